"""
The adversarial cycle, end to end, through the existing scripts and files on disk, with its controls:
  prepare the corpus if missing -> cycle 0: base model v1 -> for n = 1..num_cycles:
  reward data from base v{n} -> reward model v{n} -> GRPO -> base v{n+1} (trainer='grpo'), or SPIN of base v{n}
  against its own samples -> base v{n+1} (trainer='spin');
  controls: base v{n} trained further with next-token loss for at most the cycle's compute, keeping its best
  validation checkpoint by the base's early-stopping rule (mle_v{n+1}.pt); base v{n} sampled at several temperatures;
  and for GRPO the judge-off ablation, the same GRPO run with a constant reward (judgeoff_v{n+1}.pt); every version
  and control measured by the same instruments (evaluate.py: the referee's fresh judges, a model-free two-sample
  test, MAUVE); the cycle's verdict against every control; report.md after each cycle. With tilt_k, also base v{n}
  tilted by its judge without RL (tilt.py), read against base v{n}, its matched temperature and an MLE control given
  the judge's and the sampling's FLOPs.

  python run_cycles.py [config/cycles_*.py] [--key=value ...]

Everything lives in out_dir. Each stage leaves a manifest (manifests/NAME.json: its exact command and a content
signature of its inputs). Rerunning skips a stage only when its outputs exist and its manifest matches; a stage that
has to run first removes every artefact that depends on what it rewrites, and writes under temporary names that it
renames at the end, so artefacts of different runs are never paired and the report reads only this run's.
"""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from configurator import UserError, config_defaults, configure, run_cli
from data_loader import check_select_tokens, data_path, file_sha256
from early_stopping import EarlyStopping
from judge import PAIRED_LOSSES, reward_data_cmd, reward_model_cmd
from tracking import TRACKING_DEFAULTS, tracking_args
from verdict import (FRESH_JUDGE_FIGURES, VERDICT_FORMAT, cycle_verdict, fresh_judge_figure, label_text,
                     matched_temperature)
from runtime import resolve_device, resume_file

ROOT = os.path.dirname(os.path.abspath(__file__))

# -----------------------------------------------------------------------------
out_dir = 'runs/cycles_shakespeare_char'
num_cycles = 2
dataset = 'shakespeare_char'  # a data/ folder (prepared on demand for shakespeare_char / shakespeare) or a path
device = 'auto'
seed = 1337
init_from = 'scratch'  # base v1: 'scratch', or GPT-2 weights ('gpt2', 'gpt2-medium', ..., or a Hugging Face directory)
# fine-tuned on the dataset for base_max_iters (needs a BPE dataset; see config/cycles_gpt2_gpu.py)
compile = False  # torch.compile in train.py (CUDA only)
sample_temperature = 1.0  # sampling of the judge's data, the GRPO rollouts and the evaluation
sample_top_k = None
# base model (train.py)
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
dropout = 0.0  # base v1 and the MLE control (nanoGPT's shakespeare_char recipe uses 0.2 where a model overfits)
base_max_iters = 600
base_learning_rate = 2e-3
base_eval_interval = 100
base_eval_iters = 20  # batches per split at each evaluation of base v1 and the MLE control (nanoGPT's eval_iters)
base_patience = 3  # base v1 and the MLE control stop after this many evaluations without a val-loss gain of
base_min_delta = 0.002  # at least this, and keep their best checkpoint
# both select on the last this many train tokens, held out of their training, never on val (which the verdict reads);
# 0: on val, as nanoGPT does
base_select_tokens = 100000
base_select_pass = False  # read the selection split in one whole pass (train.py --select_pass), not eval_iters batches
base_min_lr = 0.0  # where base v1's cosine ends; 0: a tenth of base_learning_rate (nanoGPT's)
mle_learning_rate = 0.0  # the MLE control's held learning rate; 0: the base's final one (base_min_lr)
base_hold_iters = 0  # >0: after its cosine, base v1 trains on at that held rate for at most this many iterations,
# its best checkpoint kept (the MLE control's recipe): a cosine that early-stops at a high rate stops short of a plateau
trainer = 'grpo'  # 'grpo': a judge, then GRPO against it; 'spin': train_spin.py, the model is its own judge
# reward data and model
reward_max_blocks = 300
reward_samples_per_chunk = 4
reward_max_iters = 1500
reward_head_hidden_dim = 256
reward_pooling = 'last'  # 'mean' sees every position, 'token' judges each; docs/reward_model_training_infrastructure.md
reward_unfreeze_layers = 0  # the seed's recipe freezes the trunk; see docs/reward_model_training_infrastructure.md
reward_learning_rate = 1e-3
reward_batch_size = 64
reward_eval_interval = 100
reward_loss = 'mse'  # 'pairwise': a relative judge, natural block vs its crossover sample (Bradley-Terry); 'binary':
# each sample and its natural block, pointwise (whole-window judges, with reward_crossover_k)
reward_crossover_k = 0  # 0: K ~ U[1, N-1]; k: every sample keeps k natural tokens (8: the two-sample test's prompts)
reward_max_epochs = 0  # the judge also stops after this many passes over its data (0: max_iters alone)
reward_trunk_path = ''  # '' = each cycle's base; or a generator checkpoint (same tokenization) whose trunk the judge reads
# GRPO
grpo_max_steps = 60
grpo_prompts_per_step = 8
grpo_num_generations = 8
grpo_learning_rate = 2e-4
grpo_beta = 0.04
grpo_num_iterations = 1
grpo_scale_rewards = 'group'
grpo_max_kl = 0.0
grpo_eval_interval = 20
grpo_judge_update_interval = 0  # 0: the judge stays frozen during GRPO (the seed); k: it trains every k steps (online)
# 'model': GRPO plays the cycle's reward model; 'ngram': train_grpo.py's n-gram judge, fitted online (it needs
# grpo_judge_update_interval and grpo_judge_warmup_steps); the cycle's reward model is then still trained, and read on
# the new version as a judge that did not play
grpo_judge = 'model'
grpo_judge_steps = 4
grpo_judge_learning_rate = 1e-3
grpo_judge_replay = 8
grpo_judge_unfreeze_layers = 0  # what the online judge trains: 0 its head; k the last k blocks too; -1 all of it
grpo_judge_warmup_steps = 0  # rollout batches the online judge learns from before the policy moves
grpo_judge_natural_windows = 0  # natural train windows the online judge also learns from each step
grpo_referee_samples = 0  # k > 0: the two-sample AUC of k policy samples at each GRPO evaluation (log and curves)
grpo_token_advantages = False  # with reward_pooling='token': per-token advantages from the judge's per-position scores
grpo_nll_weight = 0.0  # real text in GRPO's loss: this weight times the next-token loss of its prompts' continuations
# the positive controls (train_grpo.py's reward): 'judge' plays the cycle's judge; 'teacher' a stronger generator's
# per-token log-ratio (grpo_teacher_path), 'teacher_ratio' its sequence log-ratio to base v{n} as one scalar (a
# judge's channel), 'known_words' the share of train-split words, 'module:function' a user's own; the judge is still
# trained, scores every rollout and reads the new version, as a judge that did not play
grpo_reward = 'judge'
# the game whose fixed point is the judge's tilt (train_grpo.py): the judge's log-odds ('log_odds') or P(natural),
# the KL to base v{n} inside the reward, the reward's scale a, the objective (grpo, dpg, resample_mle, judge_teacher)
# and GRPO's loss normalisation (dr_grpo: a constant, so a sequence reward's gradient is not divided by its length)
grpo_reward_form = 'p_natural'
grpo_kl_in_reward = False
grpo_reward_scale = 1.0
# where that KL is anchored: 'reference' (base v{n}, held) or 'judge' (the policy the online judge was last fit
# against: with a co-trained judge, the anchor under which the game's fixed point is the judge's tilt; grpo_cycle.md)
grpo_kl_anchor = 'reference'
grpo_objective = 'grpo'
grpo_loss_type = 'grpo'
grpo_teacher_path = ''
grpo_token_discount = 0.23  # with grpo_token_advantages: the discount of later per-token rewards (1: their sum)
grpo_teacher_kl_weight = 0.0  # the teacher's reward: weight of the exact per-token KL (MiniLLM's single step)
grpo_teacher_kl = 'reverse'  # its direction: 'reverse' KL(policy || teacher), or 'forward' (GKD)
grpo_teacher_sampled = True  # False: the exact term alone, no sampled reward in the advantages (on-policy distillation)
# 0: the trainer (GRPO or SPIN) of cycle n is seeded seed + n, as every stage; s: a repeat of the method on the same
# base v1 with its own draws: its trainer seeded s + n, and everything after base v1 that draws (the judge's data and
# training, every evaluation's prompts, windows and samples, the MLE and judge-off controls) seeded from s
trainer_seed = 0
# SPIN (trainer='spin'; train_spin.py)
spin_max_steps = 60
spin_batch_size = 16
spin_learning_rate = 1e-4
spin_beta = 0.1
spin_loss_type = 'sigmoid'
spin_nll_weight = 0.0
spin_opponent_mix = 0.0  # share of each batch written by the earlier versions base v1 .. v{n-1} instead of base v{n}
# instruments (evaluate.py): one fixed referee for MAUVE and every fresh judge
referee_path = ''  # '' = this run's base_model_v1.pt; or a stronger generator checkpoint with the same tokenization
eval_num_samples = 1000
judge_seeds = 3  # fresh judges per evaluation point, each on its own data: the spread of the boundary error
# natural blocks per split of each fresh judge's data, one crossover each: 500 independent blocks gave about the
# spread over seeds of 300 blocks x 4 crossovers (sd 0.91 vs 0.82 of 128) in less than half the time; 400 keep the
# default run within 25 minutes (docs/benchmarks.md)
judge_max_blocks = 400
judge_samples_per_chunk = 1
judge_max_iters = 1500
judge_learning_rate = 1e-3
# 'crossover': the fresh judges above, read by their boundary error; 'window': every weight of the referee's copy
# trained on whole windows, read by its sight (the judge that sees, docs/judges.md: 0.85 takes 10,000 windows and 5
# epochs, about 15 min a judge on CPU; set judge_max_blocks, judge_max_iters and judge_learning_rate=3e-4 with it)
judge_recipe = 'crossover'
# the tilt without RL (evaluate.py --tilt, tilt.py): base v{n} resampled by its judge, tilt_k candidates a sample kept
# ∝ e^{tilt_scale·f}, read against base v{n}, base v{n} at the matched temperature and an MLE control given the
# judge's FLOPs and the sampling's (tilt_verdict_v{n}.json); 0: no tilt point
tilt_k = 0
tilt_scale = 1.0
tilt_source = ''  # '' = the cycle's judge; a better generator's checkpoint: its exact log-ratio (the positive control)
# controls
controls = True  # the MLE, temperature and (GRPO) judge-off controls and the verdict of every cycle
control_temperatures = '0.6,0.7,0.8,0.9,1.0'  # the previous base's temperature sweep
# stop early when held-out perplexity has not improved by min_delta for patience cycles (0 disables)
patience = 0
min_delta = 0.0
# -----------------------------------------------------------------------------
# each number's range and the relations between them, checked by the configurator before anything is read or written
# (a stage's option has its script's range)
RANGES = dict(num_cycles='>= 0', seed='>= 0', sample_temperature='> 0', sample_top_k='>= 1',
              n_layer='>= 1', n_head='>= 1', n_embd='>= 1', block_size='>= 1', batch_size='>= 1', dropout='[0, 1)',
              base_max_iters='>= 1', base_learning_rate='> 0', base_eval_interval='>= 1', base_eval_iters='>= 1',
              base_patience='>= 0', base_min_delta='>= 0', base_select_tokens='>= 0', base_min_lr='>= 0',
              mle_learning_rate='>= 0', base_hold_iters='>= 0',
              reward_max_blocks='>= 1', reward_samples_per_chunk='>= 1', reward_max_iters='>= 0',
              reward_head_hidden_dim='>= 1', reward_unfreeze_layers='>= -1', reward_learning_rate='> 0',
              reward_batch_size='>= 1', reward_eval_interval='>= 1', reward_crossover_k='>= 0',
              reward_max_epochs='>= 0',
              grpo_max_steps='>= 1', grpo_prompts_per_step='>= 1', grpo_num_generations='>= 2',
              grpo_learning_rate='> 0', grpo_beta='>= 0', grpo_num_iterations='>= 1', grpo_max_kl='>= 0',
              grpo_eval_interval='>= 1', grpo_judge_update_interval='>= 0', grpo_judge_steps='>= 1',
              grpo_judge_learning_rate='> 0', grpo_judge_replay='>= 0', grpo_judge_unfreeze_layers='>= -1',
              grpo_judge_warmup_steps='>= 0', grpo_judge_natural_windows='>= 0', grpo_referee_samples='0 or >= 2',
              grpo_nll_weight='>= 0', grpo_reward_scale='> 0', grpo_token_discount='[0, 1]',
              grpo_teacher_kl_weight='>= 0', trainer_seed='>= 0',
              spin_max_steps='>= 1', spin_batch_size='>= 1', spin_learning_rate='> 0', spin_beta='> 0',
              spin_nll_weight='>= 0', spin_opponent_mix='[0, 1]',
              eval_num_samples='>= 2', judge_seeds='>= 0', judge_max_blocks='>= 1', judge_samples_per_chunk='>= 1',
              judge_max_iters='>= 0', judge_learning_rate='> 0', tilt_k='0 or >= 2', tilt_scale='>= 0',
              control_temperatures='each > 0', patience='>= 0', min_delta='>= 0')
RELATIONS = (('base_min_lr <= base_learning_rate', "base v1's cosine decays from base_learning_rate down to "
              "base_min_lr"),
             ('n_embd % n_head == 0', "each head takes an equal share of the embedding"),
             ('reward_crossover_k < block_size', "a crossover keeps k natural tokens of a block and writes the rest"),
             ('reward_unfreeze_layers <= n_layer and grpo_judge_unfreeze_layers <= n_layer',
              "a judge unfreezes at most its n_layer blocks (-1: all of it)"))
DEFAULTS = {**config_defaults(globals()), **TRACKING_DEFAULTS}  # each trainer stage logs to one group (tracking.py)


def wait_with_peak_memory(proc):
    """(exit code, the child's peak resident memory in MB, or None where os.wait4 is missing, e.g. Windows). Linux
    counts the forked copy of this process before exec too, so a stage smaller than run_cycles (~0.25 GB) shows
    run_cycles' size."""
    if not hasattr(os, 'wait4'):
        return proc.wait(), None
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / (2 ** 20 if sys.platform == 'darwin' else 2 ** 10)  # bytes / KiB


TRACKED_SCRIPTS = ('train.py', 'train_reward_model.py', 'train_grpo.py', 'train_spin.py')
stage_peaks_mb = []  # the peak memory of each script the running stage started (Pipeline.stage reads it)


def run(args, log_path, tracking=(), append=False):
    """Run one script to completion, its output into log_path (after what it holds, with append) and, on a terminal,
    its latest line (its progress bar or log line) shown live; a failure stops the cycle with the log's tail.
    tracking: the experiment-tracking options a trainer gets (they change no output, so they are no part of any
    stage's manifest)."""
    if os.path.basename(args[0]) in TRACKED_SCRIPTS:
        args = list(args) + list(tracking)
    print(f"  $ {' '.join(os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT) else a for a in args)}",
          flush=True)
    live = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns - 5
    tail = b''
    with open(log_path, 'ab' if append else 'wb') as log:
        proc = subprocess.Popen([sys.executable] + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for chunk in iter(lambda: proc.stdout.read1(4096), b''):
            log.write(chunk)
            tail = (tail + chunk)[-4096:]
            if live:
                lines = [l for l in tail.replace(b'\r', b'\n').split(b'\n') if l.strip()]
                if lines:
                    sys.stdout.write('\r\033[K    ' + lines[-1].decode(errors='replace')[:width])
                    sys.stdout.flush()
        returncode, peak_mb = wait_with_peak_memory(proc)
    if live:
        sys.stdout.write('\r\033[K')
    if peak_mb is not None:
        print(f"       peak memory {peak_mb:,.0f} MB", flush=True)
        stage_peaks_mb.append(peak_mb)
    if returncode != 0:
        last = [l for l in open(log_path, errors='replace').read().replace('\r', '\n').splitlines() if l.strip()][-3:]
        raise UserError(f"stage failed ({os.path.basename(args[0])}, see {log_path}): {' | '.join(last)}")


class Pipeline:
    """
    Runs the stages of one run in order. A stage's manifest records its command and the content signature of each
    input; the stage is skipped only when its outputs exist and that manifest matches. A stage that runs first
    removes, through the manifests, every artefact downstream of its outputs (of this run or an earlier one), then
    builds under temporary names, renames, and writes its manifest last: an interruption anywhere leaves only
    artefacts whose manifests match their inputs, or no manifest at all (rebuilt on the next run).
    """

    def __init__(self, out):
        self.out = out
        self.manifests = os.path.join(out, 'manifests')
        os.makedirs(self.manifests, exist_ok=True)
        self.current = {}  # stage name -> outputs, for the stages of this run that completed
        self._hashes = {}

    def rel(self, value):
        """A path as it enters a manifest: relative to the run or the repository, so a moved run stays valid."""
        return str(value).replace(self.out + os.sep, '$OUT' + os.sep).replace(ROOT + os.sep, '$ROOT' + os.sep)

    def signature(self, path):
        """sha256 of a file's bytes, or of a folder's file names and bytes."""
        if os.path.isdir(path):
            h = hashlib.sha256()
            for name in sorted(os.listdir(path)):
                h.update(name.encode() + self.signature(os.path.join(path, name)).encode())
            return h.hexdigest()
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self._hashes:
            self._hashes[key] = file_sha256(path)
        return self._hashes[key]

    def _manifest_path(self, name):
        return os.path.join(self.manifests, name.replace(' ', '_').replace('>', '').replace(':', '') + '.json')

    def _read(self, path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _remove(self, paths):
        for p in paths:
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)

    def _remove_downstream(self, outputs):
        """Remove every artefact that depends, directly or not, on one of outputs, and its manifest."""
        changed = {self.rel(o) for o in outputs}
        found = True
        while found:
            found = False
            for name in sorted(os.listdir(self.manifests)):
                m = self._read(os.path.join(self.manifests, name))
                if m and set(m['inputs']) & changed:
                    self._remove([o.replace('$OUT', self.out, 1) for o in m['outputs']])
                    os.remove(os.path.join(self.manifests, name))
                    changed |= set(m['outputs'])
                    found = True

    def stage(self, name, outputs, inputs, command, build):
        """outputs, inputs: absolute paths; command: the exact argv (for an in-process stage, its description);
        build(partials) writes the outputs under the temporary names partials."""
        manifest = {'command': [self.rel(a) for a in command], 'outputs': [self.rel(o) for o in outputs],
                    'inputs': {self.rel(p): self.signature(p) for p in inputs}}
        mpath = self._manifest_path(name)
        if all(os.path.exists(o) for o in outputs) and self._read(mpath) == manifest:
            print(f"[skip] {name}", flush=True)
            self.current[name] = outputs
            return
        print(f"[run]  {name}", flush=True)
        self._remove_downstream(outputs)
        partials = [o + '.partial' for o in outputs]
        self._remove([mpath] + outputs + partials)
        t0 = time.time()
        stage_peaks_mb.clear()
        build(partials)
        for partial, output in zip(partials, outputs):
            os.replace(partial, output)
        tmp = mpath + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, mpath)
        self.current[name] = outputs
        self.record_time(name, time.time() - t0, max(stage_peaks_mb, default=None))
        print(f"       done in {time.time() - t0:.0f}s", flush=True)

    def record_time(self, name, seconds, peak_mb):
        """The stage's wall time and its scripts' peak memory (None: it ran inside run_cycles), for the report."""
        path = os.path.join(self.out, 'stage_times.json')
        times = self._read(path) or {}
        times[name] = {'seconds': round(seconds, 1), 'peak_mb': None if peak_mb is None else round(peak_mb),
                       'finished': time.strftime('%Y-%m-%d %H:%M:%S')}
        with open(path + '.tmp', 'w') as f:
            json.dump(times, f, indent=1)
        os.replace(path + '.tmp', path)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def cycle_flops(new_base, reward_data_dir=None, reward_model_path=None):
    """The compute of one cycle as its scripts recorded it (model FLOPs: deterministic, unlike wall-clock): the
    trainer's run that wrote new_base (None: no trainer), and for GRPO the judge's data and training."""
    from model import load_checkpoint
    from reward_dataset_loader import read_metadata
    total = load_checkpoint(new_base)['metrics']['flops'] if new_base else 0
    if reward_data_dir:
        total += sum(int(read_metadata(os.path.join(reward_data_dir, f'{split}_metadata.txt'))['flops'])
                     for split in ('train', 'val'))
    if reward_model_path:
        total += load_checkpoint(reward_model_path)['flops']
    return total


def spin_cmd(C, base, earlier, data_dir, out_path, seed):
    """The cycle's train_spin.py call; earlier versions join as opponents only when spin_opponent_mix > 0."""
    mix = [f'--opponent_paths={",".join(earlier)}', f'--opponent_mix={C.spin_opponent_mix}'] \
        if C.spin_opponent_mix and earlier else []
    return [os.path.join(ROOT, 'train_spin.py'), f'--policy_path={base}', f'--dataset={data_dir}',
            f'--out_path={out_path}', f'--max_steps={C.spin_max_steps}', f'--batch_size={C.spin_batch_size}',
            f'--learning_rate={C.spin_learning_rate}', f'--beta={C.spin_beta}', f'--loss_type={C.spin_loss_type}',
            f'--nll_weight={C.spin_nll_weight}', f'--temperature={C.sample_temperature}', f'--top_k={C.sample_top_k}',
            '--ppl_max_tokens=50000', f'--device={C.device}', f'--seed={seed}', '--resume=True', *mix]


def base_train_args(C, data_dir):
    """The train.py options every next-token stage of a run shares (base v1, the MLE controls; bench_arms' teacher)."""
    return [f'--dataset={data_dir}', f'--n_layer={C.n_layer}', f'--n_head={C.n_head}', f'--n_embd={C.n_embd}',
            f'--block_size={C.block_size}', f'--batch_size={C.batch_size}', f'--dropout={C.dropout}',
            '--beta2=0.99', f'--eval_iters={C.base_eval_iters}',
            '--log_interval=100', '--ppl_max_tokens=50000', f'--compile={C.compile}', f'--device={C.device}']


def grpo_cmd(C, base, reward_model, data_dir, out_path, seed, scale_rewards=None, arm_log=None):
    """The cycle's train_grpo.py call (benchmarks reuse it to vary one setting; arm_log: the judge-off control of
    the arm that wrote that log, run for as many steps). The judge options appear only when set, so a frozen-judge
    cycle's command stays the seed's."""
    online = [f'--judge_update_interval={C.grpo_judge_update_interval}', f'--judge_steps={C.grpo_judge_steps}',
              f'--judge_learning_rate={C.grpo_judge_learning_rate}', f'--judge_replay={C.grpo_judge_replay}'] \
        + ([f'--judge_unfreeze_layers={C.grpo_judge_unfreeze_layers}'] if C.grpo_judge_unfreeze_layers else []) \
        + ([f'--judge_warmup_steps={C.grpo_judge_warmup_steps}'] if C.grpo_judge_warmup_steps else []) \
        + ([f'--judge_natural_windows={C.grpo_judge_natural_windows}'] if C.grpo_judge_natural_windows else [])
    referee = [f'--referee_samples={C.grpo_referee_samples}', f'--referee_seed={repeat_seed(C)}'] \
        if C.grpo_referee_samples else []  # the referee over the game reads a frozen judge's game too
    judge = [f'--reward_model_path={reward_model}'] if C.grpo_judge == 'model' else [f'--judge={C.grpo_judge}']
    return [os.path.join(ROOT, 'train_grpo.py'), f'--policy_path={base}', *judge, f'--dataset={data_dir}',
            f'--out_path={out_path}', f'--max_steps={C.grpo_max_steps}',
            f'--prompts_per_step={C.grpo_prompts_per_step}', f'--num_generations={C.grpo_num_generations}',
            f'--learning_rate={C.grpo_learning_rate}', f'--beta={C.grpo_beta}',
            f'--num_iterations={C.grpo_num_iterations}', f'--scale_rewards={scale_rewards or C.grpo_scale_rewards}',
            f'--max_kl={C.grpo_max_kl}', f'--temperature={C.sample_temperature}', f'--top_k={C.sample_top_k}',
            f'--eval_interval={C.grpo_eval_interval}', '--ppl_max_tokens=50000', f'--device={C.device}',
            f'--seed={seed}', '--resume=True'] + (online if C.grpo_judge_update_interval else []) + referee \
        + (['--token_advantages=True'] if C.grpo_token_advantages else []) \
        + ([f'--nll_weight={C.grpo_nll_weight}'] if C.grpo_nll_weight else []) \
        + ([f'--reward={C.grpo_reward}'] if C.grpo_reward != 'judge' else []) \
        + ([f'--teacher_path={C.grpo_teacher_path}'] if C.grpo_teacher_path else []) \
        + ([f'--token_discount={C.grpo_token_discount}'] if C.grpo_token_discount != 0.23 else []) \
        + ([f'--teacher_kl_weight={C.grpo_teacher_kl_weight}'] if C.grpo_teacher_kl_weight else []) \
        + ([f'--teacher_kl={C.grpo_teacher_kl}'] if C.grpo_teacher_kl != 'reverse' else []) \
        + (['--teacher_sampled=False'] if not C.grpo_teacher_sampled else []) \
        + ([f'--reward_form={C.grpo_reward_form}'] if C.grpo_reward_form != 'p_natural' else []) \
        + (['--kl_in_reward=True'] if C.grpo_kl_in_reward else []) \
        + ([f'--reward_scale={C.grpo_reward_scale}'] if C.grpo_reward_scale != 1.0 else []) \
        + ([f'--kl_anchor={C.grpo_kl_anchor}'] if C.grpo_kl_anchor != 'reference' else []) \
        + ([f'--objective={C.grpo_objective}'] if C.grpo_objective != 'grpo' else []) \
        + ([f'--loss_type={C.grpo_loss_type}'] if C.grpo_loss_type != 'grpo' else []) \
        + (['--judge_off=True', f'--arm_log={arm_log}', '--calibrate=False'] if arm_log else [])


def repeat_seed(C):
    """The seed of a repeat of the method on one base v1: its trainer's (seeded this + n) and every draw after base
    v1's (the judge's data and training, the evaluations, the controls). A repeat (trainer_seed s) draws its own, so
    that a method read over seeds has each seed's own controls and texts."""
    return C.trainer_seed or C.seed


def evaluate_cmd(C, ckpts, data_dir, referee, out_path, temperatures, extra=()):
    """The cycle's evaluate.py call: every version and control is measured by these instruments."""
    judge_args = (f'--max_iters={C.judge_max_iters} --learning_rate={C.judge_learning_rate} '
                  f'--reward_head_hidden_dim={C.reward_head_hidden_dim} --batch_size=64 --eval_interval=100')
    # the recipe appears only when it is not the default, so that runs made before keep their evaluations
    recipe = ['--judge_recipe', C.judge_recipe] if C.judge_recipe != 'crossover' else []
    return [os.path.join(ROOT, 'evaluate.py'), *ckpts, '--dataset', data_dir, '--referee', referee,
            '--out', out_path, '--temperatures', ','.join(map(str, temperatures)), '--top_k', str(C.sample_top_k),
            '--num_samples', str(C.eval_num_samples), '--seed', str(repeat_seed(C)), '--device', C.device,
            '--judge_seeds', str(C.judge_seeds), '--judge_max_blocks', str(C.judge_max_blocks),
            '--judge_samples_per_chunk', str(C.judge_samples_per_chunk), '--c2st_folds', '5',
            '--judge_args=' + judge_args, *recipe, *extra]


# evaluate.py reduced to the judge's sight: no perplexity, MAUVE, fresh judges or two-sample test
SIGHT_ONLY = ['--no_ppl', '--no_mauve', '--judge_seeds', '0', '--c2st_folds', '0']


def prepared_data(C):
    """The dataset folder (absolute), prepared by its own prepare.py when missing (its log beside the data: the run
    folder is made only once the corpus is checked), and its files."""
    data_dir = data_path(C.dataset)
    if not os.path.isfile(os.path.join(data_dir, 'val.bin')):
        prepare = os.path.join(data_dir, 'prepare.py')
        if not os.path.isfile(prepare):
            raise UserError(f"{data_dir} has no train.bin/val.bin and no prepare.py: pass --dataset with prepared data")
        run([prepare], os.path.join(data_dir, 'prepare.log'))  # writes atomically itself
    return data_dir, [os.path.join(data_dir, f) for f in ('train.bin', 'val.bin', 'meta.pkl')
                      if os.path.exists(os.path.join(data_dir, f))]


def main(argv):
    C = configure(DEFAULTS, argv, RANGES, RELATIONS)
    if C.trainer not in ('grpo', 'spin'):
        raise UserError(f"trainer must be 'grpo' or 'spin', got {C.trainer!r}")
    if C.judge_recipe not in FRESH_JUDGE_FIGURES:
        raise UserError(f"judge_recipe must be one of {sorted(FRESH_JUDGE_FIGURES)}, got {C.judge_recipe!r}")
    select_args(C)  # a selection pass without held-out tokens fails here, before anything is written
    temps = sorted({float(t) for t in C.control_temperatures.split(',')})  # checked by configure
    data_dir, data_files = prepared_data(C)
    check_corpus(C, data_dir)  # what the stages will ask of the corpus, before base v1 starts
    os.makedirs(C.out_dir, exist_ok=True)
    out = os.path.abspath(C.out_dir)
    logs = os.path.join(out, 'logs')
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(out, 'config.json'), 'w') as f:
        json.dump(vars(C), f, indent=2)
    pipe = Pipeline(out)

    def path(name):
        return os.path.join(out, name)

    def script_stage(name, outputs, inputs, args, log, after=None):
        """A stage that runs one script; the token PARTIAL in args stands for its first output's temporary name."""
        def build(partials):
            run([a.replace('PARTIAL', partials[0]) for a in args], os.path.join(logs, log),
                tracking_args(C, os.path.splitext(log)[0]))
            if after:
                after(partials)
        pipe.stage(name, outputs, inputs, args, build)

    train_args = base_train_args(C, data_dir)

    def train_stage(name, output, inputs, extra, log):
        """train.py into a work folder; its ckpt.pt becomes the output. A killed stage's work folder keeps train.py's
        resume state: run again, it goes on from its last evaluation (train.py checks the settings and inputs)."""
        work = output + '.work'

        def build(partials):
            resuming = os.path.exists(resume_file(os.path.join(work, 'ckpt.pt')))
            if not resuming:
                shutil.rmtree(work, ignore_errors=True)
            run([os.path.join(ROOT, 'train.py'), f'--out_dir={work}', *train_args, *extra, '--resume=True'],
                os.path.join(logs, log), tracking_args(C, os.path.splitext(log)[0]), append=resuming)
            shutil.move(os.path.join(work, 'ckpt.pt'), partials[0])
            shutil.rmtree(work)
        pipe.stage(name, [output], inputs, ['train.py'] + train_args + extra, build)

    base_stages(C, train_stage, path, data_files)
    referee = os.path.abspath(C.referee_path) if C.referee_path else path('base_model_v1.pt')

    def evaluate_stage(name, output, ckpt, log, temperatures=(C.sample_temperature,), extra=(), inputs=()):
        args = evaluate_cmd(C, [ckpt], data_dir, referee, 'PARTIAL', temperatures, extra)
        script_stage(name, [output], [ckpt, referee, *inputs, *data_files], args, log)

    def grpo_stage(n, name, output, prefix, judge_off=False):
        """GRPO of base v{n} against reward model v{n} (or the n-gram judge) into output; its log, curves and online
        judge as {prefix}_v{n}_*."""
        base, rm = path(f'base_model_v{n}.pt'), path(f'reward_model_v{n}.pt')
        outputs = [output, path(f'{prefix}_v{n}_log.jsonl'), path(f'{prefix}_v{n}_curves.png')]
        outputs += [path(f'{prefix}_v{n}_judge.pt')] if C.grpo_judge_update_interval and C.grpo_judge == 'model' \
            else []
        arm_log = path(f'grpo_v{n}_log.jsonl') if judge_off else None

        def move_extras(partials):
            stem = os.path.splitext(partials[0])[0]
            for suffix, dest in zip(('_log.jsonl', '_curves.png', '_judge.pt'), partials[1:]):
                shutil.move(stem + suffix, dest)
        judge = [rm] if C.grpo_judge == 'model' else []
        judge += [C.grpo_teacher_path] if C.grpo_teacher_path else []  # the positive control's teacher
        script_stage(name, outputs, [base] + judge + data_files + ([arm_log] if arm_log else []),
                     grpo_cmd(C, base, rm, data_dir, 'PARTIAL', repeat_seed(C) + n, arm_log=arm_log),
                     f'{prefix}_v{n}.log', after=move_extras)

    evaluate_stage('evaluate v1', path('eval_v1.json'), path('base_model_v1.pt'), 'eval_v1.log')
    stopper = EarlyStopping(C.patience, C.min_delta, 'min')
    stopper.step(load_json(path('eval_v1.json'))[0]['val_perplexity'])
    stop_reason = f'num_cycles ({C.num_cycles})'
    for n in range(1, C.num_cycles + 1):
        base, rd, rm, new = (path(f'base_model_v{n}.pt'), path(f'reward_data_v{n}'), path(f'reward_model_v{n}.pt'),
                             path(f'base_model_v{n + 1}.pt'))
        print(f"== cycle {n}", flush=True)
        if C.trainer == 'spin':
            earlier = [path(f'base_model_v{k}.pt') for k in range(1, n)] if C.spin_opponent_mix else []
            script_stage(f'cycle {n}: SPIN -> base v{n + 1}', [new, path(f'spin_v{n}_log.jsonl')],
                         [base, *earlier] + data_files,
                         spin_cmd(C, base, earlier, data_dir, 'PARTIAL', repeat_seed(C) + n),
                         f'spin_v{n}.log', after=lambda partials: shutil.move(
                             os.path.splitext(partials[0])[0] + '_log.jsonl', partials[1]))
            evaluate_stage(f'evaluate v{n + 1}', path(f'eval_v{n + 1}.json'), new, f'eval_v{n + 1}.log')
        else:
            if C.reward_loss in PAIRED_LOSSES and os.path.isdir(rd) and not os.path.isfile(f'{rd}/val_natural.bin'):
                shutil.rmtree(rd)  # written before reward data kept each sample's natural block: rebuilt with them
            script_stage(f'cycle {n}: reward data', [rd], [base] + data_files,
                         reward_data_cmd(base, data_dir, 'PARTIAL', C.reward_max_blocks, C.reward_samples_per_chunk,
                                         repeat_seed(C) + n, C.device, C.sample_temperature, C.sample_top_k,
                                         C.reward_crossover_k, exclude_eval=(C.eval_num_samples, repeat_seed(C))),
                         f'reward_data_v{n}.log')
            trunk = os.path.abspath(C.reward_trunk_path) if C.reward_trunk_path else base
            script_stage(f'cycle {n}: reward model', [rm], [trunk, rd],
                         reward_model_cmd(trunk, rd, 'PARTIAL', repeat_seed(C) + n, C.device, reward_recipe(C)),
                         f'reward_model_v{n}.log')
            # the judge's sight before the game: base v{n}'s own samples on the two-sample windows (the same samples
            # as eval_v{n}'s), beside its sight on the new base after it; the pair says whether the policy fooled it
            evaluate_stage(f'cycle {n}: judge sight on base v{n}', path(f'sight_v{n}.json'), base, f'sight_v{n}.log',
                           extra=['--reward_model', rm, *SIGHT_ONLY], inputs=[rm])
            if C.tilt_k:  # the judge's tilt of base v{n}, sampled without RL
                tilt_stage(C, n, evaluate_stage, base, rm, path(f'tilt_v{n}.json'))
            grpo_stage(n, f'cycle {n}: GRPO -> base v{n + 1}', new, 'grpo')
            evaluate_stage(f'evaluate v{n + 1}', path(f'eval_v{n + 1}.json'), new, f'eval_v{n + 1}.log',
                           extra=['--reward_model', rm], inputs=[rm])
        if C.controls:
            run_controls(C, pipe, n, temps, train_stage, evaluate_stage, grpo_stage, path, data_files)
        write_report(out, C, pipe.current)
        stopper.step(load_json(path(f'eval_v{n + 1}.json'))[0]['val_perplexity'])
        if stopper.should_stop and n < C.num_cycles:
            stop_reason = f"held-out perplexity did not improve by {C.min_delta} for {C.patience} cycles"
            break
    write_report(out, C, pipe.current)
    print(f"finished: {stop_reason}; report {os.path.join(out, 'report.md')}")


def reward_recipe(C):
    """The one reward-model recipe of the cycle's judges (train_reward_model.py options)."""
    return [f'--max_iters={C.reward_max_iters}', f'--reward_head_hidden_dim={C.reward_head_hidden_dim}',
            f'--reward_pooling={C.reward_pooling}', f'--unfreeze_layers={C.reward_unfreeze_layers}',
            f'--learning_rate={C.reward_learning_rate}', f'--batch_size={C.reward_batch_size}',
            f'--eval_interval={C.reward_eval_interval}'] \
        + ([f'--loss={C.reward_loss}'] if C.reward_loss != 'mse' else []) \
        + ([f'--max_epochs={C.reward_max_epochs}'] if C.reward_max_epochs else [])  # the seed's judge: same manifests


def base_stages(C, train_stage, path, data_files):
    """base v1: a cosine with early stopping, and with base_hold_iters its kept checkpoint trained on at the cosine's
    final rate held, its best kept (held_args)."""
    cosine = path('base_cosine_v1.pt') if C.base_hold_iters else path('base_model_v1.pt')
    train_stage('base v1', cosine, data_files,
                [f'--max_iters={C.base_max_iters}', f'--lr_decay_iters={C.base_max_iters}',
                 f'--learning_rate={C.base_learning_rate}', f'--min_lr={final_lr(C)}',
                 f'--eval_interval={C.base_eval_interval}', '--always_save_checkpoint=False',
                 f'--patience={C.base_patience}', f'--min_delta={C.base_min_delta}', '--warmup_iters=50',
                 f'--seed={C.seed}'] + select_args(C)
                + ([f'--init_from={C.init_from}'] if C.init_from != 'scratch' else []), 'base_v1.log')
    if C.base_hold_iters:
        train_stage('base v1 held', path('base_model_v1.pt'), [cosine] + data_files,
                    held_args(C, cosine, C.base_hold_iters, C.seed), 'base_v1_held.log')


def final_lr(C):
    """base v1's learning rate at the end of its cosine: base_min_lr, or a tenth of its peak."""
    return C.base_min_lr or C.base_learning_rate / 10


def check_corpus(C, data_dir):
    """The corpus holds what the stages will ask of it, each as the stage would say it, before anything is written:
    base v1's selection tail (train.py's rule) and evaluate.py's 2 x eval_num_samples disjoint val windows."""
    n_train, n_val = (len(np.memmap(os.path.join(data_dir, f), dtype=np.uint16, mode='r'))
                      for f in ('train.bin', 'val.bin'))
    check_select_tokens('base_select_tokens', C.base_select_tokens, C.block_size, n_train)
    windows = n_val // C.block_size
    if 2 * C.eval_num_samples > windows:
        raise UserError(f"--eval_num_samples={C.eval_num_samples}: {data_dir}'s val split holds {windows} windows of "
                        f"{C.block_size} tokens, and evaluation needs 2 x {C.eval_num_samples}: pass at most "
                        f"{windows // 2}")


def select_args(C):
    """base v1's and the MLE control's selection split (none given: val, and a run made before keeps its stages)"""
    if not C.base_select_tokens:
        if C.base_select_pass:
            raise UserError("base_select_pass reads the held-out train tokens: give them with --base_select_tokens=N")
        return []
    return [f'--select_tokens={C.base_select_tokens}'] + (['--select_pass=True'] if C.base_select_pass else [])


def matched_perplexity(base_path, data_dir, device, temperature):
    """The previous base's whole-split val perplexity at the matched temperature, with its per-window
    cross-entropies (the perplexity verdict pairs them window by window with the arm's)."""
    import numpy as np
    from model import GPT, evaluate_perplexity
    base = GPT.from_checkpoint(base_path, device=device)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    _, ppl, windows = evaluate_perplexity(base, val, base.config.block_size, temperature=temperature, per_window=True)
    return dict(val_perplexity=ppl, val_window_cross_entropy=windows)


def calibrated_point(base_path, data_dir, device):
    """The base at its tail-calibrated temperature (calibration.py: fit on its held-out selection tail, never val,
    recorded by its trainer): its temperature and matched_perplexity there; None where it holds out no tail."""
    from calibration import tail_temperature
    temperature = tail_temperature(base_path, data_dir, device)
    if temperature is None:
        return None
    return dict(temperature=temperature, **matched_perplexity(base_path, data_dir, device, temperature))


def completion_cross_entropy(model_path, data_dir, device, temperature, num_samples, length, seed):
    """A generator's cross-entropy (nats a token) on each natural completion of the evaluation's windows
    (evaluate.py's draw of num_samples windows of this length at this seed), sampled at this temperature."""
    import numpy as np
    from model import GPT
    from tilt import completion_logprob
    from two_sample import PROMPT_LEN, eval_windows
    model = GPT.from_checkpoint(model_path, device=device)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    reference = eval_windows(val, num_samples, length, seed)[0].to(device)
    return (-completion_logprob(model, reference, PROMPT_LEN, temperature) / (length - PROMPT_LEN)).tolist()


def tilt_controls(points, base_path, data_dir, device, tilt, seed):
    """A tilt point's controls without training, from its generator's own points (at the tilt's temperature and
    the sweep): the generator itself, and the generator at the temperature whose entropy matches the tilt's, each
    with its natural completions' cross-entropy (computed here where its evaluation did not record it)."""
    base = dict(next(p for p in points if p['temperature'] == tilt['temperature']))
    matched = matched_temperature(points, tilt['sample_entropy'])
    for point in (base, matched):
        if 'completion_window_cross_entropy' not in point:
            point['completion_window_cross_entropy'] = completion_cross_entropy(
                base_path, data_dir, device, point['temperature'], tilt['num_samples'], tilt['sample_length'], seed)
    return {'base': base, 'temperature': matched}


def flops_per_iteration(C, base):
    """The FLOPs of one next-token training iteration of base (forward and backward) at the run's batch shape."""
    from model import GPT
    return GPT.from_checkpoint(base).flops_per_token(backward=True) * C.batch_size * C.block_size


def mle_args(C, base, flops, seed):
    """An MLE control's train.py options (beside base_train_args) and iterations: base trained further with
    next-token loss for at most `flops` (held_args)."""
    iters = max(1, math.ceil(flops / flops_per_iteration(C, base)))
    return iters, held_args(C, base, iters, seed)


def held_args(C, base, iters, seed):
    """train.py options that train base further with next-token loss for at most iters, at the base's final learning
    rate held (continued training, not a new schedule), keeping the best checkpoint by the base's own early-stopping
    rule, as a researcher would stop it: the MLE control's recipe, and base_hold_iters' tail of base v1."""
    return [f'--init_from={base}', f'--max_iters={iters}', f'--eval_interval={min(iters, C.base_eval_interval)}',
            '--decay_lr=False', f'--learning_rate={C.mle_learning_rate or final_lr(C)}',
            '--always_save_checkpoint=False',
            f'--patience={C.base_patience}', f'--min_delta={C.base_min_delta}', '--warmup_iters=0',
            f'--seed={seed}'] + select_args(C)


def mle_stage(C, train_stage, name, base, output, flops, data_files, n, log):
    """An MLE control of cycle n as a stage (mle_args); returns its iterations."""
    iters, args = mle_args(C, base, flops, repeat_seed(C) + n)
    train_stage(name, output, [base] + data_files, args + ['--calibrate=False'], log)
    return iters


def tilt_stage(C, n, evaluate_stage, base, rm, output):
    """The tilt point of cycle n: base v{n} resampled by its judge rm (or by tilt_source's exact log-ratio)."""
    source = os.path.abspath(C.tilt_source) if C.tilt_source else rm
    evaluate_stage(f'cycle {n}: tilt of base v{n}', output, base, f'tilt_v{n}.log',
                   extra=['--tilt', source, '--tilt_k', str(C.tilt_k), '--tilt_scale', str(C.tilt_scale),
                          '--judge_seeds', '0'], inputs=[source])


def tilt_control_stages(C, pipe, n, train_stage, evaluate_stage, path, data_files):
    """The tilt point's MLE control, given the judge's FLOPs (its data and training) and the tilt's sampling, and
    the tilt's verdict against it, base v{n} and base v{n} at the matched temperature (tilt_verdict_v{n}.json)."""
    base, mle, tilt = path(f'base_model_v{n}.pt'), path(f'mle_tilt_v{n + 1}.pt'), path(f'tilt_v{n}.json')
    flops = cycle_flops(None, path(f'reward_data_v{n}'), path(f'reward_model_v{n}.pt')) \
        + load_json(tilt)[0]['tilt_sampling_flops']
    iters = mle_stage(C, train_stage, f'cycle {n}: MLE control of the tilt', base, mle, flops, data_files, n,
                      f'mle_tilt_v{n + 1}.log')
    evaluate_stage(f'evaluate MLE control of the tilt v{n + 1}', path(f'eval_mle_tilt_v{n + 1}.json'), mle,
                   f'eval_mle_tilt_v{n + 1}.log', extra=['--judge_seeds', '0'])
    inputs = [tilt, path(f'eval_v{n}.json'), path(f'sweep_v{n}.json'), path(f'eval_mle_tilt_v{n + 1}.json'), base]

    def build(partials):
        from verdict import tilt_verdict
        point = load_json(tilt)[0]
        controls = tilt_controls(load_json(path(f'eval_v{n}.json')) + load_json(path(f'sweep_v{n}.json')), base,
                                 data_path(C.dataset), resolve_device(C.device), point, repeat_seed(C))
        controls['mle'] = load_json(path(f'eval_mle_tilt_v{n + 1}.json'))[0]
        v = dict(cycle=n, verdicts=tilt_verdict(point, controls), draw_seed=repeat_seed(C), tilt_flops=flops,
                 mle_iters=iters, matched_temperature=controls['temperature']['temperature'],
                 tilt={k: point[k] for k in ('tilt', 'tilt_kind', 'tilt_k', 'tilt_scale', 'tilt_perplexity',
                                             'tilt_ess', 'c2st_auc', 'completion_perplexity', 'sample_entropy')})
        with open(partials[0], 'w') as f:
            json.dump(v, f, indent=1)
    pipe.stage(f'cycle {n}: tilt verdict', [path(f'tilt_verdict_v{n}.json')], inputs,
               ['verdict.tilt_verdict', f'cycle {n}', f'format {VERDICT_FORMAT}'], build)


def run_controls(C, pipe, n, temps, train_stage, evaluate_stage, grpo_stage, path, data_files):
    """Cycle n's controls, measured like the cycle's output, and its verdict against them."""
    from model import load_checkpoint
    base, mle, off = path(f'base_model_v{n}.pt'), path(f'mle_v{n + 1}.pt'), path(f'judgeoff_v{n + 1}.pt')
    grpo = C.trainer == 'grpo'
    flops = cycle_flops(path(f'base_model_v{n + 1}.pt'), path(f'reward_data_v{n}') if grpo else None,
                        path(f'reward_model_v{n}.pt') if grpo else None)
    iters = mle_stage(C, train_stage, f'cycle {n}: MLE control', base, mle, flops, data_files, n, f'mle_v{n + 1}.log')
    evaluate_stage(f'evaluate MLE control v{n + 1}', path(f'eval_mle_v{n + 1}.json'), mle, f'eval_mle_v{n + 1}.log')
    inputs = [path(f'eval_v{n}.json'), path(f'eval_v{n + 1}.json'), path(f'eval_mle_v{n + 1}.json'), base, mle]
    if grpo:  # what the judge adds: the same GRPO run with its reward replaced by a constant
        grpo_stage(n, f'cycle {n}: judge-off control', off, 'judgeoff', judge_off=True)
        # read by the cycle's judge too: how far its sight falls where no judge signal reached the policy
        rm = path(f'reward_model_v{n}.pt')
        evaluate_stage(f'evaluate judge-off control v{n + 1}', path(f'eval_judgeoff_v{n + 1}.json'), off,
                       f'eval_judgeoff_v{n + 1}.log', extra=['--reward_model', rm], inputs=[rm])
        inputs.append(path(f'eval_judgeoff_v{n + 1}.json'))
    sweep = [t for t in temps if t != C.sample_temperature]
    if sweep:
        evaluate_stage(f'temperature sweep of base v{n}', path(f'sweep_v{n}.json'), base, f'sweep_v{n}.log',
                       temperatures=sweep, extra=['--no_ppl', '--no_mauve'])
        inputs.append(path(f'sweep_v{n}.json'))
    if grpo and C.tilt_k and sweep:
        tilt_control_stages(C, pipe, n, train_stage, evaluate_stage, path, data_files)

    def build(partials):
        points = load_json(path(f'eval_v{n}.json')) + (load_json(path(f'sweep_v{n}.json')) if sweep else [])
        off_point = load_json(path(f'eval_judgeoff_v{n + 1}.json'))[0] if grpo else None
        arm = load_json(path(f'eval_v{n + 1}.json'))[0]
        matched = matched_temperature(points, arm['sample_entropy'])
        matched.update(matched_perplexity(base, data_path(C.dataset), resolve_device(C.device), matched['temperature']))
        v = cycle_verdict(arm, load_json(path(f'eval_mle_v{n + 1}.json'))[0], matched, off_point,
                          calibrated_point(base, data_path(C.dataset), resolve_device(C.device)))
        kept = load_checkpoint(mle)
        v.update(cycle=n, mle_iters=iters, mle_best_iter=kept['iter_num'], mle_stopped_at=kept.get('stopped_at'),
                 mle_stop_reason=kept.get('stop_reason'), cycle_flops=flops,
                 mle_select_tokens=kept['config'].get('select_tokens', 0), draw_seed=repeat_seed(C))
        if grpo:  # the judge-off control runs its arm's steps: both runs' steps and compute, side by side
            for name, ckpt in (('arm', path(f'base_model_v{n + 1}.pt')), ('judge_off', off)):
                metrics = load_checkpoint(ckpt)['metrics']
                v[f'{name}_steps'], v[f'{name}_flops'] = len(metrics['history']), metrics['flops']
        with open(partials[0], 'w') as f:
            json.dump(v, f, indent=1)
    pipe.stage(f'cycle {n}: verdict', [path(f'verdict_v{n}.json')], inputs,
               ['verdict.cycle_verdict', f'cycle {n}', f'format {VERDICT_FORMAT}'], build)


# -----------------------------------------------------------------------------
# the report: only artefacts of this run's stages (current: stage name -> outputs)

def fmt(v, spec='.3f', sd=None):
    if v is None:
        return '–'
    return format(v, spec) + ('' if sd is None else ' ± ' + format(sd, spec))


def collect(out, current):
    """Evaluation points and cycle artefacts of the current stages, by role."""
    from model import load_checkpoint
    have = {os.path.basename(o): o for outputs in current.values() for o in outputs}
    versions, cycles, n = [], [], 1
    while f'eval_v{n}.json' in have:
        versions.append(dict(load_json(have[f'eval_v{n}.json'])[0], version=n))
        n += 1
    for n in range(1, len(versions)):
        c = {'cycle': n, 'arm': versions[n]}
        if f'reward_model_v{n}.pt' in have:
            c['rm'] = load_checkpoint(have[f'reward_model_v{n}.pt'])['metrics']
        if f'base_model_v{n + 1}.pt' in have:
            c['trained'] = load_checkpoint(have[f'base_model_v{n + 1}.pt'])['metrics']  # GRPO's or SPIN's run
        if f'eval_mle_v{n + 1}.json' in have:
            c['mle'] = load_json(have[f'eval_mle_v{n + 1}.json'])[0]
        if f'eval_judgeoff_v{n + 1}.json' in have:
            c['judge_off'] = load_json(have[f'eval_judgeoff_v{n + 1}.json'])[0]
        c['sweep'] = [versions[n - 1]] + (load_json(have[f'sweep_v{n}.json']) if f'sweep_v{n}.json' in have else [])
        if f'verdict_v{n}.json' in have:
            c['verdict'] = load_json(have[f'verdict_v{n}.json'])
        if f'sight_v{n}.json' in have:
            c['sight_before'] = load_json(have[f'sight_v{n}.json'])[0]
        if f'tilt_verdict_v{n}.json' in have:
            c['tilt_verdict'] = load_json(have[f'tilt_verdict_v{n}.json'])
        cycles.append(c)
    return versions, cycles


def first_last(history, key):
    """'first 10 → last 10': a logged figure's mean over a run's first and last 10 steps ('–' when not logged)."""
    if not history or history[0].get(key) is None:
        return '–'
    mean = lambda rows: sum(x[key] for x in rows) / len(rows)  # noqa: E731
    return f"{fmt(mean(history[:10]))} → {fmt(mean(history[-10:]))}"


def off_sight(c):
    """' (0.812 ± 0.006)': the cycle's judge on the judge-off control's samples, where that control was read by it"""
    off = c.get('judge_off', {})
    return f" ({fmt(off['judge_sight_auc'], '.3f', off.get('judge_sight_auc_sd'))})" if 'judge_sight_auc' in off else ''


def judge_worth(e):
    """'0.12 [0.03, 0.21]; ×1.5': a judge's DV on a point's samples (evaluate.py --reward_model), '–' if unread."""
    if 'judge_dv' not in e:
        return '–'
    return f"{e['judge_dv']:.2f} [{e['judge_dv_ci'][0]:.2f}, {e['judge_dv_ci'][1]:.2f}]; ×{e['judge_dv_scale']:g}"


def mle_gain(c):
    """The MLE control's likelihood gain over the cycle's base in the judge's currency: the fall of the whole-split
    val cross-entropy per token, times the tokens a two-sample window's sample writes (its length less the prompt)."""
    base, mle = c['sweep'][0], c.get('mle', {})
    if 'val_cross_entropy' not in mle or 'val_cross_entropy' not in base:
        return '–'
    from two_sample import PROMPT_LEN
    return fmt((base['val_cross_entropy'] - mle['val_cross_entropy']) * (base['sample_length'] - PROMPT_LEN), '.2f')


def point_row(label, e):
    blind = ' (blind)' if e.get('fresh_judge_blind') else \
        f" ({e['fresh_judge_blind_count']} blind)" if e.get('fresh_judge_blind_count') else ''
    key, _, spec, _ = fresh_judge_figure(e)
    one = e.get('fresh_judge_n') == 1  # a spread over one judge is no spread: say so instead of '± 0.00'
    sd = (lambda k: None if one else e.get(k))  # noqa: E731
    return (f"| {label} | {fmt(e.get('val_perplexity'))} | "
            f"{fmt(e.get(key), spec, sd(key + '_sd'))}{' (1 seed)' if one else ''}{blind} | "
            f"{fmt(e.get('fresh_judge_r2'), '.3f', sd('fresh_judge_r2_sd'))} | "
            f"{fmt(e.get('c2st_auc'), '.3f', e.get('c2st_auc_sd'))} | {fmt(e.get('unknown_word_rate'))} | "
            f"{fmt(e.get('distinct_4_tokens'))} | {fmt(e.get('sample_entropy'))} | "
            f"{fmt(e.get('mauve'), '.3f', e.get('mauve_sd'))} |")


POINT_HEADER = ['| | val ppl (whole split) | fresh judges: boundary err (↑) or, whole-window, sight (↓) | '
                'fresh-judge R² (↓) | two-sample AUC (↓) | '
                'unknown words (↓) | distinct-4 | sample entropy | MAUVE (↑) |', '|---|---|---|---|---|---|---|---|---|']


PERPLEXITY_ONLY = ('calibrated',)  # controls with no samples of their own: read on perplexity alone


def beats(control, x):
    """Whether the arm beats one control's reading x: better on the fresh judges and on the two-sample test where the
    control has samples, and perplexity no worse than the MLE control's or than the tail-calibrated base's (read on
    perplexity alone)."""
    if control in PERPLEXITY_ONLY:
        return x['perplexity'] in ('better', 'equal')
    return (x['fresh_judges'] == 'better' and x['c2st'] == 'better'
            and (control != 'mle' or x['perplexity'] in ('better', 'equal')))


def beats_every_control(verdicts):
    """The repository's question answered for one cycle: beats(k, x) for every control k (the tail-calibrated base's
    among them where the base has one)."""
    return all(beats(k, x) for k, x in verdicts.items())


def effect_text(e, what, spec='.3f'):
    """' (arm AUC lower by 0.031 [0.017, 0.045], margin ±0.030; detectable ≥ 0.014)': an effect (positive: the arm
    better) with its 95% interval, its equivalence margin and the smallest effect its interval could have called
    better or worse ('cannot say equal' where the interval is wider than the margin), as the report prints it."""
    if not e:
        return ''
    detectable = e.get('detectable', (e['ci'][1] - e['ci'][0]) / 2)
    return (f" ({what} {e['effect']:{spec}} [{e['ci'][0]:{spec}}, {e['ci'][1]:{spec}}], margin ±{e['margin']:{spec}}; "
            f"detectable ≥ {detectable:{spec}}" + ('' if detectable < e['margin'] else '; cannot say equal') + ")")


def verdict_cell(label, e=None, spec='.3f'):
    """A verdict table's cell: the label in bold with the effect (positive: the arm better) and its 95% interval,
    marked 'wide' where the interval is wider than the margin (it could not have read 'equal'); '–' where the
    control has no reading."""
    if not e:
        return '–' if label in (None, '–') else f"**{label}**"
    wide = '' if e.get('can_say_equal', True) else ' (wide)'
    return f"**{label_text(e)}** {e['effect']:+{spec}} [{e['ci'][0]:{spec}}, {e['ci'][1]:{spec}}]{wide}"


VERDICT_CONTROLS = {'mle': 'MLE at equal FLOPs', 'temperature': 'the matched temperature',
                    'judge_off': 'the judge-off control', 'calibrated': 'the tail-calibrated base'}


def verdict_caption(c):
    """The facts under a cycle's verdict that are not readings: the controls' compute and selection, T*, the tail's
    temperature, the draws, the margins."""
    v, n = c['verdict'], c['cycle']
    m = v['matched']
    stop, held_out = v.get('mle_stopped_at'), v.get('mle_select_tokens')
    selected_on = (f"best loss on the last {held_out:,} train tokens, held out of training" if held_out
                   else "best val loss")
    text = (f"one training run a side: a claim about the method reads several trainer seeds, each with its own "
            f"controls and draws, `benchmarks/bench_arms.py`; labels by `verdict.py` (the 95% interval; margins "
            f"±{v['margins']['c2st_auc']:.3f} AUC, ±{v['margins']['perplexity']:.1%} perplexity); the MLE control is "
            f"base v{n} + next-token training allowed "
            f"{v['mle_iters']} iterations (the cycle's {v['cycle_flops']:.3g} FLOPs: the trainer's run and, for GRPO, "
            f"the judge's data and training)"
            + (f", stopped at {stop}, kept iteration {v['mle_best_iter']} ({selected_on})" if stop is not None else ''))
    if 'judge_off_steps' in v:
        text += (f"; the judge-off control ran {v['judge_off_steps']} GRPO steps ({v['judge_off_flops']:.3g} FLOPs), "
                 f"the arm {v['arm_steps']} ({v['arm_flops']:.3g} FLOPs)")
    text += f"; matched temperature T* = {m['temperature']:.3f}"
    text += ' (outside the sweep: matched to its nearest end)' if m['outside_sweep'] else ''
    text += f"; tail-calibrated temperature {v['calibrated']['temperature']:.3f}" if 'calibrated' in v else ''
    return text + (f"; draws seeded {v['draw_seed']}" if 'draw_seed' in v else '') + f"; `verdict_v{n}.json`"


def verdict_lines(c):
    """A cycle's verdict as the report prints it: one row a control, one column an instrument, each cell the label
    and its interval; under the table, the controls the cycle beats."""
    vd, n = c['verdict']['verdicts'], c['cycle']
    rows = [f"| {VERDICT_CONTROLS[k]} | {verdict_cell(x['fresh_judges'])} | "
            f"{verdict_cell(x['c2st'], x.get('c2st_effect'))} | "
            f"{verdict_cell(x['perplexity'], x.get('perplexity_effect'), '.1%')} |" for k, x in vd.items()]
    beaten = [VERDICT_CONTROLS[k] for k, x in vd.items() if beats(k, x)]
    summary = ("The cycle beats every control." if beats_every_control(vd) else
               f"The cycle beats {' and '.join(beaten)}, not every control." if beaten else
               "The cycle beats no control.")
    return [f"**Cycle {n} verdict: base v{n + 1} against each control** ({verdict_caption(c)}):", '',
            '| against | fresh judges | two-sample test: arm AUC lower by | perplexity: arm ppl lower by |',
            '|---|---|---|---|', *rows, '', summary, '']


def tilt_lines(c):
    """The tilt point's verdict against its controls, as the report prints it."""
    v, n = c['tilt_verdict'], c['cycle']
    t = v['tilt']
    ppl = ', '.join(f"K = {K}: {x['conservative']:.3f} (optimistic {x['optimistic']:.3f})"
                    for K, x in t['tilt_perplexity'].items())
    labels = '; '.join(
        f"against {TILT_CONTROL_NAMES[k]}: two-sample test "
        f"**{label_text(x['c2st_effect']) if x.get('c2st_effect') else '–'}**"
        f"{effect_text(x.get('c2st_effect'), 'tilt AUC lower by')}, perplexity of the natural completions "
        f"**{label_text(x['perplexity_effect'])}**{effect_text(x['perplexity_effect'], 'tilt ppl lower by', '.1%')}"
        for k, x in v['verdicts'].items())
    return [f"**Cycle {n}: the tilt of base v{n} without RL** (base v{n} resampled by "
            f"{'its judge' if t['tilt_kind'] == 'judge' else 'the exact log-ratio of ' + os.path.basename(t['tilt'])}, "
            f"1 of {t['tilt_k']} candidates kept ∝ e^{{{t['tilt_scale']:g}·f}}, mean effective sample size "
            f"{t['tilt_ess']:.1f}; two-sample AUC {t['c2st_auc']:.3f}; its perplexity on the natural completions, "
            f"conservative (optimistic): {ppl}; matched temperature T* = {v['matched_temperature']:.3f}; the MLE "
            f"control got {v['tilt_flops']:.3g} FLOPs, {v['mle_iters']} iterations; `tilt_verdict_v{n}.json`): "
            f"{labels}.", '']


TILT_CONTROL_NAMES = {'base': 'the base itself', 'temperature': 'the matched temperature',
                      'mle': 'the MLE control at the tilt\'s FLOPs'}


def stage_time_lines(out, current):
    """The table of every stage of this run: wall time and peak memory when it was built (a stage skipped by this run
    keeps the figures of the run that built it)."""
    times = load_json(os.path.join(out, 'stage_times.json')) if os.path.isfile(os.path.join(out, 'stage_times.json')) \
        else {}
    lines = ['## Stage times', '', 'Wall time and the peak resident memory of its script, as measured when the stage '
             'was built ("in process": the stage ran inside run_cycles.py).', '',
             '| stage | wall time | peak memory | built |', '|---|---|---|---|']
    total = 0.0
    for name in current:
        t = times.get(name)
        if t is None:
            continue
        total += t['seconds']
        peak = 'in process' if t['peak_mb'] is None else f"{t['peak_mb']:,} MB"
        lines.append(f"| {name} | {t['seconds'] / 60:.1f} min ({t['seconds']:.0f} s) | {peak} | {t['finished']} |")
    return lines + [f"| **all stages** | **{total / 60:.1f} min** | | |", '']


FRESH_JUDGE_TEXT = {  # how the report says what each recipe's fresh judges are
    'crossover': "crossover data, a head on the referee's frozen trunk, its boundary error reported on the other half",
    'window': "whole windows, every weight of the referee's copy trained, its sight reported on the point's two-sample "
              "windows"}


def write_report(out, C, current):
    versions, cycles = collect(out, current)
    lines = ['# Adversarial self-play report', '', f"Run directory `{out}`; config in `config.json`. Every figure "
             f"below is measured by the same instruments: the referee `{C.referee_path or 'base_model_v1.pt'}` gives "
             f"MAUVE's features and the start of every fresh judge ({C.judge_seeds} "
             f"seed{'s' if C.judge_seeds != 1 else ''} per point, each on its own data, selected on one half of "
             f"its held-out data; {FRESH_JUDGE_TEXT[C.judge_recipe]}; 'blind': "
             f"every judge kept its untrained start); a TF-IDF logistic regression that reads no model tells "
             f"samples from natural windows (two-sample AUC of the pooled out-of-fold scores over 5 folds, ± its "
             f"bootstrap sd over the texts); "
             f"{C.eval_num_samples} samples per point at temperature {C.sample_temperature}, from prompts disjoint "
             f"from the natural reference windows. ↑/↓: which way is closer to natural text. How to read it: "
             f"`docs/grpo_cycle.md`.", '', '## Generator versions', ''] + POINT_HEADER
    lines += [point_row(f"v{e['version']}", e) for e in versions]
    lines += ['', '| cycle | judge test R² | judge boundary err | judge sight (AUC, two-sample windows) on the cycle\'s '
              'base → on the new base (on the judge-off control) | judge worth on the cycle\'s base (DV of its '
              'log-odds, nats per window [95%]; its scale) | the MLE control\'s gain (nats per window) | '
              "GRPO reward first 10 → last 10 steps | judge boundary err on each step's unseen rollouts, first 10 → "
              "last 10 | judge sight on each step's unseen rollouts (AUC), first 10 → last 10 | raw group std of "
              "rewards | saved policy KL | stopped by |", '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for c in cycles:
        rm, g = c.get('rm', {}), c.get('trained')
        h = g['history'] if g else []
        if g and C.trainer == 'spin':  # no separate judge; the model's own margin on held-out prompts
            lines.append(f"| {c['cycle']} (SPIN) | – | – | – | – | – | held-out margin (log π − log π_ref)(real − generated): "
                         f"{fmt(g['start']['heldout_margin'])} → {fmt(h[-1]['heldout_margin'])} | – | – | – | – | "
                         f"{g['stop_reason']} |")
            continue
        before = c.get('sight_before', {})
        lines.append(f"| {c['cycle']} | {fmt(rm.get('r2'))} | {fmt(rm.get('boundary_error'), '.1f')} | "
                     f"{fmt(before.get('judge_sight_auc'), '.3f', before.get('judge_sight_auc_sd'))} → "
                     f"{fmt(c['arm'].get('judge_sight_auc'), '.3f', c['arm'].get('judge_sight_auc_sd'))}"
                     f"{off_sight(c)} | {judge_worth(before)} | {mle_gain(c)} | "
                     + (f"{first_last(h, 'reward')} | {first_last(h, 'judge_boundary_error')} | {first_last(h, 'judge_sight')} | "
                        f"{fmt(sum(x['reward_group_std'] for x in h) / len(h), '.4f')} | "
                        f"{fmt(g.get('final_kl'), '.4f')} | {g['stop_reason']} |" if g else '– | – | – | – | – | – |'))
    for c in cycles:
        n = c['cycle']
        lines += ['', f"## Cycle {n}: base v{n + 1} against its controls", ''] + POINT_HEADER
        lines.append(point_row(f"**base v{n + 1} ({C.trainer.upper()})**", c['arm']))
        if 'mle' in c:
            lines.append(point_row(f"MLE control (base v{n} + next-token training)", c['mle']))
        if 'judge_off' in c:
            lines.append(point_row("judge-off control (GRPO, constant reward)", c["judge_off"]))
        for e in sorted(c['sweep'], key=lambda e: e['temperature']):
            lines.append(point_row(f"base v{n} at T = {e['temperature']}", e))
        lines.append('')
        if 'verdict' in c:
            lines += verdict_lines(c)
        if 'tilt_verdict' in c:
            lines += tilt_lines(c)
    if any(len(c['sweep']) > 1 for c in cycles):
        plot_quality_diversity(cycles, os.path.join(out, 'quality_diversity.png'))
        lines += ['![quality against diversity](quality_diversity.png)', '']
    # SPIN's curves are in spin_v{n}_log.jsonl
    plot_grpo(cycles if C.trainer == 'grpo' else [], os.path.join(out, 'grpo_curves.png'))
    lines += ['![GRPO curves](grpo_curves.png)', ''] + stage_time_lines(out, current)
    tmp = os.path.join(out, 'report.md.tmp')
    with open(tmp, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.replace(tmp, os.path.join(out, 'report.md'))


def _plt():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def plot_quality_diversity(cycles, png):
    """Per cycle: the previous base's temperature curve, the new version and its controls, in three planes."""
    plt = _plt()
    fig, axes = plt.subplots(len(cycles), 3, figsize=(16, 4 * len(cycles)), squeeze=False)
    key, _, _, judged = fresh_judge_figure(cycles[0]['sweep'][0])
    planes = (('sample_entropy', key, judged),
              ('sample_entropy', 'c2st_auc', 'two-sample AUC (↓ closer to natural)'),
              ('distinct_4_tokens', 'unknown_word_rate', 'unknown-word rate (↓ closer to natural)'))
    for row, c in zip(axes, cycles):
        sweep = sorted(c['sweep'], key=lambda e: e['temperature'])
        for ax, (x, y, ylabel) in zip(row, planes):
            if any(y not in e for e in sweep):
                continue
            err = [e.get(y + '_sd', 0) for e in sweep] if y + '_sd' in sweep[0] else None
            ax.errorbar([e[x] for e in sweep], [e[y] for e in sweep], yerr=err, marker='o', capsize=3,
                        label=f"base v{c['cycle']}, temperature sweep")
            for e in sweep:
                ax.annotate(f"T={e['temperature']}", (e[x], e[y]), textcoords='offset points', xytext=(4, 4),
                            fontsize=8)
            for e, label, marker in ((c['arm'], f"base v{c['cycle'] + 1} (the cycle's)", 's'),
                                     (c.get('mle'), 'MLE control', '^'), (c.get('judge_off'), 'judge-off control', 'v')):
                if e:
                    ax.errorbar([e[x]], [e[y]], yerr=[e.get(y + '_sd', 0)] if err else None, marker=marker,
                                capsize=3, linestyle='none', label=label)
            ax.set(xlabel=x.replace('_', ' '), ylabel=ylabel, title=f"cycle {c['cycle']}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def plot_grpo(cycles, png):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c in cycles:
        h = c.get('trained', {}).get('history', [])
        axes[0].plot([x['reward'] for x in h], label=f"cycle {c['cycle']} reward")
        if h and h[0]['kl'] is not None:
            axes[1].plot([x['kl'] for x in h], label=f"cycle {c['cycle']} KL")
    axes[0].set(title="GRPO mean reward P(natural) (the cycle's own judge)", xlabel='step')
    axes[1].set(title='GRPO KL to reference', xlabel='step')
    for ax in axes:
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == '__main__':
    run_cli(main)
