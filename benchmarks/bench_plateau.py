"""
Has next-token training stopped gaining? A base read against its MLE control: the base trained further by
next-token loss for a given compute (run_cycles.mle_args: started from the kept checkpoint's weights with a fresh
AdamW at a held learning rate, its best checkpoint on the run's own selection split kept), one control a trainer seed and a learning rate, each
seed read on its own random val windows (two_sample.eval_windows, drawn from the seed). A base is at its plateau
when the control reads `equal` or `worse` against it at every learning rate tried (verdict.seed_effect over the
seeds); `better` says train on.

  python benchmarks/bench_plateau.py --run runs/plateau --flops 2.3e13 [--seeds 1338,2001,3001]
      [--learning_rates 0,2e-5] [--ppl_windows 400] [--device auto]

--flops: the largest arm's compute (the MLE control of a game is given as much). A learning rate of 0 is the
cycle's rule: the run's mle_learning_rate, else the rate its cosine ends at (base_min_lr), else base_learning_rate /
10. That rule can still gain after early stopping at a high learning rate, so a lower one is worth a row. The controls are written under RUN/plateau
(mle_lr{LR}_s{SEED}.pt) and reused.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import generator_train_tokens, resolve_data_dir, tokens_a_word  # noqa: E402
from model import GPT, evaluate_perplexity, load_checkpoint  # noqa: E402
from runtime import resolve_device  # noqa: E402
from shared import calibrated_temperature, effect_text, mle_control, run_files, window_ce  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from verdict import PPL_MARGIN, perplexity_effect, seed_effect  # noqa: E402


def fit_line(base, ckpt, cfg, val, device, train_read=200_000):
    """The base's perplexity on its own training tokens (the first train_read), its held-out selection tail and
    val: train and val within 1% say that it does not over-fit, and a dropout sweep may be skipped."""
    train = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'train.bin'), dtype=np.uint16, mode='r')
    own = generator_train_tokens(train, ckpt)
    reads = dict(train=own[:train_read], val=val, **({'tail': train[len(own):]} if len(own) < len(train) - 1 else {}))
    ppl = {name: evaluate_perplexity(base, tokens, device=device)[1] for name, tokens in reads.items()}
    tail = f", its selection tail ({len(reads['tail']):,} tokens) {ppl['tail']:.3f}" if 'tail' in ppl else ''
    print(f"base v1 perplexity: its training tokens (the first {min(train_read, len(own)):,} of {len(own):,}) "
          f"{ppl['train']:.3f}{tail}, val {ppl['val']:.3f}: train {ppl['train'] / ppl['val'] - 1:+.1%} of val "
          f"({'within 1%: no over-fit' if abs(ppl['train'] / ppl['val'] - 1) <= 0.01 else 'over 1% apart'})")
    if 'tail' in ppl:  # one scalar fit on the tail: what calibration alone buys an over-confident base, read on val
        T, _, _ = calibrated_temperature(base, ckpt, cfg['dataset'], device)
        at_T = evaluate_perplexity(base, val, device=device, temperature=T)[1]
        print(f"the tail-calibrated temperature {T:.3f}: val ppl {at_T:.3f} there ({at_T / ppl['val'] - 1:+.2%} of "
              f"T = 1's)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', required=True, help="a run_cycles.py folder with base_model_v1.pt and config.json")
    p.add_argument('--flops', type=float, required=True, help="each MLE control's compute, FLOPs")
    p.add_argument('--seeds', default='1338,2001,3001')
    p.add_argument('--learning_rates', default='0', help="held learning rates, comma-separated (0: the cycle's rule)")
    p.add_argument('--ppl_windows', type=int, default=400, help="each seed's own val windows the perplexity reads")
    p.add_argument('--device', default='auto', help="where the perplexity is read, in fp32 (auto: cuda when available)")
    a = p.parse_args()
    base_path, _, cfg = run_files(a.run, p)
    base_ckpt = load_checkpoint(base_path)
    device = resolve_device(a.device)
    base = GPT.from_checkpoint(base_ckpt, device=device)
    val = np.memmap(os.path.join(resolve_data_dir(cfg['dataset']), 'val.bin'), dtype=np.uint16, mode='r')
    tokens = base.config.block_size - PROMPT_LEN
    a_word = tokens_a_word(val, TokenizationManager.from_info(base_ckpt['tokenization']))
    os.makedirs(os.path.join(a.run, 'plateau'), exist_ok=True)
    fit_line(base, base_ckpt, cfg, val, device)
    print(f"base v1: iteration {base_ckpt['iter_num']} kept (stopped at {base_ckpt.get('stopped_at')}: "
          f"{base_ckpt.get('stop_reason')}); MLE controls of {a.flops:.3g} FLOPs each; {a.ppl_windows} val windows a "
          f"seed, its own\n| learning rate | seed | iterations kept / trained | base val ppl | control val ppl | "
          f"control vs base [95%, its windows] | gain, nats a completion |\n|---|---|---|---|---|---|---|")
    seeds = [int(s) for s in a.seeds.split(',')]
    windows = {seed: eval_windows(val, a.ppl_windows, base.config.block_size, seed)[0].to(device) for seed in seeds}
    base_ces = {seed: window_ce(base, windows[seed]) for seed in seeds}  # the base read once a seed, for every rate
    verdicts, words = [], []
    for lr in [float(x) for x in a.learning_rates.split(',')]:
        effects = []
        for seed in seeds:
            out = os.path.join(a.run, 'plateau', f'mle_lr{lr:g}_s{seed}.pt')
            control = load_checkpoint(mle_control(dict(cfg, mle_learning_rate=lr), base_path, a.flops, out, seed))
            base_ce, control_ce = base_ces[seed], window_ce(GPT.from_checkpoint(control, device=device), windows[seed])
            effect = perplexity_effect(control_ce, base_ce, seed)
            effects.append(effect)
            gain = (base_ce.mean() - control_ce.mean()) * tokens
            kept, trained = control['iter_num'], control.get('stopped_at', control['iter_num'])  # from its start
            print(f"| {lr or control['config']['learning_rate']:g} | {seed} | {kept} / {trained} | "
                  f"{np.exp(base_ce.mean()):.3f} | {np.exp(control_ce.mean()):.3f} | {effect_text(effect)} | "
                  f"{gain:+.3f} |")
        method = seed_effect(effects, PPL_MARGIN)
        verdicts.append(method['label'])
        print(f"| {lr or 'the rule'} | **over {len(effects)} seeds** | | | | **{effect_text(method)}** | |")
        per_token = -np.log(1 - method['effect'])  # the mean effect back in nats a token
        words.append(f"{lr or 'the rule'}: {per_token:+.4f} nats a token = {per_token * a_word:+.4f} nats a word, "
                     f"{1 - np.exp(-per_token * a_word):+.2%} of word perplexity")
    print(f"in word units ({a_word:.2f} tokens a word on val, spaces included): " + '; '.join(words))
    at_plateau = all(v in ('equal', 'worse') for v in verdicts)
    print(f"plateau: {'yes' if at_plateau else 'no'} (the MLE control reads "
          f"{' / '.join(verdicts)} against the base{'' if at_plateau else ': train on'})")


if __name__ == '__main__':
    main()
