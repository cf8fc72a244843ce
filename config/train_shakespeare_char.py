# A small character-level model of Shakespeare's complete works that trains on 2 CPU cores in minutes.
# python train.py config/train_shakespeare_char.py
out_dir = 'out-shakespeare-char'
eval_interval = 250
eval_iters = 20
log_interval = 50
always_save_checkpoint = False  # keep the best checkpoint by val loss

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 16
block_size = 256

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 2e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 100

# held-out perplexity on the first 100k val tokens at each evaluation (the whole split costs ~10 s on 2 cores)
ppl_max_tokens = 100000

patience = 4
min_delta = 0.002

device = 'auto'
compile = False
