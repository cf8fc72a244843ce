import os

import numpy as np
import pytest
import torch

from conftest import prepare_reward, run_script
from data_loader import load_token_splits
from model import GPT
from reward_data_config import RewardDataConfig
from tokenization_manager import TokenizationInfo, TokenizationManager
from reward_dataset_loader import RewardDataset, create_reward_dataloaders
from configurator import UserError

N = 32


def block_offsets(data_dir, split):
    return np.fromfile(os.path.join(data_dir, f'{split}_block_offsets.bin'), dtype=np.int64)


def test_labels_prefix_and_split_separation(char_reward, char_data):
    train_tok = np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16)
    val_tok = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    for split, tokens in (('train', train_tok), ('val', val_tok)):
        ds = RewardDataset(char_reward, split)
        offsets = block_offsets(char_reward, split)
        assert len(ds) == 12 * 3 and ds.block_size == N and len(offsets) == 12
        for s in range(len(ds)):
            x, y = ds[s]
            K = round(float(y[0]) * N)
            assert 1 <= K <= N - 1 and float(y[0]) == np.float32(K / N) and float(y[1]) == np.float32((N - K) / N)
            block = tokens[offsets[s // 3]:offsets[s // 3] + N]
            assert np.array_equal(x.numpy()[:K], block[:K])  # the natural prefix is the source block's own
            assert np.array_equal(ds.natural_of([s])[0], block)  # and its natural counterpart is that block
        assert x.dtype == torch.int64 and y.dtype == torch.float32
    # nothing of val appears in train: every train prefix comes from the train split's blocks only
    ds = RewardDataset(char_reward, 'train')
    assert ds.get_stats()['y_min'] > 0 and ds.get_stats()['y_max'] < 1


def test_generated_tail_comes_from_the_model(char_reward, char_data):
    """The synthetic part differs from the natural continuation (the model writes it)."""
    train_tok = np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16)
    ds = RewardDataset(char_reward, 'train')
    offsets = block_offsets(char_reward, 'train')
    differs = 0
    for s in range(len(ds)):
        x, y = ds[s]
        K = round(float(y[0]) * N)
        block = train_tok[offsets[s // 3]:offsets[s // 3] + N]
        differs += not np.array_equal(x.numpy()[K:], block[K:])
    assert differs >= len(ds) - 2


def test_blocks_are_drawn_from_the_whole_split(char_reward, char_data):
    """12 of the split's non-overlapping blocks, distinct, block-aligned, spread over the split (not its first pages)."""
    from prepare_reward_data import make_crossovers
    for split in ('train', 'val'):
        n_tokens = os.path.getsize(os.path.join(char_data, f'{split}.bin')) // 2
        offsets = block_offsets(char_reward, split)
        assert len(set(offsets)) == 12 and np.all(offsets % N == 0) and np.all(np.diff(offsets) > 0)
        assert offsets.min() < 0.25 * n_tokens and offsets.max() > 0.75 * n_tokens
        meta = RewardDataset(char_reward, split).metadata
        assert meta['block_selection'].startswith('uniformly without replacement')
        assert int(meta['blocks_in_split']) == n_tokens // N
    tokens = np.arange(10 * N)  # fewer blocks than max_blocks: every block, in order
    blocks, offsets, K = make_crossovers(tokens, N, 2, 50, np.random.default_rng(0))
    assert np.array_equal(offsets, np.arange(10) * N) and np.array_equal(blocks[3], tokens[3 * N:4 * N])
    assert K.shape == (10, 2) and K.min() >= 1 and K.max() <= N - 1


def test_deterministic_and_batch_layout_independent(tmp_path, char_ckpt, char_data, char_reward):
    prepare_reward(char_ckpt, tmp_path / 'again', '--max_blocks', '12', data=char_data, fresh=True)  # another hash seed
    for name in ('train_x.bin', 'train_y.bin', 'val_x.bin', 'val_y.bin', 'train_metadata.txt'):
        assert open(os.path.join(char_reward, name), 'rb').read() == open(tmp_path / 'again' / name, 'rb').read()
    prepare_reward(char_ckpt, tmp_path / 'seed2', '--max_blocks', '12', '--seed', '7', data=char_data)
    assert open(os.path.join(char_reward, 'train_x.bin'), 'rb').read() != open(tmp_path / 'seed2' / 'train_x.bin', 'rb').read()


def test_text_mode_uses_the_same_splits_as_binary(tmp_path, char_ckpt, char_data, char_reward):
    prepare_reward(char_ckpt, tmp_path / 'text', '--max_blocks', '12', data=os.path.join(char_data, 'input.txt'), mode='text')
    for name in ('train_x.bin', 'val_x.bin', 'val_y.bin'):
        assert open(os.path.join(char_reward, name), 'rb').read() == open(tmp_path / 'text' / name, 'rb').read()


def test_bpe_end_to_end(tmp_path, bpe_ckpt, bpe_data):
    out = tmp_path / 'bpe'
    r = prepare_reward(bpe_ckpt, out, '--max_blocks', '4', data=bpe_data)
    assert 'tokenization: bpe' in r.stdout
    ds = RewardDataset(str(out), 'val', expected_tokenization_info={'method': 'bpe', 'vocab_size': 50257})
    assert ds.get_tokenization_info().method == 'bpe' and int(ds.x.max()) < 50257


def test_interrupted_run_leaves_nothing_that_looks_valid(tmp_path, char_ckpt, char_data):
    import prepare_reward_data as prd
    out = tmp_path / 'interrupted'
    calls = []

    def dying_write(out_dir, split, *a):
        calls.append(split)
        if split == 'val':
            raise KeyboardInterrupt
        return real_write(out_dir, split, *a)

    real_write = prd.write_split
    prd.write_split = dying_write
    try:
        with pytest.raises(KeyboardInterrupt):
            prd.main(['--model_path', char_ckpt, '--input_mode', 'binary', '--train_bin',
                      os.path.join(char_data, 'train.bin'), '--val_bin', os.path.join(char_data, 'val.bin'),
                      '--output_dir', str(out), '--device', 'cpu', '--max_blocks', '2', '--samples_per_chunk', '1'])
    finally:
        prd.write_split = real_write
    assert calls == ['train', 'val']
    assert not out.exists()  # the partial files sit in out.partial, never under the real name
    with pytest.raises(FileNotFoundError, match="prepare_reward_data.py"):
        RewardDataset(str(out), 'train')


def test_failed_generation_is_retried_then_reported(tmp_path, char_ckpt, char_data):
    import prepare_reward_data as prd
    from runtime import setup_runtime
    model = GPT.from_checkpoint(char_ckpt)
    with torch.no_grad():
        model.lm_head.weight.fill_(float('nan'))  # every logit is NaN: sampling must fail
    blocks = np.zeros((2, N), dtype=np.uint16)
    K = np.array([[3], [5]])
    with pytest.raises(UserError, match="failed 3 times"):
        prd.generate_mixed(model, blocks, K, 4, 1.0, None, 0, setup_runtime('cpu'), 'test')


def cfg(**kw):
    return RewardDataConfig(**kw)


def test_config_validation_reports_every_problem(tmp_path, char_ckpt, char_data):
    train_bin = os.path.join(char_data, 'train.bin')
    val_bin = os.path.join(char_data, 'val.bin')
    a_file = tmp_path / 'a_file'
    a_file.write_text('not a directory')
    ok = cfg(model_path=char_ckpt, input_mode='binary', train_bin=train_bin, val_bin=val_bin,
             output_dir=str(tmp_path / 'out'))
    assert ok.validate() == []
    cases = [
        (dict(model_path=str(tmp_path / 'missing.pt')), "model file not found"),
        (dict(data_path=train_bin), "--data_path does not belong to --input_mode binary"),
        (dict(tokenization='char'), "meta_path is required when tokenization is 'char'"),
        (dict(device='cuda:7' if not torch.cuda.is_available() else 'tpu'), "device"),
        (dict(train_bin=str(tmp_path / 'nope.bin')), "train_bin file not found"),
        (dict(block_size=10_000), "--block_size must be in"),
        (dict(output_dir=str(a_file / 'out')), "output directory cannot be created"),
    ]
    for change, message in cases:
        problems = cfg(**{**ok.__dict__, **change}).validate()
        assert any(message in e for e, _ in problems), (change, problems)
        assert all(s for _, s in problems)  # every error has a suggestion
    several = cfg(**{**ok.__dict__, 'tokenization': 'char', 'train_bin': str(tmp_path / 'nope.bin'),
                     'output_dir': str(a_file / 'out')}).validate()
    assert len(several) == 3  # all at once
    text_with_bins = cfg(model_path=char_ckpt, input_mode='text', train_bin=train_bin)
    messages = [e for e, _ in text_with_bins.validate()]
    assert "--data_path is required with --input_mode text" in messages
    assert "--train_bin does not belong to --input_mode text" in messages


def test_config_catches_tokenization_mismatch(tmp_path, bpe_ckpt, char_data):
    problems = cfg(model_path=bpe_ckpt, input_mode='binary', train_bin=os.path.join(char_data, 'train.bin'),
                   val_bin=os.path.join(char_data, 'val.bin'), output_dir=str(tmp_path / 'o')).validate()
    assert any("tokenization does not match" in e and "method" in e for e, _ in problems)


def test_config_rejects_reward_checkpoint(tmp_path, char_ckpt, char_data):
    from model import save_checkpoint
    rm = GPT.from_checkpoint(char_ckpt, mode='reward')
    save_checkpoint(str(tmp_path / 'rm.pt'), rm, tokenization={'method': 'char', 'vocab_size': 1})
    problems = cfg(model_path=str(tmp_path / 'rm.pt'), input_mode='binary',
                   train_bin=os.path.join(char_data, 'train.bin'), val_bin=os.path.join(char_data, 'val.bin')).validate()
    assert any("not a generator" in e for e, _ in problems)


def test_cli_prints_all_problems_and_exits_before_work(tmp_path, char_ckpt):
    out = tmp_path / 'never'
    r = run_script('prepare_reward_data.py', '--model_path', char_ckpt, '--input_mode', 'binary',
                   '--tokenization', 'char', '--output_dir', str(out))
    assert r.returncode == 2 and 'Traceback' not in r.stderr
    assert r.stderr.count('ERROR:') == 3 and r.stderr.count('SUGGESTION:') == 3  # train_bin, val_bin, meta_path
    assert not out.exists()


def test_data_loader_rejections(tmp_path, char_data):
    odd = tmp_path / 'odd.bin'
    odd.write_bytes(b'\x00\x01\x02')
    with pytest.raises(UserError, match="not a multiple of 2"):
        load_token_splits('binary', train_bin=str(odd), val_bin=os.path.join(char_data, 'val.bin'),
                          meta_path=os.path.join(char_data, 'meta.pkl'))
    big = tmp_path / 'big.bin'
    np.array([1, 2, 300], dtype=np.uint16).tofile(big)
    with pytest.raises(UserError, match=r"big.bin holds token id 300.*vocab size"):
        load_token_splits('binary', train_bin=str(big), val_bin=str(big), meta_path=os.path.join(char_data, 'meta.pkl'))
    empty = tmp_path / 'empty.bin'
    empty.write_bytes(b'')
    with pytest.raises(UserError, match="empty"):
        load_token_splits('binary', train_bin=os.path.join(char_data, 'train.bin'), val_bin=str(empty),
                          meta_path=os.path.join(char_data, 'meta.pkl'))
    with pytest.raises(UserError, match="fewer than one block"):
        load_token_splits('binary', train_bin=os.path.join(char_data, 'train.bin'), val_bin=str(big),
                          meta_path=os.path.join(char_data, 'meta.pkl'), block_size=8)
    train, val, info = load_token_splits('text', data_path=os.path.join(char_data, 'input.txt'))
    assert (info.method, info.meta_path) == ('char', os.path.join(char_data, 'meta.pkl'))
    assert info.itos == TokenizationManager('char', data_dir=char_data).itos  # the vocabulary travels with it
    assert np.array_equal(train, np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16))


def test_reward_dataset_detects_corruption_and_mismatch(tmp_path, char_reward):
    import shutil
    bad = tmp_path / 'bad'
    shutil.copytree(char_reward, bad)
    with open(bad / 'train_x.bin', 'ab') as f:
        f.write(b'\x00\x00')
    with pytest.raises(ValueError, match="train_x.bin is .* bytes, but its metadata"):
        RewardDataset(str(bad), 'train')
    with pytest.raises(ValueError, match="tokenization mismatch.*vocab_size"):
        RewardDataset(char_reward, 'val', expected_tokenization_info=TokenizationInfo('char', 999))
    with pytest.raises(ValueError, match="tokenization mismatch.*method"):
        RewardDataset(char_reward, 'val', expected_tokenization_info={'method': 'bpe', 'vocab_size': 50257})
    os.remove(bad / 'val_y.bin')
    with pytest.raises(FileNotFoundError, match="val_y.bin not found.*prepare_reward_data.py"):
        RewardDataset(str(bad), 'val')


def test_dataloaders_and_stats(char_reward):
    train, val = create_reward_dataloaders(char_reward, batch_size=8)
    x, y = next(iter(train))
    assert x.shape == (8, N) and y.shape == (8, 2) and x.dtype == torch.int64
    assert sum(len(b[0]) for b in val) == 36
    stats = RewardDataset(char_reward, 'train').get_stats()
    assert set(stats) >= {'num_samples', 'block_size', 'y_min', 'y_max', 'y_mean', 'y_std', 'prob_sum_min',
                          'prob_sum_max', 'prob_sum_mean', 'tokenization_method', 'vocab_size'}
    assert abs(stats['prob_sum_mean'] - 1) < 1e-6
    r = run_script('reward_dataset_loader.py', char_reward)
    assert r.returncode == 0 and 'tokenization consistency: train and val match' in r.stdout
    assert 'DataLoader test' in r.stdout


def test_torchrun_two_ranks_match_single_process(tmp_path, char_ckpt, char_data, char_reward):
    out = tmp_path / 'ddp'
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'prepare_reward_data.py',
                   '--model_path', char_ckpt, '--input_mode', 'binary', '--train_bin', os.path.join(char_data, 'train.bin'),
                   '--val_bin', os.path.join(char_data, 'val.bin'), '--output_dir', str(out), '--device', 'cpu',
                   '--samples_per_chunk', '3', '--batch_size', '16', '--max_blocks', '12', env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ('train_x.bin', 'val_x.bin', 'train_y.bin'):
        assert open(os.path.join(char_reward, name), 'rb').read() == open(out / name, 'rb').read()


def test_val_blocks_leave_out_the_evaluation_windows(tmp_path, char_ckpt, char_data):
    """--exclude_eval_windows n: no val block of a judge's data is one of the 2n windows the evaluation's two-sample
    test reads (two_sample.eval_windows of --eval_seed), so a judge never selects on them; train blocks are drawn as
    before."""
    from two_sample import eval_window_indices
    prepare_reward(char_ckpt, tmp_path / 'rd', '--max_blocks', '30', '--exclude_eval_windows', '20', '--eval_seed', '5',
                   data=char_data)
    val = np.memmap(os.path.join(char_data, 'val.bin'), dtype=np.uint16, mode='r')
    evaluated = set((eval_window_indices(len(val) // N, 20, 5) * N).tolist())
    offsets = np.fromfile(tmp_path / 'rd' / 'val_block_offsets.bin', dtype=np.int64)
    assert len(offsets) == min(30, len(val) // N - 40) and not evaluated & set(offsets.tolist())
    plain = prepare_reward(char_ckpt, tmp_path / 'plain', '--max_blocks', '30', data=char_data)
    assert plain.returncode == 0
    assert np.array_equal(np.fromfile(tmp_path / 'rd' / 'train_block_offsets.bin', dtype=np.int64),
                          np.fromfile(tmp_path / 'plain' / 'train_block_offsets.bin', dtype=np.int64))


def test_generation_benchmark_reads_the_negatives_shape(char_ckpt, char_data):
    """benchmarks/bench_reward_generation.py --crossover_k 8: every sample is an 8-token prompt and its continuation,
    the judges' negatives' shape, and the three paths are read side by side into the ratio the speed target names."""
    from conftest import ROOT
    n = GPT.from_checkpoint(char_ckpt).config.block_size
    r = run_script(os.path.join(ROOT, 'benchmarks', 'bench_reward_generation.py'), '--model_path', char_ckpt,
                   '--data', os.path.join(char_data, 'train.bin'), '--blocks', '6', '--samples_per_chunk', '3',
                   '--crossover_k', '8', '--batch_size', '8', '--baseline_samples', '1')
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"18 samples, {18 * (n - 8):,} tokens to generate" in r.stdout
    assert 'generation tok/s / forward tok/s: ' in r.stdout


def test_interrupted_generation_resumes_with_the_same_tokens(tmp_path, monkeypatch, capsys, char_ckpt, char_data):
    import prepare_reward_data as prd
    monkeypatch.setattr(prd, 'PROGRESS_SECONDS', 0)  # every batch saved as it is made
    generated, real_generate, real_save = [], GPT.generate, prd.save_batches
    monkeypatch.setattr(GPT, 'generate', lambda *a, **k: generated.append(1) or real_generate(*a, **k))

    def run(out, *extra):
        generated.clear()
        prd.main(['--model_path', char_ckpt, '--input_mode', 'binary', '--train_bin',
                  os.path.join(char_data, 'train.bin'), '--val_bin', os.path.join(char_data, 'val.bin'),
                  '--output_dir', str(out), '--device', 'cpu', '--max_blocks', '12', '--samples_per_chunk', '3',
                  '--batch_size', '16', *extra])
        return len(generated)

    def killed(out, *extra):  # dies right after the 4th batch is saved: train's 3, then val's first
        saves = []

        def save_then_die(folder, split, signature, fresh):
            saves.append(bool(fresh))
            real_save(folder, split, signature, fresh)
            if sum(saves) == 4:
                raise KeyboardInterrupt
        monkeypatch.setattr(prd, 'save_batches', save_then_die)
        with pytest.raises(KeyboardInterrupt):
            run(out, *extra)
        monkeypatch.setattr(prd, 'save_batches', real_save)

    assert run(tmp_path / 'whole') == 6  # 36 samples a split in batches of 12
    assert 'resumed' not in capsys.readouterr().out
    killed(tmp_path / 'cut')
    assert not (tmp_path / 'cut').exists() and (tmp_path / 'cut.progress').is_dir()
    capsys.readouterr()
    assert run(tmp_path / 'cut') == 2  # only val's last two batches are made again
    summary = capsys.readouterr().out  # a split partly made before is given no speed
    assert summary.count('resumed: part made before, no speed') == 2 and summary.count('tok/s') == 0
    for name in ('train_x.bin', 'train_y.bin', 'val_x.bin', 'val_y.bin', 'train_metadata.txt', 'val_metadata.txt'):
        assert (tmp_path / 'whole' / name).read_bytes() == (tmp_path / 'cut' / name).read_bytes()
    assert not (tmp_path / 'cut.progress').exists()
    killed(tmp_path / 'other')  # then asked for other settings: nothing saved under the first is used
    assert run(tmp_path / 'other', '--temperature', '0.9') == 6
    assert not (tmp_path / 'other.progress').exists()
