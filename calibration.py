"""
The calibrated temperature of a generator: the one scalar that maximum likelihood fits on its held-out selection tail
(the last train tokens its checkpoint was chosen on, never val), the control for a base that over-fits and so is
over-confident. The trainers that hold out a tail (train.py --select_tokens, and GRPO and SPIN, whose policies are read
on their base's tail) fit it when they stop and record it in the checkpoint; sample.py --temperature=calibrated,
evaluate.py --temperatures=calibrated and the cycle's control read it, and fit it where a checkpoint has none.
"""
import hashlib
import math
import sys
import time

import numpy as np
import torch

from configurator import UserError
from data_loader import selection_tail
from model import (GPT, LOGITS_BYTES, ensemble_checkpoint, fold_temperature, load_checkpoint, perplexity_windows,
                   update_checkpoint)
from tokenization_manager import TokenizationInfo

BRACKET = (0.5, 3.0)  # the temperatures a fit may return; one past them is read at the edge and said


def calibrated_temperature(base, base_ckpt, dataset, device):
    """The temperature at which base reads the lowest cross-entropy on its held-out selection tail (fit_temperature,
    the search's bracket [0.5, 3], said when the fit lies at its edge). Returns (T, the tail's perplexity there, and
    at T = 1). Raises configurator.UserError where the base holds out no selection tail."""
    tail = selection_tail(dataset, base_ckpt)
    if len(tail) <= base.config.block_size:
        raise UserError("the generator holds out no selection tail, so it has no calibrated temperature (a fit on val "
                        "would be read on val): train it with train.py --select_tokens=N (run_cycles.py "
                        "--base_select_tokens=N), or give a temperature")
    T, ce, ce_at_1, at_edge = fit_temperature(base, tail, device, *BRACKET)
    if at_edge:
        print(f"warning: the tail's best temperature lies at the search's bound, T = {T:.4g} (the fit is clamped to "
              f"[{BRACKET[0]}, {BRACKET[1]}]): the base is read there", file=sys.stderr)
    return T, math.exp(ce), math.exp(ce_at_1)


def checkpoint_calibrated_temperature(ckpt, dataset, device):
    """calibrated_temperature of a checkpoint already read: the one its trainer recorded where it is of these weights
    and this tail, else fit now. (T, the tail's perplexity there, and at T = 1). dataset None: the checkpoint's own."""
    dataset = dataset or ckpt.get('config', {}).get('dataset', '')
    record = ckpt.get('calibrated')
    if record and record['of'] == calibration_key(ckpt, dataset):
        return record['temperature'], record['tail_perplexity'], record['tail_perplexity_at_1']
    return calibrated_temperature(GPT.from_checkpoint(ckpt, device=device), ckpt, dataset, device)


def base_calibrated_temperature(base_path, dataset, device):
    """checkpoint_calibrated_temperature of the checkpoint at base_path."""
    return checkpoint_calibrated_temperature(load_checkpoint(base_path), dataset, device)


def tail_temperature(base_path, dataset, device):
    """The tail-calibrated temperature of the generator at base_path, or None where it holds out no selection tail:
    the one answer to 'the calibrated temperature, or none' that the cycle's and the benches' controls read."""
    try:
        return base_calibrated_temperature(base_path, dataset, device)[0]
    except UserError:
        return None


def load_generator(spec, dataset, device):
    """The generator checkpoint a script's generator option names: one path, or several comma-separated, the
    ensemble of those generators each at its own calibrated temperature (model.fold_temperature), one model.Ensemble
    whose next-token law is the mean of theirs (model.ensemble_checkpoint). Members of another tokenization or block
    size, a reward model or an ensemble among them, are refused in one line. dataset None: each member's own."""
    paths = spec.split(',')
    if len(paths) == 1:
        return load_checkpoint(spec)
    ckpts = [load_checkpoint(p) for p in paths]
    for path, ckpt in zip(paths, ckpts):
        if ckpt['model_args'].get('mode', 'generator') != 'generator' or 'ensemble_args' in ckpt:
            raise UserError(f"{path} is not one generator: an ensemble takes generator checkpoints (train.py's)")
        TokenizationInfo.from_dict(ckpts[0]['tokenization']).check_compatible(
            TokenizationInfo.from_dict(ckpt['tokenization']), paths[0], path)
        if ckpt['model_args']['block_size'] != ckpts[0]['model_args']['block_size']:
            raise UserError(f"{path} has block size {ckpt['model_args']['block_size']}, {paths[0]} "
                            f"{ckpts[0]['model_args']['block_size']}: an ensemble's members read one block")
    temperatures = [checkpoint_calibrated_temperature(c, dataset, device)[0] for c in ckpts]
    print(f"the ensemble of {len(paths)}, each at its calibrated temperature: "
          + ', '.join(f"{T:.4f}" for T in temperatures))
    return ensemble_checkpoint([fold_temperature(c, T) for c, T in zip(ckpts, temperatures)])


def record_calibrated_temperature(path, dataset, device):
    """A trainer's last step: the calibrated temperature of the checkpoint at path, fit on its tail and recorded in it
    (what sample.py and evaluate.py read). A checkpoint with no tail is left as it is. Returns (T, seconds the fit
    took), or None."""
    ckpt, t0 = load_checkpoint(path), time.time()
    try:
        T, ppl, ppl_at_1 = calibrated_temperature(GPT.from_checkpoint(ckpt, device=device), ckpt, dataset, device)
    except UserError:
        return None
    update_checkpoint(path, calibrated=dict(temperature=T, tail_perplexity=ppl, tail_perplexity_at_1=ppl_at_1,
                                            of=calibration_key(ckpt, dataset)))
    return T, time.time() - t0


def record_and_say(path, dataset, device):
    """record_calibrated_temperature, said in one line: what the trainers print when they stop."""
    fit = record_calibrated_temperature(path, dataset, device)
    if fit:
        print(f"calibrated temperature {fit[0]:.4f}: fit on the held-out selection tail in {fit[1]:.1f}s, recorded "
              f"in {path} (sample.py --temperature=calibrated)")


def calibration_key(ckpt, dataset):
    """What a recorded temperature is of: a hash of the checkpoint's weights and of its tail's tokens, so that a
    record copied into other weights (a folded temperature, an ensemble, a policy) or read on another corpus is
    never taken for theirs."""
    h = hashlib.sha1()
    for name, tensor in sorted(ckpt['model'].items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    h.update(np.ascontiguousarray(selection_tail(dataset, ckpt)).tobytes())
    return h.hexdigest()


@torch.no_grad()
def fit_temperature(model, tokens, device=None, low=0.5, high=3.0, tol=1e-4):
    """The temperature at which a generator reads the lowest cross-entropy on tokens (in evaluate_perplexity's
    windows): one scalar fit by maximum likelihood, the control for a base that over-fits and so is over-confident.
    CE is convex in beta = 1/T (the log-normaliser is convex in it, the rest linear), so Newton's method in beta, kept
    inside the bracket [1/high, 1/low] that its own signs narrow, finds it in a few passes of the head over the trunk's
    states, read once. Returns (T, CE at T, CE at T = 1, whether the fit lies at the bracket's edge)."""
    states, lo, hi, beta, tried = trunk_states(model, tokens, device), 1 / high, 1 / low, 1.0, set()
    ce, slope, curvature = temperature_moments(model, states, beta)
    ce_at_1 = ce
    while True:
        tried.add(beta)
        if (beta == 1 / low and slope < 0) or (beta == 1 / high and slope > 0):
            return 1 / beta, ce, ce_at_1, True  # the best lies past the bracket: read at its edge
        lo, hi = (lo, beta) if slope > 0 else (beta, hi)
        step = beta - slope / curvature if curvature > 0 else (lo if slope > 0 else hi)
        if not lo < step < hi:  # past the bracket: its edge, tried once, or its middle
            edge = lo if step <= lo else hi
            step = edge if edge not in tried else (lo + hi) / 2
        if abs(step - beta) < tol:
            return 1 / beta, ce, ce_at_1, False
        beta = step
        ce, slope, curvature = temperature_moments(model, states, beta)


@torch.no_grad()
def trunk_states(model, tokens, device=None):
    """The trunk's final states over tokens in held-out perplexity's windows (perplexity_windows), with their targets:
    read once, so that each temperature a fit tries costs only the head."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    states = [(model.hidden_states(x).flatten(0, 1), y.flatten())
              for x, y in perplexity_windows(np.asarray(tokens), model.config.block_size, device=device)]
    model.train(was_training)
    return states


@torch.no_grad()
def temperature_moments(model, states, beta):
    """The mean cross-entropy of the head over states at inverse temperature beta, and its first two derivatives in
    beta: with z the logits and p = softmax(beta z), CE' = E_p[z] - z_y and CE'' = Var_p[z], never negative. The head
    has no bias, so it reads beta h for beta z; rows a batch as keep a float32 copy of their logits under
    LOGITS_BYTES."""
    sums, n, rows = torch.zeros(3, dtype=torch.float64), 0, max(1, LOGITS_BYTES // (4 * model.config.tokens))
    for h, y in states:
        for i in range(0, len(h), rows):
            bz, target = model.lm_head(beta * h[i:i + rows]).float(), y[i:i + rows, None]
            p = torch.softmax(bz, dim=-1)[:, None, :]
            mean, square = torch.bmm(p, bz[:, :, None]).flatten(), torch.bmm(p, bz.square()[:, :, None]).flatten()
            log_p_target = bz.gather(1, target)[:, 0] - torch.logsumexp(bz, dim=-1)
            sums += torch.stack([-log_p_target.sum(), (mean - bz.gather(1, target)[:, 0]).sum() / beta,
                                 (square - mean ** 2).sum() / beta ** 2]).double().cpu()
            n += len(target)
    return tuple((sums / n).tolist())
