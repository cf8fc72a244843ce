"""The forward-KL distillation of a tilt (docs/family_bound.md): prepare_tilt_data.py resamples the generator's
continuations of train prompts by a judge, train.py --mix_dir trains on the kept windows' generated tokens."""
import json
import re

import numpy as np
import torch

from conftest import run_script, train_tiny


def test_a_tilts_windows_are_learnt_on_their_generated_tokens_only():
    """mix_rows: inputs and next-token targets of each window, the prompt's targets and the padding to the block -1
    (no loss reads them)."""
    from train import mix_rows
    mix = dict(windows=torch.arange(20).view(2, 10), prompt_len=4)
    x, y = mix_rows(mix, torch.tensor([1]), 12)
    assert x.tolist() == [[10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0, 0]]
    assert y.tolist() == [[-1, -1, -1, 14, 15, 16, 17, 18, 19, -1, -1, -1]]


def test_distilling_an_oracles_tilt_moves_the_generator_towards_it_and_its_judge_off_control_does_not(
        tmp_path, noise_gen, char_ckpt, char_data):
    """The positive control through the channel: the nearly uniform generator's continuations of train prompts,
    resampled by the 150-step model's exact log-ratio to it (an oracle: its tilt at scale 1 is that model), keep
    windows the oracle favours; next-token training on them lowers val loss (44.8 -> 39.5 in perplexity here), where
    the same training on unresampled continuations (--judge=none, the judge-off control) raises it (48.4). The same
    seed writes the same windows."""
    def prepare(judge, out):
        r = run_script('prepare_tilt_data.py', f'--model_path={noise_gen}', f'--judge={judge}', '--scale=1', '--k=16',
                       '--windows=64', f'--out_dir={out}', '--device=cpu', f'--dataset={char_data}',
                       '--batch_prompts=32')
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads((out / 'meta.json').read_text())
    tilt = prepare(char_ckpt, tmp_path / 'tilt')
    off = prepare('none', tmp_path / 'off')
    assert tilt['judge_kind'] == 'exact log-ratio' and tilt['k'] == 16 and off['k'] == 1
    assert tilt['f_kept'] > tilt['f_candidates'] + 5  # the kept are the oracle's favourites
    windows = np.fromfile(tmp_path / 'tilt' / 'windows.bin', dtype=np.uint16).reshape(64, 32)
    train = np.fromfile(f'{char_data}/train.bin', dtype=np.uint16)
    assert all(bytes(w[:8]) in bytes(train.astype(np.uint16)) for w in windows[:4])  # natural train prompts
    prepare(char_ckpt, tmp_path / 'again')
    assert (tmp_path / 'again' / 'windows.bin').read_bytes() == (tmp_path / 'tilt' / 'windows.bin').read_bytes()

    def val_ppl(name):
        r = train_tiny(char_data, str(tmp_path / f'd_{name}'), f'--init_from={noise_gen}',
                       f'--mix_dir={tmp_path / name}', '--mix_fraction=1.0', '--max_iters=40', '--eval_interval=40',
                       '--decay_lr=False')
        return [float(v) for v in re.findall(r'step \d+: .*val ppl ([\d.]+)', r.stdout)]
    start, distilled = val_ppl('tilt')
    off_start, off = val_ppl('off')
    assert off_start == start and distilled < 0.95 * start < start < off


def test_bad_tilt_inputs_are_one_line_errors(tmp_path, noise_gen, char_data):
    r = run_script('prepare_tilt_data.py', f'--model_path={noise_gen}', '--judge=missing.pt',
                   f'--out_dir={tmp_path / "t"}', f'--dataset={char_data}')
    assert r.returncode == 2 and 'is no file' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 't').exists()
    r = run_script('prepare_tilt_data.py', f'--model_path={noise_gen}', '--judge=none', '--windows=100000',
                   f'--out_dir={tmp_path / "t"}', f'--dataset={char_data}')
    assert r.returncode == 2 and 'lower --windows' in r.stderr and not (tmp_path / 't').exists()
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={tmp_path / "o"}', f'--init_from={noise_gen}',
                   f'--mix_dir={tmp_path}', '--device=cpu', '--block_size=32', '--max_iters=1')
    assert r.returncode == 2 and 'holds no meta.json' in r.stderr and 'Traceback' not in r.stderr
