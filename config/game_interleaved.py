# An overlay for the arms on a split that the two-sample referee cannot read by itself (docs/judges.md, "What the
# two-sample referee reads"): val is 10,000-character blocks spread through the works, not the corpus' last plays.
# Put it after config/game_converged.py:
#   python data/shakespeare_char/prepare.py --split_block 10000 --out_dir data/shakespeare_char_interleaved
#   python benchmarks/bench_arms.py --run '' --config \
#       config/cycles_shakespeare_char.py,config/game_converged.py,config/game_interleaved.py \
#       --out runs/arms_interleaved --arms window --seeds 0,2000,3000
out_dir = 'runs/game_interleaved'
dataset = 'shakespeare_char_interleaved'
