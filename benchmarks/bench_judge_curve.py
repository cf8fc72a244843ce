"""
What a judge knows as a curve of its data: its sight (AUC) and worth (the Donsker-Varadhan bound of its
log-odds, nats a window, worth.py) against the natural train windows it saw (--windows, nested: each count's windows
hold the smaller counts') and the base's continuations of each window's 8-token prompt it saw against each natural
one (--negatives: the first k of --negatives' largest count), beside the MLE control's worth at each point's FLOPs
(the negatives' generation and a GPT judge's training; the n-gram fit's is given as its CPU seconds, its five L2
strengths' fits included). --recipe ngram (the default) is the n-gram judge (judge.NgramJudge); --recipe window is the
GPT whole-window judge of bench_judge_recipes.py (the generator's size, every weight trained), trained to its own
stopping on the select windows for --epochs passes at most.

Every window comes from the generator's own training tokens (the base's held-out selection tail left out), and every
judge chooses its L2 strength (judge.NgramJudge.fit_selected), or its checkpoint, on the same --select_windows held-out
train windows and the first k of their continuations; none sees val text. The negatives are sampled once a seed, for
every train window at the largest count, with bench_judge_recipes.py's data (cached under RUN/recipes/base_<sha256 of
the base>/, reused by every point and by a rerun with that seed on the same base, and their first k by a curve of fewer
negatives); --seed draws them, the windows' order, the read's windows and the MLE control's own seed, so that each seed
has its own of all four. Every point is read on the same --num_samples natural val windows against the base's
continuations of other val prompts (pooled DV) and of their own (per prompt, --read_negatives a prompt), as
bench_judge_recipes.py reads its recipes.

  python benchmarks/bench_judge_curve.py --run runs/plateau_min2e-5 [--windows 5000,20000,0] [--negatives 1,4,16]
      [--select_windows 2000] [--num_samples 1000] [--read_negatives 8] [--seed 1337] [--device auto] [--plot PNG]
      [--recipe ngram|window] [--epochs 4] [--temperature 1|T|calibrated]

--temperature samples every negative, the judges' and the read's, from the base at that temperature, so that each
point's worth is what its judge knows about natural text beyond the base at T (its tilt of the base at T gains that
much), and the MLE control's is its own log-ratio at T; 'calibrated' is the temperature the base's held-out
selection tail reads best (calibration.calibrated_temperature): what a judge knows past that one scalar. Names (data,
judges, records) gain _T<T> where T is not 1.

--windows 0 is every train window. Each point's judge is saved as judge_ngram_curve_<windows>w_<k>neg_s<seed>.json
beside the data (a judge bench_tilt.py --source, sample.py --judge and train_grpo.py --judge=ngram
--reward_model_path read), or judge_window_curve_...pt, and each point's figures, as it finishes, to
curve_[window_<epochs>ep_]s<seed>_...json there: a rerun with the same settings reads the points it finds (an
interrupted run resumes) and --plot PATH draws the curve.

A run whose base is an ensemble (calibrate_base.py --run R1,R2) samples its negatives from the ensemble, token by
token from the mean of its members' laws; its MLE control is the ensemble of its members each trained further for its
share of the point's FLOPs and calibrated again (shared.ensemble_mle_control). A point recorded without that control
gets it on a rerun.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
import train_reward_model  # noqa: E402
from bench_judge_recipes import RECIPES, make_data, read_texts, row, run_setting  # noqa: E402
from data_loader import progress_dir, write_atomic  # noqa: E402
from judge import NgramJudge, reward_model_cmd  # noqa: E402
from prepare_reward_data import write_subset  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from reward_dataset_loader import RewardDataset  # noqa: E402
from shared import ensemble_mle_control, mle_control  # noqa: E402
from tilt import completion_logprob, judge_log_odds  # noqa: E402
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


def ngram_point(train, held, tok, rows, k, K, path, tokenization):
    """The n-gram judge of a point: fit on the rows' natural windows against their first k continuations, its L2
    strength chosen on the held-out windows (held: the select split's texts, K continuations a window) against
    their first k; saved to path. Returns (its log-odds of windows, what was chosen, its FLOPs: none counted)."""
    natural, samples = split_texts(train, tok, rows, k)
    judge, _ = NgramJudge.fit_selected(natural, samples, held[0], [s for i, s in enumerate(held[1]) if i % K < k])
    judge.save(path, tokenization)
    return lambda w: judge.log_odds(completion_texts(tok, w)), f'C = {judge.C:g}', 0


def window_point(data, select_blocks, base_path, rows, k, path, A, device):
    """The GPT whole-window judge of a point (bench_judge_recipes.py's 'window' recipe): trained on the rows'
    natural windows against their first k continuations, to its own stopping on the select split's windows against
    their first k (about 8 evaluations an epoch, patience 8, --epochs at most); its own val figures come from one
    continuation a val window. A point's data is cut from the negatives' (prepare_reward_data.write_subset) and
    removed once its judge is saved; a rerun reads the judge. Returns (its log-odds, where it stopped, its FLOPs)."""
    if not os.path.exists(path):
        cut = path[:-3] + '_data'
        write_subset(data, cut, {'train': (rows, k), 'select': (np.arange(select_blocks), k),
                                 'val': (np.arange(len(RewardDataset(data, 'val').natural)), 1)})
        steps_per_epoch = len(rows) * k // train_reward_model.batch_size
        options = RECIPES['window'][1] + [f'--max_epochs={A.epochs}', '--max_iters=1000000', '--patience=8',
                                          f'--eval_interval={max(25, steps_per_epoch // 8)}']
        partial = path[:-3] + '.partial.pt'  # the best checkpoint so far: a judge only once its training ends
        with contextlib.redirect_stdout(sys.stderr):
            train_reward_model.main(reward_model_cmd(base_path, cut, partial, A.seed, A.device, options)[1:])
        os.replace(partial, path)
        shutil.rmtree(cut)
    ckpt = load_checkpoint(path)
    judge = GPT.from_checkpoint(ckpt, device=device)
    return lambda w: judge_log_odds(judge, w, PROMPT_LEN), f"best at step {ckpt['iter_num']}", int(ckpt['flops'])


def sampled(work, k, select, seed, tag=''):
    """The negatives a train window that a seed's data holds: k, or the smallest larger count already sampled for
    this seed, select split and temperature (tag), whose first k serve (a curve of fewer negatives reuses a larger
    curve's sampling)."""
    found = [int(m.group(1)) for f in os.listdir(work)
             if (m := re.fullmatch(rf'data_negatives(\d+)_allw_select{select}_s{seed}{re.escape(tag)}', f))]
    return min([c for c in found if c >= k], default=k)


def generation(data, split):
    """(FLOPs, samples) of a reward data split's generation, from its metadata."""
    meta = RewardDataset(data, split).metadata
    return int(meta['flops']), int(meta['num_samples'])


def sampling_temperature(value, base_path, cfg, device, p):
    """--temperature as a number: itself (4 significant digits, the names' precision), or 'calibrated': the
    temperature the base's held-out selection tail reads best."""
    if value == 'calibrated':
        from configurator import UserError
        from shared import base_calibrated_temperature
        try:
            value = base_calibrated_temperature(base_path, cfg['dataset'], device)[0]
        except UserError as e:
            p.error(str(e))
    try:
        temperature = float(f'{float(value):.4g}')
    except ValueError:
        temperature = 0
    if not temperature > 0:
        p.error(f"--temperature takes a positive number or 'calibrated', got {value!r}")
    return temperature


def worth_figures(figures):
    """A point's figures as the record keeps them: sight, pooled and per-prompt worth with their intervals."""
    g = figures['per_prompt']
    return dict(auc=float(figures['auc']), dv=float(figures['dv']), dv_ci=[float(v) for v in figures['dv_ci']],
                per_prompt=float(g['dv']), per_prompt_ci=[float(v) for v in g['dv_ci']])


def mle_reading(cfg, base, base_path, ensemble, flops, work, A, texts, temperature, device):
    """The MLE control at a point's FLOPs (trained once and reused; an ensemble's: each member trained further,
    shared.ensemble_mle_control) read as the point's judge is, its log-ratio to the base: its row's three cells (its
    sight, pooled and per-prompt worth) and its figures."""
    path = os.path.join(work, f'mle_at_{flops:.4g}_flops_s{A.seed}.pt')
    if ensemble:
        ensemble_mle_control(cfg, base_path, flops, path, A.seed + 1, device)
    else:
        mle_control(cfg, base_path, flops, path, A.seed + 1)
    mle = GPT.from_checkpoint(path, device=device)
    line, figures = row('', lambda w: completion_logprob(mle, w, PROMPT_LEN, temperature)
                        - completion_logprob(base, w, PROMPT_LEN, temperature), texts, flops, A.seed)
    return line.split(' | ')[2:5], worth_figures(figures)


def plot(points, path, title, judge_name):
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
        for key, style, label in (('judge', 'o-', f'{judge_name}, {n:,} natural windows'),
                                  ('mle', 's--', f'MLE control at its FLOPs ({n:,})'))[:2 if qs[0]['mle'] else 1]:
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


def over_seeds(paths, seeds, judge_name):
    """The points every seed's record holds (the same settings), read over the seeds: the judge's worth per prompt a
    seed, and its margin over that seed's own MLE control, each with a t interval over the seeds (verdict.seed_effect:
    every seed had its own windows, negatives, judge, read and control)."""
    from verdict import seed_effect
    records = [json.load(open(path)) for path in paths]
    print(f"{judge_name}\n| natural / generated train windows | judge's worth per prompt, seeds "
          f"{' / '.join(map(str, seeds))} | "
          f"over {len(seeds)} seeds [95%] | its sight a seed | MLE control's per prompt a seed | judge minus its "
          f"seed's MLE control, over the seeds [95%] |\n|---|---|---|---|---|---|")
    for q in records[0]:
        point = [next((r for r in rec if (r['windows'], r['negatives']) == (q['windows'], q['negatives'])), None)
                 for rec in records]
        if None in point:
            continue
        judge, sight = [r['judge']['per_prompt'] for r in point], [r['judge']['auc'] for r in point]
        mean = seed_effect(judge, 0.0)
        mle_cells = '– | –'  # a point recorded without its MLE control (an ensemble's, before it had one)
        if all(r['mle'] for r in point):
            mle = [r['mle']['per_prompt'] for r in point]
            margin = seed_effect([a - b for a, b in zip(judge, mle)], 0.0)
            mle_cells = (f"{' / '.join(f'{v:.2f}' for v in mle)} | "
                         f"{margin['effect']:+.2f} [{margin['ci'][0]:+.2f}, {margin['ci'][1]:+.2f}]")
        print(f"| {q['windows']} / {q['windows'] * q['negatives']} | {' / '.join(f'{v:.2f}' for v in judge)} | "
              f"{mean['effect']:.2f} [{mean['ci'][0]:.2f}, {mean['ci'][1]:.2f}] | "
              f"{' / '.join(f'{v:.3f}' for v in sight)} | {mle_cells} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--windows', default='5000,20000,0', help="natural train windows a point, comma-separated "
                   "(0: every one)")
    p.add_argument('--negatives', default='1,4,16', help="generated windows a natural one, comma-separated")
    p.add_argument('--select_windows', type=int, default=2000, help="held-out train windows every judge selects on")
    p.add_argument('--num_samples', type=int, default=1000, help="natural val windows every point is read on")
    p.add_argument('--read_negatives', type=int, default=8, help="continuations of each read window's own prompt")
    p.add_argument('--recipe', default='ngram', choices=('ngram', 'window'), help="the judge: the n-gram judge, or "
                   "the GPT whole-window judge (bench_judge_recipes.py's 'window' recipe) trained to its own stopping")
    p.add_argument('--epochs', type=int, default=4, help="the GPT judge's passes over its train windows at most")
    p.add_argument('--temperature', default='1', help="the base's sampling temperature for every negative, the "
                   "train's and the read's: a number, or 'calibrated' (the temperature its held-out selection tail "
                   "reads best, calibration.calibrated_temperature): what a judge knows past that one scalar")
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='auto')
    p.add_argument('--plot', default='', help="a PNG of the curve (worth per prompt against the negatives seen)")
    p.add_argument('--over_seeds', default='', help="seeds whose records to read together (comma-separated): the "
                   "points they all hold, over the seeds; nothing is computed")
    A = p.parse_args()
    windows, negatives = counts(A.windows, 'windows', p), counts(A.negatives, 'negatives', p)
    if min(negatives) < 1 or A.select_windows < 1 or A.num_samples < 2 or A.read_negatives < 1 or A.epochs < 1:
        p.error("--negatives, --select_windows, --read_negatives and --epochs take 1 or more and --num_samples 2 or "
                "more")
    t0 = time.time()
    cfg, base_path, work, data_dir, device = run_setting(A.run, A.device, p)
    judge_name = {'ngram': 'n-gram judge', 'window': 'GPT whole-window judge'}[A.recipe]
    recipe = '' if A.recipe == 'ngram' else f'{A.recipe}_{A.epochs}ep_'  # the n-gram records keep their names
    temperature = sampling_temperature(A.temperature, base_path, cfg, device, p)
    tag = '' if temperature == 1 else f'_T{temperature:g}'  # the base's own law keeps its names
    def record_of(seed):  # each seed's record, named by the negatives sampled for it
        return os.path.join(work, f'curve_{recipe}s{seed}_neg'
                                  f'{sampled(work, max(negatives), A.select_windows, seed, tag)}'
                                  f'_select{A.select_windows}_read{A.num_samples}x{A.read_negatives}{tag}.json')
    if A.over_seeds:
        seeds = counts(A.over_seeds, 'over_seeds', p)
        missing = [s for s in seeds if not os.path.exists(record_of(s))]
        if missing:
            p.error(f"no curve recorded for seed {missing[0]} with these settings: run them with --seed {missing[0]}")
        return over_seeds([record_of(s) for s in seeds], seeds, judge_name)
    K = sampled(work, max(negatives), A.select_windows, A.seed, tag)
    data = os.path.join(work, f'data_negatives{K}_allw_select{A.select_windows}_s{A.seed}{tag}')  # each seed its own
    timing = os.path.join(data, 'generation_seconds.json')
    if not os.path.isdir(data):
        t, resumed = time.time(), os.path.isdir(progress_dir(data))  # an interrupted generation goes on from there
        make_data('negatives', base_path, data_dir, data, 0, A.seed, (A.num_samples, A.seed), K, A.select_windows,
                  temperature)
        spent = dict(seconds=time.time() - t, device=str(device), torch_threads=torch.get_num_threads(),
                     resumed=resumed)
        write_atomic(timing, lambda path: json.dump(spent, open(path, 'w')))
    train, select = RewardDataset(data, 'train'), RewardDataset(data, 'select')
    spent = json.load(open(timing)) if os.path.exists(timing) else None
    (train_flops, train_samples), select_flops = generation(data, 'train'), generation(data, 'select')[0]
    written = sum(generation(data, s)[1] for s in ('train', 'val', 'select')) * (train.block_size - PROMPT_LEN)
    blocks = len(train.natural)
    if max(windows) > blocks:
        sys.exit(f"error: --windows asks for {max(windows)} train windows but {data} holds {blocks}: ask for at most "
                 f"{blocks} (0: every one)")
    base_ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(base_ckpt, device=device)
    tokenization, ensemble = base_ckpt['tokenization'], 'ensemble_args' in base_ckpt
    tok = TokenizationManager.from_info(tokenization)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    texts = None  # sampled at the first point not yet recorded
    order = np.random.default_rng(A.seed).permutation(blocks)  # nested draws: 5,000 windows are 20,000's first
    held = split_texts(select, tok, np.arange(len(select.natural)), None) if A.recipe == 'ngram' else None
    record = record_of(A.seed)
    points = json.load(open(record)) if os.path.exists(record) else []  # a rerun reads the points it has
    lines = []
    for n in windows:
        rows = np.sort(order[:n or blocks])
        for k in negatives:
            done = [q for q in points if (q['windows'], q['negatives']) == (len(rows), k)]
            if done and done[0]['mle']:
                lines.append(done[0]['line'])
                continue
            texts = texts or read_texts(base, val, A.num_samples, A.read_negatives, A.seed, device, temperature)
            if done:  # an ensemble's point recorded before an ensemble had its MLE control: the control added
                point = done[0]
                mle_cells, point['mle'] = mle_reading(cfg, base, base_path, ensemble, point['flops'], work, A,
                                                      texts, temperature, device)
                point['line'] = point['line'].rsplit(' | ', 3)[0] + ' | ' + ' | '.join(mle_cells) + ' |'
                lines.append(point['line'])
            else:
                t = time.process_time()  # CPU seconds: a pause or a neighbour does not change them
                judge_path = os.path.join(work, f'judge_{A.recipe}_curve_{n or "all"}w_{k}neg_s{A.seed}{tag}')
                if A.recipe == 'ngram':
                    score, chosen, judge_flops = ngram_point(train, held, tok, rows, k, K, judge_path + '.json',
                                                             tokenization)
                else:
                    score, chosen, judge_flops = window_point(data, len(select.natural), base_path, rows, k,
                                                              judge_path + '.pt', A, device)
                fit_seconds = time.process_time() - t
                # the point's FLOPs: its share of the negatives' generation (train and select), and the judge's
                # training (a GPT judge's; the n-gram fit runs on CPU, its seconds given)
                flops = train_flops * len(rows) * k / train_samples + select_flops * k / K + judge_flops
                line, figures = row(f'{len(rows)} / {len(rows) * k} ({chosen})', score, texts, flops, A.seed)
                mle_cells, mle_figures = mle_reading(cfg, base, base_path, ensemble, flops, work, A, texts, temperature,
                                                     device)
                lines.append(line.rsplit(' | ', 2)[0] + f' | {fit_seconds:.0f} | ' + ' | '.join(mle_cells) + ' |')
                points.append(dict(windows=len(rows), negatives=k, flops=flops, chosen=chosen, line=lines[-1],
                                   judge=worth_figures(figures), mle=mle_figures))
            print(lines[-1], file=sys.stderr, flush=True)
            write_atomic(record, lambda path: json.dump(points, open(path, 'w'), indent=1))
    print(f"\nthe {judge_name}'s worth against its data, on {A.run}'s base at temperature {temperature:g}; "
          f"{A.select_windows} held-out train windows "
          f"select every judge (its L2 strength, or its checkpoint); read on {A.num_samples} natural val windows "
          f"against as many base samples of other prompts (DV) and {A.read_negatives} of their own prompt (per "
          f"prompt), {train.block_size - PROMPT_LEN} tokens written a window")
    if spent:
        print(f"negatives: {written:,} tokens sampled (train, val and select splits, {K} a window) in "
              f"{spent['seconds']:.0f} s on {spent['device']} ({spent['torch_threads']} threads), "
              f"{spent['seconds'] / written * 1e6:.1f} s a million characters"
              + (" (resumed: the time of its last part alone, no timing)" if spent.get('resumed') else ''))
    print("| natural / generated train windows (L2 strength / step chosen) | FLOPs (negatives, training) | sight | "
          "DV, nats a window [95%] (scale) | per prompt [95%] (scale) | fit, CPU s | the MLE control at those FLOPs: "
          "sight | its DV [95%] | its per prompt [95%] |\n|---|---|---|---|---|---|---|---|---|")
    print('\n'.join(lines))
    if A.plot:
        plot(points, A.plot, f"{A.run}'s base: the {judge_name}'s worth against its data", judge_name)
        print(f"wrote {A.plot}")
    print(f"{time.time() - t0:.0f} s")


if __name__ == '__main__':
    with contextlib.suppress(BrokenPipeError):
        main()
