"""
GRPO's advantage scaling, side by side: 'group' (divide by each group's reward std), 'batch' (by the whole batch's)
and 'none', each a GRPO run from the same base against the same judge with the default cycle's GRPO settings,
then every policy measured by the cycle's instruments (evaluate.py with the base as referee).

  python benchmarks/bench_scale_rewards.py --base runs/cycles_shakespeare_char/base_model_v1.pt \
      --reward_model runs/cycles_shakespeare_char/reward_model_v1.pt [--out runs/bench_scale_rewards]

Prints one row per scaling: the judge's reward (first -> last 10 steps), the raw within-group reward std, the saved
policy's KL, whole-split val perplexity, the referee's fresh-judge boundary error (mean ± sd over 3 judges), the
unknown-word rate, the sample entropy and MAUVE.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402
from model import load_checkpoint  # noqa: E402
from data_loader import data_path  # noqa: E402
import run_cycles  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--base', required=True)
    p.add_argument('--reward_model', required=True)
    p.add_argument('--dataset', default='shakespeare_char', help="the cycle's dataset")
    p.add_argument('--config', default=os.path.join(ROOT, 'config', 'cycles_shakespeare_char.py'),
                   help="the cycle config whose GRPO and evaluation settings are used")
    p.add_argument('--out', default='runs/bench_scale_rewards')
    p.add_argument('--device', default='auto')
    a = p.parse_args()
    C = configure(run_cycles.DEFAULTS, [a.config, f'--device={a.device}'])
    data_dir = data_path(a.dataset)
    os.makedirs(a.out, exist_ok=True)
    policies = {}
    for scale in ('group', 'batch', 'none'):
        out = os.path.join(a.out, f'policy_{scale}.pt')
        if not os.path.exists(out):  # the cycle's GRPO command, seed of cycle 1, only the scaling changed
            subprocess.run([sys.executable, *run_cycles.grpo_cmd(C, a.base, a.reward_model, data_dir, out, C.seed + 1,
                                                                 scale_rewards=scale)], check=True)
        policies[scale] = out
    eval_path = os.path.join(a.out, 'eval.json')
    if not os.path.exists(eval_path):
        subprocess.run([sys.executable, *run_cycles.evaluate_cmd(C, list(policies.values()), data_dir, a.base,
                                                                  eval_path, [C.sample_temperature])], check=True)
    points = json.load(open(eval_path))
    print('\n| scale_rewards | reward first 10 -> last 10 | raw group std | KL | val ppl | boundary error | '
          'unknown words | entropy | MAUVE |\n|---|---|---|---|---|---|---|---|---|')
    for (scale, path), e in zip(policies.items(), points):
        m = load_checkpoint(path)['metrics']
        r = [h['reward'] for h in m['history']]
        print(f"| {scale} | {np.mean(r[:10]):.3f} -> {np.mean(r[-10:]):.3f} | "
              f"{np.mean([h['reward_group_std'] for h in m['history']]):.4f} | {m['final_kl']:.4f} | "
              f"{e['val_perplexity']:.3f} | {e['fresh_judge_boundary_error']:.2f} ± "
              f"{e['fresh_judge_boundary_error_sd']:.2f} | {e['unknown_word_rate']:.3f} | {e['sample_entropy']:.3f} | "
              f"{e['mauve']:.3f} ± {e['mauve_sd']:.3f} |")


if __name__ == '__main__':
    main()
