"""
The tilt sampled without RL, read by the verdicts: a generator resampled by a judge's log-odds (or, the positive
control, by a better model's exact log-ratio) against the generator itself and against it at the matched
temperature, on the two-sample test and on its natural completions' perplexity (tilt.py), in each run given (one a
seed, each with its own draws: bench_arms' runs), and over the seeds.

  python benchmarks/bench_tilt.py --runs RUN[,RUN...] --source TEACHER.pt|judge [--tilt_k 32] [--tilt_scale 1]
      [--tilt_windows 250] [--draws SEED,SEED,SEED] [--mle MLE.pt] [--control OTHER.pt] [--out tilt.json]

Each run needs base_model_v1.pt, eval_v1.json and sweep_v1.json (run_cycles.py with its controls); --source judge
tilts each run's base v1 by its own reward_model_v1.pt. The tilt's point is written beside them
(tilt_{source}_k{K}.json) and read again by a rerun. A run with no cycle (a plateau base, run_cycles --num_cycles=0)
is read over --draws SEED,SEED,...: each draw evaluates base v1 at the run's control temperatures with its own
prompts, windows and samples (points_d{SEED}.json) and tilts it with them (tilt_..._d{SEED}.json). --mle adds an MLE
control of the base, read on each draw's windows, and --control any other generator (a checkpoint at T = 1: the
calibrated base beside the tilt of an ensemble) read on them too. The last table reads the tilt's perplexity at every
K of tilt.py (8, 32, 128) against each control over the draws, in nats a token (a character at char level) and a word
(the val split's tokens a word, spaces included), with the estimator's cap, log K nats a completion.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

import calibration  # noqa: E402
import evaluate  # noqa: E402
from data_loader import resolve_data_dir, tokens_a_word  # noqa: E402
from run_cycles import completion_cross_entropy, load_json, tilt_controls  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import judge_tag  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from verdict import PPL_MARGIN, label_text, method_verdict, perplexity_effect, seed_effect, tilt_verdict  # noqa: E402


def evaluate_base(run, path, A, seed, num_samples, dataset, extra):
    """evaluate.py on the run's base v1 with this draw seed (its referee itself), to path unless it is there."""
    if not os.path.exists(path):
        base = os.path.join(run, 'base_model_v1.pt')
        evaluate.main([base, '--dataset', dataset, '--referee', base, '--out', path, '--num_samples', str(num_samples),
                       '--seed', str(seed), '--device', A.device, '--judge_seeds', '0', '--no_mauve',
                       '--c2st_folds', '5', *extra])
    return load_json(path)


def tilt_point(run, source, A, seed, num_samples, dataset, draw=''):
    """The tilt of the run's base v1 by source, evaluated (or read back) with the run's draws (or draw's)."""
    tag = 'judge' if source == os.path.join(run, 'reward_model_v1.pt') else judge_tag(source)
    path = os.path.join(run, f'tilt_{tag}_k{A.tilt_k}_a{A.tilt_scale:g}{draw}.json')
    return evaluate_base(run, path, A, seed, num_samples, dataset,
                         ['--tilt', source, '--tilt_k', str(A.tilt_k), '--tilt_scale', str(A.tilt_scale),
                          '--tilt_windows', str(A.tilt_windows)])[0]


def base_points(run, A, cfg, seed, dataset):
    """Base v1's points the tilt's controls are read from: the cycle's (eval_v1.json, sweep_v1.json), or with
    --draws this draw's own, at the run's control temperatures (points_d{seed}.json)."""
    if not A.draws:
        return load_json(os.path.join(run, 'eval_v1.json')) + load_json(os.path.join(run, 'sweep_v1.json'))
    temperatures = sorted({float(t) for t in cfg['control_temperatures'].split(',')} | {cfg['sample_temperature']})
    return evaluate_base(run, os.path.join(run, f'points_d{seed}.json'), A, seed, cfg['eval_num_samples'], dataset,
                         ['--no_ppl', '--temperatures', ','.join(f'{t:g}' for t in temperatures)])


def tail_calibrated(run, device):
    """The run's base's tail-calibrated temperature, or None where it holds out no tail."""
    return calibration.tail_temperature(os.path.join(run, 'base_model_v1.pt'),
                                     load_json(os.path.join(run, 'config.json'))['dataset'], device)


def completion_controls(run, mle, temperature, dataset, device, tilt, seed, other=''):
    """The controls read on the tilt's natural completions alone (no samples of theirs): the base at its
    tail-calibrated temperature (where it has one), the MLE control (where given) at the tilt's temperature and,
    where it holds out a tail, at its own tail-calibrated one (calibrated again: the strongest cheap control of a base
    that is itself calibrated), and another generator (where given: 'control', at T = 1), each at the tilt's draws."""
    def read(path, t):
        return dict(temperature=t, completion_window_cross_entropy=completion_cross_entropy(
            path, dataset, device, t, tilt['num_samples'], tilt['sample_length'], seed))
    controls = {**({'calibrated': read(os.path.join(run, 'base_model_v1.pt'), temperature)} if temperature else {}),
                **({'mle': read(mle, tilt['temperature'])} if mle else {})}
    mle_temperature = mle and calibration.tail_temperature(mle, dataset, device)
    if mle_temperature:  # an MLE control that holds out no tail has no calibrated reading
        controls['mle_calibrated'] = read(mle, mle_temperature)
    return {**controls, **({'control': read(other, 1.0)} if other else {})}


def per_k_effects(tilt, controls):
    """The tilt's perplexity effect against each control at every K it was read at (its conservative cross-entropy
    on its windows against the control's on the same ones): {K: {control: effect}}."""
    return {K: {name: perplexity_effect(ce, c['completion_window_cross_entropy'][:len(ce)])
                for name, c in controls.items()}
            for K, ce in tilt['tilt_window_cross_entropy'].items()}


def per_k_table(per_k, controls, words_factor, completion_tokens, unit):
    """Over the draws, at each K: the tilt's perplexity effect against each control (t interval over the draws),
    its gain over the base in nats a token (unit: 'char' at char level) and a word, and the estimator's cap, log K
    nats a completion."""
    lines = [f"| K | cap, log K (nats a completion) | gain over the base, nats a {unit} / a word "
             f"({words_factor:.2f} {unit}s a word) | % of ppl a {unit} / a word | "
             + ' | '.join(f'vs {c}' for c in controls) + ' |', '|---' * (4 + len(controls)) + '|']
    for K in per_k[0]:
        over = {c: seed_effect([d[K][c] for d in per_k], PPL_MARGIN) for c in controls}
        gain = -np.log1p(-over['base']['effect'])  # 1 - ppl(tilt)/ppl(base) as nats a token
        lines.append(f"| {K} | {np.log(int(K)):.2f} ({np.log(int(K)) / completion_tokens:.4f} a {unit}) | "
                     f"{gain:.4f} / {gain * words_factor:.3f} | {100 * (1 - np.exp(-gain)):.2f}% / "
                     f"{100 * (1 - np.exp(-gain * words_factor)):.2f}% | "
                     + ' | '.join(effect(over[c]) for c in controls) + ' |')
    return '\n'.join(lines)


def effect(e):
    return f"{label_text(e)} {100 * e['effect']:+.2f}% [{100 * e['ci'][0]:.2f}, {100 * e['ci'][1]:.2f}]" \
        if 'margin' in e and e['margin'] < 0.02 else \
        f"{label_text(e)} {e['effect']:+.3f} [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', required=True, help="comma-separated run folders, one a seed")
    p.add_argument('--source', required=True, help="a better generator's checkpoint, a judge's file, or 'judge'; "
                   "comma-separated: one for each run or draw (each seed its own judge)")
    p.add_argument('--tilt_k', type=int, default=32)
    p.add_argument('--tilt_scale', type=float, default=1.0)
    p.add_argument('--tilt_windows', type=int, default=250)
    p.add_argument('--device', default='auto')
    p.add_argument('--draws', default='', help="draw seeds, comma-separated: one run read over draws of its own")
    p.add_argument('--mle', default='', help="an MLE control of the base (its checkpoint), read on the same windows; "
                   "comma-separated: one for each run or draw, as --source")
    p.add_argument('--control', default='', help="another generator's checkpoint, read at T = 1 on the same windows "
                   "(the calibrated base beside the tilt of an ensemble)")
    p.add_argument('--out', default='')
    A = p.parse_args()
    t0, verdicts, rows, per_k, calibrated = time.time(), [], [], [], {}
    draws = [int(s) for s in A.draws.split(',')] if A.draws else [None]
    reads = [(run, draw) for run in A.runs.split(',') for draw in draws]
    sources, mles = (a.split(',') if a else [''] for a in (A.source, A.mle))
    if {len(sources), len(mles)} - {1, len(reads)}:
        p.error(f"--source and --mle take one path, or one for each of the {len(reads)} runs or draws")
    for i, (run, draw) in enumerate(reads):
        cfg = load_json(os.path.join(run, 'config.json'))
        seed, dataset = draw or cfg['trainer_seed'] or cfg['seed'], resolve_data_dir(cfg['dataset'])
        source, mle = (a[i % len(a)] for a in (sources, mles))
        source = os.path.join(run, 'reward_model_v1.pt') if source == 'judge' else source
        tilt = tilt_point(run, source, A, seed, cfg['eval_num_samples'], dataset, f'_d{seed}' if draw else '')
        points = base_points(run, A, cfg, seed, dataset)
        controls = tilt_controls(points, os.path.join(run, 'base_model_v1.pt'), dataset, resolve_device(A.device),
                                 tilt, seed)
        if run not in calibrated:
            calibrated[run] = tail_calibrated(run, resolve_device(A.device))
        controls.update(completion_controls(run, mle, calibrated[run], dataset, resolve_device(A.device), tilt, seed,
                                            A.control))
        per_k.append(per_k_effects(tilt, controls))
        v = dict(verdicts=tilt_verdict(tilt, controls), draw_seed=seed, matched_temperature=controls['temperature']
                 ['temperature'], tilt_perplexity=tilt['tilt_perplexity'], tilt_ess=tilt['tilt_ess'],
                 c2st_auc=tilt['c2st_auc'])
        verdicts.append(v)
        # each draw's reading as it finishes: a run cut off (a GPU lease's step) keeps the draws it read
        print(f"draw {seed}, K = {A.tilt_k}: " + '; '.join(
            f"vs {c} {effect(e['perplexity_effect'])}" for c, e in v['verdicts'].items()), flush=True)
        ppl = ', '.join(f"K={K} {c['conservative']:.3f} / {c['optimistic']:.3f}" for K, c in
                        tilt['tilt_perplexity'].items())
        rows.append(f"| {seed} | {ppl} | {tilt['tilt_ess']:.2f} | {tilt['c2st_auc']:.3f} | "
                    f"{v['matched_temperature']:.2f} | "
                    + ' | '.join(f"{effect(v['verdicts'][c]['perplexity_effect'])}; "
                                 f"{effect(v['verdicts'][c]['c2st_effect'])}" for c in ('base', 'temperature'))
                    + (f" | {effect(v['verdicts']['calibrated']['perplexity_effect'])} ({calibrated[run]:.3f})"
                       if 'calibrated' in controls else ' | –') + ' |')
    print(f"\ntilt of base v1 by {A.source} at K = {A.tilt_k}, scale {A.tilt_scale:g}\n"
          "| draw seed | tilt's perplexity, conservative / optimistic | ESS of K | two-sample AUC | matched T | "
          "vs base: perplexity; two-sample | vs matched temperature: perplexity; two-sample | "
          "vs tail-calibrated T: perplexity (T) |\n" + '|---' * 8 + '|')
    print('\n'.join(rows))
    over = {c: method_verdict(verdicts, c) for c in ('base', 'temperature', 'calibrated', 'mle', 'mle_calibrated',
                                                     'control')
            if all(c in v['verdicts'] for v in verdicts)}
    for c, m in over.items():
        print(f"over {len(verdicts)} seeds vs {c}: perplexity "
              + (effect(m['perplexity_effect']) if m['perplexity_effect'] else '–')
              + "; two-sample " + (effect(m['c2st_effect']) if m['c2st_effect'] else '–'))
    val = np.memmap(os.path.join(dataset, 'val.bin'), dtype=np.uint16, mode='r')
    print(f"\nthe tilt's perplexity at each K, conservative (tilt.py), on "
          f"{len(tilt['completion_window_cross_entropy'])} natural completions a draw of "
          f"{tilt['sample_length'] - evaluate.PROMPT_LEN} tokens, over {len(per_k)} draws")
    tokenizer = TokenizationManager('auto', data_dir=dataset)
    print(per_k_table(per_k, list(controls), tokens_a_word(val, tokenizer), tilt['sample_length'] - evaluate.PROMPT_LEN,
                      'char' if tokenizer.method == 'char' else 'token'))
    print(f"{time.time() - t0:.0f} s")
    if A.out:
        with open(A.out + '.tmp', 'w') as f:
            json.dump(dict(args=vars(A), seeds=verdicts, over_seeds=over, per_k=per_k), f, indent=1)
        os.replace(A.out + '.tmp', A.out)


if __name__ == '__main__':
    main()
