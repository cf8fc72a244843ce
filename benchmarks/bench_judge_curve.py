"""
What an n-gram judge knows as a curve of its data: its sight (AUC) and worth (the Donsker-Varadhan bound of its
log-odds, nats a window, worth.py) against the natural train windows it saw (--windows, nested: each count's windows
hold the smaller counts') and the base's continuations of each window's 8-token prompt it saw against each natural
one (--negatives: the first k of --negatives' largest count), beside the MLE control's worth at each point's FLOPs
(the negatives' generation; the n-gram fit's is given as its CPU seconds, its five L2 strengths' fits included).

Every window comes from the generator's own training tokens (the base's held-out selection tail left out), and every
judge chooses its L2 strength on the same --select_windows held-out train windows and the first k of their
continuations (judge.NgramJudge.fit_selected); none sees val text. The negatives are sampled once a seed, for every
train window at the largest count, with bench_judge_recipes.py's data (cached under RUN/recipes/base_<sha256 of the
base>/, reused by every point and by a rerun with that seed on the same base); --seed draws them, the windows' order,
the read's windows and the MLE control's own seed, so that each seed has its own of all four. Every point is read on
the same --num_samples natural val windows against the base's continuations of other val prompts (pooled DV) and of
their own (per prompt, --read_negatives a prompt), as bench_judge_recipes.py reads its recipes.

  python benchmarks/bench_judge_curve.py --run runs/plateau_min2e-5 [--windows 5000,20000,0] [--negatives 1,4,16]
      [--select_windows 2000] [--num_samples 1000] [--read_negatives 8] [--seed 1337] [--device auto] [--plot PNG]

--windows 0 is every train window. Each point's judge is saved as judge_ngram_curve_<windows>w_<k>neg_s<seed>.json
beside the data (a judge bench_tilt.py --source, sample.py --judge and train_grpo.py --judge=ngram
--reward_model_path read), and each point's figures, as it finishes, to curve_s<seed>_...json there: a rerun with the
same settings reads the points it finds (an interrupted run resumes) and --plot PATH draws the curve.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
from bench_judge_recipes import make_data, read_texts, row, run_setting  # noqa: E402
from data_loader import write_atomic  # noqa: E402
from judge import NgramJudge  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from reward_dataset_loader import RewardDataset  # noqa: E402
from shared import mle_control  # noqa: E402
from tilt import completion_logprob  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN, completion_texts  # noqa: E402


def counts(text, name, p):
    """A comma-separated list of counts, or a one-line usage error."""
    try:
        values = [int(v) for v in text.split(',')]
    except ValueError:
        values = [-1]
    if not values or min(values) < 0:
        p.error(f"--{name} takes comma-separated counts of 0 or more, e.g. --{name}=5000,20000,0; got {text!r}")
    return values


def split_texts(ds, tok, rows, k):
    """The completions' texts of the blocks `rows` of a reward data split: their natural windows, and the first k
    of each one's sampled continuations (rows are block-major: samples_per_chunk a block)."""
    samples = ds.x.reshape(-1, ds.samples_per_chunk, ds.block_size)[rows, :k].reshape(-1, ds.block_size)
    return (completion_texts(tok, np.asarray(ds.natural[rows], dtype=np.int64)),
            completion_texts(tok, np.asarray(samples, dtype=np.int64)))


def generation(data, split):
    """(FLOPs, samples) of a reward data split's generation, from its metadata."""
    meta = RewardDataset(data, split).metadata
    return int(meta['flops']), int(meta['num_samples'])


def worth_figures(figures):
    """A point's figures as the record keeps them: sight, pooled and per-prompt worth with their intervals."""
    g = figures['per_prompt']
    return dict(auc=float(figures['auc']), dv=float(figures['dv']), dv_ci=[float(v) for v in figures['dv_ci']],
                per_prompt=float(g['dv']), per_prompt_ci=[float(v) for v in g['dv_ci']])


def plot(points, path, title):
    """Worth per prompt [95%] against the generated windows a judge saw, a line a natural count, beside the MLE
    control's at each point's FLOPs (open markers)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in sorted({q['windows'] for q in points}):
        qs = sorted((q for q in points if q['windows'] == n), key=lambda q: q['negatives'])
        color = None  # the judge's next colour, then the same for its MLE control
        x = [q['windows'] * q['negatives'] for q in qs]
        for key, style, label in (('judge', 'o-', f'n-gram judge, {n:,} natural windows'),
                                  ('mle', 's--', f'MLE control at its FLOPs ({n:,})')):
            y = np.array([q[key]['per_prompt'] for q in qs])
            err = np.abs(np.array([q[key]['per_prompt_ci'] for q in qs]).T - y)
            line = ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label, color=color,
                               mfc='none' if key == 'mle' else None)
            color = line[0].get_color()  # the MLE control's line, markers and bars in its judge's colour
    ax.set_xscale('log')
    ax.axhline(0, color='grey', lw=0.5)
    ax.set_xlabel("generated train windows the judge saw")
    ax.set_ylabel("worth, nats a window (per prompt, 95%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def over_seeds(work, name, seeds):
    """The points every seed's record holds (the same settings), read over the seeds: the judge's worth per prompt a
    seed, and its margin over that seed's own MLE control, each with a t interval over the seeds (verdict.seed_effect:
    every seed had its own windows, negatives, judge, read and control)."""
    from verdict import seed_effect
    records = [json.load(open(os.path.join(work, name.format(seed=s)))) for s in seeds]
    print(f"| natural / generated train windows | judge's worth per prompt, seeds {' / '.join(map(str, seeds))} | "
          f"over {len(seeds)} seeds [95%] | its sight a seed | MLE control's per prompt a seed | judge minus its "
          f"seed's MLE control, over the seeds [95%] |\n|---|---|---|---|---|---|")
    for q in records[0]:
        point = [next((r for r in rec if (r['windows'], r['negatives']) == (q['windows'], q['negatives'])), None)
                 for rec in records]
        if None in point:
            continue
        judge, mle = ([r[k]['per_prompt'] for r in point] for k in ('judge', 'mle'))
        sight = [r['judge']['auc'] for r in point]
        mean, margin = (seed_effect(v, 0.0) for v in (judge, [a - b for a, b in zip(judge, mle)]))
        print(f"| {q['windows']} / {q['windows'] * q['negatives']} | {' / '.join(f'{v:.2f}' for v in judge)} | "
              f"{mean['effect']:.2f} [{mean['ci'][0]:.2f}, {mean['ci'][1]:.2f}] | "
              f"{' / '.join(f'{v:.3f}' for v in sight)} | {' / '.join(f'{v:.2f}' for v in mle)} | "
              f"{margin['effect']:+.2f} [{margin['ci'][0]:+.2f}, {margin['ci'][1]:+.2f}] |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--windows', default='5000,20000,0', help="natural train windows a point, comma-separated "
                   "(0: every one)")
    p.add_argument('--negatives', default='1,4,16', help="generated windows a natural one, comma-separated")
    p.add_argument('--select_windows', type=int, default=2000, help="held-out train windows every judge selects on")
    p.add_argument('--num_samples', type=int, default=1000, help="natural val windows every point is read on")
    p.add_argument('--read_negatives', type=int, default=8, help="continuations of each read window's own prompt")
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='auto')
    p.add_argument('--plot', default='', help="a PNG of the curve (worth per prompt against the negatives seen)")
    p.add_argument('--over_seeds', default='', help="seeds whose records to read together (comma-separated): the "
                   "points they all hold, over the seeds; nothing is computed")
    A = p.parse_args()
    windows, negatives = counts(A.windows, 'windows', p), counts(A.negatives, 'negatives', p)
    if min(negatives) < 1 or A.select_windows < 1 or A.num_samples < 2 or A.read_negatives < 1:
        p.error("--negatives, --select_windows and --read_negatives take 1 or more and --num_samples 2 or more")
    t0 = time.time()
    cfg, base_path, work, data_dir, device = run_setting(A.run, A.device, p)
    K = max(negatives)
    name = f'curve_s{{seed}}_neg{K}_select{A.select_windows}_read{A.num_samples}x{A.read_negatives}.json'
    if A.over_seeds:
        seeds = counts(A.over_seeds, 'over_seeds', p)
        missing = [s for s in seeds if not os.path.exists(os.path.join(work, name.format(seed=s)))]
        if missing:
            p.error(f"no curve recorded for seed {missing[0]} with these settings: run them with --seed {missing[0]}")
        return over_seeds(work, name, seeds)
    data = os.path.join(work, f'data_negatives{K}_allw_select{A.select_windows}_s{A.seed}')  # each seed its own
    timing = os.path.join(data, 'generation_seconds.json')
    if not os.path.isdir(data):
        t = time.time()
        make_data('negatives', base_path, data_dir, data, 0, A.seed, (A.num_samples, A.seed), K, A.select_windows)
        spent = dict(seconds=time.time() - t, device=str(device), torch_threads=torch.get_num_threads())
        write_atomic(timing, lambda path: json.dump(spent, open(path, 'w')))
    train, select = RewardDataset(data, 'train'), RewardDataset(data, 'select')
    spent = json.load(open(timing)) if os.path.exists(timing) else None
    (train_flops, train_samples), select_flops = generation(data, 'train'), generation(data, 'select')[0]
    written = sum(generation(data, s)[1] for s in ('train', 'val', 'select')) * (train.block_size - PROMPT_LEN)
    blocks = len(train.natural)
    if max(windows) > blocks:
        sys.exit(f"error: --windows asks for {max(windows)} train windows but {data} holds {blocks}: ask for at most "
                 f"{blocks} (0: every one)")
    base = GPT.from_checkpoint(base_path, device=device)
    tokenization = load_checkpoint(base_path)['tokenization']
    tok = TokenizationManager.from_info(tokenization)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    texts = None  # sampled at the first point not yet recorded
    order = np.random.default_rng(A.seed).permutation(blocks)  # nested draws: 5,000 windows are 20,000's first
    held = split_texts(select, tok, np.arange(len(select.natural)), None)
    record = os.path.join(work, name.format(seed=A.seed))
    points = json.load(open(record)) if os.path.exists(record) else []  # a rerun reads the points it has
    lines = []
    for n in windows:
        rows = np.sort(order[:n or blocks])
        for k in negatives:
            done = [q for q in points if (q['windows'], q['negatives']) == (len(rows), k)]
            if done:
                lines.append(done[0]['line'])
                continue
            texts = texts or read_texts(base, val, A.num_samples, A.read_negatives, A.seed, device)
            t = time.process_time()  # CPU seconds: a pause or a neighbour does not change them
            natural, samples = split_texts(train, tok, rows, k)
            held_k = (held[0], [s for i, s in enumerate(held[1]) if i % K < k])
            judge, _ = NgramJudge.fit_selected(natural, samples, *held_k)
            fit_seconds = time.process_time() - t
            judge.save(os.path.join(work, f'judge_ngram_curve_{n or "all"}w_{k}neg_s{A.seed}.json'), tokenization)
            # the point's FLOPs: its share of the negatives' generation (train and select), the n-gram fit aside
            flops = train_flops * len(rows) * k / train_samples + select_flops * k / K
            line, figures = row(f'{len(rows)} / {len(rows) * k} (C = {judge.C:g})',
                                lambda w: judge.log_odds(completion_texts(tok, w)), texts, flops, A.seed)
            mle_path = os.path.join(work, f'mle_at_{flops:.4g}_flops_s{A.seed}.pt')
            mle = GPT.from_checkpoint(mle_control(cfg, base_path, flops, mle_path, A.seed + 1), device=device)
            mle_line, mle_figures = row('', lambda w: completion_logprob(mle, w, PROMPT_LEN)
                                        - completion_logprob(base, w, PROMPT_LEN), texts, flops, A.seed)
            mle_cells = mle_line.split(' | ')[2:5]  # its sight, pooled and per-prompt worth
            lines.append(line.rsplit(' | ', 2)[0] + f' | {fit_seconds:.0f} | ' + ' | '.join(mle_cells) + ' |')
            print(lines[-1], file=sys.stderr, flush=True)
            points.append(dict(windows=len(rows), negatives=k, flops=flops, C=judge.C, line=lines[-1],
                               judge=worth_figures(figures), mle=worth_figures(mle_figures)))
            write_atomic(record, lambda path: json.dump(points, open(path, 'w'), indent=1))
    print(f"\nthe n-gram judge's worth against its data, on {A.run}'s base; {A.select_windows} held-out train windows "
          f"select every judge's L2 strength; read on {A.num_samples} natural val windows against as many base "
          f"samples of other prompts (DV) and {A.read_negatives} of their own prompt (per prompt), "
          f"{train.block_size - PROMPT_LEN} tokens written a window")
    if spent:
        print(f"negatives: {written:,} tokens sampled (train, val and select splits, {K} a window) in "
              f"{spent['seconds']:.0f} s on {spent['device']} ({spent['torch_threads']} threads), "
              f"{spent['seconds'] / written * 1e6:.1f} s a million characters")
    print("| natural / generated train windows (L2 strength chosen) | FLOPs (negatives) | sight (AUC) | "
          "DV, nats a window [95%] (scale) | per prompt [95%] (scale) | fit, CPU s | the MLE control at those FLOPs: "
          "sight | its DV [95%] | its per prompt [95%] |\n|---|---|---|---|---|---|---|---|---|")
    print('\n'.join(lines))
    if A.plot:
        plot(points, A.plot, f"{A.run}'s base: the n-gram judge's worth against its data")
        print(f"wrote {A.plot}")
    print(f"{time.time() - t0:.0f} s")


if __name__ == '__main__':
    with contextlib.suppress(BrokenPipeError):
        main()
