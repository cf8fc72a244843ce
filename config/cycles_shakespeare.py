# The cycle on GPT-2 BPE: Shakespeare's complete works as 1.40 M train / 165 k val GPT-2 tokens (data/shakespeare,
# prepared on first use), every stage and control as in the char cycle. Sized to run within an hour on 2 CPU cores,
# where the 50,304-way output layer is most of the cost: a small base, one cycle (the char default runs two), 30 GRPO
# steps and a three-point temperature sweep; read it as the BPE path working end to end, not as a strong generator.
# Stage times and peak memory: docs/gpt2_and_bpe.md. python run_cycles.py config/cycles_shakespeare.py
out_dir = 'runs/cycles_shakespeare'
dataset = 'shakespeare'
num_cycles = 1

block_size = 64
batch_size = 16
base_max_iters = 400
base_eval_interval = 100

reward_max_blocks = 500
reward_pooling = 'mean'

grpo_max_steps = 30
grpo_learning_rate = 1e-4
grpo_beta = 0.2
grpo_scale_rewards = 'batch'

# 2 x 500 disjoint val windows of 64 tokens
eval_num_samples = 500
judge_max_blocks = 300
judge_samples_per_chunk = 4
control_temperatures = '0.7,0.85,1.0'
