"""
BPE sampling speed, side by side in one run: torch.multinomial over softmax probabilities (the sampler before the
inverse-CDF one) against model.sample_next_token (inverse CDF: a running sum and one uniform per row).
  1. one decode step of --rows rows over GPT-2's 50,257-token vocabulary: the lm_head matmul, softmax +
     multinomial, and the inverse-CDF sampler;
  2. reward-data generation (prepare_reward_data.generate_mixed) with a BPE model of the default cycle's shape
     (4 x 128, block 128, vocab 50,304), once with each sampler: generated tokens per second.

  python benchmarks/bench_sampling.py [--rows 512] [--blocks 64] [--repeats 5]
"""
import argparse
import os
import sys
import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model as model_module  # noqa: E402
from model import GPT, GPTConfig, sample_next_token  # noqa: E402
from prepare_reward_data import generate_mixed, make_crossovers  # noqa: E402
from runtime import setup_runtime  # noqa: E402


def multinomial_sampler(logits, temperature=1.0, top_k=None, generator=None):
    """The reference: nanoGPT's sampling (softmax, then torch.multinomial)."""
    logits = logits.float() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], -float('inf'))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator).view(-1)


@contextmanager
def sampler(fn):
    """Make GPT.generate draw with fn (it looks the sampler up in model.py at each step)."""
    saved = model_module.sample_next_token
    model_module.sample_next_token = fn
    try:
        yield
    finally:
        model_module.sample_next_token = saved


def best_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rows', type=int, default=512)
    p.add_argument('--blocks', type=int, default=64, help="reward-data blocks of 128 tokens (x4 samples each)")
    p.add_argument('--repeats', type=int, default=5)
    args = p.parse_args()
    rt = setup_runtime('cpu', seed=0)
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=50304)).eval()
    hidden = torch.randn(args.rows, 128)
    logits = m.lm_head(hidden).detach()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        t_matmul = best_time(lambda: m.lm_head(hidden), args.repeats)
    t_multi = best_time(lambda: multinomial_sampler(logits, generator=gen), args.repeats)
    t_icdf = best_time(lambda: sample_next_token(logits, generator=gen), args.repeats)
    print(f"one decode step, {args.rows} rows x {logits.size(-1):,} tokens (best of {args.repeats}), "
          f"torch threads {torch.get_num_threads()}:")
    print(f"  lm_head matmul:                {t_matmul * 1e3:8.1f} ms")
    print(f"  softmax + torch.multinomial:   {t_multi * 1e3:8.1f} ms")
    print(f"  inverse CDF (this repo):       {t_icdf * 1e3:8.1f} ms   ({t_multi / t_icdf:.1f}x faster)")

    N = m.config.block_size
    tokens = np.random.default_rng(0).integers(0, 50257, N * args.blocks).astype(np.uint16)
    blocks, _, K = make_crossovers(tokens, N, 4, None, np.random.default_rng(0))
    n_gen = int((N - K).sum())
    rates = {}
    for name, fn in (('multinomial', multinomial_sampler), ('inverse CDF', sample_next_token)):
        with sampler(fn):
            t0 = time.perf_counter()
            generate_mixed(m, blocks, K, args.rows, 1.0, None, 0, rt, name)
            rates[name] = n_gen / (time.perf_counter() - t0)
    print(f"reward-data generation, BPE 4 x 128 model, {K.size} samples, {n_gen:,} generated tokens:")
    for name, rate in rates.items():
        print(f"  {name:12s} {rate:10,.0f} generated tok/s")
    print(f"  inverse CDF / multinomial: {rates['inverse CDF'] / rates['multinomial']:.2f}x")


if __name__ == '__main__':
    main()
