"""
Channel (b) of docs/family_bound.md at a plateau: a judge's tilt distilled into the generator by next-token loss,
read against its controls over trainer seeds. For each seed:
  1. prepare_tilt_data.py: --windows prompts of the base's own training tokens, --k base continuations of each, one
     kept ∝ e^{scale·f} (the tilt's windows); and the judge-off control's, one continuation a prompt unresampled;
  2. train.py from the base on each (train.py --mix_dir: --mix_fraction of every batch those windows, the rest
     natural train windows) for --epochs over the windows, at the base's final learning rate held, the best
     checkpoint on the run's selection split kept, as the MLE control keeps its own (run_cycles.mle_args);
  3. the MLE control given the distilled arm's FLOPs: the judge's (--judge_flops), the tilt's sampling, the training;
  4. every model read on the seed's own --ppl_windows val windows (two_sample.eval_windows): cross-entropy of the
     completion after the prompt, and the tilt's own (tilt.tilt_cross_entropy, conservative, at --k), so that the
     gain retained = (CE_base - CE_distilled) / (CE_base - CE_tilt) is read on the same windows; and the matched
     temperature control, the base at the temperature whose sample entropy on the seed's other prompts is the
     distilled arm's (interpolated on --temperatures, as verdict.sweep_parts places a cycle's arm on its sweep).
The verdicts read perplexity over the seeds (verdict.seed_effect), each seed with its own windows, tilt data and
controls. --judge takes what tilt.TiltSource reads: an n-gram judge's .json, a reward model, or a better generator
(its exact log-ratio: the oracle, the positive control of the channel).

  python benchmarks/bench_distill.py --run runs/plateau_min2e-5 --judge JUDGE --judge_flops 1.145e14 [--k 8]
      [--scale 1] [--windows 5000] [--epochs 2] [--mix_fraction 0.5] [--seeds 1338,2001,3001] [--ppl_windows 400]

Everything is written under RUN/distill/ (tilt windows, checkpoints, one record a setting) and reused by a rerun.
"""
import argparse
import json
import math
import os
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
from shared import effect_text, judge_tag, mle_control  # noqa: E402
from tilt import TiltSource, completion_logprob, tilt_cross_entropy  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from verdict import PPL_MARGIN, perplexity_effect, seed_effect, sweep_parts  # noqa: E402

ARMS = ('distilled', 'judge_off', 'mle')


def tilt_windows(A, base, judge, out, seed):
    """prepare_tilt_data.py's folder (made once, then reused): its meta."""
    if not os.path.exists(os.path.join(out, 'meta.json')):
        prepare_tilt_data.main([f'--model_path={base}', f'--judge={judge}', f'--scale={A.scale}', f'--k={A.k}',
                                f'--windows={A.windows}', f'--out_dir={out}', f'--device={A.device}', f'--seed={seed}'])
    with open(os.path.join(out, 'meta.json')) as f:
        return json.load(f)


def seed_figures(A, cfg, base_path, work, tag, seed, device):
    """One seed's arms trained (or read back) and read on its own val windows: per-window completion CE of each."""
    dirs = dict(distilled=os.path.join(work, f'{tag}_s{seed}'),
                judge_off=os.path.join(work, f'off_w{A.windows}_s{seed}'))
    data = {arm: tilt_windows(A, base_path, A.judge if arm == 'distilled' else 'none', d, seed)
            for arm, d in dirs.items()}
    C = configure(DEFAULTS, [f'--{k}={v}' for k, v in cfg.items() if k in DEFAULTS])
    per_iter = flops_per_iteration(C, base_path)
    iters = math.ceil(A.epochs * A.windows / max(1, round(C.batch_size * A.mix_fraction)))
    flops = A.judge_flops + data['distilled']['flops'] + iters * per_iter  # what the MLE control is given
    paths = {}
    for arm, d in dirs.items():  # each trained as the MLE control is, for `iters`, on its windows mixed in
        out = f'{d}_e{A.epochs:g}_m{A.mix_fraction:g}.pt'
        paths[arm] = mle_control(cfg, base_path, iters * per_iter, out, seed,
                                 [f'--mix_dir={d}', f'--mix_fraction={A.mix_fraction}'])
    paths['mle'] = mle_control(cfg, base_path, flops, os.path.join(work, f'mle_at_{flops:.4g}_flops_s{seed}.pt'), seed)
    val = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    base_ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(base_ckpt, device=device)
    natural, prompts = (w.to(device) for w in eval_windows(val, A.ppl_windows, base.config.block_size, seed))
    tokens = natural.shape[1] - PROMPT_LEN
    ce = dict(base=-completion_logprob(base, natural, PROMPT_LEN) / tokens)
    source = TiltSource(A.judge, base, base_ckpt, 1.0, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    ce['tilt'] = tilt_cross_entropy(base, source, natural, PROMPT_LEN, [A.k], A.scale, 1.0, gen)[A.k]['conservative']
    kept, models = {}, {}
    for arm in ARMS:
        ckpt = load_checkpoint(paths[arm])
        models[arm] = GPT.from_checkpoint(ckpt, device=device)
        ce[arm] = -completion_logprob(models[arm], natural, PROMPT_LEN) / tokens
        kept[arm] = [ckpt['iter_num'], ckpt.get('stopped_at', ckpt['iter_num'])]

    def sample_entropy(model, temperature):  # of the laws its continuations of the seed's other prompts came from
        gen = torch.Generator(device=device).manual_seed(seed)
        out = model.generate(prompts[:, :PROMPT_LEN], tokens, temperature, generator=gen, entropy=True)
        return float(out[1].mean())
    sweep = [dict(temperature=t, sample_entropy=sample_entropy(base, t)) for t in A.temperatures]
    _, parts, outside = sweep_parts(sweep, sample_entropy(models['distilled'], 1.0))
    matched = sum(w * p['temperature'] for w, p in parts)  # the base at the distilled arm's sample entropy
    ce['matched'] = -completion_logprob(base, natural, PROMPT_LEN, matched) / tokens
    return dict(ce={k: v.tolist() for k, v in ce.items()}, kept=kept, iters=iters, flops=flops,
                matched_temperature=matched, outside_sweep=outside,
                f_kept=data['distilled']['f_kept'], f_candidates=data['distilled']['f_candidates'],
                ess=data['distilled']['ess'])


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--judge', required=True, help="an n-gram judge's .json, a reward model or a better generator")
    p.add_argument('--judge_flops', type=float, required=True, help="the judge's FLOPs (its data and training)")
    p.add_argument('--k', type=int, default=8, help="candidates a prompt, one kept")
    p.add_argument('--scale', type=float, default=1.0, help="a: the tilt pi·e^{a·f}")
    p.add_argument('--windows', type=int, default=5000, help="train prompts a seed, one tilt window each")
    p.add_argument('--epochs', type=float, default=2.0, help="passes over the tilt's windows")
    p.add_argument('--mix_fraction', type=float, default=0.5, help="rows of every batch from the tilt's windows")
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--ppl_windows', type=int, default=400, help="each seed's own val windows")
    p.add_argument('--temperatures', default='0.9,0.95,1,1.05,1.1', help="the base's sweep for the matched control")
    p.add_argument('--device', default='auto')
    A = p.parse_args()
    A.temperatures = [float(t) for t in A.temperatures.split(',')]
    base_path, config_path = (os.path.join(A.run, f) for f in ('base_model_v1.pt', 'config.json'))
    if not (os.path.exists(base_path) and os.path.exists(config_path)):
        p.error(f"{A.run} lacks base_model_v1.pt or config.json: make it with run_cycles.py ... --num_cycles=0")
    if not os.path.isfile(A.judge):
        p.error(f"--judge={A.judge} is no file: pass an n-gram judge's .json, a reward model or a better generator")
    with open(config_path) as f:
        cfg = json.load(f)
    device = resolve_device(A.device)
    work = os.path.join(A.run, 'distill')
    os.makedirs(work, exist_ok=True)
    tag = f'{judge_tag(A.judge)}_k{A.k}_a{A.scale:g}_w{A.windows}'
    record_path = os.path.join(work, f'{tag}_e{A.epochs:g}_m{A.mix_fraction:g}_read{A.ppl_windows}.json')
    record = {}
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
    controls = ('base', 'matched', 'judge_off', 'mle')  # what the distilled arm is read against
    print(f"| seed | ppl: base / tilt (K = {A.k}) / distilled / judge-off / MLE | T* | iterations kept / trained: "
          f"distilled / judge-off / MLE | distilled vs base | vs matched T | vs judge-off | vs MLE | tilt vs base | "
          f"gain retained |\n|{'---|' * 10}")
    effects, gains = {k: [] for k in (*controls, 'tilt')}, []
    for seed in [int(s) for s in A.seeds.split(',')]:
        if record.get(str(seed), {}).get('temperatures') != A.temperatures:  # new, or read on another sweep
            try:
                record[str(seed)] = dict(seed_figures(A, cfg, base_path, work, tag, seed, device),
                                         temperatures=A.temperatures)
            except UserError as e:
                p.error(str(e))
            write_atomic(record_path, lambda path: json.dump(record, open(path, 'w'), indent=1))
        r = record[str(seed)]
        ce = {k: np.asarray(v) for k, v in r['ce'].items()}
        row = {c: perplexity_effect(ce['distilled'], ce[c], seed) for c in controls}
        row['tilt'] = perplexity_effect(ce['tilt'], ce['base'], seed)
        for k, e in row.items():
            effects[k].append(e)
        gains.append([ce['base'].mean() - ce['distilled'].mean(), ce['base'].mean() - ce['tilt'].mean()])
        print(f"| {seed} | {' / '.join(f'{np.exp(ce[k].mean()):.4f}' for k in ('base', 'tilt', *ARMS))} | "
              f"{r['matched_temperature']:.3f}{' (outside the sweep)' if r['outside_sweep'] else ''} | "
              f"{', '.join('{}/{}'.format(*r['kept'][a]) for a in ARMS)} | "
              + ' | '.join(effect_text(row[k]) for k in (*controls, 'tilt'))
              + f" | {gains[-1][0] / gains[-1][1]:+.0%} |")
    over = {k: seed_effect(v, PPL_MARGIN) for k, v in effects.items()}
    g = np.asarray(gains).mean(0)
    print(f"| **over {len(gains)} seeds** | | | | "
          + ' | '.join(f"**{effect_text(over[k])}**" for k in (*controls, 'tilt'))
          + f" | {g[0] / g[1]:+.0%} (of the mean gains) |")
    print(f"gain retained: {g[0]:+.5f} of the tilt's {g[1]:+.5f} nats a completion token; FLOPs a seed (the MLE "
          f"control's): {r['flops']:.3g}; record: {record_path}")


if __name__ == '__main__':
    main()
