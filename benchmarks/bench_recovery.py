"""
How much of a right reward's movement each learned judge recovers, at equal steps and settings.

On a finished positive-controls run (bench_arms.py with --run RUN --out ARMS and the teacher, exact-reward arms),
the learned judges play base v1 through train_grpo.py at the positive controls' GRPO settings (200 steps of 8 prompts
x 8 completions, lr 1e-4, beta 0.04, group scaling, the cycle's seed, all 200 steps): each judge given (default: the
run's own), frozen and co-trained online as the arms co-train it, and the n-gram judge refit online. Every policy,
those and the arms' own (teacher, exact reward, judge-off), is then read by one referee of naturalness that none of
them is: the teacher. On
each policy's own continuations of fixed val prompts it measures, exactly over the vocabulary, the per-token reverse
KL(policy || teacher) and KL(policy || base v1) (how far the policy moved). A policy's movement is the fall of its
reverse KL to the teacher from base v1's; its recovery is that fall over the teacher arm's.

  python benchmarks/bench_recovery.py --run runs/arms_positive/known_words --arms runs/arms_positive \
      [--reward_model runs/cycles_shakespeare_char/reward_model_v1.pt,runs/arms_positive/window30k/reward_model_v1.pt]
      [--teacher teacher_plateau] [--reference_arm teacher_plateau_forward_w10] [--png docs/img/recovery.png]

Prints one table (per policy: its own reward and a learned judge's sight on the rollouts, first 10 -> last 10 steps,
KL to base v1, reverse KL to the teacher, the fall with its 95% bootstrap interval, the recovery) and draws the fall
against the KL.
"""
import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import data_path  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from policy import token_logprobs  # noqa: E402
from bench_arms import CO_TRAINED_SLOW, NGRAM, POSITIVE  # noqa: E402
from configurator import configure  # noqa: E402
from run_cycles import DEFAULTS, _plt, first_last, grpo_cmd, load_json  # noqa: E402
from two_sample import eval_windows  # noqa: E402

# what the run's own arm set and the judge arms must not inherit: they play the run's judge, frozen, as the reward
JUDGE_REWARD = dict(grpo_token_advantages=False, grpo_nll_weight=0.0, grpo_reward='judge', grpo_teacher_path='',
                    grpo_teacher_kl_weight=0.0, grpo_judge='model', grpo_judge_update_interval=0,
                    grpo_token_discount=DEFAULTS['grpo_token_discount'], grpo_teacher_kl=DEFAULTS['grpo_teacher_kl'])
NGRAM_LABEL = 'n-gram judge refit online'  # needs no judge model: played once


def judge_plays(reward_model):
    """How a learned judge plays: frozen, and co-trained online as the arms co-train it (a binary whole-window judge
    every weight at the rate that keeps its sight, against 64 natural windows a step; any other judge its head)."""
    if load_checkpoint(reward_model).get('config', {}).get('loss', 'mse') == 'binary':
        return {'frozen': [], 'co-trained online (every weight, lr 3e-5)': CO_TRAINED_SLOW}
    return {'frozen': [], 'co-trained online (head)': ['--grpo_judge_update_interval=1']}


# the arms' own policies: label -> (the arm's folder, its checkpoint, its GRPO log)
ARMS = {
    'teacher reward, plateau teacher + exact forward KL, lr 1e-3': ('teacher_plateau_forward_lr1e-3',
                                                                     'base_model_v2.pt', 'grpo_v1_log.jsonl'),
    'teacher reward, plateau teacher + exact forward KL x10, lr 3e-4': ('teacher_plateau_forward_w10',
                                                                        'base_model_v2.pt', 'grpo_v1_log.jsonl'),
    'teacher reward, plateau teacher + exact forward KL': ('teacher_plateau_forward', 'base_model_v2.pt',
                                                           'grpo_v1_log.jsonl'),
    'teacher reward, plateau teacher + exact reverse KL': ('teacher_plateau_exact', 'base_model_v2.pt',
                                                           'grpo_v1_log.jsonl'),
    'teacher reward, 2,500-iteration teacher, sampled': ('teacher', 'base_model_v2.pt', 'grpo_v1_log.jsonl'),
    'exact reward (known words), beta 0.04': ('known_words', 'base_model_v2.pt', 'grpo_v1_log.jsonl'),
    'exact reward (known words), beta 1': ('known_words_beta1', 'base_model_v2.pt', 'grpo_v1_log.jsonl'),
    'judge off': ('known_words', 'judgeoff_v2.pt', 'judgeoff_v1_log.jsonl'),
}
SAMPLES, PROMPT, NEW_TOKENS, BOOT = 512, 8, 120, 1000


def judge_arm_cmd(run, C, overrides, reward_model, path):
    """train_grpo.py's call for base v1 against a learned judge (reward_model; the n-gram judge needs none) at the
    positive controls' settings, whatever reward the run's own arm played."""
    A = configure({**DEFAULTS, **vars(C), **JUDGE_REWARD}, POSITIVE + overrides)  # (keys newer than the run too)
    # equal steps: a judge played to a hack must not end its arm early at the cycle's reward threshold
    return grpo_cmd(A, os.path.join(run, 'base_model_v1.pt'), reward_model, data_path(C.dataset), path, C.seed + 1) \
        + ['--reward_threshold=2.0']


def train_judge_arm(run, C, name, overrides, out, reward_model):
    """Trains that arm into OUT/NAME.pt unless it is there; returns (checkpoint, log)."""
    path = os.path.join(out, name + '.pt')
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([sys.executable, *judge_arm_cmd(run, C, overrides, reward_model, path)], check=True)
    return path, path[:-3] + '_log.jsonl'


def read_policy(path, teacher, base, prompts, seed):
    """Per sample, the mean over its completion of the exact KL(policy || teacher), KL(policy || base v1) and
    KL(teacher || policy), on the policy's own continuations of the prompts (temperature 1)."""
    policy = GPT.from_checkpoint(path).eval()
    with torch.no_grad():
        seqs = policy.generate(prompts, NEW_TOKENS, 1.0, None, generator=torch.Generator().manual_seed(seed))
        figures = []
        for other, forward in ((teacher, False), (base, False), (teacher, True)):
            logp = torch.log_softmax(other(seqs[:, :-1], all_logits=True)[0].float(), dim=-1)
            kl = token_logprobs(policy, seqs, 1.0, kl_to=logp, kl_forward=forward)[2][:, PROMPT - 1:]
            figures.append(kl.mean(1).numpy())
    return figures


def own_figures(log_path):
    """The policy's own reward and its judge's sight on the rollouts, 'first 10 → last 10' GRPO steps ('–' for base
    v1, a missing log or a figure not logged)."""
    history = [json.loads(line) for line in open(log_path)] if log_path and os.path.exists(log_path) else []
    steps = [h for h in history if 'reward' in h]
    return first_last(steps, 'reward'), first_last(steps, 'judge_sight')


def judge_names(reward_models):
    """Each learned judge's name: the folder of its run ('error' when two share one)."""
    names = [os.path.basename(os.path.dirname(os.path.abspath(path))) for path in reward_models]
    if len(set(names)) < len(names):
        sys.exit(f"error: --reward_model judges must come from distinct run folders, got {', '.join(reward_models)}")
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    p.add_argument('--run', required=True, help="the run the arms copied (base v1, its judge, the teachers)")
    p.add_argument('--arms', required=True, help="bench_arms.py's --out folder holding the arms")
    p.add_argument('--teacher', default='teacher_plateau', help="the teacher that reads every policy")
    p.add_argument('--reference_arm', default='teacher_plateau_forward_w10',
                   help="the arm whose movement is 100%%")
    p.add_argument('--reward_model', default='', help="the learned judge(s), comma-separated, each played frozen and "
                   "co-trained into OUT/<its run folder>/ (default: RUN/reward_model_v1.pt; its sight on the rollouts "
                   "is logged as judge_sight)")
    p.add_argument('--out', default='', help="where the judge arms are trained (default: ARMS/recovery)")
    p.add_argument('--png', default='', help="the plot (default: OUT/recovery.png)")
    p.add_argument('--seed', type=int, default=1337)
    a = p.parse_args()
    out = a.out or os.path.join(a.arms, 'recovery')
    C = SimpleNamespace(**load_json(os.path.join(a.run, 'config.json')))
    teacher_path = os.path.join(a.run, f'{a.teacher}.pt')
    if not os.path.exists(teacher_path):
        sys.exit(f"error: {teacher_path} not found: run bench_arms.py --run {a.run} with a {a.teacher} arm first")
    policies = {'base v1': (os.path.join(a.run, 'base_model_v1.pt'), None)}
    reference = None
    for label, (arm, ckpt, log) in ARMS.items():
        if os.path.exists(os.path.join(a.arms, arm, ckpt)):
            policies[label] = (os.path.join(a.arms, arm, ckpt), os.path.join(a.arms, arm, log))
            reference = label if arm == a.reference_arm else reference
        else:
            print(f"skipped {label}: {os.path.join(a.arms, arm, ckpt)} not found", flush=True)
    if reference is None:
        sys.exit(f"error: the reference arm {a.reference_arm} has no policy under {a.arms}: run it with bench_arms.py")
    reward_models = (a.reward_model or os.path.join(a.run, 'reward_model_v1.pt')).split(',')
    for path in reward_models:
        if not os.path.exists(path):
            sys.exit(f"error: the judge {path} not found: pass a run's reward_model_v1.pt to --reward_model")
    for path, name in zip(reward_models, judge_names(reward_models)):
        for play, overrides in judge_plays(path).items():
            tag = 'frozen_judge' if play == 'frozen' else 'judge_co-trained_online'
            policies[f'{name} judge, {play}'] = train_judge_arm(a.run, C, os.path.join(name, tag), overrides, out,
                                                                path)
    policies[NGRAM_LABEL] = train_judge_arm(a.run, C, 'n-gram_judge_refit_online', NGRAM, out, reward_models[0])

    teacher, base = GPT.from_checkpoint(teacher_path).eval(), GPT.from_checkpoint(policies['base v1'][0]).eval()
    val = np.memmap(os.path.join(data_path(C.dataset), 'val.bin'), dtype=np.uint16, mode='r')
    prompts = eval_windows(val, SAMPLES, PROMPT, a.seed)[1]
    rng = np.random.default_rng(a.seed)
    reads = {label: read_policy(path, teacher, base, prompts, a.seed) for label, (path, _) in policies.items()}
    # bootstrap the fall of the reverse KL from base v1's, each policy's samples resampled on their own
    boot = {label: np.array([rng.choice(to_teacher, len(to_teacher)).mean() for _ in range(BOOT)])
            for label, (to_teacher, _, _) in reads.items()}
    falls = {label: boot['base v1'] - boot[label] for label in reads}
    ref_fall = reads['base v1'][0].mean() - reads[reference][0].mean()
    rows, points = [], []
    print('\n| policy | own reward, first 10 → last 10 steps | its judge\'s sight on the rollouts (same) | '
          'KL to base v1 (nats/token) | forward KL from the teacher | reverse KL to the teacher | its fall from base v1 (95% interval) | recovery of the teacher '
          'arm\'s fall (95% interval) |')
    print('|---|---|---|---|---|---|---|---|')
    for label, (to_teacher, to_base, from_teacher) in reads.items():
        fall = reads['base v1'][0].mean() - to_teacher.mean()
        ci = np.percentile(falls[label], [2.5, 97.5])
        rec = np.percentile(falls[label] / falls[reference], [2.5, 97.5])
        rows.append(f"| {label} | {' | '.join(own_figures(policies[label][1]))} | {to_base.mean():.4f} | "
                    f"{from_teacher.mean():.4f} | {to_teacher.mean():.4f} | {fall:+.4f} "
                    f"[{ci[0]:+.4f}, {ci[1]:+.4f}] | {fall / ref_fall:.0%} [{rec[0]:.0%}, {rec[1]:.0%}] |")
        points.append((label, to_base.mean(), fall, ci))
    print('\n'.join(rows))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 5))
    for (label, kl, fall, ci), color in zip(points, plt.cm.tab20.colors):
        ax.errorbar(kl, fall, yerr=[[fall - ci[0]], [ci[1] - fall]], fmt='o', capsize=3, label=label, color=color)
    ax.axhline(0, color='grey', lw=0.5)
    # symmetric log axes: a judge played to a hack moves the policy 30 times as far as the right rewards do
    ax.set_xscale('symlog', linthresh=0.01)
    ax.set_yscale('symlog', linthresh=0.01)
    ax.set_xlim(0, 1.5 * max(kl for _, kl, _, _ in points))  # a KL is never negative; room for the furthest point
    ax.set_xlabel('KL(policy || base v1), nats/token, on its own samples')
    ax.set_ylabel(f'fall of reverse KL to the teacher ({a.teacher}), nats/token')
    ax.set_title('Movement toward a better model: right rewards, learned judges, judge off')
    ax.legend(fontsize=7, loc='center left', bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    png = a.png or os.path.join(out, 'recovery.png')
    fig.savefig(png + '.partial.png', dpi=120)
    os.replace(png + '.partial.png', png)
    print(f"\nplot: {png}")


if __name__ == '__main__':
    main()
