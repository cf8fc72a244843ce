"""
Sample text from a generator checkpoint, decoding with the checkpoint's own tokenization.
  python sample.py --ckpt_path=out-shakespeare-char/ckpt.pt --start="ROMEO:" --num_samples=3 --max_new_tokens=300
--start may also be FILE:prompt.txt.

With a judge, the generator tilted by it, pi·e^{judge_scale·f} (f: the judge's log-odds of natural text; worth.py),
sampled without RL: each sample is one of `resample` candidates, kept by importance resampling (or, best_of=True,
the judge's favourite):
  python sample.py --ckpt_path=runs/x/base_model_v1.pt --judge=runs/x/reward_model_v1.pt --resample=8
A judge reads windows of its own block size: each candidate is scored on its last that many tokens.
"""

import numpy as np
import torch

from configurator import UserError, config_defaults, configure, run_cli
from model import GPT, load_checkpoint
from runtime import resolve_device
from tokenization_manager import TokenizationManager

# -----------------------------------------------------------------------------
ckpt_path = 'out-shakespeare-char/ckpt.pt'
start = '\n'  # or "FILE:prompt.txt"
num_samples = 3
max_new_tokens = 300
temperature = 0.8  # > 0; lower is more conservative
top_k = 200  # keep only the top_k most likely tokens (None: all)
seed = 1337
device = 'auto'
judge = ''  # a reward model of the generator's tokenization: sample the generator tilted by it
resample = 1  # candidates drawn per sample, one kept (K)
judge_scale = 1.0  # the tilt pi·e^{judge_scale·f}
best_of = False  # keep the candidate the judge likes best instead of resampling (best-of-K)
# -----------------------------------------------------------------------------
DEFAULTS = config_defaults(globals())


def main(argv):
    C = configure(DEFAULTS, argv)
    if C.temperature <= 0:
        raise UserError(f"--temperature must be > 0, got {C.temperature}")
    if C.top_k is not None and C.top_k < 1:
        raise UserError(f"--top_k must be >= 1 or None, got {C.top_k}")
    if C.resample < 1 or (C.resample > 1) != bool(C.judge):
        raise UserError("--resample K > 1 draws K candidates for a --judge to choose among: pass both, K >= 2")
    dev = resolve_device(C.device)
    ckpt = load_checkpoint(C.ckpt_path)
    if ckpt['model_args'].get('mode') == 'reward':
        raise UserError(f"{C.ckpt_path} is a reward model; sample from a generator checkpoint")
    model = GPT.from_checkpoint(ckpt, device=dev)
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
    y = model.generate(x.repeat(C.num_samples * C.resample, 1), C.max_new_tokens, C.temperature, C.top_k,
                       generator=gen)  # resample is 1 without a judge
    if C.judge:
        y = tilted(y, C, ckpt, dev)
    for row in y.tolist():
        print(tok.decode(row))
        print('---------------')


@torch.no_grad()
def tilted(candidates, C, ckpt, device):
    """One of each sample's C.resample candidates (rows grouped by sample), kept by the judge's tilt."""
    from tokenization_manager import TokenizationInfo
    from worth import effective_sample_size, log_odds, tilt_choice
    judge_ckpt = load_checkpoint(C.judge)
    if judge_ckpt['model_args'].get('mode') != 'reward':
        raise UserError(f"--judge {C.judge} is not a reward model; pass one written by train_reward_model.py")
    TokenizationInfo.from_dict(ckpt['tokenization']).check_compatible(
        TokenizationInfo.from_dict(judge_ckpt['tokenization']), f'the generator {C.ckpt_path}', C.judge)
    judge = GPT.from_checkpoint(judge_ckpt, device=device)
    f = log_odds(judge(candidates[:, -judge.config.block_size:])[0].double().cpu().numpy())
    f = f.reshape(C.num_samples, C.resample)
    kept = tilt_choice(f, C.judge_scale, C.best_of, np.random.default_rng(C.seed))
    ess = np.mean([effective_sample_size(C.judge_scale * row) for row in f])
    print(f"kept 1 of {C.resample} candidates per sample by " + ('best-of-K' if C.best_of else
          f"importance resampling at scale {C.judge_scale} (mean effective sample size {ess:.1f})")
          + f"; judge log-odds of the kept {np.mean(f[np.arange(len(f)), kept]):.2f}, of all {f.mean():.2f}")
    return candidates.view(C.num_samples, C.resample, -1)[torch.arange(C.num_samples), torch.from_numpy(kept)]


if __name__ == '__main__':
    run_cli(main)
