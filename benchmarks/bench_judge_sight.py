"""
Judge sight, side by side in one run: how well judges trained by each recipe tell a generator's fresh samples from
natural text. Sight is measured as evaluate.py measures the cycle's judge: the held-out AUC of the judge's
P(natural) on the two-sample test's own windows (natural val windows against samples from disjoint val prompts, the
same seed, so the same texts), printed beside the two-sample test's AUC on those windows, with each recipe's
training wall time.

  python benchmarks/bench_judge_sight.py --run runs/cycles_shakespeare_char [--recipes head,last2,whole,scratch]
      [--max_iters 300] [--num_samples 1000] [--window_blocks 10000 --window_epochs 5]

The crossover recipes train with train_reward_model.py on the run's own crossover data of base v1 (reward_data_v1),
with the cycle's judge recipe (token pooling, MSE, batch 64) except for what the recipe changes:
  head     the cycle's judge: base v1's trunk frozen, the head trained (1,500 iterations, as the cycle trains it)
  last2    base v1's last 2 blocks and final LayerNorm trained too (lr 1e-3)
  whole    every parameter of base v1 trained, embeddings included (lr 3e-4)
  scratch  the same network from random weights, every parameter trained (lr 1e-3)
The whole-window recipes train on data this benchmark writes first: window_blocks train-split windows, each against
base v1's T = 1 continuation of its first 8 tokens (prepare_reward_data.py --crossover_k 8), loss='binary',
window_epochs passes, batch 64 samples + their 64 natural windows:
  window_head        base v1's trunk frozen, a token-level head trained (lr 1e-3)
  window_whole       every parameter of base v1 trained, token-level scores (lr 3e-4)
  window_whole_mean  the same with mean pooling (the issue's probe: lr 3e-4)
  stronger_head, stronger_whole, stronger_whole_mean
                     the three whole-window recipes on the weights of --stronger_trunk, a generator checkpoint
                     trained further than base v1 (same shape and tokenization), judging base v1's samples
--likelihood_of A.pt,B.pt adds an untrained reading: each generator checkpoint's mean log-likelihood of a window's
120 continuation tokens as its score (natural windows should score higher), the sight of a likelihood-ratio judge
with no training. Under base v1 itself it shows how much of its own samples' strangeness its own model can see.
The learning rates are those of an earlier probe of these recipes; none was tuned on the figures printed here. The
judges select their checkpoint on half of the val split's blocks, which the natural windows of the sight test are
drawn from: their samples are fresh, the natural side shares the split (never the train data).
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

from auc import sight_auc, sight_auc_sd  # noqa: E402
from judge import reward_data_cmd, reward_model_cmd  # noqa: E402
from evaluate import sight_figures  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from policy import token_logprobs  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN, continuation_texts, eval_windows, two_sample_test  # noqa: E402

RECIPES = {  # name: (its data, its options of train_reward_model.py)
    'head': ('crossover', ['--max_iters=1500']),
    'last2': ('crossover', ['--unfreeze_layers=2', '--learning_rate=1e-3']),
    'whole': ('crossover', ['--unfreeze_layers=-1', '--learning_rate=3e-4']),
    'scratch': ('crossover', ['--unfreeze_layers=-1', '--init_from=random', '--learning_rate=1e-3']),
    'window_head': ('window', ['--loss=binary']),
    'window_whole': ('window', ['--loss=binary', '--unfreeze_layers=-1', '--learning_rate=3e-4']),
    'window_whole_mean': ('window', ['--loss=binary', '--unfreeze_layers=-1', '--learning_rate=3e-4',
                                     '--reward_pooling=mean']),
}
for _name in ('window_head', 'window_whole', 'window_whole_mean'):  # the same recipes on --stronger_trunk's weights
    RECIPES['stronger_' + _name[len('window_'):]] = RECIPES[_name]


def window_data(base, dataset, out, blocks, seed):
    """Whole-window data: each train-split window against base v1's continuation of its first PROMPT_LEN tokens;
    returns the wall time in s."""
    t0 = time.time()
    cmd = reward_data_cmd(base, dataset, out, blocks, 1, seed, 'cpu', crossover_k=PROMPT_LEN)
    r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"prepare_reward_data.py failed: {r.stderr[-2000:]}")
    return time.time() - t0


def train_judge(base, data, out, recipe, limit, seed):
    """train_reward_model.py with the cycle's recipe and this recipe's changes; limit is its --max_iters or
    --max_epochs option; returns the wall time in s."""
    args = [sys.executable, *reward_model_cmd(base, data, out, seed, 'cpu', [
        '--reward_pooling=token', '--batch_size=64', '--eval_interval=100', limit, *RECIPES[recipe][1]])]
    t0 = time.time()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{recipe}: train_reward_model.py failed: {r.stderr[-2000:]}")
    return time.time() - t0


@torch.no_grad()
def likelihood_sight(lm_ckpt, reference, samples, seed):
    """(sight, sd) of an LM's mean log-likelihood of the tokens after each window's PROMPT_LEN as its score."""
    lm = GPT.from_checkpoint(lm_ckpt)
    scores = [torch.cat([token_logprobs(lm, x[i:i + 250], 1.0)[0][:, PROMPT_LEN - 1:].mean(1)
                         for i in range(0, len(x), 250)]).numpy() for x in (reference, samples)]
    return sight_auc(*scores), sight_auc_sd(*scores, seed)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', default='runs/cycles_shakespeare_char', help="a finished cycle run's folder")
    p.add_argument('--recipes', default='head,last2,whole,scratch', help="comma-separated, of: " + ', '.join(RECIPES)
                   + " ('' for none)")
    p.add_argument('--max_iters', type=int, default=300, help="iterations of every crossover recipe but 'head'")
    p.add_argument('--window_blocks', type=int, default=10000, help="train windows of the whole-window recipes")
    p.add_argument('--window_epochs', type=int, default=5, help="passes of the whole-window recipes")
    p.add_argument('--stronger_trunk', default='', help="the stronger_* recipes' starting weights")
    p.add_argument('--likelihood_of', default='', help="comma-separated generator checkpoints: their likelihood's "
                   "sight, untrained")
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--seed', type=int, default=1337)
    a = p.parse_args()
    base_path = os.path.join(a.run, 'base_model_v1.pt')
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
    for lm_path in filter(None, a.likelihood_of.split(',')):
        lm_ckpt = load_checkpoint(lm_path)
        sight, sd = likelihood_sight(lm_ckpt, reference, samples, a.seed)
        print(f"  mean log-likelihood under {lm_path} (val loss {lm_ckpt['best_val_loss']:.4f}), "
              f"untrained: sight AUC {sight:.3f} ± {sd:.3f}", flush=True)
    rows, data_seconds = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in filter(None, a.recipes.split(',')):
            if RECIPES[recipe][0] == 'window':
                if not data_seconds:  # written once, shared by the whole-window recipes
                    data = os.path.join(tmp, 'window_data')
                    data_seconds = window_data(base_path, dataset, data, a.window_blocks, a.seed)
                    print(f"  whole-window data: {a.window_blocks} train windows, {data_seconds:.0f} s", flush=True)
                limit, allowed = f'--max_epochs={a.window_epochs}', f'{a.window_epochs} epochs'
            else:
                data = os.path.join(a.run, 'reward_data_v1')
                limit = f'--max_iters={1500 if recipe == "head" else a.max_iters}'
                allowed = limit.split('=')[1]
            out = os.path.join(tmp, f'{recipe}.pt')
            if recipe.startswith('stronger_') and not a.stronger_trunk:
                raise SystemExit(f"{recipe} starts from --stronger_trunk: pass a generator checkpoint")
            trunk = a.stronger_trunk if recipe.startswith('stronger_') else base_path
            seconds = train_judge(trunk, data, out, recipe, limit, a.seed)
            judge_ckpt = load_checkpoint(out)
            sight = sight_figures(GPT.from_checkpoint(judge_ckpt), reference, samples, a.seed)
            m = judge_ckpt['metrics']
            rows.append(dict(recipe=recipe, seconds=seconds, iters=judge_ckpt['iter_num'], allowed=allowed,
                             r2=f"{m['r2']:.4f}" if RECIPES[recipe][0] == 'crossover' else '–',
                             pairs=m['pair_accuracy'], data_seconds=data_seconds if allowed.endswith('epochs') else 0,
                             sight=sight['sight_auc'], sight_sd=sight['sight_auc_sd']))
            r = rows[-1]
            print(f"  {recipe}: sight AUC {r['sight']:.3f} ± {r['sight_sd']:.3f}, pair accuracy {r['pairs']:.3f}, "
                  f"crossover R² {r['r2']}, kept iteration {r['iters']} of {allowed}, {seconds:.0f} s", flush=True)
    if not rows:
        return
    print('\n| judge recipe | sight: AUC on the two-sample windows (± bootstrap sd) | two-sample test AUC, same windows '
          '| pair accuracy (test half of its val data) | crossover R² | kept iteration / allowed | training wall time '
          '(+ its data) |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        data_cost = f" (+ {r['data_seconds']:.0f} s)" if r['data_seconds'] else ''
        print(f"| {r['recipe']} | {r['sight']:.3f} ± {r['sight_sd']:.3f} | {c2st['c2st_auc']:.3f} ± "
              f"{c2st['c2st_auc_sd']:.3f} | {r['pairs']:.3f} | {r['r2']} | {r['iters']} / {r['allowed']} | "
              f"{r['seconds']:.0f} s{data_cost} |")

if __name__ == '__main__':
    main()
