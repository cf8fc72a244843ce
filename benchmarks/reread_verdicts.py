"""
Re-reads every labelled effect the docs print ('equal, −0.017 (−0.028, −0.007)' or 'equal (arm AUC lower by -0.017
[-0.028, -0.007], margin 0.030)') under today's rule (verdict.effect_label: 'equal' only when the whole 95% interval
lies inside the margin) and lists the labels that change. An effect printed in % is a perplexity effect (margin
1%), any other a two-sample AUC effect (margin 0.03). The intervals in the docs were computed before the referee's
refit joined them, so they are, if anything, narrower than today's: a label that survives here may still read
'unresolved' when its run is rebuilt.

  python benchmarks/reread_verdicts.py [docs/*.md README.md]
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from verdict import AUC_MARGIN, PPL_MARGIN, effect_label  # noqa: E402

NUMBER = r'[−-]?\d+(?:\.\d+)?%?'
# 'label, effect (lo, hi)' as the arms tables print it, and the report's 'label** (... effect [lo, hi], margin m)'
PATTERNS = [re.compile(rf"(equal|better|worse|unresolved)\**,? ({NUMBER}) \(({NUMBER}), ({NUMBER})\)"),
            re.compile(rf"\*\*(equal|better|worse|unresolved)\*\* \([^()\[\]]*? ({NUMBER}) \[({NUMBER}), ({NUMBER})\]")]


def value(text):
    return float(text.replace('−', '-').rstrip('%')) / (100 if text.endswith('%') else 1)


def reread(path):
    """(line, old label, effect, interval, new label) of every labelled effect in a file."""
    found = []
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        for pattern in PATTERNS:
            for m in pattern.finditer(line):
                label, effect, lo, hi = m.groups()
                margin = PPL_MARGIN if effect.endswith('%') else AUC_MARGIN
                found.append((n, label, effect, f"({lo}, {hi})", effect_label([value(lo), value(hi)], margin)))
    return found


def main(paths):
    total = changed = 0
    for path in paths:
        for n, old, effect, ci, new in reread(path):
            total += 1
            if old != new:
                changed += 1
                print(f"{os.path.relpath(path, ROOT)}:{n}: {old} -> {new}: {effect} {ci}")
    print(f"{changed} of {total} labelled effects change under the rule that 'equal' needs the whole interval "
          f"inside the margin")


if __name__ == '__main__':
    main(sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md'))) + [os.path.join(ROOT, 'README.md')])
