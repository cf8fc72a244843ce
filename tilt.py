"""
The generator tilted by a judge, pi·e^{a·f} (worth.py), sampled and scored without RL: sample.py, evaluate.py's
tilt point and the cycle's read it here.

f is a reward model's log-odds of natural text on a window (its last block_size tokens), or, the positive control, a
better generator's exact log-ratio log p_T - log pi over the completion (whose tilt at a = 1 is p_T itself).

Sampled by importance resampling: K candidates from pi for a prompt, one kept with probability ∝ e^{a·f}. That
sampler q_K has a density of its own, q_K(x) = pi(x)·w(x)·E[K / (w(x) + w(x_2) + ... + w(x_K))] (w = e^{a·f}, x_j
drawn from pi); it tends to the tilt as K grows and never raises a text's probability more than K-fold. Its
perplexity on natural completions is read per prompt, from fresh candidates of that prompt, two ways:
  conservative: -log of the unbiased estimate pi(x)·w(x)·K / (w(x) + w(x_2..x_K)) of q_K(x). Unbiased inside the
                log, it errs high after it (Jensen): the sampler's perplexity, overstated on average. The verdicts
                read this one.
  optimistic:   the tilt's own normaliser Z = E_pi[w] estimated by the mean of w over K candidates; log-mean-exp
                errs low (Jensen), so this perplexity of the K = infinity tilt is understated on average, and by far
                where few candidates carry the weight (a better model's exact log-ratio over 120 characters).
Both agree for a constant judge (pi itself) and close in on the tilt's from either side as K grows.
"""

import numpy as np
import torch

from judge import NgramJudge
from model import GPT, LOGITS_BYTES, load_checkpoint
from policy import token_logprobs
from tokenization_manager import TokenizationInfo, TokenizationManager
from two_sample import completion_texts
from worth import effective_sample_size, log_odds, telescoped_log_odds, tilt_choice

TILT_PPL_K = (8, 32, 128)  # the candidates a prompt at which the tilt's perplexity is shown
ROWS = 1024  # sequences a batch, in sampling and scoring


@torch.no_grad()
def completion_logprob(model, windows, prompt_len, temperature=1.0):
    """Each window's log-probability (nats, float64) of its tokens after the first prompt_len, under model at this
    temperature; as many windows a batch as keep its logits under LOGITS_BYTES (at GPT-2 BPE, 1,000 windows' logits
    are 13 GB)."""
    rows = logit_rows(model, windows.shape[1])
    return np.concatenate([token_logprobs(model, windows[i:i + rows], temperature)[0][:, prompt_len - 1:].sum(1)
                           .double().cpu().numpy() for i in range(0, len(windows), rows)])


def logit_rows(model, length):
    """How many sequences of `length` tokens a scoring batch takes: at most ROWS, and as many as keep their float32
    logits (token_logprobs holds them and their scaled copy) under LOGITS_BYTES."""
    return int(max(1, min(ROWS, LOGITS_BYTES // (2 * 4 * length * model.config.tokens))))


@torch.no_grad()
def judge_log_odds(judge, windows, prompt_len):
    """A reward model's log-odds of natural text (worth.log_odds) on each window, read on its last block_size tokens;
    a token judge's telescoped over the completion after prompt_len tokens, as the game's reward reads it
    (worth.telescoped_log_odds)."""
    block = judge.config.block_size
    cut = max(0, windows.shape[1] - block)
    if judge.config.reward_pooling == 'token' and prompt_len - cut < 1:
        raise ValueError(f"the judge reads the last {block} tokens: the prompt's last token is outside them")
    out = []
    for i in range(0, len(windows), ROWS):
        probs = judge(windows[i:i + ROWS, -block:], per_token=True)[0].double().cpu().numpy()
        if probs.ndim == 3:
            f = log_odds(probs.reshape(-1, 2)).reshape(probs.shape[:2])
            out.append(telescoped_log_odds(f, np.full(len(f), prompt_len - cut)))
        else:
            out.append(log_odds(probs))
    return np.concatenate(out)


class TiltSource:
    """What tilts the generator: a reward model's log-odds, an n-gram judge's (its file, judge.NgramJudge.save:
    read on the completion's text), or a better generator's exact log-ratio to it."""

    @staticmethod
    def kind_of(path, ckpt=None):
        """'n-gram judge' (a .json file), 'judge' (a reward model) or 'exact log-ratio' (a generator); ckpt: the
        checkpoint at path, if it is already loaded."""
        if path.endswith('.json'):
            return 'n-gram judge'
        ckpt = ckpt or load_checkpoint(path)
        return 'judge' if ckpt['model_args'].get('mode') == 'reward' else 'exact log-ratio'

    def __init__(self, path, generator, generator_ckpt, temperature, device):
        if path.endswith('.json'):
            self.model = NgramJudge.load(path)
            tokenization = self.model.tokenization
            self.kind = self.kind_of(path)
        else:
            ckpt = load_checkpoint(path)
            self.model, tokenization = GPT.from_checkpoint(ckpt, device=device), ckpt['tokenization']
            self.kind = self.kind_of(path, ckpt)
        TokenizationInfo.from_dict(generator_ckpt['tokenization']).check_compatible(
            TokenizationInfo.from_dict(tokenization), 'the generator', path)
        self.path, self.generator = path, generator
        self.tokenizer = TokenizationManager.from_info(generator_ckpt['tokenization'])
        self.temperature = temperature  # the tilted generator's sampling law pi is pi at this temperature

    @torch.no_grad()
    def scores(self, windows, prompt_len):
        """f of each window (float64)."""
        if self.kind == 'exact log-ratio':
            return completion_logprob(self.model, windows, prompt_len) \
                - completion_logprob(self.generator, windows, prompt_len, self.temperature)
        if self.kind == 'n-gram judge':
            return self.model.log_odds(completion_texts(self.tokenizer, windows, prompt_len))
        return judge_log_odds(self.model, windows, prompt_len)

    def flops_per_window(self, length, prompt_len):
        """Model FLOPs of scoring one window (the generator's own pass too, for an exact log-ratio; none for an
        n-gram judge, which runs no network)."""
        if self.kind == 'exact log-ratio':
            return (self.model.flops_per_token() + self.generator.flops_per_token()) * (length - prompt_len)
        if self.kind == 'n-gram judge':
            return 0
        return self.model.flops_per_token() * min(length, self.model.config.block_size)


@torch.no_grad()
def candidates(model, prompts, length, K, temperature, top_k, generator):
    """K continuations of each prompt (n, P) to `length` tokens: (n, K, length), and the entropy of the law each
    generated token was drawn from (n, K, length - P)."""
    n, P = prompts.shape
    per = max(1, ROWS // K)
    outs, ents = [], []
    for i in range(0, n, per):
        rows = prompts[i:i + per].repeat_interleave(K, dim=0)
        out, ent = model.generate(rows, length - P, temperature, top_k, generator=generator, entropy=True)
        outs.append(out.view(-1, K, length))
        ents.append(ent.view(-1, K, length - P))
    return torch.cat(outs), torch.cat(ents)


def scored_candidates(model, source, prompts, length, K, temperature, top_k, generator):
    """K candidates of each prompt (n, P) as candidates() draws them, their f (n, K) and the model FLOPs of drawing
    and scoring them."""
    n, P = prompts.shape
    cand, ent = candidates(model, prompts, length, K, temperature, top_k, generator)
    f = source.scores(cand.view(n * K, length), P).reshape(n, K)
    flops = n * K * ((length - P) * model.flops_per_token() + source.flops_per_window(length, P))
    return cand, ent, f, int(flops)


def tilt_weights(f, scale):
    """Each candidate's importance weight under the tilt, self-normalised over its prompt's K: w = K·e^{a·f} / sum
    e^{a·f} (n, K), mean 1 a prompt. Weighting a loss on pi's samples by w - 1 reads the tilt's expectation less
    pi's, so the term has mean zero where the judge is flat (f = const)."""
    a = scale * np.asarray(f, dtype=np.float64)
    a -= a.max(1, keepdims=True)
    return f.shape[1] * np.exp(a) / np.exp(a).sum(1, keepdims=True)


def sample_tilt(model, source, prompts, length, K, scale, temperature, top_k, generator, rng, best=False):
    """
    The tilt sampled by resampling: for each prompt (n, P), K candidates from the generator, one kept ∝ e^{scale·f}
    (best=True: the judge's favourite, best-of-K). Returns the kept samples (n, length), the entropy along them
    (n, length - P), and figures: the candidates' mean effective sample size under the weights, f's mean over the
    kept and over all candidates, and the sampling's model FLOPs (the candidates and their scoring).
    """
    n, P = prompts.shape
    cand, ent, f, flops = scored_candidates(model, source, prompts, length, K, temperature, top_k, generator)
    kept = torch.from_numpy(tilt_choice(f, scale, best, rng)).to(cand.device)
    rows = torch.arange(n, device=cand.device)
    figures = dict(tilt_ess=float(np.mean([effective_sample_size(scale * r) for r in f])),
                   tilt_f_kept=float(f[np.arange(n), kept.cpu().numpy()].mean()), tilt_f_candidates=float(f.mean()),
                   tilt_sampling_flops=flops)
    return cand[rows, kept], ent[rows, kept], figures


def tilt_cross_entropy(model, source, natural, prompt_len, Ks, scale, temperature, generator):
    """
    The tilt's cross-entropy on each natural window's completion (nats a completion token), for each K of Ks:
    {K: {'conservative': (n,), 'optimistic': (n,)}} (module docstring), from max(Ks) fresh candidates of each
    window's own prompt, nested (K = 8 reads the first 8 of them).
    """
    L = natural.shape[1]
    lp = completion_logprob(model, natural, prompt_len, temperature)
    a_nat = scale * source.scores(natural, prompt_len)
    cand, _ = candidates(model, natural[:, :prompt_len], L, max(Ks), temperature, None, generator)
    a_cand = scale * source.scores(cand.view(-1, L), prompt_len).reshape(len(natural), -1)
    out = {}
    for K in Ks:
        optimistic = np.logaddexp.reduce(a_cand[:, :K], axis=1) - np.log(K)
        conservative = np.logaddexp.reduce(np.c_[a_nat, a_cand[:, :K - 1]], axis=1) - np.log(K)
        out[K] = {name: -(lp + a_nat - log_z) / (L - prompt_len)
                  for name, log_z in (('conservative', conservative), ('optimistic', optimistic))}
    return out


@torch.no_grad()
def judge_token_scores(judge, x, positions, windows_a_batch=8):
    """
    A token judge's log-odds f(x<t v) (its head's two logits' difference at position t when token t is v) for every
    token v of the vocabulary and every position t of `positions` ((S,), or (n, S) a row's own): (n, S, V), float64.
    Every candidate token attends to its row's true prefix (GPT.candidate_states), `windows_a_batch` rows at a time:
    the per-prefix knowledge FUDGE's reweighting (Yang & Klein 2021) turns into a next-token law.
    """
    if judge.config.reward_pooling != 'token':
        raise ValueError("a judge's next-token law needs a judge that reads every prefix (reward_pooling 'token')")
    out = []
    for i in range(0, len(x), windows_a_batch):
        rows = positions if positions.dim() == 1 else positions[i:i + windows_a_batch]
        logits = judge.reward_head[:-1](judge.candidate_states(x[i:i + windows_a_batch], rows)).double()
        out.append(logits[..., 0] - logits[..., 1])
    return torch.cat(out)


@torch.no_grad()
def judge_law_cross_entropy(model, judge, natural, prompt_len, scale=1.0, temperature=1.0, windows_a_batch=8):
    """
    A token judge's next-token law: p_J(v | x<t) ∝ pi(v | x<t)·e^{a·f(x<t v)} (judge_token_scores), normalised over
    the whole vocabulary, so it needs no estimate of a normaliser. Returns each natural window's cross-entropy under
    that law and under pi (nats a completion token, float64): the law a game distilling the judge's per-prefix
    knowledge would reach.
    """
    if model.config.vocab_size != judge.config.vocab_size:
        raise ValueError("the judge and the generator must share a vocabulary")
    law, own = [], []
    for i in range(0, len(natural), windows_a_batch):
        x = natural[i:i + windows_a_batch]
        log_pi = torch.log_softmax(model(x[:, :-1], all_logits=True)[0].double() / temperature, -1)[:, prompt_len - 1:]
        f = judge_token_scores(judge, x, torch.arange(prompt_len, x.size(1), device=x.device), windows_a_batch)
        log_law = torch.log_softmax(log_pi + scale * f, -1)
        targets = x[:, prompt_len:, None]
        law.append(-log_law.gather(-1, targets).squeeze(-1).mean(1))
        own.append(-log_pi.gather(-1, targets).squeeze(-1).mean(1))
    return torch.cat(law).cpu().numpy(), torch.cat(own).cpu().numpy()
