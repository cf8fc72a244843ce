"""
The base at its tail-calibrated temperature, written as a base of its own: what a judge, its tilt or a channel adds
past the one scalar that calibration fits. An over-fit base is over-confident, and the temperature its held-out
selection tail reads best (shared.calibrated_temperature) buys it perplexity at zero FLOPs; a judge's gain that is only
that correction is no gain of the judge's. Started from the calibrated base, every bench reads past it.

  python benchmarks/calibrate_base.py --run runs/plateau --out_dir runs/plateau_calibrated [--temperature T]

Writes OUT_DIR/base_model_v1.pt (model.fold_temperature: the final LayerNorm's gain and bias times 1 / T, so its
logits are the base's at T: the same family, sampled and scored by every script as the base at T) and OUT_DIR/
config.json (the run's), so bench_judge_curve.py, bench_tilt.py and bench_channels.py take OUT_DIR as --run. It
prints the temperature folded, the tail's perplexity at T = 1 and at its best (the folded base's best is T = 1), and
what that one temperature gives on the whole val split, which it was not fit on: the calibrated base against the
base at T = 1, window by window (verdict.perplexity_effect, with its bootstrap interval).
"""
import argparse
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np  # noqa: E402

from configurator import UserError  # noqa: E402
from data_loader import resolve_data_dir  # noqa: E402
from model import GPT, evaluate_perplexity, fold_temperature, load_checkpoint, save_atomic  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import calibrated_temperature, effect_text, run_files  # noqa: E402
from verdict import perplexity_effect  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--out_dir', required=True, help="the calibrated base's run folder (made; must not hold a base)")
    p.add_argument('--temperature', type=float, default=0,
                   help="fold this temperature instead of the tail's (0: the tail-calibrated temperature)")
    p.add_argument('--device', default='auto', help="where the tail is read, in fp32 (auto: cuda when available)")
    a = p.parse_args()
    base_path, config_path, cfg = run_files(a.run, p)
    if os.path.exists(os.path.join(a.out_dir, 'base_model_v1.pt')):
        p.error(f"{a.out_dir} already holds a base: name another --out_dir, or remove it")
    if a.temperature < 0:
        p.error(f"--temperature takes a positive number (or 0: the tail's), got {a.temperature}")
    device = resolve_device(a.device)
    ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(ckpt, device=device)
    try:
        T, tail_ppl, tail_ppl_1 = calibrated_temperature(base, ckpt, cfg['dataset'], device)
    except UserError as e:
        p.error(str(e))
    folded = fold_temperature(ckpt, a.temperature or T)
    os.makedirs(a.out_dir, exist_ok=True)
    shutil.copyfile(config_path, os.path.join(a.out_dir, 'config.json'))
    save_atomic(folded, os.path.join(a.out_dir, 'base_model_v1.pt'))
    print(f"{a.run}'s base at T = {a.temperature or T:.4g} written to {a.out_dir}/base_model_v1.pt; its selection "
          f"tail reads ppl {tail_ppl_1:.4f} at T = 1 and {tail_ppl:.4f} at its best temperature, {T:.4g}")
    val = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    (_, ppl_1, ce_1), (_, ppl_T, ce_T) = (evaluate_perplexity(base, val, temperature=t, per_window=True)
                                          for t in (1.0, a.temperature or T))
    e = perplexity_effect(ce_T, ce_1)
    print(f"what the temperature gives on val (never fit on): ppl {ppl_1:.4f} at T = 1, {ppl_T:.4f} at "
          f"T = {a.temperature or T:.4g}: {effect_text(e)} over {len(ce_1):,} windows")


if __name__ == '__main__':
    main()
