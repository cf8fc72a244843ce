# A larger adversarial run for one CUDA GPU: a 6-layer 384-wide char model (nanoGPT's shakespeare_char size),
# full-length contexts, more reward data and longer GRPO, with all three controls per cycle (the MLE control with
# early stopping, the temperature sweep, the judge-off ablation). python run_cycles.py config/cycles_shakespeare_char_gpu.py
# The seed's frozen judge as the arm instead: add config/arm_frozen_judge.py and its own --out_dir.
out_dir = 'runs/cycles_shakespeare_char_gpu'
num_cycles = 4
dataset = 'shakespeare_char'
device = 'cuda'

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
# nanoGPT's shakespeare_char recipe: without dropout this model overfits within its budget (measured on an H100:
# early stopping at iteration 3,250, best val loss 1.357-1.373, train 0.98); with 0.2 it trains all 5,000
# iterations to val loss 1.296. The MLE control continues with the same dropout.
dropout = 0.2
base_max_iters = 5000
base_learning_rate = 1e-3
base_eval_interval = 250
base_patience = 4

reward_max_blocks = 4000
reward_samples_per_chunk = 10
reward_max_iters = 5000
# the arm with the best verdict in the CPU arms table (docs/log/arms.md), as config/cycles_shakespeare_char.py runs it: a
# token-level judge trained online on the policy's rollouts, real text in GRPO's loss, one std per batch
reward_pooling = 'token'
grpo_judge_update_interval = 1
grpo_nll_weight = 1.0
grpo_scale_rewards = 'batch'

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
