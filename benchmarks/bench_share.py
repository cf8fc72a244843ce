"""
What a game carries of what its judge knows: one train_grpo.py setting run over trainer seeds, each seed beside its
judge-off control (the same trainer, settings and steps with the judge's signal removed), and the generator's val
likelihood gain over that control in nats per completion, beside the judge's worth in the same nats (its
Donsker-Varadhan bound on the base, worth.py, measured before the game): the share realised.

  python benchmarks/bench_share.py --out runs/share --name ngram_kl --dv 1.46 --seeds 1338,2001,3001 \
      [--control judge_off|shuffled] -- --policy_path=BASE.pt --judge=ngram ... (train_grpo.py's options)

--control shuffled: the control plays the judge's own rewards, permuted across each step's rollouts
(--reward_shuffle=True): with the KL inside the reward, judge-off moves nothing, so only this control shows what a
reward of the judge's scale and spread gains by chance. Each run is train_grpo.py as a user runs it (its checkpoint
OUT/NAME_s{seed}.pt, its control OUT/NAME_off_s{seed}.pt or OUT/NAME_shuffled_s{seed}.pt; a finished one is reused,
an interrupted one resumes). Both read val perplexity on the same val tokens, so a seed's
effect is paired: 1 - ppl(arm) / ppl(control), and its gain ln(ppl(control) / ppl(arm)) nats a token times the
completion's tokens (block size minus the two-sample prompt, the windows the judges' worth is read on). The verdict
on the method is verdict.seed_effect's: a t interval over the seeds, each with its own control and draws.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from model import load_checkpoint  # noqa: E402
from two_sample import PROMPT_LEN  # noqa: E402
from verdict import PPL_MARGIN, label_text, seed_effect  # noqa: E402


def run(args, out_path, extra=()):
    """train_grpo.py with these options to out_path, unless it is there; returns its metrics."""
    if not os.path.exists(out_path):
        subprocess.run([sys.executable, os.path.join(ROOT, 'train_grpo.py'), *args, f'--out_path={out_path}',
                        '--resume=True', *extra], check=True)
    return load_checkpoint(out_path)['metrics']


def seed_share(arm_ppl, control_ppl, tokens):
    """One seed's paired effect on perplexity, 1 - ppl(arm) / ppl(control), and the arm's gain over its control in
    nats a completion of `tokens` tokens, ln(ppl(control) / ppl(arm)) a token: the unit of the judge's worth."""
    return 1 - arm_ppl / control_ppl, float(np.log(control_ppl / arm_ppl) * tokens)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', required=True)
    p.add_argument('--name', required=True)
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--dv', type=float, required=True, help="the judge's worth on the base, nats a completion")
    p.add_argument('--control', choices=('judge_off', 'shuffled'), default='judge_off')
    p.add_argument('grpo_args', nargs=argparse.REMAINDER, help="-- then train_grpo.py's options")
    a = p.parse_args()
    grpo_args = a.grpo_args[1:] if a.grpo_args[:1] == ['--'] else a.grpo_args
    os.makedirs(a.out, exist_ok=True)
    rows, effects, gains = [], [], []
    for seed in [int(s) for s in a.seeds.split(',')]:
        arm_path = os.path.join(a.out, f'{a.name}_s{seed}.pt')
        arm = run(grpo_args + [f'--seed={seed}'], arm_path)
        suffix, extra = (('shuffled', ['--reward_shuffle=True']) if a.control == 'shuffled' else
                         ('off', ['--judge_off=True', f"--arm_log={os.path.splitext(arm_path)[0]}_log.jsonl"]))
        off = run(grpo_args + [f'--seed={seed}'], os.path.join(a.out, f'{a.name}_{suffix}_s{seed}.pt'), extra)
        tokens = load_checkpoint(arm_path)['model_args']['block_size'] - PROMPT_LEN
        effect, gain = seed_share(arm['final_val_ppl'], off['final_val_ppl'], tokens)
        effects.append(effect)
        gains.append(gain)
        rows.append(f"| {seed} | {arm['val_ppl_start']:.3f} | {arm['final_val_ppl']:.3f} | {off['final_val_ppl']:.3f} "
                    f"| {effect:+.2%} | {gain:+.3f} | {gain / a.dv:.0%} |")
    method = seed_effect(effects, PPL_MARGIN)
    gain = seed_effect(gains, np.inf)  # the same t interval, on the gains in nats
    half = (gain['ci'][1] - gain['ci'][0]) / 2
    print(f"\n{a.name}: the judge's worth {a.dv:.2f} nats a completion ({tokens} tokens)")
    control = 'judge-off' if a.control == 'judge_off' else 'shuffled-judge'
    print(f'| seed | val ppl at start | arm | {control} control | effect on ppl | gain, nats a completion | share of '
          'the worth |\n|---|---|---|---|---|---|---|')
    print('\n'.join(rows))
    print(f"| **over {len(effects)} seeds** | | | | **{label_text(method)}** {method['effect']:+.2%} "
          f"[{method['ci'][0]:+.2%}, {method['ci'][1]:+.2%}] | {np.mean(gains):+.3f} ± {half:.3f} | "
          f"{np.mean(gains) / a.dv:.0%} ± {half / a.dv:.0%} |")


if __name__ == '__main__':
    main()
