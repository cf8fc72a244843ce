# An overlay for the arms against the judge that sees (docs/log/arms.md, "The judge that sees, played"): the default
# base v1 (1,300 iterations; the GPT whole-window judge on 30,000 of its windows reads its samples at 0.90-0.92,
# docs/judges.md), it and the MLE control selecting their checkpoints on the last 100,000 train tokens, held out of
# their training, so that no reported figure's split (val) chose one; 200 GRPO steps, with the referee's two-sample
# AUC at every evaluation. The base is not at its plateau (config/game_converged.py is; no GPT judge reaches 0.90 on
# that base's samples on CPU), so the MLE control gains what the base had left to learn.
#   python benchmarks/bench_arms.py --run '' --config config/cycles_shakespeare_char.py,config/game_sighted.py \
#       --out runs/arms_sighted --arms window30k --seeds 0,2000,3000
out_dir = 'runs/game_sighted'
num_cycles = 1
base_select_tokens = 100000
grpo_max_steps = 200
grpo_referee_samples = 200
