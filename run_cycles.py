"""
The adversarial cycle, end to end, through the existing scripts and files on disk:
  prepare the corpus if missing -> cycle 0: base model (early stopping) -> for n = 1..num_cycles:
  reward data from base v{n} -> reward model v{n} -> GRPO -> base v{n+1}; evaluation and report.md after each cycle.

  python run_cycles.py [config/cycles_*.py] [--key=value ...]

Everything lives in out_dir, versioned (base_model_v1.pt, reward_data_v1/, reward_model_v1.pt, ...). Rerunning the
same command skips every stage whose output is complete and redoes the first missing one: each stage writes under a
temporary name and renames at the end, so an interrupted stage is never trusted.
"""

import json
import os
import shutil
import subprocess
import sys
import time

from configurator import UserError, config_defaults, configure, run_cli
from early_stopping import EarlyStopping
from evaluate import reward_data_cmd, reward_model_cmd
from train import data_path

ROOT = os.path.dirname(os.path.abspath(__file__))

# -----------------------------------------------------------------------------
out_dir = 'runs/cycles_shakespeare_char'
num_cycles = 2
dataset = 'shakespeare_char'  # a data/ folder (prepared on demand for shakespeare_char / shakespeare) or a path
device = 'auto'
seed = 1337
# base model (train.py)
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
base_max_iters = 600
base_learning_rate = 2e-3
base_eval_interval = 100
base_patience = 3
# reward data and model
reward_max_blocks = 300
reward_samples_per_chunk = 4
reward_max_iters = 1500
reward_head_hidden_dim = 256
reward_pooling = 'last'  # 'mean' sees every position; see docs/reward_model_training_infrastructure.md
reward_unfreeze_layers = 0  # the seed's recipe freezes the trunk; see docs/reward_model_training_infrastructure.md
reward_learning_rate = 1e-3
reward_batch_size = 64
reward_eval_interval = 100
# GRPO
grpo_max_steps = 60
grpo_prompts_per_step = 8
grpo_num_generations = 8
grpo_learning_rate = 2e-4
grpo_beta = 0.04
grpo_num_iterations = 1
grpo_max_kl = 0.0
grpo_eval_interval = 20
# evaluation
eval_num_samples = 64
fresh_judge = True
# stop early when held-out perplexity has not improved by min_delta for patience cycles (0 disables)
patience = 0
min_delta = 0.0
# -----------------------------------------------------------------------------
DEFAULTS = config_defaults(globals())


def run(args, log_path):
    """Run one script to completion, its output into log_path; a failure stops the cycle with the log's tail."""
    print(f"  $ {' '.join(os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT) else a for a in args)}")
    with open(log_path, 'w') as log:
        r = subprocess.run([sys.executable] + args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = open(log_path).read().strip().splitlines()[-3:]
        raise UserError(f"stage failed ({os.path.basename(args[0])}, see {log_path}): {' | '.join(tail)}")


class Stages:
    """
    Runs stages in order. A stage whose output exists is skipped, until one stage has to be built: from then on every
    later stage is rebuilt too, since its inputs changed. Each builds under a temporary name, renamed at the end.
    """

    def __init__(self):
        self.rebuilding = False

    def __call__(self, name, output, build):
        if os.path.exists(output) and not self.rebuilding:
            print(f"[skip] {name}: {os.path.basename(output)} exists")
            return
        print(f"[run]  {name}")
        self.rebuilding = True
        t0 = time.time()
        partial = output + '.partial'
        for stale in (partial, output):
            if os.path.isdir(stale):
                shutil.rmtree(stale)
            elif os.path.isfile(stale):
                os.remove(stale)
        build(partial)
        os.replace(partial, output)
        print(f"       done in {time.time() - t0:.0f}s")


def main(argv):
    C = configure(DEFAULTS, argv)
    os.makedirs(C.out_dir, exist_ok=True)
    out = os.path.abspath(C.out_dir)
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(out, 'config.json'), 'w') as f:
        json.dump(vars(C), f, indent=2)
    data_dir = data_path(C.dataset)  # may not be prepared yet: prepared below
    if not os.path.isfile(os.path.join(data_dir, 'val.bin')):
        prepare = os.path.join(data_dir, 'prepare.py')
        if not os.path.isfile(prepare):
            raise UserError(f"{data_dir} has no train.bin/val.bin and no prepare.py: pass --dataset with prepared data")
        run([prepare], os.path.join(logs, 'prepare.log'))  # writes atomically itself
    dev = ['--device', C.device]
    stage = Stages()
    # one reward-model recipe for the cycle's judges and the fresh judges of the evaluation
    reward_recipe = [f'--max_iters={C.reward_max_iters}', f'--reward_head_hidden_dim={C.reward_head_hidden_dim}',
                     f'--reward_pooling={C.reward_pooling}', f'--unfreeze_layers={C.reward_unfreeze_layers}',
                     f'--learning_rate={C.reward_learning_rate}', f'--batch_size={C.reward_batch_size}',
                     f'--eval_interval={C.reward_eval_interval}']

    def train_base(partial):
        work = os.path.join(out, 'base_v1_work')
        shutil.rmtree(work, ignore_errors=True)
        run([os.path.join(ROOT, 'train.py'), f'--dataset={data_dir}', f'--out_dir={work}', f'--n_layer={C.n_layer}',
             f'--n_head={C.n_head}', f'--n_embd={C.n_embd}', f'--block_size={C.block_size}',
             f'--batch_size={C.batch_size}', f'--max_iters={C.base_max_iters}', f'--lr_decay_iters={C.base_max_iters}',
             f'--learning_rate={C.base_learning_rate}', f'--min_lr={C.base_learning_rate / 10}', '--beta2=0.99',
             f'--eval_interval={C.base_eval_interval}', '--eval_iters=20', '--log_interval=100',
             '--always_save_checkpoint=False', f'--patience={C.base_patience}', '--min_delta=0.002',
             '--warmup_iters=50', '--ppl_max_tokens=50000', '--compile=False', f'--device={C.device}',
             f'--seed={C.seed}'], os.path.join(logs, 'base_v1.log'))
        shutil.move(os.path.join(work, 'ckpt.pt'), partial)
        shutil.rmtree(work)

    def evaluate(n, reward_model):
        def build(partial):
            args = [os.path.join(ROOT, 'evaluate.py'), path(f'base_model_v{n}.pt'), '--dataset', data_dir, '--out', partial,
                    '--featurizer', path('base_model_v1.pt'), '--num_samples', str(C.eval_num_samples),
                    '--seed', str(C.seed), '--judge_max_blocks', str(C.reward_max_blocks),
                    '--judge_samples_per_chunk', str(C.reward_samples_per_chunk)] + dev
            args += ['--judge_args=' + ' '.join(reward_recipe)]
            args += ['--fresh_judge'] if C.fresh_judge else []
            args += ['--reward_model', reward_model] if reward_model else []
            run(args, os.path.join(logs, f'eval_v{n}.log'))
        stage(f'evaluate base v{n}', path(f'eval_v{n}.json'), build)

    def path(name):
        return os.path.join(out, name)

    stage('cycle 0: base model', path('base_model_v1.pt'), train_base)
    evaluate(1, None)
    stopper = EarlyStopping(C.patience, C.min_delta, 'min')
    stopper.step(load_eval(path('eval_v1.json'))['val_perplexity'])
    stop_reason = f'num_cycles ({C.num_cycles})'
    for n in range(1, C.num_cycles + 1):
        base, rd, rm = path(f'base_model_v{n}.pt'), path(f'reward_data_v{n}'), path(f'reward_model_v{n}.pt')
        print(f"== cycle {n}")
        stage(f'cycle {n}: reward data', rd, lambda p: run(
            reward_data_cmd(base, data_dir, p, C.reward_max_blocks, C.reward_samples_per_chunk, C.seed + n, C.device),
            os.path.join(logs, f'reward_data_v{n}.log')))
        stage(f'cycle {n}: reward model', rm, lambda p: run(
            reward_model_cmd(base, rd, p, C.seed + n, C.device, reward_recipe),
            os.path.join(logs, f'reward_model_v{n}.log')))

        def grpo(partial, n=n, base=base, rm=rm):
            run([os.path.join(ROOT, 'train_grpo.py'), f'--policy_path={base}', f'--reward_model_path={rm}',
                 f'--dataset={data_dir}', f'--out_path={partial}', f'--max_steps={C.grpo_max_steps}',
                 f'--prompts_per_step={C.grpo_prompts_per_step}', f'--num_generations={C.grpo_num_generations}',
                 f'--learning_rate={C.grpo_learning_rate}', f'--beta={C.grpo_beta}',
                 f'--num_iterations={C.grpo_num_iterations}', f'--max_kl={C.grpo_max_kl}',
                 f'--eval_interval={C.grpo_eval_interval}', '--ppl_max_tokens=50000', f'--device={C.device}',
                 f'--seed={C.seed + n}'], os.path.join(logs, f'grpo_v{n}.log'))
            for suffix, name in (('_log.jsonl', f'grpo_v{n}_log.jsonl'), ('_curves.png', f'grpo_v{n}_curves.png')):
                shutil.move(os.path.splitext(partial)[0] + suffix, path(name))
        stage(f'cycle {n}: GRPO -> base v{n + 1}', path(f'base_model_v{n + 1}.pt'), grpo)
        evaluate(n + 1, rm)
        write_report(out, C)
        stopper.step(load_eval(path(f'eval_v{n + 1}.json'))['val_perplexity'])
        if stopper.should_stop and n < C.num_cycles:
            stop_reason = f"held-out perplexity did not improve by {C.min_delta} for {C.patience} cycles"
            break
    write_report(out, C)
    print(f"finished: {stop_reason}; report {os.path.join(out, 'report.md')}")


def load_eval(path):
    with open(path) as f:
        return json.load(f)[0]


def cycle_rows(out):
    """One dict per base model version with the figures of the report."""
    from model import load_checkpoint
    rows, n = [], 1
    while os.path.exists(os.path.join(out, f'eval_v{n}.json')):
        e = load_eval(os.path.join(out, f'eval_v{n}.json'))
        row = {'version': n, 'val_ppl': e['val_perplexity'], 'mauve': e['mauve'],
               'distinct_4': e['distinct_4_tokens'], 'natural_distinct_4': e['natural_distinct_4_tokens'],
               'repetition': e['repetition_rate_4_tokens'], 'judge_r2': e.get('fresh_judge_r2'),
               'judge_be': e.get('fresh_judge_boundary_error'), 'p_natural': e.get('mean_p_natural'),
               'unknown_words': e.get('unknown_word_rate'), 'natural_unknown_words': e.get('natural_unknown_word_rate')}
        rm_path = os.path.join(out, f'reward_model_v{n}.pt')
        if os.path.exists(rm_path):
            m = load_checkpoint(rm_path)['metrics']
            row.update(rm_r2=m['r2'], rm_be=m['boundary_error'])
        grpo_path = os.path.join(out, f'base_model_v{n + 1}.pt')
        if os.path.exists(grpo_path):
            metrics = load_checkpoint(grpo_path)['metrics']
            h = metrics['history']
            row.update(grpo_history=h, grpo_reward_start=sum(x['reward'] for x in h[:10]) / len(h[:10]),
                       grpo_reward_end=sum(x['reward'] for x in h[-10:]) / len(h[-10:]),
                       grpo_kl=h[-1]['kl'], grpo_stop=metrics['stop_reason'])
        rows.append(row)
        n += 1
    return rows


def fmt(v, spec='.3f'):
    return '–' if v is None else format(v, spec)


def write_report(out, C):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = cycle_rows(out)
    lines = ['# Adversarial self-play report', '', f"Run directory `{out}`; config in `config.json`.", '',
             'Row v{n} describes base model v{n}: its held-out figures, and (from v1 on) the reward model trained on '
             'its samples and the GRPO run that turned it into v{n+1}. The fresh judge is a new reward model trained '
             'with the same recipe on this generator\'s samples: lower R² and higher boundary error mean its text is '
             'harder to tell from natural text.', '',
             '| base | val ppl | RM R² | RM boundary err | GRPO reward start → end | GRPO final KL | fresh-judge R² | '
             'fresh-judge boundary err | distinct-4 (natural) | rep-4 | unknown words (natural) | MAUVE |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        grpo = f"{fmt(r.get('grpo_reward_start'))} → {fmt(r.get('grpo_reward_end'))}" if 'grpo_history' in r else '–'
        lines.append(f"| v{r['version']} | {fmt(r['val_ppl'])} | {fmt(r.get('rm_r2'))} | {fmt(r.get('rm_be'), '.1f')} | "
                     f"{grpo} | {fmt(r.get('grpo_kl'), '.4f')} | {fmt(r['judge_r2'])} | {fmt(r['judge_be'], '.1f')} | "
                     f"{fmt(r['distinct_4'])} ({fmt(r['natural_distinct_4'])}) | {fmt(r['repetition'])} | "
                     f"{fmt(r['unknown_words'])} ({fmt(r['natural_unknown_words'])}) | {fmt(r['mauve'])} |")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        if 'grpo_history' in r:
            h = r['grpo_history']
            axes[0].plot([x['reward'] for x in h], label=f"cycle {r['version']} reward")
            if h[0]['kl'] is not None:
                axes[1].plot([x['kl'] for x in h], label=f"cycle {r['version']} KL")
    axes[0].set(title='GRPO mean reward P(natural)', xlabel='step')
    axes[1].set(title='GRPO KL to reference', xlabel='step')
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'grpo_curves.png'), dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    versions = [r['version'] for r in rows]
    axes[0].plot(versions, [r['val_ppl'] for r in rows], marker='o')
    axes[0].set(title='held-out perplexity', xlabel='base model version')
    axes[1].plot(versions, [r['judge_be'] if r['judge_be'] is not None else float('nan') for r in rows], marker='o')
    axes[1].set(title='fresh-judge boundary error (tokens)', xlabel='base model version')
    for ax in axes:
        ax.set_xticks(versions)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'cycles.png'), dpi=100)
    plt.close(fig)
    lines += ['', '![GRPO curves](grpo_curves.png)', '', '![cycles](cycles.png)', '']
    for r in rows:
        if 'grpo_stop' in r:
            lines.append(f"- GRPO of cycle {r['version']} stopped by: {r['grpo_stop']}")
    tmp = os.path.join(out, 'report.md.tmp')
    with open(tmp, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.replace(tmp, os.path.join(out, 'report.md'))


if __name__ == '__main__':
    run_cli(main)
