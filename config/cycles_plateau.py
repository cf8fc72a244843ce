# An overlay for the plateau base: base v1 trained until next-token training stops gaining, the regime self-play is
# claimed for (docs/results.md, "Where next-token training stops"). The default run's base stops after one epoch, in
# the steepest part of its curve, where the MLE control gains about 4% of perplexity at a game's compute.
#   python run_cycles.py config/cycles_shakespeare_char.py config/cycles_plateau.py --num_cycles=0   # the base alone
#   python benchmarks/bench_plateau.py --run runs/plateau --flops 2.26e13 --learning_rates 0,2e-6  # is it there?
# The default run's shape (4 x 128, block 128, the complete works char-level, batch 32) on game_converged.py's
# schedule: a cosine over 12,000 iterations (~11 epochs), so that early stopping acts on a decayed learning rate, not
# on the high one that stops a short cosine while more training at a lower rate still gains. Decayed to a tenth
# (2e-4), it was not a plateau: its MLE control held at 2e-5 gained 1.1% of perplexity (docs/results.md, section 5;
# 2026-11-27). So the cosine ends at a hundredth, the rate that gained, and its MLE controls hold that rate; there
# it is at its plateau: held at 2e-5 or at 2e-6 for the largest arm's compute, its MLE control reads equal over 3 seeds
# (docs/results.md, section 5; 2026-11-27).
out_dir = 'runs/plateau'
base_max_iters = 12000
base_min_lr = 2e-5
base_eval_interval = 500
base_patience = 3
base_min_delta = 0.0
# the kept checkpoint chosen on the 100,000 held-out train tokens read whole, not on 20 random batches whose noise
# (0.02-0.04 between evaluations) is as large as the plateau's slope
base_select_tokens = 100000
base_select_pass = True
