"""The model-free referee (the classifier two-sample test) and the blind flag of the fresh judges, on cases with
known answers."""
import random

import pytest

from conftest import make_text
from evaluate import two_sample_test
from verdict import judge_verdict, matched_temperature


def windows(text, n, length=120):
    return [text[i * length:(i + 1) * length] for i in range(n)]


def plant_invented_words(texts, share, seed):
    """Replace share of each text's words by invented ones (random letters), as a weak char model writes them."""
    rng = random.Random(seed)
    out = []
    for t in texts:
        words = t.split(' ')
        for i in rng.sample(range(len(words)), max(1, round(share * len(words)))):
            words[i] = ''.join(rng.choice('bcdfghjklmnpqrstvwxz') for _ in range(len(words[i]) or 3))
        out.append(' '.join(words))
    return out


@pytest.fixture(scope='module')
def natural():
    """Two disjoint draws of the same natural source (the tests' Shakespeare-like text, two seeds), 1,000 windows of
    120 characters each, as an evaluation point has."""
    return windows(make_text(120000, seed=1), 1000), windows(make_text(120000, seed=2), 1000)


def test_two_disjoint_natural_draws_are_indistinguishable(natural):
    a, b = natural
    r = two_sample_test(a, b, seed=0)
    assert abs(r['c2st_auc'] - 0.5) < 0.05 and abs(r['c2st_accuracy'] - 0.5) < 0.05, r  # measured 0.469
    assert r['c2st_n'] == 5 and r['c2st_auc_sd'] > 0


def test_invented_words_in_a_fifth_of_the_words_are_seen(natural):
    a, b = natural
    r = two_sample_test(a, plant_invented_words(b, 0.2, seed=0), seed=0)
    assert r['c2st_auc'] > 0.93 and r['c2st_accuracy'] > 0.65, r  # measured 0.960, 0.738


def test_two_sample_test_is_deterministic_per_seed(natural):
    a, b = natural
    planted = plant_invented_words(b, 0.05, seed=0)
    assert two_sample_test(a, planted, seed=3) == two_sample_test(a, planted, seed=3)
    assert two_sample_test(a, planted, seed=3) != two_sample_test(a, planted, seed=4)  # other folds


def point(be, sd, blind, entropy=1.0, t=1.0, auc=0.8):
    return dict(fresh_judge_boundary_error=be, fresh_judge_boundary_error_sd=sd, fresh_judge_n=3,
                fresh_judge_blind=blind, sample_entropy=entropy, temperature=t, unknown_word_rate=0.1,
                c2st_auc=auc, c2st_auc_sd=0.01, c2st_n=5)


def test_a_verdict_read_from_blind_judges_says_blind():
    assert judge_verdict(point(31.0, 1.0, True), point(31.0, 1.1, True)) == 'blind'
    # one side's judges saw the text: a reading, not a ceiling against a ceiling
    assert judge_verdict(point(31.0, 1.0, True), point(25.0, 1.0, False)) == 'better'
    assert judge_verdict(point(31.0, 1.0, False), point(31.2, 1.0, False)) == 'indistinguishable'


def test_matched_temperature_carries_blindness_and_the_two_sample_auc():
    sweep = [point(20.0, 1.0, False, entropy=1.0, t=0.8, auc=0.9), point(30.0, 1.0, True, entropy=2.0, t=1.0, auc=0.7)]
    m = matched_temperature(sweep, 1.5)
    assert m['temperature'] == pytest.approx(0.9) and m['c2st_auc'] == pytest.approx(0.8) and m['fresh_judge_blind']
    assert not matched_temperature(sweep, 0.5)['fresh_judge_blind']  # read from the T = 0.8 end only
