"""
The classifier two-sample test (C2ST; Lopez-Paz & Oquab 2017), the referee that reads no model: a logistic
regression on TF-IDF char 1-4-grams and lower-cased word unigrams (invented words, misspellings, rhythm) tells
natural text from samples. evaluate.py measures each point with it; verdict.py compares two points with one
classifier trained on both.
"""

import numpy as np
import torch

from configurator import UserError
from auc import auc, bootstrap_aucs

C2ST_FOLDS = 5
C2ST_BOOTSTRAP = 1000  # resamples of the texts behind an AUC's spread
PROMPT_LEN = 8  # natural tokens each evaluation sample starts from


def eval_window_indices(available, n, seed):
    """Which of the val split's `available` consecutive windows the evaluation of n samples draws (eval_windows):
    2n distinct indices, the reference's first."""
    if 2 * n > available:
        raise UserError(f"the val split holds {available} windows; evaluation needs 2 x {n}: lower the number of "
                        f"samples to at most {available // 2}")
    return np.random.default_rng(seed).choice(available, size=2 * n, replace=False)


def eval_windows(val, n, length, seed):
    """2n distinct non-overlapping val windows of `length` tokens, drawn at random: the first n are the natural
    reference, the other n give the samples' prompts, so no sample starts from a reference window."""
    chosen = eval_window_indices(len(val) // length, n, seed) * length
    windows = np.stack([val[o:o + length] for o in chosen]).astype(np.int64)
    return torch.from_numpy(windows[:n]), torch.from_numpy(windows[n:])


def continuation_texts(model, tokenizer, reference, prompts, temperature, top_k, generator, entropy=False):
    """The texts the two-sample test compares: the natural reference windows, and the model's continuations of the
    prompts' first PROMPT_LEN tokens to the same length, both without those first PROMPT_LEN tokens (the samples'
    prompts are natural text). Also the samples (with their prompts), and the sampler's entropy with entropy=True."""
    device = next(model.parameters()).device
    out = model.generate(prompts[:, :PROMPT_LEN].to(device), reference.shape[1] - PROMPT_LEN, temperature, top_k,
                         generator=generator, entropy=entropy)
    samples, sample_entropy = out if entropy else (out, None)
    return completion_texts(tokenizer, reference), completion_texts(tokenizer, samples), samples, sample_entropy


def completion_texts(tokenizer, windows, prompt_len=PROMPT_LEN):
    """Each window's text after its first prompt_len tokens (PROMPT_LEN: what the two-sample test reads)."""
    return [tokenizer.decode(s) for s in windows[:, prompt_len:].tolist()]


# the referee's features: TF-IDF (sublinear tf) of char 1-4-grams seen in two training texts at least, and of
# lower-cased words; each fold's vocabulary and idf come from its training texts only
CHAR_NGRAMS = dict(analyzer='char', ngram_range=(1, 4), min_df=2)
WORDS = dict(analyzer='word', token_pattern=r"[A-Za-z']+", min_df=1)


def referee_regression(balanced, C=1.0):
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(C=C, max_iter=2000, class_weight='balanced' if balanced else None)


def tfidf_classifier(balanced=True, C=1.0):
    """The referee's classifier on raw texts: its features are fitted on each training fold only. balanced=False: the
    caller weighs the texts itself; C: the logistic regression's inverse L2 strength (the referee's is 1)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline, make_union
    return make_pipeline(make_union(TfidfVectorizer(**CHAR_NGRAMS, sublinear_tf=True),
                                    TfidfVectorizer(**WORDS, sublinear_tf=True)), referee_regression(balanced, C))


def term_counts(texts):
    """Every text's char n-gram and word counts over all the texts' terms, counted once (in sorted order, as the
    vectorizers order them): a fold's features are then columns of these (fold_referee), not a fresh count of
    every text for each fold and refit."""
    from sklearn.feature_extraction.text import CountVectorizer
    return [CountVectorizer(**dict(kind, min_df=1)).fit_transform(texts) for kind in (CHAR_NGRAMS, WORDS)]


def fold_referee(counts, train, y, balanced=True, sample_weight=None):
    """tfidf_classifier fitted on the rows `train` of term_counts' matrices (labels y, P(sample) = 1): the same
    features (each fold's vocabulary, min_df and idf from its training rows alone) at a fraction of the cost.
    Returns P(label 1) of any rows."""
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfTransformer
    kept = []
    for c, kind in zip(counts, (CHAR_NGRAMS, WORDS)):
        training = c[train]
        columns = np.flatnonzero(np.diff(training.tocsc().indptr) >= kind['min_df'])  # each term's document count
        kept.append((c, columns, TfidfTransformer(sublinear_tf=True).fit(training[:, columns])))

    def features(rows):
        return sp.hstack([tfidf.transform(c[rows][:, columns]) for c, columns, tfidf in kept]).tocsr()
    regression = referee_regression(balanced).fit(features(train), y, sample_weight=sample_weight)
    return lambda rows: regression.predict_proba(features(rows))[:, 1]


def two_sample_test(natural_texts, sample_texts, seed, folds=C2ST_FOLDS):
    """
    How well the referee tells sample_texts from natural_texts. Every text is scored once, by the fold that held it
    out (stratified folds fixed by seed); the AUC and accuracy are those of the pooled out-of-fold scores (the
    folds' own figures are not independent samples: their training sets overlap). Spread: sd and 95% interval of
    the AUC over bootstrap resamples of each side's texts. It holds the classifiers fixed, so it is the texts'
    share of the spread: between two disjoint draws of natural text the AUC moves about twice as much
    (docs/log/arms.md), which is why verdict.py compares two points with one classifier, not by these spreads.
    """
    from sklearn.model_selection import StratifiedKFold
    texts = np.array(list(natural_texts) + list(sample_texts), dtype=object)
    y = np.r_[np.zeros(len(natural_texts)), np.ones(len(sample_texts))]
    p, counts = np.zeros(len(texts)), term_counts(texts)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(texts, y):
        p[test] = fold_referee(counts, train, y[train])(test)
    natural, samples = p[y == 0], p[y == 1]
    boots = bootstrap_aucs(samples, natural, seed, C2ST_BOOTSTRAP)
    return dict(c2st_accuracy=float(np.mean((p > 0.5) == y)), c2st_auc=auc(samples, natural),
                c2st_auc_sd=float(np.std(boots, ddof=1)),
                c2st_auc_ci=[float(q) for q in np.percentile(boots, [2.5, 97.5])], c2st_n=len(texts), c2st_folds=folds)


def joint_scores(natural_texts, sample_sets, seeds, folds=C2ST_FOLDS, set_weights=None):
    """
    One referee for several sets of samples: the classifier of each fold learns natural text against every set at
    once, and scores the held-out natural windows and each set's held-out samples. Text i of every set (the
    continuation of prompt i) falls in the fold of natural window i, so every set is read by the same classifiers.
    set_weights: each set's share of the samples' weight in that training (default: equal); natural text and the
    samples weigh the same in all, as the balanced classifier weighs them. A side given as the mix of two sets then
    weighs in the referee as much as a side of one set, and a set of weight 0 teaches it nothing.
    Returns, for each fold seed in seeds (a refit), the out-of-fold P(sample) of the natural windows and of each set.
    """
    natural = np.array(natural_texts, dtype=object)
    sets = [np.array(s, dtype=object) for s in sample_sets]
    if any(len(s) != len(natural) for s in sets):
        raise ValueError("every set needs one sample per natural window")
    counts = term_counts(np.concatenate([natural] + sets))  # set k's text i is row (k + 1) n + i
    return [_joint_fit(counts, len(sets), len(natural), seed, folds, set_weights) for seed in seeds]


def _joint_fit(counts, n_sets, n, seed, folds, set_weights):
    from sklearn.model_selection import KFold
    p_natural, p_sets = np.zeros(n), [np.zeros(n) for _ in range(n_sets)]
    shares = np.full(n_sets, 1 / n_sets) if set_weights is None else \
        np.asarray(set_weights, dtype=np.float64) / np.sum(set_weights)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(np.arange(n)):
        rows = np.concatenate([train + k * n for k in range(n_sets + 1)])
        y = np.r_[np.zeros(len(train)), np.ones(len(train) * n_sets)]
        # the balanced classifier's weights (each class half of the total), the samples' half shared as set_weights
        half = len(rows) / 2
        w = np.r_[np.full(len(train), half / len(train)), np.repeat(shares * half / len(train), len(train))]
        p_of = fold_referee(counts, rows, y, balanced=False, sample_weight=w)
        p_natural[test] = p_of(test)
        for k, p in enumerate(p_sets):
            p[test] = p_of(test + (k + 1) * n)
    return p_natural, p_sets
