"""
Sample text from a generator checkpoint, decoding with the checkpoint's own tokenization.
  python sample.py --ckpt_path=out-shakespeare-char/ckpt.pt --start="ROMEO:" --num_samples=3 --max_new_tokens=300
--start may also be FILE:prompt.txt. --temperature=calibrated samples at the temperature the checkpoint's held-out
selection tail reads best (train.py --select_tokens=N records it when it stops; calibration.py). Several checkpoints,
comma-separated (--ckpt_path=a.pt,b.pt), sample as one generator: the mean of their next-token laws, each at its own
calibrated temperature (model.Ensemble).

With a judge, the generator tilted by it, pi·e^{judge_scale·f} (f: the judge's log-odds of natural text; worth.py),
sampled without RL: each sample is one of `resample` candidates, kept by importance resampling (or, best_of=True,
the judge's favourite):
  python sample.py --ckpt_path=runs/x/base_model_v1.pt --judge=runs/x/reward_model_v1.pt --resample=8
A judge reads windows of its own block size: each candidate is scored on its last that many tokens.
"""

import numpy as np
import torch

from calibration import checkpoint_calibrated_temperature, load_generator
from configurator import UserError, config_defaults, configure, run_cli
from model import GPT
from runtime import resolve_device
from tokenization_manager import TokenizationManager

# -----------------------------------------------------------------------------
ckpt_path = 'out-shakespeare-char/ckpt.pt'  # several, comma-separated: their ensemble, each at its calibrated T
start = '\n'  # or "FILE:prompt.txt"
num_samples = 3
max_new_tokens = 300
temperature = 0.8  # lower is more conservative; 'calibrated': the one its held-out selection tail reads best
top_k = 200  # keep only the top_k most likely tokens (None: all)
seed = 1337
device = 'auto'
judge = ''  # a reward model, or an n-gram judge's .json (train_grpo.py --judge=ngram saves one): sample the tilt
resample = 1  # candidates drawn per sample, one kept (K)
judge_scale = 1.0  # the tilt pi·e^{judge_scale·f} (0: the generator's own law)
best_of = False  # keep the candidate the judge likes best instead of resampling (best-of-K)
# -----------------------------------------------------------------------------
# each number's range, checked by the configurator before anything is read
RANGES = dict(num_samples='>= 1', max_new_tokens='>= 1', temperature='> 0 or calibrated', top_k='>= 1', seed='>= 0',
              resample='>= 1', judge_scale='>= 0')
DEFAULTS = config_defaults(globals())


def main(argv):
    C = configure(DEFAULTS, argv, RANGES)
    if (C.resample > 1) != bool(C.judge):
        raise UserError("--resample K > 1 draws K candidates for a --judge to choose among: pass both, K >= 2")
    dev = resolve_device(C.device)
    ckpt = load_generator(C.ckpt_path, None, dev)
    if ckpt['model_args'].get('mode') == 'reward':
        raise UserError(f"{C.ckpt_path} is a reward model; sample from a generator checkpoint")
    model = GPT.from_checkpoint(ckpt, device=dev)
    if C.temperature == 'calibrated':  # recorded by its trainer, or fit now (calibration.py)
        C.temperature = checkpoint_calibrated_temperature(ckpt, None, dev)[0]
        print(f"temperature {C.temperature:.4f}: the calibrated one of {C.ckpt_path}")
    tok = TokenizationManager.from_info(ckpt['tokenization'])
    text = C.start
    if text.startswith('FILE:'):
        with open(text[5:], encoding='utf-8') as f:
            text = f.read()
    ids = tok.encode(text)
    if not ids:
        raise UserError("--start encodes to no tokens; give at least one character")
    x = torch.tensor(ids, dtype=torch.long, device=dev)[None, :]
    gen = torch.Generator(device=dev).manual_seed(C.seed)
    if C.judge:
        y = tilted(model, ckpt, x.repeat(C.num_samples, 1), C, gen, dev)
    else:
        y = model.generate(x.repeat(C.num_samples, 1), C.max_new_tokens, C.temperature, C.top_k, generator=gen)
    for row in y.tolist():
        print(tok.decode(row))
        print('---------------')


def tilted(model, ckpt, prompts, C, gen, device):
    """Each sample one of C.resample candidates, kept by the judge's tilt (tilt.py)."""
    from tilt import TiltSource, sample_tilt
    source = TiltSource(C.judge, model, ckpt, C.temperature, device)
    if source.kind == 'exact log-ratio':
        raise UserError(f"--judge {C.judge} is not a judge; pass a reward model (train_reward_model.py) or an n-gram "
                        f"judge's .json (train_grpo.py --judge=ngram)")
    y, _, fig = sample_tilt(model, source, prompts, prompts.shape[1] + C.max_new_tokens, C.resample, C.judge_scale,
                            C.temperature, C.top_k, gen, np.random.default_rng(C.seed), C.best_of)
    print(f"kept 1 of {C.resample} candidates per sample by " + ('best-of-K' if C.best_of else
          f"importance resampling at scale {C.judge_scale} (mean effective sample size {fig['tilt_ess']:.1f})")
          + f"; judge log-odds of the kept {fig['tilt_f_kept']:.2f}, of all {fig['tilt_f_candidates']:.2f}")
    return y


if __name__ == '__main__':
    run_cli(main)
