# The default adversarial run: 2 cycles on Shakespeare's complete works (char-level), sized for 2 CPU cores
# (28.4 min of stages with its three controls: 2026-11-28, 2 cores of an AMD EPYC, PyTorch 2.13.0).
# python run_cycles.py config/cycles_shakespeare_char.py
# run_cycles.py's own defaults give the run its shape (4 x 128 model, block 128, 60 GRPO steps of 8 prompts x 8
# completions, out_dir runs/cycles_shakespeare_char); this file sets where it departs from them.

# a base worth studying: 5-7 minutes of the run on 2 cores (1,300 x 32 x 128 = 5.3 M characters, 1 epoch)
batch_size = 32
base_max_iters = 1300
base_eval_interval = 700  # each evaluation costs ~4 s

# the judge's data: 1,000 blocks per split, 4 crossovers each
reward_max_blocks = 1000
# the arm with the best verdict in the arms table (docs/log/arms.md: cycle 1, 3 seeds each, against the seed's frozen
# judge, the online token-level judge alone and SPIN): a token-level judge (the seed's last-token judge is blind here,
# R² 0.001; mean pooling sees a little), trained online on the policy's rollouts, and real text in GRPO's loss
reward_pooling = 'token'
grpo_judge_update_interval = 1
grpo_nll_weight = 1.0

# a gentler GRPO step against that weak judge
grpo_learning_rate = 1e-4
grpo_beta = 0.2
# one std per batch, not per group: measured best of group/batch/none (docs/grpo_cycle.md)
grpo_scale_rewards = 'batch'
