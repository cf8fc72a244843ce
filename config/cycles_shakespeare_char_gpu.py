# A larger adversarial run for one CUDA GPU: a 6-layer 384-wide char model (nanoGPT's shakespeare_char size),
# full-length contexts, more reward data and longer GRPO. python run_cycles.py config/cycles_shakespeare_char_gpu.py
out_dir = 'runs/cycles_shakespeare_char_gpu'
num_cycles = 4
dataset = 'shakespeare_char'
device = 'cuda'

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
base_max_iters = 5000
base_learning_rate = 1e-3
base_eval_interval = 250
base_patience = 4

reward_max_blocks = 4000
reward_samples_per_chunk = 10
reward_max_iters = 5000
reward_pooling = 'mean'

grpo_max_steps = 500
grpo_prompts_per_step = 32
grpo_num_generations = 8
grpo_learning_rate = 5e-5
grpo_beta = 0.04
grpo_num_iterations = 2
grpo_max_kl = 0.5

# instruments: 2 x 960 disjoint val windows of 256 characters (the split holds 1,975)
eval_num_samples = 960
judge_max_blocks = 1000
judge_samples_per_chunk = 4
patience = 2
min_delta = 0.01
