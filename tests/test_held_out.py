"""The generator's training tokens: every stage that reads natural train text reads the train split less the tail its
base held out to choose its checkpoint (train.py --select_tokens), never a token of that tail."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import make_text, prepare_reward, run_script, train_tiny
from configurator import UserError
from data_loader import generator_train_tokens, held_out_record, held_out_tail, prepare_dataset
from model import load_checkpoint
from tokenization_manager import TokenizationManager

TAIL = 400  # the tail, all 'Z': a letter the rest of the train split never holds
TRAIN_CHARS = 36000


@pytest.fixture(scope='module')
def tail_case(tmp_path_factory):
    """A char dataset whose train split ends in TAIL 'Z's (the only Z of the train split), and a tiny base trained
    with that tail held out for its checkpoint's selection."""
    d = tmp_path_factory.mktemp('tail')
    text = make_text(TRAIN_CHARS - TAIL, seed=3) + 'Z' * TAIL + make_text(4000, seed=4)
    (d / 'text.txt').write_text(text)
    prepare_dataset('char', str(d / 'data'), str(d / 'text.txt'))  # 90%: the train split ends with the Z's
    train_tiny(str(d / 'data'), str(d / 'base'), '--max_iters=20', '--eval_interval=10', f'--select_tokens={TAIL}')
    z = TokenizationManager('char', meta_path=str(d / 'data' / 'meta.pkl')).encode('Z')[0]
    return d, str(d / 'data'), str(d / 'base' / 'ckpt.pt'), z


def test_the_base_records_its_held_out_tail_and_the_tail_is_all_it_held_out(tail_case):
    _, data, base, z = tail_case
    train = np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16)
    assert len(train) == TRAIN_CHARS and np.flatnonzero(train == z).tolist() == list(range(TRAIN_CHARS - TAIL,
                                                                                          TRAIN_CHARS))
    ckpt = load_checkpoint(base)
    assert ckpt['held_out'] == dict(tokens=TAIL, of=TRAIN_CHARS)
    assert not (generator_train_tokens(train, ckpt) == z).any() and len(generator_train_tokens(train, ckpt)) == \
        TRAIN_CHARS - TAIL


def test_the_record_rules():
    """A record of another split of the corpus holds out as many tokens at this split's end (the splits share their
    end); a train.py checkpoint from before the record reads its select_tokens; a model trained on its own training
    tokens keeps the tail, one trained with a selection split of its own the smaller of the two, one from scratch its
    own; a tail that leaves nothing to read is a one-line error."""
    assert held_out_tail(dict(held_out=dict(tokens=5, of=100)), 100) == 5
    assert held_out_tail(dict(held_out=dict(tokens=5, of=100)), 90) == 5
    assert held_out_tail(dict(held_out=dict(tokens=50, of=100)), 30) == 30
    assert held_out_tail(dict(config=dict(select_tokens=7)), 100) == 7
    assert held_out_tail(dict(config=dict(dataset='x')), 100) == 0
    assert held_out_record(dict(held_out=dict(tokens=5, of=100)), 90) == dict(tokens=5, of=90)
    assert held_out_record(dict(held_out=dict(tokens=5, of=100)), 100) == dict(tokens=5, of=100)
    assert held_out_record(dict(held_out=dict(tokens=5, of=100)), 100, 8) == dict(tokens=5, of=100)
    assert held_out_record(None, 100, 8) == dict(tokens=8, of=100)
    assert len(generator_train_tokens(np.arange(90), dict(held_out=dict(tokens=5, of=100)))) == 85
    with pytest.raises(UserError, match='none are left'):
        generator_train_tokens(np.arange(10), dict(held_out=dict(tokens=10, of=10)))


def test_a_larger_split_of_the_corpus_leaves_a_smaller_bases_tail_unread(tmp_path, tail_case):
    """Nested splits (prepare.py --train_tokens keeps the last N): a base trained on the smaller one held out its
    tail, which is the last tokens of the larger split too. A stage that reads the larger split with that base
    leaves the tail unread (it read it whole when a record of another split counted as none)."""
    d, data, _, z = tail_case
    small = tmp_path / 'small'
    prepare_dataset('char', str(small), str(d / 'text.txt'), train_tokens=TRAIN_CHARS // 2)
    train_tiny(str(small), str(tmp_path / 'base'), '--max_iters=2', '--eval_interval=1', f'--select_tokens={TAIL}')
    ckpt = load_checkpoint(str(tmp_path / 'base' / 'ckpt.pt'))
    assert ckpt['held_out'] == dict(tokens=TAIL, of=TRAIN_CHARS // 2)
    larger = np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16)
    assert len(generator_train_tokens(larger, ckpt)) == TRAIN_CHARS - TAIL
    assert not (generator_train_tokens(larger, ckpt) == z).any()


def test_one_vocabulary_of_known_words_the_generators_training_tokens(tail_case):
    """evaluate.py's unknown-word rate and GRPO's known-words reward read one vocabulary: the words of the
    generator's training tokens (the tail's word of Z's is not among them)."""
    from data_loader import train_words, words_known_in
    _, data, base, _ = tail_case
    ckpt = load_checkpoint(base)
    train = np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16)
    tokenizer = TokenizationManager.from_info(ckpt['tokenization'])
    known = train_words(data, ckpt)
    assert any('zz' in w for w in words_known_in(train, tokenizer))  # the whole split's words hold the tail's
    assert not any('zz' in w for w in known) and len(known) > 10
    assert known == words_known_in(generator_train_tokens(train, ckpt), tokenizer)


def test_continued_training_keeps_only_the_tail_no_model_of_its_line_read(tmp_path, tail_case):
    """train.py from a checkpoint: its tail is the smaller of its own selection split and its start's (a run on the
    whole split read the tail: nothing is held out any more); from scratch, its own."""
    _, data, base, _ = tail_case
    for select, expected in ((TAIL, TAIL), (2 * TAIL, TAIL), (0, 0)):
        out = tmp_path / f'continued{select}'
        train_tiny(data, str(out), f'--init_from={base}', '--max_iters=2', '--eval_interval=1',
                   f'--select_tokens={select}')
        assert load_checkpoint(str(out / 'ckpt.pt'))['held_out'] == dict(tokens=expected, of=TRAIN_CHARS), select


def test_reward_data_never_reads_the_tail(tmp_path, tail_case):
    """Every train block of the judge's data, natural and sampled prefix alike, lies in the base's training tokens:
    with all blocks drawn, the tail would be among them."""
    _, data, base, z = tail_case
    out = tmp_path / 'reward'
    prepare_reward(base, out, '--max_blocks', '5000', '--samples_per_chunk', '1', data=data)
    natural = np.fromfile(out / 'train_natural.bin', dtype=np.uint16)
    offsets = np.fromfile(out / 'train_block_offsets.bin', dtype=np.int64)
    assert len(offsets) == (TRAIN_CHARS - TAIL) // 32 and offsets.max() + 32 <= TRAIN_CHARS - TAIL
    assert not (natural == z).any()
    meta = open(out / 'train_metadata.txt').read()
    assert f'held_out_tail: {TAIL}' in meta


def test_tilt_windows_never_read_the_tail(tmp_path, tail_case):
    """prepare_tilt_data.py's prompts are windows of the generator's training tokens: with every window drawn, the
    tail (the last 12 of the whole split's 1,125 windows of 32) would be among them."""
    _, data, base, z = tail_case
    windows = (TRAIN_CHARS - TAIL) // 32
    r = run_script('prepare_tilt_data.py', f'--model_path={base}', '--judge=none', f'--windows={windows}',
                   f'--out_dir={tmp_path / "tilt"}', f'--dataset={data}', '--device=cpu')
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.load(open(tmp_path / 'tilt' / 'meta.json'))
    rows = np.fromfile(tmp_path / 'tilt' / 'windows.bin', dtype=np.uint16).reshape(-1, meta['length'])
    assert meta['held_out_tail'] == TAIL and len(rows) == windows
    assert not (rows[:, :meta['prompt_len']] == z).any()


def test_the_policy_trainers_read_only_the_generators_training_tokens_and_keep_its_tail(tmp_path, tail_case):
    """GRPO's prompts, its real text and its judge's natural windows, and SPIN's real data, come from
    policy.prompts_and_splits: the train split less the tail. A GRPO run's n-gram judge, saved as the texts it was
    fitted on (the prompts' own continuations and many more natural windows), holds no Z; both trainers' checkpoints
    keep the base's tail, so the next cycle's stages leave it unread too."""
    from policy import prompts_and_splits
    _, data, base, z = tail_case
    options = SimpleNamespace(max_prompt_len=0, min_prompt_len=4, dataset=data)
    _, train, _, held = prompts_and_splits(options, 32, load_checkpoint(base))
    assert len(train) == TRAIN_CHARS - TAIL and not (np.asarray(train) == z).any()
    assert held == dict(tokens=TAIL, of=TRAIN_CHARS)
    grpo = tmp_path / 'grpo.pt'
    r = run_script('train_grpo.py', f'--policy_path={base}', '--judge=ngram', '--judge_update_interval=1',
                   '--judge_warmup_steps=1', '--judge_natural_windows=400', '--nll_weight=1', f'--out_path={grpo}',
                   '--device=cpu', '--max_steps=2', '--eval_interval=2', '--prompts_per_step=4',
                   '--num_generations=2', '--ppl_max_tokens=2000')
    assert r.returncode == 0, r.stderr[-3000:]
    assert load_checkpoint(str(grpo))['held_out'] == dict(tokens=TAIL, of=TRAIN_CHARS)
    judge = json.load(open(tmp_path / 'grpo_judge.json'))
    assert len(judge['natural']) > 800 and not any('Z' in t for t in judge['natural'])  # its samples may write Z
    spin = tmp_path / 'spin.pt'
    r = run_script('train_spin.py', f'--policy_path={grpo}', f'--out_path={spin}', '--device=cpu', '--batch_size=4',
                   '--eval_prompts=8', '--ppl_max_tokens=2000', '--max_steps=1')
    assert r.returncode == 0, r.stderr[-3000:]
    assert load_checkpoint(str(spin))['held_out'] == dict(tokens=TAIL, of=TRAIN_CHARS)
