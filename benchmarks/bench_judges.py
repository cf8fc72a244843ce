"""
The judge arms, screened side by side on cycle 1 of a finished default run: the frozen pointwise judge (the seed's
design), the online judge, the token-level judge (sequence reward, and per-token advantages), a judge on a stronger
trunk, and online + token. Each arm is the default cycle with one or two settings changed, run by run_cycles.py in a
copy of the default run's directory, so the base, its evaluation, the temperature sweep and (when the cycle's FLOPs
are unchanged) the MLE control are shared and only what the arm changes is rebuilt.

  python benchmarks/bench_judges.py [--run runs/cycles_shakespeare_char] [--out runs/bench_judges] [--arms a,b]

Prints one row per arm: the judge's quality on the referee's held-out crossover data (base v1's reward data, the
test half of its val split; for an online judge, the judge GRPO ended with), the judge's boundary error on each
GRPO step's unseen rollouts (first and last 10 steps), the judge's reward, the saved policy's KL, and base v2 as the
instruments measure it (whole-split val perplexity, fresh-judge boundary error, MAUVE, sample entropy) with the
computed verdicts against the MLE and temperature controls, and the seconds GRPO took.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from model import GPT, load_checkpoint  # noqa: E402
from run_cycles import first_last  # noqa: E402
from reward_dataset_loader import RewardDataset  # noqa: E402
from train_reward_model import reward_metrics  # noqa: E402


def arms(run):
    """Arm -> (its label, its run_cycles.py overrides on top of the default config)."""
    return {
        'frozen': ('frozen pointwise (the seed)', []),
        'online': ('online pointwise', ['--grpo_judge_update_interval=1']),
        'token': ('token-level', ['--reward_pooling=token']),
        'token_adv': ('token-level, per-token advantages', ['--reward_pooling=token', '--grpo_token_advantages=True']),
        'trunk': ('stronger trunk (MLE control v2)', [f'--reward_trunk_path={os.path.join(run, "mle_v2.pt")}']),
        'online_token': ('online token-level', ['--grpo_judge_update_interval=1', '--reward_pooling=token']),
    }


@torch.no_grad()
def judge_quality(judge_path, data_dir):
    """R² and boundary error of a judge on the test half of a reward dataset's val split."""
    judge = GPT.from_checkpoint(judge_path)
    ds = RewardDataset(data_dir, 'val')
    rows = np.sort(ds.selection_and_test_rows()[1])
    p = np.concatenate([judge(torch.from_numpy(ds.x[rows[i:i + 256]].astype(np.int64)))[0][:, 0].numpy()
                        for i in range(0, len(rows), 256)])
    return reward_metrics(p, ds.y[rows, 0], ds.block_size, float(np.mean(RewardDataset(data_dir, 'train').y[:, 0])))


def arm_row(name, out, run, e):
    """One table row: the arm's judge, its GRPO run and base v2 as the instruments and the verdict see them."""
    grpo = load_checkpoint(os.path.join(out, 'base_model_v2.pt'))['metrics']
    online = os.path.join(out, 'grpo_v1_judge.pt')
    q = judge_quality(online if os.path.exists(online) else os.path.join(out, 'reward_model_v1.pt'),
                      os.path.join(run, 'reward_data_v1'))
    v = json.load(open(os.path.join(out, 'verdict_v1.json')))['verdicts']
    seconds = sum(h[f'time_{k}'] for h in grpo['history'] for k in ('generation', 'scoring', 'update'))
    return (f"| {name} | {q['r2']:.3f} / {q['boundary_error']:.1f} | "
            f"{first_last(grpo['history'], 'judge_boundary_error')} | {first_last(grpo['history'], 'reward')} | "
            f"{grpo['final_kl']:.4f} | {e['val_perplexity']:.3f} | "
            f"{e['fresh_judge_boundary_error']:.2f} ± {e['fresh_judge_boundary_error_sd']:.2f} | "
            f"{e['mauve']:.3f} ± {e['mauve_sd']:.3f} | {e['sample_entropy']:.3f} | "
            f"{v['mle']['boundary_error']}, {v['mle']['perplexity']} | "
            f"{v['temperature']['boundary_error']}, {v['temperature']['perplexity']} | {seconds:.0f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', default='runs/cycles_shakespeare_char', help="a finished default run (2 cycles or 1)")
    p.add_argument('--config', default=os.path.join(ROOT, 'config', 'cycles_shakespeare_char.py'))
    p.add_argument('--out', default='runs/bench_judges')
    p.add_argument('--grpo_seeds', default='0', help="comma-separated GRPO seeds per arm (0: the cycle's own); "
                   "the base, its judge data and the controls stay shared")
    p.add_argument('--arms', default='', help="comma-separated arms, of: " + ', '.join(arms('')) + " (default: all)")
    a = p.parse_args()
    run = os.path.abspath(a.run)
    table = arms(run)
    chosen = a.arms.split(',') if a.arms else list(table)
    rows, per_arm = [], {}
    for arm in chosen:
        for seed in [int(x) for x in a.grpo_seeds.split(',')]:
            name, overrides = table[arm]
            name += f' (GRPO seed {seed})' if seed else ''
            out = os.path.join(a.out, arm + (f'_seed{seed}' if seed else ''))
            if not os.path.exists(out):
                shutil.copytree(run, out)
            t0 = time.time()
            subprocess.run([sys.executable, os.path.join(ROOT, 'run_cycles.py'), a.config, f'--out_dir={out}',
                            '--num_cycles=1', *overrides] + ([f'--grpo_seed={seed}'] if seed else []), check=True)
            e = json.load(open(os.path.join(out, 'eval_v2.json')))[0]
            rows.append(arm_row(name, out, run, e))
            per_arm.setdefault(table[arm][0], []).append(e)
            print(f"{name}: done in {time.time() - t0:.0f} s", flush=True)
    print('\n| arm | its judge on base v1\'s held-out crossovers: R² / boundary err | judge boundary err on unseen '
          'rollouts, first 10 → last 10 | reward first 10 → last 10 | KL | val ppl | fresh-judge boundary err (↑) | '
          'MAUVE | entropy | vs MLE (boundary, ppl) | vs temperature (boundary, ppl) | GRPO s |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|')
    print('\n'.join(rows))
    if any(len(v) > 1 for v in per_arm.values()):
        print('\n| arm | GRPO seeds | val ppl, mean ± sd | fresh-judge boundary err, mean ± sd over seeds | MAUVE |')
        print('|---|---|---|---|---|')
        for name, evals in per_arm.items():
            f = lambda k: f"{np.mean([e[k] for e in evals]):.3f} ± {np.std([e[k] for e in evals], ddof=1):.3f}"
            print(f"| {name} | {len(evals)} | {f('val_perplexity')} | {f('fresh_judge_boundary_error')} | {f('mauve')} |")


if __name__ == '__main__':
    main()
