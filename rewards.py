"""
The rewards train_grpo.py plays for, one function each, in the shape of TRL's reward_funcs: each takes the step's
rollouts (a namespace: token ids, masks, texts and the models a reward may read; train_grpo.reward_inputs) and
returns per-completion scores (B,) and per-position scores (B, N) where it has them, else None.

  judge          the judge's P(natural) (the seed's design): a token judge's mean over the completion's positions
  judge_log_odds the judge's log-odds of natural text; a token judge's telescoped over the completion (its last
                 position's minus the prompt's last: worth.telescoped_log_odds, the sequence log-ratio)
  teacher        MiniLLM's reward: log p_T - log pi per completion token to a better generator, their mean
  teacher_ratio  the positive control through a judge's own channel: one scalar per completion, a better generator's
                 exact sequence log-ratio log p_T(x) - log pi_ref(x) to the reference (the cycle's start), no
                 per-token credit; its tilt pi_ref·e^{a·f} at scale a is pi_ref^(1-a)·p_T^a
  known_words    the share of the completion's words found in the train split (exact, and hackable)
  module:function  a user's own (or path/to/file.py:function), called as function(prompts=[str],
                 completions=[str], prompt_ids=[[int]], completion_ids=[[int]]), one float back a completion

Several, comma-separated, are summed with weights, as TRL's reward_funcs with reward_weights (combined_reward).
"""

import importlib
import importlib.util
import math
import os
import sys
import traceback

import torch

from configurator import UserError
from data_loader import whole_words
from policy import token_logprobs
from worth import telescoped_log_odds


def judge(r):
    """The judge's P(natural): a token judge's per-position scores averaged over the completion, else its one figure."""
    per_position = r.judged if r.judged.dim() == 2 else None
    rewards = (r.judged * r.generated).sum(1) / r.generated.sum(1) if per_position is not None else r.p_natural
    return rewards, per_position


def judge_log_odds(r):
    """log P(natural) - log P(synthetic) of each completion: a pooled judge's (B, 2) probs, or a token judge's
    (B, N, 2) telescoped, the last position's minus the prompt's last (worth.telescoped_log_odds)."""
    p = r.probs.double().clamp_min(1e-7)
    f = p[..., 0].log() - p[..., 1].log()
    return (telescoped_log_odds(f, r.prompt_lengths) if f.dim() == 2 else f).float(), None


@torch.no_grad()
def teacher(r):
    """Per completion token, log p_teacher - log p_policy of the sampled token (the policy as it sampled, at the
    sampling temperature); the completion's reward is their mean (minus the per-token reverse KL, length-normalised).
    The per-position log-ratios (B, N) feed token advantages (position j + 1 is target j's); with the teacher's exact
    law in play (r.teacher_logp) a token's own log-ratio leaves its credit, so they move one position earlier."""
    if r.teacher_logp is not None:
        teacher_token = r.teacher_logp.gather(-1, r.seqs[:, 1:, None]).squeeze(-1)
    else:
        teacher_token = token_logprobs(r.teacher, r.seqs, 1.0)[0].float()
    ratio = (teacher_token - token_logprobs(r.policy, r.seqs, r.temperature)[0].float()) * r.mask
    per_position = torch.nn.functional.pad(ratio, (0, 1) if r.teacher_logp is not None else (1, 0))
    return ratio.sum(1) / r.mask.sum(1).clamp_min(1), per_position


@torch.no_grad()
def teacher_ratio(r):
    """The teacher's exact sequence log-ratio to the reference over the completion, one scalar a completion (the
    reference's log-probs as the trainer took them for its KL, r.ref_logps: one pass, counted once)."""
    ratio = token_logprobs(r.teacher, r.seqs, 1.0)[0].float() - r.ref_logps
    return (ratio * r.mask).sum(1), None


def known_words(r):
    """The share of each completion's words found in the train split's words (its first and last may be cut by the
    window or the prompt, as unknown_word_rate skips them); 0 for a completion without one."""
    rewards = []
    for text in r.completions:
        words = whole_words(text)
        rewards.append(sum(w in r.known_words for w in words) / len(words) if words else 0.0)
    return torch.tensor(rewards, device=r.seqs.device), None


BUILT_IN = {'judge': judge, 'judge_log_odds': judge_log_odds, 'teacher': teacher, 'teacher_ratio': teacher_ratio,
            'known_words': known_words}
NEEDS_TEACHER = ('teacher', 'teacher_ratio')


def load_user_function(spec):
    """The function a 'module:function' or 'path/to/file.py:function' names (a module from the working directory or
    the Python path)."""
    module_name, _, name = spec.rpartition(':')
    if not module_name or not name:
        raise UserError(f"--reward={spec!r}: a user's reward is module:function or file.py:function "
                        f"(e.g. my_rewards:length)")
    try:
        if module_name.endswith('.py'):
            loader = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        return getattr(module, name)
    except (ImportError, AttributeError, FileNotFoundError) as e:
        raise UserError(f"--reward={spec}: cannot load it ({e}); it must name a module (or .py file) defining "
                        f"{name}(prompts, completions, **kwargs)") from None


def user_reward(spec):
    """A reward of this module's shape that calls the user's function (load_user_function) on the texts and ids.
    Whatever goes wrong in it is one line naming the function and what was wrong: the exception with the user's file
    and line, the count returned, or the first value that is not a finite number and its completion."""
    fn = load_user_function(spec)

    def reward(r):
        ids = r.seqs.tolist()
        try:
            scores = list(fn(prompts=r.prompts, completions=r.completions,
                             prompt_ids=[row[:n] for row, n in zip(ids, r.prompt_lengths)],
                             completion_ids=[row[n:] for row, n in zip(ids, r.prompt_lengths)]))
        except Exception as e:
            raise UserError(f"--reward={spec} raised {type(e).__name__}: {e} ({raised_at(e, fn)})") from None
        if len(scores) != len(ids):
            raise UserError(f"--reward={spec} returned {len(scores)} scores for {len(ids)} completions: it must "
                            "return one float per completion")
        for i, score in enumerate(scores):
            try:
                ok = math.isfinite(float(score))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise UserError(f"--reward={spec} returned {score!r} for completion {i} ({r.completions[i][:40]!r}): "
                                "it must return a finite float for every completion")
        return torch.tensor([float(x) for x in scores], device=r.seqs.device), None
    return reward


def raised_at(e, fn):
    """Where an exception of a user's reward was raised: the innermost line of the file that defines it."""
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if f.filename == getattr(getattr(fn, '__code__', None), 'co_filename', None)]
    frame = (own or frames)[-1]
    return f"{frame.filename}, line {frame.lineno}"


def reward_names(spec):
    """The rewards a --reward names: one, or several comma-separated."""
    return [name.strip() for name in spec.split(',')]


def reward_weights_of(spec, weights):
    """--reward_weights as floats, one a reward (all 1 when not given), or a one-line error."""
    n = len(reward_names(spec))
    if not weights:
        return [1.0] * n
    try:
        out = [float(w) for w in str(weights).split(',')]
    except ValueError:
        out = []
    if len(out) != n or not all(math.isfinite(w) for w in out):
        raise UserError(f"--reward_weights={weights}: {n} finite numbers, comma-separated, one for each of "
                        f"--reward={spec}")
    return out


def combined_reward(spec, weights, reward_form='p_natural'):
    """The reward a --reward spec plays: one reward as it is (its per-position scores kept), or several summed with
    their weights (TRL's reward_funcs with reward_weights), whole completions only. Returns the function and the
    names; the function returns (rewards, per_position, each reward's own scores by name)."""
    names = reward_names(spec)
    fns, w = [reward_function(name, reward_form) for name in names], reward_weights_of(spec, weights)
    if len(set(names)) != len(names):
        raise UserError(f"--reward={spec} names a reward twice: give it once, with its weight in --reward_weights")

    def reward(r):
        parts = [fn(r) for fn in fns]
        if len(parts) == 1:  # its per-position scores too (a token judge's, the teacher's), times its weight
            (rewards, per_position), = parts
            return w[0] * rewards, None if per_position is None else w[0] * per_position, {names[0]: rewards}
        total = sum(wi * p[0].float() for wi, p in zip(w, parts))
        return total, None, {name: p[0] for name, p in zip(names, parts)}
    return reward, names


def reward_function(name, reward_form='p_natural'):
    """The reward a name picks: a built-in (the judge's in its reward_form) or a user's module:function."""
    if name == 'judge':
        return judge_log_odds if reward_form == 'log_odds' else judge
    if name in BUILT_IN:
        return BUILT_IN[name]
    if ':' in name:
        return user_reward(name)
    raise UserError(f"reward must be 'judge', 'teacher', 'teacher_ratio', 'known_words' or module:function, "
                    f"got {name!r}")


def kl_regularised(rewards, logps, ref_logps, mask):
    """rewards minus each completion's exact log-ratio sum_t log pi(x_t) - log pi_ref(x_t) over its tokens (mask):
    its expected policy gradient is that of E[r] - KL(pi || pi_ref); as a log-weight, log pi_ref·e^r / pi."""
    return rewards - ((logps - ref_logps) * mask).sum(1).to(rewards.dtype)
