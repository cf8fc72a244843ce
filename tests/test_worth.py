"""What a judge is worth in nats (worth.py): the Donsker-Varadhan bound's known answers on tiny models and texts."""
import numpy as np
import pytest
import torch

from worth import dv, dv_bound, log_mean_exp, log_odds


def test_a_constant_judge_is_worth_nothing():
    rng = np.random.default_rng(0)
    assert dv(np.full(50, 3.0), np.full(70, 3.0)) == pytest.approx(0.0, abs=1e-12)
    b = dv_bound(np.full(400, -1.5), np.full(300, -1.5), seed=1)
    assert b['dv'] == pytest.approx(0.0, abs=1e-12) and b['dv_ci'] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert log_mean_exp(rng.normal(size=10) + 1e3) > 1e3 - 5  # no overflow far from 0


def test_log_odds_of_a_judges_probabilities():
    p = np.array([[0.5, 0.5], [0.9, 0.1], [1.0, 0.0]])
    assert log_odds(p)[:2] == pytest.approx([0.0, np.log(9.0)]) and 15 < log_odds(p)[2] < 17


@pytest.fixture(scope='module')
def teacher_and_tilt(char_ckpt, char_data):
    """A known answer: the tiny char model is the teacher p_T, the same model sampled at temperature 1.3 the generator
    pi; the judge is their exact log-ratio over a completion, f = log p_T - log pi, on natural val completions and on
    pi's own completions of the same prompts. Its bound is the cross-entropy gap on natural text, E_nat[f], exactly
    in expectation (E_pi[e^f] = 1)."""
    from model import GPT
    from policy import token_logprobs
    torch.manual_seed(0)
    model = GPT.from_checkpoint(char_ckpt)
    val = np.memmap(f'{char_data}/val.bin', dtype=np.uint16, mode='r')
    N, prompt, n = 24, 8, 600
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(val) - N, n)
    natural = torch.from_numpy(np.stack([val[s:s + N] for s in starts]).astype(np.int64))
    with torch.no_grad():
        sampled = model.generate(natural[:, :prompt], N - prompt, temperature=1.3,
                                 generator=torch.Generator().manual_seed(0))

        def f(seqs):  # the completion's log-ratio, summed over its tokens
            ratio = token_logprobs(model, seqs, 1.0)[0] - token_logprobs(model, seqs, 1.3)[0]
            return ratio[:, prompt - 1:].sum(1).double().numpy()
        return f(natural), f(sampled)


def test_a_better_models_exact_log_ratio_is_worth_its_cross_entropy_gap(teacher_and_tilt):
    f_natural, f_samples = teacher_and_tilt
    gap = f_natural.mean()  # the exact cross-entropy gap on these natural completions, nats per completion
    assert gap > 0.5  # the sharper model is the better one on natural text
    b = dv_bound(f_natural, f_samples, scales=(1.0,))
    assert b['dv_ci'][0] <= gap <= b['dv_ci'][1], (gap, b)
    assert abs(log_mean_exp(f_samples)) < 0.25  # log E_pi[p_T/pi] = 0, read from 600 samples


def test_the_bound_chooses_its_scale_on_other_texts_than_it_reads(teacher_and_tilt):
    """A scale chosen among several, on one half, read on the other, only where enough samples carry the weights
    e^{a f} (a larger scale may bound KL(natural || pi) more tightly than the gap, but read from a few samples it
    errs high); the same scores shuffled between natural and samples (a judge fit on shuffled labels) are worth
    nothing, at most 0 within the interval."""
    from worth import MIN_ESS, effective_sample_size
    f_natural, f_samples = teacher_and_tilt
    b = dv_bound(f_natural, f_samples)
    assert b['dv_ess'] >= MIN_ESS / 2 and b['dv_scale'] <= 2.0 and b['dv_ci'][0] > 0, b
    assert effective_sample_size(np.zeros(7)) == pytest.approx(7) and effective_sample_size([0, -50]) < 1.01
    pooled = np.random.default_rng(1).permutation(np.r_[f_natural, f_samples])
    shuffled = dv_bound(pooled[:len(f_natural)], pooled[len(f_natural):], seed=2)
    assert shuffled['dv_ci'][0] <= 0, shuffled
    assert shuffled['dv'] < 0.25 * b['dv']
