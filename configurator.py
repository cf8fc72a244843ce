"""
Config the nanoGPT way: a script's defaults are plain values; then
    python script.py [config/file.py ...] [--key=value ...]
applies config files (Python, executed) and command-line overrides in order. Unknown keys and wrongly typed values
are errors, so a typo never silently trains the wrong thing. Also the CLI wrapper that turns user errors into one
line and a non-zero exit.
"""

import os
import sys
from ast import literal_eval
from types import SimpleNamespace


class UserError(Exception):
    """A problem with the user's input: shown as one line, no traceback."""


def _coerce(key, value, default):
    if default is None or value is None or type(value) is type(default):
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise UserError(f"--{key} expects a {type(default).__name__} (default {default!r}), got {value!r}")


def configure(defaults, argv):
    """defaults: dict of config values -> SimpleNamespace with the overrides of argv applied."""
    cfg = dict(defaults)
    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                raise UserError(f"config file not found: {arg} (configs live in config/; overrides are --key=value)")
            scope = {}
            with open(arg) as f:
                exec(f.read(), scope)
            for key, value in scope.items():
                if key.startswith('_') or type(value).__name__ == 'module':
                    continue
                if key not in cfg:
                    raise UserError(f"{arg} sets unknown config key {key!r}; known keys: {', '.join(sorted(cfg))}")
                cfg[key] = _coerce(key, value, defaults[key])
        else:
            key, sep, raw = arg[2:].partition('=')
            if not sep:
                raise UserError(f"expected --key=value, got {arg!r}")
            if key not in cfg:
                raise UserError(f"unknown config key {key!r}; known keys: {', '.join(sorted(cfg))}")
            try:
                value = literal_eval(raw)
            except (SyntaxError, ValueError):
                value = raw  # a bare string, e.g. --device=cpu
            if isinstance(defaults[key], str) and not isinstance(value, str):
                value = raw  # a string option stays the text typed, e.g. --start=1603
            cfg[key] = _coerce(key, value, defaults[key])
    return SimpleNamespace(**cfg)


def config_defaults(namespace):
    """The config-like globals of a script (nanoGPT's rule: plain ints, floats, bools, strings, None)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and (v is None or isinstance(v, (int, float, bool, str)))}


def launched_by_torchrun():
    """torchrun sets RANK for every process it starts."""
    return int(os.environ.get('RANK', -1)) != -1


def run_cli(main):
    """Run main(argv); user errors become 'error: ...' on stderr and exit code 2.

    Under torchrun (RANK set) the process then ends at once with os._exit, its output flushed, skipping interpreter
    finalization: gloo's worker threads can still be releasing the last collective's tensors when the interpreter
    tears down, and a thread that asks for the GIL then is unwound through C++ and aborts the rank ('terminate
    called without an active exception', SIGABRT, after all its work; PyTorch PR #179291). A two-rank DDP script
    on 2 loaded CPU cores aborted in 13 of 50 tries, 0 of 50 with this exit (benchmarks/bench_torchrun_exit.py). A
    rank that finished has already ended in runtime.Runtime.close, before main's locals were freed."""
    code = 0
    try:
        main(sys.argv[1:])
    except (UserError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    if launched_by_torchrun():
        end_process(code)
    if code:
        sys.exit(code)


def end_process(code):
    """End this process now with code, its output flushed, skipping interpreter finalization (run_cli's reason)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
