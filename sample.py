"""
Sample text from a generator checkpoint, decoding with the checkpoint's own tokenization.
  python sample.py --ckpt_path=out-shakespeare-char/ckpt.pt --start="ROMEO:" --num_samples=3 --max_new_tokens=300
--start may also be FILE:prompt.txt.
"""

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
# -----------------------------------------------------------------------------
DEFAULTS = config_defaults(globals())


def main(argv):
    C = configure(DEFAULTS, argv)
    if C.temperature <= 0:
        raise UserError(f"--temperature must be > 0, got {C.temperature}")
    if C.top_k is not None and C.top_k < 1:
        raise UserError(f"--top_k must be >= 1 or None, got {C.top_k}")
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
    y = model.generate(x.repeat(C.num_samples, 1), C.max_new_tokens, C.temperature, C.top_k, generator=gen)
    for row in y.tolist():
        print(tok.decode(row))
        print('---------------')


if __name__ == '__main__':
    run_cli(main)
