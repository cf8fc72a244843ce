"""
SPIN (Self-Play fIne-tuNing; Chen et al., ICML 2024) of the generator: the model is its own judge, and real text
stays in its loss.

  python train_spin.py [config.py] --policy_path=BASE.pt --out_path=NEW.pt [--key=value ...]

Each step: batch_size natural windows of block_size tokens from random offsets of the train split, each cut at a
prompt length P ~ U[min_prompt_len, max_prompt_len] (as GRPO's prompts); the chosen continuation is the corpus' own,
the rejected one is the opponent's for the same prompt, written by the one KV-cache sampler. The opponent and the
reference are the previous iterate, the policy this run starts from (frozen); with opponent_mix > 0 that share of
each batch is written by an earlier iterate instead, drawn from opponent_paths (playing against a mixture of past
iterates, arXiv 2404.04291). With m = (log π − log π_ref)(real) − (log π − log π_ref)(generated), log-probabilities
summed over the continuation's tokens:
  loss_type='sigmoid':  −log σ(β m)          (SPIN's, DPO's)
  loss_type='hinge':    max(0, 1 − β m)
plus nll_weight × the mean next-token loss of the real continuation (a pull towards the corpus that keeps both
log-probabilities from falling together). Logged: the loss, the margin m and both log-probability terms on the
batch, and every eval_interval steps the margin on fixed held-out val prompts (with their opponent continuations
drawn once at the start) and val perplexity.
"""

import copy
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from calibration import record_and_say
from configurator import UserError, config_defaults, configure, run_cli
from model import GPT, evaluate_perplexity, load_checkpoint, save_checkpoint, start_problem
from runtime import (all_reduce_mean, load_resume_state, resume_file, rng_states, run_signature, save_resume_state,
                     set_rng_states, setup_runtime)
from policy import completion_mask, prompts_and_splits, sample_windows, token_logprobs, warmup_lr
from tokenization_manager import TokenizationInfo
from tracking import TRACKING_DEFAULTS, Tracker

# -----------------------------------------------------------------------------
policy_path = ''  # the previous iterate: the policy trained here, its frozen reference and its default opponent
out_path = 'out-spin/policy.pt'
dataset = ''  # folder with train.bin/val.bin; default: the policy checkpoint's own dataset
# when the run stops: fit the temperature its base's held-out selection tail reads best and record it in the
# checkpoint (calibration.py; sample.py --temperature=calibrated reads it), where the base holds out a tail
calibrate = True
max_steps = 100
batch_size = 16  # prompts per step, each with its real and its generated continuation
min_prompt_len = 1
max_prompt_len = 0  # 0: block_size // 2
temperature = 1.0  # the opponent's sampling
top_k = None
beta = 0.1
loss_type = 'sigmoid'  # 'sigmoid' or 'hinge'
nll_weight = 0.0  # weight of the next-token loss on the real continuation
opponent_paths = ''  # comma-separated earlier iterates (same tokenization) for the opponent mixture
opponent_mix = 0.0  # share of each batch written by one of opponent_paths instead of the previous iterate
learning_rate = 1e-5
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_steps = 10
eval_interval = 20  # also how often the resume state is written
resume = False  # continue an interrupted run from <out stem>_resume.pt when its settings and inputs match
eval_prompts = 64  # held-out val prompts of the margin measured every eval_interval steps
ppl_max_tokens = 100000  # val tokens for the perplexity (0: the whole split)
device = 'auto'
backend = 'auto'
dtype = 'auto'
seed = 1337
# -----------------------------------------------------------------------------
# each number's range and the relations between them, checked by the configurator before anything is read or written
RANGES = dict(max_steps='>= 1', batch_size='>= 1', min_prompt_len='>= 1', max_prompt_len='>= 0', temperature='> 0',
              top_k='>= 1', beta='> 0', nll_weight='>= 0', opponent_mix='[0, 1]', learning_rate='> 0',
              weight_decay='>= 0', beta1='[0, 1)', beta2='[0, 1)', grad_clip='>= 0', warmup_steps='>= 0',
              eval_interval='>= 1', eval_prompts='>= 1', ppl_max_tokens='>= 0', seed='>= 0')
RELATIONS = (('max_prompt_len == 0 or min_prompt_len <= max_prompt_len', "a prompt is min_prompt_len to "
              "max_prompt_len tokens long"),)
DEFAULTS = {**config_defaults(globals()), **TRACKING_DEFAULTS}  # + wandb_log, tensorboard_log, ... (tracking.py)


def spin_loss(logp_real, ref_real, logp_gen, ref_gen, beta, loss_type='sigmoid'):
    """SPIN's loss over sequence log-probabilities (B,) of the real and the generated continuations under the policy
    and the reference; returns (loss, margin m per row)."""
    margin = (logp_real - ref_real) - (logp_gen - ref_gen)
    if loss_type == 'sigmoid':
        return -F.logsigmoid(beta * margin).mean(), margin
    if loss_type == 'hinge':
        return torch.relu(1 - beta * margin).mean(), margin
    raise ValueError(f"loss_type must be 'sigmoid' or 'hinge', got {loss_type!r}")


def pair_logprobs(model, real, generated, mask):
    """Sequence log-probabilities (B,) of the real and generated continuations (summed over mask's target tokens),
    in one forward over both, and the real continuation's per-token log-probs (for the NLL term)."""
    logps = token_logprobs(model, torch.cat([real, generated]), 1.0)[0]
    real_tok, gen_tok = logps.chunk(2)
    return (real_tok * mask).sum(-1), (gen_tok * mask).sum(-1), real_tok


def opponent_batch(windows, lengths, opponents, mix, N, hi, C, gen, rng, rt):
    """The generated continuations: each row's prompt continued by the previous iterate (opponents[0]), or for a
    share mix of the rows (the last ones) by one earlier iterate drawn for this batch."""
    prompt = torch.from_numpy(windows[:, :hi]).to(rt.device)
    plen = torch.from_numpy(lengths).to(rt.device)
    n_mix = int(round(mix * len(windows))) if len(opponents) > 1 else 0
    cut = len(windows) - n_mix
    jobs = [(opponents[0], slice(0, cut))] if cut else []
    if n_mix:
        jobs.append((opponents[1 + rng.integers(len(opponents) - 1)], slice(cut, None)))
    with torch.no_grad(), rt.ctx:
        return torch.cat([opponent.generate(prompt[rows], N - hi, C.temperature, C.top_k, prompt_lengths=plen[rows],
                                            generator=gen) for opponent, rows in jobs])


def load_policy(C, rt):
    ckpt = load_checkpoint(C.policy_path)
    if problem := start_problem(ckpt, C.policy_path):
        raise UserError(problem)
    policy = GPT.from_checkpoint(ckpt, device=rt.device)
    opponents = [copy.deepcopy(policy).requires_grad_(False).eval()]  # the previous iterate: opponent and reference
    for path in [p for p in C.opponent_paths.split(',') if p]:
        other = load_checkpoint(path)
        TokenizationInfo.from_dict(ckpt['tokenization']).check_compatible(
            TokenizationInfo.from_dict(other['tokenization']), f'the policy {C.policy_path}', path)
        opponents.append(GPT.from_checkpoint(other, device=rt.device).requires_grad_(False))
    return ckpt, policy, opponents


def main(argv):
    C = configure(DEFAULTS, argv, RANGES, RELATIONS)
    if not C.policy_path:
        raise UserError("pass --policy_path=PATH (the generator to improve)")
    if C.loss_type not in ('sigmoid', 'hinge'):
        raise UserError(f"loss_type must be sigmoid or hinge, got {C.loss_type!r}")
    if C.opponent_mix > 0 and not C.opponent_paths:
        raise UserError("opponent_mix needs --opponent_paths=EARLIER.pt[,...]")
    rt = setup_runtime(C.device, C.backend, C.dtype, C.seed)
    ckpt, policy, opponents = load_policy(C, rt)
    reference = opponents[0]
    N = policy.config.block_size
    hi, train, val, held_out = prompts_and_splits(C, N, ckpt)
    optimizer = policy.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), rt.device_type)
    trained = DDP(policy) if rt.ddp else policy
    rng = np.random.default_rng([C.seed, rt.rank])
    gen = torch.Generator(device=rt.device).manual_seed(C.seed * 1000 + rt.rank)
    n_rows = max(1, C.batch_size // rt.world_size)
    log_path = os.path.splitext(C.out_path)[0] + '_log.jsonl'

    # held-out pairs, drawn once: val windows and the previous iterate's continuations of their prompts
    eval_windows, eval_lengths = sample_windows(val, C.eval_prompts, C.min_prompt_len, hi, N,
                                                np.random.default_rng(C.seed + 1))
    eval_real = torch.from_numpy(eval_windows).to(rt.device)
    eval_gen = opponent_batch(eval_windows, eval_lengths, opponents[:1], 0.0, N, hi, C,
                              torch.Generator(device=rt.device).manual_seed(C.seed + 1), rng, rt)
    eval_mask = completion_mask(torch.from_numpy(eval_lengths).to(rt.device), N)
    with torch.no_grad(), rt.ctx:
        eval_ref = pair_logprobs(reference, eval_real, eval_gen, eval_mask)[:2]

    @torch.no_grad()
    def heldout():
        with rt.ctx:
            real, generated, _ = pair_logprobs(policy, eval_real, eval_gen, eval_mask)
        return dict(heldout_margin=float(((real - eval_ref[0]) - (generated - eval_ref[1])).mean()),
                    heldout_logp_real=float(real.mean()), heldout_logp_generated=float(generated.mean()),
                    val_ppl=evaluate_perplexity(policy, val, N, ctx=rt.ctx, max_tokens=C.ppl_max_tokens)[1])

    # compute of one step: the opponent's generation, the reference's and the policy's passes over both rows
    flops_per_step = n_rows * rt.world_size * N * (policy.flops_per_token() + 2 * reference.flops_per_token()
                                                    + 2 * policy.flops_per_token(backward=True))
    history, first_step = [], 0
    state_path = resume_file(C.out_path, rt.rank)
    signature = run_signature(vars(C), [C.policy_path] + [p for p in C.opponent_paths.split(',') if p])
    state = load_resume_state(state_path, signature) if C.resume else None
    if state is None:
        start = heldout() if rt.master else None
    else:  # the opponents are their files (checked by the signature); the previous iterate is also the reference
        policy.load_state_dict(state['policy'])
        optimizer.load_state_dict(state['optimizer'])
        reference.load_state_dict(state['reference'])
        set_rng_states(state['rng'], rng, gen)
        history, start, first_step = state['history'], state['start'], state['step']
        if first_step >= C.max_steps:
            raise UserError(f"{state_path} is already at step {first_step}: raise max_steps to continue it")
    tracker = Tracker(C, f"spin/{os.path.basename(os.path.splitext(C.out_path)[0])}",
                      os.path.dirname(os.path.abspath(C.out_path)), rt.master,
                      resume_step=first_step if state is not None else None)
    if rt.master:
        os.makedirs(os.path.dirname(os.path.abspath(C.out_path)), exist_ok=True)
        with open(log_path, 'w') as f:  # a resumed run's log holds exactly the steps it resumed with
            f.writelines(json.dumps(row) + '\n' for row in history)
        print(f"policy {C.policy_path} ({policy.get_num_params() / 1e6:.2f}M), {len(opponents) - 1} earlier "
              f"opponents; {C.batch_size} pairs per step, N={N}, beta {C.beta}, {C.loss_type} loss, NLL weight "
              f"{C.nll_weight}; held-out margin at start {start['heldout_margin']:.3f}, val ppl {start['val_ppl']:.3f}")
    bar = tqdm(total=C.max_steps, initial=first_step, desc='spin', disable=not rt.master, dynamic_ncols=True,
               mininterval=2.0)
    for step in range(first_step, C.max_steps):
        lr = warmup_lr(optimizer, C.learning_rate, C.warmup_steps, step)
        t0 = time.time()
        windows, lengths = sample_windows(train, n_rows, C.min_prompt_len, hi, N, rng)
        generated = opponent_batch(windows, lengths, opponents, C.opponent_mix, N, hi, C, gen, rng, rt)
        real = torch.from_numpy(windows).to(rt.device)
        mask = completion_mask(torch.from_numpy(lengths).to(rt.device), N)
        with torch.no_grad(), rt.ctx:
            ref_real, ref_gen, _ = pair_logprobs(reference, real, generated, mask)
        with rt.ctx:
            logp_real, logp_gen, real_tok = pair_logprobs(trained, real, generated, mask)
        loss, margin = spin_loss(logp_real, ref_real, logp_gen, ref_gen, C.beta, C.loss_type)
        nll = -(real_tok * mask).sum() / mask.sum()
        total = loss + C.nll_weight * nll
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), C.grad_clip or float('inf')).item()
        optimizer.step()
        row = dict(step=step, loss=all_reduce_mean(loss.item(), rt), nll=all_reduce_mean(nll.item(), rt),
                   margin=all_reduce_mean(margin.mean().item(), rt),
                   logp_real=all_reduce_mean(logp_real.mean().item(), rt),
                   logp_generated=all_reduce_mean(logp_gen.mean().item(), rt), grad_norm=grad_norm, lr=lr,
                   time=time.time() - t0)
        if rt.master:
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.4f}", margin=f"{row['margin']:.2f}", refresh=False)
            if (step + 1) % C.eval_interval == 0 or step + 1 == C.max_steps:
                row.update(heldout())
                tqdm.write(f"step {step + 1}: loss {row['loss']:.4f}, margin {row['margin']:.3f} (held out "
                           f"{row['heldout_margin']:.3f}), log p real {row['heldout_logp_real']:.2f}, generated "
                           f"{row['heldout_logp_generated']:.2f}, val ppl {row['val_ppl']:.3f}")
            with open(log_path, 'a') as f:
                f.write(json.dumps(row) + '\n')
            tracker.log(row, step)
        history.append(row)
        if (step + 1) % C.eval_interval == 0 and step + 1 < C.max_steps:
            save_resume_state(state_path, dict(
                signature=signature, step=step + 1, policy=policy.state_dict(), optimizer=optimizer.state_dict(),
                reference=reference.state_dict(), rng=rng_states(rng, gen), history=history, start=start))
    bar.close()
    if rt.master:
        end = history[-1]
        save_checkpoint(C.out_path, policy, iter_num=len(history), config=vars(C), tokenization=ckpt['tokenization'],
                        optimizer=optimizer, held_out=held_out,
                        metrics=dict(history=history, start=start, stop_reason='max_steps',
                                     final_val_ppl=end['val_ppl'], flops=flops_per_step * len(history)))
        if C.calibrate:
            record_and_say(C.out_path, C.dataset, rt.device)
        print(f"done: {len(history)} steps; held-out margin {start['heldout_margin']:.3f} -> "
              f"{end['heldout_margin']:.3f}, log p real {start['heldout_logp_real']:.2f} -> "
              f"{end['heldout_logp_real']:.2f}, generated {start['heldout_logp_generated']:.2f} -> "
              f"{end['heldout_logp_generated']:.2f}; val ppl {start['val_ppl']:.3f} -> {end['val_ppl']:.3f}; "
              f"{flops_per_step * len(history):.3g} FLOPs; saved {C.out_path}, log {log_path}")
    if os.path.exists(state_path):  # finished: nothing left to resume
        os.remove(state_path)
    tracker.close()
    rt.close()


if __name__ == '__main__':
    run_cli(main)
