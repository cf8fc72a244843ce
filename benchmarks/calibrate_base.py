"""
The base at its tail-calibrated temperature, written as a base of its own: what a judge, its tilt or a channel adds
past the one scalar that calibration fits. An over-fit base is over-confident, and the temperature its held-out
selection tail reads best (calibration.calibrated_temperature) buys it perplexity at zero FLOPs; a judge's gain that is only
that correction is no gain of the judge's. Started from the calibrated base, every bench reads past it.

  python benchmarks/calibrate_base.py --run runs/plateau --out_dir runs/plateau_calibrated [--temperature T]
  python benchmarks/calibrate_base.py --run runs/plateau,runs/plateau_s2 --out_dir runs/plateau_ensemble

Writes OUT_DIR/base_model_v1.pt (model.fold_temperature: the final LayerNorm's gain and bias times 1 / T, so its
logits are the base's at T: the same family, sampled and scored by every script as the base at T) and OUT_DIR/
config.json (the first run's), so bench_judge_curve.py, bench_tilt.py and bench_channels.py take OUT_DIR as --run. It
prints the temperature folded, the tail's perplexity at T = 1 and at its best (the folded base's best is T = 1), and
what that one temperature gives on the whole val split, which it was not fit on: the calibrated base against the
base at T = 1, window by window (verdict.perplexity_effect, with its bootstrap interval).

Several runs (bases of one dataset and tail, trained alike with other seeds: run_cycles.py ... --seed=S): each base
at its own tail-calibrated temperature, written as one model.Ensemble (each next token's probability the mean of
theirs), what a user with spare compute would buy instead of a judge; on val it is read against the first run's
calibrated base. The benches read and sample it as a base; it is never trained as one (its MLE control trains its
members: shared.ensemble_mle_control).
"""
import argparse
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

from configurator import UserError, parse_checked, run_cli  # noqa: E402
from data_loader import generator_train_tokens, resolve_data_dir  # noqa: E402
from model import (GPT, ensemble_checkpoint, evaluate_perplexity, fold_temperature, load_checkpoint,  # noqa: E402
                   save_atomic)
from runtime import resolve_device  # noqa: E402
from shared import calibrated_temperature, effect_text, run_files  # noqa: E402
from verdict import perplexity_effect  # noqa: E402


RANGES = dict(temperature='>= 0')


def calibrated(run, parser, device, temperature):
    """The run's base checkpoint at its tail-calibrated temperature (or at `temperature`), the model at T = 1, T, the
    tail's perplexity at T and at 1, and the run's config path and config."""
    base_path, config_path, cfg = run_files(run, parser)
    ckpt = load_checkpoint(base_path)
    if 'ensemble_args' in ckpt:  # one temperature fit to the mean law is not each member's: fold_temperature's
        parser.error(f"{run} holds an ensemble: calibrate its members' runs instead (--run R1,R2 writes the ensemble "
                     "of their calibrated bases)")
    base = GPT.from_checkpoint(ckpt, device=device)
    try:
        T, tail_ppl, tail_ppl_1 = calibrated_temperature(base, ckpt, cfg['dataset'], device)
    except UserError as e:
        parser.error(f"{run}: {e}")
    print(f"{run}'s base: its selection tail reads ppl {tail_ppl_1:.4f} at T = 1 and {tail_ppl:.4f} at its best "
          f"temperature, {T:.4g}; folded at T = {temperature or T:.4g}")
    return fold_temperature(ckpt, temperature or T), base, temperature or T, config_path, cfg


def trained_on(ckpt, dataset):
    """The data folder and the count of its train tokens the checkpoint's generator trained on (its tail held out)."""
    data = resolve_data_dir(dataset)
    return data, len(generator_train_tokens(np.memmap(os.path.join(data, 'train.bin'), dtype=np.uint16, mode='r'),
                                            ckpt))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json; "
                   "comma-separated: the ensemble of their calibrated bases")
    p.add_argument('--out_dir', required=True, help="the calibrated base's run folder (made; must not hold a base)")
    p.add_argument('--temperature', type=float, default=0,
                   help="fold this temperature instead of the tail's (0: the tail-calibrated temperature; one run)")
    p.add_argument('--device', default='auto', help="where the tail is read, in fp32 (auto: cuda when available)")
    a = parse_checked(p, argv, RANGES)
    runs = a.run.split(',')
    if os.path.exists(os.path.join(a.out_dir, 'base_model_v1.pt')):
        p.error(f"{a.out_dir} already holds a base: name another --out_dir, or remove it")
    if a.temperature < 0 or (a.temperature and len(runs) > 1):
        p.error(f"--temperature takes a positive number (or 0: the tail's), and one run, got {a.temperature}")
    device = resolve_device(a.device)
    folded, bases, temperatures, config_paths, cfgs = zip(*[calibrated(run, p, device, a.temperature) for run in runs])
    if len({trained_on(c, cfg['dataset']) for c, cfg in zip(folded, cfgs)}) > 1:
        p.error("--run takes bases of one dataset and one held-out tail (run_cycles.py with the same --dataset and "
                "--base_select_tokens)")
    ckpt = folded[0] if len(runs) == 1 else ensemble_checkpoint(list(folded))
    os.makedirs(a.out_dir, exist_ok=True)
    shutil.copyfile(config_paths[0], os.path.join(a.out_dir, 'config.json'))
    save_atomic(ckpt, os.path.join(a.out_dir, 'base_model_v1.pt'))
    val = np.memmap(os.path.join(resolve_data_dir(cfgs[0]['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    first, T = bases[0], temperatures[0]
    if len(runs) == 1:
        (_, ppl_1, ce_1), (_, ppl_T, ce_T) = (evaluate_perplexity(first, val, temperature=t, per_window=True)
                                              for t in (1.0, T))
        e = perplexity_effect(ce_T, ce_1)
        print(f"written to {a.out_dir}/base_model_v1.pt; what the temperature gives on val (never fit on): ppl "
              f"{ppl_1:.4f} at T = 1, {ppl_T:.4f} at T = {T:.4g}: {effect_text(e)} over {len(ce_1):,} windows")
        return
    (_, ppl_T, ce_T), (_, ppl_e, ce_e) = (evaluate_perplexity(m, val, temperature=t, per_window=True) for m, t in
                                          ((first, T), (GPT.from_checkpoint(ckpt, device=device), 1.0)))
    e = perplexity_effect(ce_e, ce_T)
    print(f"the ensemble of {len(runs)} written to {a.out_dir}/base_model_v1.pt; on val (never fit on): ppl "
          f"{ppl_T:.4f} the first base at T = {T:.4g}, {ppl_e:.4f} the ensemble: {effect_text(e)} over "
          f"{len(ce_e):,} windows")


if __name__ == '__main__':
    run_cli(main)
