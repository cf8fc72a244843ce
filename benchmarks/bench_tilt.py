"""
The tilt sampled without RL, read by the verdicts: a generator resampled by a judge's log-odds (or, the positive
control, by a better model's exact log-ratio) against the generator itself and against it at the matched
temperature, on the two-sample test and on its natural completions' perplexity (tilt.py), in each run given (one a
seed, each with its own draws: bench_arms' runs), and over the seeds.

  python benchmarks/bench_tilt.py --runs RUN[,RUN...] --source TEACHER.pt|judge [--tilt_k 32] [--tilt_scale 1]
      [--tilt_windows 250] [--out tilt.json]

Each run needs base_model_v1.pt, eval_v1.json and sweep_v1.json (run_cycles.py with its controls); --source judge
tilts each run's base v1 by its own reward_model_v1.pt. The tilt's point is written beside them
(tilt_{source}_k{K}.json) and read again by a rerun.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evaluate  # noqa: E402
from data_loader import resolve_data_dir  # noqa: E402
from run_cycles import load_json, tilt_controls  # noqa: E402
from runtime import resolve_device  # noqa: E402
from verdict import label_text, method_verdict, tilt_verdict  # noqa: E402


def tilt_point(run, source, A, seed, num_samples, dataset):
    """The tilt of the run's base v1 by source, evaluated (or read back) with the run's draws."""
    tag = 'judge' if source == os.path.join(run, 'reward_model_v1.pt') else \
        os.path.splitext(os.path.basename(source))[0]
    path = os.path.join(run, f'tilt_{tag}_k{A.tilt_k}_a{A.tilt_scale:g}.json')
    if not os.path.exists(path):
        base = os.path.join(run, 'base_model_v1.pt')
        evaluate.main([base, '--dataset', dataset, '--referee', base, '--out', path, '--num_samples', str(num_samples),
                       '--seed', str(seed), '--device', A.device, '--judge_seeds', '0', '--no_mauve',
                       '--c2st_folds', '5', '--tilt', source, '--tilt_k', str(A.tilt_k),
                       '--tilt_scale', str(A.tilt_scale), '--tilt_windows', str(A.tilt_windows)])
    return load_json(path)[0]


def effect(e):
    return f"{label_text(e)} {100 * e['effect']:+.2f}% [{100 * e['ci'][0]:.2f}, {100 * e['ci'][1]:.2f}]" \
        if 'margin' in e and e['margin'] < 0.02 else \
        f"{label_text(e)} {e['effect']:+.3f} [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', required=True, help="comma-separated run folders, one a seed")
    p.add_argument('--source', required=True, help="a better generator's checkpoint, or 'judge'")
    p.add_argument('--tilt_k', type=int, default=32)
    p.add_argument('--tilt_scale', type=float, default=1.0)
    p.add_argument('--tilt_windows', type=int, default=250)
    p.add_argument('--device', default='auto')
    p.add_argument('--out', default='')
    A = p.parse_args()
    t0, verdicts, rows = time.time(), [], []
    for run in A.runs.split(','):
        cfg = load_json(os.path.join(run, 'config.json'))
        seed, dataset = cfg['trainer_seed'] or cfg['seed'], resolve_data_dir(cfg['dataset'])
        source = os.path.join(run, 'reward_model_v1.pt') if A.source == 'judge' else A.source
        tilt = tilt_point(run, source, A, seed, cfg['eval_num_samples'], dataset)
        points = load_json(os.path.join(run, 'eval_v1.json')) + load_json(os.path.join(run, 'sweep_v1.json'))
        controls = tilt_controls(points, os.path.join(run, 'base_model_v1.pt'), dataset, resolve_device(A.device),
                                 tilt, seed)
        v = dict(verdicts=tilt_verdict(tilt, controls), draw_seed=seed, matched_temperature=controls['temperature']
                 ['temperature'], tilt_perplexity=tilt['tilt_perplexity'], tilt_ess=tilt['tilt_ess'],
                 c2st_auc=tilt['c2st_auc'])
        verdicts.append(v)
        ppl = ', '.join(f"K={K} {c['conservative']:.3f} / {c['optimistic']:.3f}" for K, c in
                        tilt['tilt_perplexity'].items())
        rows.append(f"| {seed} | {ppl} | {tilt['tilt_ess']:.2f} | {tilt['c2st_auc']:.3f} | "
                    f"{v['matched_temperature']:.2f} | "
                    + ' | '.join(f"{effect(v['verdicts'][c]['perplexity_effect'])}; "
                                 f"{effect(v['verdicts'][c]['c2st_effect'])}" for c in ('base', 'temperature')) + ' |')
    print(f"\ntilt of base v1 by {A.source} at K = {A.tilt_k}, scale {A.tilt_scale:g}\n"
          "| draw seed | tilt's perplexity, conservative / optimistic | ESS of K | two-sample AUC | matched T | "
          "vs base: perplexity; two-sample | vs matched temperature: perplexity; two-sample |\n|---|---|---|---|---|---|---|")
    print('\n'.join(rows))
    over = {c: method_verdict(verdicts, c) for c in ('base', 'temperature')}
    for c, m in over.items():
        print(f"over {len(verdicts)} seeds vs {c}: perplexity " + (effect(m['perplexity_effect']) if m['perplexity_effect'] else '–')
              + "; two-sample " + (effect(m['c2st_effect']) if m['c2st_effect'] else '–'))
    print(f"{time.time() - t0:.0f} s")
    if A.out:
        with open(A.out + '.tmp', 'w') as f:
            json.dump(dict(args=vars(A), seeds=verdicts, over_seeds=over), f, indent=1)
        os.replace(A.out + '.tmp', A.out)


if __name__ == '__main__':
    main()
