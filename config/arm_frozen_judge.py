# The seed's arm as an overlay on any cycle config: a judge frozen during GRPO (mean-pooled head on the frozen trunk,
# pointwise loss), pure GRPO with no real text in its loss, group-scaled advantages. Give it its own out_dir:
#   python run_cycles.py config/cycles_shakespeare_char_gpu.py config/arm_frozen_judge.py --out_dir=runs/gpu_frozen
reward_pooling = 'mean'
reward_loss = 'mse'
grpo_judge_update_interval = 0
grpo_token_advantages = False
grpo_nll_weight = 0.0
grpo_scale_rewards = 'group'
