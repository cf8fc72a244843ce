"""
The tilt's windows, for a forward-KL distillation of it (docs/family_bound.md): prompts of natural windows drawn from
the generator's own training tokens (data_loader.generator_train_tokens), K continuations of each by the generator,
one kept with probability ∝ e^{scale·f} (tilt.sample_tilt: importance resampling). Next-token training on the kept
windows (train.py --mix_dir=OUT) then fits the tilt's forward projection onto the generator's family, the fit
perplexity reads, where the tilt's game reaches its reverse projection. --keep=all keeps every candidate instead, with
the weight w - 1 (tilt.tilt_weights: w = K·e^{a·f} over its prompt's sum, mean 1): train.py weighs each window's loss
by it, so the loss on the tilt's windows less the same loss on pi's own (the w - 1 anchor: what training on the
generator's own samples does alone cancels in expectation).

  python prepare_tilt_data.py --model_path=runs/x/base_model_v1.pt --judge=runs/x/recipes/base_<sha>/judge_ngram.json \
      --scale=0.7 --k=8 --windows=5000 --out_dir=runs/x/tilt_ngram

--judge takes a reward model, an n-gram judge's .json, or a better generator (its exact log-ratio: the oracle, whose
tilt at scale 1 is that generator), as tilt.TiltSource reads them; --judge=none keeps one continuation a prompt
unresampled (K = 1): the judge-off control, the same pipeline with f = 0.
Writes OUT/windows.bin (uint16, rows x length), with --keep=all OUT/weights.bin (float32, w - 1 a row), and
OUT/meta.json, atomically.
"""

import json
import os
import shutil
import time

import numpy as np
import torch
from tqdm import tqdm

from configurator import UserError, config_defaults, configure, run_cli
from data_loader import file_sha256, generator_train_tokens, replace_dir, resolve_data_dir
from model import GPT, load_checkpoint
from runtime import resolve_device
from tilt import TiltSource, sample_tilt, scored_candidates, tilt_weights
from two_sample import PROMPT_LEN
from worth import effective_sample_size

# -----------------------------------------------------------------------------
model_path = ''  # the generator (base) checkpoint
judge = ''  # a reward model, an n-gram judge's .json, a better generator's checkpoint, or 'none' (judge-off)
scale = 1.0  # a: the tilt pi·e^{a·f} (0: the generator's own candidates, kept uniformly)
k = 8  # candidates a prompt, one kept
keep = 'one'  # 'one': one candidate a prompt kept ∝ e^{a·f}; 'all': every candidate, weighted w - 1
windows = 5000  # prompts (natural train windows), one kept window each
length = 0  # tokens a window, prompt included (0: the generator's block size)
dataset = ''  # the data folder (default: the generator's own, from its config)
out_dir = ''
batch_prompts = 128  # prompts sampled together (x k candidates)
device = 'auto'
seed = 1337
# -----------------------------------------------------------------------------
# each number's range and the relations between them, checked by the configurator before anything is read or written
RANGES = dict(scale='>= 0', k='>= 1', windows='>= 1', length='>= 0', batch_prompts='>= 1', seed='>= 0')
RELATIONS = ((f'length == 0 or length > {PROMPT_LEN}', f"a window holds its {PROMPT_LEN}-token prompt and more"),)
DEFAULTS = config_defaults(globals())


def check(C, block_size):
    if not C.model_path or not os.path.isfile(C.model_path):
        raise UserError(f"--model_path={C.model_path!r} is not a checkpoint: pass the generator's")
    if not C.out_dir:
        raise UserError("pass --out_dir=DIR for the tilt's windows")
    if C.judge != 'none' and not os.path.isfile(C.judge):
        raise UserError(f"--judge={C.judge!r} is no file: pass a reward model, an n-gram judge's .json, a better "
                        f"generator, or none (the judge-off control)")
    if C.keep not in ('one', 'all'):
        raise UserError(f"--keep={C.keep!r} is not one of one, all")
    if not PROMPT_LEN < (C.length or block_size) <= block_size:
        raise UserError(f"--length must lie in ({PROMPT_LEN}, {block_size}] (the prompt is {PROMPT_LEN} tokens, the "
                        f"generator's block {block_size}), got {C.length}")


def draw_prompts(train, length, n, seed):
    """n natural windows of the generator's training tokens (non-overlapping, drawn without replacement): their first
    PROMPT_LEN tokens are the prompts."""
    available = len(train) // length
    if n > available:
        raise UserError(f"--windows={n} is more than the {available} windows of {length} tokens in the generator's "
                        f"training tokens: lower --windows or --length")
    starts = np.sort(np.random.default_rng([seed, 0]).choice(available, n, replace=False)) * length
    return torch.from_numpy(np.stack([train[s:s + PROMPT_LEN] for s in starts]).astype(np.int64))


def tilt_rows(C, model, source, prompts, n_tokens, K, gen, rng):
    """One batch of prompts' windows: the kept candidates (one a prompt, or all K with --keep=all), each row's w - 1
    (zero judge-off, where f = 0; None for one kept) and the sampler's figures (None judge-off)."""
    if source is None:
        with torch.no_grad():
            return model.generate(prompts, n_tokens - PROMPT_LEN, generator=gen), np.zeros(len(prompts)), None
    if C.keep == 'one':
        out, _, fig = sample_tilt(model, source, prompts, n_tokens, K, C.scale, 1.0, None, gen, rng)
        return out, None, fig
    cand, _, f, flops = scored_candidates(model, source, prompts, n_tokens, K, 1.0, None, gen)
    w = tilt_weights(f, C.scale)
    fig = dict(tilt_ess=float(np.mean([effective_sample_size(C.scale * r) for r in f])),
               tilt_f_kept=float((w * f).mean()), tilt_f_candidates=float(f.mean()), tilt_sampling_flops=flops)
    return cand.view(-1, n_tokens), (w - 1).reshape(-1), fig


def main(argv):
    C = configure(DEFAULTS, argv, RANGES, RELATIONS)
    ckpt = load_checkpoint(C.model_path) if os.path.isfile(C.model_path) else None
    check(C, ckpt['model_args']['block_size'] if ckpt else 0)
    device = resolve_device(C.device)
    torch.manual_seed(C.seed)
    model = GPT.from_checkpoint(ckpt, device=device)
    n_tokens = C.length or model.config.block_size
    data_dir = resolve_data_dir(C.dataset or ckpt.get('config', {}).get('dataset', ''))
    train = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
    n_train, train = len(train), generator_train_tokens(train, ckpt)
    prompts = draw_prompts(train, n_tokens, C.windows, C.seed).to(device)
    source = None if C.judge == 'none' else TiltSource(C.judge, model, ckpt, 1.0, device)
    K = 1 if source is None else C.k
    gen = torch.Generator(device=device).manual_seed(C.seed)
    rng = np.random.default_rng([C.seed, 1])
    kept, weights, figures, t0 = [], [], [], time.time()
    for i in tqdm(range(0, C.windows, C.batch_prompts), desc='tilt windows', dynamic_ncols=True):
        batch = prompts[i:i + C.batch_prompts]
        rows, w, fig = tilt_rows(C, model, source, batch, n_tokens, K, gen, rng)
        kept.append(rows.cpu())
        weights.append(w)
        if fig:
            figures.append((len(batch), fig))
    x = torch.cat(kept).numpy().astype(np.uint16)
    weigh = (lambda key: sum(n * f[key] for n, f in figures) / C.windows) if figures else (lambda key: None)
    meta = dict(kind='tilt windows', model_path=os.path.abspath(C.model_path), model_sha256=file_sha256(C.model_path),
                judge=os.path.abspath(C.judge) if source else 'none', judge_kind=source.kind if source else 'none',
                scale=C.scale if source else 0.0, k=K, windows=C.windows, length=n_tokens, prompt_len=PROMPT_LEN,
                dataset=data_dir, seed=C.seed, keep=C.keep, rows=len(x), vocab_size=model.config.vocab_size,
                held_out_tail=n_train - len(train),
                ess=weigh('tilt_ess'), f_kept=weigh('tilt_f_kept'), f_candidates=weigh('tilt_f_candidates'),
                flops=sum(f['tilt_sampling_flops'] for _, f in figures) if figures
                else model.flops_per_token() * C.windows * (n_tokens - PROMPT_LEN))
    partial = C.out_dir.rstrip(os.sep) + '.partial'
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    x.tofile(os.path.join(partial, 'windows.bin'))
    if C.keep == 'all':
        np.concatenate(weights).astype(np.float32).tofile(os.path.join(partial, 'weights.bin'))
    with open(os.path.join(partial, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    replace_dir(partial, C.out_dir)
    kept_how = f"all {K} a prompt kept, weighted w - 1 (w ∝ e^({C.scale:g}·f))" if C.keep == 'all' \
        else f"one kept of {K} a prompt ∝ e^({C.scale:g}·f)"
    how = (f"{kept_how} by the {source.kind}; the candidates' ESS {meta['ess']:.2f}, f {meta['f_kept']:.3f} kept "
           f"against {meta['f_candidates']:.3f} drawn") if source \
        else "one continuation a prompt, unresampled (the judge-off control)"
    print(f"{C.windows} windows of {n_tokens} tokens ({PROMPT_LEN} natural, then the generator's), {how}; "
          f"{meta['flops']:.3g} FLOPs, {time.time() - t0:.0f} s; written to {C.out_dir}")

if __name__ == '__main__':
    run_cli(main)
