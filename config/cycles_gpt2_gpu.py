# GPT-2 small as the base, GPT-2 BPE on Shakespeare's complete works, for one 80 GB CUDA GPU, with all three controls
# per cycle (MLE with early stopping, temperature sweep, judge-off). NOT YET RUN on a GPU: the pieces it chains
# (GPT-2 loading, BPE cycle, bf16 autocast, torch.compile in train.py, the CUDA-graph sampler's step) are each tested
# on CPU. python run_cycles.py config/cycles_gpt2_gpu.py; the seed's frozen judge: add config/arm_frozen_judge.py.
# Without a hub (an offline GPU machine), init_from takes a local directory written by save_pretrained.
# Needs the weights once, online: python -c "from transformers import GPT2LMHeadModel as M; M.from_pretrained('gpt2')"
out_dir = 'runs/cycles_gpt2_gpu'
num_cycles = 4
dataset = 'shakespeare'  # GPT-2 BPE, prepared on first use
device = 'cuda'
init_from = 'gpt2'  # 124M; 'gpt2-medium' (350M) fits too at batch_size 16
compile = True

# base v1: GPT-2 fine-tuned on the complete works (1.40 M BPE tokens in train), stopped early when val loss stalls;
# 600 x 64 x 256 tokens is 7 epochs of the split, so GPT-2's own dropout (0.1) is kept (not yet measured)
dropout = 0.1
block_size = 256
batch_size = 64
base_max_iters = 600
base_learning_rate = 6e-5
base_eval_interval = 50
base_patience = 3

# judges: the GPT-2 trunk on 600 blocks of 256 tokens per split (val holds 644), 4 crossovers each. The arm of the
# default CPU run (docs/log/arms.md): a token-level judge, trained online on the policy's rollouts, and real text in
# GRPO's loss. Cached per-position features: 2,400 x 256 x 768 floats = 1.9 GB per split; the online judge's replay
# of 9 steps of 256 rollouts another 1.8 GB
reward_max_blocks = 600
reward_samples_per_chunk = 4
reward_max_iters = 3000
reward_pooling = 'token'
reward_batch_size = 64
grpo_judge_update_interval = 1
grpo_nll_weight = 1.0

grpo_max_steps = 300
grpo_prompts_per_step = 32
grpo_num_generations = 8
grpo_learning_rate = 1e-6
grpo_beta = 0.04
grpo_num_iterations = 2
grpo_max_kl = 0.5

# instruments: the referee is base v1 (GPT-2 fine-tuned); the val split (165 k tokens) holds 2 x 320 disjoint windows
# of 256 tokens (references and prompts), so 300 samples per point
eval_num_samples = 300
judge_max_blocks = 600
judge_samples_per_chunk = 4
patience = 2
min_delta = 0.01
