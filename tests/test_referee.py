"""The model-free referee (the classifier two-sample test) and the blind flag of the fresh judges, on cases with
known answers."""
import os
import random
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import ROOT, make_text
from two_sample import two_sample_test
from verdict import c2st_effect, judge_verdict, matched_temperature, perplexity_effect

sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
from bench_known_answers import plant_invented_words  # noqa: E402


def windows(text, n, length=120):
    return [text[i * length:(i + 1) * length] for i in range(n)]


@pytest.fixture(scope='module')
def natural():
    """Three disjoint draws of the same natural source (the tests' Shakespeare-like text, three seeds), 1,000 windows
    of 120 characters each, as an evaluation point has."""
    return tuple(windows(make_text(120000, seed=s), 1000) for s in (1, 2, 3))


def test_two_disjoint_natural_draws_are_indistinguishable(natural):
    a, b, _ = natural
    r = two_sample_test(a, b, seed=0)
    assert abs(r['c2st_auc'] - 0.5) < 0.05 and abs(r['c2st_accuracy'] - 0.5) < 0.05, r
    assert r['c2st_n'] == 2000 and r['c2st_folds'] == 5 and 0.005 < r['c2st_auc_sd'] < 0.03
    assert r['c2st_auc_ci'][0] < r['c2st_auc'] < r['c2st_auc_ci'][1]


def test_invented_words_in_a_fifth_of_the_words_are_seen(natural):
    a, b, _ = natural
    r = two_sample_test(a, plant_invented_words(b, 0.2, seed=0), seed=0)
    assert r['c2st_auc'] > 0.93 and r['c2st_accuracy'] > 0.65, r  # measured 0.960, 0.738


def test_two_sample_test_is_deterministic_per_seed(natural):
    a, b, _ = natural
    planted = plant_invented_words(b, 0.05, seed=0)
    assert two_sample_test(a, planted, seed=3) == two_sample_test(a, planted, seed=3)
    assert two_sample_test(a, planted, seed=3) != two_sample_test(a, planted, seed=4)  # other folds


def test_the_referee_counted_once_is_the_pipeline_fitted_per_fold(natural):
    """fold_referee's features come from term counts made once over all texts; fitted on a fold's rows it scores as
    the vectorizers fitted on that fold's texts alone do (their vocabulary, min_df and idf), to float rounding."""
    from two_sample import fold_referee, term_counts, tfidf_classifier
    a, b, _ = natural
    texts = np.array(a[:150] + plant_invented_words(b[:150], 0.1, seed=0), dtype=object)
    y = np.r_[np.zeros(150), np.ones(150)]
    train, test = np.arange(0, 300, 2), np.arange(1, 300, 2)
    once = fold_referee(term_counts(texts), train, y[train])(test)
    per_fold = tfidf_classifier().fit(texts[train], y[train]).predict_proba(texts[test])[:, 1]
    assert np.abs(once - per_fold).max() < 1e-9


def c2st_point(reference, samples):
    """An evaluation point's texts for the two-sample test: every point of a run shares the natural windows."""
    return dict(c2st_natural_texts=reference, c2st_sample_texts=samples)


def test_the_two_sample_verdict_knows_the_answers(natural):
    reference, a, b = natural
    same = c2st_effect(c2st_point(reference, a), c2st_point(reference, b))  # two disjoint natural draws
    # one pair of draws is one checkpoint against one: its interval holds 0, and about fills the margin (whether it
    # reads 'equal' is a matter of luck at 1,000 texts; over seeds it does: test_known_answers_at_the_seed_unit)
    assert same['label'] in ('equal', 'unresolved') and same['ci'][0] < 0 < same['ci'][1], same
    assert same['refits'] == 3 and 0.015 < same['detectable'] < 0.035
    assert abs(same['arm_auc'] - 0.5) < 0.05 and abs(same['control_auc'] - 0.5) < 0.05
    planted_b = c2st_point(reference, plant_invented_words(b, 0.2, seed=0))
    planted = c2st_effect(planted_b, c2st_point(reference, a), refits=1)  # the direction: one fit will do
    assert planted['label'] == 'worse' and planted['ci'][1] < -0.03, planted
    # the matched temperature's mix: half a clean draw, half a planted one, lies between them
    mix = dict(c2st_parts=[(0.5, c2st_point(reference, a)), (0.5, planted_b)])
    halfway = c2st_effect(c2st_point(reference, a), mix, refits=1)
    assert 0 < halfway['effect'] < -planted['effect'] and halfway['label'] == 'better'
    assert c2st_effect(c2st_point(reference, a), c2st_point(b, a)) is None  # other natural windows: no comparison


def test_known_answers_at_the_seed_unit():
    """Each seed an other pair of disjoint natural draws (and its own planting), read as a method is, over seeds:
    natural against natural reads 'equal' on the two-sample test (1,000 texts a side, as a default point) and on
    perplexity, planted invented words 'worse' on both (300 texts suffice there)."""
    from verdict import AUC_MARGIN, PPL_MARGIN, seed_effect
    reference, train = windows(make_text(120000, seed=1), 1000), make_text(120000, seed=0)
    natural, planted, ppl_natural, ppl_planted = [], [], [], []
    for s in range(3):
        a, b = (windows(make_text(120000, seed=10 + 2 * s + i), 1000) for i in (0, 1))
        natural.append(c2st_effect(c2st_point(reference, a), c2st_point(reference, b), seed=s)['effect'])
        bad = plant_invented_words(a[:300], 0.2, seed=s)
        planted.append(c2st_effect(c2st_point(reference[:300], bad), c2st_point(reference[:300], b[:300]),
                                   seed=s)['effect'])
        clean = bigram_cross_entropy(train, b)
        ppl_natural.append(perplexity_effect(bigram_cross_entropy(train, a), clean)['effect'])
        ppl_planted.append(perplexity_effect(bigram_cross_entropy(train, plant_invented_words(a, 0.05, seed=s)),
                                             clean)['effect'])
    assert seed_effect(natural, AUC_MARGIN)['label'] == 'equal', natural
    assert seed_effect(planted, AUC_MARGIN)['label'] == 'worse', planted
    assert seed_effect(ppl_natural, PPL_MARGIN)['label'] == 'equal', ppl_natural
    assert seed_effect(ppl_planted, PPL_MARGIN)['label'] == 'worse', ppl_planted


def test_the_joint_referee_weighs_a_two_point_control_as_much_as_the_arm(natural):
    """A control mixed from two sweep points once taught the joint referee its model twice, which read the arm as the
    closer to natural text. Two kinds of invented words (other letters), each played as the arm against a two-point
    control of the other: the two effects nearly cancel (their sum measured 0.022; 0.056 when each set weighed
    alike in the referee's training)."""
    reference, a, b = natural
    total = 0.0
    for mine, theirs in (('bcdfg', 'vwxz'), ('vwxz', 'bcdfg')):
        parts = [(0.5, c2st_point(reference, plant_invented_words(b, 0.02, s, theirs))) for s in (1, 2)]
        arm = c2st_point(reference, plant_invented_words(a, 0.02, 0, mine))
        total += c2st_effect(arm, dict(c2st_parts=parts), refits=1)['effect']
    assert abs(total) < 0.04, total


def bigram_cross_entropy(train_text, texts):
    """Each text's mean cross-entropy (nats per character) under an add-one char bigram model of train_text: a
    model's per-window figures, as the perplexity verdict reads them."""
    pairs, firsts = Counter(zip(train_text, train_text[1:])), Counter(train_text[:-1])
    vocab = len(set(train_text) | set(''.join(texts)))
    return [float(np.mean([-np.log((pairs[(x, y)] + 1) / (firsts[x] + vocab)) for x, y in zip(t, t[1:])]))
            for t in texts]


def test_the_perplexity_verdict_knows_the_answers(natural):
    _, a, b = natural
    train = make_text(120000, seed=0)
    clean_a, clean_b = bigram_cross_entropy(train, a), bigram_cross_entropy(train, b)
    assert perplexity_effect(clean_a, clean_b)['label'] == 'equal'  # two disjoint natural draws
    planted = perplexity_effect(bigram_cross_entropy(train, plant_invented_words(b, 0.05, seed=0)), clean_b)
    assert planted['label'] == 'worse' and planted['ci'][1] < -0.01, planted


def point(be, sd, blind, entropy=1.0, t=1.0, auc=0.8):
    return dict(fresh_judge_boundary_error=be, fresh_judge_boundary_error_sd=sd, fresh_judge_n=3,
                fresh_judge_blind=blind, sample_entropy=entropy, temperature=t, unknown_word_rate=0.1,
                c2st_auc=auc, c2st_auc_sd=0.01)


def test_a_verdict_read_from_blind_judges_says_blind():
    assert judge_verdict(point(31.0, 1.0, True), point(31.0, 1.1, True)) == 'blind'
    # one side's judges saw the text: a reading, not a ceiling against a ceiling
    assert judge_verdict(point(31.0, 1.0, True), point(25.0, 1.0, False)) == 'better'
    assert judge_verdict(point(31.0, 1.0, False), point(31.2, 1.0, False)) == 'unresolved'


def test_matched_temperature_carries_blindness_and_the_two_sample_auc():
    sweep = [point(20.0, 1.0, False, entropy=1.0, t=0.8, auc=0.9), point(30.0, 1.0, True, entropy=2.0, t=1.0, auc=0.7)]
    m = matched_temperature(sweep, 1.5)
    assert m['temperature'] == pytest.approx(0.9) and m['c2st_auc'] == pytest.approx(0.8) and m['fresh_judge_blind']
    assert [w for w, _ in m['c2st_parts']] == pytest.approx([0.5, 0.5])
    assert not matched_temperature(sweep, 0.5)['fresh_judge_blind']  # read from the T = 0.8 end only


def test_the_split_benchmark_reads_a_val_split_of_other_words_as_shifted(tmp_path, char_ckpt, char_data):
    """benchmarks/bench_referee_split.py on a corpus split by position whose val part uses other words than its train
    part (as the corpus' last plays have other names): natural train against natural val reads far apart with no
    model at all, two draws of natural val read alike, and every figure it writes is an AUC or a rate."""
    import json
    import pickle
    import shutil
    from conftest import WORDS, run_script
    meta = pickle.load(open(f'{char_data}/meta.pkl', 'rb'))
    shutil.copy(f'{char_data}/meta.pkl', tmp_path / 'meta.pkl')

    def write(split, words, n_chars, seed):
        rng = random.Random(seed)
        text = ''
        while len(text) < n_chars:
            text += f"{rng.choice(['KING', 'LORD'])}:\n{' '.join(rng.choice(words) for _ in range(6)).capitalize()}.\n\n"
        np.array([meta['stoi'][c] for c in text[:n_chars]], dtype=np.uint16).tofile(tmp_path / f'{split}.bin')
    write('train', WORDS[:18], 12000, 0)
    write('val', WORDS[18:], 6000, 1)
    r = run_script('benchmarks/bench_referee_split.py', '--model', char_ckpt, '--dataset', str(tmp_path),
                   '--num_samples', '60', '--judge_samples', '30', '--json', str(tmp_path / 'split.json'))
    assert r.returncode == 0, r.stderr[-2000:]
    figures = json.load(open(tmp_path / 'split.json'))
    c2st = {k: v['c2st_auc'] for k, v in figures['c2st'].items()}
    assert c2st['train_vs_val'] > 0.9 and c2st['val_vs_val'] < 0.75, c2st
    assert all(0 <= v <= 1 for v in c2st.values()) and figures['unknown_word_rate']['natural_val'] > 0.5
    assert figures['unknown_word_rate']['natural_train'] == 0
    assert all(0 <= v['auc'] <= 1 for v in figures['ngram_judge_sight'].values())
    assert '| train_vs_val |' in r.stdout and figures['judge_samples'] == 30 and 'fitted on 30 + 30' in r.stdout


def window_point(sight, sd, blind=False, entropy=1.0, t=1.0):
    return dict(fresh_judge_recipe='window', fresh_judge_sight_auc=sight, fresh_judge_sight_auc_sd=sd, fresh_judge_n=3,
                fresh_judge_blind=blind, sample_entropy=entropy, temperature=t, unknown_word_rate=0.1)


def test_whole_window_fresh_judges_are_read_by_their_sight_lower_is_closer():
    assert judge_verdict(window_point(0.60, 0.01), window_point(0.80, 0.01)) == 'better'  # seen less: closer
    assert judge_verdict(window_point(0.80, 0.01), window_point(0.60, 0.01)) == 'worse'
    assert judge_verdict(window_point(0.70, 0.05), window_point(0.71, 0.05)) == 'unresolved'
    with pytest.raises(ValueError, match='different fresh-judge recipes'):
        judge_verdict(window_point(0.6, 0.01), point(25.0, 1.0, False))
    m = matched_temperature([window_point(0.9, 0.02, entropy=1.0, t=0.8), window_point(0.7, 0.04, entropy=2.0)], 1.5)
    assert m['fresh_judge_sight_auc'] == pytest.approx(0.8) and m['fresh_judge_sight_auc_sd'] == pytest.approx(0.03)
    assert m['fresh_judge_recipe'] == 'window' and 'fresh_judge_boundary_error' not in m


def test_whole_window_fresh_judges_see_a_noise_generator(tmp_path, char_ckpt, char_data):
    """evaluate.py --judge_recipe window: each fresh judge trains every weight of the referee's copy on natural
    windows against the generator's continuations, and is read by its sight on the point's two-sample windows. A
    generator trained 2 steps writes nearly uniform characters: seen at once; the referee itself (150 steps) less."""
    import json
    from conftest import run_script, train_tiny
    from evaluate import trunk_signature
    from model import load_checkpoint
    train_tiny(char_data, str(tmp_path / 'noise'), '--max_iters=2', '--eval_interval=1')
    r = run_script('evaluate.py', str(tmp_path / 'noise' / 'ckpt.pt'), char_ckpt, '--dataset', char_data, '--referee',
                   char_ckpt, '--out', str(tmp_path / 'eval.json'), '--num_samples', '24', '--judge_seeds', '2',
                   '--judge_max_blocks', '60', '--judge_recipe', 'window', '--no_mauve', '--no_ppl', '--c2st_folds',
                   '0', '--device', 'cpu', '--judge_args=--max_iters=60 --eval_interval=20 --learning_rate=1e-3')
    assert r.returncode == 0, r.stderr[-2000:]
    noise, own = json.load(open(tmp_path / 'eval.json'))
    referee = trunk_signature(load_checkpoint(char_ckpt)['model'])
    for e in (noise, own):
        assert e['fresh_judge_recipe'] == 'window' and e['fresh_judge_n'] == 2 and 'fresh_judge_r2' not in e
        assert all(0 <= run['sight_auc'] <= 1 and run['trunk'] != referee for run in e['fresh_judge_runs'])
    assert noise['fresh_judge_sight_auc'] > 0.95 and not noise['fresh_judge_blind'], noise['fresh_judge_runs']
    assert own['fresh_judge_sight_auc'] < noise['fresh_judge_sight_auc'] - 0.1 and not own['fresh_judge_blind']


def test_evaluate_fits_its_default_samples_to_the_val_split(tmp_path, char_ckpt, char_data):
    """docs/grpo_cycle.md's evaluate.py line gives no --num_samples: the default (1,000) is fitted to what the val
    split holds twice over, said in one line; a number given that the split cannot hold still stops in one line."""
    import json
    from conftest import run_script
    common = [char_ckpt, '--dataset', char_data, '--referee', char_ckpt, '--judge_seeds', '0', '--no_mauve',
              '--no_ppl', '--c2st_folds', '0', '--device', 'cpu']
    r = run_script('evaluate.py', *common, '--out', str(tmp_path / 'eval.json'))
    assert r.returncode == 0, r.stderr[-2000:]
    windows = len(np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)) // 32
    assert f"num_samples: {windows // 2}, what the val split's {windows} windows hold twice over" in r.stdout
    assert json.load(open(tmp_path / 'eval.json'))[0]['num_samples'] == windows // 2
    # with fresh judges, their val blocks are left beside the evaluation's windows, which their data never holds
    judged = common[:5] + ['--judge_seeds', '1', '--judge_max_blocks', '20', '--judge_args=--max_iters=5'] + common[7:]
    r = run_script('evaluate.py', *judged, '--out', str(tmp_path / 'judged.json'))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"num_samples: {(windows - 20) // 2}, what the val split's {windows} windows hold twice over beside the " \
        "fresh judges' 20" in r.stdout
    r = run_script('evaluate.py', *common, '--out', str(tmp_path / 'e2' / 'eval.json'), '--num_samples', '1000')
    assert r.returncode == 2 and f'lower the number of samples to at most {windows // 2}' in r.stderr
    assert not (tmp_path / 'e2').exists()
