"""
What a user with spare compute would do instead of a judge: an ensemble of bases trained alike with other seeds,
each at its own tail-calibrated temperature, each next token's probability the mean of theirs
(model.Ensemble: the ensemble's exact perplexity), read against the first run's base at its
tail-calibrated temperature on the natural completions bench_tilt.py reads a tilt on (each draw seed its own windows:
two_sample.eval_windows of the run's eval_num_samples, the first --windows of them).

  python benchmarks/bench_ensemble.py --runs RUN,RUN2[,...] [--draws 1338,2001,3001] [--windows 100]
      [--num_samples N] [--device auto]

Each RUN is a run_cycles.py folder with a base (base_model_v1.pt, config.json), the bases of one dataset and shape
(run_cycles.py ... --seed=S makes another; --n_embd=256 a wider one). Prints each draw's perplexities, each other
member's effect and the ensemble's against the calibrated first base (verdict.perplexity_effect), over the draws
(verdict.seed_effect), and the compute: an ensemble of M costs M bases' training and M forward passes a scored window.
A wider generator, calibrated, is read here as member 2 against the calibrated base, on the same windows.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from calibrate_base import calibrated  # noqa: E402
from configurator import UserError  # noqa: E402
from data_loader import resolve_data_dir  # noqa: E402
from model import GPT, Ensemble  # noqa: E402
from run_cycles import DEFAULTS  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import effect_text  # noqa: E402
from tilt import completion_logprob  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from verdict import PPL_MARGIN, perplexity_effect, seed_effect  # noqa: E402


def members(runs, parser, device):
    """Each run's base at its tail-calibrated temperature (folded in, calibrate_base.calibrated: the checkpoint read
    once), that temperature and the run's config; one dataset and shape for all."""
    out = []
    for run in runs:
        folded, _, T, _, cfg = calibrated(run, parser, device, 0)
        out.append((GPT.from_checkpoint(folded, device=device), T, cfg))
    if len({(resolve_data_dir(c['dataset']), m.config.block_size, m.config.vocab_size) for m, _, c in out}) > 1:
        parser.error("--runs take bases of one dataset, block size and vocabulary")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', required=True, help="comma-separated run folders: the first is the control's base")
    p.add_argument('--draws', default='1338,2001,3001', help="draw seeds, each its own windows")
    p.add_argument('--windows', type=int, default=100, help="natural completions a draw (bench_tilt's --tilt_windows)")
    p.add_argument('--num_samples', type=int, default=0, help="the evaluation's windows a draw, of which the first "
                   "--windows are read (0: the run's eval_num_samples, as bench_tilt.py draws them)")
    p.add_argument('--device', default='auto')
    A = p.parse_args()
    runs = A.runs.split(',')
    if len(runs) < 2 or A.windows < 2 or A.num_samples < 0:
        p.error("--runs takes two runs or more, --windows 2 or more, --num_samples 0 or more")
    device = resolve_device(A.device)
    bases = members(runs, p, device)
    models, temperatures = [m for m, _, _ in bases], [t for _, t, _ in bases]
    ensemble = Ensemble(models)
    cfg = bases[0][2]
    val = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    length = models[0].config.block_size
    tokens = length - PROMPT_LEN
    # the evaluation's draw of windows, as bench_tilt's: the run's eval_num_samples unless given
    samples = A.num_samples or cfg.get('eval_num_samples', DEFAULTS['eval_num_samples'])
    members_text = ' / '.join(f"member {i + 1}{', the calibrated base,' if i == 0 else ''} at T {t:.3f}"
                              for i, t in enumerate(temperatures))
    others = [f'member {i + 1}' for i in range(1, len(models))] + ['ensemble']
    print(f"| draw | ppl: {members_text} / ensemble | "
          + ' | '.join(f'{o} vs the calibrated base' for o in others) + ' |\n' + '|---' * (2 + len(others)) + '|')
    effects = []  # a draw's effects of each other member and of the ensemble against the calibrated base
    for seed in [int(s) for s in A.draws.split(',')]:
        try:
            natural = eval_windows(val, samples, length, seed)[0][:A.windows].to(device)
        except UserError as e:
            p.error(str(e))
        ce = [-completion_logprob(m, natural, PROMPT_LEN) / tokens for m in [*models, ensemble]]
        effects.append([perplexity_effect(c, ce[0], seed) for c in ce[1:]])
        print(f"| {seed} | {' / '.join(f'{np.exp(c.mean()):.4f}' for c in ce)} | "
              + ' | '.join(effect_text(e) for e in effects[-1]) + ' |')
    over = [seed_effect([draw[i] for draw in effects], PPL_MARGIN) for i in range(len(others))]
    print(f"| **over {len(effects)} draws** | | " + ' | '.join(f'**{effect_text(e)}**' for e in over) + ' |')
    print(f"compute: {len(models)} bases' training; a scored window of {tokens} completion tokens costs "
          f"{ensemble.flops_per_token() * length:.3g} FLOPs ({len(models)} forward passes), each member's "
          f"{' / '.join(f'{m.flops_per_token() * length:.3g}' for m in models)}")

if __name__ == '__main__':
    main()
