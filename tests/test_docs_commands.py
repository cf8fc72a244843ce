"""What the pages tell a user to type works. Every command in a code block of the README and the guides (docs/*.md;
docs/log/ is history) names a script or config that exists and only options that script takes; a config file given
is read by the script's own configurator. docs/grpo_cycle.md's stages one by one run in order on the tiny corpus,
exactly as written but for the paths (into a temp folder) and size options (iterations, steps, blocks, samples)."""
import functools
import glob
import importlib
import os
import re
import shlex

import pytest

from conftest import ROOT, run_script

PAGES = ['README.md'] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
LAUNCHERS = ('python', 'bash', 'torchrun')


def page_commands(page):
    """The shell commands of a page's code blocks: lines that start with a launcher (after VAR=value prefixes), their
    backslash continuations joined and their comments dropped."""
    out, in_block, current = [], False, ''
    for line in open(os.path.join(ROOT, page)).read().splitlines():
        if line.startswith('```'):
            in_block = not in_block
            continue
        if not in_block or line.lstrip().startswith('#'):
            continue
        line = re.sub(r'\s+#.*$', '', line).strip()
        if not current and not re.match(r'^([A-Z_]+=\S+\s+)*(%s)\b' % '|'.join(LAUNCHERS), line):
            continue
        current = f'{current} {line}'.strip()
        if current.endswith('\\'):
            current = current[:-1].rstrip()
            continue
        out.append(current)
        current = ''
    return out


ALL = [(page, command) for page in PAGES for command in page_commands(page)]


def script_and_args(command):
    """(the script a command runs, relative to the root, or None for `python -m`/`-c`; its arguments)."""
    try:
        words = shlex.split(command)
    except ValueError:  # a placeholder's apostrophe ([the base's own options])
        words = command.split()
    while words and re.match(r'^[A-Z_]+=', words[0]):
        words = words[1:]
    if words[0] == 'torchrun':
        words = words[next(i for i, w in enumerate(words) if w.endswith('.py')) - 1:]
    if words[1] in ('-m', '-c'):
        return None, words[2:]
    return words[1], words[2:]


def option_names(args):
    """The --names a command passes, placeholders' ([--x ...]) included, values left out; '[--key=value ...]' stands
    for any."""
    names = [re.match(r'--([A-Za-z0-9_]+)', a.lstrip('[')).group(1) for a in args
             if re.match(r'--[A-Za-z0-9_]+', a.lstrip('['))]
    return [n for n in names if n != 'key']


@functools.lru_cache(maxsize=None)
def help_options(script):
    """The options an argparse script's --help lists."""
    r = run_script(script, '--help')
    assert r.returncode == 0, (script, r.stderr[-1000:])
    return set(re.findall(r'--([A-Za-z0-9_]+)', r.stdout))


def test_the_pages_have_commands():
    assert len(ALL) > 60 and {page for page, _ in ALL} >= {'README.md', 'docs/grpo_cycle.md', 'docs/results.md'}


@pytest.mark.parametrize('page, command', ALL, ids=[f'{p}:{c[:50]}' for p, c in ALL])
def test_every_command_names_what_exists_and_options_its_script_takes(page, command):
    from configurator import configure
    script, args = script_and_args(command)
    if script is None or script.startswith('../'):  # python -m/-c; the workplace's own scripts beside the repository
        return
    assert os.path.isfile(os.path.join(ROOT, script)), f"{page}: {script} does not exist"
    if not script.endswith('.py'):
        return
    configured = re.search(r'^DEFAULTS = ', open(os.path.join(ROOT, script)).read(), re.M)
    configs = [a for a in args if a.endswith('.py') and not a.startswith('-')]
    for config in configs:
        assert os.path.isfile(os.path.join(ROOT, config)), f"{page}: {config} does not exist"
    module_name = os.path.splitext(script)[0].replace('/', '.')
    if configured:  # the configurator's scripts: every key a default, every config read
        defaults = importlib.import_module(module_name).DEFAULTS
        unknown = [n for n in option_names(args) if n not in defaults]
        assert not unknown, f"{page}: {script} has no option {unknown}"
        configure(defaults, [os.path.join(ROOT, c) for c in configs])
    else:  # argparse's: each option one its --help lists
        unknown = [n for n in option_names(args) if n not in help_options(script)]
        assert not unknown, f"{page}: {script} has no option {unknown}"


# docs/grpo_cycle.md's stages one by one: each script's size options at the tests' toy size, appended (the last
# value of an option wins, as a user overriding the page's would)
SIZES = {
    'train.py': ['--max_iters=20', '--eval_interval=10', '--eval_iters=2', '--block_size=32', '--n_layer=2',
                 '--n_head=2', '--n_embd=32', '--batch_size=8', '--compile=False', '--device=cpu'],
    'sample.py': ['--num_samples=1', '--max_new_tokens=16', '--device=cpu'],
    'prepare_reward_data.py': ['--max_blocks', '10', '--samples_per_chunk', '2', '--device', 'cpu'],
    'reward_dataset_loader.py': [],
    'train_reward_model.py': ['--max_iters=5', '--device=cpu'],
    'train_grpo.py': ['--max_steps=2', '--prompts_per_step=2', '--num_generations=2', '--eval_interval=2',
                      '--device=cpu'],
    'evaluate.py': ['--judge_seeds', '1', '--judge_max_blocks', '10', '--device', 'cpu'],
}


def test_the_cycles_stages_one_by_one_run_as_written(tmp_path, char_data):
    """The first block of docs/grpo_cycle.md, in order: the corpus is the tests' (its prepare.py line is the one
    left out: it fetches), every output under tmp_path, sizes at the toy scale. A stage's default that cannot work
    on the corpus it names (evaluate.py's 1,000 samples on a small val split, say) fails here."""
    stages = page_commands('docs/grpo_cycle.md')[:8]
    assert stages[0].startswith('python data/shakespeare_char/prepare.py') and 'evaluate.py' in stages[-1]
    paths = {'data/shakespeare_char/': f'{char_data}/', 'data/reward_dataset': str(tmp_path / 'reward_dataset'),
             'out-shakespeare-char': str(tmp_path / 'out-shakespeare-char'), 'out-reward': str(tmp_path / 'out-reward'),
             'out-grpo': str(tmp_path / 'out-grpo'), '--dataset shakespeare_char': f'--dataset {char_data}'}
    for command in stages[1:]:
        for page_path, here in paths.items():
            command = command.replace(page_path, here)
        script, args = script_and_args(command)
        extra = {'train.py': [f'--dataset={char_data}', f"--out_dir={tmp_path / 'out-shakespeare-char'}"],
                 'prepare_reward_data.py': ['--output_dir', str(tmp_path / 'reward_dataset')],
                 'evaluate.py': ['--out', str(tmp_path / 'eval.json')]}.get(script, [])
        r = run_script(script, *args, *SIZES[script], *extra)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    assert (tmp_path / 'out-grpo' / 'policy.pt').exists() and (tmp_path / 'out-grpo' / 'policy.pt').stat().st_size
