"""What the benchmarks share: the model they time, and the MLE control they read a method against. Import it after
the repository root is on sys.path."""
import os
import shutil
import subprocess
import sys

import torch

from model import GPT, GPTConfig
from tilt import completion_logprob
from verdict import label_text

# the shape of the default char model (config/train_shakespeare_char.py)
DEFAULT_SHAPE = dict(block_size=256, vocab_size=84, n_layer=4, n_head=4, n_embd=128)


def bench_model(model_path, mode='generator'):
    """The checkpoint at model_path in the given mode, or a fresh model of the default char model's shape."""
    if model_path:
        return GPT.from_checkpoint(model_path, mode=mode)
    return GPT(GPTConfig(**DEFAULT_SHAPE, mode=mode)).eval()


def mle_control(cfg, base, flops, out, seed):
    """base trained further with next-token loss for at most `flops` by the cycle's rule (run_cycles.mle_args: the
    base's final learning rate held, its best checkpoint by the run's own selection split kept), with the training
    options of the run whose config.json is cfg; trained once to out (written at the end) and reused."""
    from configurator import configure
    from data_loader import resolve_data_dir
    from run_cycles import DEFAULTS, base_train_args, mle_args
    if not os.path.exists(out):
        C = configure(DEFAULTS, [f'--{k}={v}' for k, v in cfg.items() if k in DEFAULTS])
        _, args = mle_args(C, base, flops, seed)
        work = out + '.work'
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     'train.py'), f'--out_dir={work}']
                       + base_train_args(C, resolve_data_dir(C.dataset)) + args, check=True, stdout=subprocess.DEVNULL)
        shutil.move(os.path.join(work, 'ckpt.pt'), out)
        shutil.rmtree(work)
    return out


@torch.no_grad()
def window_ce(model, windows, temperature=1.0):
    """Each window's mean next-token cross-entropy (nats, float64) under model at this temperature, in fp32."""
    return -completion_logprob(model, windows, 1, temperature) / (windows.shape[1] - 1)


def effect_text(e):
    """A labelled effect on perplexity as the tables print it: label, effect and its 95% interval in percent."""
    return f"{label_text(e)} {e['effect']:+.2%} [{e['ci'][0]:+.2%}, {e['ci'][1]:+.2%}]"
