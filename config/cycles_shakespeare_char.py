# The default adversarial run: 2 cycles on Shakespeare's complete works (char-level), sized for 2 CPU cores.
# python run_cycles.py config/cycles_shakespeare_char.py
out_dir = 'runs/cycles_shakespeare_char'
num_cycles = 2
dataset = 'shakespeare_char'
device = 'auto'

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
base_max_iters = 600

reward_max_blocks = 1000
reward_samples_per_chunk = 4
reward_max_iters = 1500
reward_pooling = 'mean'  # the seed's last-token judge is blind here (R² 0.001); mean pooling sees a little

grpo_max_steps = 60
grpo_prompts_per_step = 8
grpo_num_generations = 8
grpo_learning_rate = 1e-4
grpo_beta = 0.2
