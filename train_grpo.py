"""
GRPO (Group Relative Policy Optimization, DeepSeekMath 2024; as TRL's GRPOTrainer defines it) of the generator
against a frozen reward model whose P(natural) is the reward.

  python train_grpo.py [config/grpo_*.py] --policy_path=BASE.pt --reward_model_path=RM.pt --out_path=NEW.pt

Each step: prompts of random length P ~ U[min_prompt_len, max_prompt_len] from random offsets of the train split;
num_generations completions per prompt, continued to exactly block_size tokens by the one KV-cache sampler;
group-normalized advantages; a clipped-ratio loss over completion tokens with a k3 KL penalty to a frozen
reference; num_iterations optimizer passes over each batch of rollouts.

A rollout is a crossover sample with K = P (natural prompt, generated tail), labelled P/N as prepare_reward_data
labels it, so every step also measures the judge on samples it has never seen (judge_r2, judge_boundary_error in
the log). With judge_update_interval=k the judge keeps up (GAD, TextGAIL): every k steps its head takes judge_steps
optimizer steps on the latest rollouts and a replay of earlier steps' (its trunk stays frozen, so the features the
scoring pass computed are all it needs); the final judge is saved beside the policy as *_judge.pt. A pairwise judge
(train_reward_model.py --loss=pairwise) is also scored against each prompt's natural window: how often it ranks
that window above the rollout is logged (judge_pair_accuracy), and online it learns from those pairs.

A token judge (reward_pooling='token') scores each completion by its mean P(natural) over the completion's
positions; with token_advantages=True each completion token gets its own advantage instead: the discounted sum of
the judge's per-token P(natural) from that token on (token_discount; ScratchGAN's per-step rewards), normalised
position by position within the group.

With nll_weight > 0 real text stays in the loss: each update adds that weight times the next-token loss of the
corpus' own continuation of each step's prompts (the natural windows the prompts were cut from), the pull towards
the corpus that TextGAIL gets from human text in its buffer and SPIN from its NLL term.
"""

import copy
import json
import os
import time
from collections import deque

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import UserError, config_defaults, configure, run_cli
from early_stopping import EarlyStopping
from model import SAMPLERS, GPT, evaluate_perplexity, load_checkpoint, save_checkpoint, sequence_probs, softmax_entropy
from reward_data_config import TokenizationInfo
from runtime import (all_reduce_mean, broadcast_stop, load_resume_state, resume_file, rng_states, run_signature,
                     save_resume_state, set_rng_states, setup_runtime)
from tokenization_manager import TokenizationManager
from train import resolve_data_dir
from train_reward_model import judge_loss, pair_accuracy, pairwise_loss, reward_metrics

# -----------------------------------------------------------------------------
policy_path = ''  # the generator to improve (also the frozen reference)
reward_model_path = ''  # the frozen judge
out_path = 'out-grpo/policy.pt'
dataset = ''  # folder with train.bin/val.bin; default: the policy checkpoint's own dataset
# rollouts
max_steps = 100
prompts_per_step = 8
num_generations = 8  # G completions per prompt
min_prompt_len = 1
max_prompt_len = 0  # 0: block_size // 2
temperature = 1.0
top_k = None
sampler = 'auto'  # GPT.generate's decode loop: 'auto' (a CUDA graph on CUDA), 'eager', 'static', 'graph', 'compile'
# objective
scale_rewards = 'group'  # 'group', 'batch' or 'none'
token_advantages = False  # a token judge only: per-token advantages from its per-position P(natural)
token_discount = 0.23  # their discount (ScratchGAN's)
loss_type = 'grpo'  # 'grpo', 'dr_grpo' or 'dapo'
epsilon = 0.2
epsilon_high = None  # None: epsilon
beta = 0.04  # KL penalty weight (0: no reference model unless max_kl needs one)
num_iterations = 1  # mu: optimizer passes over each batch of rollouts
# optimizer
learning_rate = 1e-5
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_steps = 10
# stopping
reward_threshold = 0.9  # stop when the moving average of the mean reward reaches this (not for a pairwise judge)
reward_window = 10  # steps in that moving average
patience = 0  # steps without the moving average improving by min_delta (0 disables)
min_delta = 0.0
max_kl = 0.0  # stop when the mean KL to the reference exceeds this, keeping the last policy under it (0 disables)
# online judge: 0 keeps the judge frozen (the seed's design); k > 0 trains its head every k steps on the rollouts
judge_update_interval = 0
judge_steps = 4  # judge optimizer steps per update
judge_learning_rate = 1e-3
judge_batch_size = 64
judge_replay = 8  # earlier steps' rollouts replayed beside the latest, so the judge keeps what it caught before
# the judge-off ablation: every reward is the constant 0.5, so every advantage is 0 and only the KL anchor and the
# NLL term move the policy (the same trainer, settings and compute with the judge's signal removed)
judge_off = False
# real text in the loss (TextGAIL keeps human text in its RL buffer; SPIN's fix for falling likelihoods): this weight
# times the next-token loss of the corpus' own continuation of each step's prompts (0: the seed's pure GRPO)
nll_weight = 0.0
# evaluation
eval_interval = 20  # also how often the resume state is written
resume = False  # continue an interrupted run from <out stem>_resume.pt when its settings and inputs match
ppl_max_tokens = 100000  # val tokens for the perplexity (0: the whole split)
num_log_samples = 2
# system
backend = 'auto'
device = 'auto'
dtype = 'auto'
seed = 1337
# -----------------------------------------------------------------------------
DEFAULTS = config_defaults(globals())


def group_advantages(rewards, group_size, scale='group'):
    """
    (r - group mean) / (std + 1e-4), std of the group ('group'), of the whole batch ('batch'), or none ('none').
    Returns (advantages, number of groups whose rewards are all equal: their advantages are exactly 0, mean raw
    within-group std: what 'group' scaling divides by, so a judge whose rewards barely differ is visible in the log).
    """
    groups = rewards.view(-1, group_size)
    centered = center_and_scale(groups, scale, rewards.std())
    zero_std = int((groups.std(dim=1) == 0).sum()) if group_size > 1 else groups.size(0)
    group_std = float(groups.std(dim=1).nan_to_num(0.0).mean()) if group_size > 1 else 0.0
    return centered.reshape(-1), zero_std, group_std


def center_and_scale(groups, scale, batch_std):
    """groups (n_groups, group_size, ...) minus each group's mean, divided by the group's std + 1e-4 ('group'), by
    batch_std + 1e-4 ('batch') or by nothing ('none')."""
    centered = groups - groups.mean(dim=1, keepdim=True)
    if scale == 'group':
        return centered / (groups.std(dim=1, keepdim=True).nan_to_num(0.0) + 1e-4)
    if scale == 'batch':
        return centered / (batch_std.nan_to_num(0.0) + 1e-4)
    if scale != 'none':
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale!r}")
    return centered


def token_advantages_of(token_rewards, positions_mask, group_size, discount, scale='group'):
    """
    Per-token advantages (B, T-1) aligned with the next-token targets, from per-position rewards (B, T) over the
    completion (positions_mask (B, T): 1 at generated positions): the discounted return from each position on,
    centred on its group's mean at the same position (the rows of a group share their prompt length, so positions
    line up) and scaled by the group's, the batch's or no std. Target j produces position j + 1.
    """
    r = token_rewards * positions_mask
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.size(1) - 1, -1, -1):
        running = r[:, t] + discount * running
        returns[:, t] = running
    centered = center_and_scale(returns.view(-1, group_size, returns.size(1)), scale,
                                returns[positions_mask.bool()].std())
    return (centered.reshape_as(returns) * positions_mask)[:, 1:]


def generated_positions(prompt_lengths, seq_len):
    """(B, seq_len) mask of the positions a row's completion fills: position t iff t >= its prompt length P."""
    return (torch.arange(seq_len, device=prompt_lengths.device)[None, :] >= prompt_lengths[:, None]).float()


def completion_mask(prompt_lengths, seq_len):
    """(B, seq_len - 1) mask over next-token targets: target j (token j + 1) is a completion token iff j + 1 >= P."""
    return generated_positions(prompt_lengths, seq_len)[:, 1:]


def token_logprobs(model, seqs, temperature, entropy=False, chunk=8):
    """
    Log-probabilities (B, T-1) of each next token, from logits scaled by the sampling temperature, and with
    entropy=True each position's entropy (B, T-1, no gradient). Only the logits (B, T-1, V) stay alive for the
    backward: the normaliser and the entropy are computed `chunk` rows at a time, so a 50k-token vocabulary never
    holds a full log-softmax (or its entropy terms) beside them.
    """
    logits = model(seqs[:, :-1], all_logits=True)[0].float() / temperature
    targets = seqs[:, 1:, None]
    logps, entropies = [], []
    for i in range(0, len(seqs), chunk):
        rows = logits[i:i + chunk]
        lse = torch.logsumexp(rows, dim=-1)
        logps.append(rows.gather(-1, targets[i:i + chunk]).squeeze(-1) - lse)
        if entropy:
            with torch.no_grad():
                entropies.append(softmax_entropy(rows))
    return torch.cat(logps), (torch.cat(entropies) if entropy else None)


def k3_kl(logps, ref_logps):
    """Per-token k3 estimate of KL(policy || reference): unbiased, always >= 0."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, epsilon=0.2, epsilon_high=None, beta=0.0,
              loss_type='grpo', max_completion_length=None):
    """
    Clipped-ratio policy loss over completion tokens plus beta * k3 KL to the reference; returns (loss, stats).
    logps, old_logps, ref_logps, mask: (B, T); advantages: (B,) or per token (B, T).
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(logps - old_logps)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # per sequence, or per token (B, T)
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * adv)
    kl = None
    if ref_logps is not None:
        kl = k3_kl(logps, ref_logps)
        if beta:
            per_token = per_token + beta * kl
    if loss_type == 'grpo':
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    elif loss_type == 'dr_grpo':
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    elif loss_type == 'dapo':
        loss = (per_token * mask).sum() / mask.sum().clamp_min(1)
    else:
        raise ValueError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {loss_type!r}")
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    n = mask.sum().clamp_min(1)
    stats = {'clip_ratio': ((clipped.float() * mask).sum() / n).item(),
             'kl': None if kl is None else ((kl * mask).sum() / n).item()}
    return loss, stats


def judge_update(head, optimizer, replay, steps, batch_size, loss_kind, gen, rt):
    """steps optimizer steps of the judge's head on minibatches of the replay buffer ((features, labels, and for a
    pairwise judge the features of each rollout's natural window) of the latest and earlier rollouts); gradients
    averaged over ranks. Returns the mean loss."""
    feats, labels = torch.cat([r[0] for r in replay]), torch.cat([r[1] for r in replay])
    natural = torch.cat([r[2] for r in replay]) if loss_kind == 'pairwise' else None
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(feats), (batch_size,), generator=gen).to(feats.device)
        if natural is not None:  # each rollout against its prompt's natural window, through one forward
            out = head(torch.cat([feats[rows], natural[rows]]))
            loss = pairwise_loss(out[batch_size:], out[:batch_size])
        else:
            loss = judge_loss(head(feats[rows]), labels[rows], loss_kind)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rt.ddp:
            for p in head.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad.div_(rt.world_size)
        optimizer.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def warmup_lr(optimizer, learning_rate, warmup_steps, step):
    """Linear warmup to learning_rate over warmup_steps, then constant; set on the optimizer and returned."""
    lr = learning_rate * min(1.0, (step + 1) / max(1, warmup_steps))
    for group in optimizer.param_groups:
        group['lr'] = lr
    return lr


def prompts_and_splits(C, block_size, ckpt):
    """The largest prompt length (C.max_prompt_len, default block_size // 2; checked) and the memory-mapped train
    and val splits of C.dataset (default: the checkpoint's own dataset)."""
    hi = C.max_prompt_len or block_size // 2
    if not 1 <= C.min_prompt_len <= hi < block_size:
        raise UserError(f"need 1 <= min_prompt_len <= max_prompt_len < block_size ({block_size}); "
                        f"got {C.min_prompt_len}, {hi}")
    data_dir = resolve_data_dir(C.dataset or ckpt.get('config', {}).get('dataset', ''))
    return hi, *(np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
                 for split in ('train', 'val'))


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


def plot_history(history, path):
    """Reward (mean and std band), KL and clip ratio, and the judge's R² on fresh rollouts over the steps, as a PNG."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    steps = [h['step'] for h in history]
    reward, std = np.array([h['reward'] for h in history]), np.array([h['reward_std'] for h in history])
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    axes[0].plot(steps, reward, label='mean reward P(natural)')
    axes[0].fill_between(steps, reward - std, reward + std, alpha=0.2, label='± std')
    axes[0].set(xlabel='step', title='reward')
    if history and history[0]['kl'] is not None:
        axes[1].plot(steps, [h['kl'] for h in history], label='KL to reference')
    axes[1].plot(steps, [h['clip_ratio'] for h in history], label='clip ratio')
    axes[1].set(xlabel='step', title='KL and clipping')
    r2 = np.array([h['judge_r2'] for h in history])
    smooth = np.convolve(r2, np.ones(min(10, len(r2))) / min(10, len(r2)), mode='valid')
    axes[2].plot(steps, r2, alpha=0.3, label="judge R² on each step's rollouts")
    axes[2].plot(steps[len(steps) - len(smooth):], smooth, label='moving average (10 steps)')
    axes[2].set(xlabel='step', title='the judge on samples it has not seen')
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_models(C, rt):
    policy_ckpt = load_checkpoint(C.policy_path)
    rm_ckpt = load_checkpoint(C.reward_model_path)
    if policy_ckpt['model_args'].get('mode', 'generator') != 'generator':
        raise UserError(f"{C.policy_path} is a reward model; --policy_path takes a generator checkpoint")
    if rm_ckpt['model_args'].get('mode') != 'reward':
        raise UserError(f"{C.reward_model_path} is not a reward model; train one with train_reward_model.py")
    tok = TokenizationInfo.from_dict(policy_ckpt['tokenization'])
    tok.check_compatible(TokenizationInfo.from_dict(rm_ckpt['tokenization']), 'the policy', 'the reward model')
    policy = GPT.from_checkpoint(policy_ckpt, device=rt.device)
    reward_model = GPT.from_checkpoint(rm_ckpt, device=rt.device).requires_grad_(False)
    N = policy.config.block_size
    if reward_model.config.block_size < N:
        raise UserError(f"the reward model's block size {reward_model.config.block_size} is below the policy's "
                        f"{N}: it cannot score whole sequences")
    if rm_ckpt.get('data_block_size', N) != N:  # its P(natural) means the share of N natural tokens it saw
        raise UserError(f"{C.reward_model_path} was trained on sequences of {rm_ckpt['data_block_size']} tokens, but "
                        f"GRPO scores sequences of the policy's block size {N}: train it on reward data of length {N}")
    reference = None
    if C.beta > 0 or C.max_kl > 0:
        reference = copy.deepcopy(policy).requires_grad_(False).eval()
    return policy_ckpt, rm_ckpt, policy, reward_model, reference


def main(argv):
    C = configure(DEFAULTS, argv)
    for name in ('policy_path', 'reward_model_path'):
        if not getattr(C, name):
            raise UserError(f"pass --{name}=PATH")
    if C.scale_rewards not in ('group', 'batch', 'none') or C.loss_type not in ('grpo', 'dr_grpo', 'dapo'):
        raise UserError("scale_rewards must be group|batch|none and loss_type grpo|dr_grpo|dapo")
    if C.num_generations < 2 or C.temperature <= 0 or C.num_iterations < 1:
        raise UserError("num_generations must be >= 2, temperature > 0 and num_iterations >= 1")
    if C.sampler not in SAMPLERS:
        raise UserError(f"sampler must be one of {', '.join(SAMPLERS)}, got {C.sampler!r}")
    if C.judge_update_interval < 0 or C.judge_steps < 1 or C.judge_replay < 0 or C.judge_batch_size < 1:
        raise UserError("judge_update_interval and judge_replay must be >= 0, judge_steps and judge_batch_size >= 1")
    rt = setup_runtime(C.device, C.backend, C.dtype, C.seed)
    if C.prompts_per_step % rt.world_size:
        raise UserError(f"prompts_per_step {C.prompts_per_step} must divide by the {rt.world_size} ranks")
    policy_ckpt, rm_ckpt, policy, reward_model, reference = load_models(C, rt)
    if C.token_advantages and reward_model.config.reward_pooling != 'token':
        raise UserError(f"token_advantages needs a token judge; {C.reward_model_path} pools by "
                        f"'{reward_model.config.reward_pooling}': train one with --reward_pooling=token")
    judge_path = os.path.splitext(C.out_path)[0] + '_judge.pt'
    judge_opt, judge_gen, replay, judge_flops = None, None, deque(maxlen=C.judge_replay + 1), 0
    judge_loss_kind = rm_ckpt.get('config', {}).get('loss', 'mse')  # the judge keeps the loss it was trained with
    if C.judge_update_interval:
        reward_model.reward_head.requires_grad_(True)
        judge_opt = torch.optim.AdamW(reward_model.reward_head.parameters(), lr=C.judge_learning_rate,
                                      betas=(0.9, 0.99), weight_decay=0.0)
        judge_gen = torch.Generator().manual_seed(C.seed * 1000 + 7 + rt.rank)
        head_params = sum(p.numel() for p in reward_model.reward_head.parameters())
    N = policy.config.block_size
    hi, train, val = prompts_and_splits(C, N, policy_ckpt)
    tokenizer = TokenizationManager.from_info(policy_ckpt['tokenization'])
    optimizer = policy.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), rt.device_type)
    trained = DDP(policy) if rt.ddp else policy
    rng = np.random.default_rng([C.seed, rt.rank])
    gen = torch.Generator(device=rt.device).manual_seed(C.seed * 1000 + rt.rank)
    n_prompts = C.prompts_per_step // rt.world_size
    max_completion = N - C.min_prompt_len
    log_path = os.path.splitext(C.out_path)[0] + '_log.jsonl'
    state_path = resume_file(C.out_path, rt.rank)
    signature = run_signature(vars(C), [C.policy_path, C.reward_model_path])
    state = load_resume_state(state_path, signature) if C.resume else None

    def val_ppl():
        return evaluate_perplexity(policy, val, N, batch_size=32, ctx=rt.ctx, max_tokens=C.ppl_max_tokens)[1]

    def save(step, stop_reason, **final):
        save_checkpoint(C.out_path, policy, iter_num=step, best_val_loss=None, config=vars(C),
                        tokenization=policy_ckpt['tokenization'], optimizer=optimizer,
                        metrics=dict(history=history, stop_reason=stop_reason, val_ppl_start=ppl_start,
                                     ppl_tokens=ppl_tokens, flops=flops_per_step * len(history) + judge_flops,
                                     **final))
        if C.judge_update_interval:  # the judge as it stands, loadable wherever a reward model is
            save_checkpoint(judge_path, reward_model, iter_num=step, config=dict(rm_ckpt.get('config', {}),
                            online_from=os.path.abspath(C.reward_model_path)), tokenization=rm_ckpt['tokenization'],
                            data_block_size=N, metrics={k: history[-1][k] for k in history[-1] if k.startswith('judge')})

    # compute of one step (FLOPs, 2 per parameter per token forward, 6 with the backward): generation, judge,
    # reference, and num_iterations forward+backward passes of the policy, over every rank's rows
    rows = C.prompts_per_step * C.num_generations
    flops_per_step = rows * N * (policy.flops_per_token() + reward_model.flops_per_token()
                                 + (reference.flops_per_token() if reference is not None else 0)
                                 + C.num_iterations * policy.flops_per_token(backward=True))
    flops_per_step += (C.prompts_per_step * N * C.num_iterations * policy.flops_per_token(backward=True)
                       if C.nll_weight else 0)  # the natural continuations' forward and backward
    flops_per_step += C.prompts_per_step * N * reward_model.flops_per_token() if judge_loss_kind == 'pairwise' else 0
    ppl_tokens = 'whole val split' if not C.ppl_max_tokens else f'first {min(C.ppl_max_tokens, len(val)):,} val tokens'

    history, reward_ma = [], deque(maxlen=C.reward_window)
    stopper = EarlyStopping(C.patience, C.min_delta, 'max')
    last_ok_state, last_ok_step, stop_reason, step, first_step = None, 0, 'max_steps', 0, 0
    if state is None:
        ppl_start = val_ppl() if rt.master else None
    else:  # everything the next step reads, as the interrupted run left it after its step state['step'] - 1
        policy.load_state_dict(state['policy'])
        optimizer.load_state_dict(state['optimizer'])
        if reference is not None:
            reference.load_state_dict(state['reference'])
        if judge_opt is not None:
            reward_model.reward_head.load_state_dict(state['judge'])
            judge_opt.load_state_dict(state['judge_optimizer'])
            replay.extend(tuple(None if t is None else t.to(rt.device) for t in r) for r in state['replay'])
        set_rng_states(state['rng'], rng, gen, judge_gen)
        history, ppl_start, judge_flops = state['history'], state['ppl_start'], state['judge_flops']
        reward_ma.extend(state['reward_ma'])
        stopper.load_state_dict(state['stopper'])
        last_ok_state, last_ok_step, first_step = state['last_ok_state'], state['last_ok_step'], state['step']
        if first_step >= C.max_steps:
            raise UserError(f"{state_path} is already at step {first_step}: raise max_steps to continue it")
    if rt.master:
        os.makedirs(os.path.dirname(os.path.abspath(C.out_path)), exist_ok=True)
        with open(log_path, 'w') as f:  # a resumed run's log holds exactly the steps it resumed with
            f.writelines(json.dumps(row) + '\n' for row in history)
        print(f"policy {C.policy_path} ({policy.get_num_params() / 1e6:.2f}M), reward model {C.reward_model_path}; "
              f"{C.prompts_per_step} prompts x {C.num_generations} completions per step, N={N}; "
              f"val ppl ({ppl_tokens}) at start {ppl_start:.3f}"
              + (f"; resumed at step {first_step} from {state_path}" if state else '')
              + ('; judge OFF: constant reward, zero advantages' if C.judge_off else ''))

    def save_state(step):
        """Everything an exact continuation needs after this step (each rank its own draws and replay)."""
        save_resume_state(state_path, dict(
            signature=signature, step=step, policy=policy.state_dict(), optimizer=optimizer.state_dict(),
            reference=reference.state_dict() if reference is not None else None,
            judge=reward_model.reward_head.state_dict() if judge_opt is not None else None,
            judge_optimizer=judge_opt.state_dict() if judge_opt is not None else None,
            replay=[tuple(r) for r in replay], rng=rng_states(rng, gen, judge_gen), history=history,
            ppl_start=ppl_start, judge_flops=judge_flops, reward_ma=list(reward_ma), stopper=stopper.state_dict(),
            last_ok_state=last_ok_state, last_ok_step=last_ok_step))

    bar = tqdm(total=C.max_steps, initial=first_step, desc='grpo', disable=not rt.master, dynamic_ncols=True,
               mininterval=2.0)
    for step in range(first_step, C.max_steps):
        lr = warmup_lr(optimizer, C.learning_rate, C.warmup_steps, step)
        # 1. rollouts: G completions per prompt, all rows advancing together in one cached batch
        t0 = time.time()
        prompts, lengths, windows = sample_prompts(train, n_prompts, C.min_prompt_len, hi, N, rng)
        prompt_t = torch.from_numpy(np.repeat(prompts, C.num_generations, axis=0)).to(rt.device)
        lengths_t = torch.from_numpy(np.repeat(lengths, C.num_generations)).to(rt.device)
        with rt.ctx:
            seqs = policy.generate(prompt_t, N - hi, C.temperature, C.top_k, prompt_lengths=lengths_t, generator=gen,
                                   sampler=C.sampler)
        t1 = time.time()
        # 2. rewards and advantages; the judge's figures on these rollouts, which it has not seen yet
        with torch.no_grad(), rt.ctx:
            feats = reward_model.reward_features(seqs)
            probs = reward_model.reward_head(feats).float()  # (B, 2), or (B, N, 2) by position for a token judge
        generated = generated_positions(lengths_t, N)
        judged, p_natural = probs[..., 0], sequence_probs(probs)[:, 0]  # P(natural); the sequence's estimates K/N
        # a token judge rewards the completion's own positions; a pooled judge's one figure is the reward
        rewards = (judged * generated).sum(1) / generated.sum(1) if judged.dim() == 2 else p_natural
        if C.judge_off:  # the ablation: the judge still scores (and is logged), but its signal never reaches the loss
            rewards, judged = torch.full_like(rewards, 0.5), torch.full_like(judged, 0.5)
        advantages, zero_std, group_std = group_advantages(rewards, C.num_generations, C.scale_rewards)
        if C.token_advantages:
            advantages = token_advantages_of(judged, generated, C.num_generations, C.token_discount, C.scale_rewards)
        natural_share = lengths_t.float() / N  # the crossover label of a rollout: K = its prompt length
        judge_fresh = reward_metrics(p_natural.cpu().numpy(), natural_share.cpu().numpy(), N,
                                     float(natural_share.mean()))
        mask = generated[:, 1:]  # completion_mask: the completion's next-token targets
        real = torch.from_numpy(windows).to(rt.device)
        real_mask = completion_mask(torch.from_numpy(lengths).to(rt.device), N)
        if judge_loss_kind == 'pairwise':  # a pairwise judge: each rollout's natural window, its pair's other half
            with torch.no_grad(), rt.ctx:
                real_feats = reward_model.reward_features(real).float().repeat_interleave(C.num_generations, 0)
            pair_acc = pair_accuracy(reward_model.reward_head(real_feats), probs)
        with torch.no_grad(), rt.ctx:
            ref_logps = token_logprobs(reference, seqs, C.temperature)[0] if reference is not None else None
        t2 = time.time()
        # 3. mu optimizer passes over these rollouts; the first pass fixes the rollout log-probs (ratio exactly 1)
        # the policy that made these rollouts, kept while its KL is under the cap
        pre_update = {k: v.detach().clone() for k, v in policy.state_dict().items()} if C.max_kl else None
        # the policy stays in eval mode: no dropout in its log-probs (TRL's disable_dropout)
        old_logps, stats, nll = None, {}, None
        for _ in range(C.num_iterations):
            with rt.ctx:
                logps, token_entropy = token_logprobs(trained, seqs, C.temperature, entropy=old_logps is None)
            if old_logps is None:
                old_logps = logps.detach()
                entropy = (token_entropy * mask).sum() / mask.sum()
            loss, pass_stats = grpo_loss(logps, old_logps, ref_logps, advantages, mask, C.epsilon, C.epsilon_high,
                                         C.beta, C.loss_type, max_completion)
            stats = stats or pass_stats  # KL of the rollout policy: measured on the first pass
            stats['clip_ratio'] = pass_stats['clip_ratio']
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if C.nll_weight:  # its own forward and backward: DDP allows one forward per backward
                with rt.ctx:
                    real_logps = token_logprobs(trained, real, 1.0)[0]
                nll = -(real_logps * real_mask).sum() / real_mask.sum()
                (C.nll_weight * nll).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), C.grad_clip or float('inf')).item()
            optimizer.step()
        judge_loss = None
        if C.judge_update_interval:
            replay.append((feats.float().detach(), torch.stack([natural_share, 1 - natural_share], dim=1),
                           real_feats if judge_loss_kind == 'pairwise' else None))
            if (step + 1) % C.judge_update_interval == 0:
                judge_loss = judge_update(reward_model.reward_head, judge_opt, replay, C.judge_steps,
                                          C.judge_batch_size, judge_loss_kind, judge_gen, rt)
                judge_flops += 6 * head_params * C.judge_batch_size * C.judge_steps * rt.world_size
        t3 = time.time()

        row = dict(step=step, reward=all_reduce_mean(rewards.mean().item(), rt),
                   reward_std=all_reduce_mean(rewards.std().item(), rt), reward_group_std=all_reduce_mean(group_std, rt),
                   frac_reward_zero_std=all_reduce_mean(zero_std / n_prompts, rt),
                   kl=None if stats['kl'] is None else all_reduce_mean(stats['kl'], rt),
                   clip_ratio=all_reduce_mean(stats['clip_ratio'], rt), entropy=all_reduce_mean(entropy.item(), rt),
                   grad_norm=grad_norm, loss=loss.item(), lr=lr,
                   completion_length=float(N - lengths.mean()), time_generation=t1 - t0, time_scoring=t2 - t1,
                   time_update=t3 - t2, judge_r2=all_reduce_mean(judge_fresh['r2'], rt),
                   judge_boundary_error=all_reduce_mean(judge_fresh['boundary_error'], rt), judge_loss=judge_loss,
                   nll=None if nll is None else all_reduce_mean(nll.item(), rt),
                   judge_pair_accuracy=all_reduce_mean(pair_acc, rt) if judge_loss_kind == 'pairwise' else None)
        history.append(row)
        reward_ma.append(row['reward'])
        stop = False
        if rt.master:
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", kl=f"{row['kl'] or 0:.4f}", refresh=False)
            if C.max_kl and row['kl'] is not None and row['kl'] > C.max_kl:
                stop, stop_reason = True, f"max_kl: mean KL {row['kl']:.4f} exceeded {C.max_kl} at step {step}"
            else:
                last_ok_state, last_ok_step = pre_update, step
                ma = sum(reward_ma) / len(reward_ma)
                # Bradley-Terry fixes only differences of a pairwise judge's scores: its level says nothing
                if len(reward_ma) == C.reward_window and ma >= C.reward_threshold and judge_loss_kind != 'pairwise':
                    stop, stop_reason = True, f"reward_threshold: moving average {ma:.4f} >= {C.reward_threshold}"
                elif len(reward_ma) == C.reward_window:
                    stopper.step(ma)
                    if stopper.should_stop:
                        stop, stop_reason = True, (f"plateau: reward moving average did not improve by {C.min_delta} "
                                                   f"for {C.patience} steps")
            if (step + 1) % C.eval_interval == 0 or step + 1 == C.max_steps or stop:
                row['val_ppl'] = val_ppl()
                tqdm.write(f"step {step + 1}: reward {row['reward']:.4f} (std {row['reward_std']:.4f}), "
                           f"judge on fresh rollouts R2 {row['judge_r2']:.3f}, "
                           f"kl {row['kl'] if row['kl'] is None else round(row['kl'], 5)}, clip {row['clip_ratio']:.4f}, "
                           f"entropy {row['entropy']:.3f}, val ppl {row['val_ppl']:.3f}; time gen/score/update "
                           f"{row['time_generation']:.2f}/{row['time_scoring']:.2f}/{row['time_update']:.2f}s")
                for s in seqs[:C.num_log_samples * C.num_generations:C.num_generations].tolist():
                    tqdm.write('  | ' + tokenizer.decode(s)[-120:].replace('\n', '\n  | '))
                if not stop and step + 1 < C.max_steps:  # the last step's checkpoint is the final save below
                    save(step + 1, None)
            with open(log_path, 'a') as f:
                f.write(json.dumps(row) + '\n')
        if broadcast_stop(stop, rt):
            break
        if (step + 1) % C.eval_interval == 0 and step + 1 < C.max_steps:
            save_state(step + 1)
    bar.close()
    if rt.master:
        if stop_reason.startswith('max_kl'):  # keep the last policy under the cap: its KL is its own rollouts'
            if last_ok_state is None:
                raise UserError(f"the starting policy already exceeds max_kl={C.max_kl}; raise --max_kl")
            policy.load_state_dict(last_ok_state)
            final_step, final_kl, final_ppl = last_ok_step, history[last_ok_step]['kl'], val_ppl()
            print(f"kept the policy of step {last_ok_step}, the last under the KL cap")
        else:  # the updated policy: its KL measured on the last rollouts, its perplexity logged after the update
            final_step, final_ppl, final_kl = step + 1, history[-1]['val_ppl'], None
            if reference is not None:
                with torch.no_grad(), rt.ctx:
                    logps = token_logprobs(policy, seqs, C.temperature)[0]
                final_kl = float((k3_kl(logps, ref_logps) * mask).sum() / mask.sum())
        save(final_step, stop_reason, final_kl=final_kl, final_val_ppl=final_ppl, judge_off=C.judge_off)
        first = [h['reward'] for h in history[:10]]
        last = [h['reward'] for h in history[-10:]]
        t = {k: sum(h[f'time_{k}'] for h in history) for k in ('generation', 'scoring', 'update')}
        print(f"done: {len(history)} steps; stopped by {stop_reason}")
        print(f"mean reward: first {len(first)} steps {np.mean(first):.4f}, last {len(last)} steps {np.mean(last):.4f}; "
              f"saved policy: val ppl ({ppl_tokens}) {ppl_start:.3f} -> {final_ppl:.3f}, KL to the reference "
              f"{'–' if final_kl is None else format(final_kl, '.4f')}; {flops_per_step * len(history):.3g} FLOPs")
        total = sum(t.values())
        plot_path = os.path.splitext(C.out_path)[0] + '_curves.png'
        plot_history(history, plot_path)
        print("time: " + ', '.join(f"{k} {v:.1f}s ({100 * v / total:.0f}%)" for k, v in t.items())
              + f"; saved {C.out_path}, log {log_path}, plot {plot_path}")
    if os.path.exists(state_path):  # finished: nothing left to resume
        os.remove(state_path)
    rt.close()


if __name__ == '__main__':
    run_cli(main)
