"""
Where a judge can help, against the generator's training characters: what the fed judge knows (its worth, nats a
window per prompt, against the base and against the base at its tail-calibrated temperature) and, in % of the base's
character perplexity, what its tilt gives sampled at K = 32 (and the tilt of the calibrated base by a judge fitted on
its samples, against it; an ensemble's tilt by its own judge, against the ensemble's MLE control), what the best
channel carried into the generator itself (and of an oracle's tilt, the channels' positive control), what one
temperature fit on the held-out tail buys, and what the next size's data buys. The figures come from a record (docs/log/data_size.csv: one measured figure a row,
its 95% interval where it has one, and where it was measured: the page holds its command and date); a size a series
lacks is left out of that series.

  python benchmarks/plot_data_size.py [--figures docs/log/data_size.csv] [--out docs/img/data_size.png]
"""
import argparse
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = {  # series -> (panel, label)
    'worth': (0, "the fed judge's worth"),
    'worth_calibrated': (0, "its worth past the tail-calibrated temperature"),
    'tilt': (1, "its tilt sampled at K = 32"),
    'generator': (1, "the generator itself (best channel)"),
    'oracle': (1, "an oracle's tilt in the generator (best channel)"),
    'calibrated': (1, "the base at the tail-calibrated temperature"),
    'tilt_calibrated': (1, "past it: its own judge's tilt of the calibrated base, against it"),
    'ensemble_tilt': (1, "an ensemble's tilt by its own judge, against its MLE control calibrated again"),
    'next_size': (1, "the next size's data (its plateau base)"),
}


def read_figures(path):
    """{series: [(train characters, value, (low, high) or None)]}, sorted by size; a one-line error on a bad row."""
    out = {}
    with open(path, newline='') as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            try:
                if row['series'] not in SERIES:
                    raise ValueError(f"series {row['series']!r} is not one of {', '.join(SERIES)}")
                ci = (float(row['low']), float(row['high'])) if row['low'] and row['high'] else None
                out.setdefault(row['series'], []).append((int(row['train_characters']), float(row['value']), ci))
            except (KeyError, TypeError, ValueError) as e:
                sys.exit(f"error: {path} line {n}: {e}; each row needs train_characters,series,value,low,high,source")
    return {s: sorted(v) for s, v in out.items()}


def sideways_nudges(figures, step=1.07):
    """{series: factor on its sizes}: the series of one panel spread sideways, centred on the size (x is log-scaled),
    so that points of one size do not hide each other."""
    nudge = {}
    for panel in (0, 1):
        drawn = [s for s in SERIES if s in figures and SERIES[s][0] == panel]
        nudge.update({s: step ** (k - (len(drawn) - 1) / 2) for k, s in enumerate(drawn)})
    return nudge


def plot(figures, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    sizes = sorted({p[0] for points in figures.values() for p in points})
    nudge = sideways_nudges(figures)
    for series, points in figures.items():
        panel, label = SERIES[series]
        x, y = [p[0] * nudge[series] for p in points], [p[1] for p in points]
        err = [[v - (c or (v, v))[0] for _, v, c in points], [(c or (v, v))[1] - v for _, v, c in points]]
        # markers alone: a line across a size the series has not measured would read as a measurement there
        axes[panel].errorbar(x, y, yerr=err, fmt='o', capsize=3, label=label)
    axes[1].set_yscale('symlog', linthresh=1)  # the next size's tens of percent beside the judge's tenths
    for ax, ylabel in zip(axes, ("nats a window, per prompt [95%]", "% of the base's character perplexity [95%]")):
        ax.set_xscale('log')
        ax.set_xticks(sizes, [f'{x / 1e6:.3g} M' for x in sizes], minor=False)
        ax.set_xticks([], minor=True)
        ax.axhline(0, color='grey', lw=0.5)
        ax.set_xlabel("the generator's training characters")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.15))  # below: no point hidden
    fig.suptitle("Where a judge can help: the char GPT (4 x 128) at its plateau by data size", fontsize=9)
    fig.tight_layout()
    fig.savefig(path + '.tmp.png', dpi=120)
    os.replace(path + '.tmp.png', path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--figures', default=os.path.join(ROOT, 'docs', 'log', 'data_size.csv'))
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'img', 'data_size.png'))
    A = p.parse_args()
    if not os.path.isfile(A.figures):
        p.error(f"--figures={A.figures!r} is no file: pass the record of figures (docs/log/data_size.csv)")
    plot(read_figures(A.figures), A.out)
    print(f"wrote {A.out}")


if __name__ == '__main__':
    main()
