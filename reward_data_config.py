"""
Configuration of prepare_reward_data.py: every option in one dataclass, and a validate() that reports all problems
at once, each with a suggested fix, before any work starts.
"""

import os
from dataclasses import dataclass
from typing import Optional

from configurator import UserError
from model import load_checkpoint
from runtime import resolve_device
from tokenization_manager import TokenizationInfo, TokenizationManager


@dataclass
class RewardDataConfig:
    model_path: str
    input_mode: str = 'text'  # 'text' (a raw text file) or 'binary' (train.bin/val.bin)
    data_path: Optional[str] = None
    train_bin: Optional[str] = None
    val_bin: Optional[str] = None
    tokenization: str = 'auto'  # 'auto', 'bpe' or 'char'
    meta_path: Optional[str] = None
    output_dir: str = 'data/reward_dataset'
    train_split: float = 0.9
    split_block: int = 0  # text mode: the prepare scripts' --split_block (0: contiguous)
    samples_per_chunk: int = 10
    temperature: float = 1.0
    top_k: Optional[int] = None
    device: str = 'auto'
    seed: int = 42
    block_size: Optional[int] = None  # default: the model's
    batch_size: int = 512  # sequences generated together
    max_blocks: Optional[int] = None  # at most this many blocks per split (default all)
    crossover_k: int = 0  # 0: K ~ U[1, N-1] per sample; k > 0: every sample keeps its block's first k tokens
    # n > 0: no val block is one of the 2n windows of the evaluation's two-sample test (two_sample.eval_windows of
    # eval_seed), so that a judge never selects on the windows its sight and the referee are read on
    exclude_eval_windows: int = 0
    eval_seed: int = 1337
    # n > 0: n blocks of the generator's train tokens, drawn at random and never in the train split, make a 'select'
    # split that train_reward_model.py selects its checkpoint on (held-out train windows: the judge never selects on
    # the generator's val text); 0: no such split (the judge selects on half of val, the seed's design)
    select_blocks: int = 0

    def data_dir(self):
        """Where meta.pkl would sit next to the input data."""
        path = self.data_path if self.input_mode == 'text' else self.train_bin
        return os.path.dirname(os.path.abspath(path)) if path else None

    def validate(self):
        """All problems as (error, suggestion) pairs; empty when the config is usable. The numbers' own ranges
        (prepare_reward_data.RANGES) are checked before, as the CLI parses them."""
        problems = []

        def bad(error, suggestion):
            problems.append((error, suggestion))

        ckpt, missing = None, [p for p in (self.model_path or '').split(',') if not os.path.isfile(p)]
        if missing:  # several, comma-separated: their ensemble (calibration.load_generator), read as the first
            bad(f"model file not found: {missing[0]}", "pass --model_path with a checkpoint written by train.py")
        else:
            try:
                ckpt = load_checkpoint(self.model_path.split(',')[0])
            except ValueError as e:
                bad(str(e), "pass --model_path with a checkpoint written by train.py")
            if ckpt is not None and ckpt['model_args'].get('mode', 'generator') != 'generator':
                bad(f"{self.model_path} is a {ckpt['model_args']['mode']} checkpoint, not a generator",
                    "pass the base (generator) model that should write the synthetic continuations")
        if self.input_mode == 'text':
            if not self.data_path:
                bad("--data_path is required with --input_mode text", "pass --data_path FILE, or use --input_mode binary")
            elif not os.path.isfile(self.data_path):
                bad(f"data file not found: {self.data_path}", "check --data_path")
            for name in ('train_bin', 'val_bin'):
                if getattr(self, name):
                    bad(f"--{name} does not belong to --input_mode text", f"drop --{name}, or use --input_mode binary")
        elif self.input_mode == 'binary':
            for name in ('train_bin', 'val_bin'):
                path = getattr(self, name)
                if not path:
                    bad(f"--{name} is required with --input_mode binary", f"pass --{name} (written by a prepare.py)")
                elif not os.path.isfile(path):
                    bad(f"{name} file not found: {path}", f"check --{name}, or run the dataset's prepare.py")
            if self.data_path:
                bad("--data_path does not belong to --input_mode binary", "drop --data_path, or use --input_mode text")
        else:
            bad(f"unknown --input_mode {self.input_mode!r}", "use --input_mode text or --input_mode binary")
        if self.tokenization not in ('auto', 'bpe', 'char'):
            bad(f"unknown --tokenization {self.tokenization!r}", "use auto, bpe or char")
        if self.tokenization == 'char' and not self.meta_path:
            bad("meta_path is required when tokenization is 'char'", "pass --meta_path or use --tokenization auto")
        if self.tokenization == 'bpe' and self.meta_path:
            bad("--meta_path does not belong to --tokenization bpe", "drop --meta_path, or use --tokenization char")
        if self.meta_path and not os.path.isfile(self.meta_path):
            bad(f"meta file not found: {self.meta_path}", "pass the meta.pkl written by the char prepare.py")
        N = self.block_size or (ckpt['model_args']['block_size'] if ckpt is not None else None)
        if N is not None and self.crossover_k >= N:
            bad(f"--crossover_k must be below the block size {N}, got {self.crossover_k}",
                "use e.g. --crossover_k 8 (the two-sample test's prompt length)")
        if ckpt is not None and self.block_size is not None:
            model_bs = ckpt['model_args']['block_size']
            if not 2 <= self.block_size <= model_bs:
                bad(f"--block_size must be in [2, {model_bs}] for this model, got {self.block_size}",
                    "leave --block_size out to use the model's")
        try:
            resolve_device(self.device)
        except UserError as e:
            bad(str(e), "use --device auto or --device cpu")
        if ckpt is not None and not problems:
            self._check_tokenization(ckpt, bad)
        parent = os.path.dirname(os.path.abspath(self.output_dir))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK) or \
                (os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir)):
            bad(f"output directory cannot be created: {self.output_dir}", "pass a writable --output_dir")
        return problems

    def _check_tokenization(self, ckpt, bad):
        try:
            data_tok = TokenizationManager(self.tokenization, self.meta_path, self.data_dir())
        except (ValueError, FileNotFoundError) as e:
            bad(str(e), "pass --tokenization and --meta_path matching the data")
            return
        saved = ckpt.get('tokenization') or {}
        if not saved:
            bad(f"{self.model_path} records no tokenization", "use a checkpoint written by this repository's train.py")
            return
        diff = TokenizationInfo.from_dict(saved).differences(TokenizationInfo.from_dict(data_tok.info()))
        if diff:
            bad(f"the checkpoint's tokenization does not match the data's ({'; '.join(diff)})",
                "use the data the model was trained on, or pass the matching --tokenization/--meta_path")
        if ckpt['model_args']['vocab_size'] < data_tok.vocab_size:
            bad(f"model vocab {ckpt['model_args']['vocab_size']} is smaller than the tokenizer's {data_tok.vocab_size}",
                "use the model trained on this data")


def format_problems(problems):
    return '\n'.join(f"ERROR: {e}\nSUGGESTION: {s}" for e, s in problems)

