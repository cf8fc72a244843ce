"""The verdict's rules on hand-made figures: the rule is monotone in the interval (an interval that excludes 0 is a
difference, 'within margin' when it is also inside the margin; 'equal' needs 0 inside and the interval inside the
margin), a method is read over its training seeds, each with its own draws or with their bootstrap added, and one
judge a side resolves nothing."""
import numpy as np
import pytest

from verdict import compare, effect_label, label_text, labelled, method_verdict, own_draws, seed_effect


def test_the_rule_reads_where_the_interval_lies():
    assert effect_label([-0.02, 0.02], 0.03) == 'equal'
    assert effect_label([0.001, 0.005], 0.03) == 'better'  # excludes 0: a difference, however small
    assert label_text(labelled(0.003, [0.001, 0.005], 0.03)) == 'better (within margin)'
    assert label_text(labelled(-0.02, [-0.025, -0.015], 0.03)) == 'worse (within margin)'
    assert label_text(labelled(0.03, [0.01, 0.06], 0.03)) == 'better'  # reaches past the margin: not 'within'
    assert effect_label([-0.011, 0.04], 0.03) == 'unresolved'  # includes 0, reaches past the margin
    assert effect_label([-0.06, -0.031], 0.03) == 'worse'
    assert effect_label([-0.2, 0.2], 0.03) == 'unresolved'
    assert not labelled(0.0, [-0.02, 0.02], 0.03)['within_margin']


def test_an_interval_within_float_rounding_of_0_is_equal_on_either_side():
    """A model against its ensemble with its own twin differs by float32 rounding, whose sign is the CPU's: inside
    ±ROUNDING the label is 'equal' on both sides of 0, and just past it the rule reads a difference again."""
    from verdict import ROUNDING
    assert effect_label([-3e-7, -1e-7], 0.01) == effect_label([1e-7, 3e-7], 0.01) == 'equal'
    assert not labelled(-2e-7, [-3e-7, -1e-7], 0.01)['within_margin']
    assert effect_label([2 * ROUNDING, 3 * ROUNDING], 0.01) == 'better'
    assert effect_label([-3 * ROUNDING, -ROUNDING * 1.01], 0.01) == 'worse'


def test_a_more_precise_interval_never_turns_a_difference_into_equal():
    """The rule is monotone: shrink an interval about its effect and a 'better' or 'worse' stays one, and an 'equal'
    stays 'equal' or becomes a difference; only 'unresolved' resolves. The case the last rule got wrong: +0.028
    [0.022, 0.034] read 'better', and [0.025, 0.031], the same effect measured more precisely, 'equal'."""
    assert effect_label([0.022, 0.034], 0.03) == effect_label([0.025, 0.031], 0.03) == 'better'
    order = {'unresolved': 0, 'equal': 1, 'better': 2, 'worse': 2}
    for effect in np.linspace(-0.06, 0.06, 49):
        labels = [effect_label([effect - h, effect + h], 0.03) for h in np.linspace(0.08, 0.0005, 60)]
        for wide, narrow in zip(labels, labels[1:]):
            assert order[narrow] >= order[wide] and not (wide in ('better', 'worse') and narrow != wide), \
                (effect, labels)


def test_an_effect_says_what_it_could_have_told_apart():
    e = labelled(0.01, [-0.015, 0.035], 0.03)
    assert e['detectable'] == pytest.approx(0.025) and e['can_say_equal'] and e['label'] == 'unresolved'
    wide = labelled(0.0, [-0.04, 0.04], 0.03)
    assert not wide['can_say_equal'] and wide['label'] == 'unresolved'


def test_a_method_is_read_over_its_seeds():
    tight = seed_effect([0.004, -0.002, 0.001], 0.03)
    assert tight['label'] == 'equal' and tight['seeds'] == 3 and tight['ci'][0] < 0.001 < tight['ci'][1]
    assert tight['interval'] == 't over seeds (own draws)'
    assert seed_effect([-0.08, -0.07, -0.09], 0.03)['label'] == 'worse'
    assert seed_effect([0.05, 0.06, 0.055], 0.03)['label'] == 'better'
    scattered = seed_effect([0.06, -0.05, 0.01], 0.03)
    assert scattered['label'] == 'unresolved' and not scattered['can_say_equal']
    # two seeds, however tight: too few to speak for the method
    assert seed_effect([0.001, 0.002], 0.03)['label'] == 'unresolved'
    assert seed_effect([0.001], 0.03)['label'] == 'unresolved'


def verdict_of(c2st, ppl, draw_seed=None, half=0.01):
    """A seed's cycle verdict as the method verdict reads it: two effects with intervals of half-width half."""
    effect = lambda e: {'effect': e, 'ci': [e - half, e + half]}  # noqa: E731
    return {'verdicts': {'judge_off': {'c2st_effect': effect(c2st), 'perplexity_effect': effect(ppl)}},
            **({} if draw_seed is None else {'draw_seed': draw_seed})}


def test_the_method_verdict_reads_each_seeds_effects():
    m = method_verdict([verdict_of(0.002, -0.05, 1), verdict_of(-0.001, -0.06, 2), verdict_of(0.001, -0.055, 3)],
                       'judge_off')
    assert m['c2st_effect']['label'] == 'equal' and m['perplexity_effect']['label'] == 'worse'
    assert m['c2st_effect']['interval'] == 't over seeds (own draws)'
    assert method_verdict([verdict_of(0.0, 0.0)], 'mle') == {'c2st_effect': None, 'perplexity_effect': None}


def test_seeds_that_shared_their_draws_add_each_seeds_bootstrap():
    """Three seeds whose effects agree to 0.001 but whose own intervals are ±0.011 (the 600-step teacher arm against
    judge-off): with their own draws the t interval is the truth; with one control and one set of windows shared,
    that noise cancels between seeds, so each seed's bootstrap variance joins the interval, and it includes 0."""
    seeds = [verdict_of(0.008, 0.0, s, half=0.011) for s in (1, 2, 3)]
    seeds[1]['verdicts']['judge_off']['c2st_effect']['effect'] = 0.010
    seeds[2]['verdicts']['judge_off']['c2st_effect']['effect'] = 0.009
    own = method_verdict(seeds, 'judge_off')['c2st_effect']
    shared_seeds = [dict(v, draw_seed=7) for v in seeds]
    assert own_draws(seeds) and not own_draws(shared_seeds) and not own_draws([verdict_of(0, 0), verdict_of(0, 0)])
    shared = method_verdict(shared_seeds, 'judge_off')['c2st_effect']
    assert own['label'] == 'better' and own['ci'][0] > 0  # the narrow interval the issue questioned
    assert shared['ci'][0] < 0 < shared['ci'][1] and shared['label'] == 'equal'
    assert shared['interval'].endswith('(shared draws)') and shared['effect'] == pytest.approx(own['effect'])


def test_one_fresh_judge_a_side_is_unresolved():
    assert compare((30.0, 0.0, 1), (20.0, 0.0, 1), True) == 'unresolved'
    assert compare((30.0, 0.5, 3), (20.0, 0.5, 3), True) == 'better'


def test_the_docs_reread_finds_the_labels_that_change(tmp_path):
    """benchmarks/reread_verdicts.py re-reads the labelled effects the docs print under today's rule."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, ROOT + '/benchmarks')
    from reread_verdicts import reread
    page = tmp_path / 'page.md'
    page.write_text("| 0 | equal, −0.021 (−0.032, −0.011) / **worse**, −20.5% (−20.9%, −20.0%) |\n"
                    "against the MLE control: two-sample test **equal** (arm AUC lower by -0.017 [-0.028, -0.007], "
                    "margin 0.030), perplexity **equal** (arm ppl lower by -0.5% [-1.2%, 0.1%], margin 1.0%)\n"
                    "| 1 | equal −0.2% [−0.3, −0.1] | **better** +0.028 [0.022, 0.034] |\n")
    found = [(line, old, new) for line, old, _, _, new in reread(str(page))]
    assert found == [(1, 'equal', 'worse'), (1, 'worse', 'worse'), (2, 'equal', 'worse (within margin)'),
                     (2, 'equal', 'unresolved'), (3, 'equal', 'worse (within margin)'), (3, 'better', 'better')]
    from reread_verdicts import main
    main(['--write', str(page)])  # the page then prints today's labels, and a second reading changes none
    text = page.read_text()
    assert '| 0 | worse, −0.021 (−0.032, −0.011)' in text and '**worse (within margin)** (arm' in text
    assert all(old == new for _, old, _, _, new in reread(str(page)))


def test_beating_every_control_includes_the_tail_calibrated_base():
    """run_cycles.beats_every_control: better on the fresh judges and the two-sample test than every sampled control,
    and perplexity no worse than the MLE control's nor the tail-calibrated base's (perplexity only: no judges)."""
    from run_cycles import beats_every_control
    sampled = {'fresh_judges': 'better', 'c2st': 'better', 'perplexity': 'equal'}
    verdicts = {'mle': dict(sampled), 'temperature': dict(sampled),
                'calibrated': {'fresh_judges': '–', 'c2st': None, 'perplexity': 'equal'}}
    assert beats_every_control(verdicts)
    assert not beats_every_control(dict(verdicts, calibrated=dict(verdicts['calibrated'], perplexity='worse')))
    assert beats_every_control({k: v for k, v in verdicts.items() if k != 'calibrated'})
    assert not beats_every_control(dict(verdicts, temperature=dict(sampled, c2st='equal')))
