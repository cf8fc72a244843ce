"""
How often a two-rank gloo run aborts or hangs at exit, ending the way every script ends (Runtime.close: the barrier,
destroy_process_group, then os._exit under torchrun) against leaving the process group the same way and ending by
interpreter finalization, alternated in one run. Each try is a torchrun of a small DDP script that trains a few
steps, gathers and broadcasts as GRPO does, then ends. A busy process beside it loads the cores, as pytest-xdist's
second worker does in CI.

  python benchmarks/bench_torchrun_exit.py [--tries 60] [--busy 1]

Prints, per way of ending, the aborted tries out of all (a rank killed by SIGABRT: 'terminate called without an
active exception') and the hung ones (no end within 120 s).
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
import torch.distributed as dist
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
    if os.environ['ENDING'] == 'finalization':  # leave as Runtime.close does, then let the interpreter finalize
        dist.barrier()
        dist.destroy_process_group()
    else:
        rt.close()

if os.environ['ENDING'] == 'close':
    run_cli(main)
else:
    main([])
'''


def outcome(script, ending):
    """'ended', 'aborted' or 'hung': how one torchrun of the rank script ended."""
    env = dict(os.environ, ENDING=ending, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    try:
        r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                            script], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return 'hung'
    if r.returncode != 0 and 'SIGABRT' not in r.stderr:
        sys.exit(f"error: a try failed for another reason:\n{r.stderr[-2000:]}")
    return 'aborted' if r.returncode else 'ended'


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--tries', type=int, default=60, help='tries per way of ending')
    parser.add_argument('--busy', type=int, default=1, help='busy processes beside the runs')
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(args.busy)]
    counts = {ending: dict(ended=0, aborted=0, hung=0) for ending in ('close', 'finalization')}  # keys: ENDING
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, 'rank.py')
            with open(script, 'w') as f:
                f.write(RANK_SCRIPT)
            for _ in tqdm(range(args.tries), desc='tries'):
                for ending in counts:  # alternated: the machine's load drifts alike for both
                    counts[ending][outcome(script, ending)] += 1
    finally:
        for p in busy:
            p.kill()
    for ending, n in counts.items():
        print(f"{ending:>12}: {n['aborted']} of {args.tries} tries aborted, {n['hung']} hung")


if __name__ == '__main__':
    main()
