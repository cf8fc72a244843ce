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
the log), and its sight: the AUC at ranking a fixed set of natural val windows, which no judge trains on, above the
rollouts, both scored in the same pass and precision (judge_sight, an instrument: its extra scoring pass is not
counted in the run's FLOPs). With judge_update_interval=k the judge keeps
up (GAD, TextGAIL): every k steps its head takes judge_steps optimizer steps on the latest rollouts and a replay of
earlier steps' (its trunk stays frozen, so the features the scoring pass computed are all it needs); the final
judge is saved beside the policy as *_judge.pt (the n-gram judge, --judge=ngram, as *_judge.json: the texts it was
fitted on). A pairwise judge (train_reward_model.py --loss=pairwise) is also
scored against each prompt's natural window: how often it ranks that window above the rollout is logged
(judge_pair_accuracy), and online it learns from those pairs.

A token judge (reward_pooling='token') scores each completion by its mean P(natural) over the completion's
positions; with token_advantages=True each completion token gets its own advantage instead: the discounted sum of
the judge's per-token P(natural) from that token on (token_discount; ScratchGAN's per-step rewards), normalised
position by position within the group.

With nll_weight > 0 real text stays in the loss: each update adds that weight times the next-token loss of the
corpus' own continuation of each step's prompts (the natural windows the prompts were cut from), the pull towards
the corpus that TextGAIL gets from human text in its buffer and SPIN from its NLL term.

The reward is one function of rewards.py (--reward: the judge's, a positive control's, or a user's module:function).
The game whose fixed point is the judge's tilt pi_ref·e^{a·f}: --reward_form=log_odds, --kl_in_reward=True, --beta=0,
--scale_rewards=none (reward_scale: a); or, towards the same tilt by distribution matching, --objective=dpg,
resample_mle or judge_teacher (docs/grpo_cycle.md, "The fixed point made right, and distribution matching").
"""

import copy
import functools
import json
import os
import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from calibration import record_and_say
from configurator import UserError, config_defaults, configure, run_cli
from early_stopping import EarlyStopping
from auc import sight_auc
from judge import NgramJudge, freeze_trunk, judge_update, pair_accuracy, reward_metrics
from data_loader import words_known_in
from model import (SAMPLERS, GPT, evaluate_perplexity, load_checkpoint, save_checkpoint, sequence_probs,
                   start_problem)
from policy import (completion_mask, generated_positions, prompts_and_splits, sample_prompts, sample_windows,
                    token_logprobs, warmup_lr)
from rewards import NEEDS_TEACHER, combined_reward, kl_regularised, reward_names
from runtime import (all_reduce_mean, broadcast_stop, gather_lists, global_std, global_sum, load_resume_state,
                     resume_file, rng_states, run_signature, save_resume_state, set_rng_states, setup_runtime)
from tokenization_manager import TokenizationInfo, TokenizationManager
from tilt import judge_token_scores
from tracking import TRACKING_DEFAULTS, Tracker
from worth import effective_sample_size, tilt_choice
from two_sample import continuation_texts, eval_windows, two_sample_test

# -----------------------------------------------------------------------------
policy_path = ''  # the generator to improve (also the frozen reference)
reward_model_path = ''  # the frozen judge
# the judge that plays: 'model', the reward model at reward_model_path; 'ngram', a judge outside the GPT form
# (judge.py's NgramJudge: the two-sample test's classifier on the completions' text), no reward model, refit from
# scratch every judge_update_interval steps on the replay's rollouts against natural continuations (its prompts' own
# and judge_natural_windows more), first on judge_warmup_steps batches before the policy moves; or, with
# reward_model_path=JUDGE.json (judge.NgramJudge.save's file, e.g. bench_judge_curve.py's), that judge played frozen
judge = 'model'
# the reward the policy plays for (rewards.py, one function each): 'judge', the judge's P(natural) (the seed's
# design); or a positive control, a reward known to be right, with the judge still scoring and logged as an instrument
# beside it: 'teacher', the mean over the completion of log p_teacher - log p_policy per token, a stronger generator
# at teacher_path (MiniLLM's reverse-KL reward: with token_advantages each token is credited with its own and later
# log-ratios); 'teacher_ratio', its exact sequence log-ratio to the reference, one scalar a completion as a judge
# gives it; 'known_words', the share of the completion's words found in the train split (exact, and hackable); or
# 'module:function', a user's own (TRL's reward_funcs shape: function(prompts, completions, **kwargs) -> floats)
# Several, comma-separated, are summed with reward_weights (TRL's reward_funcs and reward_weights), each one's mean
# logged. A reward that reads no judge needs none: with no reward_model_path the judge's instruments are off
reward = 'judge'
reward_weights = ''  # one weight a reward, comma-separated ('': each 1)
teacher_path = ''
# reward='teacher' with token_advantages: MiniLLM's single-step decomposition. > 0: each completion position's own
# term, the KL between the policy's and the teacher's next-token laws (teacher_kl: which way round), is minimised
# exactly over the whole vocabulary with this weight (its gradient, no sampling noise), and a token's advantage credits
# only the log-ratios after it (0: the sampled reward's per-token credit alone). It holds the teacher's next-token
# log-probs (B, T, V) for a step: char-sized vocabularies
teacher_kl_weight = 0.0
# the exact term's direction: 'reverse', KL(policy || teacher) (MiniLLM; mode-seeking), or 'forward', KL(teacher ||
# policy) on the policy's own prefixes (GKD's on-policy distillation; it keeps the teacher's spread)
teacher_kl = 'reverse'
# with teacher_kl_weight: False drops the sampled log-ratios from the reward (every advantage 0), leaving the exact
# term alone, on-policy distillation with no policy gradient: what that term earns apart from the sampled reward
teacher_sampled = True
# the judge's reward: 'p_natural', its P(natural) (the seed's design), or 'log_odds', log P(natural) - log P(synthetic)
# (a token judge's summed over the completion's positions). With kl_in_reward, beta=0 and scale_rewards='none' the
# game's fixed point is the tilt pi_ref·e^f (tilt.py), the only one that is natural text under a perfect judge
reward_form = 'p_natural'
# True: the reward minus the completion's exact log-ratio log pi(x)/pi_ref(x) under the rollout policy, so the
# policy gradient is that of E[f] - KL(pi || pi_ref) at weight 1 (the KL inside the reward, no k3 term: beta=0)
kl_in_reward = False
# where the KL (kl_in_reward, beta or the tilt's weights) is anchored: 'reference', the starting policy pi_ref, held
# (the seed's); or 'judge', the policy the online judge was last fit against, moved there at each of its refits. A
# co-trained judge tracks f = log p_data/pi_theta, and against a held pi_ref the game's fixed point is then
# pi_ref^{1/(1+a)}·p_data^{a/(1+a)}, not pi_ref·e^{a·f}; anchored where f is a log-ratio to, each refit's tilt is the
# judge's own (pi_k^{1-a}·p_data^a a step at a <= 1), the object whose worth the judge is read against
kl_anchor = 'reference'
# the reward's scale a: the tilt pi_ref·e^{a·r} the KL-regularised and distribution-matching games reach (a < 1, a
# tempered tilt, moves less far and with less variance)
reward_scale = 1.0
# 'grpo': group-relative advantages of the reward (the seed's). Or distribution matching towards the tilt pi_ref·e^r
# (r: the reward times reward_scale), each rollout weighed by pi_ref(x)·e^{r(x)} / pi(x), self-normalised within its
# group: 'dpg', the weights as advantages G·w - 1 (Khalifa et al. 2021's distributional policy gradient, Korbak et al.
# 2022's baseline); 'resample_mle', one rollout a group resampled by them and trained on by next-token loss (RAFT,
# ReST); 'judge_teacher', the tilt's own next-token law p(v | x<t) ∝ pi_base(v | x<t)·e^{r(x<t v)}, normalised over
# the vocabulary, distilled by the exact forward KL on the policy's prefixes (a token judge's per-prefix log-odds,
# FUDGE's reweighting, with pi_base the reference, or the policy while the judge learns online; or teacher_ratio's
# per-prefix log-ratio, whose law at scale 1 is the teacher's own). It holds the law (B, N, V) for a step and runs a
# token judge V times a position: char-sized vocabularies
objective = 'grpo'
# dpg's rollouts: 'policy', on-policy, each step's own policy draws them (the seed's); 'gated', a frozen proposal q,
# the starting policy, draws them, each weighed by pi_ref·e^r / q with Korbak et al.'s baseline pi/q, and q takes the
# policy's weights only when the step's rollouts estimate the policy closer to the tilt than q in forward KL
# (KL(p||pi) - KL(p||q) = E_p[log q/pi] < 0; GDC's gate, Khalifa et al. 2021): a policy that strays is not sampled
proposal = 'policy'
# judge_teacher: the law at this many completion positions of each rollout, drawn afresh each step (0: at every one);
# the exact KL's mean over them is an unbiased estimate of its mean over the completion, at S/N of the law's cost
law_positions = 0
out_path = 'out-grpo/policy.pt'
dataset = ''  # folder with train.bin/val.bin; default: the policy checkpoint's own dataset
# when the run stops: fit the temperature its base's held-out selection tail reads best and record it in the
# checkpoint (calibration.py; sample.py --temperature=calibrated reads it), where the base holds out a tail
calibrate = True
# rollouts
max_steps = 100
prompts_per_step = 8
num_generations = 8  # G completions per prompt
min_prompt_len = 1
max_prompt_len = 0  # 0: block_size // 2
temperature = 1.0
top_k = None
sampler = 'auto'  # GPT.generate's decode loop: 'auto' ('graph' on CUDA, else 'eager'), 'static', 'graph', 'compile'
# objective
scale_rewards = 'group'  # 'group', 'batch' or 'none'
token_advantages = False  # per-token advantages: a token judge's per-position P(natural), or the teacher's log-ratios
token_discount = 0.23  # their discount (ScratchGAN's)
loss_type = 'grpo'  # 'grpo', 'dr_grpo' or 'dapo'
epsilon = 0.2
epsilon_high = None  # None: epsilon
beta = 0.04  # KL penalty weight (0: no reference model unless max_kl needs one)
num_iterations = 1  # mu: optimizer passes over each batch of rollouts
# optimizer
learning_rate = 1e-5  # 0: the policy stays as it starts (the judge and the instruments alone move)
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_steps = 10
# stopping
reward_threshold = 0.9  # stop when the moving average of the mean reward reaches this (the judge's P(natural)
# only; above 1: never)
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
# what the online judge trains (train_reward_model.py's unfreeze_layers): 0 its head on the frozen trunk's features;
# k its last k blocks too; -1 the whole network, its own features (GAD). Always the judge's own copy, never the policy
judge_unfreeze_layers = 0
# '' keeps the loss the judge was trained with; or 'mse', 'ce', 'pairwise' (Bradley-Terry), or 'binary': cross-entropy
# of whole rollouts as synthetic against natural windows as natural (needs judge_natural_windows; the probe's judges)
judge_loss = ''
judge_warmup_steps = 0  # rollout batches the online judge learns from before the policy's first step
# natural windows from the train split that the online judge also learns from each step, labelled natural at every
# position (pointwise losses): without them every late position it sees is generated, and position alone fits the
# crossover labels; they cost no generation
judge_natural_windows = 0
# the judge-off ablation: every reward is the constant 0.5, so every advantage is 0 and only the KL anchor and the
# NLL term move the policy (the same trainer, settings and compute with the judge's signal removed)
judge_off = False
arm_log = ''  # judge-off only: the arm's _log.jsonl; the control runs as many steps as the arm did
# the shuffled-judge control: each group's rewards permuted among its own rollouts (the judge's own values and
# within-group spread, no tie to the text they score). Where judge-off moves nothing (the KL inside the reward: every
# advantage 0), this shows what a reward of the judge's scale does by chance, so a gain over it is the judge's knowledge
reward_shuffle = False
# real text in the loss (TextGAIL keeps human text in its RL buffer; SPIN's fix for falling likelihoods): this weight
# times the next-token loss of the corpus' own continuation of each step's prompts (0: the seed's pure GRPO)
nll_weight = 0.0
# evaluation
eval_interval = 20  # also how often the resume state is written
resume = False  # continue an interrupted run from <out stem>_resume.pt when its settings and inputs match;
# a finished one (the same settings and inputs) is left as it is
ppl_max_tokens = 100000  # val tokens for the perplexity (0: the whole split)
num_log_samples = 2
# the referee over the game: at each evaluation, the two-sample test's AUC (two_sample.py: it reads no model) of this
# many policy continuations against as many natural val windows, evaluate.py's windows for referee_seed (0: off)
referee_samples = 0
referee_seed = 1337
# system
backend = 'auto'
device = 'auto'
dtype = 'auto'
seed = 1337
# -----------------------------------------------------------------------------
# each number's range and the relations between them, checked by the configurator before anything is read or written
RANGES = dict(teacher_kl_weight='>= 0', reward_scale='> 0', law_positions='>= 0',  # the reward
              max_steps='>= 1', prompts_per_step='>= 1', num_generations='>= 2', min_prompt_len='>= 1',  # rollouts
              max_prompt_len='>= 0', temperature='> 0', top_k='>= 1',
              token_discount='[0, 1]', epsilon='(0, 1)', epsilon_high='> 0', beta='>= 0', num_iterations='>= 1',
              learning_rate='>= 0', weight_decay='>= 0', beta1='[0, 1)', beta2='[0, 1)', grad_clip='>= 0',  # optimizer
              warmup_steps='>= 0',
              reward_threshold='>= 0', reward_window='>= 1', patience='>= 0', min_delta='>= 0', max_kl='>= 0',
              judge_update_interval='>= 0', judge_steps='>= 1', judge_learning_rate='> 0', judge_batch_size='>= 1',
              judge_replay='>= 0', judge_unfreeze_layers='>= -1', judge_warmup_steps='>= 0',
              judge_natural_windows='>= 0', nll_weight='>= 0',
              eval_interval='>= 1', ppl_max_tokens='>= 0', num_log_samples='>= 0', referee_samples='0 or >= 2',
              referee_seed='>= 0', seed='>= 0')
RELATIONS = (('max_prompt_len == 0 or min_prompt_len <= max_prompt_len', "a prompt is min_prompt_len to "
              "max_prompt_len tokens long"),)
DEFAULTS = {**config_defaults(globals()), **TRACKING_DEFAULTS}  # + wandb_log, tensorboard_log, ... (tracking.py)


def group_advantages(rewards, group_size, scale='group', batch_std_of=torch.std):
    """
    (r - group mean) / (std + 1e-4), std of the group ('group'), of the whole batch ('batch', by batch_std_of: under
    DDP every rank's rewards pooled, as TRL gathers them), or none ('none').
    Returns (advantages, number of groups whose rewards are all equal: their advantages are exactly 0, mean raw
    within-group std: what 'group' scaling divides by, so a judge whose rewards barely differ is visible in the log).
    """
    groups = rewards.view(-1, group_size)
    centered = center_and_scale(groups, scale, batch_std_of(rewards))
    zero_std = int((groups.std(dim=1) == 0).sum()) if group_size > 1 else groups.size(0)
    group_std = float(groups.std(dim=1).nan_to_num(0.0).mean()) if group_size > 1 else 0.0
    return centered.reshape(-1), zero_std, group_std


def within_group_share(rewards, group_size):
    """The share of the rewards' variance that lies within groups: the part that ranks a prompt's completions
    against each other, all that group-centred advantages can use (the rest tells prompts apart). 0 when every
    reward is equal."""
    total = float(((rewards - rewards.mean()) ** 2).sum())
    groups = rewards.view(-1, group_size)
    return float(((groups - groups.mean(dim=1, keepdim=True)) ** 2).sum()) / total if total > 0 else 0.0


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


def token_advantages_of(token_rewards, positions_mask, group_size, discount, scale='group', batch_std_of=torch.std):
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
                                batch_std_of(returns[positions_mask.bool()]))
    return (centered.reshape_as(returns) * positions_mask)[:, 1:]


def k3_kl(logps, ref_logps):
    """Per-token k3 estimate of KL(policy || reference): unbiased, always >= 0."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, epsilon=0.2, epsilon_high=None, beta=0.0,
              loss_type='grpo', max_completion_length=None, token_count=None):
    """
    Clipped-ratio policy loss over completion tokens plus beta * k3 KL to the reference; returns (loss, stats).
    logps, old_logps, ref_logps, mask: (B, T); advantages: (B,) or per token (B, T). token_count: what 'dapo' divides
    by, default this batch's completion tokens; under DDP the global count over the world size (TRL's
    num_items_in_batch), so the ranks' averaged gradients are those of the whole batch.
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
        loss = (per_token * mask).sum() / (mask.sum().clamp_min(1) if token_count is None else token_count)
    else:
        raise ValueError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {loss_type!r}")
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    n = mask.sum().clamp_min(1)
    stats = {'clip_ratio': ((clipped.float() * mask).sum() / n).item(),
             'kl': None if kl is None else ((kl * mask).sum() / n).item()}
    return loss, stats


def plot_history(history, path, referee_start=None):
    """Reward (mean and std band), KL and clip ratio, and the judge's R² on fresh rollouts over the steps, as a PNG;
    with the referee on, a fourth panel: the judge's sight and the referee's two-sample AUC over the steps (does the
    policy fool its judge, and does the referee agree?)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    steps = [h['step'] for h in history]
    reward, std = np.array([h['reward'] for h in history]), np.array([h['reward_std'] for h in history])
    referee = [(h['step'], h['referee_auc']) for h in history if 'referee_auc' in h]
    fig, axes = plt.subplots(1, 4 if referee else 3, figsize=(21 if referee else 16, 4))
    axes[0].plot(steps, reward, label='mean reward P(natural)')
    axes[0].fill_between(steps, reward - std, reward + std, alpha=0.2, label='± std')
    axes[0].set(xlabel='step', title='reward')
    if history and history[0]['kl'] is not None:
        axes[1].plot(steps, [h['kl'] for h in history], label='KL to reference')
    axes[1].plot(steps, [h['clip_ratio'] for h in history], label='clip ratio')
    axes[1].set(xlabel='step', title='KL and clipping')
    r2 = np.array([h['judge_r2'] for h in history], dtype=float)  # nan: no judge
    smooth = np.convolve(r2, np.ones(min(10, len(r2))) / min(10, len(r2)), mode='valid')
    axes[2].plot(steps, r2, alpha=0.3, label="judge R² on each step's rollouts")
    axes[2].plot(steps[len(steps) - len(smooth):], smooth, label='moving average (10 steps)')
    if 'judge_sight' in history[0]:
        axes[2].plot(steps, np.array([h['judge_sight'] for h in history], dtype=float),
                     label='judge sight (AUC, natural vs rollouts)')
    axes[2].set(xlabel='step', title='the judge on samples it has not seen')
    if referee:
        axes[3].plot(steps, [h['judge_sight'] for h in history], alpha=0.4, label="judge sight on each step's rollouts")
        start = [(-1, referee_start)] if referee_start is not None else []
        axes[3].plot(*zip(*(start + referee)), 'o-',
                     label='referee: two-sample AUC of the policy (↓ closer to natural)')
        axes[3].set(xlabel='step (-1: before the first)', title='fooling the judge, and the referee', ylim=(0.3, 1.02))
    for ax in axes:
        ax.legend()
    if referee:  # between the sight (about 0.5) and the referee's AUC (about 0.9): the empty band
        axes[3].legend(loc='center right', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_models(C, rt):
    policy_ckpt = load_checkpoint(C.policy_path)
    if problem := start_problem(policy_ckpt, C.policy_path):
        raise UserError(problem)
    policy = GPT.from_checkpoint(policy_ckpt, device=rt.device)
    reference = None
    if C.beta > 0 or C.max_kl > 0 or C.kl_in_reward or C.objective != 'grpo' or plays(C, 'teacher_ratio'):
        reference = copy.deepcopy(policy).requires_grad_(False).eval()
    if C.judge == 'ngram' or not C.reward_model_path:  # the n-gram judge, or no judge: a reward that reads none
        return policy_ckpt, None, policy, None, reference
    rm_ckpt = load_checkpoint(C.reward_model_path)
    if rm_ckpt['model_args'].get('mode') != 'reward':
        raise UserError(f"{C.reward_model_path} is not a reward model; train one with train_reward_model.py")
    tok = TokenizationInfo.from_dict(policy_ckpt['tokenization'])
    tok.check_compatible(TokenizationInfo.from_dict(rm_ckpt['tokenization']), 'the policy', 'the reward model')
    reward_model = GPT.from_checkpoint(rm_ckpt, device=rt.device).requires_grad_(False)
    N = policy.config.block_size
    if reward_model.config.block_size < N:
        raise UserError(f"the reward model's block size {reward_model.config.block_size} is below the policy's "
                        f"{N}: it cannot score whole sequences")
    if rm_ckpt.get('data_block_size', N) != N:  # its P(natural) means the share of N natural tokens it saw
        raise UserError(f"{C.reward_model_path} was trained on sequences of {rm_ckpt['data_block_size']} tokens, but "
                        f"GRPO scores sequences of the policy's block size {N}: train it on reward data of length {N}")
    return policy_ckpt, rm_ckpt, policy, reward_model, reference


def saved_ngram_judge(C, policy_ckpt):
    """The n-gram judge saved at reward_model_path (refit on its texts), of the policy's tokenization."""
    try:
        judge = NgramJudge.load(C.reward_model_path)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{C.reward_model_path}: not an n-gram judge's file ({e}); NgramJudge.save writes one "
                        f"(bench_judge_recipes.py, bench_judge_curve.py, a game's *_judge.json)") from None
    TokenizationInfo.from_dict(policy_ckpt['tokenization']).check_compatible(
        TokenizationInfo.from_dict(judge.tokenization), 'the policy', 'the n-gram judge')
    return judge


def load_teacher(C, policy_ckpt, rt):
    """The teacher of reward='teacher': a generator of the policy's tokenization that reads whole sequences."""
    ckpt = load_checkpoint(C.teacher_path)
    if ckpt['model_args'].get('mode', 'generator') != 'generator':
        raise UserError(f"{C.teacher_path} is a reward model; --teacher_path takes a generator checkpoint")
    TokenizationInfo.from_dict(policy_ckpt['tokenization']).check_compatible(
        TokenizationInfo.from_dict(ckpt['tokenization']), 'the policy', 'the teacher')
    teacher = GPT.from_checkpoint(ckpt, device=rt.device).requires_grad_(False).eval()
    if teacher.config.block_size < policy_ckpt['model_args']['block_size']:
        raise UserError(f"the teacher's block size {teacher.config.block_size} is below the policy's: it cannot "
                        f"score whole sequences")
    return teacher


def plays(C, name):
    """Whether the reward named is one of those --reward plays."""
    return name in reward_names(C.reward)


def check_config(C):
    if C.judge not in ('model', 'ngram'):
        raise UserError(f"judge must be 'model' (the reward model at reward_model_path) or 'ngram', got {C.judge!r}")
    if not C.policy_path:
        raise UserError("pass --policy_path=PATH")
    if C.judge == 'model' and not C.reward_model_path and (plays(C, 'judge') or C.objective == 'judge_teacher'):
        raise UserError(f"--reward={C.reward} reads the judge: pass --reward_model_path=PATH (a reward that reads "
                        "none, e.g. known_words or your module:function, needs no judge)")
    if C.judge == 'ngram' and C.reward_model_path and (not C.reward_model_path.endswith('.json') or
                                                       C.judge_update_interval or C.judge_warmup_steps):
        raise UserError("--judge=ngram with --reward_model_path plays a saved n-gram judge (a .json file "
                        "NgramJudge.save wrote) frozen: pass such a file, and no judge_update_interval or "
                        "judge_warmup_steps")
    if C.judge == 'ngram' and not C.reward_model_path and (
            not C.judge_update_interval or not C.judge_warmup_steps or C.judge_unfreeze_layers
            or C.judge_loss not in ('', 'binary') or C.token_advantages):
        raise UserError("--judge=ngram is fitted online: pass --judge_update_interval=1 (or k) and "
                        "--judge_warmup_steps=W >= 1, and no judge_unfreeze_layers, judge_loss or token_advantages "
                        "(it has no layers, and scores whole completions); or --reward_model_path=JUDGE.json to "
                        "play a saved one frozen")
    combined_reward(C.reward, C.reward_weights, C.reward_form)  # names it knows, or a user's function that loads
    if any(plays(C, name) for name in NEEDS_TEACHER) != bool(C.teacher_path):
        raise UserError(f"--reward={C.reward if any(plays(C, n) for n in NEEDS_TEACHER) else 'teacher'} needs "
                        f"--teacher_path=GENERATOR.pt, and teacher_path goes with teacher or teacher_ratio alone")
    if not plays(C, 'judge') and C.judge_update_interval:
        raise UserError(f"--reward={C.reward} does not read the judge: it stays frozen (drop judge_update_interval)")
    if C.teacher_kl not in ('reverse', 'forward'):
        raise UserError(f"teacher_kl must be 'reverse' or 'forward', got {C.teacher_kl!r}")
    if C.teacher_kl_weight and not (C.reward == 'teacher' and C.token_advantages):
        raise UserError("--teacher_kl_weight splits the teacher's per-token credit: it needs --reward=teacher and "
                        "--token_advantages=True")
    if not C.teacher_sampled and not C.teacher_kl_weight:
        raise UserError("--teacher_sampled=False leaves the exact term alone: pass --teacher_kl_weight > 0 with it")
    if C.reward_form not in ('p_natural', 'log_odds') or (C.reward_form == 'log_odds' and (
            C.reward != 'judge' or C.token_advantages)):  # the judge's alone: a weighted sum has no log-odds
        raise UserError("reward_form must be p_natural or log_odds; log_odds reads the judge's whole-completion "
                        "score: --reward=judge, no token_advantages")
    if C.kl_in_reward and C.beta:
        raise UserError("--kl_in_reward=True puts the KL inside the reward at weight 1: pass --beta=0 (no k3 term)")
    if C.objective not in ('grpo', 'dpg', 'resample_mle', 'judge_teacher') or C.reward_scale <= 0:
        raise UserError(f"objective must be grpo, dpg, resample_mle or judge_teacher (got {C.objective!r}) and "
                        f"reward_scale > 0")
    if C.objective != 'grpo' and (C.beta or C.kl_in_reward or C.token_advantages or C.teacher_kl_weight):
        raise UserError(f"--objective={C.objective} matches the tilt pi_ref·e^r, its KL to the reference already "
                        f"inside: pass --beta=0, and no kl_in_reward, token_advantages or teacher_kl_weight")
    if C.kl_anchor not in ('reference', 'judge') or (C.kl_anchor == 'judge' and not (
            C.judge_update_interval and (C.kl_in_reward or C.beta or C.objective in ('dpg', 'resample_mle')))):
        raise UserError("kl_anchor must be 'reference' or 'judge'; 'judge' moves the KL's anchor to an online judge's "
                        "refits: pass --judge_update_interval=1 (or k) and a KL (kl_in_reward, beta, dpg or "
                        "resample_mle) with it")
    if C.top_k and (C.kl_in_reward or C.objective != 'grpo'):
        raise UserError("--top_k samples from a truncated law while the tilt's games read log pi untruncated (the KL "
                        "and the weights would be biased): drop --top_k with kl_in_reward or --objective="
                        f"{C.objective}")
    if C.objective == 'judge_teacher' and (C.reward not in ('judge', 'teacher_ratio') or C.judge != 'model'):
        raise UserError("--objective=judge_teacher reads a per-prefix log-odds: a token reward model's "
                        "(--reward=judge) or a teacher's (--reward=teacher_ratio)")
    if C.proposal not in ('policy', 'gated') or (C.proposal == 'gated' and C.objective != 'dpg'):
        raise UserError(f"proposal must be 'policy' or 'gated' (got {C.proposal!r}); 'gated' draws dpg's rollouts: "
                        "pass it with --objective=dpg")
    if C.law_positions and C.objective != 'judge_teacher':
        raise UserError("--law_positions picks the positions judge_teacher's law is read at: pass it with "
                        "--objective=judge_teacher")
    if C.token_advantages and (len(reward_names(C.reward)) > 1 or plays(C, 'known_words') or ':' in C.reward):
        raise UserError(f"--reward={C.reward} scores whole completions: drop --token_advantages (per-token credit "
                        "is a token judge's or the teacher's, played alone)")
    if C.scale_rewards not in ('group', 'batch', 'none') or C.loss_type not in ('grpo', 'dr_grpo', 'dapo'):
        raise UserError("scale_rewards must be group|batch|none and loss_type grpo|dr_grpo|dapo")
    if C.sampler not in SAMPLERS:
        raise UserError(f"sampler must be one of {', '.join(SAMPLERS)}, got {C.sampler!r}")
    if C.arm_log and not C.judge_off:
        raise UserError("arm_log sets the judge-off control's steps: pass it with --judge_off=True")
    if C.reward_shuffle and (C.judge_off or C.token_advantages or C.objective == 'judge_teacher'):
        raise UserError("--reward_shuffle permutes whole completions' rewards: not with judge_off, token_advantages "
                        "or --objective=judge_teacher")
    if (C.judge_unfreeze_layers or C.judge_warmup_steps or C.judge_loss) and not C.judge_update_interval:
        raise UserError("judge_unfreeze_layers, judge_loss and judge_warmup_steps shape the online judge: pass "
                        "--judge_update_interval=1 (or k) with them")
    if C.judge_natural_windows and (not C.judge_update_interval or C.judge_loss == 'pairwise'):
        raise UserError("judge_natural_windows feeds the online judge's pointwise loss: pass it with "
                        "--judge_update_interval=1 (or k) and a judge_loss other than pairwise")
    if C.judge_loss not in ('', 'mse', 'ce', 'pairwise', 'binary'):
        raise UserError(f"judge_loss must be '', mse, ce, pairwise or binary, got {C.judge_loss!r}")


def arm_steps(path):
    """How many steps the arm a judge-off control matches ran: the rows of its JSONL log."""
    if not os.path.isfile(path):
        raise UserError(f"arm_log {path} not found: pass the _log.jsonl of the GRPO run this control matches")
    with open(path) as f:
        steps = sum(1 for line in f if line.strip())
    if not steps:
        raise UserError(f"arm_log {path} has no steps: the arm's run did not finish a step")
    return steps


def setup(C, rt):
    """Everything the loop reads, as one namespace: models and optimizers, the online judge's state, data, the
    draws (numpy for prompts, torch for sampling and the judge's minibatches), paths, compute per step, and the
    progress a resume state restores."""
    policy_ckpt, rm_ckpt, policy, reward_model, reference = load_models(C, rt)
    if C.token_advantages and C.reward == 'judge' and C.judge == 'model' and \
            reward_model.config.reward_pooling != 'token':
        raise UserError(f"token_advantages needs a token judge; {C.reward_model_path} pools by "
                        f"'{reward_model.config.reward_pooling}': train one with --reward_pooling=token")
    run = SimpleNamespace(C=C, rt=rt, policy=policy, reward_model=reward_model, reference=reference,
                          policy_ckpt=policy_ckpt, rm_ckpt=rm_ckpt, N=policy.config.block_size)
    run.max_steps = arm_steps(C.arm_log) if C.arm_log else C.max_steps
    run.teacher = load_teacher(C, policy_ckpt, rt) if any(plays(C, n) for n in NEEDS_TEACHER) else None
    run.reward_fn, run.reward_names = combined_reward(C.reward, C.reward_weights, C.reward_form)
    if C.objective == 'judge_teacher' and C.reward == 'judge' and reward_model.config.reward_pooling != 'token':
        raise UserError(f"--objective=judge_teacher needs a judge that reads every prefix; {C.reward_model_path} "
                        f"pools by '{reward_model.config.reward_pooling}': train one with --reward_pooling=token")
    # GDC's proposal: the starting policy, frozen between the gate's updates
    run.proposal = copy.deepcopy(policy).requires_grad_(False).eval() if C.proposal == 'gated' else None
    run.proposal_updates = 0
    run.resample_rng = np.random.default_rng([C.seed, rt.rank, 13])  # resample_mle's choices
    run.shuffle_rng = np.random.default_rng([C.seed, rt.rank, 17])  # reward_shuffle's permutations
    run.law_rng = np.random.default_rng([C.seed, rt.rank, 19])  # law_positions' draws
    # the judge keeps the loss it was trained with, unless judge_loss names another
    run.ngram = (saved_ngram_judge(C, policy_ckpt) if C.reward_model_path else NgramJudge()) \
        if C.judge == 'ngram' else None
    run.judge_loss_kind = 'binary' if run.ngram else None if rm_ckpt is None else \
        C.judge_loss or rm_ckpt.get('config', {}).get('loss', 'mse')
    if run.judge_loss_kind == 'binary' and C.judge_update_interval and not C.judge_natural_windows and not run.ngram:
        given = '--judge_loss=binary' if C.judge_loss else f"{C.reward_model_path} was trained with loss=binary"
        raise UserError(f"{given}: online, a binary judge learns natural windows against the rollouts: pass "
                        f"--judge_natural_windows=M" + ('' if C.judge_loss else " (or another --judge_loss)"))
    if run.judge_loss_kind == 'ranking' and C.judge_update_interval:
        raise UserError(f"{C.reward_model_path} was trained by ranking NCE, which the online update does not play: "
                        f"pass --judge_loss=binary --judge_natural_windows=M (or pairwise), or keep it frozen")
    run.judge_opt, run.judge_gen, run.replay = None, None, deque(maxlen=C.judge_replay + 1)
    run.judge_trunk = C.judge_unfreeze_layers != 0  # it learns from token ids, not from cached features
    if C.judge_update_interval and not run.ngram:
        freeze_trunk(reward_model, C.judge_unfreeze_layers)
        run.judge_params = [p for p in reward_model.parameters() if p.requires_grad]
        run.judge_opt = torch.optim.AdamW(run.judge_params, lr=C.judge_learning_rate, betas=(0.9, 0.99),
                                          weight_decay=0.0)
        run.judge_gen = torch.Generator().manual_seed(C.seed * 1000 + 7 + rt.rank)
    run.judge_rng = np.random.default_rng([C.seed, rt.rank, 7])  # its natural windows: the prompts' draw stays put
    # the whole judge's raw output (per position for a token judge), or its head on cached features
    if reward_model is not None:
        run.judge_fn = (lambda x: reward_model(x, per_token=True)[0]) if run.judge_trunk else reward_model.reward_head
        run.head_params = sum(p.numel() for p in reward_model.reward_head.parameters())
    run.hi, run.train, run.val, run.held_out = prompts_and_splits(C, run.N, policy_ckpt)
    if C.law_positions > run.N - run.hi:
        raise UserError(f"--law_positions={C.law_positions} is more than the shortest completion's "
                        f"{run.N - run.hi} positions: pass at most that")
    run.tokenizer = TokenizationManager.from_info(policy_ckpt['tokenization'])
    run.known_words = words_known_in(run.train, run.tokenizer) if plays(C, 'known_words') else None
    # the natural side of the judge's sight: as many val windows as a step has rollouts, drawn once by their own
    # generator, each read over the positions its row's rollout completes
    rows = C.prompts_per_step // rt.world_size * C.num_generations
    run.sight_probs = None  # a frozen judge's output on them, scored once (sight_window_probs)
    run.sight_windows = torch.from_numpy(sample_windows(run.val, rows, 1, 1, run.N,
                                                        np.random.default_rng([C.seed, rt.rank, 11]))[0]).to(rt.device)
    run.referee_windows = eval_windows(run.val, C.referee_samples, run.N, C.referee_seed) if C.referee_samples else None
    run.optimizer = policy.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), rt.device_type)
    run.trained = DDP(policy) if rt.ddp else policy
    run.rng = np.random.default_rng([C.seed, rt.rank])
    run.gen = torch.Generator(device=rt.device).manual_seed(C.seed * 1000 + rt.rank)
    run.n_prompts = C.prompts_per_step // rt.world_size
    run.max_completion = run.N - C.min_prompt_len
    stem = os.path.splitext(C.out_path)[0]
    run.log_path, run.plot_path = stem + '_log.jsonl', stem + '_curves.png'
    run.judge_path = stem + ('_judge.json' if run.ngram else '_judge.pt')  # the judge as it stands (save)
    run.state_path = resume_file(C.out_path, rt.rank)
    run.signature = run_signature(vars(C), [C.policy_path] + ([C.reward_model_path] if C.reward_model_path else [])
                                  + ([C.teacher_path] if C.teacher_path else []))
    run.flops_per_step = step_flops(run)
    run.ppl_tokens = 'whole val split' if not C.ppl_max_tokens else \
        f'first {min(C.ppl_max_tokens, len(run.val)):,} val tokens'
    run.history, run.reward_ma = [], deque(maxlen=C.reward_window)
    run.stopper = EarlyStopping(C.patience, C.min_delta, 'max')
    run.last_ok_state, run.last_ok_step, run.stop_reason, run.judge_flops = None, 0, 'max_steps', 0
    run.warmup = []  # the judge's warm-up batches (judge_warmup)
    return run


def judge_flops_per_token(run):
    """The judge's forward FLOPs per token: 0 for the n-gram judge, which is not a network (its wall time is in
    the log's time_scoring and time_update)."""
    return 0 if run.ngram or run.reward_model is None else run.reward_model.flops_per_token()


def step_flops(run):
    """Compute of one step (FLOPs, 2 per parameter per token forward, 6 with the backward): generation, the judge's
    pass where the reward is the judge's (a positive control's judge scores the rollouts as an instrument only, so
    its pass is no cost of the method), the reference, the policy's own log-probs of the rollouts for a teacher's
    log-ratio, the KL inside the reward or the tilt's weights, judge_teacher's law (a token judge's V candidate tokens
    a position), and num_iterations forward+backward passes of the policy, over every rank's rows."""
    C, N, policy = run.C, run.N, run.policy
    rows = C.prompts_per_step * C.num_generations
    judge_plays = plays(C, 'judge')
    flops = rows * N * (policy.flops_per_token() + (judge_flops_per_token(run) if judge_plays else 0)
                        + (run.reference.flops_per_token() if run.reference is not None else 0)
                        + policy.flops_per_token() * (plays(C, 'teacher') + C.kl_in_reward
                                                     + (C.objective in ('dpg', 'resample_mle'))
                                                     + (C.proposal == 'gated'))
                        + C.num_iterations * policy.flops_per_token(backward=True))
    if C.objective == 'judge_teacher':  # the law's base pass, and a token judge's every candidate token (where the
        # law is read at law_positions: those, and the true rows' pass they attend to)
        V = policy.config.tokens
        candidates = C.law_positions * V + N if C.law_positions else N * V
        flops += rows * (N * policy.flops_per_token()
                         + (candidates * judge_flops_per_token(run) if judge_plays else 0))
    if C.nll_weight:  # the natural continuations' forward and backward
        flops += C.prompts_per_step * N * C.num_iterations * policy.flops_per_token(backward=True)
    if run.judge_loss_kind == 'pairwise' and judge_plays:  # the natural windows' scoring
        flops += C.prompts_per_step * N * judge_flops_per_token(run)
    return flops


def teacher_flops(run):
    """The teacher's forward FLOPs of one step, apart from the run's (the policy's own log-probs of the rollouts are
    the run's: step_flops): the policy's compute is what its MLE control is matched to, the teacher's cost is stated
    beside it."""
    if run.teacher is None:
        return 0
    return run.C.prompts_per_step * run.C.num_generations * run.N * run.teacher.flops_per_token()


def referee_auc(run):
    """The two-sample test's AUC of the policy as it stands: referee_samples continuations of the referee's prompts
    against its natural windows (lower: closer to natural text). Its own sampling draw leaves the run's as it was."""
    reference, prompts = run.referee_windows
    gen = torch.Generator(device=run.rt.device).manual_seed(run.C.referee_seed)
    with torch.no_grad(), run.rt.ctx:
        natural, samples, _, _ = continuation_texts(run.policy, run.tokenizer, reference, prompts, run.C.temperature,
                                                    run.C.top_k, gen)
    return two_sample_test(natural, samples, run.C.referee_seed)['c2st_auc']


def val_ppl(run):
    return evaluate_perplexity(run.policy, run.val, run.N, batch_size=32, ctx=run.rt.ctx,
                               max_tokens=run.C.ppl_max_tokens)[1]


def save(run, step, stop_reason, **final):
    """The policy checkpoint (with its history and compute), and the online judge as it stands beside it (the n-gram
    judge as the texts it was fitted on: the judge that played, whose worth bench_share.py reads)."""
    C = run.C
    save_checkpoint(C.out_path, run.policy, iter_num=step, best_val_loss=None, config=vars(C),
                    tokenization=run.policy_ckpt['tokenization'], optimizer=run.optimizer, held_out=run.held_out,
                    metrics=dict(history=run.history, stop_reason=stop_reason, val_ppl_start=run.ppl_start,
                                 ppl_tokens=run.ppl_tokens, judge_warmup=run.warmup,
                                 referee_auc_start=run.referee_start,
                                 flops=run.flops_per_step * len(run.history) + run.judge_flops,
                                 teacher_flops=teacher_flops(run) * len(run.history), signature=run.signature,
                                 **final))
    if C.judge_update_interval and not run.ngram:  # loadable wherever a reward model is
        last = run.history[-1]
        save_checkpoint(run.judge_path, run.reward_model, iter_num=step,
                        config=dict(run.rm_ckpt.get('config', {}), online_from=os.path.abspath(C.reward_model_path),
                                    loss=run.judge_loss_kind, online_unfreeze_layers=C.judge_unfreeze_layers),
                        tokenization=run.rm_ckpt['tokenization'], data_block_size=run.N,
                        metrics={k: last[k] for k in last if k.startswith('judge')})
    if run.ngram and run.ngram.fitted_on is not None and not C.reward_model_path:  # a saved judge is its own file
        run.ngram.save(run.judge_path, run.policy_ckpt['tokenization'])


# -----------------------------------------------------------------------------
# the phases of a step, in the order the loop runs them

def rollouts(run):
    """G completions of each of n_prompts prompts cut from the train split, all rows advancing together in one
    cached batch. Returns the batch: the sequences, their prompt lengths, the masks of generated positions and of
    completion targets, and the natural windows the prompts were cut from (with their own completion mask)."""
    C, rt = run.C, run.rt
    prompts, lengths, windows = sample_prompts(run.train, run.n_prompts, C.min_prompt_len, run.hi, run.N, run.rng)
    prompt_t = torch.from_numpy(np.repeat(prompts, C.num_generations, axis=0)).to(rt.device)
    lengths_t = torch.from_numpy(np.repeat(lengths, C.num_generations)).to(rt.device)
    drawer = run.policy if run.proposal is None else run.proposal  # GDC's gate: a frozen proposal draws them
    with rt.ctx:
        seqs = drawer.generate(prompt_t, run.N - run.hi, C.temperature, C.top_k, prompt_lengths=lengths_t,
                               generator=run.gen, sampler=C.sampler)
    generated = generated_positions(lengths_t, run.N)
    return SimpleNamespace(seqs=seqs, lengths=lengths, lengths_t=lengths_t, generated=generated,
                           mask=generated[:, 1:],  # completion_mask: the completion's next-token targets
                           real=torch.from_numpy(windows).to(rt.device),
                           real_mask=completion_mask(torch.from_numpy(lengths).to(rt.device), run.N))


def score(run, batch, reference=True):
    """The rewards for the rollouts (rewards.py), and the judge's figures on them, which it has not seen yet: a
    rollout is a crossover sample with K = its prompt length. Also the reference's log-probs (unless
    reference=False), the log-weights of the tilt's objectives and the next-token law the exact term distils."""
    C, rt = run.C, run.rt
    s = ngram_scores(run, batch) if run.ngram else model_scores(run, batch) if run.reward_model is not None else \
        SimpleNamespace(feats=None, judged=None, p_natural=None, probs=None, real_feats=None, pair_acc=None, sight=None)
    s.target_logp, s.law_mask, s.log_rho = None, batch.mask, None
    if C.teacher_kl_weight:  # the teacher's every next-token log-prob, for the exact term (and its reward)
        with torch.no_grad(), rt.ctx:
            s.target_logp = torch.log_softmax(run.teacher(batch.seqs[:, :-1], all_logits=True)[0].float(), dim=-1)
    s.ref_logps = None
    if reference and run.reference is not None:  # before the reward: teacher_ratio reads them too
        with torch.no_grad(), rt.ctx:
            s.ref_logps = token_logprobs(run.reference, batch.seqs, C.temperature)[0]
    rewards, per_position, s.parts = run.reward_fn(reward_inputs(run, batch, s))
    s.rewards = C.reward_scale * rewards  # the positive controls replace the judge's signal; its figures stay
    if per_position is not None:
        s.judged = C.reward_scale * per_position
    if C.reward_shuffle:  # the control: the same values, each on another rollout's text of its own group
        s.rewards = shuffled_within_groups(s.rewards, C.num_generations, run.shuffle_rng)
    if C.judge_off:  # the ablation: the judge still scores (and is logged), but its signal never reaches the loss
        s.rewards = torch.full_like(s.rewards, 0.5)
        s.judged = None if s.judged is None else torch.full_like(s.judged, 0.5)
        s.target_logp = None
    s.natural_share = batch.lengths_t.float() / run.N
    s.fresh = dict(r2=None, boundary_error=None) if s.p_natural is None else reward_metrics(
        s.p_natural.cpu().numpy(), s.natural_share.cpu().numpy(), run.N, float(s.natural_share.mean()))
    if reference and (C.kl_in_reward or C.objective in ('dpg', 'resample_mle')):
        with torch.no_grad(), rt.ctx:
            logps = token_logprobs(run.policy, batch.seqs, C.temperature)[0]
        s.rewards = kl_regularised(s.rewards, logps, s.ref_logps, batch.mask)  # dpg: log pi_ref·e^r / pi
        if run.proposal is not None:  # drawn from q: log pi_ref·e^r / q, and log pi/q for the baseline and the gate
            with torch.no_grad(), rt.ctx:
                s.log_rho = ((logps - token_logprobs(run.proposal, batch.seqs, C.temperature)[0])
                             * batch.mask).sum(1).to(s.rewards.dtype)
            s.rewards = s.rewards + s.log_rho
    if reference and C.objective == 'judge_teacher' and not C.judge_off:
        s.target_logp, s.law_mask = judge_teacher_law(run, batch)
    return s


def shuffled_within_groups(rewards, group_size, rng):
    """The shuffled-judge control's rewards: each group's permuted among its own rollouts. The centred advantages
    read only within-group differences, so this keeps the arm's within-group spread exactly; a permutation across
    groups would bring the spread between prompts in, a noisier reward than the judge's."""
    order = np.concatenate([g * group_size + rng.permutation(group_size) for g in range(len(rewards) // group_size)])
    return rewards[torch.from_numpy(order).to(rewards.device)]


class RewardInputs(SimpleNamespace):
    """What a reward reads (rewards.py): the rollouts' ids, masks and texts, the models, and the judge's scores. The
    texts are decoded when a reward first reads them (known_words and a user's reward do), the completions taken
    from the n-gram judge where it has decoded them already."""

    @functools.cached_property
    def prompts(self):
        return [self.tokenizer.decode(row[:n]) for row, n in zip(self.seqs.tolist(), self.prompt_lengths)]

    @functools.cached_property
    def completions(self):
        if self.decoded is not None:
            return self.decoded
        return completion_texts(self.tokenizer, self.seqs, self.prompt_lengths)


def reward_inputs(run, batch, s):
    return RewardInputs(
        seqs=batch.seqs, mask=batch.mask, generated=batch.generated, prompt_lengths=batch.lengths_t.tolist(),
        tokenizer=run.tokenizer, decoded=s.texts[1] if getattr(s, 'texts', None) else None, policy=run.policy,
        reference=run.reference, teacher=run.teacher, temperature=run.C.temperature, known_words=run.known_words,
        teacher_logp=s.target_logp, judged=s.judged, p_natural=s.p_natural, probs=getattr(s, 'probs', None),
        ref_logps=s.ref_logps)


@torch.no_grad()
def judge_teacher_law(run, batch):
    """objective='judge_teacher': the tilt's next-token law at every target (B, N-1, V), p(v | x<t) ∝
    pi_base(v | x<t)·e^{a·f(x<t v)}: f a token judge's log-odds with token t set to v (tilt.judge_token_scores), or
    teacher_ratio's log p_T(v | x<t) - log pi_ref(v | x<t). pi_base: the reference, the law f is a log-ratio to; the
    policy as it stands while an online judge keeps up with it. Also the targets the law is read at (B, N-1): every
    completion target, or law_positions of them a row, drawn afresh (elsewhere the law is pi_base's own)."""
    C, rt = run.C, run.rt
    base = run.policy if C.judge_update_interval else run.reference
    mask = batch.mask
    if C.law_positions:
        keys = torch.from_numpy(run.law_rng.random(tuple(mask.shape))).to(mask.device).masked_fill_(mask == 0, 2.0)
        targets = keys.argsort(1)[:, :C.law_positions]  # a uniform draw among each row's completion targets
        mask = torch.zeros_like(mask).scatter_(1, targets, 1)
    else:
        targets = torch.arange(mask.size(1), device=mask.device).expand(len(mask), -1)
    with rt.ctx:
        log_base = torch.log_softmax(base(batch.seqs[:, :-1], all_logits=True)[0].float() / C.temperature, -1)
        if C.reward == 'teacher_ratio':
            log_teacher = torch.log_softmax(run.teacher(batch.seqs[:, :-1], all_logits=True)[0].float(), -1)
            f = (log_teacher - log_base).gather(1, targets[..., None].expand(-1, -1, log_base.size(-1)))
        else:
            f = judge_token_scores(run.reward_model, batch.seqs, targets + 1).float()  # target j is token j + 1
    tilted = log_base.scatter_add(1, targets[..., None].expand_as(f), C.reward_scale * f)
    return torch.log_softmax(tilted, -1), mask.to(batch.mask.dtype)


def model_scores(run, batch):
    """The reward model's scores. A token judge rewards the completion's own positions; a pooled judge's one figure
    is the reward. Each prompt's natural window is scored too: a pairwise judge's other half, and sight's."""
    C, rt = run.C, run.rt
    pairwise = run.judge_loss_kind == 'pairwise'
    rm = run.reward_model
    with torch.no_grad(), rt.ctx:  # the rollouts, the sight's val windows and the prompts' own: one precision
        feats = rm.reward_features(batch.seqs)
        probs = rm.reward_head(feats).float()  # (B, 2), or (B, N, 2) by position for a token judge
        real_feats = rm.reward_features(batch.real) if pairwise else None
        real_probs = rm.reward_head(real_feats).float() if pairwise else None
    judged, p_natural = probs[..., 0], sequence_probs(probs)[:, 0]  # P(natural); the sequence's estimates K/N
    rewards = (judged * batch.generated).sum(1) / batch.generated.sum(1) if judged.dim() == 2 else p_natural
    s = SimpleNamespace(feats=feats, judged=judged, rewards=rewards, p_natural=p_natural, probs=probs, real_feats=None,
                        pair_acc=None, sight=judge_sight(batch, sight_window_probs(run), probs[..., 0]))
    if pairwise:
        s.real_feats = real_feats.float().repeat_interleave(C.num_generations, 0)
        s.pair_acc = pair_accuracy(real_probs.repeat_interleave(C.num_generations, 0), probs)
    return s


def sight_window_probs(run):
    """The judge's output on the sight's fixed val windows, in the precision the rollouts are scored in: every step
    for a judge that learns online, once for a frozen one (the same windows, the same judge)."""
    if run.sight_probs is None or run.C.judge_update_interval:
        with torch.no_grad(), run.rt.ctx:
            run.sight_probs = run.reward_model.reward_head(run.reward_model.reward_features(run.sight_windows)).float()
    return run.sight_probs


def completion_texts(tokenizer, seqs, prompt_lengths):
    """The text of each row from its prompt's end on: what the n-gram judge and a text reward read."""
    return [tokenizer.decode(row[n:]) for row, n in zip(seqs.tolist(), np.asarray(prompt_lengths).tolist())]


def ngram_scores(run, batch):
    """The n-gram judge's P(natural) of each rollout's completion, the reward; its sight ranks the fixed val windows,
    each cut where its row's prompt ends, against the rollouts. Its texts for the replay: the prompts' own natural
    continuations (train) against the rollouts."""
    samples = completion_texts(run.tokenizer, batch.seqs, np.repeat(batch.lengths, run.C.num_generations))
    natural = completion_texts(run.tokenizer, batch.real, batch.lengths)
    held_out = completion_texts(run.tokenizer, run.sight_windows, np.repeat(batch.lengths, run.C.num_generations))
    p = torch.from_numpy(run.ngram.p_natural(samples)).float().to(run.rt.device)
    return SimpleNamespace(texts=(natural, samples), feats=None, judged=p, rewards=p, p_natural=p, real_feats=None,
                           probs=torch.stack([p, 1 - p], 1),
                           pair_acc=None, sight=sight_auc(run.ngram.p_natural(held_out), p.cpu().numpy()))


def judge_sight(batch, sight_probs, judged):
    """The judge's sight on this step's rollouts, which it has not learnt from: the AUC at ranking the fixed natural
    val windows (sight_probs: the judge's output on them; no judge trains on val) above the rollouts (judged: its raw
    P(natural), also under judge_off), both scored as the reward scores a rollout (a token judge: the mean P(natural)
    over the positions the row's rollout completes)."""
    real_judged = sight_probs[..., 0]
    if real_judged.dim() == 2:  # per position: the completion's own positions, as for the rollouts' rewards
        positions = batch.generated
        natural = (real_judged * positions).sum(1) / positions.sum(1)
        sampled = (judged * batch.generated).sum(1) / batch.generated.sum(1)
    else:
        natural, sampled = sequence_probs(sight_probs)[:, 0], judged
    return sight_auc(natural.cpu().numpy(), sampled.cpu().numpy())


def advantages_of(C, rt, rewards, judged, generated, rng=None, log_rho=None):
    """Group-normalised advantages, one per completion or (token_advantages) one per completion token; for the
    tilt's objectives, rewards are log-weights (tilt_advantages); judge_teacher's are 0 (the exact term moves it).
    Returns (advantages, groups with all-equal rewards, mean raw within-group std, the tilt's mean effective
    sample size a group or None). 'batch' scaling pools every rank's rewards; log_rho: a gated proposal's
    log pi/q a rollout (tilt_advantages)."""
    def batch_std(values):
        return global_std(values, rt)
    if C.objective in ('dpg', 'resample_mle'):
        return tilt_advantages(rewards, C.num_generations, C.objective, rng, log_rho)
    advantages, zero_std, group_std = group_advantages(rewards, C.num_generations, C.scale_rewards, batch_std)
    if C.token_advantages:
        advantages = token_advantages_of(judged, generated, C.num_generations, C.token_discount, C.scale_rewards,
                                         batch_std)
    if not C.teacher_sampled or C.objective == 'judge_teacher':  # the exact term alone: the sampled rewards are
        # logged, but no advantage carries them
        advantages = torch.zeros_like(advantages)
    return advantages, zero_std, group_std, None


def tilt_advantages(log_weights, group_size, objective, rng, log_rho=None):
    """Distribution matching towards the tilt: w = the self-normalised weights softmax(log w) within each group.
    'dpg': advantages G·w - 1 (the forward KL's gradient, sum_i w_i grad log pi(x_i), less the baseline
    (1/G) sum_i grad log pi(x_i), which is 0 in expectation; Korbak et al. 2022); drawn from a proposal q (log_rho =
    log pi/q), G·w - pi/q, whose baseline sum_i (pi/q)(x_i) grad log pi(x_i) is 0 in expectation under q.
    'resample_mle': G at one rollout a group drawn ∝ w (rng), 0 elsewhere: next-token loss on the kept ones.
    Returns (advantages, groups with all-equal weights, the mean within-group std of the log-weights, the mean
    effective sample size of a group, (sum w)^2 / sum w^2)."""
    groups = log_weights.double().view(-1, group_size)
    w = torch.softmax(groups, dim=1)
    if objective == 'dpg':
        advantages = group_size * w - (1 if log_rho is None else torch.exp(log_rho.double().view(-1, group_size)))
    else:
        kept = tilt_choice(groups.cpu().numpy(), 1.0, False, rng)
        advantages = torch.zeros_like(w)
        advantages[torch.arange(len(w)), torch.from_numpy(kept).to(w.device)] = group_size
    ess = float(np.mean([effective_sample_size(g) for g in groups.cpu().numpy()]))
    return (advantages.reshape(-1).to(log_weights.dtype), int((groups.std(dim=1) == 0).sum()),
            float(groups.std(dim=1).mean()), ess)


def proposal_gate(run, s, policy_state):
    """GDC's gate: the forward KL to the tilt p of the policy that scored this step's rollouts, less the proposal's,
    KL(p||pi) - KL(p||q) = E_p[log q/pi], estimated on the rollouts by their self-normalised weights within each
    group (log Z cancels); below 0, the proposal takes that policy's weights (policy_state, before this step's
    update). Returns the estimate (nats a completion, every rank's mean)."""
    groups = s.rewards.double().view(-1, run.C.num_generations)
    gap = all_reduce_mean(float((-torch.softmax(groups, dim=1) * s.log_rho.double().view_as(groups)).sum(1).mean()),
                          run.rt)
    if gap < 0:
        run.proposal.load_state_dict(policy_state)
        run.proposal_updates += 1
    return gap


def policy_update(run, batch, s):
    """num_iterations optimizer passes over these rollouts; the first pass fixes the rollout log-probs (ratio
    exactly 1). The policy stays in eval mode: no dropout in its log-probs (TRL's disable_dropout). 'dapo' and the
    NLL term divide by the global token count over the world size, so DDP's averaged gradient is the whole batch's."""
    C, rt = run.C, run.rt
    dapo_tokens = global_sum(batch.mask.sum(), rt).float() / rt.world_size
    real_tokens = global_sum(batch.real_mask.sum(), rt).float() / rt.world_size
    u = SimpleNamespace(stats={}, nll=None, old_logps=None, teacher_kl=None)
    for _ in range(C.num_iterations):
        with rt.ctx:
            logps, token_entropy, *exact_kl = token_logprobs(run.trained, batch.seqs, C.temperature,
                                                             entropy=u.old_logps is None, kl_to=s.target_logp,
                                                             kl_forward=C.teacher_kl == 'forward'
                                                             or C.objective == 'judge_teacher')
        if u.old_logps is None:
            u.old_logps = logps.detach()
            u.entropy = (token_entropy * batch.mask).sum() / batch.mask.sum()
        u.loss, pass_stats = grpo_loss(logps, u.old_logps, s.ref_logps, s.advantages, batch.mask, C.epsilon,
                                       C.epsilon_high, C.beta, C.loss_type, run.max_completion,
                                       token_count=dapo_tokens if rt.ddp else None)
        if exact_kl:  # MiniLLM's single-step term (judge_teacher: the tilt's law, weight 1), averaged over
            # completion tokens as the 'grpo' loss averages
            u.teacher_kl = ((exact_kl[0] * s.law_mask).sum(-1) / s.law_mask.sum(-1).clamp_min(1)).mean()
            u.loss = u.loss + (C.teacher_kl_weight or 1.0) * u.teacher_kl
        u.stats = u.stats or pass_stats  # KL of the rollout policy: measured on the first pass
        u.stats['clip_ratio'] = pass_stats['clip_ratio']
        run.optimizer.zero_grad(set_to_none=True)
        u.loss.backward()
        if C.nll_weight:  # its own forward and backward: DDP allows one forward per backward
            with rt.ctx:
                real_logps = token_logprobs(run.trained, batch.real, 1.0)[0]
            u.nll = -(real_logps * batch.real_mask).sum() / (real_tokens if rt.ddp else batch.real_mask.sum())
            (C.nll_weight * u.nll).backward()
        u.grad_norm = torch.nn.utils.clip_grad_norm_(run.policy.parameters(), C.grad_clip or float('inf')).item()
        run.optimizer.step()
    return u


def update_judge(run, batch, s, step, last_warmup=False):
    """The online judge (judge_update_interval = k > 0) learns from these rollouts and a replay of earlier ones
    every k steps, and on the warm-up's last batch (so k above max_steps is a judge fitted in the warm-up, then
    frozen); returns its mean loss, or None on a step it does not train. A judge whose trunk trains replays
    the token ids (its features change as it learns), a head-only judge the features this step computed."""
    C = run.C
    if not C.judge_update_interval:
        return None
    if run.ngram:
        return update_ngram_judge(run, s, step, last_warmup)
    labels = torch.stack([s.natural_share, 1 - s.natural_share], dim=1)
    if run.judge_loss_kind == 'binary':  # a whole rollout is synthetic, its prompt included
        labels = torch.stack([torch.zeros_like(s.natural_share), torch.ones_like(s.natural_share)], dim=1)
    if run.judge_trunk:
        natural = batch.real.repeat_interleave(C.num_generations, 0) if run.judge_loss_kind == 'pairwise' else None
        entry = [batch.seqs, labels, natural]
    else:
        entry = [s.feats.float().detach(), labels, s.real_feats]
    if C.judge_natural_windows:  # all natural: label [1, 0], every position natural
        windows = torch.from_numpy(sample_windows(run.train, C.judge_natural_windows, 1, 1, run.N,
                                                  run.judge_rng)[0]).to(run.rt.device)
        if not run.judge_trunk:
            with torch.no_grad(), run.rt.ctx:
                windows = run.reward_model.reward_features(windows).float()
            run.judge_flops += len(windows) * run.N * run.reward_model.flops_per_token() * run.rt.world_size
        entry[0] = torch.cat([entry[0], windows])
        entry[1] = torch.cat([labels, labels.new_tensor([[1.0, 0.0]]).expand(len(windows), 2)])
    run.replay.append(tuple(entry))
    if (step + 1) % C.judge_update_interval and not last_warmup:
        return None
    run.judge_flops += judge_update_flops(run)
    return judge_update(run.judge_fn, run.judge_params, run.judge_opt, run.replay, C.judge_steps,
                        C.judge_batch_size, run.judge_loss_kind, run.judge_gen, run.rt)


def judge_update_flops(run):
    """One update of the online judge: judge_steps minibatches forward and backward, through its trunk (a judge whose
    trunk trains), else through its head alone, at each of a token judge's N positions or once a row."""
    C = run.C
    rows = C.judge_batch_size * C.judge_steps * run.rt.world_size * (2 if run.judge_loss_kind == 'pairwise' else 1)
    if run.judge_trunk:
        return rows * run.N * run.reward_model.flops_per_token(backward=True)
    return rows * (run.N if run.reward_model.config.reward_pooling == 'token' else 1) * 6 * run.head_params


def update_ngram_judge(run, s, step, last_warmup=False):
    """The n-gram judge's replay takes this step's texts (every rank's, so every rank fits the same judge): the
    rollouts' completions, and natural text: the prompts' own continuations and judge_natural_windows more, cut
    where a prompt of the same law would end. Every k steps it is refit from scratch on the replay; returns its log
    loss there, or None on a step it does not refit."""
    C = run.C
    natural, samples = s.texts
    if C.judge_natural_windows:
        windows, lengths = sample_windows(run.train, C.judge_natural_windows, C.min_prompt_len, run.hi, run.N,
                                          run.judge_rng)
        natural = natural + completion_texts(run.tokenizer, torch.from_numpy(windows), lengths)
    run.replay.append((gather_lists(natural, run.rt), gather_lists(samples, run.rt)))
    if (step + 1) % C.judge_update_interval and not last_warmup:
        return None
    return run.ngram.fit([t for r in run.replay for t in r[0]], [t for r in run.replay for t in r[1]])


def log_row(run, step, lr, batch, s, u, times):
    """The step's row of the JSONL log (every rank's figures averaged), kept in the history and sent to the
    trackers."""
    rt, mean = run.rt, (lambda v: None if v is None else all_reduce_mean(v, run.rt))
    row = dict(step=step, reward=mean(s.rewards.mean().item()), reward_std=mean(s.rewards.std().item()),
               reward_group_std=mean(s.group_std), frac_reward_zero_std=mean(s.zero_std / run.n_prompts),
               reward_within_group_share=mean(within_group_share(s.rewards, run.C.num_generations)),
               kl=None if u.stats['kl'] is None else mean(u.stats['kl']), clip_ratio=mean(u.stats['clip_ratio']),
               entropy=mean(u.entropy.item()), grad_norm=u.grad_norm, loss=mean(u.loss.item()), lr=lr,
               completion_length=float(run.N - batch.lengths.mean()), time_generation=times[1] - times[0],
               time_scoring=times[2] - times[1], time_update=times[3] - times[2],
               judge_r2=mean(s.fresh['r2']), judge_boundary_error=mean(s.fresh['boundary_error']),
               judge_loss=u.judge_loss, nll=None if u.nll is None else mean(u.nll.item()),
               teacher_kl=None if u.teacher_kl is None else mean(u.teacher_kl.item()),
               judge_pair_accuracy=mean(s.pair_acc) if run.judge_loss_kind == 'pairwise' else None,
               judge_sight=mean(s.sight), ess=None if s.ess is None else mean(s.ess),
               proposal_gap=s.proposal_gap, proposal_updates=run.proposal_updates)
    if len(s.parts) > 1:  # each reward's own mean, before its weight (TRL logs rewards/<name>/mean)
        row.update({f'reward_{name}': mean(v.float().mean().item()) for name, v in s.parts.items()})
    run.history.append(row)
    run.reward_ma.append(row['reward'])
    if rt.master:
        run.tracker.log(row, step)
    return row


def should_stop(run, row, step, pre_update):
    """The stopping rules, decided on rank 0: the KL cap (keeping the last policy under it), then the reward
    rules. A judge-off control takes no reward-based stop: it runs its arm's steps (arm_log), whatever its
    constant reward does."""
    C = run.C
    if C.max_kl and row['kl'] is not None and row['kl'] > C.max_kl:
        run.stop_reason = f"max_kl: mean KL {row['kl']:.4f} exceeded {C.max_kl} at step {step}"
        return True
    run.last_ok_state, run.last_ok_step = pre_update, step
    if C.judge_off or len(run.reward_ma) < C.reward_window:
        return False
    ma = sum(run.reward_ma) / len(run.reward_ma)
    if ma >= C.reward_threshold and reward_is_p_natural(run):
        run.stop_reason = f"reward_threshold: moving average {ma:.4f} >= {C.reward_threshold}"
        return True
    run.stopper.step(ma)
    if run.stopper.should_stop:
        run.stop_reason = f"plateau: reward moving average did not improve by {C.min_delta} for {C.patience} steps"
        return True
    return False


def reward_is_p_natural(run):
    """Whether the logged reward is the judge's P(natural), the only reward reward_threshold reads (a pairwise
    judge's level says nothing: Bradley-Terry fixes only differences of its scores)."""
    C = run.C
    return (C.reward == 'judge' and C.reward_form == 'p_natural' and run.judge_loss_kind != 'pairwise'
            and C.objective == 'grpo' and not C.kl_in_reward and C.reward_scale == 1.0)


def report(run, step, row, batch, stop):
    """Every eval_interval steps (and at the end): the val perplexity into the row, a summary line and samples,
    and a checkpoint (the last step's is the final save)."""
    C = run.C
    row['val_ppl'] = val_ppl(run)
    if C.referee_samples:
        row['referee_auc'] = referee_auc(run)
    run.tracker.log({k: row[k] for k in ('val_ppl', 'referee_auc') if k in row}, step)
    judge = '' if row['judge_sight'] is None else \
        f"judge on fresh rollouts R2 {row['judge_r2']:.3f} sight {row['judge_sight']:.3f}, "
    parts = ''.join(f"{name} {row[f'reward_{name}']:.4f}, " for name in run.reward_names if f'reward_{name}' in row)
    tqdm.write(f"step {step + 1}: reward {row['reward']:.4f} (std {row['reward_std']:.4f}), {parts}{judge}"
               f"kl {row['kl'] if row['kl'] is None else round(row['kl'], 5)}, clip {row['clip_ratio']:.4f}, "
               f"entropy {row['entropy']:.3f}, val ppl {row['val_ppl']:.3f}"
               + (f", referee two-sample AUC {row['referee_auc']:.3f}" if 'referee_auc' in row else '')
               + "; time gen/score/update "
               f"{row['time_generation']:.2f}/{row['time_scoring']:.2f}/{row['time_update']:.2f}s")
    for seq in batch.seqs[:C.num_log_samples * C.num_generations:C.num_generations].tolist():
        tqdm.write('  | ' + run.tokenizer.decode(seq)[-120:].replace('\n', '\n  | '))
    if not stop and step + 1 < run.max_steps:
        save(run, step + 1, None)


def save_state(run, step):
    """Everything an exact continuation needs after this step (each rank its own draws and replay)."""
    judge_on = run.judge_opt is not None
    save_resume_state(run.state_path, dict(
        signature=run.signature, step=step, policy=run.policy.state_dict(), optimizer=run.optimizer.state_dict(),
        reference=run.reference.state_dict() if run.reference is not None else None,
        proposal=run.proposal.state_dict() if run.proposal is not None else None,
        proposal_updates=run.proposal_updates,
        judge=run.reward_model.state_dict() if judge_on else None, warmup=run.warmup,
        judge_optimizer=run.judge_opt.state_dict() if judge_on else None,
        ngram_fitted_on=run.ngram.fitted_on if run.ngram else None,
        replay=[tuple(r) for r in run.replay], rng=rng_states(run.rng, run.gen, run.judge_gen),
        judge_rng=run.judge_rng.bit_generator.state, resample_rng=run.resample_rng.bit_generator.state,
        shuffle_rng=run.shuffle_rng.bit_generator.state, law_rng=run.law_rng.bit_generator.state,
        history=run.history,
        ppl_start=run.ppl_start, referee_start=run.referee_start, judge_flops=run.judge_flops,
        reward_ma=list(run.reward_ma),
        stopper=run.stopper.state_dict(), last_ok_state=run.last_ok_state, last_ok_step=run.last_ok_step))


def restore_state(run, state):
    """Everything the next step reads, as the interrupted run left it after its step state['step'] - 1; returns
    the step to continue from."""
    run.policy.load_state_dict(state['policy'])
    run.optimizer.load_state_dict(state['optimizer'])
    if run.reference is not None:
        run.reference.load_state_dict(state['reference'])
    if run.proposal is not None:
        run.proposal.load_state_dict(state['proposal'])
    run.proposal_updates = state['proposal_updates']
    if run.judge_opt is not None:
        run.reward_model.load_state_dict(state['judge'])
        run.judge_opt.load_state_dict(state['judge_optimizer'])
        run.replay.extend(tuple(None if t is None else t.to(run.rt.device) for t in r) for r in state['replay'])
    if run.ngram:  # its texts: refit on what it was fitted on, it is the same judge (the fit is deterministic)
        run.replay.extend(tuple(r) for r in state['replay'])
        if state['ngram_fitted_on'] is not None:
            run.ngram.fit(*state['ngram_fitted_on'])
    set_rng_states(state['rng'], run.rng, run.gen, run.judge_gen)
    run.history, run.ppl_start, run.judge_flops = state['history'], state['ppl_start'], state['judge_flops']
    run.referee_start = state['referee_start']
    run.warmup = state['warmup']
    run.judge_rng.bit_generator.state = state['judge_rng']
    run.resample_rng.bit_generator.state = state['resample_rng']
    run.shuffle_rng.bit_generator.state = state['shuffle_rng']
    run.law_rng.bit_generator.state = state['law_rng']
    run.reward_ma.extend(state['reward_ma'])
    run.stopper.load_state_dict(state['stopper'])
    run.last_ok_state, run.last_ok_step = state['last_ok_state'], state['last_ok_step']
    if state['step'] >= run.max_steps:
        raise UserError(f"{run.state_path} is already at step {state['step']}: raise max_steps to continue it")
    return state['step']


def judge_warmup(run):
    """judge_warmup_steps rollout batches the online judge learns from before the policy moves (GAD's warm-up):
    its sight on each batch before it learns from it, logged apart from the policy's steps; their generation, scoring
    and updates are counted in the judge's FLOPs. It learns on the last batch whatever judge_update_interval says."""
    C, rt = run.C, run.rt
    rows = C.prompts_per_step * C.num_generations
    for w in tqdm(range(C.judge_warmup_steps), desc='judge warm-up', disable=not rt.master, dynamic_ncols=True,
                  leave=False):
        batch = rollouts(run)
        s = score(run, batch, reference=False)  # no policy update: the reference's log-probs go unused
        loss = update_judge(run, batch, s, w, last_warmup=w + 1 == C.judge_warmup_steps)
        run.judge_flops += rows * run.N * (run.policy.flops_per_token() + judge_flops_per_token(run))
        run.warmup.append(dict(step=w, judge_sight=all_reduce_mean(s.sight, rt), judge_loss=loss,
                               judge_r2=all_reduce_mean(s.fresh['r2'], rt)))
    if run.warmup and rt.master:
        print(f"judge warm-up: {len(run.warmup)} batches, sight {run.warmup[0]['judge_sight']:.3f} -> "
              f"{run.warmup[-1]['judge_sight']:.3f} on batches it had not seen")


def start(run, state):
    """Fresh or resumed: the log file rewritten with the steps it resumes with, and the opening line."""
    C = run.C
    first_step = restore_state(run, state) if state is not None else 0
    run.tracker = Tracker(C, f"grpo/{os.path.basename(os.path.splitext(C.out_path)[0])}",
                          os.path.dirname(os.path.abspath(C.out_path)), run.rt.master,
                          resume_step=first_step if state is not None else None)
    if state is None:
        run.ppl_start = val_ppl(run) if run.rt.master else None
        run.referee_start = referee_auc(run) if C.referee_samples and run.rt.master else None
        judge_warmup(run)
    run.log_started = False
    if run.rt.master:
        if state is not None:  # the steps it resumes with; a fresh run's log starts with its first step (write_log)
            write_log(run)
        judge = ('the n-gram judge (TF-IDF logistic regression, refit every '
                 f'{C.judge_update_interval} steps)') if run.ngram else f"reward model {C.reward_model_path}" \
            if run.reward_model is not None else f"no judge (--reward={C.reward} reads none: sight, R2 and the " \
            "judge's updates are off)"
        print(f"policy {C.policy_path} ({run.policy.get_num_params() / 1e6:.2f}M), {judge}; "
              f"{C.prompts_per_step} prompts x {C.num_generations} completions per step, "
              f"N={run.N}; val ppl ({run.ppl_tokens}) at start {run.ppl_start:.3f}"
              + (f"; resumed at step {first_step} from {run.state_path}" if state else '')
              + ('; judge OFF: constant reward, zero advantages' if C.judge_off else '')
              + (f"; {run.max_steps} steps, as its arm ({C.arm_log})" if C.arm_log else ''))
    return first_step


def write_log(run):
    """The JSONL log: the whole history the first time (a fresh run's first step, or the steps a resumed one
    continues from), then each new row; so a run that stops before its first step leaves no log behind."""
    rows = run.history if not run.log_started else run.history[-1:]
    if not run.log_started:
        os.makedirs(os.path.dirname(os.path.abspath(run.C.out_path)), exist_ok=True)
    with open(run.log_path, 'a' if run.log_started else 'w') as f:
        f.writelines(json.dumps(row) + '\n' for row in rows)
    run.log_started = True


def finish(run, step, batch, s):
    """The saved policy: under a KL stop the last one under the cap (its KL is its own rollouts'), else the
    updated one (its KL measured on the last rollouts, its perplexity logged after the update); the summary."""
    C, history = run.C, run.history
    if run.stop_reason.startswith('max_kl'):
        if run.last_ok_state is None:
            raise UserError(f"the starting policy already exceeds max_kl={C.max_kl}; raise --max_kl")
        run.policy.load_state_dict(run.last_ok_state)
        final_step, final_kl, final_ppl = run.last_ok_step, history[run.last_ok_step]['kl'], val_ppl(run)
        print(f"kept the policy of step {run.last_ok_step}, the last under the KL cap")
    else:
        final_step, final_ppl, final_kl = step + 1, history[-1]['val_ppl'], None
        if run.reference is not None:
            with torch.no_grad(), run.rt.ctx:
                logps = token_logprobs(run.policy, batch.seqs, C.temperature)[0]
            final_kl = float((k3_kl(logps, s.ref_logps) * batch.mask).sum() / batch.mask.sum())
    save(run, final_step, run.stop_reason, final_kl=final_kl, final_val_ppl=final_ppl, judge_off=C.judge_off)
    if C.calibrate:
        record_and_say(C.out_path, C.dataset, run.rt.device)
    first, last = [h['reward'] for h in history[:10]], [h['reward'] for h in history[-10:]]
    t = {k: sum(h[f'time_{k}'] for h in history) for k in ('generation', 'scoring', 'update')}
    print(f"done: {len(history)} steps; stopped by {run.stop_reason}"
          + ('' if run.reward_model is not None or run.ngram else "; no judge played or was measured")
          + (f"; the gated proposal took the policy's weights {run.proposal_updates} times" if run.proposal is not None
             else ''))
    print(f"mean reward: first {len(first)} steps {np.mean(first):.4f}, last {len(last)} steps {np.mean(last):.4f}; "
          f"saved policy: val ppl ({run.ppl_tokens}) {run.ppl_start:.3f} -> {final_ppl:.3f}, KL to the reference "
          f"{'–' if final_kl is None else format(final_kl, '.4f')}; "
          f"{run.flops_per_step * len(history):.3g} FLOPs")
    total = sum(t.values())
    plot_history(history, run.plot_path, run.referee_start)
    print("time: " + ', '.join(f"{k} {v:.1f}s ({100 * v / total:.0f}%)" for k, v in t.items())
          + f"; saved {C.out_path}, log {run.log_path}, plot {run.plot_path}")


def finished_here(run):
    """Whether out_path holds this very run (the resume signature: settings and inputs), finished: --resume=True then
    leaves it as it is and says so, where it would otherwise play it again over its checkpoint and log. A finished
    run cannot be extended (its resume state went at its end): a larger max_steps is an error."""
    C = run.C
    if not os.path.isfile(C.out_path) or os.path.exists(run.state_path):
        return False
    metrics = load_checkpoint(C.out_path)['metrics']
    if metrics.get('signature') != run.signature or 'final_val_ppl' not in metrics:
        return False
    steps = len(metrics['history'])
    if steps < run.max_steps and metrics['stop_reason'] == 'max_steps':
        raise UserError(f"{C.out_path} is this run, finished at {steps} steps; it cannot be extended to "
                        f"{run.max_steps} (its resume state went at its end): play the longer run to another "
                        "--out_path")
    if run.rt.master:
        print(f"{C.out_path} is this run, finished ({steps} steps, {metrics['stop_reason']}): nothing to resume; "
              "left as it is")
    return True


# -----------------------------------------------------------------------------

def main(argv):
    C = configure(DEFAULTS, argv, RANGES, RELATIONS)
    check_config(C)
    rt = setup_runtime(C.device, C.backend, C.dtype, C.seed)
    if C.prompts_per_step % rt.world_size:
        raise UserError(f"prompts_per_step {C.prompts_per_step} must divide by the {rt.world_size} ranks")
    run = setup(C, rt)
    if C.resume and finished_here(run):
        rt.close()
        return
    first_step = start(run, load_resume_state(run.state_path, run.signature) if C.resume else None)
    # the bar closes on an error too, so a one-line error stands on its own line
    with tqdm(total=run.max_steps, initial=first_step, desc='grpo', disable=not rt.master, dynamic_ncols=True,
              mininterval=2.0) as bar:
        for step in range(first_step, run.max_steps):
            lr = warmup_lr(run.optimizer, C.learning_rate, C.warmup_steps, step)
            t0 = time.time()
            batch = rollouts(run)
            t1 = time.time()
            s = score(run, batch)
            s.advantages, s.zero_std, s.group_std, s.ess = advantages_of(C, rt, s.rewards, s.judged, batch.generated,
                                                                         run.resample_rng, s.log_rho)
            t2 = time.time()
            # the policy that made these rollouts, kept while its KL is under the cap
            pre_update = ({k: v.detach().clone() for k, v in run.policy.state_dict().items()}
                          if C.max_kl or C.kl_anchor == 'judge' or run.proposal is not None else None)
            u = policy_update(run, batch, s)
            s.proposal_gap = proposal_gate(run, s, pre_update) if run.proposal is not None else None
            u.judge_loss = update_judge(run, batch, s, step)
            if C.kl_anchor == 'judge' and u.judge_loss is not None and run.reference is not None:
                run.reference.load_state_dict(pre_update)  # the KL anchored where the judge was just fit
            row = log_row(run, step, lr, batch, s, u, (t0, t1, t2, time.time()))
            stop = False
            if rt.master:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.3f}", kl=f"{row['kl'] or 0:.4f}", refresh=False)
                stop = should_stop(run, row, step, pre_update)
                if (step + 1) % C.eval_interval == 0 or step + 1 == run.max_steps or stop:
                    report(run, step, row, batch, stop)
                write_log(run)
            if broadcast_stop(stop, rt):
                break
            if (step + 1) % C.eval_interval == 0 and step + 1 < run.max_steps:
                save_state(run, step + 1)
    if rt.master:
        finish(run, step, batch, s)
    run.tracker.close()
    if os.path.exists(run.state_path):  # finished: nothing left to resume
        os.remove(run.state_path)
    rt.close()


if __name__ == '__main__':
    run_cli(main)
