"""
nanoGPT's CPU recipe on tiny-shakespeare (README, "I only have a macbook"), run by this repository's train.py and,
given a checkout of karpathy/nanoGPT, by nanoGPT's own train.py side by side: whole-process wall time of each,
alternated `--repeats` times, the ratio of their medians, and the val loss each reaches at iteration 2000. A shared
machine's speed drifts by ±10% between minutes; --concurrent runs the two at the same time instead, one thread and
one core each, so that the drift hits both alike and their ratio is what stays.
  python benchmarks/bench_nanogpt_recipe.py [--text path/to/tinyshakespeare.txt] [--nanogpt path/to/nanoGPT]
                                            [--repeats 3] [--concurrent] [--val_ppl off|end|every_eval]
The text defaults to ../shared/data/tinyshakespeare.txt (any copy of tiny-shakespeare works). nanoGPT is not
installable from a package registry: clone it (git clone https://github.com/karpathy/nanoGPT) and pass its folder.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# nanoGPT README's CPU command line, on top of its config/train_shakespeare_char.py
NANOGPT_RECIPE = ['config/train_shakespeare_char.py', '--device=cpu', '--compile=False', '--eval_iters=20',
                  '--log_interval=1', '--block_size=64', '--batch_size=12', '--n_layer=4', '--n_head=4',
                  '--n_embd=128', '--max_iters=2000', '--lr_decay_iters=2000', '--dropout=0.0']


def timed(arms, concurrent):
    """Each arm's (whole-process wall time, val loss at iteration 2000): one after another, or all at once with one
    thread each."""
    env = dict(os.environ, OMP_NUM_THREADS='1') if concurrent else None
    results = {}
    for batch in ([list(arms)] if concurrent else [[name] for name in arms]):
        t0, procs, ends = time.perf_counter(), {}, {}
        for name in batch:  # output to files: a pipe nobody reads fills up and stops a process that logs each step
            cmd, cwd = arms[name]
            out, err = tempfile.TemporaryFile('w+'), tempfile.TemporaryFile('w+')
            procs[name] = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True), out, err
        while len(ends) < len(procs):  # each process's own end time
            for name, (proc, _, _) in procs.items():
                if name not in ends and proc.poll() is not None:
                    ends[name] = time.perf_counter() - t0
            time.sleep(0.05)
        for name, (proc, out, err) in procs.items():
            out.seek(0), err.seek(0)
            if proc.returncode != 0:
                sys.exit(f"error: {' '.join(arms[name][0])} failed:\n{err.read()[-2000:]}")
            loss = re.findall(r"step 2000: train loss [\d.]+, val loss ([\d.]+)", out.read())[-1]
            results[name] = ends[name], float(loss)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    ap.add_argument('--text', default=os.path.join(ROOT, '..', 'shared', 'data', 'tinyshakespeare.txt'))
    ap.add_argument('--nanogpt', default='', help="a checkout of karpathy/nanoGPT, to run side by side")
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--concurrent', action='store_true', help="run the two at once, one thread each")
    ap.add_argument('--val_ppl', default='off', choices=('every_eval', 'end', 'off'),
                    help="train.py's whole-split val perplexity (nanoGPT computes none; the config's default: off)")
    a = ap.parse_args()
    if not os.path.isfile(a.text):
        sys.exit(f"error: {a.text} not found: pass --text with the path of a tiny-shakespeare text file")
    if a.nanogpt and not os.path.isfile(os.path.join(a.nanogpt, 'train.py')):
        sys.exit(f"error: {a.nanogpt} holds no train.py: pass --nanogpt with a checkout of karpathy/nanoGPT")
    sys.path.insert(0, ROOT)
    from data_loader import prepare_dataset
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, 'data', 'shakespeare_char')  # where nanoGPT reads it, cwd=tmp
        prepare_dataset('char', data_dir, a.text)
        ours = [sys.executable, os.path.join(ROOT, 'train.py'),
                os.path.join(ROOT, 'config', 'train_tinyshakespeare_cpu_recipe.py'),
                f'--dataset={data_dir}', f'--out_dir={tmp}/out_ours', f'--val_ppl={a.val_ppl}']
        arms = {'train.py': (ours, ROOT)}
        if a.nanogpt:
            for f in ('train.py', 'model.py', 'configurator.py', 'config'):
                src = os.path.join(a.nanogpt, f)
                (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(tmp, f))
            arms['nanoGPT'] = ([sys.executable, 'train.py', *NANOGPT_RECIPE, f'--out_dir={tmp}/out_nanogpt'], tmp)
        times, losses = {k: [] for k in arms}, {}
        for r in range(a.repeats):
            order = dict(reversed(arms.items())) if r % 2 else arms  # alternated, so that drift hits both alike
            for name, (t, losses[name]) in timed(order, a.concurrent).items():
                times[name].append(t)
                print(f"repeat {r + 1}/{a.repeats}: {name} {t:.1f} s, val loss at 2000 {losses[name]:.4f}",
                      flush=True)
    print('\n| trainer | whole-process wall time, s (each run) | median | val loss at iteration 2000 |')
    print('|---|---|---|---|')
    for name in arms:
        print(f"| {name} | {', '.join(f'{t:.1f}' for t in times[name])} | {statistics.median(times[name]):.1f} | "
              f"{losses[name]:.4f} |")
    if a.nanogpt:
        print(f"\ntrain.py speed relative to nanoGPT (median time ratio nanoGPT / train.py): "
              f"{statistics.median(times['nanoGPT']) / statistics.median(times['train.py']):.3f}x")


if __name__ == '__main__':
    main()
