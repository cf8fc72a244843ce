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


def module_imports(path):
    """The project modules a file imports at module level."""
    found = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
    return found


def test_no_import_circle_and_no_stage_script_used_as_a_library():
    graph = {m: module_imports(f) for m, f in MODULES.items()}
    scripts = {m for m, f in MODULES.items() if "if __name__ == '__main__':" in open(f).read()}
    for m, deps in graph.items():
        assert not (deps & (scripts - LIBRARY_WITH_A_REPORT)), f"{m} imports the stage script(s) {deps & scripts}"

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
