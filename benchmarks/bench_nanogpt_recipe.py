"""
nanoGPT's CPU recipe on tiny-shakespeare, through this repository's train.py: val loss at iteration 2000
(nanoGPT publishes about 1.88) and training tokens/s.
  python benchmarks/bench_nanogpt_recipe.py [path/to/tinyshakespeare.txt]
The text defaults to ../shared/data/tinyshakespeare.txt (a developer file; any copy of tiny-shakespeare works).
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    text = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, '..', 'shared', 'data', 'tinyshakespeare.txt')
    if not os.path.isfile(text):
        sys.exit(f"error: {text} not found: pass the path of a tiny-shakespeare text file")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, 'tinyshakespeare_char')
        sys.path.insert(0, ROOT)
        from data_loader import prepare_dataset
        prepare_dataset('char', data_dir, text)
        t0 = time.time()
        out = subprocess.run([sys.executable, os.path.join(ROOT, 'train.py'),
                              os.path.join(ROOT, 'config', 'train_tinyshakespeare_cpu_recipe.py'),
                              f'--dataset={data_dir}', f'--out_dir={tmp}/out'],
                             capture_output=True, text=True, cwd=ROOT)
        elapsed = time.time() - t0
    if out.returncode != 0:
        sys.exit(out.stderr)
    steps = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+), val ppl ([\d.]+)", out.stdout)
    rates = [float(r.replace(',', '')) for r in re.findall(r"iter \d+: .* ([\d,]+) tok/s", out.stdout)[1:]]
    for s in steps:
        print(f"step {s[0]:>5}: train loss {s[1]}, val loss {s[2]}, val ppl {s[3]}")
    print(f"val loss at iteration 2000: {steps[-1][2]} (nanoGPT publishes ~1.88)")
    print(f"median training throughput: {sorted(rates)[len(rates) // 2]:,.0f} tok/s; wall time {elapsed:.0f}s")


if __name__ == '__main__':
    main()
