"""Shared fixtures: a tiny deterministic corpus, prepared char/BPE datasets and tiny checkpoints, all in temp dirs."""
import os
import random
import subprocess
import sys

# the suite runs on two pytest-xdist workers (pytest.ini): one thread per process keeps them from oversubscribing two
# cores; set before torch is imported, so in-process runs and the scripts they are compared with thread alike
os.environ.setdefault('OMP_NUM_THREADS', '1')

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# the longest modules first: pytest-xdist's loadscope hands each worker a whole module, in collection order
# (pytest.ini's --no-loadscope-reorder), so the two workers finish together only when the longest start first (about
# 3, 2, 1.5, 1.2 and 1 minutes of one core)
LONGEST_MODULES = ('test_grpo.py', 'test_cycles.py', 'test_objectives.py', 'test_distill.py', 'test_referee.py')


def pytest_collection_modifyitems(items):
    order = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: within a module the order stands


WORDS = ("the king queen lord lady love death night day sweet fair good my thy thou art hath doth "
         "sword crown heart blood war peace speak hear come go stay now here there what why").split()


def make_text(n_chars=40000, seed=0):
    """Shakespeare-ish lines of random words: enough structure for a tiny model to learn something."""
    rng = random.Random(seed)
    lines = []
    while sum(len(l) + 1 for l in lines) < n_chars:
        name = rng.choice(['KING', 'QUEEN', 'LORD', 'LADY'])
        words = ' '.join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
        lines.append(f"{name}:\n{words.capitalize()}.\n")
    return '\n'.join(lines)[:n_chars]


def run_script(*args, env=None, timeout=600, fresh=False):
    """Run a repository script as a user would; returns a CompletedProcess. A script file with no environment of
    its own runs in a process forked from this worker's fork server on Linux (tests/forkserver.py: the imports every
    script pays are done once), or, where there is none (macOS; SELFPLAY_TEST_FORK=0), in this process: its
    main(argv) under run_cli, as `python script.py` runs it (_in_process_run). `-m` runs, runs whose environment
    changes a variable, fresh=True (two runs that must differ in hash seed, as two users' would), scripts outside the
    repository's root and SELFPLAY_TEST_FORK=subprocess start a fresh interpreter. torchrun (`-m
    torch.distributed.run`) runs its script through the fork server too, and so its ranks."""
    same_env = all(os.environ.get(k) == v for k, v in (env or {}).items())  # an env that changes nothing is none
    own = args[0].endswith('.py') and same_env and not fresh
    if own and fork_server_available():
        return _forked_run(args[0], args[1:], timeout)
    if args[:2] == ('-m', 'torch.distributed.run') and same_env and fork_server_available():
        import importlib.util  # torchrun's own script, forked: its ranks (`sys.executable -u script.py`) are forked too
        return _forked_run(importlib.util.find_spec('torch.distributed.run').origin, args[2:], timeout)
    if own and runs_in_process(args[0]):
        return _in_process_run(args[0], args[1:])
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def runs_in_process(script):
    """Without the fork server, a root script with main(argv) runs in the test's process
    (SELFPLAY_TEST_FORK=subprocess: never)."""
    path = os.path.join(ROOT, script)
    return (os.environ.get('SELFPLAY_TEST_FORK') != 'subprocess' and os.path.dirname(script) == ''
            and os.path.isfile(path) and 'run_cli(main)' in open(path).read())


def _in_process_run(script, args):
    """`python script args` in this process: run_cli(main) with that argv from the repository root, its stdout and
    stderr captured, its exit code from SystemExit (1 and the traceback for an uncaught exception); the script's
    module is imported afresh, so what a test patched on it earlier is gone. What a run changes is restored after
    it: argv, working directory, environment, torch threads, the torch, numpy and random generators, the
    deterministic-algorithms flag, the default dtype and the warning filters."""
    import contextlib
    import gc
    import importlib
    import io
    import traceback
    import warnings
    import numpy as np
    import torch
    from configurator import run_cli
    from forkserver import exit_code
    saved = (sys.argv, os.getcwd(), dict(os.environ), torch.get_num_threads(), torch.get_rng_state(),
             np.random.get_state(), random.getstate(), torch.are_deterministic_algorithms_enabled(),
             torch.get_default_dtype())
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        sys.argv = [script, *args]
        os.chdir(ROOT)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                name = script[:-3]  # the script's module afresh, as a new process has it (not as a test patched it)
                module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
                run_cli(module.main)
            except SystemExit as e:
                code = exit_code(e)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, cwd, env, threads, torch_rng, np_rng, py_rng, deterministic, dtype = saved
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_default_dtype(dtype)
        gc.collect()
    return subprocess.CompletedProcess([sys.executable, script, *args], int(code), out.getvalue(), err.getvalue())


_SERVER = {}


def fork_server_available():
    """Whether script runs go through the fork server: Linux only (it needs fork after threads have started and
    AF_UNIX SOCK_SEQPACKET sockets, which macOS lacks), and not switched off (SELFPLAY_TEST_FORK=0 or subprocess).
    Elsewhere a root script runs in the test's process, anything else in a fresh interpreter: the same results."""
    import socket
    return (sys.platform.startswith('linux') and hasattr(os, 'fork') and hasattr(socket, 'SOCK_SEQPACKET')
            and os.environ.get('SELFPLAY_TEST_FORK') not in ('0', 'subprocess'))


def fork_server_socket():
    """This worker's fork server's socket (the server started on first use); the launcher beside it, `python`, runs
    `python script.py args` through it (tests/forkserver.py)."""
    import tempfile
    if 'proc' not in _SERVER or _SERVER['proc'].poll() is not None:
        _SERVER['dir'] = tempfile.TemporaryDirectory()
        _SERVER['socket'] = os.path.join(_SERVER['dir'].name, 'socket')
        _SERVER['proc'] = subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests', 'forkserver.py'),
                                            _SERVER['socket']], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert _SERVER['proc'].stdout.readline() == 'ready\n', 'the fork server did not start'
    return _SERVER['socket']


def script_python():
    """The interpreter a shell script of the tests runs Python scripts with (its PY): the fork server's launcher
    where there is one, so that each script it starts is forked, else this interpreter."""
    if fork_server_available():
        return os.path.join(os.path.dirname(fork_server_socket()), 'python')
    return sys.executable


def _forked_run(script, args, timeout):
    """One script run through this worker's fork server, its output through two temp files."""
    import tempfile
    from forkserver import request_run
    sock = fork_server_socket()
    with tempfile.TemporaryFile('w+') as out, tempfile.TemporaryFile('w+') as err, open(os.devnull) as null:
        try:
            code = request_run(sock, script, args, ROOT, os.environ,
                               (null.fileno(), out.fileno(), err.fileno()), timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired([script, *args], timeout) from None
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess([sys.executable, script, *args], code, out.read(), err.read())


def spawn_two_ranks(fn, *args):
    """Run fn(rank, 2, port, *args) in two processes that meet at a free local port (gloo tests without torchrun).
    The processes are forked from multiprocessing's fork server, which imports torch once per worker (a spawned
    process pays that import each time)."""
    import multiprocessing
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    multiprocessing.set_forkserver_preload(['torch', 'torch.distributed'])
    mp.start_processes(fn, args=(2, port, *args), nprocs=2, start_method='forkserver')


@pytest.fixture(scope='session')
def tiny_text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp('text') / 'tiny.txt'
    path.write_text(make_text())
    return str(path)


@pytest.fixture(scope='session')
def char_data(tmp_path_factory, tiny_text_file):
    from data_loader import prepare_dataset
    out = tmp_path_factory.mktemp('data') / 'tiny_char'
    prepare_dataset('char', str(out), tiny_text_file)
    return str(out)


@pytest.fixture(scope='session')
def bpe_data(tmp_path_factory, tiny_text_file):
    from data_loader import prepare_dataset
    out = tmp_path_factory.mktemp('data') / 'tiny_bpe'
    prepare_dataset('bpe', str(out), tiny_text_file)
    return str(out)


TINY_MODEL = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8', '--eval_iters=2',
              '--device=cpu', '--compile=False', '--log_interval=10', '--warmup_iters=5', '--learning_rate=3e-3']


def train_tiny(data_dir, out_dir, *extra, fresh=False):
    result = run_script('train.py', f'--dataset={data_dir}', f'--out_dir={out_dir}', *TINY_MODEL, *extra, fresh=fresh)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope='session')
def char_ckpt(tmp_path_factory, char_data):
    """A tiny char generator trained for 150 iterations (it has learned the character statistics)."""
    out = tmp_path_factory.mktemp('ckpt_char')
    train_tiny(char_data, str(out), '--max_iters=150', '--lr_decay_iters=150', '--eval_interval=150')
    return str(out / 'ckpt.pt')


@pytest.fixture(scope='session')
def noise_gen(tmp_path_factory, char_data):
    """A generator trained 2 steps: it writes nearly uniform characters."""
    out = tmp_path_factory.mktemp('gen')
    train_tiny(char_data, str(out), '--max_iters=2', '--eval_interval=1')
    return str(out / 'ckpt.pt')


@pytest.fixture(scope='session')
def bpe_ckpt(tmp_path_factory, bpe_data):
    out = tmp_path_factory.mktemp('ckpt_bpe')
    train_tiny(bpe_data, str(out), '--max_iters=10', '--eval_interval=10')
    return str(out / 'ckpt.pt')


def prepare_reward(ckpt, out, *extra, data=None, mode='binary', fresh=False):
    """prepare_reward_data.py on a tiny model: 3 samples per block, small generation batches."""
    args = ['prepare_reward_data.py', '--model_path', ckpt, '--output_dir', str(out), '--device', 'cpu',
            '--samples_per_chunk', '3', '--batch_size', '16']
    if mode == 'binary':
        args += ['--input_mode', 'binary', '--train_bin', os.path.join(data, 'train.bin'),
                 '--val_bin', os.path.join(data, 'val.bin')]
    else:
        args += ['--input_mode', 'text', '--data_path', data]
    r = run_script(*args, *extra, fresh=fresh)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope='session')
def char_reward(tmp_path_factory, char_ckpt, char_data):
    """12 blocks x 3 samples per split from the tiny char model."""
    out = tmp_path_factory.mktemp('rd') / 'char'
    prepare_reward(char_ckpt, out, '--max_blocks', '12', data=char_data)
    return str(out)


@pytest.fixture(scope='session')
def learnable_reward(tmp_path_factory, char_data):
    """A reward dataset in the standard format whose label is a function of the last token: a frozen trunk's
    last-token features carry it, so a head that trains correctly must beat the constant predictor."""
    import numpy as np
    from prepare_reward_data import labels_for, write_split
    from tokenization_manager import TokenizationManager
    out = tmp_path_factory.mktemp('rd') / 'learnable'
    out.mkdir()
    tok = TokenizationManager('char', data_dir=char_data)
    rng = np.random.default_rng(0)
    for split, n in (('train', 600), ('val', 200)):
        x = rng.integers(0, tok.vocab_size, size=(n, 32)).astype(np.uint16)
        K = 1 + (x[:, -1].astype(np.int64) * 7) % 31
        write_split(str(out), split, x, labels_for(K, 32), dict(tokenization_method='char', vocab_size=tok.vocab_size,
                                                                 meta_path=tok.meta_path))
    return str(out)


@pytest.fixture(scope='session')
def judge_case(tmp_path_factory, char_ckpt, char_data, char_reward):
    """A generator that writes nearly uniform characters (2 training steps) against natural text: its samples differ
    from the corpus by a learnable feature. The judge reads another checkpoint's trunk (the 150-step model's) and
    starts blind (0 steps: its zero-initialised output layer says 0.5 everywhere). Held out: crossover data of that
    generator on the val split, which the judge never trains on."""
    d = tmp_path_factory.mktemp('judge')
    train_tiny(char_data, str(d / 'gen'), '--max_iters=2', '--eval_interval=1')
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={d / "blind.pt"}', '--device=cpu', '--max_iters=0', '--reward_pooling=mean')
    assert r.returncode == 0, r.stderr[-2000:]
    prepare_reward(str(d / 'gen' / 'ckpt.pt'), d / 'heldout', '--max_blocks', '40', data=char_data)
    return d


def toy_run_config(char_data):
    """The config.json of a run_cycles.py run at the tests' toy size (what the benchmarks read beside a base)."""
    return dict(dataset=char_data, n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, base_eval_iters=2,
                base_learning_rate=3e-3, base_eval_interval=2, base_select_tokens=4000, device='cpu', compile=False,
                seed=1)


def positive_control_run(d, name, policy, *extra):
    """GRPO with a reward known to be right (train_grpo.py --reward); the blind judge still scores, as an
    instrument."""
    r = run_script('train_grpo.py', f'--policy_path={policy}', f'--reward_model_path={d / "blind.pt"}',
                   f'--out_path={d / name}', '--device=cpu', '--max_steps=24', '--learning_rate=3e-3',
                   '--warmup_steps=2', '--eval_interval=100', '--prompts_per_step=8', '--num_generations=4', *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    from model import load_checkpoint
    return load_checkpoint(str(d / name))['metrics']


def same_weights(a, b):
    """Whether two checkpoints hold the same weights, bit for bit."""
    import torch
    from model import load_checkpoint
    sa, sb = load_checkpoint(str(a))['model'], load_checkpoint(str(b))['model']
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def kill_after_save(monkeypatch, script, at=None, saves=None):
    """Cuts script.main right after a resume state is on disk: its save_resume_state saves, notes the iteration in
    saves, then raises KeyboardInterrupt (the kill) at iteration `at`, or at the first save where at is None."""
    import runtime

    def save_then_die(path, state):
        runtime.save_resume_state(path, state)
        if saves is not None:
            saves.append(state.get('iter_num'))
        if at is None or state.get('iter_num') == at:
            raise KeyboardInterrupt
    monkeypatch.setattr(script, 'save_resume_state', save_then_die)
