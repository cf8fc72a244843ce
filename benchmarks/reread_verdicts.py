"""
Re-reads every labelled effect the docs print ('equal, −0.017 (−0.028, −0.007)' or 'equal (arm AUC lower by -0.017
[-0.028, -0.007], margin 0.030)') under today's rule (verdict.effect_label: 'better'/'worse' when the 95% interval
excludes 0, '(within margin)' added when it also lies inside the margin; 'equal' when it includes 0 inside the
margin; else 'unresolved') and lists the labels that change; --write puts today's labels in the files. An effect
printed in % is a perplexity effect (margin 1%), any other a two-sample AUC effect (margin 0.03). A label re-read
here keeps its printed interval: where a method's interval came from seeds that shared their controls, that
interval holds the arm's noise only, and the text beside it must say so (the tool cannot tell).

  python benchmarks/reread_verdicts.py [--write] [docs/*.md README.md]
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from verdict import AUC_MARGIN, PPL_MARGIN, label_text, labelled  # noqa: E402

NUMBER = r'[+−-]?\d+(?:\.\d+)?%?'
LABEL = r'(equal|better|worse|unresolved)((?: \(within margin\))?)'
# 'label, effect (lo, hi)' as the arms tables print it, the report's 'label** (... effect [lo, hi], margin m)' and the
# README's and the notes' 'label effect [lo, hi]' (an interval's bounds in the effect's unit, % or not)
PATTERNS = [re.compile(rf"{LABEL}(\**,? )({NUMBER}) \(({NUMBER}), ({NUMBER})\)"),
            re.compile(rf"\*\*{LABEL}(\*\* \([^()\[\]]*? )({NUMBER}) \[({NUMBER}), ({NUMBER})\]"),
            re.compile(rf"{LABEL}(\** )({NUMBER}) \[({NUMBER}), ({NUMBER})\]")]


def value(text, percent):
    return float(text.replace('−', '-').rstrip('%')) / (100 if percent else 1)


def new_label(effect, lo, hi):
    percent = effect.endswith('%')
    margin = PPL_MARGIN if percent else AUC_MARGIN
    return label_text(labelled(value(effect, percent), [value(lo, percent), value(hi, percent)], margin))


def reread(path):
    """(line, old label, effect, interval, new label) of every labelled effect in a file."""
    found = []
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        for pattern in PATTERNS:
            for m in pattern.finditer(line):
                label, within, _, effect, lo, hi = m.groups()
                found.append((n, label + within, effect, f"({lo}, {hi})", new_label(effect, lo, hi)))
    return found


def rewrite(path):
    """The file with every labelled effect carrying today's label."""
    def sub(m):
        label, within, between, effect, lo, hi = m.groups()
        start = m.group(0).index(label)
        return m.group(0)[:start] + new_label(effect, lo, hi) + m.group(0)[start + len(label + within):]
    text = open(path, encoding='utf-8').read()
    for pattern in PATTERNS:
        text = pattern.sub(sub, text)
    return text


def main(argv):
    write = '--write' in argv
    paths = [p for p in argv if p != '--write'] or \
        sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)) + [os.path.join(ROOT, 'README.md')]
    total = changed = 0
    for path in paths:
        for n, old, effect, ci, new in reread(path):
            total += 1
            if old != new:
                changed += 1
                print(f"{os.path.relpath(path, ROOT)}:{n}: {old} -> {new}: {effect} {ci}")
        if write:
            text = rewrite(path)
            with open(path + '.tmp', 'w', encoding='utf-8') as f:
                f.write(text)
            os.replace(path + '.tmp', path)
    print(f"{changed} of {total} labelled effects change under the monotone rule"
          + (' (written)' if write else ''))


if __name__ == '__main__':
    main(sys.argv[1:])
