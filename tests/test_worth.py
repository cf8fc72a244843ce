"""What a judge is worth in nats (worth.py): the Donsker-Varadhan bound's known answers on tiny models and texts."""
import json

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


def test_the_tilt_is_sampled_by_resampling_its_candidates():
    """Importance resampling keeps candidate k with probability ∝ e^{scale·f_k}; scale 0 is uniform, a large scale
    and best-of-K keep the argmax."""
    from worth import tilt_choice
    f = np.array([[0.0, np.log(3.0)], [2.0, -1.0]])
    picks = np.stack([tilt_choice(f, generator=np.random.default_rng(s)) for s in range(4000)])
    assert (picks[:, 0] == 1).mean() == pytest.approx(0.75, abs=0.03)  # 3 : 1
    assert (picks[:, 1] == 0).mean() == pytest.approx(np.e ** 3 / (np.e ** 3 + 1), abs=0.02)
    uniform = np.stack([tilt_choice(f, scale=0.0, generator=np.random.default_rng(s)) for s in range(4000)])
    assert (uniform == 0).mean() == pytest.approx(0.5, abs=0.03)
    assert tilt_choice(f, best=True).tolist() == [1, 0] == tilt_choice(f, scale=1e3).tolist()


@pytest.fixture(scope='module')
def tiny_judge(tmp_path_factory, char_ckpt, char_reward):
    from conftest import run_script
    out = tmp_path_factory.mktemp('judge') / 'judge.pt'
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={out}', '--device=cpu', '--max_iters=20', '--eval_interval=10')
    assert r.returncode == 0, r.stderr[-2000:]
    return str(out)


def test_sample_py_samples_the_judges_tilt(char_ckpt, tiny_judge):
    """sample.py --judge --resample K: K candidates a sample, one kept by the tilt; the same seed gives the same text;
    bad combinations are refused in one line."""
    from conftest import run_script
    args = ['sample.py', f'--ckpt_path={char_ckpt}', '--start=KING:', '--num_samples=3', '--max_new_tokens=20',
            f'--judge={tiny_judge}', '--resample=4', '--device=cpu']
    r, again = run_script(*args), run_script(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count('---------------') == 3 and 'kept 1 of 4 candidates per sample' in r.stdout
    assert r.stdout == again.stdout
    best = run_script(*args, '--best_of=True')
    assert best.returncode == 0 and 'best-of-K' in best.stdout
    for bad, message in ((['--resample=1'], '--resample K > 1'), ([f'--judge={char_ckpt}'], 'is not a judge')):
        r = run_script(*args, *bad)
        assert r.returncode != 0 and message in r.stderr and 'Traceback' not in r.stderr, r.stderr[-1000:]
    r = run_script('sample.py', f'--ckpt_path={char_ckpt}', '--resample=4')
    assert r.returncode != 0 and '--resample K > 1' in r.stderr


class ConstantJudge:
    """A judge that says the same of every text: its tilt is the generator itself."""
    kind = 'judge'

    def scores(self, windows, prompt_len):
        return np.full(len(windows), 2.5)


@pytest.fixture(scope='module')
def val_windows(char_data):
    val = np.memmap(f'{char_data}/val.bin', dtype=np.uint16, mode='r')
    starts = np.random.default_rng(3).integers(0, len(val) - 24, 40)
    return torch.from_numpy(np.stack([val[s:s + 24] for s in starts]).astype(np.int64))


def test_a_constant_judges_tilt_is_the_generator_itself(char_ckpt, val_windows):
    from model import GPT
    from tilt import completion_logprob, tilt_cross_entropy
    model = GPT.from_checkpoint(char_ckpt)
    ces = tilt_cross_entropy(model, ConstantJudge(), val_windows, 8, (2, 8), 1.0, 1.0, torch.Generator().manual_seed(0))
    own = -completion_logprob(model, val_windows, 8) / 16
    for K in (2, 8):
        assert ces[K]['conservative'] == pytest.approx(own) and ces[K]['optimistic'] == pytest.approx(own)


def test_the_tilt_by_a_better_models_exact_log_ratio(char_ckpt, val_windows):
    """The positive control at tiny size: pi is the tiny model at temperature 1.3, f its exact log-ratio to the same
    model at 1 (the better one on natural text). The resampler's conservative perplexity never gains more than
    log K nats a completion over pi, gains more with more candidates, and its samples are the ones f prefers."""
    from model import GPT, load_checkpoint
    from tilt import TiltSource, completion_logprob, sample_tilt, tilt_cross_entropy
    model = GPT.from_checkpoint(char_ckpt)
    source = TiltSource(char_ckpt, model, load_checkpoint(char_ckpt), 1.3, 'cpu')
    assert source.kind == 'exact log-ratio'
    ces = tilt_cross_entropy(model, source, val_windows, 8, (2, 32), 1.0, 1.3, torch.Generator().manual_seed(0))
    pi = -completion_logprob(model, val_windows, 8, 1.3) / 16
    for K in (2, 32):
        assert np.all(pi - ces[K]['conservative'] <= np.log(K) / 16 + 1e-9)
    assert ces[32]['conservative'].mean() < ces[2]['conservative'].mean() < pi.mean()
    kept, entropy, figures = sample_tilt(model, source, val_windows[:, :8], 24, 8, 1.0, 1.3, None,
                                         torch.Generator().manual_seed(1), np.random.default_rng(1))
    assert kept.shape == val_windows.shape and entropy.shape == (40, 16)
    assert figures['tilt_f_kept'] > figures['tilt_f_candidates'] and 1 <= figures['tilt_ess'] <= 8
    assert np.allclose(source.scores(kept, 8).mean(), figures['tilt_f_kept'])


def test_a_token_judges_next_token_law_reweights_every_candidate_token(char_ckpt, val_windows):
    """The law p_J(v | x<t) ∝ pi(v | x<t)·e^{f(x<t v)}, read through the judge's key/value cache of the true prefix,
    equals the law recomputed by a full pass for every candidate token; a judge whose head says nothing (zero
    output layer) leaves pi as it is."""
    from model import GPT
    from tilt import judge_law_cross_entropy
    model = GPT.from_checkpoint(char_ckpt)
    judge = GPT.from_checkpoint(char_ckpt, mode='reward', reward_pooling='token')
    law, own = judge_law_cross_entropy(model, judge, val_windows[:3], 8)
    assert law == pytest.approx(own)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in judge.reward_head.parameters():
            p.normal_(0, 0.3)
        x, t = val_windows[1:2, :13], 12
        law, _ = judge_law_cross_entropy(model, judge, x, t, windows_a_batch=1)
        f = []
        for v in range(model.config.vocab_size):
            y = x.clone()
            y[0, t] = v
            logits = judge.reward_head[:-1](judge.hidden_states(y)[:, -1]).double()
            f.append(float(logits[0, 0] - logits[0, 1]))
        log_pi = torch.log_softmax(model(x[:, :t], all_logits=True)[0][0, -1].double(), -1)
        direct = -torch.log_softmax(log_pi + torch.tensor(f, dtype=torch.float64), -1)[x[0, t]]
    assert law[0] == pytest.approx(float(direct), rel=1e-5)
    with pytest.raises(ValueError, match='reads every prefix'):
        judge_law_cross_entropy(model, GPT.from_checkpoint(char_ckpt, mode='reward', reward_pooling='mean'), x, t)


def test_the_per_prompt_worth_is_invariant_to_a_constant_a_prompt():
    """Ranking NCE fixes a judge's scores only up to a constant a prompt: the per-prompt reading (each natural
    completion against K samples of its own prompt) does not move when such constants are added, where the pooled DV
    does. Known answers: a constant judge is worth 0; a judge that tells every text apart reaches the cap log(K + 1)."""
    from worth import dv_bound_per_prompt, dv_per_prompt
    rng = np.random.default_rng(0)
    n, K = 400, 8
    f_natural, f_samples = rng.normal(0.3, 1.0, n), rng.normal(0.0, 1.0, (n, K))
    shift = rng.normal(0.0, 5.0, n)  # a constant a prompt
    plain = dv_bound_per_prompt(f_natural, f_samples, seed=1)
    shifted = dv_bound_per_prompt(f_natural + shift, f_samples + shift[:, None], seed=1)
    assert shifted['dv'] == pytest.approx(plain['dv'], abs=1e-9) and shifted['dv_ci'] == pytest.approx(plain['dv_ci'])
    assert shifted['dv_scale'] == plain['dv_scale'] and plain['dv'] > 0
    pooled = dv_bound(f_natural, f_samples.ravel(), seed=1)['dv']
    assert dv_bound(f_natural + shift, (f_samples + shift[:, None]).ravel(), seed=1)['dv'] != pytest.approx(pooled)
    assert dv_bound_per_prompt(np.full(n, 2.0), np.full((n, K), 2.0))['dv'] == pytest.approx(0.0, abs=1e-12)
    assert dv_per_prompt(np.full(n, 30.0), np.full((n, K), -30.0)) == pytest.approx(np.log(K + 1))


def test_the_per_prompt_worth_of_an_exact_log_ratio_reads_the_kl_from_below():
    """An enumerable case: natural text p and generator pi over four outcomes a prompt, the judge their exact
    log-ratio. Read per prompt, its worth is in expectation at most KL(p || pi) (the resampling tilt's gain, read
    conservatively) and closes in on it as K grows."""
    from worth import dv_per_prompt
    p, pi = np.array([0.4, 0.3, 0.2, 0.1]), np.full(4, 0.25)
    kl = float((p * np.log(p / pi)).sum())
    f = np.log(p / pi)
    rng = np.random.default_rng(2)
    natural = rng.choice(4, size=20000, p=p)
    reads = {K: dv_per_prompt(f[natural], f[rng.choice(4, size=(20000, K), p=pi)]).mean() for K in (4, 64)}
    assert reads[4] < reads[64] < kl + 0.005 and reads[64] > kl - 0.01


def test_an_ngram_judge_saved_is_the_same_judge_and_tilts_by_its_own_log_odds(tmp_path, char_ckpt, val_windows,
                                                                               monkeypatch):
    """judge.NgramJudge.save writes the texts it was fitted on and its fitted features and regression; load restores
    them without a refit: the same log-odds to the bit, on its texts and on texts it never saw (a file without them
    is refit on its texts, the same judge again). As a tilt's
    source (tilt.TiltSource, a .json file) it scores a window by its log-odds of the completion's text, and best-of-K
    keeps the candidate it scores highest."""
    from judge import NgramJudge
    from model import GPT, load_checkpoint
    from tilt import TiltSource, sample_tilt
    from tokenization_manager import TokenizationManager
    ckpt = load_checkpoint(char_ckpt)
    model = GPT.from_checkpoint(ckpt)
    tok = TokenizationManager.from_info(ckpt['tokenization'])
    natural = [tok.decode(w) for w in val_windows[:, 8:].tolist()]
    with torch.no_grad():
        samples = model.generate(val_windows[:, :8], 16, generator=torch.Generator().manual_seed(0))
    written = [tok.decode(w) for w in samples[:, 8:].tolist()]
    judge = NgramJudge()
    judge.fit(natural, written)
    judge.save(str(tmp_path / 'ngram.json'), ckpt['tokenization'])
    unseen = ['Zounds, quoth the xylophone!', 'and so the king is here', 'qqq zzz']
    with monkeypatch.context() as m:
        m.setattr(NgramJudge, 'fit', lambda *a: pytest.fail('load refit the judge'))
        again = NgramJudge.load(str(tmp_path / 'ngram.json'))
    assert np.array_equal(again.log_odds(natural + written + unseen), judge.log_odds(natural + written + unseen))
    saved = json.load(open(tmp_path / 'ngram.json'))
    del saved['fitted']
    json.dump(saved, open(tmp_path / 'texts_only.json', 'w'))
    refit = NgramJudge.load(str(tmp_path / 'texts_only.json'))
    assert refit.log_odds(natural + unseen) == pytest.approx(judge.log_odds(natural + unseen), abs=1e-12)
    source = TiltSource(str(tmp_path / 'ngram.json'), model, ckpt, 1.0, 'cpu')
    assert source.kind == 'n-gram judge' and source.flops_per_window(24, 8) == 0
    assert source.scores(val_windows, 8) == pytest.approx(judge.log_odds(natural), abs=1e-12)
    kept, _, figures = sample_tilt(model, source, val_windows[:6, :8], 24, 4, 1.0, 1.0, None,
                                   torch.Generator().manual_seed(1), np.random.default_rng(0), best=True)
    candidates = tilt_candidates(model, val_windows[:6, :8], 4)
    best = source.scores(candidates.view(-1, 24), 8).reshape(6, 4).argmax(1)
    assert torch.equal(kept, candidates[torch.arange(6), torch.from_numpy(best)])
    assert figures['tilt_f_kept'] >= figures['tilt_f_candidates']
    from conftest import run_script
    r = run_script('sample.py', f'--ckpt_path={char_ckpt}', '--start=KING:', '--num_samples=2', '--max_new_tokens=16',
                   f"--judge={tmp_path / 'ngram.json'}", '--resample=4', '--device=cpu')
    assert r.returncode == 0 and 'kept 1 of 4 candidates per sample' in r.stdout, r.stderr[-2000:]


def tilt_candidates(model, prompts, K):
    """The candidates sample_tilt draws from the same generator state."""
    from tilt import candidates
    return candidates(model, prompts, 24, K, 1.0, None, torch.Generator().manual_seed(1))[0]


def test_the_ngram_judge_chooses_its_l2_strength_on_held_out_texts(tmp_path):
    """fit_selected keeps the C whose fit has the lowest held-out loss: where the labels are noise (both classes drawn
    from one law) that is the strongest regularisation, the fit closest to knowing nothing; where the classes differ,
    a weaker one. The chosen C is saved and loaded with the judge."""
    from judge import NgramJudge
    rng = np.random.default_rng(0)
    words = ['the', 'king', 'lord', 'my', 'good', 'queen', 'and', 'so', 'is', 'here']

    def texts(n, vocab):
        return [' '.join(rng.choice(vocab, 6)) for _ in range(n)]
    noise = [texts(60, words) for _ in range(4)]
    judge, losses = NgramJudge.fit_selected(*noise, grid=(0.01, 1.0, 100.0))
    assert judge.C == 0.01 and losses[0.01] < losses[1.0] < losses[100.0]
    letters = ['zq', 'xv', 'qq', 'kqz', 'vvq', 'zx']
    natural, samples = texts(60, words), texts(60, letters)
    judge, losses = NgramJudge.fit_selected(natural, samples, texts(30, words), texts(30, letters),
                                            grid=(0.01, 1.0, 100.0))
    assert judge.C == min(losses, key=losses.get) and judge.C > 0.01
    judge.save(str(tmp_path / 'j.json'), {'method': 'char'})
    again = NgramJudge.load(str(tmp_path / 'j.json'))
    assert again.C == judge.C and again.p_natural(natural[:5]) == pytest.approx(judge.p_natural(natural[:5]))
