"""
What the two-sample referee reads on a corpus split by position. nanoGPT's shakespeare_char keeps the corpus' last
10% as val, so the val split holds plays the train split never shows: natural val text differs from natural train
text by its names and subjects before any model writes a word, and a generator trained on the train split continues
val prompts with train-split names. Side by side in one run, on one generator:

  python benchmarks/bench_referee_split.py --model runs/.../base_model_v1.pt [--dataset data/shakespeare_char]
      [--num_samples 1000] [--seed 1337] [--judge_samples N] [--reward_model RM.pt] [--json out.json]

the two-sample AUC (two_sample.py: 5 folds, pooled out-of-fold scores, bootstrap sd over texts) of
  val_vs_val      natural val windows against disjoint natural val windows, those the referee's prompts are cut
                  from (the known answer: 0.5)
  train_vs_val    natural train windows against natural val windows (the split's own shift: no model)
  referee         the generator's continuations of val prompts against natural val windows (evaluate.py's reading)
  in_domain       its continuations of train prompts against natural train windows (the same test where the
                  generator's training text lives; it has seen those windows, so this is a lower bound)
and the sight of the n-gram judge (judge.NgramJudge) fitted as the GPT judges are, on num_samples (or
judge_samples) natural train windows against the generator's continuations of other train prompts, read on the
referee's texts (where the GPT judges' sight is read) and on the in-domain texts; and the unknown-word rate
(evaluate.py's) of natural val and natural train text. With --reward_model, that GPT judge's sight (its P(natural)
of the whole window, as evaluate.py reads it) on the same two sets of texts, beside the n-gram judge's. Every text
is its window without the 8 natural prompt tokens at its start, as evaluate.py cuts them.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import resolve_data_dir  # noqa: E402
from data_loader import generator_train_tokens, train_words, unknown_word_rate  # noqa: E402
from auc import sight_auc, sight_auc_sd  # noqa: E402
from judge import NgramJudge  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from tokenization_manager import TokenizationInfo, TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN, continuation_texts, eval_windows, two_sample_test  # noqa: E402


def p_natural(judge, windows, batch_size=250):
    """A GPT judge's P(natural) of each whole window (its prompt included, as evaluate.py scores samples)."""
    return np.concatenate([judge(windows[i:i + batch_size])[0][:, 0].float().numpy()
                           for i in range(0, len(windows), batch_size)])


def natural_texts(tok, windows):
    return [tok.decode(w[PROMPT_LEN:]) for w in windows.tolist()]


@torch.no_grad()
def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', required=True, help='a generator checkpoint')
    p.add_argument('--dataset', default='', help="folder with train.bin/val.bin (default: the checkpoint's own)")
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--judge_samples', type=int, default=0, help="texts a side the n-gram judge is fitted on "
                   "(default: num_samples; another count draws other in-domain texts, the referee's stay)")
    p.add_argument('--reward_model', default='', help="a GPT judge (reward model) to read on the same texts")
    p.add_argument('--json', default='', help='also write the figures here')
    a = p.parse_args()
    ckpt = load_checkpoint(a.model)
    model = GPT.from_checkpoint(ckpt).eval()
    data_dir = resolve_data_dir(a.dataset or ckpt.get('config', {}).get('dataset', ''))
    tok = TokenizationManager('auto', data_dir=data_dir)  # the dataset's own meta.pkl: the checkpoint may have moved
    TokenizationInfo.from_dict(ckpt['tokenization']).check_compatible(TokenizationInfo.from_dict(tok.info()),
                                                                     a.model, data_dir)
    split = {s: np.memmap(os.path.join(data_dir, f'{s}.bin'), dtype=np.uint16, mode='r') for s in ('train', 'val')}
    split['train'] = generator_train_tokens(split['train'], ckpt)  # never the tail the generator held out
    n, N, t0 = a.num_samples, model.config.block_size, time.time()
    gen = torch.Generator().manual_seed(a.seed)
    # val: evaluate.py's windows (the natural reference, and the windows its prompts are cut from: natural val text
    # too, disjoint from the reference, the known answer's other side)
    val_ref, val_prompts = eval_windows(split['val'], n, N, a.seed)
    # train: (reference, prompts) for the in-domain test, and more to fit the n-gram judge
    n_fit = a.judge_samples or n
    train_ref, train_prompts = eval_windows(split['train'], n + n_fit, N, a.seed)
    natural_val, referee_samples, val_seqs, _ = continuation_texts(model, tok, val_ref, val_prompts, 1.0, None, gen)
    natural_train, train_samples, train_seqs, _ = continuation_texts(model, tok, train_ref[:n], train_prompts[:n], 1.0,
                                                                     None, gen)
    fit_natural, fit_samples = continuation_texts(model, tok, train_ref[n:], train_prompts[n:], 1.0, None, gen)[:2]
    c2st = {'val_vs_val': two_sample_test(natural_texts(tok, val_prompts), natural_val, a.seed),
            'train_vs_val': two_sample_test(natural_train, natural_val, a.seed),
            'referee': two_sample_test(natural_val, referee_samples, a.seed),
            'in_domain': two_sample_test(natural_train, train_samples, a.seed)}
    judge = NgramJudge()
    judge.fit(fit_natural, fit_samples)
    sight, gpt_sight = {}, {}
    rm = GPT.from_checkpoint(a.reward_model).eval() if a.reward_model else None
    for name, (nat, sam, nat_w, sam_w) in (('referee', (natural_val, referee_samples, val_ref, val_seqs)),
                                           ('in_domain', (natural_train, train_samples, train_ref[:n], train_seqs))):
        x, y = judge.p_natural(nat), judge.p_natural(sam)
        sight[name] = (sight_auc(x, y), sight_auc_sd(x, y, a.seed))
        if rm is not None:
            x, y = p_natural(rm, nat_w), p_natural(rm, sam_w)
            gpt_sight[name] = (sight_auc(x, y), sight_auc_sd(x, y, a.seed))
    known = train_words(data_dir, ckpt)
    unknown = {name: unknown_word_rate(texts, known) for name, texts in (
        ('natural_val', natural_val), ('natural_train', natural_train), ('samples_of_val_prompts', referee_samples),
        ('samples_of_train_prompts', train_samples))}
    print(f"{a.model}: {n} texts a side, {N - PROMPT_LEN} tokens each, seed {a.seed}; {time.time() - t0:.0f} s\n")
    print('| two-sample test | AUC ± sd |\n|---|---|')
    for name, r in c2st.items():
        print(f"| {name} | {r['c2st_auc']:.3f} ± {r['c2st_auc_sd']:.3f} |")
    print("\n| judge, read on | referee texts: sight ± sd | in-domain texts |\n|---|---|---|")
    for label, figures in ((f'n-gram, fitted on {n_fit} + {n_fit} train-domain texts', sight),
                           (a.reward_model, gpt_sight)):
        if figures:
            print(f"| {label} | " + ' | '.join(f"{s:.3f} ± {sd:.3f}" for s, sd in figures.values()) + ' |')
    print('\n| unknown-word rate of | rate |\n|---|---|')
    for name, r in unknown.items():
        print(f"| {name} | {100 * r:.1f}% |")
    if a.json:
        out = dict(model=os.path.abspath(a.model), num_samples=n, judge_samples=n_fit, seed=a.seed,
                   unknown_word_rate=unknown,
                   c2st={k: {f: v[f] for f in ('c2st_auc', 'c2st_auc_sd', 'c2st_auc_ci')} for k, v in c2st.items()},
                   ngram_judge_sight={k: dict(auc=s, sd=sd) for k, (s, sd) in sight.items()},
                   reward_model=a.reward_model,
                   gpt_judge_sight={k: dict(auc=s, sd=sd) for k, (s, sd) in gpt_sight.items()})
        with open(a.json + '.tmp', 'w') as f:
            json.dump(out, f, indent=1)
        os.replace(a.json + '.tmp', a.json)


if __name__ == '__main__':
    main()
