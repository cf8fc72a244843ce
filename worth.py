"""
What a judge is worth in nats: the Donsker-Varadhan bound of its log-odds. Statistics only, from the scores it is
handed (evaluate.py gives it a reward model's log-odds on natural windows and on a generator's samples).

For a judge's log-odds f on a text x (log P(natural) - log P(synthetic)) and a generator pi, the tilt
pi*(x) ∝ pi(x)·e^{f(x)} is pi reweighted by the judge, the fixed point of KL-regularised reward maximisation with
reward f at KL weight 1. Its likelihood gain on natural text over pi is at least

    DV(f) = E_natural[f] - log E_pi[e^f]

(Donsker and Varadhan's variational bound on KL(natural || pi), attained by f = log natural/pi). So DV is what a judge
knows that any way of playing it could carry into the generator, in nats per text. Known answers: a constant judge
is worth 0; a better model's exact log-ratio log p_T/pi is worth the cross-entropy gap between the two on natural
text (E_pi[p_T/pi] = 1); a judge that knows nothing is worth at most 0. The judge's scale is free (a·f is as much a
judge as f): it is chosen on one half of the texts and DV read on the other, with a bootstrap interval over that
half, so the figure was not selected on the texts it is reported on.
"""

import numpy as np

BOOTSTRAP = 1000  # resamples behind the bound's 95% interval
SCALES = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0)  # the judge's scales the bound is chosen among
# a scale is admissible only where e^{a f} over the samples keeps an effective sample size of at least this share of
# them (and 30 texts): below it log-mean-exp is dominated by a few samples and biased low, so the bound errs high (on
# the tests' known answer, 2,000 samples: scale 1.5 at an ESS of 5% read 3.8 nats where the exact gap is 2.9)
MIN_ESS_SHARE = 0.1
MIN_ESS = 30


def log_mean_exp(x):
    x = np.asarray(x, dtype=np.float64)
    top = x.max()
    return float(top + np.log(np.mean(np.exp(x - top))))


def dv(f_natural, f_samples):
    """The Donsker-Varadhan bound E_natural[f] - log E_pi[e^f] (nats per text) of scores on natural texts and on the
    generator's samples."""
    return float(np.mean(f_natural) - log_mean_exp(f_samples))


def effective_sample_size(log_weights):
    """Kish's effective sample size of importance weights e^{log_weights}: n when they are equal, 1 when one holds
    all the mass."""
    w = np.exp(np.asarray(log_weights, dtype=np.float64) - np.max(log_weights))
    return float(w.sum() ** 2 / (w ** 2).sum())


def dv_bound(f_natural, f_samples, seed=0, scales=SCALES):
    """
    A judge's worth: its DV at the scale that maximises DV on one half of the natural texts and of the samples
    (each half drawn at random), among the scales whose weights e^{a f} keep enough effective samples there, read on
    the other half, with a 95% bootstrap interval over that half's texts (natural and samples resampled apart);
    and, for reference, its DV at scale 1 on every text. Log-mean-exp over a finite sample is biased low (Jensen),
    so the bound errs high where few samples carry the weight: dv_ess is the effective sample size it was read at.
    """
    f_natural, f_samples = (np.asarray(f, dtype=np.float64) for f in (f_natural, f_samples))
    rng = np.random.default_rng(seed)
    halves = [np.array_split(rng.permutation(len(f)), 2) for f in (f_natural, f_samples)]
    (nat_pick, nat_read), (smp_pick, smp_read) = [(f[h[0]], f[h[1]]) for f, h in zip((f_natural, f_samples), halves)]
    least = min(max(MIN_ESS, MIN_ESS_SHARE * len(smp_pick)), len(smp_pick))
    admissible = [a for a in scales if effective_sample_size(a * smp_pick) >= least]
    scale = max(admissible or [min(scales)], key=lambda a: dv(a * nat_pick, a * smp_pick))
    nat, smp = scale * nat_read, scale * smp_read
    boots = [dv(nat[rng.integers(0, len(nat), len(nat))], smp[rng.integers(0, len(smp), len(smp))])
             for _ in range(BOOTSTRAP)]
    return dict(dv=dv(nat, smp), dv_ci=[float(q) for q in np.percentile(boots, [2.5, 97.5])], dv_scale=scale,
                dv_at_scale_1=dv(f_natural, f_samples), dv_n=[len(nat), len(smp)], dv_ess=effective_sample_size(smp))


def dv_per_prompt(f_natural, f_samples):
    """
    Each prompt's bound read within its own group: its natural completion x (f_natural, (n,)) against K samples y_k
    of the same prompt (f_samples, (n, K)), f(x) - log((e^{f(x)} + sum_k e^{f(y_k)}) / (K + 1)). That is tilt.py's
    conservative estimator of the likelihood gain over pi of the judge's resampling tilt with K + 1 candidates: in
    expectation at most that gain, itself at most the prompt's KL(natural || pi), and at most log(K + 1). A constant
    added to one prompt's scores leaves it unchanged: the reading for judges that fix their scores only up to a
    constant a prompt (ranking NCE), where dv's one log-mean-exp over every prompt's samples is not a reading.
    """
    f_natural = np.asarray(f_natural, dtype=np.float64)
    group = np.concatenate([f_natural[:, None], np.asarray(f_samples, dtype=np.float64)], axis=1)
    top = group.max(axis=1)
    log_z = top + np.log(np.exp(group - top[:, None]).mean(axis=1))
    return f_natural - log_z


def dv_bound_per_prompt(f_natural, f_samples, seed=0, scales=SCALES):
    """A judge's worth read per prompt (dv_per_prompt, mean over prompts): at the scale that maximises it on one half
    of the prompts, read on the other half, with a 95% bootstrap interval over that half's prompts. No scale needs an
    effective-sample-size guard: the estimator errs low, not high."""
    f_natural, f_samples = np.asarray(f_natural, dtype=np.float64), np.asarray(f_samples, dtype=np.float64)
    rng = np.random.default_rng(seed)
    pick, read = np.array_split(rng.permutation(len(f_natural)), 2)
    scale = max(scales, key=lambda a: dv_per_prompt(a * f_natural[pick], a * f_samples[pick]).mean())
    gains = dv_per_prompt(scale * f_natural[read], scale * f_samples[read])
    boots = [gains[rng.integers(0, len(gains), len(gains))].mean() for _ in range(BOOTSTRAP)]
    return dict(dv=float(gains.mean()), dv_ci=[float(q) for q in np.percentile(boots, [2.5, 97.5])],
                dv_scale=scale, dv_n=[len(read), f_samples.shape[1]])


def log_odds(probs, eps=1e-7):
    """A judge's log-odds log P(natural) - log P(synthetic) from its (B, 2) probabilities (float64, clipped to eps
    so that a saturated judge reads about ±16 rather than infinity)."""
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1.0)
    return np.log(p[:, 0]) - np.log(p[:, 1])


def telescoped_log_odds(f, prompt_lengths):
    """A token judge's sequence log-odds: its per-position log-odds f (B, T) at the last position minus at the
    prompt's last (f_{T-1} - f_{P-1}), numpy or torch. A per-prefix judge at its optimum has f_t = log p_data(x<=t) -
    log pi(x<=t), so this is the completion's exact log-ratio log p_data(x_P..) / pi(x_P.. | x<P); summing f_t over
    the completion instead weighs the ratio of an early token by every later position (up to T - P times)."""
    if hasattr(f, 'device'):  # torch
        import torch
        rows = torch.arange(len(f), device=f.device)
        prompt_lengths = torch.as_tensor(prompt_lengths, device=f.device)
    else:
        rows, prompt_lengths = np.arange(len(f)), np.asarray(prompt_lengths)
    return f[:, -1] - f[rows, prompt_lengths - 1]


def tilt_choice(f, scale=1.0, best=False, generator=None):
    """
    The tilt pi·e^{scale·f} sampled without RL: for each row of f (n, K), the log-odds of K candidates drawn from pi
    for one prompt, the index of the one kept. Importance resampling draws it with probability ∝ e^{scale·f}, which
    samples the tilt exactly as K grows (sampling-importance-resampling); best=True keeps the argmax (best-of-K, the
    tilt's mode-seeking limit as the scale grows).
    """
    f = np.asarray(f, dtype=np.float64)
    if best:
        return f.argmax(axis=1)
    rng = generator if generator is not None else np.random.default_rng()
    w = np.exp(scale * (f - f.max(axis=1, keepdims=True)))
    cumulative = np.cumsum(w / w.sum(axis=1, keepdims=True), axis=1)
    return np.minimum((cumulative < rng.random((len(f), 1))).sum(axis=1), f.shape[1] - 1)
