"""The layout stays easy to change: library modules below the scripts, no import circle, short functions."""
import ast
import glob
import os

from conftest import ROOT

MODULES = {os.path.splitext(os.path.basename(f))[0]: f for f in glob.glob(os.path.join(ROOT, '*.py'))}
# a script (it runs as a program) that other modules may still import: the reward dataset's library with its report
LIBRARY_WITH_A_REPORT = {'reward_dataset_loader'}
# functions allowed past about 120 lines (the test allows 125), each with its reason
LONG_ALLOWED = {
    ('train.py', 'main'): "nanoGPT's train.py, read top to bottom: set-up, the loop, the summary",
}


def module_imports(path, inside_functions=False):
    """The project modules a file imports at module level, and with inside_functions=True inside a function too (a
    lazy import still closes a circle: it only hides it until someone moves it)."""
    found = set()
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree) if inside_functions else tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
    return found


def test_no_import_circle_and_no_stage_script_used_as_a_library():
    """No module imports a stage script at module level (a stage may run another's main from inside a function, as
    evaluate.py runs the fresh judges' two stages), and no import, lazy or not, closes a circle."""
    scripts = {m for m, f in MODULES.items() if "if __name__ == '__main__':" in open(f).read()}
    for m, f in MODULES.items():
        deps = module_imports(f)
        assert not (deps & (scripts - LIBRARY_WITH_A_REPORT)), f"{m} imports the stage script(s) {deps & scripts}"
    graph = {m: module_imports(f, inside_functions=True) for m, f in MODULES.items()}

    def reach(start, node, seen):
        for d in graph[node]:
            assert d != start, f"import circle through {start} and {node}"
            if d not in seen:
                seen.add(d)
                reach(start, d, seen)
    for m in graph:
        reach(m, m, set())


def test_functions_of_the_root_modules_stay_short():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 125 and (os.path.basename(path), node.name) not in LONG_ALLOWED:
                    long.append(f"{os.path.basename(path)}:{node.name} ({lines} lines)")
    assert not long, long


# the torch APIs the code calls that older releases lack, with the first release that has them
NEWER_TORCH_APIS = {
    'torch.get_autocast_dtype(': (2, 4),
    "torch.is_autocast_enabled('cuda')": (2, 4),  # the device-type argument
    'torch.amp.GradScaler(': (2, 3),
    'F.scaled_dot_product_attention(': (2, 0),
    'torch.load(': (1, 13),  # weights_only=True
}


def test_the_torch_lower_bound_covers_the_apis_the_code_calls():
    """requirements.txt's torch bound is at least the newest release any called API needs (the sampler once called
    2.4's autocast queries under a 2.1 bound, and crashed there instead of falling back)."""
    import re
    sources = ''.join(open(f).read() for f in glob.glob(os.path.join(ROOT, '**', '*.py'), recursive=True)
                      if '/tests/' not in f)
    needed = max(v for api, v in NEWER_TORCH_APIS.items() if api in sources)
    bound = re.search(r'^torch>=(\d+)\.(\d+)', open(os.path.join(ROOT, 'requirements.txt')).read(), re.M)
    assert bound and tuple(map(int, bound.groups())) >= needed, f"requirements.txt needs torch>={needed[0]}.{needed[1]}"


def test_the_docs_cite_no_issue_numbers():
    """The docs say what was measured and why, not which tracker entry asked for it (the numbers mean nothing to a
    reader of a clone)."""
    import re
    pages = [os.path.join(ROOT, 'README.md')] + glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
    cited = [f"{os.path.relpath(f, ROOT)}: {m.group(0)}" for f in pages
             for m in re.finditer(r'\b[Ii]ssues? #?\d+', open(f).read())]
    assert not cited, cited


def test_every_file_the_readme_names_exists():
    """The README is the front door: each doc, script or figure it names (a link, or a path in backticks) is in the
    repository; a run's outputs (runs/...) are written by the commands it shows, so they are not checked."""
    import re
    text = open(os.path.join(ROOT, 'README.md')).read()
    named = set(re.findall(r'(?:\]\(|`)([A-Za-z0-9_./-]+\.(?:md|py|sh|png|txt))', text))
    missing = sorted(p for p in named if not p.startswith('runs/') and not os.path.exists(os.path.join(ROOT, p)))
    assert len(named) > 20 and not missing, f"the README names files that do not exist: {missing}"


INTERVAL_FIGURE = r'[+−-]?\d+\.\d+%? \[[+−-]?\d+\.\d+%?, [+−-]?\d+\.\d+%?\]'  # a figure with its 95% interval


def table_cells(text):
    """Every cell of every markdown table in text."""
    return [c.strip() for line in text.splitlines() if line.startswith('|') for c in line.strip().strip('|').split('|')]


def test_the_front_door_and_the_paper_are_short():
    """The README is read in three minutes (at most 1,600 words) and docs/results.md in twenty (at most 4,000): words,
    not lines, so that packing lines cannot hide length; no table cell in either holds more than 200 characters; the
    paper gives each figure once and names no dates in its prose (they live in its one table of machines and
    dates)."""
    import re
    for page, words in (('README.md', 1600), (os.path.join('docs', 'results.md'), 4000)):
        text = open(os.path.join(ROOT, page)).read()
        assert len(text.split()) <= words, f"{page} has {len(text.split())} words, more than {words}"
        long = [c[:60] for c in table_cells(text) if len(c) > 200]
        assert not long, f"{page} has table cells over 200 characters: {long}"
    paper = open(os.path.join(ROOT, 'docs', 'results.md')).read()
    figures = re.findall(INTERVAL_FIGURE, ' '.join(paper.split()))
    twice = sorted({f for f in figures if figures.count(f) > 1})
    assert len(figures) > 20 and not twice, f"figures docs/results.md gives more than once: {twice}"
    dated = [line[:60] for line in paper.splitlines() if not line.startswith('|') and re.search(r'\b20\d\d-\d\d-\d\d', line)]
    assert not dated, f"dated prose lines in docs/results.md: {dated}"


def test_the_readmes_answer_is_the_papers():
    """Every figure with an interval in the README's answer (its headline, three lines and table) appears, the same,
    in docs/results.md: the front door cannot drift from the paper. The answer stays a headline, three lines and one
    table: at most 450 words below its heading."""
    import re
    readme = open(os.path.join(ROOT, 'README.md')).read()
    heading = readme.index('## The answer')
    answer = readme[readme.index('\n', heading):readme.index('\n## ', heading)]  # below its heading line
    words = len(answer.split())
    assert words <= 450, f"the README's answer has {words} words below its heading, more than 450"
    paper = ' '.join(open(os.path.join(ROOT, 'docs', 'results.md')).read().split())
    figures = re.findall(INTERVAL_FIGURE, ' '.join(answer.split()))
    assert len(figures) >= 10, figures
    missing = [f for f in figures if f not in paper]
    assert not missing, f"the README's answer has figures docs/results.md does not: {missing}"


def test_the_results_are_a_paper_and_the_log_is_indexed():
    """The lab log under docs/log/ has an index naming each of its pages; and every doc path a page of docs/ names
    exists."""
    import re
    index = open(os.path.join(ROOT, 'docs', 'log', 'README.md')).read()
    pages = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ROOT, 'docs', 'log', '*.md')))
    assert [p for p in pages if p != 'README.md' and p not in index] == [] and len(pages) > 3
    docs = glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
    named = {p for f in docs for p in re.findall(r'`(docs/[A-Za-z0-9_./-]+\.(?:md|png))`', open(f).read())}
    assert sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p))) == []


def test_the_data_size_plot_reads_its_record_and_refuses_a_bad_row(tmp_path):
    """benchmarks/plot_data_size.py draws the record's figures (the repository's own, and a series a size lacks left
    out); a row naming no known series is a one-line error that names the line, and no figure is written."""
    import csv
    from conftest import run_script
    script = os.path.join(ROOT, 'benchmarks', 'plot_data_size.py')
    rows = list(csv.DictReader(open(os.path.join(ROOT, 'docs', 'log', 'data_size.csv'))))
    assert {r['series'] for r in rows} >= {'worth', 'tilt', 'generator'} and all(r['source'] for r in rows)
    out = tmp_path / 'data_size.png'
    r = run_script(script, '--out', str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    bad = tmp_path / 'bad.csv'
    bad.write_text('train_characters,series,value,low,high,source\n225000,worth,1.0,,,x\n225000,wroth,1.0,,,x\n')
    r = run_script(script, '--figures', str(bad), '--out', str(tmp_path / 'bad.png'))
    assert r.returncode != 0 and 'line 3' in r.stderr and "'wroth'" in r.stderr
    assert 'Traceback' not in r.stderr and not list(tmp_path.glob('bad*.png'))


def test_data_size_plot_spreads_the_series_of_one_size(monkeypatch):
    """Series of one panel are nudged apart around each size (their points would hide each other), symmetrically, and
    a panel's lone series stays on its size."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, 'benchmarks'))
    import plot_data_size
    nudge = plot_data_size.sideways_nudges({'worth': [], 'tilt': [], 'calibrated': [], 'generator': []})
    assert nudge['worth'] == 1.0
    right = sorted(nudge[s] for s in ('tilt', 'calibrated', 'generator'))
    assert len(set(right)) == 3 and abs(right[0] * right[2] - 1) < 1e-9 and right[1] == 1.0
