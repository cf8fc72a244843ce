# nanoGPT's documented CPU recipe for shakespeare_char (README "I only have a macbook"), for comparing
# figures with nanoGPT's published val loss of about 1.88 at iteration 2000. It needs a char dataset of
# Karpathy's tiny-shakespeare; benchmarks/bench_nanogpt_recipe.py prepares one and runs this config.
out_dir = 'out-tinyshakespeare-cpu-recipe'
eval_interval = 250
eval_iters = 20
log_interval = 1  # as nanoGPT's command line
val_ppl = 'off'  # as nanoGPT, which reports none (the whole split, once at the end: --val_ppl=end, ~3 s)
always_save_checkpoint = False

dataset = 'tinyshakespeare_char'
gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100

device = 'cpu'
compile = False
