# An overlay for the arms of a longer game (docs/log/arms.md): base v1 trained until its own early stopping ends it
# (patience 3 evaluations of 500 iterations, min_delta 0.002, on a cosine schedule over 12,000), so the MLE control
# measures more of the same at the plateau; both select their checkpoint on the last 100,000 train tokens, held out of
# their training, so that no reported figure's split (val) chose a checkpoint; 200 GRPO steps, with the referee's
# two-sample AUC at every evaluation.
#   python run_cycles.py config/cycles_shakespeare_char.py config/game_converged.py
out_dir = 'runs/game_converged'
num_cycles = 1
base_max_iters = 12000
base_eval_interval = 500
base_select_tokens = 100000
grpo_max_steps = 200
grpo_referee_samples = 200
