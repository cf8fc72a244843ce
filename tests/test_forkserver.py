"""The suite's fork server (tests/forkserver.py) runs a script as a fresh interpreter runs it: the same output, exit
code and traceback, its own argv, sys.path[0] and working directory, a nested `sys.executable script.py` (a
run_cycles stage) too, and a timeout kills it."""
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
'''


@pytest.fixture
def script(tmp_path):
    (tmp_path / 'helper.py').write_text('VALUE = 17\n')
    (tmp_path / 'script.py').write_text(SCRIPT)
    return str(tmp_path / 'script.py')


@pytest.mark.parametrize('args', [['plain', 'x'], ['exit', '3'], ['raise'], ['nested']])
def test_a_forked_run_is_a_fresh_run(script, args):
    forked = run_script(script, *args)
    fresh = run_script(script, *args, fresh=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert forked.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == 'to stderr'
    assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]
    expected = {'plain': 0, 'exit': 3, 'raise': 1, 'nested': 0}[args[0]]
    assert forked.returncode == expected and "stdin '' 17" in forked.stdout
    if args[0] == 'raise':
        assert 'Traceback' in forked.stderr and 'RuntimeError: boom' in forked.stderr
    if args[0] == 'nested':
        assert "nested 5 [\"['exit',\", \"'5']\"]" in forked.stdout and 'nested -c 42' in forked.stdout


def test_a_forked_run_past_its_timeout_is_killed(script):
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(script, 'sleep', timeout=3)


def test_without_the_fork_server_script_runs_are_fresh_interpreters(monkeypatch):
    """Off Linux (macOS has no SOCK_SEQPACKET on Unix sockets) or with SELFPLAY_TEST_FORK=0, run_script starts a
    fresh interpreter: the same results, no server."""
    import sys
    import conftest
    monkeypatch.setattr(sys, 'platform', 'darwin')
    assert not conftest.fork_server_available()
    monkeypatch.setattr(conftest, '_forked_run', lambda *a: pytest.fail('the fork server was used'))
    r = run_script('-c', 'print(6 * 7)')
    assert r.stdout.strip() == '42'
    r = run_script('prepare_reward_data.py', '--max_blocks', '0', '--model_path', 'missing.pt')
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    monkeypatch.undo()
    monkeypatch.setenv('SELFPLAY_TEST_FORK', '0')
    assert not conftest.fork_server_available()


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
