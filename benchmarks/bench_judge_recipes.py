"""
Judge recipes in nats: what each way of making a judge of a base model knows, as the Donsker-Varadhan bound of its
log-odds (worth.py) on natural val windows against the base's own continuations of other val prompts (evaluate.py's
two-sample windows), beside its sight (AUC) and its model FLOPs (its data's sampling and its training), every recipe
given the same sampled windows and passes over them:
  crossover    the cycle's judge: crossover data (K ~ U[1, N-1], 4 a block), per-position labels (token pooling), the
               base's trunk frozen, MSE (config/cycles_shakespeare_char.py's recipe);
  window       natural train windows against the base's continuations of their first 8 tokens, every weight
               trained, mean pooling, binary cross-entropy (docs/judges.md's judge that sees). With the base's own
               samples as noise at ratio 1, noise-contrastive estimation of a residual energy pi·e^f (Deng et al.
               2020) minimises this same logistic loss on f: it is the NCE judge too;
  per-prefix   the same windows, every position labelled (natural before the 8-token prompt's end, then synthetic),
               token pooling, every weight trained: a judge of every prefix, read also by its next-token law's
               perplexity (tilt.judge_law_cross_entropy);
  bidirectional  the window recipe with every position attending both ways (--bidirectional=True: the energy net
               of Deng et al. 2020 and Lin et al. 2021), which reads what a causal trunk cannot;
  ranking      ranking NCE (Lin et al. 2021): each natural train window against --negatives of the base's
               continuations of its 8-token prompt at once (the generator's samples are cheap), the window recipe's
               network otherwise;
  n-gram       the two-sample test's classifier (judge.NgramJudge) fit on the same windows' completions;
  combined     its features beside the GPT's (the base's final states, mean-pooled and standardised), one logistic
               regression on both.
Beside them, the MLE control given the largest recipe's FLOPs (run_cycles.mle_stage's rule, its best checkpoint
kept) and its exact log-ratio: what the same compute buys as next-token training, in the same nats.
With --select_windows n, every recipe trains to its own stopping: the data holds n more natural train windows (and
their samples) that no judge trains on, the GPT recipes keep the checkpoint whose loss there is lowest (up to
--epochs passes, patience 8) and the n-gram judge its L2 strength (judge.NgramJudge.fit_selected); without it they
select on half of the val split's windows (the n-gram judge fits at the referee's C = 1), as they did before.
Every judge is also read per prompt (worth.dv_bound_per_prompt): each natural val window against --negatives of the
base's continuations of its own prompt, the normaliser within that group. Ranking NCE fixes its scores only up to a
constant a prompt, so its worth is that column's; the pooled DV is no reading of it.

  python benchmarks/bench_judge_recipes.py --run runs/base [--windows 10000] [--epochs 2] [--num_samples 1000]
      [--law_windows 100] [--seed 1337] [--negatives 8] [--recipes crossover,window,...] [--device auto]
      [--select_windows 0]

The n-gram judge is saved as judge_ngram_<windows>w[_selectN].json, a judge bench_tilt.py --source and sample.py
--judge read. Everything is written under RUN/recipes/base_<the first 12 hex digits of the base checkpoint's sha256>,
each file named by its windows (data_window_5000w, judge_ranking8_allw_select2000.pt, ...), reused by a rerun on the
same base and by every recipe: a base trained again in the same run folder never reads another base's samples or
judges, and a rerun with other --windows never reads the data of these.
"""
import argparse
import contextlib
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import prepare_reward_data  # noqa: E402
import train_reward_model  # noqa: E402
from auc import sight_auc  # noqa: E402
from data_loader import file_sha256, resolve_data_dir  # noqa: E402
from judge import NgramJudge, reward_data_cmd, reward_model_cmd  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from reward_dataset_loader import RewardDataset, read_metadata  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import mle_control, run_files  # noqa: E402
from tilt import candidates, completion_logprob, judge_law_cross_entropy, judge_log_odds  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN, completion_texts, eval_windows  # noqa: E402
from worth import dv_bound, dv_bound_per_prompt  # noqa: E402

# each GPT recipe: (its data, train_reward_model.py options)
RECIPES = {
    'crossover': ('crossover', ['--reward_pooling=token', '--unfreeze_layers=0', '--learning_rate=1e-3']),
    'window': ('window', ['--reward_pooling=mean', '--unfreeze_layers=-1', '--loss=binary', '--learning_rate=3e-4']),
    'per-prefix': ('window', ['--reward_pooling=token', '--unfreeze_layers=-1', '--loss=binary',
                              '--learning_rate=3e-4']),
    'bidirectional': ('window', ['--reward_pooling=mean', '--unfreeze_layers=-1', '--loss=binary',
                                 '--learning_rate=3e-4', '--bidirectional=True']),
    'ranking': ('negatives', ['--reward_pooling=mean', '--unfreeze_layers=-1', '--loss=ranking',
                              '--learning_rate=3e-4']),
}


def make_data(kind, base, data_dir, out, windows, seed, exclude, negatives, select, temperature=1.0):
    """The sampled windows of a recipe: crossovers (4 a block), whole windows (an 8-token prompt each) or
    `negatives` continuations of each window's prompt, none of whose val blocks is an evaluation window (exclude:
    their number and seed); select: held-out train windows to select on (0: none); the base sampled at temperature."""
    if not os.path.isdir(out):
        blocks, per, k = (windows // 4, 4, 0) if kind == 'crossover' else \
            (windows, negatives if kind == 'negatives' else 1, PROMPT_LEN)
        with contextlib.redirect_stdout(sys.stderr):
            # prepare_reward_data writes under out.partial and renames it into place when done
            prepare_reward_data.main(reward_data_cmd(base, data_dir, out, blocks, per, seed, 'auto', temperature,
                                                     crossover_k=k, exclude_eval=exclude, select_blocks=select)[1:])
    return sum(int(read_metadata(os.path.join(out, f'{s}_metadata.txt'))['flops']) for s in ('train', 'val'))


def ngram_judge(data, tok):
    """The n-gram judge fit on the window data's train completions, natural against sampled; its L2 strength chosen
    on the select split's when the data has one (else the referee's C = 1)."""
    def texts(split):
        ds = RewardDataset(data, split)
        return [completion_texts(tok, torch.from_numpy(w.astype(np.int64))) for w in (ds.natural, ds.x)]
    if not os.path.exists(os.path.join(data, 'select_x.bin')):
        judge = NgramJudge()
        judge.fit(*texts('train'))
        return judge
    return NgramJudge.fit_selected(*texts('train'), *texts('select'))[0]


def combined_judge(data, tok, base, device):
    """The n-gram judge's features beside the base's mean-pooled final states, one logistic regression on both, fit
    on the window data's train windows; returns its log-odds of natural text on given windows, and the FLOPs of the
    base's pass over its training windows."""
    from scipy.sparse import csr_matrix, hstack
    from sklearn.preprocessing import StandardScaler
    from evaluate import mean_pooled_features
    from two_sample import tfidf_classifier
    ds = RewardDataset(data, 'train')
    windows = torch.from_numpy(np.concatenate([ds.natural, ds.x]).astype(np.int64)).to(device)
    y = np.r_[np.zeros(len(ds.natural)), np.ones(len(ds.x))]
    classifier = tfidf_classifier()
    tfidf = classifier[:-1].fit_transform(np.array(completion_texts(tok, windows), dtype=object), y)
    features = mean_pooled_features(base, windows)
    scaler = StandardScaler().fit(features)
    classifier[-1].fit(hstack([tfidf, csr_matrix(scaler.transform(features))]).tocsr(), y)

    def log_odds_of(w):
        x = hstack([classifier[:-1].transform(np.array(completion_texts(tok, w), dtype=object)),
                    csr_matrix(scaler.transform(mean_pooled_features(base, w)))]).tocsr()
        return -classifier[-1].decision_function(x)  # its logit is that of a sample; natural is class 0
    return log_odds_of, base.flops_per_token() * windows.numel()


def run_setting(run, device, parser):
    """A plateau or cycle run's (config, base path, the base's folder of judges and data, data folder, device);
    a run without a base or config is the parser's one-line error."""
    base_path, _, cfg = run_files(run, parser)
    work = os.path.join(run, 'recipes', f'base_{file_sha256(base_path)[:12]}')
    os.makedirs(work, exist_ok=True)
    return cfg, base_path, work, resolve_data_dir(cfg['dataset']), resolve_device(device)


@torch.no_grad()
def read_texts(base, val, n, negatives, seed, device, temperature=1.0):
    """What every judge is read on: n natural val windows (two_sample.eval_windows), the base's continuations (at
    temperature) of the PROMPT_LEN-token prompts of n other val windows (the pooled DV's), and `negatives`
    continuations of each natural window's own prompt, (n, negatives, L) (the per-prompt DV's)."""
    natural, prompts = (w.to(device) for w in eval_windows(val, n, base.config.block_size, seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    samples = base.generate(prompts[:, :PROMPT_LEN], natural.shape[1] - PROMPT_LEN, temperature, generator=gen)
    group = candidates(base, natural[:, :PROMPT_LEN], natural.shape[1], negatives, temperature, None, gen)[0]
    return natural, samples, group


def row(name, score, texts, flops, seed, law=None):
    """A table row: the judge's FLOPs, sight, worth a window (pooled, and per prompt) and a written token, and its
    next-token law; and its figures (dv_bound's, with per_prompt: dv_bound_per_prompt's, and auc). score: the
    judge's log-odds of windows; texts: (natural, samples of other prompts, (n, K, L) samples of each natural
    window's own prompt)."""
    natural, samples, group = texts
    f_natural, f_samples = score(natural), score(samples)
    f_group = score(group.reshape(-1, group.shape[-1])).reshape(group.shape[:2])
    b, g = dv_bound(f_natural, f_samples, seed), dv_bound_per_prompt(f_natural, f_group, seed)
    auc = sight_auc(1 / (1 + np.exp(-f_natural)), 1 / (1 + np.exp(-f_samples)))
    return (f"| {name} | {flops:.3g} | {auc:.3f} | {b['dv']:.2f} [{b['dv_ci'][0]:.2f}, {b['dv_ci'][1]:.2f}] "
            f"(×{b['dv_scale']:g}) | {g['dv']:.2f} [{g['dv_ci'][0]:.2f}, {g['dv_ci'][1]:.2f}] (×{g['dv_scale']:g}) | "
            f"{b['dv'] / (natural.shape[1] - PROMPT_LEN):.4f} | " + (law or '–') + ' |'), \
        dict(b, per_prompt=g, auc=auc)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--windows', type=int, default=10000, help="natural train windows a recipe (0: every one)")
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--law_windows', type=int, default=100)
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--negatives', type=int, default=8, help="the ranking recipe's continuations a natural window, "
                   "and the per-prompt reading's continuations of each natural val window's prompt")
    p.add_argument('--recipes', default=','.join(RECIPES), help="the GPT recipes to train and read, comma-separated")
    p.add_argument('--device', default='auto', help="where every model reads and samples (auto: cuda when available)")
    p.add_argument('--select_windows', type=int, default=0, help="held-out natural train windows every recipe "
                   "selects on (trained to its own stopping); 0: half of val's windows, as before")
    A = p.parse_args()
    recipes = A.recipes.split(',')
    if set(recipes) - set(RECIPES) or A.negatives < 1:
        p.error(f"--recipes takes some of {','.join(RECIPES)} and --negatives at least 1")
    t0 = time.time()
    cfg, base_path, work, data_dir, device = run_setting(A.run, A.device, p)
    base = GPT.from_checkpoint(base_path, device=device)
    tok = TokenizationManager.from_info(load_checkpoint(base_path)['tokenization'])
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    texts = read_texts(base, val, A.num_samples, A.negatives, A.seed, device)
    natural = texts[0]
    len_completion = natural.shape[1] - PROMPT_LEN
    law_natural = natural[:A.law_windows]
    base_law = np.exp(np.mean(-completion_logprob(base, law_natural, PROMPT_LEN) / len_completion))
    kinds = dict.fromkeys(['window'] + [RECIPES[name][0] for name in recipes])  # the n-gram judges read 'window'
    # every file is named by what it was made from: data_window_5000w, data_negatives8_allw_select2000, ...
    select = f"_{A.windows or 'all'}w" + (f'_select{A.select_windows}' if A.select_windows else '')
    tag = {kind: kind + (str(A.negatives) if kind == 'negatives' else '') + select for kind in kinds}
    data_flops = {kind: make_data(kind, base_path, data_dir, os.path.join(work, f'data_{tag[kind]}'), A.windows,
                                A.seed, (A.num_samples, A.seed), A.negatives, A.select_windows)
                  for kind in kinds}
    lines, spent = [], {}
    for name in recipes:
        kind, options = RECIPES[name]
        path = os.path.join(work, f"judge_{name}{A.negatives if kind == 'negatives' else ''}{select}.pt")
        if not os.path.exists(path):
            data = os.path.join(work, f'data_{tag[kind]}')  # selects on its select split where it has one
            with contextlib.redirect_stdout(sys.stderr):
                train_reward_model.main(reward_model_cmd(base_path, data, path, A.seed, 'auto',
                                                         options + [f'--max_epochs={A.epochs}', '--max_iters=100000',
                                                                    '--patience=8'])[1:])
        judge = GPT.from_checkpoint(path, device=device)
        spent[name] = data_flops[kind] + load_checkpoint(path)['flops']
        law = None
        if judge.config.reward_pooling == 'token':
            ce, own = judge_law_cross_entropy(base, judge, law_natural, PROMPT_LEN)
            law = f"{np.exp(ce.mean()):.3f} (base {np.exp(own.mean()):.3f})"
        lines.append(row(name, lambda w: judge_log_odds(judge, w, PROMPT_LEN), texts, spent[name], A.seed, law)[0])
    ngram = ngram_judge(os.path.join(work, f'data_{tag["window"]}'), tok)
    ngram.save(os.path.join(work, f'judge_ngram{select}.json'), load_checkpoint(base_path)['tokenization'])
    lines.append(row(f'n-gram (C = {ngram.C:g})', lambda w: ngram.log_odds(completion_texts(tok, w)), texts,
                     data_flops['window'], A.seed)[0])
    combined, pass_flops = combined_judge(os.path.join(work, f'data_{tag["window"]}'), tok, base, device)
    lines.append(row("combined (n-gram + the base's features)", combined, texts, data_flops['window'] + pass_flops,
                     A.seed)[0])
    most = max(spent.values())  # the MLE control's file is named by its budget: reused only at the same FLOPs
    mle = GPT.from_checkpoint(mle_control(cfg, base_path, most, os.path.join(work, f'mle_at_{most:.4g}_flops.pt'),
                                          cfg['seed'] + 1), device=device)

    def mle_ratio(w):
        return completion_logprob(mle, w, PROMPT_LEN) - completion_logprob(base, w, PROMPT_LEN)
    mle_line, _ = row('MLE control, exact log-ratio', mle_ratio, texts, most, A.seed)
    gap = mle_ratio(natural).mean()
    print(f"\n{A.windows} sampled windows a recipe, {A.epochs} epochs at most, selected on "
          + (f"{A.select_windows} held-out train windows" if A.select_windows else "half of val's windows")
          + f"; read on {A.num_samples} natural val windows "
          f"against as many base samples of other prompts (DV) and {A.negatives} of their own prompt (per prompt), "
          f"{len_completion} tokens written; base perplexity on the law's {A.law_windows} windows {base_law:.3f}\n"
          "| judge | FLOPs (data + training) | sight (AUC) | DV, nats a window [95%] (scale) | per prompt, "
          f"{A.negatives} + 1 a group [95%] (scale) | DV, nats a token | next-token law's perplexity |\n"
          "|---|---|---|---|---|---|---|")
    print('\n'.join(lines + [mle_line]))
    print(f"the MLE control's exact cross-entropy gap to the base on these natural windows: {gap:.2f} nats a "
          f"window ({gap / len_completion:.4f} a token)")
    print(f"{time.time() - t0:.0f} s")


if __name__ == '__main__':
    main()
