"""
Evaluate generator checkpoints on the held-out val split and write the figures as JSON.

  python evaluate.py CKPT [CKPT ...] --dataset data/shakespeare_char --out eval.json \
      [--reward_model RM.pt] [--featurizer BASE_V1.pt] [--fresh_judge]

For each checkpoint: val perplexity (the shared function); samples at a fixed seed continued from natural prompts and,
against natural val text of the same length, distinct-n (n = 1..4, on tokens and on whitespace words), the
repetition rate, the share of words never seen in the train split, and MAUVE (features: mean-pooled hidden states
of one fixed featurizer checkpoint, so figures are comparable across cycles); the mean P(natural) a reward model
gives the samples; and the fresh-judge test: a new reward model, trained with the same recipe on reward data from
this generator, and its val R² and boundary error.
A generator that really got closer to natural text is harder for a fresh judge.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

from configurator import UserError, run_cli
from model import GPT, evaluate_perplexity, load_checkpoint
from runtime import resolve_device
from tokenization_manager import TokenizationManager
from train import resolve_data_dir

ROOT = os.path.dirname(os.path.abspath(__file__))
VOCAB_TOKENS = 20_000_000  # the known words of unknown_word_rate come from at most this many train tokens


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


def words_of(text):
    """Lower-cased words (letters and inner apostrophes) of a text."""
    return [w.strip("'").lower() for w in re.findall(r"[A-Za-z']+", text) if w.strip("'")]


def train_words(data_dir):
    """The known words of unknown_word_rate: those of the train split (its first VOCAB_TOKENS tokens)."""
    tok = TokenizationManager('auto', data_dir=data_dir)
    train = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
    return set(words_of(tok.decode(train[:VOCAB_TOKENS].tolist())))


def unknown_word_rate(texts, known_words):
    """Share of words never seen in known_words (the train split's): the misspelt and invented words a char
    model writes and natural text rarely has. Each text's first and last word are skipped: the window may cut them."""
    words = [w for t in texts for w in words_of(t)[1:-1]]
    return sum(w not in known_words for w in words) / len(words) if words else 0.0


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


def mauve_score(p_features, q_features, seed):
    import mauve
    result = mauve.compute_mauve(p_features=p_features, q_features=q_features, seed=seed, verbose=False,
                                 num_buckets=max(2, len(p_features) // 10))
    return float(result.mauve)


def natural_windows(val, n, length, seed):
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, len(val) - length, size=n)
    return torch.from_numpy(np.stack([val[o:o + length] for o in offsets]).astype(np.int64))


def reward_data_cmd(model_path, data_dir, out_dir, max_blocks, samples_per_chunk, seed, device):
    """The prepare_reward_data.py call of a judge: the cycle's and the fresh judge's data are made the same way."""
    return [os.path.join(ROOT, 'prepare_reward_data.py'), '--model_path', model_path, '--input_mode', 'binary',
            '--train_bin', os.path.join(data_dir, 'train.bin'), '--val_bin', os.path.join(data_dir, 'val.bin'),
            '--output_dir', out_dir, '--max_blocks', str(max_blocks), '--samples_per_chunk', str(samples_per_chunk),
            '--seed', str(seed), '--device', device]


def reward_model_cmd(model_path, data_dir, out_path, seed, device, rm_args):
    """The train_reward_model.py call of a judge; rm_args is the recipe (options of train_reward_model.py)."""
    return [os.path.join(ROOT, 'train_reward_model.py'), f'--model_path={model_path}', f'--data_dir={data_dir}',
            f'--out_path={out_path}', f'--seed={seed}', f'--device={device}'] + list(rm_args)


def run_fresh_judge(ckpt_path, data_dir, work_dir, device, max_blocks, samples_per_chunk, rm_args, seed):
    """Reward data from this generator, a new reward model on it (same recipe: rm_args), and its val metrics."""
    rd, rm = os.path.join(work_dir, 'judge_data'), os.path.join(work_dir, 'judge.pt')
    cmds = [[sys.executable] + reward_data_cmd(ckpt_path, data_dir, rd, max_blocks, samples_per_chunk, seed, device),
            [sys.executable] + reward_model_cmd(ckpt_path, rd, rm, seed, device, rm_args)]
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(f"fresh-judge step failed: {' '.join(cmd[1:3])}: {r.stderr.strip().splitlines()[-1:]}")
    m = load_checkpoint(rm)['metrics']
    return {'fresh_judge_r2': m['r2'], 'fresh_judge_boundary_error': m['boundary_error'],
            'fresh_judge_mse': m['mse'], 'fresh_judge_baseline_mse': m['baseline_mse']}


def evaluate_checkpoint(path, data_dir, device, known_words, featurizer=None, reward_model=None, num_samples=64,
                        sample_len=None, prompt_len=8, seed=1337, fresh_judge=None, work_dir=None):
    ckpt = load_checkpoint(path)
    model = GPT.from_checkpoint(ckpt, device=device)
    tok = TokenizationManager.from_info(ckpt['tokenization'])
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    L = sample_len or model.config.block_size
    ce, ppl = evaluate_perplexity(model, val, model.config.block_size)
    natural = natural_windows(val, num_samples, L, seed).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    samples = model.generate(natural[:, :prompt_len], L - prompt_len, 1.0, None, generator=gen)
    figures = {'checkpoint': path, 'val_cross_entropy': ce, 'val_perplexity': ppl, 'num_samples': num_samples,
               'sample_length': L}
    gen_stats = text_statistics(samples.tolist(), [tok.decode(s) for s in samples.tolist()], known_words)
    nat_stats = text_statistics(natural.tolist(), [tok.decode(s) for s in natural.tolist()], known_words)
    figures.update({k: v for k, v in gen_stats.items()})
    figures.update({f'natural_{k}': v for k, v in nat_stats.items()})
    featurizer = featurizer or model
    figures['mauve'] = mauve_score(mean_pooled_features(featurizer, natural), mean_pooled_features(featurizer, samples),
                                   seed)
    if reward_model is not None:
        with torch.no_grad():
            figures['mean_p_natural'] = float(reward_model(samples)[0][:, 0].mean())
            figures['mean_p_natural_of_natural_text'] = float(reward_model(natural)[0][:, 0].mean())
    figures['samples'] = [tok.decode(s) for s in samples[:3].tolist()]
    if fresh_judge:
        with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
            figures.update(run_fresh_judge(path, data_dir, tmp, str(device), seed=seed, **fresh_judge))
    return figures


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('checkpoints', nargs='+')
    p.add_argument('--dataset', required=True, help="folder with train.bin/val.bin (the checkpoints' data)")
    p.add_argument('--out', default='eval.json')
    p.add_argument('--reward_model', default=None)
    p.add_argument('--featurizer', default=None, help="checkpoint whose mean-pooled states feed MAUVE (default: the first)")
    p.add_argument('--num_samples', type=int, default=64)
    p.add_argument('--sample_len', type=int, default=None)
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='auto')
    p.add_argument('--fresh_judge', action='store_true')
    p.add_argument('--judge_max_blocks', type=int, default=300)
    p.add_argument('--judge_samples_per_chunk', type=int, default=4)
    p.add_argument('--judge_args', default='', help="train_reward_model.py options of the fresh judge's recipe, "
                   "e.g. '--max_iters=1500 --unfreeze_layers=2' (default: its defaults)")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    data_dir = resolve_data_dir(args.dataset)
    featurizer = GPT.from_checkpoint(args.featurizer or args.checkpoints[0], device=device)
    rm = GPT.from_checkpoint(args.reward_model, device=device) if args.reward_model else None
    judge = dict(max_blocks=args.judge_max_blocks, samples_per_chunk=args.judge_samples_per_chunk,
                 rm_args=args.judge_args.split()) if args.fresh_judge else None
    known_words = train_words(data_dir)  # read once: every checkpoint is judged against the same vocabulary
    results = []
    for path in args.checkpoints:
        figures = evaluate_checkpoint(path, data_dir, device, known_words, featurizer, rm, args.num_samples,
                                      args.sample_len, seed=args.seed, fresh_judge=judge,
                                      work_dir=os.path.dirname(os.path.abspath(args.out)))
        results.append(figures)
        shown = {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}
        print(f"{path}: {json.dumps(shown)}")
    tmp = args.out + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == '__main__':
    run_cli(main)
