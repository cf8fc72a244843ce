"""
What a game carries of what its judge knows: one train_grpo.py setting run over trainer seeds, each seed beside its
judge-off control (the same trainer, settings and steps with the judge's signal removed), and the generator's val
likelihood gain over that control in nats per completion, beside the judge's worth in the same nats (its
Donsker-Varadhan bound on the base, worth.py, measured before the game): the share realised.

  python benchmarks/bench_share.py --out runs/share --name ngram_kl --dv 1.46 --seeds 1338,2001,3001 \
      [--control judge_off|shuffled|temperature|mle] -- --policy_path=BASE.pt --judge=ngram ... (train_grpo.py's options)

--control shuffled: the control plays the judge's own rewards, permuted across each step's rollouts
(--reward_shuffle=True): with the KL inside the reward, judge-off moves nothing, so only this control shows what a
reward of the judge's scale and spread gains by chance. --control temperature: the base sampled at the matched
temperature T* (Caccia et al. 2020), the one whose sampler entropy equals the arm's on the same prompts (the
seed's two-sample windows; the base swept over --sweep), its perplexity read at T*. --control mle: the base trained
further by next-token loss for the arm's FLOPs, by the cycle's rule (the base's learning rate held, its best
checkpoint on the base run's selection split kept; the base run's config.json beside BASE.pt), its own seed. Each run is train_grpo.py as a user runs it (its checkpoint
OUT/NAME_s{seed}.pt, its control OUT/NAME_off_s{seed}.pt, OUT/NAME_shuffled_s{seed}.pt or OUT/NAME_mle_s{seed}.pt;
a finished one is reused, an interrupted one resumes). Both read val perplexity on the same val tokens, so a seed's
effect is paired: 1 - ppl(arm) / ppl(control), and its gain ln(ppl(control) / ppl(arm)) nats a token times the
completion's tokens (block size minus the two-sample prompt, the windows the judges' worth is read on). The verdict
on the method is verdict.seed_effect's: a t interval over the seeds, each with its own control and draws.
"""
import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from model import GPT, evaluate_perplexity, load_checkpoint  # noqa: E402
from policy import prompts_and_splits  # noqa: E402
from shared import mle_control  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from verdict import PPL_MARGIN, label_text, seed_effect, sweep_parts  # noqa: E402


def finished(out_path):
    """Whether a train_grpo.py run to out_path has ended: its checkpoint, which each evaluation also writes, holds
    the final perplexity."""
    return os.path.exists(out_path) and 'final_val_ppl' in load_checkpoint(out_path)['metrics']


def run(args, out_path, extra=()):
    """train_grpo.py with these options to out_path, unless it has finished there (an interrupted run resumes);
    returns its metrics."""
    if not finished(out_path):
        subprocess.run([sys.executable, os.path.join(ROOT, 'train_grpo.py'), *args, f'--out_path={out_path}',
                        '--resume=True', *extra], check=True)
    return load_checkpoint(out_path)['metrics']


def arm_setting(arm_path):
    """What the arm played on: its train_grpo.py config, its base's checkpoint (the policy it started from) and the
    val split it read (policy.prompts_and_splits, as train_grpo.py resolves it)."""
    cfg = load_checkpoint(arm_path)['config']
    base = load_checkpoint(cfg['policy_path'])
    return cfg, base, prompts_and_splits(SimpleNamespace(**cfg), base['model_args']['block_size'], base)[2]


@torch.no_grad()
def sampler_entropy(model, prompts, length, temperature, top_k, seed):
    """The sampler's mean entropy (nats a generated token) continuing these prompts to `length` tokens."""
    gen = torch.Generator().manual_seed(seed)
    return float(model.generate(prompts, length - prompts.shape[1], temperature, top_k, generator=gen,
                                entropy=True)[1].double().mean())


@torch.no_grad()
def matched_temperature_ppl(arm_path, seed, windows, sweep):
    """The arm's base at the matched temperature T*: the sweep's temperature whose sampler entropy equals the arm's,
    each continuing the same PROMPT_LEN-token prompts of this seed's two-sample windows (eval_windows), interpolated
    linearly (verdict.sweep_parts); returns T*, whether the arm lay outside the sweep, and the base's val perplexity
    at T* on the tokens the arm's own was read on."""
    cfg, base_ckpt, val = arm_setting(arm_path)
    arm, base = GPT.from_checkpoint(arm_path), GPT.from_checkpoint(base_ckpt)
    length = base.config.block_size
    prompts = eval_windows(val, windows, length, seed)[1][:, :PROMPT_LEN]
    arm_entropy = sampler_entropy(arm, prompts, length, cfg['temperature'], cfg['top_k'], seed)
    points = [dict(temperature=t, sample_entropy=sampler_entropy(base, prompts, length, t, cfg['top_k'], seed))
              for t in sweep]
    _, parts, outside = sweep_parts(points, arm_entropy)
    t_star = sum(w * p['temperature'] for w, p in parts)
    ppl = evaluate_perplexity(base, val, length, temperature=t_star, max_tokens=cfg['ppl_max_tokens'])[1]
    return t_star, outside, ppl


def mle_ppl(arm_path, arm, seed, out_path):
    """The MLE control given the arm's FLOPs (shared.mle_control, the base run's config.json beside its base), read
    at the arm's sampling temperature on the tokens the arm's perplexity was read on."""
    cfg, _, val = arm_setting(arm_path)
    run_config = os.path.join(os.path.dirname(os.path.abspath(cfg['policy_path'])), 'config.json')
    if not os.path.exists(run_config):
        raise SystemExit(f"--control mle trains the base further with its own run's options: {run_config} is missing "
                         "(use a base made by run_cycles.py)")
    with open(run_config) as f:
        run_cfg = json.load(f)
    mle = GPT.from_checkpoint(mle_control(run_cfg, cfg['policy_path'], arm['flops'], out_path, seed))
    return evaluate_perplexity(mle, val, mle.config.block_size, temperature=cfg['temperature'],
                               max_tokens=cfg['ppl_max_tokens'])[1]


def seed_share(arm_ppl, control_ppl, tokens):
    """One seed's paired effect on perplexity, 1 - ppl(arm) / ppl(control), and the arm's gain over its control in
    nats a completion of `tokens` tokens, ln(ppl(control) / ppl(arm)) a token: the unit of the judge's worth."""
    return 1 - arm_ppl / control_ppl, float(np.log(control_ppl / arm_ppl) * tokens)


CONTROL_NAMES = {'judge_off': 'judge-off', 'shuffled': 'shuffled-judge', 'temperature': 'matched-temperature',
                 'mle': 'MLE'}


def control_perplexity(a, grpo_args, seed, arm_path, arm):
    """One seed's control (--control) and its val perplexity, with a note for the table (T*, or '')."""
    if a.control == 'temperature':
        t_star, outside, ppl = matched_temperature_ppl(arm_path, seed, a.entropy_windows,
                                                       [float(t) for t in a.sweep.split(',')])
        return ppl, f" (T* {t_star:.3f}{', outside the sweep' if outside else ''})"
    if a.control == 'mle':
        return mle_ppl(arm_path, arm, seed, os.path.join(a.out, f'{a.name}_mle_s{seed}.pt')), ''
    suffix, extra = (('shuffled', ['--reward_shuffle=True']) if a.control == 'shuffled' else
                     ('off', ['--judge_off=True', f"--arm_log={os.path.splitext(arm_path)[0]}_log.jsonl"]))
    return run(grpo_args + [f'--seed={seed}'], os.path.join(a.out, f'{a.name}_{suffix}_s{seed}.pt'),
               extra)['final_val_ppl'], ''


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', required=True)
    p.add_argument('--name', required=True)
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--dv', type=float, required=True, help="the judge's worth on the base, nats a completion")
    p.add_argument('--control', choices=('judge_off', 'shuffled', 'temperature', 'mle'), default='judge_off')
    p.add_argument('--sweep', default='0.9,0.95,1.0,1.05,1.1', help="--control temperature: the base's temperatures")
    p.add_argument('--entropy_windows', type=int, default=500, help='--control temperature: prompts the entropy reads')
    p.add_argument('grpo_args', nargs=argparse.REMAINDER, help="-- then train_grpo.py's options")
    a = p.parse_args()
    grpo_args = a.grpo_args[1:] if a.grpo_args[:1] == ['--'] else a.grpo_args
    os.makedirs(a.out, exist_ok=True)
    rows, effects, gains = [], [], []
    for seed in [int(s) for s in a.seeds.split(',')]:
        arm_path = os.path.join(a.out, f'{a.name}_s{seed}.pt')
        arm = run(grpo_args + [f'--seed={seed}'], arm_path)
        control_ppl, note = control_perplexity(a, grpo_args, seed, arm_path, arm)
        tokens = load_checkpoint(arm_path)['model_args']['block_size'] - PROMPT_LEN
        effect, gain = seed_share(arm['final_val_ppl'], control_ppl, tokens)
        effects.append(effect)
        gains.append(gain)
        rows.append(f"| {seed} | {arm['val_ppl_start']:.3f} | {arm['final_val_ppl']:.3f} | {control_ppl:.3f}{note} "
                    f"| {effect:+.2%} | {gain:+.3f} | {gain / a.dv:.0%} |")
    method = seed_effect(effects, PPL_MARGIN)
    gain = seed_effect(gains, np.inf)  # the same t interval, on the gains in nats
    half = (gain['ci'][1] - gain['ci'][0]) / 2
    print(f"\n{a.name}: the judge's worth {a.dv:.2f} nats a completion ({tokens} tokens)")
    control = CONTROL_NAMES[a.control]
    print(f'| seed | val ppl at start | arm | {control} control | effect on ppl | gain, nats a completion | share of '
          'the worth |\n|---|---|---|---|---|---|---|')
    print('\n'.join(rows))
    print(f"| **over {len(effects)} seeds** | | | | **{label_text(method)}** {method['effect']:+.2%} "
          f"[{method['ci'][0]:+.2%}, {method['ci'][1]:+.2%}] | {np.mean(gains):+.3f} ± {half:.3f} | "
          f"{np.mean(gains) / a.dv:.0%} ± {half / a.dv:.0%} |")


if __name__ == '__main__':
    main()
