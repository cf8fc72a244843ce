"""
The channels of docs/family_bound.md at a plateau: a judge's tilt pi·e^{a·f} carried into the generator itself, read
against its controls over trainer seeds. --channel picks how it is carried:
  distill (b): prepare_tilt_data.py takes --windows prompts of the base's own training tokens and --k base
     continuations of each, one kept ∝ e^{a·f} (the tilt's windows), and the judge-off control's, one continuation a
     prompt unresampled; train.py from the base on each (--mix_dir: --mix_fraction of every batch those windows, the
     rest natural train windows) for --epochs over the windows, at the base's final learning rate held, the best
     checkpoint on the run's selection split kept, as the MLE control keeps its own (run_cycles.mle_args);
     --keep=all keeps every candidate instead, each window's loss weighted w - 1 (the anchor that subtracts the same
     loss on the base's unresampled continuations; its judge-off control's weights are all 0);
  game (a): train_grpo.py from the base for --steps, the tilt's game (the KL inside the reward, scale a: its fixed
     point the tilt, reached as its reverse-KL projection);
  dpg (c): train_grpo.py --objective=dpg for --steps (the forward KL's policy gradient, Korbak et al.'s baseline);
     --proposal=gated draws its rollouts from a proposal that takes the policy's weights only when the forward KL to
     the tilt falls (GDC's gate, train_grpo.py --proposal).
  --from_mle=FLOPS starts each seed's arm, and reads it, from that seed's MLE control at FLOPS instead of the base
  (trained once from the base, as the MLE controls are, and reused): whether the channel adds to next-token
  training, the base's own controls (matched temperature, judge-off, MLE) then taken from that start.
  The games draw 8 prompts of the base's training tokens a step and --k continuations of each, the prompts as long as
  the read's; their last policy is kept (no selection). Their judge-off control is the base itself: with f = 0 every
  advantage is 0 and the trainer leaves the weights as they are (tests/test_grpo.py holds it to that).
Then, for each seed:
  1. the MLE control given the arm's FLOPs: the judge's (--judge_flops), the tilt's sampling or the game's, the
     training; read at its best checkpoint on the selection tail (which can be its start) and, as the games keep
     their last policy, at the weights where it stopped (vs MLE's last: the games' selection on the control's side);
  2. every model read on the seed's own --ppl_windows val windows (two_sample.eval_windows): cross-entropy of the
     completion after the prompt, and the tilt's own (tilt.tilt_cross_entropy, conservative, at --k), so that the
     gain retained = (CE_base - CE_arm) / (CE_base - CE_tilt) is read on the same windows (biased up: CE_tilt is
     the tilt's conservative cross-entropy, which understates the tilt's gain, so the ratio overstates the share an
     arm kept; '–' where the tilt gains nothing, retained_text); and the matched
     temperature control, the base at the temperature whose sample entropy on the seed's other prompts is the
     arm's (interpolated on --temperatures, as verdict.sweep_parts places a cycle's arm on its sweep); and the
     tail-calibrated control, the base at the temperature that its held-out selection tail reads best
     (calibration.calibrated_temperature): what one scalar fit by maximum likelihood buys a base that is over-confident;
     and the arm at its own calibrated temperature against it (both calibrated: what the channel adds past that),
     and against the MLE control at its own (MLE calibrated again: what the channel adds past both).
The verdicts read perplexity over the seeds (verdict.seed_effect), each seed with its own windows, tilt data or
rollouts, and controls. --judge takes what tilt.TiltSource reads: an n-gram judge's .json, a reward model, or a
better generator (its exact log-ratio: the oracle, the positive control of a channel; a game plays it as
train_grpo.py --reward=teacher_ratio, with --instrument, a judge, scoring beside it as train_grpo.py asks).

  python benchmarks/bench_channels.py --run runs/plateau_min2e-5 --judge JUDGE --judge_flops 1.145e14
      [--channel distill] [--k 8] [--scale 1] [--windows 5000] [--epochs 2] [--mix_fraction 0.5] [--keep one]
      [--steps 600]
      [--instrument JUDGE.json] [--from_mle FLOPS] [--seeds 1338,2001,3001] [--ppl_windows 400]

Everything is written under RUN/channels/ (tilt windows, checkpoints, one record a setting) and reused by a rerun.
"""
import argparse
import functools
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import prepare_tilt_data  # noqa: E402
from configurator import UserError, configure  # noqa: E402
from data_loader import resolve_data_dir, write_atomic  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from run_cycles import DEFAULTS, flops_per_iteration  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import (base_calibrated_temperature, calibrated_temperature, effect_text, judge_tag,  # noqa: E402
                    last_of, mle_control, run_files)
from tilt import TiltSource, completion_logprob, tilt_cross_entropy  # noqa: E402
from two_sample import PROMPT_LEN, completion_texts, eval_windows  # noqa: E402
from verdict import AUC_MARGIN, PPL_MARGIN, c2st_effect, perplexity_effect, seed_effect, sweep_parts  # noqa: E402

ARMS = ('distilled', 'judge_off', 'mle')
KEEP_TAG = dict(one='', all='_all')  # one kept a prompt (the first records' names), or all, weighted w - 1


def tilt_windows(A, base, judge, out, seed):
    """prepare_tilt_data.py's folder (made once, then reused): its meta."""
    if not os.path.exists(os.path.join(out, 'meta.json')):
        prepare_tilt_data.main([f'--model_path={base}', f'--judge={judge}', f'--scale={A.scale}', f'--k={A.k}',
                                f'--windows={A.windows}', f'--out_dir={out}', f'--device={A.device}', f'--seed={seed}',
                                f'--keep={A.keep}'])
    with open(os.path.join(out, 'meta.json')) as f:
        return json.load(f)


def distill_arms(A, cfg, base_path, work, tag, seed):
    """Channel (b)'s arms (trained once, then reused): their paths, iterations, the MLE control's FLOPs and the
    figures of the tilt's windows."""
    dirs = dict(distilled=os.path.join(work, f'{tag}_s{seed}'),
                judge_off=os.path.join(work, f'off_w{A.windows}{KEEP_TAG[A.keep]}_s{seed}'))
    data = {arm: tilt_windows(A, base_path, A.judge if arm == 'distilled' else 'none', d, seed)
            for arm, d in dirs.items()}
    C = configure(DEFAULTS, [f'--{k}={v}' for k, v in cfg.items() if k in DEFAULTS])
    per_iter = flops_per_iteration(C, base_path)
    iters = math.ceil(A.epochs * A.windows / max(1, round(C.batch_size * A.mix_fraction)))
    paths = {}
    for arm, d in dirs.items():  # each trained as the MLE control is, for `iters`, on its windows mixed in
        paths[arm] = mle_control(cfg, base_path, iters * per_iter, f'{d}_e{A.epochs:g}_m{A.mix_fraction:g}.pt', seed,
                                 [f'--mix_dir={d}', f'--mix_fraction={A.mix_fraction}'])
    tilt = data['distilled']
    return paths, iters, tilt['flops'] + iters * per_iter, \
        dict(f_kept=tilt['f_kept'], f_candidates=tilt['f_candidates'], ess=tilt['ess'])


def game_options(A, base_path):
    """train_grpo.py's options for channel (a) or (c): the judge frozen (or the oracle's exact log-ratio, --instrument
    scoring beside it), the tilt's scale, 8 prompts a step of the read's prompt length, --k continuations of each."""
    def frozen(judge):  # an n-gram judge's file or a reward model, played frozen
        return (['--judge=ngram'] if judge.endswith('.json') else []) + [f'--reward_model_path={judge}']
    kind = TiltSource.kind_of(A.judge)
    judge = (frozen(A.instrument) + ['--reward=teacher_ratio', f'--teacher_path={A.judge}']
             if kind == 'exact log-ratio' else frozen(A.judge) + ['--reward_form=log_odds'])
    objective = (['--objective=dpg', f'--proposal={A.proposal}'] if A.channel == 'dpg' else
                 ['--kl_in_reward=True', '--scale_rewards=none', '--loss_type=dr_grpo'])
    return [f'--policy_path={base_path}', f'--device={A.device}', f'--max_steps={A.steps}', '--prompts_per_step=8',
            f'--num_generations={A.k}', f'--min_prompt_len={PROMPT_LEN}', f'--max_prompt_len={PROMPT_LEN}',
            f'--learning_rate={A.game_lr}', '--beta=0', f'--reward_scale={A.scale}',
            f'--eval_interval={max(1, A.steps // 4)}', '--ppl_max_tokens=20000', *judge, *objective]


def game_arms(A, cfg, base_path, work, tag, seed):
    """Channel (a) or (c)'s arm (played once, then reused; its judge-off control is the base): as distill_arms."""
    out = os.path.join(work, f'{tag}_s{seed}.pt')
    if not os.path.exists(out):  # written at each evaluation: played under another name, resumed if cut short
        partial = out[:-len('.pt')] + '_partial.pt'
        subprocess.run([sys.executable, os.path.join(ROOT, 'train_grpo.py'), *game_options(A, base_path),
                        f'--seed={seed}', f'--out_path={partial}', '--resume=True'], check=True,
                       stdout=subprocess.DEVNULL)
        os.replace(partial, out)
    m = load_checkpoint(out)['metrics']
    return dict(distilled=out, judge_off=base_path), len(m['history']), m['flops'] + m['teacher_flops'], {}


@functools.cache
def mle_path(folder, flops, seed):
    """Where the MLE control of a seed at these FLOPs is written (and found again: a --from_mle start reuses the
    base's own MLE control of those FLOPs)."""
    return os.path.join(folder, f'mle_at_{flops:.4g}_flops_s{seed}.pt')


def seed_start(A, cfg, base_path, seed):
    """The seed's start: the base, or (--from_mle) the seed's MLE control at A.from_mle FLOPs from the base."""
    if not A.from_mle:
        return base_path
    return mle_control(cfg, base_path, A.from_mle, mle_path(os.path.join(A.run, 'channels'), A.from_mle, seed), seed)


def seed_figures(A, cfg, base_path, work, tag, seed, device):
    """One seed's arms trained (or read back) from base_path, its start, and read on its own val windows: per-window
    completion CE of each, and the start's tail-calibrated temperature."""
    paths, iters, arm_flops, tilt_figures = (distill_arms if A.channel == 'distill' else game_arms)(
        A, cfg, base_path, work, tag, seed)
    flops = A.judge_flops + arm_flops  # what the MLE control is given
    paths['mle'] = mle_control(cfg, base_path, flops, mle_path(work, flops, seed), seed, keep_last=True)
    calibrated, tail_ppl, tail_ppl_1 = base_calibrated_temperature(base_path, cfg['dataset'], device)
    return dict(read_seed(A, cfg, paths, base_path, seed, device, calibrated), iters=iters, flops=flops,
                calibrated=[calibrated, tail_ppl, tail_ppl_1], start=base_path, **tilt_figures)


def read_seed(A, cfg, paths, base_path, seed, device, calibrated):
    """Every model at paths, the base and its tilt read on the seed's val windows: each window's completion
    cross-entropy; the matched temperature; the two-sample test of the arm's continuations of the seed's other
    prompts against the natural windows, beside the base's, the matched temperature's and the MLE control's; and
    the arm at its own tail-calibrated temperature."""
    base_ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(base_ckpt, device=device)
    natural, prompts = seed_windows(A, cfg, base.config.block_size, seed, device)
    tokens = natural.shape[1] - PROMPT_LEN
    ce = dict(base=-completion_logprob(base, natural, PROMPT_LEN) / tokens)
    source = TiltSource(A.judge, base, base_ckpt, 1.0, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    ce['tilt'] = tilt_cross_entropy(base, source, natural, PROMPT_LEN, [A.k], A.scale, 1.0, gen)[A.k]['conservative']
    kept, models, ckpts = {}, {}, {}
    for arm in ARMS:
        ckpts[arm] = ckpt = load_checkpoint(paths[arm])
        models[arm] = GPT.from_checkpoint(ckpt, device=device)
        ce[arm] = -completion_logprob(models[arm], natural, PROMPT_LEN) / tokens
        kept[arm] = [ckpt['iter_num'], ckpt.get('stopped_at', ckpt['iter_num'])] if paths[arm] != base_path else None
    # the MLE control where it stopped, as the games are read (they keep their last policy), beside its best on the tail
    ce['mle_last'] = -completion_logprob(GPT.from_checkpoint(last_of(paths['mle']), device=device), natural,
                                         PROMPT_LEN) / tokens
    # the arm at its own tail-calibrated temperature: read against the base at its own, what survives calibration,
    # and against the MLE control calibrated again (the strongest cheap control of a trained arm)
    arm_calibrated, ce['distilled_calibrated'] = calibrated_ce(models['distilled'], ckpts['distilled'], natural, cfg,
                                                               device)
    mle_calibrated, ce['mle_calibrated'] = calibrated_ce(models['mle'], ckpts['mle'], natural, cfg, device)
    natural_texts = completion_texts(source.tokenizer, natural)

    def point(model, temperature):  # its continuations of the seed's other prompts, and their laws' entropy
        gen = torch.Generator(device=device).manual_seed(seed)
        samples, entropy = model.generate(prompts[:, :PROMPT_LEN], tokens, temperature, generator=gen, entropy=True)
        return dict(temperature=temperature, sample_entropy=float(entropy.mean()), c2st_natural_texts=natural_texts,
                    c2st_sample_texts=completion_texts(source.tokenizer, samples))
    sweep = [point(base, t) for t in A.temperatures]
    arm, mle = point(models['distilled'], 1.0), point(models['mle'], 1.0)
    _, parts, outside = sweep_parts(sweep, arm['sample_entropy'])
    matched = sum(w * p['temperature'] for w, p in parts)  # the base at the arm's sample entropy
    ce['matched'] = -completion_logprob(base, natural, PROMPT_LEN, matched) / tokens
    ce['calibrated'] = -completion_logprob(base, natural, PROMPT_LEN, calibrated) / tokens
    at_one = next((p for p in sweep if p['temperature'] == 1.0), None) or point(base, 1.0)  # the sweep's T = 1
    c2st = {name: c2st_effect(arm, control, seed) for name, control in
            (('base', at_one), ('matched', dict(c2st_parts=parts)), ('mle', mle))}
    return dict(ce={k: v.tolist() for k, v in ce.items()}, kept=kept, matched_temperature=matched,
                arm_calibrated_temperature=arm_calibrated, mle_calibrated_temperature=mle_calibrated,
                outside_sweep=outside, c2st=json.loads(json.dumps(c2st, default=float)))


def seed_windows(A, cfg, block_size, seed, device):
    """The seed's own val windows: its natural windows, read, and its other prompts, continued
    (two_sample.eval_windows)."""
    val = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    return tuple(w.to(device) for w in eval_windows(val, A.ppl_windows, block_size, seed))


def calibrated_ce(model, ckpt, natural, cfg, device):
    """A model at its own tail-calibrated temperature: that temperature, and each window's completion cross-entropy
    there."""
    temperature = calibrated_temperature(model, ckpt, cfg['dataset'], device)[0]
    return temperature, -completion_logprob(model, natural, PROMPT_LEN, temperature) / (natural.shape[1] - PROMPT_LEN)


def add_mle_calibrated(A, cfg, work, r, seed, device):
    """A record read before the MLE control was calibrated again: that control alone read now, on the seed's own
    windows (the arms and the other figures are kept)."""
    ckpt = load_checkpoint(mle_path(work, r['flops'], seed))
    model = GPT.from_checkpoint(ckpt, device=device)
    natural = seed_windows(A, cfg, model.config.block_size, seed, device)[0]
    temperature, ce = calibrated_ce(model, ckpt, natural, cfg, device)
    r['ce']['mle_calibrated'], r['mle_calibrated_temperature'] = ce.tolist(), temperature


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--judge', required=True, help="an n-gram judge's .json, a reward model or a better generator")
    p.add_argument('--judge_flops', type=float, required=True, help="the judge's FLOPs (its data and training)")
    p.add_argument('--channel', default='distill', choices=('distill', 'game', 'dpg'),
                   help="(b) distill, (a) the tilt's game or (c) DPG")
    p.add_argument('--k', type=int, default=8, help="candidates a prompt, one kept")
    p.add_argument('--scale', type=float, default=1.0, help="a: the tilt pi·e^{a·f}")
    p.add_argument('--windows', type=int, default=5000, help="train prompts a seed, one tilt window each")
    p.add_argument('--epochs', type=float, default=2.0, help="passes over the tilt's windows")
    p.add_argument('--mix_fraction', type=float, default=0.5, help="rows of every batch from the tilt's windows")
    p.add_argument('--keep', default='one', choices=tuple(KEEP_TAG),
                   help="distill: one candidate a prompt kept ∝ e^{a·f}, or all, weighted w - 1")
    p.add_argument('--proposal', default='policy', choices=('policy', 'gated'),
                   help="dpg: its rollouts drawn by the policy (on-policy) or by GDC's gated proposal")
    p.add_argument('--steps', type=int, default=600, help="game, dpg: the trainer's steps")
    p.add_argument('--game_lr', type=float, default=1e-5, help="game, dpg: the trainer's learning rate")
    p.add_argument('--instrument', default='', help="game, dpg with an oracle: the judge that scores beside it")
    p.add_argument('--from_mle', type=float, default=0,
                   help="start each seed from its MLE control at these FLOPs from the base (0: from the base)")
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--ppl_windows', type=int, default=400, help="each seed's own val windows")
    p.add_argument('--temperatures', default='0.9,0.95,1,1.05,1.1', help="the base's sweep for the matched control")
    p.add_argument('--device', default='auto')
    A = p.parse_args()
    A.temperatures = [float(t) for t in A.temperatures.split(',')]
    base_path, _, cfg = run_files(A.run, p)
    if not os.path.isfile(A.judge):
        p.error(f"--judge={A.judge} is no file: pass an n-gram judge's .json, a reward model or a better generator")
    if A.from_mle < 0:
        p.error(f"--from_mle takes the start's MLE FLOPs (0: start from the base), got {A.from_mle:g}")
    if A.channel != 'distill' and TiltSource.kind_of(A.judge) == 'exact log-ratio' and not os.path.isfile(A.instrument):
        p.error(f"--channel={A.channel} plays an oracle as train_grpo.py --reward=teacher_ratio, beside a judge that "
                f"scores as an instrument: pass --instrument=JUDGE (an n-gram judge's .json or a reward model)")
    device = resolve_device(A.device)
    # started from MLE controls, the arms and their own controls live apart from the base's, whose names they share
    work = os.path.join(A.run, 'channels', f'from_mle_{A.from_mle:.4g}' if A.from_mle else '')
    os.makedirs(work, exist_ok=True)
    if A.channel == 'distill':
        tag = f'{judge_tag(A.judge)}_k{A.k}_a{A.scale:g}_w{A.windows}{KEEP_TAG[A.keep]}'
        record_path = os.path.join(work, f'{tag}_e{A.epochs:g}_m{A.mix_fraction:g}_read{A.ppl_windows}.json')
    else:
        gated = '_gated' if A.channel == 'dpg' and A.proposal == 'gated' else ''
        tag = f'{judge_tag(A.judge)}_{A.channel}{gated}_k{A.k}_a{A.scale:g}_lr{A.game_lr:g}_{A.steps}steps'
        record_path = os.path.join(work, f'{tag}_read{A.ppl_windows}.json')
    arm = dict(distill='distilled', game='game', dpg='DPG')[A.channel]
    record = {}
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
    try:
        calibrated, tail_ppl, tail_ppl_1 = base_calibrated_temperature(base_path, cfg['dataset'], device)
    except UserError as e:
        p.error(str(e))
    controls = ('base', 'matched', 'calibrated', 'judge_off', 'mle', 'mle_last')  # what the arm is read against
    print(f"| seed | ppl: base / tilt (K = {A.k}) / {arm} / judge-off / MLE | T* | iterations kept / trained: "
          f"{arm} / judge-off / MLE | {arm} vs base | vs matched T | vs tail-calibrated T | vs judge-off | vs MLE | "
          f"vs MLE's last | tilt vs base | gain retained | each at its tail-calibrated T (arm's T) | vs MLE, both "
          f"calibrated (MLE's T) |\n|{'---|' * 14}")
    effects, gains = {k: [] for k in (*controls, 'tilt', 'both_calibrated', 'mle_calibrated')}, []
    for seed in [int(s) for s in A.seeds.split(',')]:
        old = record.get(str(seed), {})
        # new, read on another sweep, or before the two-sample test or the calibrated control: (re)read, the arms
        # reused
        if old.get('temperatures') != A.temperatures or 'c2st' not in old \
                or 'distilled_calibrated' not in old['ce'] or 'mle_last' not in old['ce']:
            try:
                record[str(seed)] = dict(seed_figures(A, cfg, seed_start(A, cfg, base_path, seed), work, tag, seed,
                                                      device),
                                         temperatures=A.temperatures)
            except UserError as e:
                p.error(str(e))
            write_atomic(record_path, lambda path: json.dump(record, open(path, 'w'), indent=1))
        elif 'mle_calibrated' not in old['ce']:
            add_mle_calibrated(A, cfg, work, old, seed, device)
            write_atomic(record_path, lambda path: json.dump(record, open(path, 'w'), indent=1))
        r = record[str(seed)]
        ce = {k: np.asarray(v) for k, v in r['ce'].items()}
        row = {c: perplexity_effect(ce['distilled'], ce[c], seed) for c in controls}
        row['tilt'] = perplexity_effect(ce['tilt'], ce['base'], seed)
        row['both_calibrated'] = perplexity_effect(ce['distilled_calibrated'], ce['calibrated'], seed)
        row['mle_calibrated'] = perplexity_effect(ce['distilled_calibrated'], ce['mle_calibrated'], seed)
        for k, e in row.items():
            effects[k].append(e)
        gains.append([ce['base'].mean() - ce['distilled'].mean(), ce['base'].mean() - ce['tilt'].mean()])
        print(f"| {seed} | {' / '.join(f'{np.exp(ce[k].mean()):.4f}' for k in ('base', 'tilt', *ARMS))} | "
              f"{r['matched_temperature']:.3f}{' (outside the sweep)' if r['outside_sweep'] else ''} | "
              f"{', '.join('{}/{}'.format(*r['kept'][a]) if r['kept'][a] else 'the base' for a in ARMS)} | "
              + ' | '.join(effect_text(row[k]) for k in (*controls, 'tilt'))
              + f" | {retained_text(*gains[-1])} | {effect_text(row['both_calibrated'])} "
              f"({r['arm_calibrated_temperature']:.3f}) | {effect_text(row['mle_calibrated'])} "
              f"({r['mle_calibrated_temperature']:.3f}) |")
    over = {k: seed_effect(v, PPL_MARGIN) for k, v in effects.items()}
    g = np.asarray(gains).mean(0)
    print(f"| **over {len(gains)} seeds** | | | | "
          + ' | '.join(f"**{effect_text(over[k])}**" for k in (*controls, 'tilt'))
          + f" | {retained_text(*g)} (of the mean gains) | **{effect_text(over['both_calibrated'])}** | "
          f"**{effect_text(over['mle_calibrated'])}** |")
    print(f"gain retained: {g[0]:+.5f} of the tilt's {g[1]:+.5f} nats a completion token; FLOPs a seed (the MLE "
          f"control's): {r['flops']:.3g}; the run's base's tail-calibrated temperature {calibrated:.3f} (its "
          f"selection tail reads ppl {tail_ppl:.4f} there, {tail_ppl_1:.4f} at T = 1); record: {record_path}")
    if A.from_mle:
        print('each seed started from its MLE control (the "base" above): ' + '; '.join(
            f"{s}: {record[s]['start']}, tail-calibrated T {record[s]['calibrated'][0]:.3f}"
            for s in A.seeds.split(',')))
    c2st_table(record, A.seeds, arm)


def retained_text(arm_gain, tilt_gain):
    """The share of its tilt's gain an arm kept (nats a token each, over the base), or '–' where the tilt gained
    nothing: no share of nothing. Biased up: the tilt's gain is its conservative one (tilt.py), an underestimate."""
    return f"{arm_gain / tilt_gain:+.0%}" if tilt_gain > 0 else '–'


def c2st_table(record, seeds, arm):
    """The two-sample test over the seeds: the arm's AUC against natural val text (0.5: the referee cannot tell),
    and its effect against each control (AUC(control) - AUC(arm): positive, the arm's text the closer)."""
    seeds = seeds.split(',')
    controls = ('base', 'matched', 'mle')
    print(f"\n| seed | two-sample AUC of the {arm} arm | vs base | vs matched T | vs MLE |\n|{'---|' * 5}")
    for seed in seeds:
        c = record[seed]['c2st']
        print(f"| {seed} | {c['base']['arm_auc']:.3f} | " + ' | '.join(effect_text(c[k], unit='auc') for k in controls)
              + ' |')
    over = {k: seed_effect([record[s]['c2st'][k] for s in seeds], AUC_MARGIN) for k in controls}
    print(f"| **over {len(seeds)} seeds** | | "
          + ' | '.join(f"**{effect_text(over[k], unit='auc')}**" for k in controls) + ' |')


if __name__ == '__main__':
    main()
