"""
The verdict of a cycle: its new generator against each control, on every referee, given the spreads. run_cycles.py
computes it from the points evaluate.py measured.
"""

import os

import numpy as np

from model import GPT, evaluate_perplexity


def _label(diff, p, alpha):
    return 'indistinguishable' if not p < alpha else ('better' if diff > 0 else 'worse')


def compare(arm, control, higher_is_better, alpha=0.05):
    """
    'better', 'indistinguishable' or 'worse': the arm against the control, each given as (mean, sd, n) over seeds,
    by a two-sided Welch t-test at level alpha. With no spread on either side any difference decides.
    """
    from scipy import stats
    (m1, s1, n1), (m2, s2, n2) = arm, control
    diff = (m1 - m2) if higher_is_better else (m2 - m1)
    if s1 == 0 and s2 == 0:
        return _label(diff, 0.0 if diff else 1.0, alpha)
    return _label(diff, stats.ttest_ind_from_stats(m1, s1, n1, m2, s2, n2, equal_var=False).pvalue, alpha)


def compare_paired(arm_values, control_values, higher_is_better, alpha=0.05):
    """The same three labels from paired measurements (the cross-entropy of each val window), by a two-sided
    paired t-test."""
    from scipy import stats
    d = np.asarray(arm_values, dtype=np.float64) - np.asarray(control_values, dtype=np.float64)
    d = d if higher_is_better else -d
    if np.all(d == d[0]):
        return _label(d[0], 0.0 if d[0] else 1.0, alpha)
    return _label(d.mean(), stats.ttest_1samp(d, 0.0).pvalue, alpha)


def matched_temperature(points, entropy):
    """
    The control's temperature T* whose sample entropy equals the arm's, by linear interpolation along the sweep
    (points: a base model's evaluation points at several temperatures), with the fresh-judge boundary error and the
    two-sample AUC interpolated there. An arm outside the sweep's entropy range is matched to the nearest end
    (flagged). The matched judges are blind when those of a point it was read from are.
    """
    pts = sorted(points, key=lambda p: p['sample_entropy'])
    xs = [p['sample_entropy'] for p in pts]

    def at(key):
        return float(np.interp(entropy, xs, [p[key] for p in pts]))
    i = int(np.searchsorted(xs, entropy))
    neighbours = pts[max(0, i - 1):i + 1] or pts[-1:]
    matched = dict(temperature=at('temperature'), outside_sweep=not xs[0] <= entropy <= xs[-1],
                   fresh_judge_boundary_error=at('fresh_judge_boundary_error'),
                   fresh_judge_boundary_error_sd=at('fresh_judge_boundary_error_sd'),
                   fresh_judge_blind=any(p.get('fresh_judge_blind', False) for p in neighbours),
                   unknown_word_rate=at('unknown_word_rate'), fresh_judge_n=min(p['fresh_judge_n'] for p in pts))
    if all('c2st_auc' in p for p in pts):
        matched.update(c2st_auc=at('c2st_auc'), c2st_auc_sd=at('c2st_auc_sd'), c2st_n=min(p['c2st_n'] for p in pts))
    return matched


def judge_verdict(arm, control):
    """The fresh judges' label: 'blind' when the judges of both sides never left their untrained start (two blind
    judges' figures are the same ceiling, which says nothing of the texts), else the Welch test's label."""
    if arm.get('fresh_judge_blind') and control.get('fresh_judge_blind'):
        return 'blind'
    return compare(*[(e['fresh_judge_boundary_error'], e['fresh_judge_boundary_error_sd'], e['fresh_judge_n'])
                     for e in (arm, control)], higher_is_better=True)


def c2st_verdict(arm, control):
    """The two-sample test's label (lower AUC is closer to natural text), or None where a side was not measured."""
    if 'c2st_auc' not in arm or 'c2st_auc' not in control:
        return None
    return compare(*[(e['c2st_auc'], e['c2st_auc_sd'], e['c2st_n']) for e in (arm, control)], higher_is_better=False)


POINT_SUMMARY = ('val_perplexity', 'fresh_judge_boundary_error', 'fresh_judge_boundary_error_sd', 'fresh_judge_blind',
                 'sample_entropy', 'c2st_auc', 'c2st_auc_sd', 'mauve', 'mauve_sd')


def cycle_verdict(arm, mle, sweep, base_path, data_dir, device, judge_off=None):
    """
    The verdict of one cycle: its new generator (arm) against the MLE control (mle), against the previous base
    sampled at the matched temperature (sweep: that base's points) and, for GRPO, against the judge-off ablation
    (judge_off: the same trainer with a constant reward). Each on the referee's fresh-judge boundary error (higher is
    better), the two-sample test's AUC (lower is better) and whole-split held-out perplexity (lower is better;
    window by window).
    """
    matched = matched_temperature(sweep, arm['sample_entropy'])
    base = GPT.from_checkpoint(base_path, device=device)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    _, ppl, windows = evaluate_perplexity(base, val, base.config.block_size, temperature=matched['temperature'],
                                          per_window=True)
    matched.update(val_perplexity=ppl, val_window_cross_entropy=windows)
    controls = {'mle': mle, 'temperature': matched, **({'judge_off': judge_off} if judge_off else {})}
    verdicts = {name: {'boundary_error': judge_verdict(arm, c), 'c2st': c2st_verdict(arm, c),
                       'perplexity': compare_paired(arm['val_window_cross_entropy'], c['val_window_cross_entropy'],
                                                    False)}
                for name, c in controls.items()}
    del matched['val_window_cross_entropy']
    summary = {name: {k: c[k] for k in POINT_SUMMARY if k in c} for name, c in controls.items() if name != 'temperature'}
    return dict(matched=matched, verdicts=verdicts, arm={k: arm[k] for k in POINT_SUMMARY + ('temperature',) if k in arm},
                **summary)
