"""
Build the reward model's data: natural token blocks of length N (drawn from the whole split; of the train split, only
the base's own training tokens: data_loader.generator_train_tokens) whose tail, from a crossover K ~ U[1, N-1], is
rewritten by the base model. Label [K/N, (N-K)/N] = [share natural, share synthetic]. Train samples come only from
the train split, val samples only from the val split. --crossover_k 8 fixes K: every sample is an 8-token natural
prompt and the model's continuation, as the two-sample test's samples are (with samples_per_chunk 1 and
train_reward_model.py's loss='binary', a whole-window judge: each sample against its natural block).
--select_blocks n adds a 'select' split: n more blocks of the generator's train tokens, never in the train split, that
train_reward_model.py selects its checkpoint on, so that a judge trains to its own stopping on train windows alone.

  python prepare_reward_data.py --model_path out-shakespeare-char/ckpt.pt --input_mode binary \
      --train_bin data/shakespeare_char/train.bin --val_bin data/shakespeare_char/val.bin

Speed: samples are sorted by K and generated in large batches with the KV-cache sampler; a batch's rows share
their common prefix in one parallel prefill and then advance together, each row switching from copying its
prompt to sampling at its own K. Under torchrun each rank generates a disjoint share of the batches.

An interrupted run resumes: the batches written so far are saved under OUTPUT_DIR.progress/ every few minutes (and
at each split's end), signed by everything that decides their tokens (the settings, the model's sha256, the split's
blocks and crossovers, PyTorch and the device type); the same command again generates only the batches missing, with
the same tokens, and removes the folder when the data is in place. Saved batches of other settings are never used.
"""

import argparse
import hashlib
import json
import os
import shutil
import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from configurator import UserError, parse_checked, run_cli
from data_loader import file_sha256, generator_train_tokens, load_token_splits, progress_dir, replace_dir
from calibration import load_generator
from model import GPT
from reward_data_config import RewardDataConfig, format_problems
from runtime import setup_runtime
from tokenization_manager import TokenizationInfo
from two_sample import eval_window_indices

FORMAT_VERSION = 3  # 2: blocks drawn from the whole split, offsets in {split}_block_offsets.bin; 3: the natural
# blocks themselves in {split}_natural.bin, each sample's natural counterpart (pairwise judges)
MAX_ATTEMPTS = 3
PROGRESS_SECONDS = 300  # how often generate_mixed saves the batches it has written, for an interrupted run to resume
SELECT_SEED = 10 ** 9  # the select split's sampling seed is SELECT_SEED + --seed (train and val: 2 seed, 2 seed + 1)


# each number's range, checked (configurator.parse_checked) before anything is read; the relations that need the
# model (crossover_k and block_size within its block) are RewardDataConfig.validate's
RANGES = dict(train_split='(0, 1)', split_block='>= 0', samples_per_chunk='>= 1', temperature='> 0', top_k='>= 1',
              seed='>= 0', block_size='>= 2', batch_size='>= 1', crossover_k='>= 0', exclude_eval_windows='>= 0',
              eval_seed='>= 0', select_blocks='>= 0', max_blocks='>= 1')


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RewardDataConfig(model_path='')
    p.add_argument('--model_path', required=True, help="base (generator) checkpoint; a.pt,b.pt: their ensemble, each "
                   "at its calibrated temperature")
    p.add_argument('--input_mode', choices=['text', 'binary'], default=d.input_mode)
    p.add_argument('--data_path', help="raw text file (text mode)")
    p.add_argument('--train_bin', help="train.bin (binary mode)")
    p.add_argument('--val_bin', help="val.bin (binary mode)")
    p.add_argument('--tokenization', choices=['auto', 'bpe', 'char'], default=d.tokenization)
    p.add_argument('--meta_path', help="meta.pkl for char tokenization")
    p.add_argument('--output_dir', default=d.output_dir)
    p.add_argument('--train_split', type=float, default=d.train_split, help="text mode: share of the text for train")
    p.add_argument('--split_block', type=int, default=d.split_block,
                   help="text mode: the prepare scripts' --split_block (0: the contiguous split)")
    p.add_argument('--samples_per_chunk', type=int, default=d.samples_per_chunk, help="samples per block, each its own K")
    p.add_argument('--temperature', type=float, default=d.temperature)
    p.add_argument('--top_k', type=lambda s: None if s == 'None' else int(s), default=d.top_k)
    p.add_argument('--device', default=d.device, help="auto, cpu or cuda")
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--block_size', type=int, default=d.block_size, help="N (default: the model's block size)")
    p.add_argument('--batch_size', type=int, default=d.batch_size, help="sequences generated together")
    p.add_argument('--crossover_k', type=int, default=d.crossover_k,
                   help="0: K ~ U[1, N-1] per sample; k: every sample keeps its first k natural tokens (8: "
                        "whole-window judges, the two-sample test's prompt length)")
    p.add_argument('--exclude_eval_windows', type=int, default=d.exclude_eval_windows,
                   help="n > 0: no val block is one of the evaluation's 2n two-sample windows (of --eval_seed)")
    p.add_argument('--eval_seed', type=int, default=d.eval_seed, help="the evaluation's seed (evaluate.py --seed)")
    p.add_argument('--select_blocks', type=int, default=d.select_blocks,
                   help="n > 0: n blocks of the generator's train tokens, never in the train split, make a 'select' "
                        "split the judge selects its checkpoint on (0: it selects on half of val)")
    p.add_argument('--max_blocks', type=int, default=d.max_blocks, help="at most this many blocks per split, drawn at random from all of it (default: every block)")
    return RewardDataConfig(**vars(parse_checked(p, argv, RANGES)))


def make_crossovers(tokens, N, samples_per_chunk, max_blocks, rng, crossover_k=0, exclude=()):
    """
    Blocks (n_blocks, N), their token offsets in the split (n_blocks,), and a crossover K in [1, N-1] per sample
    (n_blocks, spc): drawn uniformly, or crossover_k for every sample when it is set. The split is cut into
    consecutive non-overlapping blocks; with max_blocks below their number,
    max_blocks of them are drawn uniformly without replacement (kept in split order), so the data spans the whole
    split instead of its first pages. Blocks whose index is in `exclude` are never drawn.
    """
    n_total = len(tokens) // N
    chosen = np.setdiff1d(np.arange(n_total), np.asarray(exclude, dtype=np.int64))
    if max_blocks and max_blocks < len(chosen):
        chosen = np.sort(rng.choice(chosen, size=max_blocks, replace=False))
    blocks = np.asarray(tokens[:n_total * N]).reshape(n_total, N)[chosen]
    K = rng.integers(1, N, size=(len(chosen), samples_per_chunk))
    if crossover_k:  # drawn all the same, so the blocks chosen do not depend on it
        K[:] = crossover_k
    return blocks, chosen * N, K


def progress_signature(cfg, model_sha256, device_type, split, blocks, K):
    """What decides a split's generated tokens: the settings (all but where they go and the device's index), the
    model, the split's blocks and crossovers, PyTorch and the device type. Saved batches are reused only under it."""
    settings = {k: v for k, v in sorted(vars(cfg).items()) if k not in ('output_dir', 'device')}
    h = hashlib.sha256(json.dumps([settings, model_sha256, device_type, torch.__version__, split],
                                  default=str).encode())
    h.update(np.ascontiguousarray(blocks).tobytes())
    h.update(np.ascontiguousarray(K, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def saved_batches(folder, split, signature):
    """{batch: its rows' tokens} of the batches that an interrupted run with this signature saved (save_batches)."""
    found = {}
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    for name in names:
        if name.startswith(f'{split}_{signature}_') and name.endswith('.npz'):
            with np.load(os.path.join(folder, name)) as f:
                for b, rows in zip(f['batches'], np.split(f['tokens'], np.cumsum(f['sizes'])[:-1])):
                    found[int(b)] = rows
    return found


def save_batches(folder, split, signature, fresh):
    """Save the batches generated since the last save ({batch: tokens}) as one file, written atomically."""
    if not fresh:
        return
    os.makedirs(folder, exist_ok=True)
    batches = sorted(fresh)
    path = os.path.join(folder, f'{split}_{signature}_{batches[0]:07d}.npz')
    with open(path + '.tmp', 'wb') as f:
        np.savez(f, batches=np.array(batches), sizes=np.array([len(fresh[b]) for b in batches]),
                 tokens=np.concatenate([fresh[b] for b in batches]))
    os.replace(path + '.tmp', path)
    fresh.clear()


def generate_mixed(model, blocks, K, batch_size, temperature, top_k, seed, rt, desc, progress=None):
    """
    x (n_blocks * spc, N) uint16: sample s is block s // spc with its tail from K[s] on written by the model.
    Batches hold samples of similar K (sorted), and batch b samples with seed (seed, b): the result does not depend
    on how batches are spread over ranks, nor on whether they were made before an interruption. progress: (folder,
    split, signature) where batches are saved every PROGRESS_SECONDS and found again (saved_batches).
    """
    n_blocks, spc = K.shape
    N = blocks.shape[1]
    K = K.reshape(-1)
    block_of = np.repeat(np.arange(n_blocks), spc)
    order = np.argsort(K, kind='stable')
    # as few batches as batch_size allows, of equal size: a batch's rows copy their prompts one step at a time until
    # their own K, so 600 rows split 512 + 88 would spend the first batch's steps mostly copying
    batches = np.array_split(order, -(-len(order) // batch_size))
    x = np.zeros((len(K), N), dtype=np.int64)
    vocab = model.config.tokens
    mine = range(rt.rank, len(batches), rt.world_size)
    saved = saved_batches(*progress) if progress else {}
    for b in mine:  # a rank fills only its own batches: under DDP the ranks' rows are summed
        if b in saved:
            x[batches[b]] = saved[b]
    fresh, last_save = {}, time.time()
    for b in tqdm([b for b in mine if b not in saved], desc=desc, disable=not rt.master, dynamic_ncols=True,
                  initial=sum(b in saved for b in mine), total=len(mine)):
        rows = batches[b]
        k_rows, k_max = K[rows], int(K[rows].max())
        prompt = torch.from_numpy(blocks[block_of[rows], :k_max].astype(np.int64)).to(rt.device)
        lengths = torch.from_numpy(k_rows).to(rt.device)
        for attempt in range(MAX_ATTEMPTS):
            gen = torch.Generator(device=rt.device).manual_seed(seed * 1_000_003 + b * 101 + attempt)
            try:
                with rt.ctx:
                    out = model.generate(prompt, N - k_max, temperature, top_k, prompt_lengths=lengths, generator=gen)
                if int(out.max()) < vocab and int(out.min()) >= 0:
                    break
                problem = "generated token ids outside the vocabulary"
            except (RuntimeError, ValueError) as e:  # e.g. non-finite logits from a diverged model
                problem = str(e).splitlines()[0]
            print(f"warning: generation batch {b} of {desc} failed (attempt {attempt + 1}): {problem}")
        else:
            raise UserError(f"generation batch {b} of {desc} failed {MAX_ATTEMPTS} times ({problem}); "
                               f"nothing was written: check the model (non-finite weights?) or lower --temperature")
        x[rows] = out.cpu().numpy()
        if progress:
            fresh[b] = x[rows].astype(np.uint16)
            if time.time() - last_save >= PROGRESS_SECONDS:
                save_batches(*progress, fresh)
                last_save = time.time()
    if progress:
        save_batches(*progress, fresh)
    if rt.ddp:  # every row was written by exactly one rank; the others hold zeros
        t = torch.from_numpy(x)
        dist.all_reduce(t)
        x = t.numpy()
    return x.astype(np.uint16)


def labels_for(K, N):
    k = K.reshape(-1).astype(np.float64)
    return np.stack([k / N, (N - k) / N], axis=1).astype(np.float32)


def write_split(out_dir, split, x, y, meta, block_offsets=None, natural=None):
    x.tofile(os.path.join(out_dir, f'{split}_x.bin'))
    y.tofile(os.path.join(out_dir, f'{split}_y.bin'))
    if block_offsets is not None:  # sample s comes from the block at token offset block_offsets[s // samples_per_chunk]
        np.asarray(block_offsets, dtype=np.int64).tofile(os.path.join(out_dir, f'{split}_block_offsets.bin'))
    if natural is not None:  # the blocks themselves: sample s's prefix with the corpus' own continuation
        np.asarray(natural, dtype=np.uint16).tofile(os.path.join(out_dir, f'{split}_natural.bin'))
    meta = dict(num_samples=len(x), block_size=x.shape[1], x_shape=f"({x.shape[0]}, {x.shape[1]})",
                y_shape=f"({y.shape[0]}, 2)", x_dtype='uint16', y_dtype='float32', **meta)
    with open(os.path.join(out_dir, f'{split}_metadata.txt'), 'w') as f:
        f.writelines(f"{k}: {v}\n" for k, v in meta.items())


def write_subset(src, dst, picks):
    """A reward dataset cut from another: picks is {split: (blocks, k)}, those blocks of src's split (indices into
    its natural blocks) with the first k samples of each. Its metadata is src's with the counts, and the FLOPs of the
    kept samples' generation, updated; written under dst.partial, then renamed into place."""
    from reward_dataset_loader import RewardDataset
    splits = {split: RewardDataset(src, split) for split in picks}
    for split, (_, k) in picks.items():  # checked before anything is written
        per = splits[split].samples_per_chunk
        if not 1 <= k <= per:
            raise ValueError(f"{src}'s {split} split holds {per} samples a block: k must be 1 to {per}, got {k}")
    tmp = f"{dst.rstrip(os.sep)}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for split, (blocks, k) in picks.items():
        ds = splits[split]
        per, blocks = ds.samples_per_chunk, np.asarray(blocks, dtype=np.int64)
        rows = (blocks[:, None] * per + np.arange(k)).reshape(-1)
        meta = {key: v for key, v in ds.metadata.items() if key not in ('num_samples', 'block_size', 'x_shape',
                                                                         'y_shape', 'x_dtype', 'y_dtype')}
        offsets = np.fromfile(os.path.join(src, f'{split}_block_offsets.bin'), dtype=np.int64)[blocks]
        meta.update(samples_per_chunk=k, num_blocks=len(blocks), subset_of=os.path.abspath(src),
                    flops=int(meta['flops']) * len(rows) // ds.num_samples)
        write_split(tmp, split, np.asarray(ds.x[rows]), np.asarray(ds.y[rows]), meta, offsets,
                    np.asarray(ds.natural[blocks]))
    replace_dir(tmp, dst)


def main(argv):
    cfg = parse_args(argv)
    problems = cfg.validate()
    if problems:
        raise UserError(f"invalid configuration ({len(problems)} problem{'s' * (len(problems) > 1)}):\n"
                        + format_problems(problems))
    rt = setup_runtime(cfg.device, seed=cfg.seed)
    ckpt = load_generator(cfg.model_path, None, rt.device)  # several, comma-separated: their calibrated ensemble
    model = GPT.from_checkpoint(ckpt, device=rt.device)
    N = cfg.block_size or model.config.block_size
    train, val, tok_info = load_token_splits(cfg.input_mode, cfg.data_path, cfg.train_bin, cfg.val_bin,
                                             cfg.tokenization, cfg.meta_path, cfg.train_split, N, cfg.split_block)
    TokenizationInfo.from_dict(ckpt['tokenization']).check_compatible(tok_info, cfg.model_path, 'the data')
    n_train, train = len(train), generator_train_tokens(train, ckpt)  # never the tail the base held out
    tmp_dir = f"{cfg.output_dir.rstrip(os.sep)}.partial"
    progress = progress_dir(cfg.output_dir)  # signed batches: what an interrupted run resumes
    if rt.master:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # a half-written split is never trusted (signed batches are)
        os.makedirs(tmp_dir)
    model_sha256 = ','.join(file_sha256(p) for p in cfg.model_path.split(','))  # an ensemble's: each member's
    meta_common = dict(tokenization_method=tok_info.method, vocab_size=tok_info.vocab_size, meta_path=tok_info.meta_path,
                       model_path=','.join(os.path.abspath(p) for p in cfg.model_path.split(',')),
                       model_sha256=model_sha256,
                       temperature=cfg.temperature, top_k=cfg.top_k, samples_per_chunk=cfg.samples_per_chunk,
                       seed=cfg.seed, crossover_k=cfg.crossover_k or 'uniform', format_version=FORMAT_VERSION)
    summary, t0 = [], time.time()
    # (split, its tokens, its random stream): the select split, when asked for, is drawn first so that the train
    # split can leave its blocks out; train and val keep the streams they had before it existed
    splits = [('select', train, 2)] * bool(cfg.select_blocks) + [('train', train, 0), ('val', val, 1)]
    if cfg.select_blocks >= len(train) // N:
        raise UserError(f"--select_blocks {cfg.select_blocks} leaves no train block (the generator's train tokens "
                        f"hold {len(train) // N} blocks of {N}): lower --select_blocks")
    held_for_selection = ()
    for split, tokens, stream in splits:
        rng = np.random.default_rng([cfg.seed, stream])
        exclude = eval_window_indices(len(tokens) // N, cfg.exclude_eval_windows, cfg.eval_seed) \
            if split == 'val' and cfg.exclude_eval_windows else held_for_selection if split == 'train' else ()
        blocks, offsets, K = make_crossovers(tokens, N, cfg.samples_per_chunk,
                                             cfg.select_blocks if split == 'select' else cfg.max_blocks, rng,
                                             cfg.crossover_k, exclude)
        if split == 'select':
            held_for_selection = offsets // N
        t_split = time.time()
        signature = progress_signature(cfg, model_sha256, rt.device_type, split, blocks, K)
        resumed = False
        if rt.master and os.path.isdir(progress):  # batches saved under other settings are never mixed in
            for name in os.listdir(progress):
                resumed |= name.startswith(f'{split}_{signature}_')
                if name.startswith(f'{split}_') and not name.startswith(f'{split}_{signature}_'):
                    os.remove(os.path.join(progress, name))
        x = generate_mixed(model, blocks, K, cfg.batch_size, cfg.temperature, cfg.top_k,
                           cfg.seed * 2 + stream if stream < 2 else SELECT_SEED + cfg.seed, rt,
                           f"{split} ({len(blocks)} blocks)", (progress, split, signature))
        y = labels_for(K, N)
        if rt.master:
            n_total = len(tokens) // N
            drawn = 'all, in order' if len(blocks) == n_total else \
                f"uniformly without replacement (seed {cfg.seed}), kept in split order"
            write_split(tmp_dir, split, x, y, dict(meta_common, split=split, num_blocks=len(blocks),
                                                   blocks_in_split=n_total, block_selection=drawn,
                                                   excluded_eval_windows=len(exclude) * (split == 'val'),
                                                   excluded_select_blocks=len(exclude) * (split == 'train'),
                                                   held_out_tail=n_train - len(train) if split != 'val' else 0,
                                                   block_offsets_file=f'{split}_block_offsets.bin',
                                                   natural_file=f'{split}_natural.bin',
                                                   flops=model.flops_per_token() * len(x) * N), offsets, blocks)
            generated = int((N - K).sum())
            summary.append((split, len(blocks), len(x), generated, time.time() - t_split, y[:, 0].mean(), resumed))
    if rt.ddp:
        dist.barrier()
    if rt.master:
        replace_dir(tmp_dir, cfg.output_dir)
        shutil.rmtree(progress, ignore_errors=True)
        print(f"\nreward dataset written to {cfg.output_dir} in {time.time() - t0:.1f}s")
        print(f"  block size N: {N}; tokenization: {tok_info.method} (vocab {tok_info.vocab_size}); "
              f"samples per block: {cfg.samples_per_chunk}")
        for split, n_blocks, n, gen, dt, mean_nat, resumed in summary:
            speed = 'resumed: part made before, no speed' if resumed else f'{gen / max(dt, 1e-9):,.0f} tok/s'
            print(f"  {split}: {n_blocks} blocks -> {n} samples, x ({n}, {N}) uint16, y ({n}, 2) float32; "
                  f"mean P(natural) label {mean_nat:.3f}; {gen:,} generated tokens in {dt:.1f}s ({speed})")
    rt.close()


if __name__ == '__main__':
    run_cli(main)
