"""
The verdicts' known answers on the real corpus, read at the seed unit (each seed an evaluation of its own: other
prompts, other reference windows, other samples), as a method's claim is read (verdict.seed_effect):
  - two disjoint draws of natural val text: the two-sample test must read `equal`;
  - the same draws with invented words planted in 5% of one side's words: `worse`;
  - a stronger model (e.g. the teacher: base v1 trained further) against the weaker one: `better` on perplexity,
    on the two-sample test and on MAUVE (MAUVE has no margin: its seed-unit difference is read by its interval).
If a pair that must differ reads `unresolved`, the evaluation is underpowered for it at these samples and seeds: the
table gives each effect's interval half-width, the smallest effect it could have called.

  python benchmarks/bench_known_answers.py --weaker BASE_V1.pt --stronger TEACHER.pt [--dataset shakespeare_char]
      [--seeds 1,2,3] [--num_samples 1000] [--out runs/known_answers]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import data_path  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402
from two_sample import PROMPT_LEN  # noqa: E402
from verdict import AUC_MARGIN, PPL_MARGIN, c2st_effect, label_text, perplexity_effect, seed_effect  # noqa: E402


def plant_invented_words(texts, share, seed, letters='bcdfghjklmnpqrstvwxz'):
    """Replace share of each text's words by invented ones (random consonants), as a weak char model writes them."""
    rng = random.Random(seed)
    out = []
    for t in texts:
        words = t.split(' ')
        for i in rng.sample(range(len(words)), max(1, round(share * len(words)))):
            words[i] = ''.join(rng.choice(letters) for _ in range(len(words[i]) or 3))
        out.append(' '.join(words))
    return out


def natural_draws(data_dir, n, length, seed):
    """Three disjoint sets of n natural val windows (reference, A, B), decoded without their first PROMPT_LEN
    tokens, as the two-sample test reads a point's texts."""
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    tok = TokenizationManager('auto', data_dir=data_dir)
    chosen = np.random.default_rng([seed, 99]).choice(len(val) // length, size=3 * n, replace=False) * length
    texts = [tok.decode(np.asarray(val[o + PROMPT_LEN:o + length]).tolist()) for o in chosen]
    return texts[:n], texts[n:2 * n], texts[2 * n:]


def evaluate(a, seed, out):
    """evaluate.py on both checkpoints for one seed (the weaker as referee; no fresh judges): its two points."""
    path = os.path.join(out, f'eval_seed{seed}.json')
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(ROOT, 'evaluate.py'), a.weaker, a.stronger, '--dataset',
                        a.dataset, '--referee', a.weaker, '--out', path, '--num_samples', str(a.num_samples),
                        '--seed', str(seed), '--judge_seeds', '0', '--device', a.device], check=True)
    return json.load(open(path))


def row(name, expected, effects, margin, spec):
    e = seed_effect(effects, margin)
    per_seed = ', '.join(format(x, spec) for x in effects)
    return (f"| {name} | {expected} | {per_seed} | {e['effect']:{spec}} [{e['ci'][0]:{spec}}, {e['ci'][1]:{spec}}] | "
            f"± {e['detectable']:{spec}} | **{label_text(e)}** |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--weaker', required=True)
    p.add_argument('--stronger', required=True)
    p.add_argument('--dataset', default='shakespeare_char')
    p.add_argument('--seeds', default='1,2,3')
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--device', default='cpu')
    p.add_argument('--out', default='runs/known_answers')
    a = p.parse_args()
    a.dataset = data_path(a.dataset)
    os.makedirs(a.out, exist_ok=True)
    t0, seeds = time.time(), [int(s) for s in a.seeds.split(',')]
    natural, planted, c2st, ppl, mauve = [], [], [], [], []
    for s in seeds:
        weak, strong = evaluate(a, s, a.out)
        reference, draw_a, draw_b = natural_draws(a.dataset, a.num_samples, weak['sample_length'], s)
        point = lambda texts: dict(c2st_natural_texts=reference, c2st_sample_texts=texts)  # noqa: E731
        natural.append(c2st_effect(point(draw_a), point(draw_b), seed=s)['effect'])
        planted.append(c2st_effect(point(plant_invented_words(draw_a, 0.05, s)), point(draw_b), seed=s)['effect'])
        c2st.append(c2st_effect(strong, weak, seed=s)['effect'])
        ppl.append(perplexity_effect(strong['val_window_cross_entropy'], weak['val_window_cross_entropy'])['effect'])
        mauve.append(strong['mauve'] - weak['mauve'])
        print(f"seed {s}: done at {time.time() - t0:.0f} s", flush=True)
    print(f"\nknown answers at the seed unit: {len(seeds)} seeds, {a.num_samples} samples a point; weaker {a.weaker}, "
          f"stronger {a.stronger}; effects positive when the first side is closer to natural text\n")
    print('| pair | must read | per-seed effects | over seeds [95% t interval] | detectable | reads |')
    print('|---|---|---|---|---|---|')
    print(row('two disjoint natural draws, two-sample AUC', 'equal', natural, AUC_MARGIN, '.3f'))
    print(row('invented words in 5% of one draw\'s words, two-sample AUC', 'worse', planted, AUC_MARGIN, '.3f'))
    print(row('stronger vs weaker model, two-sample AUC', 'better', c2st, AUC_MARGIN, '.3f'))
    print(row('stronger vs weaker model, perplexity (whole val split)', 'better', ppl, PPL_MARGIN, '.2%'))
    print(row('stronger vs weaker model, MAUVE (no margin)', 'better', mauve, 0.0, '.3f'))
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == '__main__':
    main()
