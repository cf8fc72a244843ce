"""
What a game carries of what its judge knows: one train_grpo.py setting run over trainer seeds, each seed beside its
control, and the generator's val likelihood gain over that control in nats per completion, beside the worth in the
same nats of the judge that played (its Donsker-Varadhan bound, worth.py, read on the base the game started from):
the share realised.

  python benchmarks/bench_share.py --out runs/share --name ngram_kl --seeds 1338,2001,3001 \
      [--control judge_off|shuffled|temperature|mle] [--worth_samples 1000] -- --policy_path=BASE.pt ...
      (train_grpo.py's options after --)

The judge that played is each seed's own, as the game saved it (played_judge): a frozen reward model's checkpoint,
the online judge's OUT/NAME_s{seed}_judge.pt, or the n-gram judge's OUT/NAME_s{seed}_judge.json (the texts it was
fitted on; with --judge_update_interval beyond the game's steps, the judge of the warm-up, frozen; with
--judge_update_interval=1, the co-trained judge, saved as refit after the game's last step: it never scored one of the
game's rollouts, so its share reads the worth of the judge the game would have played next). Its worth is read
on the arm's base, on --worth_samples natural val windows against the base's continuations of as many other val
prompts (the seed's own draw, apart from its perplexity windows), and the worth over seeds is their mean with a t
interval. A reward that is no judge (a teacher's log-ratio, known words) has no share.

The controls: judge_off, the same trainer with the judge's signal removed; base, the arm's starting policy itself
(with the KL inside the reward judge-off never moves: it is the base, bit for bit); shuffled, the judge's own rewards
permuted within each group (--reward_shuffle=True): with the KL inside the reward judge-off moves nothing, so only
this control shows what a reward of the judge's scale and within-group spread gains by chance; temperature, the base
sampled at the matched temperature T* (Caccia et al. 2020), the one whose sampler entropy equals the arm's on the same
prompts (the seed's two-sample windows; the base swept over --sweep); mle, the base trained further by next-token loss
for the arm's FLOPs by the cycle's rule (the base's learning rate held, its best checkpoint on the base run's
selection split kept; the base run's config.json beside BASE.pt), its own seed; calibrated, the base at its
tail-calibrated temperature (calibration.calibrated_temperature: fit on the tail its checkpoint held out, never val; zero
FLOPs). The judge's offline training (its recipe) is not in the arm's FLOPs: the MLE control is not given it, which
favours the judge; its recorded FLOPs are printed beside.

Each run is train_grpo.py as a user runs it (OUT/NAME_s{seed}.pt, its control OUT/NAME_off_s{seed}.pt,
OUT/NAME_shuffled_s{seed}.pt or OUT/NAME_mle_s{seed}.pt; a finished one is reused, an interrupted one resumes).
Every model is read here by one reader, on the same device and precision (fp32) and at the arm's sampling temperature
(the matched-temperature control at T*): each seed's own --ppl_windows random val windows (two_sample.eval_windows,
drawn from the seed), so each seed has its own draws. A seed's effect is paired window by window, 1 - ppl(arm) /
ppl(control) with a bootstrap interval, and its gain ln(ppl(control) / ppl(arm)) nats a token times the completion's
tokens (block size minus the two-sample prompt, the windows the judges' worth is read on). The verdict on the method
is verdict.seed_effect's t interval over the seeds; the share's interval carries the worth's own
(verdict.share_interval, Fieller's), and a worth whose interval holds 0 has no share. A run is trained under a lock
on its checkpoint's name, so reads side by side never resume one run in two processes.
"""
import argparse
import fcntl
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from model import GPT, load_checkpoint  # noqa: E402
from policy import prompts_and_splits  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import calibrated_temperature, effect_text, judge_worth, mle_control, window_ce  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from verdict import PPL_MARGIN, label_text, perplexity_effect, seed_effect, share_interval, sweep_parts  # noqa: E402

WORTH_DRAW = 1  # the worth's val windows come from the generator [seed, WORTH_DRAW], apart from the seed's own


def finished(out_path):
    """Whether a train_grpo.py run to out_path has ended: its checkpoint, which each evaluation also writes, holds
    the final perplexity."""
    return os.path.exists(out_path) and 'final_val_ppl' in load_checkpoint(out_path)['metrics']


def run(args, out_path, extra=()):
    """train_grpo.py with these options to out_path, unless it has finished there (an interrupted run resumes);
    returns its metrics. The check and the run hold a lock on out_path + '.lock': a second read waits for the first
    to finish the run, then reuses it."""
    with open(out_path + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
    gen = torch.Generator(device=prompts.device).manual_seed(seed)
    return float(model.generate(prompts, length - prompts.shape[1], temperature, top_k, generator=gen,
                                entropy=True)[1].double().mean())


def played_judge(arm_path):
    """The file of the judge the arm played as the game saved it (train_grpo.py), or None for a reward that is no
    judge: the n-gram judge's texts, the online judge's checkpoint, or the frozen reward model's."""
    cfg = load_checkpoint(arm_path)['config']
    if cfg.get('reward') != 'judge':
        return None
    stem = os.path.splitext(arm_path)[0]
    if cfg.get('judge') == 'ngram':  # a saved judge played frozen, or the one the game fitted
        return cfg.get('reward_model_path') or stem + '_judge.json'
    return stem + '_judge.pt' if cfg.get('judge_update_interval') else cfg['reward_model_path']


def played_worth(arm_path, seed, n, device):
    """The worth of the judge the arm played (played_judge), read on the arm's base at its sampling temperature:
    shared.judge_worth on this seed's own draw of val windows, apart from its perplexity windows; None where the
    reward is no judge."""
    judge = played_judge(arm_path)
    if judge is None:
        return None
    cfg, _, val = arm_setting(arm_path)
    return judge_worth(judge, cfg['policy_path'], val, n, [seed, WORTH_DRAW], device, cfg['temperature'])


def seed_windows(arm_path, seed, n, device):
    """This seed's own n random val windows of the arm's block size, from the val split the arm read."""
    _, base, val = arm_setting(arm_path)
    return eval_windows(val, n, base['model_args']['block_size'], seed)[0].to(device)


@torch.no_grad()
def matched_temperature_ce(arm_path, seed, windows, entropy_windows, sweep):
    """The arm's base at the matched temperature T*: the sweep's temperature whose sampler entropy equals the arm's,
    each continuing the same PROMPT_LEN-token prompts of this seed's two-sample windows (eval_windows), interpolated
    linearly (verdict.sweep_parts); returns T*, whether the arm lay outside the sweep, and the base's cross-entropy
    at T* on each of the windows."""
    cfg, base_ckpt, val = arm_setting(arm_path)
    arm, base = (GPT.from_checkpoint(c, device=windows.device) for c in (arm_path, base_ckpt))
    length = base.config.block_size
    prompts = eval_windows(val, entropy_windows, length, seed)[1][:, :PROMPT_LEN].to(windows.device)
    arm_entropy = sampler_entropy(arm, prompts, length, cfg['temperature'], cfg['top_k'], seed)
    points = [dict(temperature=t, sample_entropy=sampler_entropy(base, prompts, length, t, cfg['top_k'], seed))
              for t in sweep]
    _, parts, outside = sweep_parts(points, arm_entropy)
    t_star = sum(w * p['temperature'] for w, p in parts)
    return t_star, outside, window_ce(base, windows, t_star)


def mle_path(arm_path, arm, seed, out_path):
    """The MLE control given the arm's FLOPs (shared.mle_control, the base run's config.json beside its base)."""
    cfg = arm_setting(arm_path)[0]
    run_config = os.path.join(os.path.dirname(os.path.abspath(cfg['policy_path'])), 'config.json')
    if not os.path.exists(run_config):
        raise SystemExit(f"--control mle trains the base further with its own run's options: {run_config} is missing "
                         "(use a base made by run_cycles.py)")
    with open(run_config) as f:
        run_cfg = json.load(f)
    return mle_control(run_cfg, cfg['policy_path'], arm['flops'], out_path, seed)


def seed_share(arm_ppl, control_ppl, tokens):
    """One seed's paired effect on perplexity, 1 - ppl(arm) / ppl(control), and the arm's gain over its control in
    nats a completion of `tokens` tokens, ln(ppl(control) / ppl(arm)) a token: the unit of the judge's worth."""
    return 1 - arm_ppl / control_ppl, float(np.log(control_ppl / arm_ppl) * tokens)


CONTROL_NAMES = {'judge_off': 'judge-off', 'base': 'base', 'shuffled': 'shuffled-judge',
                 'temperature': 'matched-temperature', 'mle': 'MLE', 'calibrated': 'tail-calibrated'}


def control_ce(a, grpo_args, seed, arm_path, arm, windows, temperature):
    """One seed's control (--control), its cross-entropy on each of the seed's windows at the arm's temperature (the
    matched control at T*), with a note for the table (T*, or '')."""
    if a.control == 'temperature':
        t_star, outside, ce = matched_temperature_ce(arm_path, seed, windows, a.entropy_windows,
                                                     [float(t) for t in a.sweep.split(',')])
        return ce, f" (T* {t_star:.3f}{', outside the sweep' if outside else ''})"
    if a.control == 'calibrated':
        cfg, base_ckpt, _ = arm_setting(arm_path)
        base = GPT.from_checkpoint(base_ckpt, device=windows.device)
        t = calibrated_temperature(base, base_ckpt, cfg['dataset'] or base_ckpt['config']['dataset'], windows.device)[0]
        return window_ce(base, windows, t), f" (T {t:.3f})"
    if a.control == 'base':
        path = arm_setting(arm_path)[0]['policy_path']
    elif a.control == 'mle':
        path = mle_path(arm_path, arm, seed, os.path.join(a.out, f'{a.name}_mle_s{seed}.pt'))
    else:
        suffix, extra = (('shuffled', ['--reward_shuffle=True']) if a.control == 'shuffled' else
                         ('off', ['--judge_off=True', f"--arm_log={os.path.splitext(arm_path)[0]}_log.jsonl"]))
        path = os.path.join(a.out, f'{a.name}_{suffix}_s{seed}.pt')
        run(grpo_args + [f'--seed={seed}'], path, extra)
    return window_ce(GPT.from_checkpoint(path, device=windows.device), windows, temperature), ''


def share_text(gain, gain_half, dv, dv_ci):
    """The share of the worth with its interval (verdict.share_interval), or why it has none."""
    if dv is None:
        return "not defined (the reward is no judge)"
    if dv_ci[0] <= 0 <= dv_ci[1]:
        return f"not defined (the worth's interval [{dv_ci[0]:.2f}, {dv_ci[1]:.2f}] holds 0)"
    ci = share_interval(gain, gain_half, dv, dv_ci)
    if ci is None:
        return f"{gain / dv:.0%} (no bounded interval: one seed, or a worth too uncertain)"
    return f"{gain / dv:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def judge_flops_note(arm_path):
    """The judge's offline training FLOPs as its checkpoint records them (left out of the MLE control's budget)."""
    cfg = load_checkpoint(arm_path)['config']
    if cfg.get('judge') != 'model' or cfg.get('reward') != 'judge':
        return ''
    flops = load_checkpoint(cfg['reward_model_path']).get('flops')
    return (f"; the judge's own training, {flops:.3g} FLOPs (its data not included), is outside the arm's FLOPs and "
            "the MLE control's budget" if flops else '')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', required=True)
    p.add_argument('--name', required=True)
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--worth_samples', type=int, default=1000, help="natural val windows (and as many base "
                   "samples) the worth of the judge that played is read on")
    p.add_argument('--control', choices=tuple(CONTROL_NAMES), default='judge_off')
    p.add_argument('--ppl_windows', type=int, default=400, help="each seed's own val windows the perplexity reads")
    p.add_argument('--sweep', default='0.9,0.95,1.0,1.05,1.1', help="--control temperature: the base's temperatures")
    p.add_argument('--entropy_windows', type=int, default=500, help='--control temperature: prompts the entropy reads')
    p.add_argument('--device', default='cpu', help="where every model is read, in fp32 (cpu, cuda or auto)")
    p.add_argument('grpo_args', nargs=argparse.REMAINDER, help="-- then train_grpo.py's options")
    a = p.parse_args()
    grpo_args = a.grpo_args[1:] if a.grpo_args[:1] == ['--'] else a.grpo_args
    os.makedirs(a.out, exist_ok=True)
    rows, effects, gains, worths = [], [], [], []
    device = resolve_device(a.device)
    for seed in [int(s) for s in a.seeds.split(',')]:
        arm_path = os.path.join(a.out, f'{a.name}_s{seed}.pt')
        arm = run(grpo_args + [f'--seed={seed}'], arm_path)
        windows = seed_windows(arm_path, seed, a.ppl_windows, device)
        arm_ckpt = load_checkpoint(arm_path)
        temperature = arm_ckpt['config']['temperature']
        arm_ce = window_ce(GPT.from_checkpoint(arm_ckpt, device=windows.device), windows, temperature)
        ctrl_ce, note = control_ce(a, grpo_args, seed, arm_path, arm, windows, temperature)
        tokens = windows.shape[1] - PROMPT_LEN
        effect = perplexity_effect(arm_ce, ctrl_ce, seed)
        gain = seed_share(np.exp(arm_ce.mean()), np.exp(ctrl_ce.mean()), tokens)[1]
        effects.append(effect)
        gains.append(gain)
        worth = played_worth(arm_path, seed, a.worth_samples, device)
        worths += [worth] if worth else []
        rows.append(f"| {seed} | {np.exp(arm_ce.mean()):.3f} | {np.exp(ctrl_ce.mean()):.3f}{note} | "
                    f"{effect_text(effect)} | {gain:+.3f} | " + (worth_text(worth) if worth else '–') + ' |')
    method = seed_effect(effects, PPL_MARGIN)
    gain = seed_effect(gains, np.inf)  # the same t interval, on the gains in nats
    half = (gain['ci'][1] - gain['ci'][0]) / 2
    dv, dv_ci = worth_over_seeds(worths)
    print(f"\n{a.name}: {a.ppl_windows} val windows a seed, its own, {tokens} tokens a completion"
          f"{judge_flops_note(arm_path)}")
    control = CONTROL_NAMES[a.control]
    print(f'| seed | arm val ppl | {control} control | effect on ppl [95%, its windows] | gain, nats a completion | '
          'the judge that played: its worth on the base [95%] |\n|---|---|---|---|---|---|')
    print('\n'.join(rows))
    print(f"| **over {len(effects)} seeds** | | | **{label_text(method)}** {method['effect']:+.2%} "
          f"[{method['ci'][0]:+.2%}, {method['ci'][1]:+.2%}] | {np.mean(gains):+.3f} ± {half:.3f} | "
          + ('–' if dv is None else f"{dv:.2f} [{dv_ci[0]:.2f}, {dv_ci[1]:.2f}]") + ' |')
    print(f"share of the worth of the judge that played: {share_text(np.mean(gains), half, dv, dv_ci)}")


def worth_text(worth):
    """A seed's judge and its worth, as the table prints them."""
    return (f"{os.path.relpath(worth['judge'])}: {worth['dv']:.2f} [{worth['dv_ci'][0]:.2f}, "
            f"{worth['dv_ci'][1]:.2f}] (×{worth['dv_scale']:g})")


def worth_over_seeds(worths):
    """The worth of the judges that played over the seeds: their mean with a t interval (verdict.seed_effect's), one
    seed's own bootstrap interval, or (None, None) where no judge played."""
    if not worths:
        return None, None
    if len(worths) == 1:
        return worths[0]['dv'], worths[0]['dv_ci']
    over = seed_effect([w['dv'] for w in worths], np.inf)
    return over['effect'], over['ci']


if __name__ == '__main__':
    main()
