"""
How often a two-rank gloo run aborts at exit, ending the way every script ends (run_cli: os._exit under torchrun)
against ending by interpreter finalization, alternated in one run. Each try is a torchrun of a small DDP script
that trains a few steps, gathers and broadcasts as GRPO does, and closes its Runtime (the barrier, then
destroy_process_group). A busy process beside it loads the cores, as pytest-xdist's second worker does in CI.

  python benchmarks/bench_torchrun_exit.py [--tries 60] [--busy 1]

Prints, per way of ending, the aborted tries out of all (a rank killed by SIGABRT: 'terminate called without an
active exception').
"""
import argparse
import os
import subprocess
import sys
import tempfile

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANK_SCRIPT = '''
import os, torch
from torch.nn.parallel import DistributedDataParallel as DDP
from configurator import run_cli
from runtime import broadcast_stop, gather_lists, setup_runtime

def main(argv):
    rt = setup_runtime('cpu', 'gloo')
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    trained, optimizer = DDP(model), torch.optim.AdamW(model.parameters(), 1e-3)
    for _ in range(20):
        trained(torch.randn(32, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        gather_lists(['text'] * 3, rt)
        broadcast_stop(False, rt)
    rt.close()

if os.environ['ENDING'] == 'finalization':
    main([])
else:
    run_cli(main)
'''


def aborted(script, ending):
    env = dict(os.environ, ENDING=ending, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', script],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0 and 'SIGABRT' not in r.stderr:
        sys.exit(f"error: a try failed for another reason:\n{r.stderr[-2000:]}")
    return r.returncode != 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--tries', type=int, default=60, help='tries per way of ending')
    parser.add_argument('--busy', type=int, default=1, help='busy processes beside the runs')
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(args.busy)]
    counts = {'run_cli': 0, 'finalization': 0}  # keys: the rank script's ENDING
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, 'rank.py')
            with open(script, 'w') as f:
                f.write(RANK_SCRIPT)
            for _ in tqdm(range(args.tries), desc='tries'):
                for ending in counts:  # alternated: the machine's load drifts alike for both
                    counts[ending] += aborted(script, ending)
    finally:
        for p in busy:
            p.kill()
    for ending, n in counts.items():
        print(f"{ending:>12}: {n} of {args.tries} tries aborted")


if __name__ == '__main__':
    main()
