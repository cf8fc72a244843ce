"""The verdict's rules on hand-made figures: 'equal' needs the whole interval inside the margin (TOST), a method is
read over its training seeds, and one judge a side resolves nothing."""
import pytest

from verdict import compare, effect_label, labelled, method_verdict, seed_effect


def test_equal_needs_the_whole_interval_inside_the_margin():
    assert effect_label([-0.02, 0.02], 0.03) == 'equal'
    assert effect_label([0.001, 0.005], 0.03) == 'equal'  # excludes 0 but immaterial: equivalent, not better
    assert effect_label([-0.011, 0.04], 0.03) == 'unresolved'  # point inside the margin, interval past it
    assert effect_label([0.01, 0.06], 0.03) == 'better'
    assert effect_label([-0.06, -0.031], 0.03) == 'worse'
    assert effect_label([-0.2, 0.2], 0.03) == 'unresolved'


def test_an_effect_says_what_it_could_have_told_apart():
    e = labelled(0.01, [-0.015, 0.035], 0.03)
    assert e['detectable'] == pytest.approx(0.025) and e['can_say_equal'] and e['label'] == 'unresolved'
    wide = labelled(0.0, [-0.04, 0.04], 0.03)
    assert not wide['can_say_equal'] and wide['label'] == 'unresolved'


def test_a_method_is_read_over_its_seeds():
    tight = seed_effect([0.004, -0.002, 0.001], 0.03)
    assert tight['label'] == 'equal' and tight['seeds'] == 3 and tight['ci'][0] < 0.001 < tight['ci'][1]
    assert seed_effect([-0.08, -0.07, -0.09], 0.03)['label'] == 'worse'
    assert seed_effect([0.05, 0.06, 0.055], 0.03)['label'] == 'better'
    scattered = seed_effect([0.06, -0.05, 0.01], 0.03)
    assert scattered['label'] == 'unresolved' and not scattered['can_say_equal']
    # two seeds, however tight: too few to speak for the method
    assert seed_effect([0.001, 0.002], 0.03)['label'] == 'unresolved'
    assert seed_effect([0.001], 0.03)['label'] == 'unresolved'


def test_the_method_verdict_reads_each_seeds_effects():
    def verdict(c2st, ppl):
        return {'verdicts': {'judge_off': {'c2st_effect': {'effect': c2st}, 'perplexity_effect': {'effect': ppl}}}}
    m = method_verdict([verdict(0.002, -0.05), verdict(-0.001, -0.06), verdict(0.001, -0.055)], 'judge_off')
    assert m['c2st_effect']['label'] == 'equal' and m['perplexity_effect']['label'] == 'worse'
    assert method_verdict([verdict(0.0, 0.0)], 'mle') == {'c2st_effect': None, 'perplexity_effect': None}


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
                    "margin 0.030), perplexity **equal** (arm ppl lower by -0.5% [-1.2%, 0.1%], margin 1.0%)\n")
    found = [(line, old, new) for line, old, _, _, new in reread(str(page))]
    assert found == [(1, 'equal', 'worse'), (1, 'worse', 'worse'), (2, 'equal', 'equal'), (2, 'equal', 'unresolved')]
