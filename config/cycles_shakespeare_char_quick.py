# A first look in about 4 minutes on 2 CPU cores (4 min 18 s, 2026-11-26, AMD EPYC, PyTorch 2.13.0): one cycle of
# the default set-up with a short base, a shorter GRPO, one fresh judge per point on 200 samples, and no controls
# (so no verdict). Its figures are a smoke test, not a result: the default run (config/cycles_shakespeare_char.py)
# is the one to read.
# python run_cycles.py config/cycles_shakespeare_char_quick.py
out_dir = 'runs/cycles_shakespeare_char_quick'
num_cycles = 1
base_max_iters = 300

reward_max_blocks = 300
reward_pooling = 'token'  # the default arm: online token-level judge, real text in GRPO's loss (docs/log/arms.md)
grpo_judge_update_interval = 1
grpo_nll_weight = 1.0

grpo_max_steps = 30
grpo_learning_rate = 1e-4
grpo_beta = 0.2
grpo_scale_rewards = 'batch'

eval_num_samples = 200
judge_seeds = 1
judge_max_blocks = 600
controls = False
