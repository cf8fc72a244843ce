"""
The arms of the self-play question, side by side on a finished default run: the judge arms (the frozen pointwise
judge of the seed, online, token-level with and without per-token advantages, a stronger trunk, online + token),
SPIN (plain and with an NLL term) and GRPO with real text in its loss. Each arm is the default cycle with a few
settings changed, run by run_cycles.py in a copy of the default run's directory, so base v1 is shared and only what
the arm changes is rebuilt. Seeds repeat an arm on the same base v1 (run_cycles --trainer_seed s), each with its own
draws: its judge's data and training, its evaluations' prompts, windows and samples, its temperature sweep and its
MLE and judge-off controls, all seeded from s; arms run with the same seed share that seed's controls (a copy of the
seed's first run, whose stages the manifests keep where their commands are the same).

  python benchmarks/bench_arms.py [--run runs/cycles_shakespeare_char] [--out runs/bench_arms] [--arms a,b]
      [--seeds 0,2000,3000] [--cycles 1] [--png docs/img/arms_quality_diversity.png]

Prints, per arm, seed and cycle, the judge's quality on the referee's held-out crossover data (GRPO arms: base v1's
reward data, the test half of its val split; an online judge as GRPO left it), its boundary error on each GRPO
step's unseen rollouts, the reward, the KL, the new version as the three referees measure it (fresh judges, the
two-sample test, MAUVE) and the computed verdicts against the MLE, temperature and (GRPO) judge-off controls; then,
per arm and cycle, the means and spreads over seeds; and draws every arm on cycle 1's quality-diversity plane beside
base v1's temperature sweep and the MLE controls.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import data_path  # noqa: E402
from model import GPT, load_checkpoint  # noqa: E402
from run_cycles import _plt, base_train_args, first_last, judge_worth, load_json  # noqa: E402
from reward_dataset_loader import RewardDataset  # noqa: E402
from judge import pair_accuracy, reward_metrics  # noqa: E402
from verdict import fresh_judge_figure, label_text, method_verdict  # noqa: E402


# every arm starts from the seed's judge design as the default config had it before the arms table (mean-pooled,
# frozen, pointwise, GRPO without real text), whatever the default config is now
SEED_DESIGN = ['--trainer=grpo', '--reward_pooling=mean', '--reward_loss=mse', '--grpo_judge_update_interval=0',
               '--grpo_token_advantages=False', '--grpo_nll_weight=0.0']


# the judge that sees most on CPU (docs/judges.md): natural windows against the base's continuations of 8-token
# prompts, every weight of the base's network trained as a mean-pooled binary judge, frozen during GRPO
WINDOW_JUDGE = ['--reward_crossover_k=8', '--reward_samples_per_chunk=1', '--reward_max_blocks=10000',
                '--reward_loss=binary', '--reward_unfreeze_layers=-1', '--reward_learning_rate=3e-4',
                '--reward_max_epochs=5', '--reward_max_iters=100000']


# the recipe on 30,000 windows: the GPT judge that reaches 0.90 sight on the default base v1's samples
JUDGE_30K = ['--reward_max_blocks=30000', '--reward_eval_interval=200']


# the positive controls' GRPO: the probe's (200 steps of 8 prompts x 8 completions, lr 1e-4, beta 0.04, TRL's group
# scaling), the judge of the seed frozen and read as an instrument only
# a judge outside the GPT form, the n-gram referee's own classifier: fitted on 20 warm-up batches, refit every step on
# the last 16 (1,024 rollouts against 1,152 natural continuations); its arm adds WINDOW_JUDGE, which keeps the cycle's
# reward model as the run it copies trained it, read on the new version as a GPT judge that did not play
NGRAM = ['--grpo_judge=ngram', '--grpo_judge_update_interval=1', '--grpo_judge_warmup_steps=20',
         '--grpo_judge_natural_windows=64', '--grpo_judge_replay=15']
# a whole-window judge co-trained online: every weight, 64 natural windows a step against the rollouts
CO_TRAINED = ['--grpo_judge_update_interval=1', '--grpo_judge_unfreeze_layers=-1', '--grpo_judge_learning_rate=3e-4',
              '--grpo_judge_natural_windows=64']
# the same judge at a tenth of that rate: with the policy held, 60 batches at 3e-4 take its sight on base v1 from
# 0.709 to 0.574 and at 3e-5 keep it (0.718; docs/log/arms.md, "The co-trained judge blinds itself")
CO_TRAINED_SLOW = CO_TRAINED + ['--grpo_judge_learning_rate=3e-5']  # a later --key=value overrides an earlier one
POSITIVE = ['--grpo_max_steps=200', '--grpo_learning_rate=1e-4', '--grpo_beta=0.04', '--grpo_scale_rewards=group',
            '--grpo_eval_interval=50']
# the teachers, trained once per run by train.py, their cost their own: name -> (the checkpoint they start from, their
# options). teacher_2500 is the probe's: base v1 + 2,500 iterations at a tenth of the base's learning rate, its last
# checkpoint. teacher_plateau trains on from it towards the plateau (config/game_converged.py's 1.399 val loss):
# 4,000 iterations more, 100 of warm-up (a fresh optimizer), cosine from a quarter of the base's rate, its last
# checkpoint (its start trained on every train token, so no held-out train tokens are left to select on)
def teachers(C):
    return {'teacher_2500': ('base_model_v1.pt', ['--max_iters=2500', '--decay_lr=False',
                                                  f'--learning_rate={C.base_learning_rate / 10}', '--warmup_iters=0',
                                                  '--eval_interval=500', '--always_save_checkpoint=True']),
            'teacher_plateau': ('teacher_2500.pt', ['--max_iters=4000', '--lr_decay_iters=4000',
                                                    f'--learning_rate={C.base_learning_rate / 4}',
                                                    f'--min_lr={C.base_learning_rate / 40}', '--eval_interval=500',
                                                    '--warmup_iters=100', '--always_save_checkpoint=True'])}


def teacher_path(run, name='teacher_2500'):
    return os.path.join(run, f'{name}.pt')


def arms(run):
    """Arm -> (its label, its run_cycles.py overrides on top of the default config and SEED_DESIGN)."""
    online_token = ['--grpo_judge_update_interval=1', '--reward_pooling=token']
    spin = ['--trainer=spin', '--spin_max_steps=300']  # 300 steps of 16 pairs: the GRPO cycle's wall-clock
    # the teacher arms: a teacher's per-token log-ratio, per-token credit (a later --key=value overrides an earlier one)
    def teacher(name):
        return POSITIVE + ['--grpo_reward=teacher', f'--grpo_teacher_path={teacher_path(run, name)}',
                           '--grpo_token_advantages=True', '--grpo_token_discount=1.0']
    plateau = teacher('teacher_plateau')
    forward = plateau + ['--grpo_teacher_kl_weight=1.0', '--grpo_teacher_kl=forward']
    forward_w10 = forward + ['--grpo_teacher_kl_weight=10.0', '--grpo_learning_rate=3e-4']
    known_words = POSITIVE + ['--grpo_reward=known_words']
    # the game whose fixed point is the tilt: no k3 term, centred unscaled advantages, Dr. GRPO's constant normaliser
    game = POSITIVE + ['--grpo_beta=0', '--grpo_scale_rewards=none', '--grpo_loss_type=dr_grpo',
                       '--grpo_learning_rate=1e-5', '--grpo_kl_in_reward=True']
    ratio = game + ['--grpo_reward=teacher_ratio', f'--grpo_teacher_path={teacher_path(run, "teacher_plateau")}',
                    '--grpo_reward_scale=0.3']
    ratio_kl, ratio_dpg = ratio, ratio + ['--grpo_kl_in_reward=False', '--grpo_objective=dpg']
    return {
        'frozen': ('frozen pointwise judge (the seed)', []),
        'online': ('online pointwise', ['--grpo_judge_update_interval=1']),
        'token': ('token-level', ['--reward_pooling=token']),
        'token_adv': ('token-level, per-token advantages', ['--reward_pooling=token', '--grpo_token_advantages=True']),
        'trunk': ('stronger trunk (MLE control v2)', [f'--reward_trunk_path={os.path.join(run, "mle_v2.pt")}']),
        'online_token': ('online token-level', online_token),
        'pairwise': ('online pairwise (Bradley-Terry)', ['--grpo_judge_update_interval=1', '--reward_loss=pairwise']),
        'spin': ('SPIN', spin),
        'spin_nll': ('SPIN + NLL weight 1', spin + ['--spin_nll_weight=1.0']),
        'real': ('online token-level + real text (NLL weight 1)', online_token + ['--grpo_nll_weight=1.0']),
        'window': ('whole-window judge (every weight trained, 10k windows x 5 epochs) + real text', WINDOW_JUDGE
                   + ['--grpo_nll_weight=1.0']),
        'window_pure': ('whole-window judge, no real text', WINDOW_JUDGE),
        # the same recipe on 30,000 windows, 84% of the char train split, evaluated every 200 steps as measured: on the
        # default base v1 it reads the base's samples at 0.904-0.921 over 3 seeds (docs/judges.md); frozen, as 'window'
        'window30k': ('whole-window judge on 30k windows + real text', WINDOW_JUDGE + JUDGE_30K
                      + ['--grpo_nll_weight=1.0']),
        # co-trained at the rate that keeps a judge's sight (3e-5), with real text: the issue's seeing judge online
        'window30k_online_slow': ('whole-window judge on 30k windows co-trained online at judge lr 3e-5 + real text',
                                  WINDOW_JUDGE + JUDGE_30K + CO_TRAINED_SLOW + ['--grpo_nll_weight=1.0']),
        'window_online': ('whole-window judge co-trained online (every weight, 64 natural windows a step) + real text',
                          WINDOW_JUDGE + CO_TRAINED + ['--grpo_nll_weight=1.0']),
        'window_online_pure': ('whole-window judge co-trained online, no real text', WINDOW_JUDGE + CO_TRAINED),
        'window_online_slow_pure': ('whole-window judge co-trained online at judge lr 3e-5, no real text',
                                    WINDOW_JUDGE + CO_TRAINED_SLOW),
        'ngram_online_pure': ("n-gram judge (the two-sample test's classifier) refit online, no real text",
                              WINDOW_JUDGE + NGRAM),
        # the positive controls: rewards known to be right, through the same GRPO, cycle, controls and referees
        'teacher': ('teacher reward (base v1 + 2,500 iterations; per-token log-ratio, per-token credit)',
                    teacher('teacher_2500')),
        # MiniLLM's single-step decomposition: each token's own reverse KL to the teacher exactly, over the vocabulary;
        # the sampled log-ratios after it as its advantage
        'teacher_exact': ('teacher reward (base v1 + 2,500 iterations) + exact single-step KL',
                          teacher('teacher_2500') + ['--grpo_teacher_kl_weight=1.0']),
        'teacher_plateau_exact': ('plateau teacher reward + exact single-step KL',
                                  plateau + ['--grpo_teacher_kl_weight=1.0']),
        # the exact term the other way round, KL(teacher || policy) on the policy's prefixes (GKD): it keeps the
        # teacher's spread where the reverse KL seeks its modes
        'teacher_plateau_forward': ('plateau teacher reward + exact forward KL (GKD)', forward),
        # the same at ten times the learning rate (the base's own order): the budget, not the objective, in question
        'teacher_plateau_forward_lr1e-3': ('plateau teacher reward + exact forward KL, lr 1e-3',
                                           forward + ['--grpo_learning_rate=1e-3']),
        # the exact term ten times the sampled reward's weight (Adam keeps the step ~lr, so this turns the update's
        # direction towards the distillation gradient, less the sequence-level noise) at three times the rate: at lr
        # 1e-3 the mixed update first moved away from the teacher (forward KL 0.29 -> 0.35 in 25 steps)
        'teacher_plateau_forward_w10': ('plateau teacher reward + exact forward KL x10, lr 3e-4', forward_w10),
        # the exact term alone (no sampled reward in the advantages): what the distillation gradient earns by itself
        'teacher_plateau_forward_w10_exact': ('plateau teacher: exact forward KL x10 alone, lr 3e-4 (no sampled reward)',
                                              forward_w10 + ['--grpo_teacher_sampled=False']),
        # the budget: the same at three times the steps (its judge-off control runs as long)
        'teacher_plateau_forward_w10_600': ('plateau teacher reward + exact forward KL x10, lr 3e-4, 600 steps',
                                            forward_w10 + ['--grpo_max_steps=600']),
        # the plateau teacher through a judge's own channel: its exact sequence log-ratio to base v1, one scalar a
        # completion, at scale 0.3 (the tilt base_v1^0.7·teacher^0.3), in the game whose fixed point is that tilt:
        # the KL to base v1 inside the reward, centred unscaled advantages, Dr. GRPO's constant normaliser, lr 1e-5
        'teacher_ratio_kl': ('plateau teacher sequence log-ratio x0.3, KL inside the reward (lr 1e-5)', ratio_kl),
        # the issue's probe's teacher: the run's own MLE control (base v1 + the cycle's FLOPs of next-token training),
        # whose sequence log-ratio to base v1 varies a third as much as the plateau teacher's
        'teacher_mle_ratio_kl': ('MLE-control teacher sequence log-ratio x0.3, KL inside the reward (lr 1e-5)',
                                 ratio_kl[:-2] + [f'--grpo_teacher_path={teacher_path(run, "teacher_mle")}',
                                                  '--grpo_reward_scale=0.3']),
        # the same reward by distribution matching (DPG: self-normalised weights pi_ref·e^r / pi within each group)
        'teacher_ratio_dpg': ('plateau teacher sequence log-ratio x0.3, DPG (lr 1e-5)', ratio_dpg),
        # a learned judge through the same channel: the n-gram judge (refit every step, as ngram_online_pure) played
        # by its log-odds x1.5 (the issue's probe's scale, not tuned here) with the KL to base v1 inside the reward
        'ngram_kl': ("n-gram judge's log-odds x1.5 refit online, KL inside the reward (lr 1e-5)",
                     NGRAM + game + ['--grpo_reward_form=log_odds', '--grpo_reward_scale=1.5']),
        'known_words': ('exact reward: share of train-split words (beta 0.04)', known_words),
        'known_words_beta0.2': ('exact reward, beta 0.2', known_words + ['--grpo_beta=0.2']),
        'known_words_beta1': ('exact reward, beta 1', known_words + ['--grpo_beta=1.0']),
        'known_words_nll': ('exact reward + real text (NLL weight 1)', known_words + ['--grpo_nll_weight=1.0']),
    }


def make_teacher(run, name):
    """A teacher of the teacher arms, once per run (and the teachers it starts from), on the run's data and batch
    (train.py; its cost is its own, not the arm's)."""
    path = teacher_path(run, name)
    if os.path.exists(path):
        return
    C = SimpleNamespace(**load_json(os.path.join(run, 'config.json')))
    start, options = teachers(C)[name]
    if start.startswith('teacher_'):
        make_teacher(run, start[:-3])
    work = path + '.partial'
    subprocess.run([sys.executable, os.path.join(ROOT, 'train.py'), *base_train_args(C, data_path(C.dataset)),
                    f'--init_from={os.path.join(run, start)}', f'--out_dir={work}', *options], check=True)
    os.replace(os.path.join(work, 'ckpt.pt'), path)
    shutil.rmtree(work)


@torch.no_grad()
def judge_quality(judge_path, data_dir):
    """R² and boundary error of a judge on the test half of a reward dataset's val split."""
    judge = GPT.from_checkpoint(judge_path)
    ds = RewardDataset(data_dir, 'val')
    rows = np.sort(ds.selection_and_test_rows()[1])
    p = np.concatenate([judge(torch.from_numpy(ds.x[rows[i:i + 256]].astype(np.int64)))[0][:, 0].numpy()
                        for i in range(0, len(rows), 256)])
    m = reward_metrics(p, ds.y[rows, 0], ds.block_size, float(np.mean(RewardDataset(data_dir, 'train').y[:, 0])))
    if ds.natural is not None:  # reward data of format 3: each sample against its natural block
        natural = np.concatenate([judge(torch.from_numpy(ds.natural_of(rows[i:i + 256]).astype(np.int64)))[0].numpy()
                                  for i in range(0, len(rows), 256)])
        m['pair_accuracy'] = pair_accuracy(torch.from_numpy(natural), torch.from_numpy(np.stack([p, 1 - p], 1)))
    return m


def verdict_cell(v, control):
    """'fresh judges, two-sample, ppl' labels of one control ('–' where the cycle has no such control)."""
    x = v['verdicts'].get(control)
    if not x:
        return '–'
    c2st = label_text(x['c2st_effect']) if x.get('c2st_effect') else '–'
    return f"{x['fresh_judges']}, {c2st}, {label_text(x['perplexity_effect'])}"


def arm_row(name, out, n, e, v):
    """One table row: cycle n of one arm's run, its judge and trainer, and the new version as the instruments and
    the verdict see it."""
    ckpt = load_checkpoint(os.path.join(out, f'base_model_v{n + 1}.pt'))
    trained = ckpt['metrics']
    h = trained['history']
    if ckpt['config'].get('judge') == 'ngram':  # no network to read on crossovers: its sight on the rollouts
        judge = (f"n-gram: sight on unseen rollouts {first_last(h, 'judge_sight')} | – | {first_last(h, 'reward')} | "
                 f"{trained['final_kl']:.4f}")
        seconds = sum(x[f'time_{k}'] for x in h for k in ('generation', 'scoring', 'update'))
    elif os.path.exists(os.path.join(out, f'reward_model_v{n}.pt')) and 'reward' in h[0]:  # a GRPO cycle
        online = os.path.join(out, f'grpo_v{n}_judge.pt')
        q = judge_quality(online if os.path.exists(online) else os.path.join(out, f'reward_model_v{n}.pt'),
                          os.path.join(out, f'reward_data_v{n}'))
        pair = f" / {q['pair_accuracy']:.3f}" if 'pair_accuracy' in q else ''
        sight = os.path.join(out, f'sight_v{n}.json')  # the offline judge on base v{n}'s samples -> the new base's
        if os.path.exists(sight) and 'judge_sight_auc' in e:
            before = load_json(sight)[0]
            pair += f"; sight {before['judge_sight_auc']:.3f} → {e['judge_sight_auc']:.3f}"
            off = os.path.join(out, f'eval_judgeoff_v{n + 1}.json')  # and on the judge-off control's samples
            off = load_json(off)[0] if os.path.exists(off) else {}
            if 'judge_sight_auc' in off:
                pair += f" ({off['judge_sight_auc']:.3f})"
            if 'judge_dv' in before:  # what it knows of base v{n} in nats, before the game (worth.py)
                pair += f"; worth {judge_worth(before)}"
        judge = (f"{q['r2']:.3f} / {q['boundary_error']:.1f}{pair} | {first_last(h, 'judge_boundary_error')} | "
                 f"{first_last(h, 'reward')} | {trained['final_kl']:.4f}")
        seconds = sum(x[f'time_{k}'] for x in h for k in ('generation', 'scoring', 'update'))
    else:  # SPIN: the model is its own judge; its held-out margin instead
        judge = f"– | – | margin {trained['start']['heldout_margin']:.1f} → {h[-1]['heldout_margin']:.1f} | –"
        seconds = sum(x['time'] for x in h)
    fresh, _, spec, _ = fresh_judge_figure(e)
    return (f"| {name} | {n} | {judge} | {e['val_perplexity']:.3f} | {e[fresh]:{spec}} ± {e[fresh + '_sd']:{spec}} | "
            f"{e['c2st_auc']:.3f} ± {e['c2st_auc_sd']:.3f} | "
            f"{e['mauve']:.3f} ± {e['mauve_sd']:.3f} | {e['sample_entropy']:.3f} | {e['unknown_word_rate']:.3f} | "
            f"{verdict_cell(v, 'mle')} | {verdict_cell(v, 'temperature')} | {verdict_cell(v, 'judge_off')} | "
            f"{seconds:.0f} |")


def method_cell(runs, control):
    """The arm's verdict on the method against one control, over its seeds (verdict.method_verdict: a t interval
    over the per-seed effects, with each seed's bootstrap variance added where the seeds shared their draws;
    'unresolved' under 3 seeds): 'two-sample label effect [ci]; ppl label effect [ci]'."""
    m = method_verdict([v for _, v in runs], control)
    if m['c2st_effect'] is None and m['perplexity_effect'] is None:
        return '–'
    def cell(e, spec):
        if e is None:
            return '–'
        if e['seeds'] < 2:  # no spread over one seed: its effect, unresolved as a method
            return f"**{label_text(e)}** ({e['effect']:{spec}}, 1 seed)"
        shared = '' if e['interval'].endswith('(own draws)') else ' (shared draws)'
        return f"**{label_text(e)}** {e['effect']:{spec}} [{e['ci'][0]:{spec}}, {e['ci'][1]:{spec}}]{shared}"
    return f"{cell(m['c2st_effect'], '.3f')}; {cell(m['perplexity_effect'], '.1%')}"


def summary_rows(results):
    """Per arm and cycle: means and sds over seeds (one seed: no sd, '1 seed'), how often each per-checkpoint
    verdict came out, and the verdict on the method over the seeds."""
    rows = []
    for (name, n), runs in results.items():
        f = lambda k: (f"{np.mean([e[k] for e, _ in runs]):.3f}"  # noqa: E731
                       + (f" ± {np.std([e[k] for e, _ in runs], ddof=1):.3f}" if len(runs) > 1 else ' (1 seed)'))
        count = lambda ctl: ', '.join(f"{k} ×{c}" for k, c in sorted(Counter(  # noqa: E731
            verdict_cell(v, ctl).replace(', ', '/') for _, v in runs).items()))
        rows.append(f"| {name} | {n} | {len(runs)} | {f('val_perplexity')} | {f(fresh_judge_figure(runs[0][0])[0])} | "
                    f"{f('c2st_auc')} | {f('mauve')} | {f('sample_entropy')} | {f('unknown_word_rate')} | "
                    f"{count('mle')} | {count('temperature')} | {count('judge_off')} | {method_cell(runs, 'mle')} | "
                    f"{method_cell(runs, 'temperature')} | {method_cell(runs, 'judge_off')} |")
    return rows


def plot_arms(results, run, outs, png):
    """Cycle 1 on the quality-diversity plane: base v1's temperature sweep, every arm (mean over seeds, bars: sd
    over seeds) and each distinct MLE control (an arm with other cycle FLOPs gets its own)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    load = lambda p: json.load(open(p))  # noqa: E731
    sweep = sorted(load(os.path.join(run, 'eval_v1.json')) + load(os.path.join(run, 'sweep_v1.json')),
                   key=lambda e: e['temperature'])
    x, (y, _, _, ylabel) = 'sample_entropy', fresh_judge_figure(sweep[0])
    ax.errorbar([e[x] for e in sweep], [e[y] for e in sweep], yerr=[e[y + '_sd'] for e in sweep], marker='o',
                capsize=3, color='gray', label='base v1, temperature sweep (sd over judges)')
    for e in sweep:
        ax.annotate(f"T={e['temperature']}", (e[x], e[y]), textcoords='offset points', xytext=(4, -10), fontsize=8)
    controls = {}  # one per iteration count: the same base trained for the same steps is the same control
    for out in outs:
        iters = load(os.path.join(out, 'verdict_v1.json'))['mle_iters']
        controls.setdefault(iters, load(os.path.join(out, 'eval_mle_v2.json'))[0])
    for iters, mle in sorted(controls.items()):
        ax.errorbar([mle[x]], [mle[y]], yerr=[mle[y + '_sd']], marker='^', color='black', capsize=3,
                    linestyle='none', label=f"MLE control, {iters} iterations (val ppl {mle['val_perplexity']:.3f})")
    for (name, n), runs in results.items():
        if n != 1:
            continue
        xs, ys = [e[x] for e, _ in runs], [e[y] for e, _ in runs]
        ax.errorbar([np.mean(xs)], [np.mean(ys)], xerr=[np.std(xs, ddof=1)] if len(runs) > 1 else None,
                    yerr=[np.std(ys, ddof=1)] if len(runs) > 1 else None, marker='s', capsize=3, linestyle='none',
                    label=f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''}; val ppl "
                          f"{np.mean([e['val_perplexity'] for e, _ in runs]):.3f})")
    ax.set(xlabel='sample entropy (nats per token; diversity)',
           ylabel=ylabel,
           title='Cycle 1 of every arm against its controls (referee: base v1)')
    ax.legend(fontsize=7, loc='best')
    fig.tight_layout()
    tmp = png + '.tmp.png'
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, png)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--run', default='runs/cycles_shakespeare_char', help="a finished default run ('': the first "
                   "arm builds its own base v1 and controls, which its seeds and the later arms then share)")
    p.add_argument('--config', default=os.path.join(ROOT, 'config', 'cycles_shakespeare_char.py'),
                   help="run_cycles.py config file(s), comma-separated (later ones overlay earlier ones)")
    p.add_argument('--out', default='runs/bench_arms')
    p.add_argument('--seeds', default='0', help="comma-separated seeds per arm (0: the cycle's own); base v1 is "
                   "shared, each seed has its own judge data, evaluations and controls")
    p.add_argument('--cycles', type=int, default=1, help="cycles per arm (each later cycle has its own controls)")
    p.add_argument('--arms', default='', help="comma-separated arms, of: " + ', '.join(arms('')) + " (default: all)")
    p.add_argument('--png', default='', help="the quality-diversity plane (default: OUT/arms_quality_diversity.png)")
    a = p.parse_args()
    run = os.path.abspath(a.run) if a.run else ''
    table = arms(run)
    chosen = a.arms.split(',') if a.arms else list(table)
    unknown = sorted(set(chosen) - set(table))
    if unknown:
        sys.exit(f"error: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(table)}")
    rows, results, outs, by_seed = [], {}, [], {}
    for arm in (arm for arm in chosen if arm.startswith('teacher')):
        if not run:
            sys.exit("error: the teacher arms' teachers are trained from a finished run's base v1: pass --run")
        if arm.startswith('teacher_mle'):  # the run's MLE control, as it is
            if not os.path.exists(teacher_path(run, 'teacher_mle')):
                shutil.copyfile(os.path.join(run, 'mle_v2.pt'), teacher_path(run, 'teacher_mle'))
        else:
            make_teacher(run, 'teacher_plateau' if 'plateau' in arm or 'ratio' in arm else 'teacher_2500')
    for arm in chosen:
        for seed in [int(s) for s in a.seeds.split(',')]:
            name, overrides = table[arm]
            out = os.path.join(a.out, arm + (f'_seed{seed}' if seed else ''))
            if not os.path.exists(out):  # base v1 from the run; a seed's own controls from its first arm, if any
                source = by_seed.get(seed) or run or (outs[0] if outs else '')
                if source:
                    shutil.copytree(source, out)
                else:  # --run '': this arm builds base v1 and the controls itself
                    os.makedirs(out)
            t0 = time.time()
            subprocess.run([sys.executable, os.path.join(ROOT, 'run_cycles.py'), *a.config.split(','),
                            f'--out_dir={out}', f'--num_cycles={a.cycles}', *SEED_DESIGN, *overrides]
                           + ([f'--trainer_seed={seed}'] if seed else []), check=True)
            outs.append(out)
            by_seed.setdefault(seed, out)
            for n in range(1, a.cycles + 1):
                e = json.load(open(os.path.join(out, f'eval_v{n + 1}.json')))[0]
                v = json.load(open(os.path.join(out, f'verdict_v{n}.json')))
                rows.append(arm_row(name + (f' (seed {seed})' if seed else ''), out, n, e, v))
                results.setdefault((name, n), []).append((e, v))
            print(f"{arm}, seed {seed}: done in {time.time() - t0:.0f} s", flush=True)
    print('\n| arm | cycle | its judge on held-out crossovers of the cycle\'s base: R² / boundary err (/ pair '
          'accuracy; sight on the base → on the new version (on the judge-off control); worth on the base, DV nats '
          '[95%]) | judge boundary err on '
          'unseen rollouts, first 10 → last 10 | reward (SPIN: held-out margin) | KL | '
          'val ppl | fresh judges: boundary err (↑) or, whole-window, sight (↓) | two-sample AUC (↓) | MAUVE | '
          'entropy | unknown words | vs MLE (fresh judges, two-sample, ppl) | vs temperature (same) | vs judge off '
          '(same) | trainer s |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    print('\n'.join(rows))
    print('\n| arm | cycle | seeds | val ppl | fresh judges (↑ boundary err; ↓ sight) | two-sample AUC (↓) | MAUVE | '
          'entropy | unknown words | per checkpoint vs MLE: fresh judges/two-sample/ppl × seeds | '
          'vs temperature (same) '
          '| vs judge off (same) | the method over seeds vs MLE: two-sample AUC lower by, ppl lower by (t interval) | '
          'vs temperature (same) | vs judge off (same) |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    print('\n'.join(summary_rows(results)))
    png = a.png or os.path.join(a.out, 'arms_quality_diversity.png')
    plot_arms(results, outs[0], outs, png)
    print(f"\nquality-diversity plane: {png}")


if __name__ == '__main__':
    main()
