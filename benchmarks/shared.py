"""What the benchmarks share: the model they time, and the MLE control they read a method against. Import it after
the repository root is on sys.path."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

from configurator import UserError
from calibration import (base_calibrated_temperature, calibrated_temperature,  # noqa: F401 (the benches' names)
                         checkpoint_calibrated_temperature)
from model import GPT, GPTConfig, load_checkpoint
from tilt import TiltSource, completion_logprob
from two_sample import PROMPT_LEN, eval_windows
from verdict import label_text
from worth import dv_bound

# the shape of the default char model (config/train_shakespeare_char.py)
DEFAULT_SHAPE = dict(block_size=256, vocab_size=84, n_layer=4, n_head=4, n_embd=128)


def bench_model(model_path, mode='generator'):
    """The checkpoint at model_path in the given mode, or a fresh model of the default char model's shape."""
    if model_path:
        return GPT.from_checkpoint(model_path, mode=mode)
    return GPT(GPTConfig(**DEFAULT_SHAPE, mode=mode)).eval()


def run_files(run, parser):
    """A plateau or cycle run's base path, config path and config (its config.json): what --run names in every
    bench; a run without them is the parser's one-line error."""
    base_path, config_path = (os.path.join(run, f) for f in ('base_model_v1.pt', 'config.json'))
    if not (os.path.exists(base_path) and os.path.exists(config_path)):
        parser.error(f"{run} lacks base_model_v1.pt or config.json: --run takes a run_cycles.py folder with a base "
                     f"(run_cycles.py ... --num_cycles=0 makes one)")
    with open(config_path) as f:
        return base_path, config_path, json.load(f)


def judge_tag(path):
    """A judge's name in a record's file name: its file name and the first 8 hex digits of its bytes' sha256, so two
    judges of one name (every train.py checkpoint is ckpt.pt) never share, and silently reuse, one record."""
    from data_loader import file_sha256
    return f"{os.path.splitext(os.path.basename(path))[0]}_{file_sha256(path)[:8]}"


def mle_control(cfg, base, flops, out, seed, extra=(), keep_last=False):
    """base trained further with next-token loss for at most `flops` by the cycle's rule (run_cycles.mle_args: the
    base's final learning rate held, its best checkpoint by the run's own selection split kept), with the training
    options of the run whose config.json is cfg, and `extra` train.py options (a distillation's --mix_dir); trained
    once to out (written at the end) and reused; one cut off goes on from its last evaluation (train.py --resume, in
    out.work). keep_last: the weights where it stopped too, at last_of(out) (the control read as a game is, which
    keeps its last policy); a control trained without them is trained again."""
    from configurator import configure
    from data_loader import resolve_data_dir
    from run_cycles import DEFAULTS, base_train_args, mle_args
    if not os.path.exists(out) or (keep_last and not os.path.exists(last_of(out))):
        C = configure(DEFAULTS, [f'--{k}={v}' for k, v in cfg.items() if k in DEFAULTS])
        _, args = mle_args(C, base, flops, seed)
        work = out + '.work'  # train.py checks that a state left there is this control's before going on from it
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     'train.py'), f'--out_dir={work}']
                       + base_train_args(C, resolve_data_dir(C.dataset)) + args + list(extra)
                       + (['--save_last=True'] if keep_last else []) + ['--resume=True'], check=True,
                       stdout=subprocess.DEVNULL)
        if keep_last:
            shutil.move(os.path.join(work, 'last.pt'), last_of(out))
        shutil.move(os.path.join(work, 'ckpt.pt'), out)
        shutil.rmtree(work)
    return out


def ensemble_mle_control(cfg, base, flops, out, seed, device):
    """The MLE control of an ensemble base (its checkpoint's path): each member trained further by mle_control for
    flops / M (its own seed), then at its own tail-calibrated temperature, as the ensemble's members are, averaged
    (model.ensemble_checkpoint): next-token training at the same FLOPs, spent as the ensemble spends them. Its members'
    controls are kept beside out; all are trained once and reused."""
    from model import ensemble_checkpoint, ensemble_members, fold_temperature, save_atomic
    if not os.path.exists(out):
        members = ensemble_members(load_checkpoint(base))
        if any(m['model_args'] != members[0]['model_args'] for m in members):
            raise UserError(f"{base}: its members differ in shape or dropout, and the MLE control trains each with "
                            "the first run's recipe: read a mixed ensemble against the MLE controls of its members' "
                            "own runs instead")
        controls = []
        for i, member in enumerate(members):
            start, path = f'{out}.member{i}_start.pt', f'{out}.member{i}.pt'
            if not os.path.exists(path):
                save_atomic(member, start)  # the same bytes again: a cut-off control's state still matches it
                mle_control(cfg, start, flops / len(members), path, seed + i)
                os.remove(start)
            trained = load_checkpoint(path)
            T = checkpoint_calibrated_temperature(trained, cfg['dataset'], device)[0]
            controls.append(fold_temperature(trained, T))
        save_atomic(ensemble_checkpoint(controls), out)
    return out


def last_of(mle_path):
    """Where mle_control keeps an MLE control's last weights: beside its kept checkpoint, '_last' before '.pt'."""
    return os.path.splitext(mle_path)[0] + '_last.pt'


@torch.no_grad()
def judge_worth(judge_path, base_path, val, n, draw, device, temperature=1.0):
    """What the judge at judge_path (a reward model, or an n-gram judge's file: tilt.TiltSource) is worth on the base
    at base_path (worth.dv_bound, nats a completion): its log-odds on n natural val windows against the base's
    continuations, at this temperature, of the PROMPT_LEN-token prompts of n other val windows (two_sample.eval_windows,
    drawn by `draw`). Returns dv_bound's figures with the judge's path."""
    base_ckpt = load_checkpoint(base_path)
    base = GPT.from_checkpoint(base_ckpt, device=device)
    natural, prompts = (w.to(device) for w in eval_windows(val, n, base.config.block_size, draw))
    gen = torch.Generator(device=device).manual_seed(int(np.random.default_rng(draw).integers(2 ** 31)))
    samples = base.generate(prompts[:, :PROMPT_LEN], natural.shape[1] - PROMPT_LEN, temperature, generator=gen)
    source = TiltSource(judge_path, base, base_ckpt, temperature, device)
    f_natural, f_samples = (source.scores(w, PROMPT_LEN) for w in (natural, samples))
    return dict(dv_bound(f_natural, f_samples, draw), judge=judge_path)



def window_ce(model, windows, temperature=1.0):
    """Each window's mean next-token cross-entropy (nats, float64) under model at this temperature, in fp32."""
    return -completion_logprob(model, windows, 1, temperature) / (windows.shape[1] - 1)


def effect_text(e, unit='%'):
    """A labelled effect as the tables print it: label, effect and its 95% interval, in percent (perplexity) or, with
    unit='auc', in AUC points."""
    if unit == 'auc':
        return f"{label_text(e)} {e['effect']:+.3f} [{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}]"
    return f"{label_text(e)} {e['effect']:+.2%} [{e['ci'][0]:+.2%}, {e['ci'][1]:+.2%}]"
