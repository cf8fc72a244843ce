"""
The test suite's wall time with its script runs forked from a fork server that has done their imports once
(tests/forkserver.py, the default) against every script run in a fresh interpreter (SELFPLAY_TEST_FORK=0),
alternated in one run on the same machine.

  python benchmarks/bench_suite.py [--repeats 1] [-- pytest arguments, default: the whole suite as pytest.ini runs it]

Prints each run's wall time and test counts, then the fresh/forked ratio of the mean wall times. A run that fails a
test stops the benchmark: a time of a broken suite is not a figure.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {'forked': '1', 'fresh': '0'}


def timed_suite(mode, pytest_args):
    env = dict(os.environ, SELFPLAY_TEST_FORK=MODES[mode])
    start = time.perf_counter()
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *pytest_args], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    summary = (r.stdout.strip().splitlines() or [''])[-1]
    if r.returncode != 0 or not re.search(r'\d+ passed', summary):
        sys.exit(f"error: the {mode} suite failed: {summary}\n{r.stdout[-3000:]}")
    return seconds, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--repeats', type=int, default=1, help='runs of each mode, alternated')
    parser.add_argument('pytest_args', nargs='*', help='after --: what pytest runs (default: the whole suite)')
    args = parser.parse_args()
    times = {mode: [] for mode in MODES}
    for i in range(args.repeats):
        for mode in (MODES if i % 2 == 0 else reversed(list(MODES))):
            seconds, summary = timed_suite(mode, args.pytest_args)
            times[mode].append(seconds)
            print(f"run {i + 1} {mode:6s}: {seconds:7.1f} s  ({re.sub(r'=+', '', summary).strip()})", flush=True)
    mean = {mode: sum(t) / len(t) for mode, t in times.items()}
    print(f"mean: forked {mean['forked']:.1f} s, fresh {mean['fresh']:.1f} s; "
          f"fresh / forked = {mean['fresh'] / mean['forked']:.2f}x")


if __name__ == '__main__':
    main()
