"""Every number an entry point takes, checked before anything is read or written: one out-of-range value for each
numeric option of each script (its RANGES, which configure requires for every numeric default), and each relation
between options broken once. Each run is a user's: exit 2, one line on stderr naming the option, no traceback, and
nothing on disk, not even an empty output folder."""
import importlib
import re

import pytest

from conftest import run_script
from configurator import parse_range, range_words
from data_loader import PREPARE_RANGES

# each entry point -> the options that name every output it would write, put under the test's folder
OUTPUTS = {
    'train.py': ['--out_dir={d}/out'],
    'sample.py': [],
    'train_reward_model.py': ['--out_path={d}/rm/rm.pt'],
    'train_grpo.py': ['--out_path={d}/grpo/p.pt'],
    'train_spin.py': ['--out_path={d}/spin/p.pt'],
    'prepare_tilt_data.py': ['--out_dir={d}/tilt'],
    'run_cycles.py': ['--out_dir={d}/run'],
    'evaluate.py': ['x.pt', '--dataset', 'data/shakespeare_char', '--referee', 'x.pt', '--out', '{d}/e/eval.json'],
    'prepare_reward_data.py': ['--model_path', 'x.pt', '--output_dir', '{d}/rd'],
    'data/shakespeare_char/prepare.py': ['--out_dir={d}/data'],
}
ARGPARSE = {'evaluate.py', 'prepare_reward_data.py', 'data/shakespeare_char/prepare.py'}


FLOATS = {'temperatures', 'train_split', 'temperature', 'tilt_scale'}  # the argparse scripts' float options


def ranges_of(script):
    """The script's RANGES and its defaults (for an argparse script, 0 for its int options and 0.0 for its floats)."""
    if script == 'data/shakespeare_char/prepare.py':
        ranges = PREPARE_RANGES
    else:
        module = importlib.import_module(script[:-3])
        ranges = module.RANGES
        if hasattr(module, 'DEFAULTS'):
            return ranges, module.DEFAULTS
    return ranges, {k: 0.0 if k in FLOATS else 0 for k in ranges}


def out_of_range(spec, integer):
    """A value just outside spec (configurator.parse_range's forms), an int where the option takes one."""
    if spec.startswith('each '):
        return '1,' + str(out_of_range(spec[5:], False))
    words = range_words(spec)  # '> 0 or calibrated': a number outside the numbers' range
    spec = ' or '.join(part for part in spec.split(' or ') if part.strip() not in words)
    if ' or ' in spec:  # '0 or >= 2': the gap between the alternatives
        value = 1
    elif spec[0] in '[(':  # an open end, or past the closed upper one
        lo, hi = (float(x) for x in spec[1:-1].split(','))
        value = lo if spec[0] == '(' else hi if spec[-1] == ')' else hi + 1
    else:
        op, bound = re.match(r'(>=|<=|>|<)\s*(-?[\d.]+)$', spec).groups()
        value = {'>=': float(bound) - 1, '>': float(bound), '<=': float(bound) + 1, '<': float(bound)}[op]
    assert not parse_range(spec)(value), (spec, value)
    return int(value) if integer else value


def cases():
    for script in OUTPUTS:
        ranges, defaults = ranges_of(script)
        for option, spec in ranges.items():
            default = defaults[option]
            integer = default is None or (isinstance(default, int) and not isinstance(default, bool))
            yield script, option, out_of_range(spec, integer)


def run_refused(script, args, tmp_path, named):
    """Run script with args and its outputs under tmp_path: refused in one line naming `named`, nothing written."""
    outputs = [a.format(d=tmp_path) for a in OUTPUTS[script]]
    r = run_script(script, *outputs, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith('error: ') and all(f'--{n}=' in lines[0] for n in named), lines
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
    return lines[0]


@pytest.mark.parametrize('script, option, value', list(cases()))
def test_out_of_range_is_refused_before_anything_is_written(script, option, value, tmp_path):
    arg = [f'--{option}', str(value)] if script in ARGPARSE else [f'--{option}={value}']
    line = run_refused(script, arg, tmp_path, [option])
    assert 'out of range' in line and ranges_of(script)[0][option].replace('each ', '') in line, line


@pytest.mark.parametrize('script, args, named', [
    ('train.py', ['--learning_rate=1e-3', '--min_lr=1e-2'], ['min_lr', 'learning_rate']),
    ('train.py', ['--n_embd=64', '--n_head=5'], ['n_embd', 'n_head']),
    ('run_cycles.py', ['--base_learning_rate=1e-3', '--base_min_lr=1e-2'], ['base_min_lr', 'base_learning_rate']),
    ('run_cycles.py', ['--n_embd=64', '--n_head=6'], ['n_embd', 'n_head']),
    ('train_grpo.py', ['--min_prompt_len=9', '--max_prompt_len=4'], ['min_prompt_len', 'max_prompt_len']),
    ('train_spin.py', ['--min_prompt_len=9', '--max_prompt_len=4'], ['min_prompt_len', 'max_prompt_len']),
    ('prepare_tilt_data.py', ['--length=8'], ['length']),
    ('evaluate.py', ['--num_samples', '3', '--c2st_folds', '5'], ['c2st_folds', 'num_samples']),
    ('run_cycles.py', ['--reward_crossover_k=500', '--block_size=32'], ['reward_crossover_k', 'block_size']),
    ('run_cycles.py', ['--reward_unfreeze_layers=9', '--n_layer=2'], ['reward_unfreeze_layers', 'n_layer'])])
def test_broken_relation_is_refused(script, args, named, tmp_path):
    assert 'must hold' in run_refused(script, args, tmp_path, named)


def test_every_numeric_option_has_a_range():
    """configure refuses a script whose numeric default has no range; every range names an option it has."""
    from configurator import unranged
    for script in OUTPUTS:
        ranges, defaults = ranges_of(script)
        if script not in ARGPARSE:
            assert unranged(defaults, ranges) == [] and set(ranges) <= set(defaults), script


def test_the_reported_examples(tmp_path, char_data, char_ckpt):
    """The issue's examples: each was a traceback, a NaN loss or a checkpoint that looked like a result."""
    for script, arg in [('sample.py', '--max_new_tokens=-5'), ('sample.py', '--num_samples=0'),
                        ('train.py', '--batch_size=0'), ('train.py', '--max_iters=-1'),
                        ('train_reward_model.py', '--batch_size=0'), ('train_grpo.py', '--max_steps=-2')]:
        run_refused(script, [arg], tmp_path, [arg[2:].split('=')[0]])
    # relations that need the corpus or a checkpoint, checked before the first write
    for script, args, named in [
            ('train.py', [f'--dataset={char_data}', '--block_size=32', '--select_tokens=5'], ['select_tokens']),
            ('train.py', [f'--dataset={char_data}', '--block_size=32', '--select_tokens=40000'], ['select_tokens']),
            ('train.py', [f'--dataset={char_data}', f'--init_from={char_ckpt}', '--block_size=64'], ['block_size']),
            ('run_cycles.py', [f'--dataset={char_data}', '--block_size=32'], ['base_select_tokens']),
            ('run_cycles.py', [f'--dataset={char_data}', '--block_size=32', '--base_select_tokens=2000'],
             ['eval_num_samples'])]:
        run_refused(script, args, tmp_path, named)
    # a range with a lower bound alone does not hold infinity: every number is finite
    for script, arg in [('train.py', ['--learning_rate=1e999']), ('run_cycles.py', ['--grpo_beta=1e999']),
                        ('evaluate.py', ['--temperatures', '1,inf']), ('evaluate.py', ['--tilt_scale', 'inf'])]:
        assert 'not a finite number' in run_refused(script, arg, tmp_path, [arg[0][2:].split('=')[0]])


def test_parse_range_forms():
    accepts = {'>= 1': (1, 5), '> 0': (1e-9,), '[0, 1)': (0, 0.5), '(0, 1]': (1,), '0 or >= 2': (0, 2),
               'each > 0': ('0.5,1',), '<= 3': (3,)}
    refuses = {'>= 1': (0, float('nan')), '> 0': (0,), '[0, 1)': (1, -0.1), '(0, 1]': (0,), '0 or >= 2': (1,),
               'each > 0': ('0.5,0',), '<= 3': (4,)}
    for spec, values in accepts.items():
        assert all(parse_range(spec)(v) for v in values), spec
    for spec, values in refuses.items():
        assert not any(parse_range(spec)(v) for v in values), spec
