"""
Evaluate generator checkpoints with instruments that never read the evaluated model's own features, and write the
figures as JSON.

  python evaluate.py CKPT [CKPT ...] --dataset data/shakespeare_char --referee REFEREE.pt --out eval.json \
      [--temperatures 1.0,0.8] [--top_k N] [--reward_model RM.pt] [--judge_seeds 3] [--no_ppl] [--no_mauve]

The referee is one fixed generator checkpoint (a cycle uses its base_model_v1.pt) with the tokenization of the
evaluated ones. For each checkpoint and sampling temperature (a "point"):
- held-out perplexity over the whole val split at that temperature, with each window's cross-entropy (the verdict
  compares models window by window);
- num_samples samples continued from natural val prompts, against as many natural val windows that share no token
  with those prompts: distinct-n, repetition, the unknown-word rate, the sampler's entropy, and MAUVE on the
  referee's mean-pooled features with a bootstrap spread;
- the fresh-judge test, judge_seeds times, each judge on its own draw of data written by this generator at this
  temperature, selected on one half of its val data. --judge_recipe crossover (the default): crossover reward
  data, a new judge head on the referee's frozen trunk, reported on the other half of its val data: boundary error
  and R² as mean ± sd over seeds; a generator whose text is really closer to natural text leaves the judge a higher
  boundary error. --judge_recipe window (the recipe of the judge that sees, docs/judges.md): train-split natural
  windows against this generator's continuations of their first 8 tokens, every weight of a copy of the referee
  trained (mean pooling, loss 'binary'); reported as its sight on this point's two-sample windows (the AUC of its
  P(natural), natural windows against the samples, below), mean ± sd over seeds: lower is closer to natural text.
  A judge whose kept checkpoint is its untrained start (it never beat its first evaluation) is blind: its figures
  are the constant predictor's, whatever the text; a point whose judges are all blind is flagged
  (fresh_judge_blind), and a verdict read from it says 'blind';
- with --reward_model, that judge on the two-sample windows below: its sight (the AUC of its P(natural), natural
  windows against the samples) and its worth in nats (worth.py: the Donsker-Varadhan bound of its log-odds, the
  likelihood gain its tilt of this generator is sure of, its scale chosen on half the windows, read on the other);
- the classifier two-sample test (C2ST; Lopez-Paz & Oquab 2017), a referee that reads no model: a logistic
  regression on TF-IDF char n-grams and word unigrams tells the natural reference windows from the samples, the
  shared prompt length cut from both, over stratified folds; the AUC of the pooled out-of-fold scores, with its
  bootstrap spread over the texts. Lower AUC means closer to natural text (0.5: indistinguishable to it). Every
  point of a run (and of any run with the same dataset, referee block size, num_samples and seed) is measured on
  the same natural windows and prompts; both texts are kept (c2st_*_texts), so verdict.py reads two points with
  one classifier trained on both.
- the natural windows' completions' cross-entropy under the point (completion_window_cross_entropy, nats a token),
  which the tilt's verdict pairs window by window.
With --tilt PATH each checkpoint's point is its tilt pi·e^{a·f} by that judge (or, the positive control, by a better
generator's exact log-ratio), sampled by resampling --tilt_k candidates a prompt (tilt.py): its samples meet every
referee above but the fresh judges (which need a checkpoint to write their data); its perplexity is the tilt's on the
first --tilt_windows natural completions, from fresh candidates of their own prompts, at K = 8, 32, 128 and
--tilt_k, conservative and optimistic (tilt.py); the verdict reads the conservative one at --tilt_k.
"""

import argparse
import contextlib
import hashlib
import json
import os
import tempfile

import numpy as np
import torch

from auc import sight_auc, sight_auc_sd
from calibration import checkpoint_calibrated_temperature, load_generator
from configurator import UserError, parse_checked, run_cli
from data_loader import resolve_data_dir, train_words, unknown_word_rate
from judge import reward_data_cmd, reward_model_cmd
from model import GPT, evaluate_perplexity, load_checkpoint
from runtime import resolve_device
from tokenization_manager import TokenizationInfo, TokenizationManager
from tilt import TILT_PPL_K, TiltSource, completion_logprob, judge_log_odds, sample_tilt, tilt_cross_entropy
from two_sample import C2ST_FOLDS, PROMPT_LEN, completion_texts, continuation_texts, eval_windows, two_sample_test
from worth import dv_bound

ROOT = os.path.dirname(os.path.abspath(__file__))
# the fresh judges' recipes: (the crossover_k of their data, the train_reward_model.py options fixed by the recipe,
# the figures averaged over seeds). crossover: the referee's trunk stays frozen (one fixed featurizer), its head sees
# the mean over positions. window: every weight of the referee's copy trains, on whole windows (docs/judges.md)
JUDGE_RECIPES = {'crossover': (0, ['--unfreeze_layers=0', '--reward_pooling=mean'], ('boundary_error', 'r2')),
                 'window': (PROMPT_LEN, ['--unfreeze_layers=-1', '--reward_pooling=mean', '--loss=binary'],
                            ('sight_auc', 'pair_accuracy'))}


def distinct_n(sequences, n):
    """Distinct n-grams over all n-grams of all sequences (corpus-level distinct-n); sequences of tokens or words."""
    grams = [tuple(s[i:i + n]) for s in sequences for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(sequences, n=4):
    """Share of n-grams that repeat an earlier n-gram of the same sequence, averaged over sequences (seq-rep-n)."""
    rates = []
    for s in sequences:
        grams = [tuple(s[i:i + n]) for i in range(len(s) - n + 1)]
        if grams:
            rates.append(1.0 - len(set(grams)) / len(grams))
    return float(np.mean(rates)) if rates else 0.0


def text_statistics(token_seqs, texts, known_words=None):
    stats = {f'distinct_{n}_tokens': distinct_n(token_seqs, n) for n in range(1, 5)}
    words = [t.split() for t in texts]
    stats.update({f'distinct_{n}_words': distinct_n(words, n) for n in range(1, 5)})
    stats['repetition_rate_4_tokens'] = repetition_rate(token_seqs, 4)
    if known_words is not None:
        stats['unknown_word_rate'] = unknown_word_rate(texts, known_words)
    return stats


@torch.no_grad()
def mean_pooled_features(featurizer, seqs, batch_size=64):
    out = []
    for i in range(0, len(seqs), batch_size):
        out.append(featurizer.hidden_states(seqs[i:i + batch_size]).mean(dim=1).float().cpu().numpy())
    return np.concatenate(out)


def mauve_with_spread(p_features, q_features, seed, n_boot=10):
    """MAUVE of the two sets, and the sd of MAUVE over n_boot bootstrap resamples of both (its sampling spread)."""
    import mauve

    def score(p, q, s):
        return float(mauve.compute_mauve(p_features=p, q_features=q, seed=s, verbose=False,
                                         num_buckets=max(2, len(p) // 10)).mauve)
    rng = np.random.default_rng(seed)
    boots = [score(p_features[rng.integers(0, len(p_features), len(p_features))],
                   q_features[rng.integers(0, len(q_features), len(q_features))], seed + b + 1) for b in range(n_boot)]
    return score(p_features, q_features, seed), float(np.std(boots, ddof=1)) if n_boot > 1 else 0.0


def trunk_signature(state_dict):
    """sha256 of the trunk's tensors (the 'transformer.' ones): equal iff two models share the same trunk."""
    h = hashlib.sha256()
    for k in sorted(k for k in state_dict if 'transformer.' in k):  # an ensemble's: members.i.transformer.
        h.update(k.encode())
        h.update(state_dict[k].detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def sight_figures(judge, reference, samples, seed):
    """A judge's P(natural) means, its sight (AUC, natural windows against samples, with its bootstrap sd) and its
    worth in nats (worth.dv_bound of its log-odds as the tilt and the game read them, tilt.judge_log_odds: natural
    windows against the samples, per window and per completion token)."""
    probs_natural, probs_samples = [judge(x)[0].double().cpu().numpy() for x in (reference, samples)]
    p_natural, p_samples = probs_natural[:, 0], probs_samples[:, 0]
    worth = dv_bound(judge_log_odds(judge, reference, PROMPT_LEN), judge_log_odds(judge, samples, PROMPT_LEN), seed)
    return dict(mean_p_natural=float(p_samples.mean()), mean_p_natural_of_natural_text=float(p_natural.mean()),
                sight_auc=sight_auc(p_natural, p_samples), sight_auc_sd=sight_auc_sd(p_natural, p_samples, seed),
                **worth, dv_per_token=worth['dv'] / (reference.shape[1] - PROMPT_LEN))


def fresh_judges(ckpt_path, referee_path, data_dir, work_dir, device, seeds, temperature, top_k, max_blocks,
                 samples_per_chunk, rm_args, recipe='crossover', sight_windows=None, exclude_eval=None):
    """One fresh judge per seed (run in this process, through the two scripts' own main): its figures on the test
    half of its val data, or with the window recipe its sight on sight_windows (reference, samples), and the
    signature of its trunk (the referee's, trained further by the window recipe). exclude_eval: (samples, seed) of
    the evaluation, whose two-sample windows none of its val blocks is."""
    import prepare_reward_data
    import train_reward_model
    crossover_k, fixed_args, keys = JUDGE_RECIPES[recipe]
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
            rd, rm = os.path.join(tmp, 'data'), os.path.join(tmp, 'judge.pt')
            with open(os.devnull, 'w') as quiet, contextlib.redirect_stdout(quiet):  # their bars stay on stderr
                prepare_reward_data.main(reward_data_cmd(ckpt_path, data_dir, rd, max_blocks, samples_per_chunk,
                                                         seed, device, temperature, top_k, crossover_k,
                                                         exclude_eval)[1:])
                train_reward_model.main(reward_model_cmd(referee_path, rd, rm, seed, device,
                                                         list(rm_args) + fixed_args)[1:])
            judge = load_checkpoint(rm)
            # the kept head is the one of its first evaluation, before any step: the untrained start
            runs.append(dict(judge['metrics'], seed=seed, trunk=trunk_signature(judge['model']),
                             blind=judge['iter_num'] == 0))
            if recipe == 'window':
                sight = sight_figures(GPT.from_checkpoint(judge, device=device), *sight_windows, seed)
                runs[-1].update(sight_auc=sight['sight_auc'], sight_auc_sd=sight['sight_auc_sd'])
        print(f"  fresh judge seed {seed}: " + ', '.join(f"{k} {runs[-1][k]:.4f}" for k in keys)
              + (' (blind: never left its untrained start)' if runs[-1]['blind'] else ''))
    out = {'fresh_judge_runs': runs, 'fresh_judge_blind': all(r['blind'] for r in runs),
           'fresh_judge_blind_count': sum(r['blind'] for r in runs), 'fresh_judge_recipe': recipe}
    for key in keys:
        values = [r[key] for r in runs]
        out[f'fresh_judge_{key}'] = float(np.mean(values))
        out[f'fresh_judge_{key}_sd'] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    out['fresh_judge_n'] = len(runs)
    return out


def completion_figures(model, source, reference, temperature, A):
    """The cross-entropy of each natural window's completion (nats a token) under the point, and its perplexity; for
    a tilt (source), that of the tilt on the first A.tilt_windows windows, conservative at A.tilt_k (tilt.py), with
    the tilt's perplexities at every K shown."""
    length = reference.shape[1] - PROMPT_LEN
    if not source:
        ce = -completion_logprob(model, reference, PROMPT_LEN, temperature) / length
        return dict(completion_window_cross_entropy=ce.tolist(), completion_perplexity=float(np.exp(ce.mean())))
    Ks = sorted(set(TILT_PPL_K) | {A.tilt_k})
    gen = torch.Generator(device=reference.device).manual_seed(A.seed + 1)  # its own candidates, not the samples'
    ces = tilt_cross_entropy(model, source, reference[:A.tilt_windows], PROMPT_LEN, Ks, A.tilt_scale, temperature,
                             gen)
    ce = ces[A.tilt_k]['conservative']
    return dict(tilt=os.path.abspath(A.tilt), tilt_kind=source.kind, tilt_k=A.tilt_k, tilt_scale=A.tilt_scale,
                completion_window_cross_entropy=ce.tolist(), completion_perplexity=float(np.exp(ce.mean())),
                tilt_perplexity={str(K): {name: float(np.exp(v.mean())) for name, v in c.items()}
                                 for K, c in ces.items()},
                tilt_window_cross_entropy={str(K): c['conservative'].tolist() for K, c in ces.items()})


def evaluate_point(path, temperature, A, data_dir, device, referee, known_words, reference, reference_features,
                   prompts, reward_model):
    """Every figure of one checkpoint sampled at one temperature."""
    ckpt = load_generator(path, data_dir, device)
    model = GPT.from_checkpoint(ckpt, device=device)
    if model.config.block_size < reference.shape[1]:
        raise UserError(f"{path} has block size {model.config.block_size}, below the referee's {reference.shape[1]}")
    tok = TokenizationManager.from_info(ckpt['tokenization'])
    figures = {'checkpoint': ','.join(os.path.abspath(p) for p in path.split(',')), 'temperature': temperature,
               'top_k': A.top_k,
               'num_samples': len(reference), 'sample_length': reference.shape[1]}
    source = A.tilt and TiltSource(A.tilt, model, ckpt, temperature, device)
    if not A.no_ppl:
        figures.update(completion_figures(model, source, reference.to(device), temperature, A))
    if not A.no_ppl and not source:  # a tilt has no whole-split perplexity: its normaliser is per prompt
        val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
        ce, ppl, windows = evaluate_perplexity(model, val, model.config.block_size, temperature=temperature,
                                               per_window=True)
        figures.update(val_cross_entropy=ce, val_perplexity=ppl, val_window_cross_entropy=windows)
    gen = torch.Generator(device=device).manual_seed(A.seed)
    # the sampler's own entropy at every generated position: its diversity, which temperature controls (a tilt's:
    # the generator's entropy along the kept candidates)
    if source:
        samples, entropy, tilt_figures = sample_tilt(model, source, prompts[:, :PROMPT_LEN].to(device),
                                                     reference.shape[1], A.tilt_k, A.tilt_scale, temperature,
                                                     A.top_k, gen, np.random.default_rng(A.seed))
        natural_texts, sample_texts = completion_texts(tok, reference), completion_texts(tok, samples)
        figures.update(tilt_figures)
    else:
        natural_texts, sample_texts, samples, entropy = continuation_texts(model, tok, reference, prompts,
                                                                           temperature, A.top_k, gen, entropy=True)
    texts = [tok.decode(s) for s in samples.tolist()]
    figures.update(text_statistics(samples.tolist(), texts, known_words))
    natural = text_statistics(reference.tolist(), [tok.decode(s) for s in reference.tolist()], known_words)
    if A.c2st_folds:  # both without the prompt's length: the samples' prompts are natural text
        figures.update(two_sample_test(natural_texts, sample_texts, A.seed, A.c2st_folds),
                       c2st_natural_texts=natural_texts, c2st_sample_texts=sample_texts)  # for the verdict's test
    figures.update({f'natural_{k}': v for k, v in natural.items()})
    figures['sample_entropy'] = float(entropy.double().mean())
    if not A.no_mauve:
        figures['mauve'], figures['mauve_sd'] = mauve_with_spread(
            reference_features, mean_pooled_features(referee, samples), A.seed)
    windows = (reference.to(device), samples)  # the two-sample test's own: natural against sampled
    if reward_model is not None:  # its sight
        sight = sight_figures(reward_model, *windows, A.seed)
        figures.update(mean_p_natural=sight['mean_p_natural'],
                       mean_p_natural_of_natural_text=sight['mean_p_natural_of_natural_text'],
                       **{'judge_' + k: v for k, v in sight.items() if k.startswith(('sight', 'dv'))})
    figures['samples'] = texts[:3]
    if A.judge_seeds and not source:
        seeds = [A.seed + 1000 * j for j in range(A.judge_seeds)]
        figures.update(fresh_judges(path, A.referee, data_dir, A.work_dir, str(device), seeds, temperature, A.top_k,
                                    A.judge_max_blocks, A.judge_samples_per_chunk, A.judge_args.split(),
                                    A.judge_recipe, windows, (A.num_samples, A.seed)))
    return figures


# each number's range and the relations between them, checked (configurator.parse_checked) before anything is read
RANGES = dict(temperatures='each > 0 or calibrated', top_k='>= 1', num_samples='>= 2', seed='>= 0', judge_seeds='>= 0',
              judge_max_blocks='>= 1', judge_samples_per_chunk='>= 1', c2st_folds='0 or >= 2', tilt_k='>= 2',
              tilt_scale='>= 0', tilt_windows='>= 1')
RELATIONS = (('num_samples is None or c2st_folds <= num_samples', "each fold holds at least one sample"),)
NUM_SAMPLES = 1000  # samples a point by default, where the val split holds twice as many windows


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('checkpoints', nargs='+', help="generator checkpoints, each a point; a.pt,b.pt: their ensemble, "
                   "each at its calibrated temperature")
    p.add_argument('--dataset', required=True, help="folder with train.bin/val.bin (the checkpoints' data)")
    p.add_argument('--referee', required=True, help="the fixed generator checkpoint whose trunk serves MAUVE and "
                   "every fresh judge (a cycle: its base_model_v1.pt)")
    p.add_argument('--out', default='eval.json')
    p.add_argument('--temperatures', default='1.0', help="comma-separated sampling temperatures, each a point; "
                   "'calibrated': each checkpoint's own, the one its held-out selection tail reads best")
    p.add_argument('--top_k', type=lambda s: None if s == 'None' else int(s), default=None)
    p.add_argument('--reward_model', default=None, help="a reward model whose mean P(natural) of the samples, "
                   "sight (AUC, natural windows against the samples) and worth in nats (the Donsker-Varadhan bound "
                   "of its log-odds, worth.py) are reported")
    p.add_argument('--num_samples', type=int, default=None, help=f"samples a point, and as many natural windows "
                   f"(default: {NUM_SAMPLES}, or as many as the val split holds twice over)")
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='auto')
    p.add_argument('--no_ppl', action='store_true', help="skip the whole-split perplexity")
    p.add_argument('--no_mauve', action='store_true')
    p.add_argument('--judge_seeds', type=int, default=3, help="fresh judges per point (0: none)")
    p.add_argument('--judge_max_blocks', type=int, default=400, help="natural blocks per split of each judge's data")
    p.add_argument('--judge_samples_per_chunk', type=int, default=1, help="crossovers per block of each judge's data")
    p.add_argument('--judge_recipe', choices=sorted(JUDGE_RECIPES), default='crossover',
                   help="crossover: a head on the referee's frozen trunk, read on crossovers (boundary error); window: "
                        "every weight of the referee's copy trained on whole windows, read as its sight")
    p.add_argument('--c2st_folds', type=int, default=C2ST_FOLDS, help="folds of the two-sample test (0: none)")
    p.add_argument('--tilt', default='', help="a reward model (or a better generator, the positive control): each "
                   "point is the checkpoint tilted by its log-odds (or exact log-ratio), sampled by resampling")
    p.add_argument('--tilt_k', type=int, default=32, help="the tilt's candidates a sample")
    p.add_argument('--tilt_scale', type=float, default=1.0, help="a of the tilt pi·e^{a·f}")
    p.add_argument('--tilt_windows', type=int, default=250, help="natural completions (at most --num_samples) the "
                   f"tilt's perplexity is read on, {max(TILT_PPL_K)} fresh candidates each")
    p.add_argument('--judge_args', default='', help="train_reward_model.py options of the fresh judges' recipe, "
                   "e.g. '--max_iters=1500 --learning_rate=1e-3' (pooling is the mean; the recipe sets what trains)")
    A = parse_checked(p, argv, RANGES, RELATIONS)
    A.temperatures = [t if t == 'calibrated' else float(t) for t in A.temperatures.split(',')]
    A.work_dir = os.path.dirname(os.path.abspath(A.out))
    return A


def fitted_num_samples(A, windows):
    """--num_samples as given (eval_windows stops on one the split cannot hold), or by default NUM_SAMPLES, fewer
    where the val split holds under 2 x NUM_SAMPLES windows of the referee's block beside the fresh judges' val blocks
    (judge_max_blocks, at most half the split; their data never holds an evaluation window), said in one line."""
    if A.num_samples is not None:
        return A.num_samples
    judges = min(A.judge_max_blocks, windows // 2) if A.judge_seeds else 0
    n = min(NUM_SAMPLES, (windows - judges) // 2)
    if n < max(2, A.c2st_folds):
        raise UserError(f"the val split holds {windows} windows of the referee's block: too few for an evaluation "
                        f"(2 x {max(2, A.c2st_folds)}); use a larger val split or a smaller block")
    if n < NUM_SAMPLES:
        print(f"num_samples: {n}, what the val split's {windows} windows hold twice over"
              + (f" beside the fresh judges' {judges}" if judges else '') + f" (default {NUM_SAMPLES})")
    return n


def own_temperature(path, temperature, data_dir, device):
    """A point's sampling temperature: the number given, or 'calibrated', the checkpoint's own (calibration.py)."""
    if temperature != 'calibrated':
        return temperature
    T = checkpoint_calibrated_temperature(load_generator(path, data_dir, device), data_dir, device)[0]
    print(f"{path}: its calibrated temperature, {T:.4f}")
    return T


def main(argv):
    A = parse_args(argv)
    device = resolve_device(A.device)
    data_dir = resolve_data_dir(A.dataset)
    referee_ckpt = load_checkpoint(A.referee)
    referee = GPT.from_checkpoint(referee_ckpt, mode='generator', device=device)
    for path in (p for spec in A.checkpoints for p in spec.split(',')):
        TokenizationInfo.from_dict(referee_ckpt['tokenization']).check_compatible(
            TokenizationInfo.from_dict(load_checkpoint(path)['tokenization']), f'the referee {A.referee}', path)
    rm = GPT.from_checkpoint(A.reward_model, device=device) if A.reward_model else None
    known_words = train_words(data_dir, referee_ckpt)  # read once: every point is judged against one vocabulary
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    A.num_samples = fitted_num_samples(A, len(val) // referee.config.block_size)
    reference, prompts = eval_windows(val, A.num_samples, referee.config.block_size, A.seed)
    reference_features = None if A.no_mauve else mean_pooled_features(referee, reference.to(device))  # once a run
    results, points = [], [(path, own_temperature(path, t, data_dir, device)) for path in A.checkpoints
                            for t in A.temperatures]  # a checkpoint with no calibrated temperature stops here
    for path, temperature in points:
        print(f"{path} at temperature {temperature}:")
        figures = evaluate_point(path, temperature, A, data_dir, device, referee, known_words, reference,
                                 reference_features, prompts, rm)
        figures['referee'] = os.path.abspath(A.referee)
        figures['referee_trunk'] = trunk_signature(referee_ckpt['model'])
        results.append(figures)
        shown = {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}
        print(f"  {json.dumps(shown)}")
    tmp = A.out + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, A.out)
    print(f"wrote {A.out}")


if __name__ == '__main__':
    run_cli(main)
