"""The forward-KL distillation of a tilt (docs/family_bound.md): prepare_tilt_data.py resamples the generator's
continuations of train prompts by a judge, train.py --mix_dir trains on the kept windows' generated tokens."""
import json
import os
import re
import shutil

import numpy as np
import torch

from conftest import ROOT, run_script, toy_run_config, train_tiny
from data_loader import file_sha256


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


def test_the_distillation_bench_reads_an_oracles_tilt_against_its_controls_over_seeds(tmp_path, noise_gen, char_ckpt,
                                                                                      char_data):
    """bench_channels.py, the oracle through channel (b): each seed's tilt windows, its judge-off windows, the two arms
    trained as the MLE control is and the MLE control at the distilled arm's FLOPs; every model read on the seed's
    own val windows. The oracle's distilled arm beats its judge-off control and keeps part of its tilt's gain; a
    rerun reads its record (nothing retrained), and a missing judge is a one-line error."""
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(noise_gen, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    script = os.path.join(ROOT, 'benchmarks', 'bench_channels.py')
    args = ['--run', str(run), '--judge', char_ckpt, '--judge_flops', '1e9', '--k', '16', '--windows', '64',
            '--epochs', '2', '--seeds', '1,2', '--ppl_windows', '12', '--device', 'cpu']
    r = run_script(script, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    work = run / 'channels'
    digest = file_sha256(char_ckpt)[:8]  # two judges named ckpt.pt get two records
    record = json.loads((work / f'ckpt_{digest}_k16_a1_w64_e2_m0.5_read12.json').read_text())
    for seed in ('1', '2'):
        ce = {k: np.mean(v) for k, v in record[seed]['ce'].items()}
        assert ce['distilled'] < ce['judge_off'] and ce['tilt'] < ce['base'] and ce['distilled'] < ce['base']
        assert record[seed]['iters'] == 32 and record[seed]['f_kept'] > record[seed]['f_candidates']
        assert 0.9 <= record[seed]['matched_temperature'] <= 1.1 and 'matched' in record[seed]['ce']
        c2st = record[seed]['c2st']  # the two-sample test beside each control; the noise generator's text is far
        assert set(c2st) == {'base', 'matched', 'mle'} and c2st['base']['arm_auc'] > 0.9 and 'label' in c2st['mle']
    rows = [line for line in r.stdout.splitlines() if line.startswith('| 1 |') or line.startswith('| 2 |')]
    assert len(rows) == 4 and all(re.search(r'\| [+-]\d+% \|$', row) for row in rows[:2])
    assert 'two-sample AUC of the distilled arm' in r.stdout
    assert '**over 2 seeds**' in r.stdout and 'unresolved' in r.stdout  # 2 seeds make no claim on a method
    stamps = {p: p.stat().st_mtime for p in work.glob('*.pt')}
    assert len(stamps) == 6  # 2 seeds x (distilled, judge-off, MLE)
    again = run_script(script, *args)
    def table(out):
        return [line for line in out.splitlines() if line.startswith('|') or line.startswith('gain retained')]
    assert again.returncode == 0 and table(again.stdout) == table(r.stdout)
    assert [line for line in again.stdout.splitlines() if line] == table(r.stdout)  # read back: nothing else ran
    assert {p: p.stat().st_mtime for p in work.glob('*.pt')} == stamps
    r = run_script(script, '--run', str(run), '--judge', str(tmp_path / 'none.json'), '--judge_flops', '0')
    assert r.returncode == 2 and 'is no file' in r.stderr and 'Traceback' not in r.stderr


def test_the_oracle_plays_the_tilts_game_and_dpg_through_the_same_reads(tmp_path, noise_gen, char_ckpt, char_data):
    """Channels (a) and (c): train_grpo.py from the base with the oracle's exact log-ratio as the reward (an n-gram
    judge scoring beside it), read as channel (b) is. Each game moves the generator towards the oracle (its val
    windows' cross-entropy falls); its judge-off control is the base, and the MLE control is given the game's FLOPs.
    An oracle played without an instrument is a one-line error."""
    from judge import NgramJudge
    from model import load_checkpoint
    from tokenization_manager import TokenizationManager
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(noise_gen, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    tokenization = load_checkpoint(noise_gen)['tokenization']
    text = TokenizationManager.from_info(tokenization).decode(np.fromfile(f'{char_data}/train.bin', np.uint16)[:4000])
    judge = NgramJudge()
    judge.fit([text[i:i + 24] for i in range(0, 2400, 24)], ['zq' * 12 for _ in range(100)])
    judge.save(str(tmp_path / 'instrument.json'), tokenization)
    script = os.path.join(ROOT, 'benchmarks', 'bench_channels.py')
    common = ['--run', str(run), '--judge', char_ckpt, '--judge_flops', '1e9', '--k', '4', '--steps', '16',
              '--game_lr', '3e-3', '--seeds', '1', '--ppl_windows', '12', '--device', 'cpu']
    r = run_script(script, *common, '--channel', 'game')
    assert r.returncode == 2 and '--instrument' in r.stderr and 'Traceback' not in r.stderr
    for channel in ('game', 'dpg'):
        r = run_script(script, *common, '--channel', channel, '--instrument', str(tmp_path / 'instrument.json'))
        assert r.returncode == 0, r.stderr[-3000:]
        digest = file_sha256(char_ckpt)[:8]
        record = json.loads((run / 'channels' / f'ckpt_{digest}_{channel}_k4_a1_lr0.003_16steps_read12.json')
                            .read_text())['1']
        ce = {k: np.mean(v) for k, v in record['ce'].items()}
        assert ce['distilled'] < ce['base'] == ce['judge_off'] and ce['tilt'] < ce['base']
        assert record['iters'] == 16 and record['kept']['judge_off'] is None and record['flops'] > 1e9
        played = load_checkpoint(str(run / 'channels' / f'ckpt_{digest}_{channel}_k4_a1_lr0.003_16steps_s1.pt'))
        assert played['config']['objective'] == ('dpg' if channel == 'dpg' else 'grpo')
        assert '| 1 |' in r.stdout and 'the base' in r.stdout
