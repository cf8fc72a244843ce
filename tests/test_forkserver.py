"""The suite's fork server (tests/forkserver.py) runs a script as a fresh interpreter runs it: the same output, exit
code and traceback, its own argv, sys.path[0] and working directory, a nested `sys.executable script.py` (a
run_cycles stage) too, an exit that joins threads, runs atexit handlers and flushes, and a timeout kills it."""
import os
import subprocess

import pytest

from conftest import run_script

SCRIPT = '''
import os, subprocess, sys
import helper  # beside the script: sys.path[0] is the script's folder
print('argv', sys.argv[1:], 'cwd', os.path.basename(os.getcwd()), 'stdin', repr(sys.stdin.read()), helper.VALUE)
print('to stderr', file=sys.stderr)
if sys.argv[1] == 'nested':
    r = subprocess.run([sys.executable, __file__, 'exit', '5'], capture_output=True, text=True)
    print('nested', r.returncode, r.stdout.split()[1:3])
    r = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)
    print('nested -c', r.stdout.strip())
elif sys.argv[1] == 'exit':
    sys.exit(int(sys.argv[2]))
elif sys.argv[1] == 'raise':
    raise RuntimeError('boom')
elif sys.argv[1] == 'sleep':
    import time
    time.sleep(60)
elif sys.argv[1] == 'finish':  # what an interpreter's exit does: join threads, run atexit, flush, SystemExit's text
    import atexit, threading, time
    atexit.register(lambda: print('atexit ran'))
    threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()
    sys.stdout.write('unflushed')
    sys.exit('a message')
'''


@pytest.fixture
def script(tmp_path):
    (tmp_path / 'helper.py').write_text('VALUE = 17\n')
    (tmp_path / 'script.py').write_text(SCRIPT)
    return str(tmp_path / 'script.py')


@pytest.mark.parametrize('args', [['plain', 'x'], ['exit', '3'], ['raise'], ['nested'], ['finish']])
def test_a_forked_run_is_a_fresh_run(script, args):
    forked = run_script(script, *args)
    fresh = run_script(script, *args, fresh=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == 'to stderr'
    assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]
    expected = {'plain': 0, 'exit': 3, 'raise': 1, 'nested': 0, 'finish': 1}[args[0]]
    assert forked.returncode == expected and "stdin '' 17" in forked.stdout
    if args[0] == 'raise':
        assert 'Traceback' in forked.stderr and 'RuntimeError: boom' in forked.stderr
    if args[0] == 'finish':
        assert forked.stdout.endswith('unflushedthread joined\natexit ran\n') and forked.stderr.endswith('a message\n')
    if args[0] == 'nested':
        assert "nested 5 [\"['exit',\", \"'5']\"]" in forked.stdout and 'nested -c 42' in forked.stdout


def test_a_forked_run_past_its_timeout_is_killed(script):
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(script, 'sleep', timeout=3)


def test_torchrun_its_ranks_and_the_shell_scripts_python_are_forked(tmp_path):
    """Where there is a fork server, the runs that once paid a fresh interpreter's imports are forked from it (torch
    is loaded before their first line): torchrun and the ranks it starts (`sys.executable -u script.py`), and a script
    that conftest.script_python() runs, as a shell script's PY; each still gets its own argv and environment."""
    from conftest import fork_server_available, script_python
    if not fork_server_available():
        pytest.skip('no fork server here: these runs start fresh interpreters')
    (tmp_path / 'rank.py').write_text("import os, sys\nprint('rank', os.environ['RANK'], 'torch' in sys.modules, "
                                      "sys.argv[1:])\n")
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', str(tmp_path / 'rank.py'),
                   'x', env={'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', '1')})
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(line for line in r.stdout.splitlines() if line.startswith('rank')) == \
        ["rank 0 True ['x']", "rank 1 True ['x']"]
    r = subprocess.run([script_python(), str(tmp_path / 'rank.py'), 'y'], capture_output=True, text=True,
                       env=dict(os.environ, RANK='7'), timeout=60)
    assert r.stdout == "rank 7 True ['y']\n", r.stderr[-2000:]


def test_without_the_fork_server_scripts_run_in_process(monkeypatch):
    """Off Linux (macOS has no SOCK_SEQPACKET on Unix sockets) or with SELFPLAY_TEST_FORK=0, run_script runs a root
    script's main(argv) in the test's process, anything else in a fresh interpreter: the same results, no server."""
    import sys
    import conftest
    monkeypatch.setattr(sys, 'platform', 'darwin')
    assert not conftest.fork_server_available()
    monkeypatch.undo()  # (torch's lazy imports branch on sys.platform: the runs below go by the switch instead)
    monkeypatch.setattr(conftest, '_forked_run', lambda *a: pytest.fail('the fork server was used'))
    monkeypatch.setenv('SELFPLAY_TEST_FORK', '0')
    assert not conftest.fork_server_available() and conftest.runs_in_process('prepare_reward_data.py')
    r = run_script('-c', 'print(6 * 7)')
    assert r.stdout.strip() == '42'
    r = run_script('prepare_reward_data.py', '--max_blocks', '0', '--model_path', 'missing.pt')
    assert r.returncode == 2 and r.stderr.startswith('error: ') and 'Traceback' not in r.stderr
    monkeypatch.setenv('SELFPLAY_TEST_FORK', 'subprocess')
    assert not conftest.fork_server_available() and not conftest.runs_in_process('prepare_reward_data.py')


def test_an_in_process_run_matches_a_fresh_interpreter_and_restores_state(monkeypatch, tmp_path, char_data):
    """The same training in this process and in a fresh interpreter: the same log and weights; afterwards this
    process has its generators, threads and working directory back."""
    import os
    import torch
    from conftest import TINY_MODEL
    from model import load_checkpoint
    args = [f'--dataset={char_data}', *TINY_MODEL, '--max_iters=6', '--eval_interval=3', '--log_interval=1']
    monkeypatch.setenv('SELFPLAY_TEST_FORK', '0')
    state, threads, cwd = torch.get_rng_state(), torch.get_num_threads(), os.getcwd()
    inside = run_script('train.py', *args, f'--out_dir={tmp_path / "inside"}', '--seed=7')
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads and os.getcwd() == cwd
    monkeypatch.setenv('SELFPLAY_TEST_FORK', 'subprocess')
    outside = run_script('train.py', *args, f'--out_dir={tmp_path / "outside"}', '--seed=7')
    assert inside.returncode == outside.returncode == 0, inside.stderr + outside.stderr
    logged = [[line.split(', time')[0] for line in r.stdout.splitlines() if line.startswith(('iter', 'step'))]
              for r in (inside, outside)]
    assert logged[0] == logged[1] and len(logged[0]) == 9
    a, b = (load_checkpoint(str(tmp_path / d / 'ckpt.pt'))['model'] for d in ('inside', 'outside'))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_script_test_module_passes_without_the_fork_server(tmp_path):
    """The suite's script tests without the fork server, as on macOS: one module of them (its CLI error tests), run
    by pytest in a fresh process with SELFPLAY_TEST_FORK=0."""
    import os
    import sys
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-p', 'no:cacheprovider',
                        'tests/test_reward_data.py', '-k', 'cli_prints_all_problems or config_validation'],
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True, text=True,
                       env=dict(os.environ, SELFPLAY_TEST_FORK='0'), timeout=600)
    assert r.returncode == 0 and ' passed' in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
