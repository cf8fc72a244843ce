"""A fork server for the test suite. Every script run of a test pays 2-4 s of imports in a fresh interpreter (torch;
torch._dynamo, which the first optimizer step imports; MAUVE's sklearn and transformers), most of a tiny run's time.
One server per pytest worker does those imports once; each script run is then a process forked from it and started
as `python script.py args` would be: its own argv, working directory, environment, sys.path[0], stdin/stdout/stderr,
exit code and a normal interpreter exit (atexit handlers, thread joins).

A run's own `sys.executable` is a small launcher (`python -S`, no torch) that asks the same server, so the stages
run_cycles starts, and the ranks torchrun starts (`python -u script.py`; a rank's output is flushed when it ends, as
run_cli ends it), are forked too. The launcher hands over its own stdin/stdout/stderr, so a stage's output reaches
the pipe run_cycles reads; what run_cycles reads as a stage's peak memory is then the launcher's, in tests only.

What a forked run cannot have, so tests/conftest.py's run_script starts a fresh interpreter for it: an environment
read while importing (PYTHON*, OMP_*, HF_* ...), its own hash seed, and `python -m` (but for torchrun, whose
module is a script file: run_script forks it). The server is single-threaded
(OMP_NUM_THREADS=1, as conftest sets), so forking it is safe.

Protocol, over a SOCK_SEQPACKET Unix socket: the request {script, args, cwd, env} with the run's three standard fds
attached; the replies {"pid": ...} once forked, then {"returncode": ...} (negative: killed by that signal)."""
import json
import os
import signal
import socket
import sys

PRELOAD = ('torch', 'torch._dynamo', 'numpy', 'mauve')


def request_run(sock_path, script, args, cwd, env, fds, timeout=None):
    """Run `script args` in a forked process with fds as its stdin/stdout/stderr; returns its exit code. On a timeout
    the run is killed (as subprocess.run kills its child) and TimeoutError raised."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(sock_path)
        msg = json.dumps(dict(script=script, args=list(args), cwd=cwd, env=dict(env))).encode()
        socket.send_fds(s, [msg], list(fds))
        pid = json.loads(s.recv(4096))['pid']
        s.settimeout(timeout)
        try:
            return json.loads(s.recv(4096))['returncode']
        except socket.timeout:
            os.kill(pid, signal.SIGKILL)
            s.settimeout(None)
            s.recv(4096)
            raise TimeoutError(f'{script} ran over {timeout} s') from None


def launch(sock_path, real_python):
    """What a forked run's sys.executable (the `python` file serve writes: `python -S`, then this) does with its
    arguments: a script through the server at sock_path, anything else in the real interpreter."""
    args = sys.argv[1:]
    if args[:1] == ['-u'] and args[1:2] and args[1].endswith('.py'):  # torchrun's ranks: `python -u script.py`
        args = args[1:]
    if not args or not args[0].endswith('.py'):  # python -c / -m / no script: a real interpreter
        os.execv(real_python, [real_python, *args])
    code = request_run(sock_path, args[0], args[1:], os.getcwd(), os.environ, (0, 1, 2))
    if code < 0:
        os.kill(os.getpid(), -code)
    sys.exit(code)


def run_child(request, fds, launcher):
    """In the forked process: become `python script args` and run it; never returns to the server."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request['env'])
    os.chdir(request['cwd'])
    script = os.path.abspath(request['script'])
    sys.argv = [request['script'], *request['args']]
    sys.path[0] = os.path.dirname(script)
    sys.executable = launcher
    import runpy
    try:
        runpy.run_path(script, run_name='__main__')
        code = 0
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finish(code)


def exit_code(e):
    """The exit status `python script.py` gives a SystemExit: its code, 0 for None, 1 (the message printed) for
    anything else."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def finish(code):
    """Exit as the interpreter does (join non-daemon threads, run atexit handlers, flush the standard streams) but
    without tearing down every loaded module: with torch loaded, that teardown took 1.3 s of each forked run."""
    import atexit
    import threading
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def serve_one(conn, launcher):
    """In a process forked per request: fork the run, report its pid, wait, report its exit code."""
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        conn.close()
        run_child(request, fds, launcher)
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({'pid': pid}).encode())
    _, status = os.waitpid(pid, 0)
    conn.send(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}).encode())
    os._exit(0)


def serve(sock_path):
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:  # a library some script may not need: that script imports it itself
            pass
    launcher = os.path.join(os.path.dirname(sock_path), 'python')
    with open(launcher, 'w') as f:
        f.write(f'#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n'
                f'import forkserver\nforkserver.launch({sock_path!r}, {sys.executable!r})\n')
    os.chmod(launcher, 0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-request processes reap themselves
    parent = os.getppid()
    print('ready', flush=True)
    while os.getppid() == parent:  # the pytest worker that started it is still there
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            conn.settimeout(None)
            serve_one(conn, launcher)
        conn.close()


if __name__ == '__main__':
    serve(sys.argv[1])
