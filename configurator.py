"""
Config the nanoGPT way: a script's defaults are plain values; then
    python script.py [config/file.py ...] [--key=value ...]
applies config files (Python, executed) and command-line overrides in order. Unknown keys and wrongly typed values
are errors, so a typo never silently trains the wrong thing, and so are numbers out of their range: each script keeps
a RANGES dict beside its defaults (an option's range, e.g. '>= 1', '(0, 1]') and RELATIONS between options, checked
here before the script reads or writes anything. Also the CLI wrapper that turns user errors into one line and a
non-zero exit.
"""

import math
import os
import re
import sys
from ast import literal_eval
from types import SimpleNamespace


class UserError(Exception):
    """A problem with the user's input: shown as one line, no traceback."""


def _coerce(key, value, default, ranges=None):
    if default is None or value is None or type(value) is type(default):
        return value
    if isinstance(value, str) and value in range_words((ranges or {}).get(key, '')):
        return value  # a number the option names: the script computes it
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise UserError(f"--{key} expects a {type(default).__name__} (default {default!r}), got {value!r}")


def range_words(spec):
    """The words a range takes for a number ('> 0 or calibrated': the option may name what the script computes)."""
    return {part.strip() for part in spec.removeprefix('each ').split(' or ') if re.fullmatch(r'[a-z_]+', part.strip())}


def parse_range(spec):
    """A range as a script writes it beside its defaults -> a test of one number. Forms: '>= 1', '> 0', '<= 1',
    '[0, 1]', '(0, 1]', '[0, 1)', 'each > 0' (a comma-separated string of numbers, each tested), alternatives joined
    by ' or ' ('0 or >= 2'). A bare number is that value alone; a bare word (range_words), that text."""
    words = range_words(spec)
    if spec.startswith('each '):
        one = parse_range(spec[5:])
        return lambda v: all(one(x if x in words else float(x)) for x in str(v).split(','))
    tests = []
    for part in spec.split(' or '):
        part = part.strip()
        if part in words:
            continue
        if part[0] in '[(':
            lo, hi = (float(x) for x in part[1:-1].split(','))
            tests.append(lambda v, lo=lo, hi=hi, a=part[0], b=part[-1]:
                         (v >= lo if a == '[' else v > lo) and (v <= hi if b == ']' else v < hi))
        elif part[:2] in ('>=', '<='):
            bound = float(part[2:])
            tests.append(lambda v, b=bound, op=part[:2]: v >= b if op == '>=' else v <= b)
        elif part[0] in '<>':
            bound = float(part[1:])
            tests.append(lambda v, b=bound, op=part[0]: v > b if op == '>' else v < b)
        else:
            tests.append(lambda v, b=float(part): v == b)
    return lambda v: v in words if isinstance(v, str) else any(t(v) for t in tests)


def finite(value, spec):
    """Whether a number (or each of an 'each' option's comma-separated numbers) is finite; what is not a number is
    left to its range's test."""
    try:
        return all(math.isfinite(float(x)) for x in (str(value).split(',') if spec.startswith('each ') else [value]))
    except (TypeError, ValueError):
        return True


def check_numbers(cfg, ranges, relations=()):
    """Every numeric option of cfg (a dict) in its range, and every relation between options true, else a UserError
    naming the option, its value and the range. ranges maps each option to parse_range's spec (None values pass:
    None means 'unset'); relations are Python expressions over the option names, each with the fix to name."""
    for key, spec in ranges.items():
        value = cfg[key]
        if value is None:
            continue
        if not finite(value, spec):  # inf passes a lower bound alone
            raise UserError(f"--{key}={value!r} is not a finite number: pass one in its range, {spec}")
        try:
            ok = parse_range(spec)(value)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            one = spec[5:] if spec.startswith('each ') else spec
            rule = ('each of its numbers' if one != spec else 'it') + (' must lie in ' if one[0] in '[(' else
                                                                       ' must be ') + one
            raise UserError(f"--{key}={value!r} is out of range: {rule}")
    for expr, fix in relations:
        if not eval(expr, {}, dict(cfg)):  # the scripts' own expressions over their own options, never user text
            names = dict.fromkeys(n for n in re.findall(r'[A-Za-z_]\w*', expr) if n in cfg)
            shown = ', '.join(f"--{k}={cfg[k]!r}" for k in names)
            raise UserError(f"{shown}: {expr} must hold ({fix})")


def unranged(defaults, ranges):
    """The numeric options of defaults that have no range: a script's oversight, so configure refuses to run."""
    return sorted(k for k, v in defaults.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ranges)


def parse_checked(parser, argv, ranges, relations=()):
    """argparse's parse_args for the scripts that take argparse options, checked as configure checks: each numeric
    option's range is shown in its --help and checked by check_numbers; every numeric option must have one."""
    for action in parser._actions:
        numeric = action.type in (int, float) or (isinstance(action.default, (int, float))
                                                   and not isinstance(action.default, bool))
        if numeric and action.dest not in ranges:
            raise AssertionError(f"option --{action.dest} has no range in RANGES")
        if action.dest in ranges:
            action.help = f"{action.help or ''} (range: {ranges[action.dest]})".lstrip()
    args = parser.parse_args(argv)
    check_numbers(vars(args), ranges, relations)
    return args


def configure(defaults, argv, ranges=None, relations=()):
    """defaults: dict of config values -> SimpleNamespace with the overrides of argv applied. With ranges (and
    relations), every number is checked by check_numbers before the script reads or writes anything; every numeric
    default must then have a range."""
    if ranges is not None and unranged(defaults, ranges):
        raise AssertionError(f"options with no range in RANGES: {', '.join(unranged(defaults, ranges))}")
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
                cfg[key] = _coerce(key, value, defaults[key], ranges)
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
            cfg[key] = _coerce(key, value, defaults[key], ranges)
    if ranges is not None:
        check_numbers(cfg, ranges, relations)
    return SimpleNamespace(**cfg)


def config_defaults(namespace):
    """The config-like globals of a script (nanoGPT's rule: plain ints, floats, bools, strings, None), less the
    constants it imports or names in capitals (PROMPT_LEN is no option)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and not k.isupper() and (v is None or isinstance(v, (int, float, bool, str)))}


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
