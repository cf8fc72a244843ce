"""
The AUC and its bootstrap, the one statistic the judges (their sight) and the two-sample test (its referee's AUC)
share: plain numpy and scipy, so that the statistics import no model.
"""

import numpy as np


def auc(higher, lower):
    """The probability that a score of `higher` exceeds one of `lower`, ties counting half (Mann-Whitney U over the
    product of the sizes), from the ranks of the pooled scores: O(n log n)."""
    from scipy.stats import rankdata
    a, b = np.asarray(higher, dtype=np.float64).ravel(), np.asarray(lower, dtype=np.float64).ravel()
    ranks = rankdata(np.concatenate([a, b]))[:a.size]  # ties get their average rank
    return float((ranks.sum() - a.size * (a.size + 1) / 2) / (a.size * b.size))


def sight_auc(natural_scores, sample_scores):
    """A judge's sight: the AUC at telling natural text from the generator's samples, the probability that a natural
    window scores above a sample (ties count half). 0.5: blind; 1: every natural window above every sample. Scores
    are the judge's P(natural) or any monotone function of it."""
    return auc(natural_scores, sample_scores)


def bootstrap_aucs(higher, lower, seed, n):
    """auc(higher, lower) over n bootstrap redraws of both sides' scores (with replacement): the texts' share of an
    AUC's spread."""
    rng = np.random.default_rng(seed)
    higher, lower = np.asarray(higher).ravel(), np.asarray(lower).ravel()
    return np.array([auc(rng.choice(higher, higher.size), rng.choice(lower, lower.size)) for _ in range(n)])


def sight_auc_sd(natural_scores, sample_scores, seed, n=200):
    """The spread of a judge's sight over texts: its sd over n bootstrap redraws of both sides."""
    return float(np.std(bootstrap_aucs(natural_scores, sample_scores, seed, n), ddof=1))
