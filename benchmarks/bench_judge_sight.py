"""
Judge sight, side by side in one run: how well judges trained by each recipe tell a generator's fresh samples from
natural text. Sight is measured as evaluate.py measures the cycle's judge: the held-out AUC of the judge's
P(natural) on the two-sample test's own windows (natural val windows against samples from disjoint val prompts, the
same seed, so the same texts), printed beside the two-sample test's AUC on those windows, with each recipe's
training wall time.

  python benchmarks/bench_judge_sight.py --run runs/cycles_shakespeare_char [--recipes head,last2,whole,scratch]
      [--max_iters 300] [--num_samples 1000]

Every judge trains with train_reward_model.py on the run's own crossover data of base v1 (reward_data_v1), with the
cycle's judge recipe (token pooling, MSE, batch 64) except for what its recipe changes:
  head     the cycle's judge: base v1's trunk frozen, the head trained (1,500 iterations, as the cycle trains it)
  last2    base v1's last 2 blocks and final LayerNorm trained too (lr 1e-3)
  whole    every parameter of base v1 trained, embeddings included (lr 3e-4)
  scratch  the same network from random weights, every parameter trained (lr 1e-3)
The learning rates are those of an earlier probe of these recipes; none was tuned on the figures printed here.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from judge import sight_auc  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import continuation_texts, eval_windows, two_sample_test  # noqa: E402

RECIPES = {
    'head': ['--max_iters=1500'],
    'last2': ['--unfreeze_layers=2', '--learning_rate=1e-3'],
    'whole': ['--unfreeze_layers=-1', '--learning_rate=3e-4'],
    'scratch': ['--unfreeze_layers=-1', '--init_from=random', '--learning_rate=1e-3'],
}


def train_judge(base, data, out, recipe, max_iters, seed):
    """train_reward_model.py with the cycle's recipe and this recipe's changes; returns the wall time in s."""
    args = [sys.executable, os.path.join(ROOT, 'train_reward_model.py'), f'--model_path={base}', f'--data_dir={data}',
            f'--out_path={out}', '--reward_pooling=token', '--batch_size=64', '--eval_interval=100', '--device=cpu',
            f'--seed={seed}', f'--max_iters={max_iters}', *RECIPES[recipe]]
    t0 = time.time()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{recipe}: train_reward_model.py failed: {r.stderr[-2000:]}")
    return time.time() - t0


def bootstrap_sd(natural, samples, seed, n=200):
    """The spread of the sight AUC over texts: both sides resampled with replacement."""
    rng = np.random.default_rng(seed)
    return float(np.std([sight_auc(rng.choice(natural, natural.size), rng.choice(samples, samples.size))
                         for _ in range(n)], ddof=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', default='runs/cycles_shakespeare_char', help="a finished cycle run's folder")
    p.add_argument('--recipes', default='head,last2,whole,scratch')
    p.add_argument('--max_iters', type=int, default=300, help="iterations of every recipe but 'head'")
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--seed', type=int, default=1337)
    a = p.parse_args()
    base_path, data = os.path.join(a.run, 'base_model_v1.pt'), os.path.join(a.run, 'reward_data_v1')
    config = json.load(open(os.path.join(a.run, 'config.json')))
    ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(ckpt)
    tok = TokenizationManager.from_info(ckpt['tokenization'])
    dataset = config['dataset'] if os.path.isdir(config['dataset']) else os.path.join(ROOT, 'data', config['dataset'])
    val = np.memmap(os.path.join(dataset, 'val.bin'), dtype=np.uint16, mode='r')
    N = base.config.block_size
    # evaluate.py's draw: the same windows, prompts and generator seed, so the same texts as its two-sample test
    reference, prompts = eval_windows(val, a.num_samples, N, a.seed)
    natural_texts, sample_texts, samples, _ = continuation_texts(base, tok, reference, prompts, 1.0, None,
                                                                 torch.Generator().manual_seed(a.seed))
    c2st = two_sample_test(natural_texts, sample_texts, a.seed)
    print(f"base v1 of {a.run}, T = 1.0, {a.num_samples} natural windows against {a.num_samples} samples; two-sample "
          f"test (TF-IDF logistic regression) AUC {c2st['c2st_auc']:.3f} ± {c2st['c2st_auc_sd']:.3f} (5 folds)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in a.recipes.split(','):
            out = os.path.join(tmp, f'{recipe}.pt')
            seconds = train_judge(base_path, data, out, recipe, a.max_iters, a.seed)
            judge_ckpt = load_checkpoint(out)
            judge = GPT.from_checkpoint(judge_ckpt)
            with torch.no_grad():
                p_natural = judge(reference)[0][:, 0].numpy()
                p_samples = judge(samples)[0][:, 0].numpy()
            rows.append(dict(recipe=recipe, seconds=seconds, iters=judge_ckpt['iter_num'],
                             max_iters=judge_ckpt['config']['max_iters'], r2=judge_ckpt['metrics']['r2'],
                             sight=sight_auc(p_natural, p_samples), sight_sd=bootstrap_sd(p_natural, p_samples, a.seed)))
            r = rows[-1]
            print(f"  {recipe}: sight AUC {r['sight']:.3f} ± {r['sight_sd']:.3f}, crossover R² {r['r2']:.4f}, kept "
                  f"iteration {r['iters']} of {r['max_iters']}, {seconds:.0f} s", flush=True)
    print('\n| judge recipe | sight: AUC on the two-sample windows (± bootstrap sd) | two-sample test AUC, same windows '
          '| crossover R² (test half) | kept iteration / allowed | training wall time |')
    print('|---|---|---|---|---|---|')
    for r in rows:
        print(f"| {r['recipe']} | {r['sight']:.3f} ± {r['sight_sd']:.3f} | {c2st['c2st_auc']:.3f} ± "
              f"{c2st['c2st_auc_sd']:.3f} | {r['r2']:.4f} | {r['iters']} / {r['max_iters']} | {r['seconds']:.0f} s |")


if __name__ == '__main__':
    main()
