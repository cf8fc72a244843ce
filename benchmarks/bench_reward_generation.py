"""
Reward-data generation speed, side by side in one run, on the default char model shape (n_layer=4, n_head=4,
n_embd=128) at N=256:
  1. per-sample generation without a cache (nanoGPT's generate: a full re-forward per new token), the baseline;
  2. this repository's batched KV-cache generation with per-row crossovers (prepare_reward_data.generate_mixed);
  3. a plain teacher-forced forward pass over the same finished sequences (the practical ceiling).

  python benchmarks/bench_reward_generation.py [--model_path CKPT] [--blocks 2048] [--samples_per_chunk 4]
      [--crossover_k 0]

--crossover_k 8 fixes every sample's prompt at 8 tokens, the judges' negatives' shape (bench_judge_curve.py: 16
continuations of each window's 8-token prompt, --samples_per_chunk 16, with the plateau base as --model_path).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import sample_next_token  # noqa: E402
from prepare_reward_data import generate_mixed, make_crossovers  # noqa: E402
from runtime import setup_runtime  # noqa: E402
from shared import bench_model  # noqa: E402


@torch.no_grad()
def generate_without_cache(model, prompt, n_new, gen):
    """The baseline: nanoGPT's loop, one sample, the whole sequence re-forwarded for every new token."""
    idx = prompt
    for _ in range(n_new):
        logits, _ = model(idx[:, -model.config.block_size:])
        idx = torch.cat([idx, sample_next_token(logits[:, -1], generator=gen)[:, None]], dim=1)
    return idx


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--model_path', default=None, help="a char checkpoint; default: a fresh model of the default shape")
    p.add_argument('--data', default='data/shakespeare_char/train.bin')
    p.add_argument('--blocks', type=int, default=2048)
    p.add_argument('--samples_per_chunk', type=int, default=4)
    p.add_argument('--batch_size', type=int, default=512)
    p.add_argument('--baseline_samples', type=int, default=6)
    p.add_argument('--crossover_k', type=int, default=0, help="every sample's prompt length (0: K ~ U[1, N-1])")
    args = p.parse_args()
    rt = setup_runtime('cpu', seed=0)
    model = bench_model(args.model_path)
    N = model.config.block_size
    if os.path.isfile(args.data):
        tokens = np.memmap(args.data, dtype=np.uint16, mode='r')[:N * args.blocks]
    else:
        tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, N * args.blocks).astype(np.uint16)
    blocks, _, K = make_crossovers(tokens, N, args.samples_per_chunk, None, np.random.default_rng(0),
                                   args.crossover_k)
    n_gen = int((N - K).sum())
    print(f"model: {model.get_num_params() / 1e6:.2f}M params, N={N}, {K.size} samples, {n_gen:,} tokens to generate, "
          f"torch threads {torch.get_num_threads()}")

    # 1. baseline on a few samples (it is slow) spread evenly over the crossover distribution
    gen = torch.Generator().manual_seed(0)
    flatK, block_of = K.reshape(-1), np.repeat(np.arange(len(blocks)), K.shape[1])
    by_k = np.argsort(flatK, kind='stable')
    t0, base_tokens = time.time(), 0
    for s in by_k[np.linspace(0, len(by_k) - 1, args.baseline_samples).astype(int)]:
        prompt = torch.from_numpy(blocks[block_of[s], :flatK[s]].astype(np.int64))[None]
        generate_without_cache(model, prompt, N - int(flatK[s]), gen)
        base_tokens += N - int(flatK[s])
    base_rate = base_tokens / (time.time() - t0)

    # 2. batched KV-cache generation of the whole set
    t0 = time.time()
    x = generate_mixed(model, blocks, K, args.batch_size, 1.0, None, 0, rt, 'bench')
    gen_time = time.time() - t0
    gen_rate = n_gen / gen_time

    # 3. teacher-forced forward over the same finished sequences
    xs = torch.from_numpy(x.astype(np.int64))
    t0 = time.time()
    with torch.no_grad():
        for i in range(0, len(xs), 64):
            model.lm_head(model.hidden_states(xs[i:i + 64]))
    fwd_time = time.time() - t0
    fwd_rate = xs.numel() / fwd_time

    print(f"per-sample, no cache (nanoGPT generate): {base_rate:,.0f} generated tok/s ({args.baseline_samples} samples)")
    print(f"batched KV cache (this repo):            {gen_rate:,.0f} generated tok/s = {gen_rate / base_rate:.0f}x the baseline")
    print(f"teacher-forced forward, same sequences:  {fwd_rate:,.0f} tok/s ({fwd_time:.2f}s for all {xs.numel():,} tokens)")
    print(f"generation tok/s / forward tok/s: {gen_rate / fwd_rate:.2f}; "
          f"forward time / generation time (same sequences): {fwd_time / gen_time:.2f}")


if __name__ == '__main__':
    main()
