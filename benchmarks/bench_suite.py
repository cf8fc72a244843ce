"""
The test suite's wall time by how its script runs run, alternated in one run on the same machine: forked from a fork
server that has done their imports once (tests/forkserver.py, the default on Linux), in the test's own process
(SELFPLAY_TEST_FORK=0, the default where there is no fork server, e.g. macOS) and each in a fresh interpreter
(SELFPLAY_TEST_FORK=subprocess).

  python benchmarks/bench_suite.py [--repeats 1] [--modes forked,in_process] [-- pytest arguments, default: the whole
      suite as pytest.ini runs it]

Prints each run's wall time and test counts, then each mode's mean wall time over the first mode's. A run that fails a
test stops the benchmark: a time of a broken suite is not a figure.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {'forked': '1', 'in_process': '0', 'fresh': 'subprocess'}


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
    parser.add_argument('--modes', default='forked,in_process', help=f"of {', '.join(MODES)}")
    parser.add_argument('pytest_args', nargs='*', help='after --: what pytest runs (default: the whole suite)')
    args = parser.parse_args()
    modes = args.modes.split(',')
    if set(modes) - set(MODES):
        sys.exit(f"error: unknown mode(s) {', '.join(sorted(set(modes) - set(MODES)))}; choose from {', '.join(MODES)}")
    times = {mode: [] for mode in modes}
    for i in range(args.repeats):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            seconds, summary = timed_suite(mode, args.pytest_args)
            times[mode].append(seconds)
            print(f"run {i + 1} {mode:10s}: {seconds:7.1f} s  ({re.sub(r'=+', '', summary).strip()})", flush=True)
    mean = {mode: sum(t) / len(t) for mode, t in times.items()}
    print('mean: ' + ', '.join(f"{mode} {mean[mode]:.1f} s ({mean[mode] / mean[modes[0]]:.2f}x)" for mode in modes))


if __name__ == '__main__':
    main()
