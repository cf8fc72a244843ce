"""
What the policy trainers (GRPO, SPIN) share: prompts cut from the corpus with their natural windows, the masks of
the generated positions, the policy's token log-probabilities, and the learning-rate warm-up.
"""

import os

import numpy as np
import torch

from configurator import UserError
from data_loader import generator_train_tokens, held_out_record, resolve_data_dir
from model import softmax_entropy


def generated_positions(prompt_lengths, seq_len):
    """(B, seq_len) mask of the positions a row's completion fills: position t iff t >= its prompt length P."""
    return (torch.arange(seq_len, device=prompt_lengths.device)[None, :] >= prompt_lengths[:, None]).float()


def completion_mask(prompt_lengths, seq_len):
    """(B, seq_len - 1) mask over next-token targets: target j (token j + 1) is a completion token iff j + 1 >= P."""
    return generated_positions(prompt_lengths, seq_len)[:, 1:]


def token_logprobs(model, seqs, temperature, entropy=False, chunk=8, kl_to=None, kl_forward=False):
    """
    Log-probabilities (B, T-1) of each next token, from logits scaled by the sampling temperature, and with
    entropy=True each position's entropy (B, T-1, no gradient). Only the logits (B, T-1, V) stay alive for the
    backward: the normaliser and the entropy are computed `chunk` rows at a time, so a 50k-token vocabulary never
    holds a full log-softmax (or its entropy terms) beside them.
    kl_to: another model's next-token log-probabilities (B, T-1, V); then a third output, each position's exact
    KL(this model || that one) over the whole vocabulary (B, T-1), with its gradient (kl_forward: KL(that || this)).
    """
    logits = model(seqs[:, :-1], all_logits=True)[0].float() / temperature
    targets = seqs[:, 1:, None]
    logps, entropies, kls = [], [], []
    for i in range(0, len(seqs), chunk):
        rows = logits[i:i + chunk]
        lse = torch.logsumexp(rows, dim=-1)
        logps.append(rows.gather(-1, targets[i:i + chunk]).squeeze(-1) - lse)
        if entropy:
            with torch.no_grad():
                entropies.append(softmax_entropy(rows))
        if kl_to is not None:
            log_p, other = rows - lse[..., None], kl_to[i:i + chunk]
            first, second = (other, log_p) if kl_forward else (log_p, other)
            kls.append((first.exp() * (first - second)).sum(-1))
    out = torch.cat(logps), (torch.cat(entropies) if entropy else None)
    return out if kl_to is None else (*out, torch.cat(kls))


def warmup_lr(optimizer, learning_rate, warmup_steps, step):
    """Linear warmup to learning_rate over warmup_steps, then constant; set on the optimizer and returned."""
    lr = learning_rate * min(1.0, (step + 1) / max(1, warmup_steps))
    for group in optimizer.param_groups:
        group['lr'] = lr
    return lr


def prompts_and_splits(C, block_size, ckpt):
    """The largest prompt length (C.max_prompt_len, default block_size // 2; checked), the memory-mapped splits of
    C.dataset (default: the checkpoint's own dataset): the generator's own training tokens (the train split less the
    tail its base held out, data_loader.generator_train_tokens) and val, and the held_out record of the policy
    trained on them. C.dataset is set to the folder read, so that the policy's checkpoint names its data."""
    hi = C.max_prompt_len or block_size // 2
    if not 1 <= C.min_prompt_len <= hi < block_size:
        raise UserError(f"need 1 <= min_prompt_len <= max_prompt_len < block_size ({block_size}); "
                        f"got {C.min_prompt_len}, {hi}")
    data_dir = C.dataset = resolve_data_dir(C.dataset or ckpt.get('config', {}).get('dataset', ''))
    train, val = (np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
                  for split in ('train', 'val'))
    return hi, generator_train_tokens(train, ckpt), val, held_out_record(ckpt, len(train))


def sample_windows(train, n, lo, hi, block_size, rng):
    """n natural windows (n, block_size) at random offsets of the train split, and a prompt length ~ U[lo, hi] each."""
    lengths = rng.integers(lo, hi + 1, size=n)
    offsets = rng.integers(0, len(train) - block_size, size=n)
    return np.stack([np.asarray(train[o:o + block_size], dtype=np.int64) for o in offsets]), lengths


def sample_prompts(train, n, lo, hi, block_size, rng):
    """n prompts of lengths ~ U[lo, hi] at random offsets of the train split, left-aligned in (n, hi), their lengths,
    and the natural windows they were cut from (the corpus' own continuation of each prompt)."""
    windows, lengths = sample_windows(train, n, lo, hi, block_size, rng)
    prompts = np.where(np.arange(hi)[None, :] < lengths[:, None], windows[:, :hi], 0)
    return prompts, lengths, windows
