"""What the pages tell a user to type works. Every command in a code block of the README and the guides (docs/*.md;
docs/log/ is history) names a script or config that exists and only options that script takes; a config file given
is read by the script's own configurator. Every command a page does not mark runs here, in its page's order, on the
tiny corpus, exactly as written but for the paths (into a temp folder) and size options (iterations, steps, blocks,
samples). A command that cannot run here carries a mark, a comment `# [MARK] ...` after it (or on a line of its own in
the code block, for each command below it), and the mark is checked instead:
  [GPU]      it needs CUDA: it names cuda or a GPU config or script;
  [network]  it reads outside the repository or fetches (the default corpus, GPT-2's weights, ../ paths);
  [long]     a whole run or an experiment (minutes to hours on 2 cores): run_cycles.py or a benchmarks/ script, never a
             stage a tiny size can run;
  [form]     the form of a command, with placeholders (RUN, BASE.pt, [--option ...], ...) where a user's paths go."""
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
MARKS = ('GPU', 'network', 'long', 'form')
START = re.compile(r'^([A-Z_]+=\S+\s+)*(%s)\b|^([A-Z_]+=\S+\s*)+\\$' % '|'.join(LAUNCHERS))


def page_commands(page):
    """The shell commands of a page's code blocks, each with its mark or None: lines that start with a launcher (after
    VAR=value prefixes), their backslash continuations joined and their comments dropped."""
    out, in_block, current, block_mark, mark = [], False, '', None, None
    for line in open(os.path.join(ROOT, page)).read().splitlines():
        if line.startswith('```'):
            in_block, block_mark = not in_block, None
            continue
        comment = re.search(r'(^|\s)#\s*\[(\w+)\]', line)
        if not in_block or line.lstrip().startswith('#'):
            block_mark = comment.group(2) if in_block and comment else block_mark
            continue
        mark = comment.group(2) if comment else mark
        line = re.sub(r'\s+#.*$', '', line).strip()
        if not current and not START.match(line):
            continue
        current = f'{current} {line}'.strip()
        if current.endswith('\\'):
            current = current[:-1].rstrip()
            continue
        out.append((current, mark or block_mark))
        current, mark = '', None
    return out


ALL = [(page, command) for page in PAGES for command, _ in page_commands(page)]
MARKED = [(page, command, mark) for page in PAGES for command, mark in page_commands(page) if mark]


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


# each script's size options at the tests' toy size, appended (the last value of an option wins, as a user overriding
# the page's would); and where a page's command writes beside the repository by default, a temp folder instead
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
    'run_cycles.py': ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=32', '--base_max_iters=30',
                      '--base_eval_interval=10', '--reward_max_blocks=10', '--reward_max_iters=60',
                      '--grpo_max_steps=4', '--grpo_prompts_per_step=2', '--grpo_num_generations=4',
                      '--eval_num_samples=16', '--judge_max_blocks=8', '--judge_max_iters=40', '--device=cpu',
                      '--base_select_tokens=2000'],
    'benchmarks/plot_data_size.py': [],
}
PATHS = (('data/shakespeare_char/', '{data}/'), ('--dataset shakespeare_char', '--dataset {data}'),
         ('data/reward_dataset', '{tmp}/data/reward_dataset'), ('out-', '{tmp}/out-'), ('runs/', '{tmp}/runs/'),
         ('myreward.py:', '{tmp}/myreward.py:'))


def here(script, args, tmp, data):
    """What a page's command writes beside the repository by default (its config's out_dir, the reward data's
    folder), in tmp; the tests' corpus for the config's."""
    named = ' '.join(args)
    out_dir = [] if '--out_dir' in named else [f'--out_dir={tmp}/out-shakespeare-char']
    output_dir = [] if '--output_dir' in named else ['--output_dir', f'{tmp}/data/reward_dataset']
    extra = {'train.py': [f'--dataset={data}'] + out_dir, 'prepare_reward_data.py': output_dir,
             'evaluate.py': ['--out', f'{tmp}/eval.json'],
             'run_cycles.py': [f'--dataset={data}', f'--out_dir={tmp}/runs/cycles_shakespeare_char_quick'],
             'benchmarks/plot_data_size.py': ['--out', f'{tmp}/data_size.png']}
    return extra.get(script, [])


def heredocs(page, tmp):
    """Write the files a page's code blocks write with `cat > FILE <<'EOF'`, into tmp."""
    text = open(os.path.join(ROOT, page)).read()
    for name, body in re.findall(r"^cat > (\S+) <<'EOF'\n(.*?)^EOF$", text, re.M | re.S):
        (tmp / name).write_text(body)


RUN_PAGES = [page for page in PAGES if any(mark is None and command != 'python -m pytest'
                                           for command, mark in page_commands(page))]


@pytest.mark.parametrize('page', RUN_PAGES)
def test_every_unmarked_command_runs_as_written_in_its_pages_order(page, tmp_path, char_data):
    """A page's unmarked commands, in order, as a user types them: paths into tmp_path, the tests' corpus, sizes at
    the toy scale. A stage's default that cannot work on the corpus it names (evaluate.py's 1,000 samples on a small
    val split, say) fails here. `python -m pytest` is the command that runs this one."""
    heredocs(page, tmp_path)
    for command, mark in page_commands(page):
        if mark or command == 'python -m pytest':
            continue
        for page_path, ours in PATHS:
            command = command.replace(page_path, ours.format(tmp=tmp_path, data=char_data))
        script, args = script_and_args(command)
        words = command.split()  # torchrun's own options, before the script, through its module
        launcher = ['-m', 'torch.distributed.run', *words[1:words.index(script)]] if words[0] == 'torchrun' else []
        assert script in SIZES, f"{page}: {command} runs a script this test has no toy size for: add it to SIZES"
        r = run_script(*launcher, script, *args, *SIZES[script], *here(script, args, tmp_path, char_data))
        assert r.returncode == 0, (command, r.stderr[-2000:])


def test_the_pages_run_the_cycles_stages_and_mark_the_rest():
    """The stages one by one (docs/grpo_cycle.md) and the README's quick look and own reward run here; no page marks a
    stage [long]."""
    ran = {page: [c for c, mark in page_commands(page) if not mark] for page in PAGES}
    assert [script_and_args(c)[0] for c in ran['docs/grpo_cycle.md']] == [
        'train.py', 'sample.py', 'prepare_reward_data.py', 'reward_dataset_loader.py', 'train_reward_model.py',
        'train_grpo.py', 'evaluate.py']
    assert {'run_cycles.py', 'train_grpo.py'} <= {script_and_args(c)[0] for c in ran['README.md']}


PLACEHOLDER = re.compile(r'\[|\.\.\.|\||(?<![\w/.-])[A-Z][A-Z0-9_]*(?![a-z])')


@pytest.mark.parametrize('page, command, mark', MARKED, ids=[f'{p}:{m}:{c[:40]}' for p, c, m in MARKED])
def test_each_mark_says_what_its_command_needs(page, command, mark):
    """The marks of the module's docstring, each checked on its command."""
    script, args = script_and_args(command)
    assert mark in MARKS, f"{page}: [{mark}] is not a mark; the marks are {MARKS}"
    if mark == 'GPU':  # a one-line python -c writes what the GPU command below it reads
        assert re.search(r'cuda|gpu', command, re.I) or script is None, f"{page}: {command} names no GPU"
    elif mark == 'network':
        fetches = re.match(r'data/\w+/prepare\.py$', script or '') and '--input' not in args
        assert '../' in command or fetches or 'init_from=gpt2' in command, f"{page}: {command} reads nothing remote"
    elif mark == 'long':
        assert script == 'run_cycles.py' or script.startswith('benchmarks/'), \
            f"{page}: {command} is a stage: it runs at a tiny size, unmarked"
    else:
        assert PLACEHOLDER.search(re.sub(r'^([A-Z_]+=\S+\s+)*', '', command)), f"{page}: {command} has no placeholder"
