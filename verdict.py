"""
The verdict of a cycle: its new generator against each control, on every referee, given the spreads; and the verdict
on a method, over its training seeds. Statistics only: it computes from the figures it is handed (run_cycles.py
gives it the points evaluate.py measured and the perplexities of the checkpoints it owns).

The rule reads each effect's 95% interval, and is monotone: an interval that excludes 0 is a difference, however
small ('better' or 'worse', 'within margin' added when the whole interval also lies inside ±margin); one that
includes 0 and lies inside ±margin is 'equal' (equivalent); any other is 'unresolved'. A more precise interval about
the same effect can only move a label from 'unresolved' to one of the others, never from 'better' to 'equal'.
One exception, below measurement: an interval lying wholly within ±ROUNDING of 0 is 'equal' whichever side of 0 it
falls on. Such an effect is float32 rounding (a model against its own ensemble with a twin), whose sign differs between
CPU families; no figure of this repository reads an effect that small.
"""

import numpy as np

from auc import auc
from two_sample import joint_scores


# The equivalence margins, fixed before any arm was read: two-sample AUCs 0.03 apart (about twice the sd of the
# difference between two disjoint natural draws of 1,000 texts), or a perplexity within 1% of the other's
AUC_MARGIN = 0.03
PPL_MARGIN = 0.01
BOOTSTRAP = 1000  # resamples behind each effect's 95% interval
# the two-sample referee is refit over this many fold seeds, its effect their mean (and each resample's), so that one
# fold split's luck does not decide it; the fits' spread is reported beside the interval
REFITS = 3
# effects (a perplexity ratio's 1 - r, an AUC difference) within this of 0 are float32 rounding, not a difference:
# one ulp of a cross-entropy near 1 is 1.2e-7, summed over a window's tokens and the log-sum-exp of an ensemble
ROUNDING = 1e-6
MIN_SEEDS = 3  # training seeds a verdict on a method reads at the least
# 3: TOST labels, the referee's refits in the two-sample interval, 'unresolved' for one fresh judge; 4: the joint
# referee weighs the arm and a two-point control alike; 5: the monotone rule, the two-sample interval resamples the
# mean of the referee's fits, the draw seed recorded; older verdicts of a run are rebuilt
VERDICT_FORMAT = 6


# each fresh-judge recipe's figure (evaluate.py --judge_recipe): its key, whether higher is closer to natural text,
# how it is printed (tokens or an AUC) and its axis label
FRESH_JUDGE_FIGURES = {
    'crossover': ('fresh_judge_boundary_error', True, '.2f', 'fresh-judge boundary error (↑ closer to natural)'),
    'window': ('fresh_judge_sight_auc', False, '.3f', "fresh whole-window judges' sight (↓ closer to natural)")}


def fresh_judge_figure(point):
    """(key, higher_is_better, format, label) of a point's fresh-judge figure: the crossover judges' boundary error,
    or the sight of whole-window judges."""
    return FRESH_JUDGE_FIGURES[point.get('fresh_judge_recipe', 'crossover')]


def compare(arm, control, higher_is_better, alpha=0.05):
    """
    'better', 'worse' or 'unresolved': the arm against the control, each given as (mean, sd, n) over independent
    judge seeds, by a two-sided Welch t-test at level alpha. It has no margin, so it never says 'equal'; with fewer
    than 2 seeds a side there is no spread to test against: 'unresolved'. With no spread on either side any
    difference decides.
    """
    from scipy import stats
    (m1, s1, n1), (m2, s2, n2) = arm, control
    diff = (m1 - m2) if higher_is_better else (m2 - m1)
    if n1 < 2 or n2 < 2:
        return 'unresolved'
    p = (0.0 if diff else 1.0) if s1 == 0 and s2 == 0 else \
        stats.ttest_ind_from_stats(m1, s1, n1, m2, s2, n2, equal_var=False).pvalue
    return 'unresolved' if not p < alpha else ('better' if diff > 0 else 'worse')


def effect_label(ci, margin):
    """An effect's label from its 95% interval ci (positive: the arm is better) and its equivalence margin: 'better'
    or 'worse' when the interval excludes 0; 'equal' when it includes 0 and lies inside ±margin; else 'unresolved'
    (the data cannot tell a material difference from none). An interval within ±ROUNDING of 0 is 'equal'."""
    if max(abs(ci[0]), abs(ci[1])) < ROUNDING:
        return 'equal'
    if ci[0] > 0 or ci[1] < 0:
        return 'better' if ci[0] > 0 else 'worse'
    return 'equal' if -margin < ci[0] and ci[1] < margin else 'unresolved'


def label_text(e):
    """How every table prints an effect's label: 'better (within margin)' for a difference whose whole interval lies
    inside ±margin, the label alone otherwise."""
    return e['label'] + (' (within margin)' if e.get('within_margin') else '')


def labelled(effect, ci, margin, **extra):
    """An effect as the verdicts store it: its label, interval and margin, and what the data could have told apart
    (detectable: the interval's half-width, about the smallest effect it could have called 'better' or 'worse';
    can_say_equal: whether its width fits inside the margin at all)."""
    ci = [float(q) for q in ci]
    half = (ci[1] - ci[0]) / 2
    label = effect_label(ci, margin)
    return dict(label=label, within_margin=label in ('better', 'worse') and -margin < ci[0] and ci[1] < margin,
                effect=float(effect), ci=ci, margin=margin, detectable=half, can_say_equal=bool(half < margin),
                **extra)


def _effect(effect, boots, margin, **extra):
    return labelled(effect, np.percentile(boots, [2.5, 97.5]), margin, **extra)


def seed_effect(effects, margin, min_seeds=MIN_SEEDS, shared_draws=False):
    """
    A method's effect over its training seeds (effects: one a seed, each an arm against a control, as a number or a
    labelled effect): the mean with a t interval over the seeds, labelled by the same rules. When every seed had its
    own controls and draws, the spread between seeds holds all the noise: the t interval reads it alone. When the
    seeds shared them (shared_draws: the same control samples, prompts and windows for every seed), that noise is
    common to every seed and cancels from their spread, so the seeds' bootstrap half-width (the root mean square of
    their 95% intervals' half-widths) joins the t half-width in quadrature. With fewer than min_seeds seeds the label
    is 'unresolved' whatever the interval (a claim about a method is a claim over seeds).
    """
    from scipy import stats
    e = np.asarray([x['effect'] if isinstance(x, dict) else x for x in effects], dtype=np.float64)
    # the between-seed half-width (t, k - 1 degrees of freedom) and, for shared draws, the seeds' mean bootstrap
    # half-width, added in quadrature: the interval widens with either part and is the t interval when draws are own
    between = stats.t.ppf(0.975, e.size - 1) * e.std(ddof=1) / np.sqrt(e.size) if e.size > 1 else np.inf
    boot = np.sqrt(np.mean([((x['ci'][1] - x['ci'][0]) / 2) ** 2 for x in effects])) if shared_draws else 0.0
    half = np.hypot(between, boot)
    out = labelled(e.mean(), [e.mean() - half, e.mean() + half], margin, seeds=int(e.size),
                   interval='t over seeds + each seed\'s bootstrap (shared draws)' if shared_draws
                   else 't over seeds (own draws)')
    if e.size < min_seeds:
        out.update(label='unresolved', within_margin=False)
    return out


def share_interval(gain, gain_half, dv, dv_ci):
    """The 95% interval of a share gain / dv when both are estimates (Fieller's: the ratios r with |gain - r·dv| <=
    sqrt(gain_half² + r²·dv_half²), each term its own 95% half-width; dv_half from dv_ci's width), or None where the
    worth's interval holds 0: then no bounded interval exists and the share is not defined (nor from a gain with no
    spread, one seed's: gain_half infinite)."""
    dv_half = (dv_ci[1] - dv_ci[0]) / 2
    a = dv ** 2 - dv_half ** 2
    if dv_ci[0] <= 0 <= dv_ci[1] or a <= 0 or not np.isfinite(gain_half):
        return None
    root = np.sqrt(gain ** 2 * dv_half ** 2 + dv ** 2 * gain_half ** 2 - dv_half ** 2 * gain_half ** 2)
    return [(gain * dv - root) / a, (gain * dv + root) / a]


def perplexity_effect(arm_windows, control_windows, seed=0):
    """The arm's whole-split perplexity against the control's, window by window (the cross-entropy of each val
    window, both models on the same windows): effect = 1 - ppl(arm) / ppl(control), positive when the arm's is
    lower, with a bootstrap interval over the windows."""
    d = np.asarray(control_windows, dtype=np.float64) - np.asarray(arm_windows, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = [1 - np.exp(-d[rng.integers(0, d.size, d.size)].mean()) for _ in range(BOOTSTRAP)]
    return _effect(1 - np.exp(-d.mean()), boots, PPL_MARGIN)


def c2st_effect(arm, control, seed=0, refits=REFITS):
    """
    The two-sample test's effect: AUC(control) - AUC(arm), positive when the arm's text is the closer to natural
    text, both read by one referee trained on both sides' samples (two_sample.joint_scores), averaged over `refits`
    fits of that referee on other folds; the arm and the control weigh alike in its training (a control mixed from
    two sweep points weighs as much as the arm, each point by its share). Its 95% interval resamples the natural
    windows and the prompts (the same prompts for every side) and the fits (as many as the effect averages, drawn
    with replacement), and reads each resample as the effect is read, the mean over its fits: the interval holds the
    texts' spread and the fit spread of a mean of `refits` fits, not of one (refit_sd: the sd over the fits apart).
    control is a point, or the matched temperature's mix of two sweep points (c2st_parts: [(weight, point)]). None
    where a side kept no texts or the sides were not measured on the same natural windows.
    """
    parts = control.get('c2st_parts') or [(1.0, control)]
    points = [arm] + [p for _, p in parts]
    if any('c2st_sample_texts' not in p or p['c2st_natural_texts'] != arm['c2st_natural_texts'] for p in points):
        return None
    # the referee weighs the arm and the control alike: the control's half shared by its parts' weights
    weights = [1.0] + [w for w, _ in parts]
    fits = joint_scores(arm['c2st_natural_texts'], [p['c2st_sample_texts'] for p in points],
                        [seed + r for r in range(refits)], set_weights=weights)

    def difference(fit, natural, prompts):
        p_natural, p_sets = fits[fit]
        return (sum(w * auc(p[prompts], p_natural[natural]) for (w, _), p in zip(parts, p_sets[1:]))
                - auc(p_sets[0][prompts], p_natural[natural]))

    def mean_difference(chosen, natural, prompts):  # the effect is the mean over `refits` fits: so is each resample
        per_fit = {r: difference(r, natural, prompts) for r in set(chosen.tolist())}  # a fit drawn twice, read once
        return float(np.mean([per_fit[r] for r in chosen.tolist()]))
    n, rng = len(arm['c2st_natural_texts']), np.random.default_rng(seed)
    boots = [mean_difference(rng.integers(0, refits, refits), rng.integers(0, n, n), rng.integers(0, n, n))
             for _ in range(BOOTSTRAP)]
    per_fit = [difference(r, slice(None), slice(None)) for r in range(refits)]
    arm_auc = float(np.mean([auc(p_sets[0], p_natural) for p_natural, p_sets in fits]))
    return _effect(np.mean(per_fit), boots, AUC_MARGIN, arm_auc=arm_auc, control_auc=arm_auc + np.mean(per_fit),
                   refits=refits, refit_sd=float(np.std(per_fit, ddof=1)) if refits > 1 else 0.0)


def sweep_parts(points, entropy):
    """Where a sample entropy falls on a temperature sweep (points with 'sample_entropy'): the points sorted by it,
    the one or two it lies between with their linear-interpolation weights [(weight, point)], and whether it lies
    outside the sweep (then matched to the nearest end)."""
    pts = sorted(points, key=lambda p: p['sample_entropy'])
    xs = [p['sample_entropy'] for p in pts]
    i = int(np.searchsorted(xs, entropy))
    if 0 < i < len(pts) and xs[i] > xs[i - 1]:
        w = (entropy - xs[i - 1]) / (xs[i] - xs[i - 1])
        parts = [(1 - w, pts[i - 1]), (w, pts[i])]
    else:
        parts = [(1.0, pts[min(i, len(pts) - 1)])]
    return pts, parts, not xs[0] <= entropy <= xs[-1]


def matched_temperature(points, entropy):
    """
    The control's temperature T* whose sample entropy equals the arm's, by linear interpolation along the sweep
    (points: a base model's evaluation points at several temperatures), with the fresh judges' figure and the
    two-sample AUC interpolated there, and the two sweep points it lies between with their weights (c2st_parts: the
    two-sample verdict mixes their out-of-fold scores' AUCs the same way). An arm outside the sweep's entropy range
    is matched to the nearest end (flagged). The matched judges are blind when those of a point it was read from are.
    """
    pts, parts, outside = sweep_parts(points, entropy)
    xs = [p['sample_entropy'] for p in pts]

    def at(key):
        return float(np.interp(entropy, xs, [p[key] for p in pts]))
    matched = dict(temperature=at('temperature'), outside_sweep=outside, unknown_word_rate=at('unknown_word_rate'),
                   c2st_parts=parts)
    judged = fresh_judge_figure(pts[0])[0]
    if all(judged in p for p in pts):  # points evaluated with no fresh judges (--judge_seeds 0) have none to match
        matched.update({judged: at(judged), judged + '_sd': at(judged + '_sd')},
                       fresh_judge_recipe=pts[0].get('fresh_judge_recipe', 'crossover'),
                       fresh_judge_blind=any(p.get('fresh_judge_blind', False) for w, p in parts if w > 0),
                       fresh_judge_n=min(p['fresh_judge_n'] for p in pts))
    if all('c2st_auc' in p for p in pts):
        matched.update(c2st_auc=at('c2st_auc'), c2st_auc_sd=at('c2st_auc_sd'))
    return matched


def judge_verdict(arm, control):
    """The fresh judges' label: 'blind' when the judges of both sides never left their untrained start (two blind
    judges' figures are the same ceiling, which says nothing of the texts), else the Welch test's label over the
    judges' seeds, on their recipe's figure (both sides are judged by one recipe): 'unresolved' with one judge a
    side."""
    if arm.get('fresh_judge_blind') and control.get('fresh_judge_blind'):
        return 'blind'
    key, higher_is_better = fresh_judge_figure(arm)[:2]
    if fresh_judge_figure(control)[0] != key:
        raise ValueError("the arm and the control were judged by different fresh-judge recipes")
    return compare(*[(e[key], e[key + '_sd'], e['fresh_judge_n']) for e in (arm, control)], higher_is_better)


POINT_SUMMARY = ('val_perplexity', 'fresh_judge_recipe', 'fresh_judge_boundary_error', 'fresh_judge_boundary_error_sd',
                 'fresh_judge_sight_auc', 'fresh_judge_sight_auc_sd', 'fresh_judge_blind', 'sample_entropy',
                 'c2st_auc', 'c2st_auc_sd', 'c2st_auc_ci', 'mauve', 'mauve_sd')


def control_verdict(arm, control):
    """The arm against one control on every referee: the fresh judges' label, and the two-sample test's and the
    perplexity's effects with their intervals and labels (c2st None where a side has no two-sample scores)."""
    c2st = c2st_effect(arm, control)
    ppl = perplexity_effect(arm['val_window_cross_entropy'], control['val_window_cross_entropy'])
    return {'fresh_judges': judge_verdict(arm, control), 'c2st': c2st and c2st['label'], 'c2st_effect': c2st,
            'perplexity': ppl['label'], 'perplexity_effect': ppl}


def cycle_verdict(arm, mle, matched, judge_off=None, calibrated=None):
    """
    The verdict of one cycle, this checkpoint against each control's (one training run a side): its new generator
    (arm) against the MLE control (mle), against the previous base sampled at the matched temperature (matched:
    matched_temperature's point, with that base's val perplexity and per-window cross-entropies at T* added by the
    caller) and, for GRPO, against the judge-off ablation (judge_off: the same trainer with a constant reward). Each
    on the referee's fresh judges (their boundary error, higher is better, or with the window recipe their sight,
    lower is better), the two-sample test's pooled AUC (lower is better) and whole-split held-out perplexity (lower
    is better; window by window); the last two as effects with 95% intervals, read against their margins. And,
    where the previous base holds out a selection tail, against that base at its tail-calibrated temperature
    (calibrated: its temperature and val perplexity with per-window cross-entropies; zero FLOPs), on perplexity alone:
    it has no samples of its own for the other referees.
    """
    matched = dict(matched)
    controls = {'mle': mle, 'temperature': matched, **({'judge_off': judge_off} if judge_off else {})}
    verdicts = {name: control_verdict(arm, c) for name, c in controls.items()}
    if calibrated:
        ppl = perplexity_effect(arm['val_window_cross_entropy'], calibrated['val_window_cross_entropy'])
        verdicts['calibrated'] = {'fresh_judges': '–', 'c2st': None, 'c2st_effect': None, 'perplexity': ppl['label'],
                                  'perplexity_effect': ppl}
    del matched['val_window_cross_entropy'], matched['c2st_parts']
    summary = {name: {k: c[k] for k in POINT_SUMMARY if k in c} for name, c in controls.items() if name != 'temperature'}
    if calibrated:
        summary['calibrated'] = {k: calibrated[k] for k in ('temperature', 'val_perplexity')}
    return dict(matched=matched, verdicts=verdicts, arm={k: arm[k] for k in POINT_SUMMARY + ('temperature',) if k in arm},
                margins=dict(c2st_auc=AUC_MARGIN, perplexity=PPL_MARGIN), **summary)


def tilt_verdict(tilt, controls):
    """
    A tilt point (evaluate.py --tilt: the generator resampled by a judge, no training) against each control (name ->
    point, the matched temperature's with its c2st_parts): the two-sample test's effect, and the perplexity effect
    on the natural completions, window by window (the tilt's conservative cross-entropy on its windows against the
    control's on the same ones), each with its interval and label. It has no fresh judges: they need a checkpoint.
    """
    ce = tilt['completion_window_cross_entropy']
    verdicts = {}
    for name, control in controls.items():
        c2st = c2st_effect(tilt, control)
        ppl = perplexity_effect(ce, control['completion_window_cross_entropy'][:len(ce)])
        verdicts[name] = {'c2st': c2st and c2st['label'], 'c2st_effect': c2st, 'perplexity': ppl['label'],
                          'perplexity_effect': ppl}
    return verdicts


def own_draws(verdicts):
    """Whether each seed's verdict had its own controls and draws: every verdict records its draw seed
    (run_cycles.py's draw_seed), and no two are the same. Verdicts made before the draw seed was recorded shared
    them (bench_arms copied one seed's controls to every other)."""
    seeds = [v.get('draw_seed') for v in verdicts]
    return None not in seeds and len(set(seeds)) == len(seeds)


def method_verdict(verdicts, control):
    """A method's verdict against one control over its trainer seeds (verdicts: one cycle_verdict a seed): the
    two-sample and perplexity effects read at the seed unit (seed_effect; a t interval alone where every seed had
    its own draws, else with each seed's bootstrap variance added), None where a seed lacks that effect."""
    out, shared = {}, not own_draws(verdicts)
    for key, margin in (('c2st_effect', AUC_MARGIN), ('perplexity_effect', PPL_MARGIN)):
        effects = [v['verdicts'].get(control, {}).get(key) for v in verdicts]
        out[key] = None if not effects or any(e is None for e in effects) else \
            seed_effect(effects, margin, shared_draws=shared)
    return out
