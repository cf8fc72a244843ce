"""
Reward-head training speed, side by side in one run: the cached-feature path (the frozen trunk's pooled features
computed once, the head trained on them) against re-running the frozen trunk for every batch, on the default char
model shape at N=256, with the same seed; also checks that both paths give the same losses.

  python benchmarks/bench_reward_training.py [--model_path CKPT] [--samples 2048] [--epochs 3]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtime import setup_runtime  # noqa: E402
from shared import bench_model  # noqa: E402
from judge import compute_features, freeze_trunk, loss_fn  # noqa: E402


class ArrayDataset:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)


def train_epochs(model, ds, epochs, batch_size, feats=None, seed=0):
    """Head training; with feats the head reads cached features, otherwise the trunk runs every batch."""
    torch.manual_seed(seed)
    model.init_reward_head()
    opt = torch.optim.AdamW(model.reward_head.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    losses, times = [], []
    for _ in range(epochs):
        t0 = time.time()
        perm = torch.randperm(len(ds), generator=gen).numpy()
        for i in range(0, len(ds) - batch_size + 1, batch_size):
            rows = np.sort(perm[i:i + batch_size])
            y = torch.from_numpy(ds.y[rows])
            if feats is not None:
                probs = model.reward_head(feats[torch.from_numpy(rows)])
            else:
                probs = model(torch.from_numpy(ds.x[rows].astype(np.int64)))[0]
            loss = loss_fn(probs, y, 'mse')
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        times.append(time.time() - t0)
    return losses, times


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--model_path', default=None)
    p.add_argument('--samples', type=int, default=2048)
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--batch_size', type=int, default=64)
    args = p.parse_args()
    rt = setup_runtime('cpu', seed=0)
    model = bench_model(args.model_path, mode='reward')
    freeze_trunk(model, 0)
    N = model.config.block_size
    rng = np.random.default_rng(0)
    K = rng.integers(1, N, args.samples)
    ds = ArrayDataset(rng.integers(0, model.config.vocab_size, (args.samples, N)).astype(np.uint16),
                      np.stack([K / N, (N - K) / N], 1).astype(np.float32))
    full_losses, full_times = train_epochs(model, ds, args.epochs, args.batch_size)
    t0 = time.time()
    feats = compute_features(model, ds.x, 256, rt, 'features')
    feat_time = time.time() - t0
    cached_losses, cached_times = train_epochs(model, ds, args.epochs, args.batch_size, feats)
    full_epoch, cached_epoch = np.mean(full_times), np.mean(cached_times)
    max_diff = max(abs(a - b) for a, b in zip(full_losses, cached_losses))
    print(f"{args.samples} samples of N={N}, batch {args.batch_size}, {args.epochs} epochs, "
          f"{torch.get_num_threads()} threads")
    print(f"full path (trunk every batch): {full_epoch:.2f}s per epoch")
    print(f"cached features: one-off feature pass {feat_time:.2f}s, then {cached_epoch:.3f}s per epoch")
    print(f"speed-up per epoch: {full_epoch / cached_epoch:,.0f}x; including the feature pass over "
          f"{args.epochs} epochs: {full_epoch * args.epochs / (feat_time + cached_epoch * args.epochs):.1f}x")
    print(f"largest per-step loss difference between the paths: {max_diff:.2e} (same seed)")


if __name__ == '__main__':
    main()
