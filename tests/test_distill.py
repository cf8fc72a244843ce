"""The forward-KL distillation of a tilt (docs/family_bound.md): prepare_tilt_data.py resamples the generator's
continuations of train prompts by a judge, train.py --mix_dir trains on the kept windows' generated tokens."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from conftest import ROOT, run_script, toy_run_config, train_tiny
from data_loader import file_sha256
from calibration import calibrated_temperature
from model import GPT, load_checkpoint
from tilt import completion_logprob
from two_sample import PROMPT_LEN, eval_windows


@pytest.fixture(scope='module')
def noise_base(tmp_path_factory, char_data):
    """A generator trained 2 steps, nearly uniform, that held out the last 4,000 train tokens (the toy run's
    base_select_tokens) to choose its checkpoint: the tail the channels' calibrated control is fit on."""
    out = tmp_path_factory.mktemp('noise_base')
    train_tiny(char_data, str(out), '--max_iters=2', '--eval_interval=1', '--select_tokens=4000')
    return str(out / 'ckpt.pt')


def test_a_tilts_windows_are_learnt_on_their_generated_tokens_only():
    """mix_rows: inputs and next-token targets of each window, the prompt's targets and the padding to the block -1
    (no loss reads them)."""
    from train import mix_rows
    mix = dict(windows=torch.arange(20).view(2, 10), prompt_len=4, weights=None)
    x, y, w = mix_rows(mix, torch.tensor([1]), 12)
    assert x.tolist() == [[10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0, 0]]
    assert y.tolist() == [[-1, -1, -1, 14, 15, 16, 17, 18, 19, -1, -1, -1]] and w is None
    assert mix_rows(dict(mix, weights=torch.tensor([0.5, -2.0])), torch.tensor([1, 0]), 12)[2].tolist() == [-2, 0.5]


def test_a_batch_mixes_the_tilts_windows_before_its_natural_rows():
    """train.mix_into: none mixed leaves the batch and no weights; n_mix windows go first, and with weighted windows
    the natural rows weigh 1."""
    from train import mix_into
    x, y = torch.zeros(3, 12, dtype=torch.long), torch.ones(3, 12, dtype=torch.long)
    mix = dict(windows=torch.arange(20).view(2, 10) + 100, prompt_len=4, weights=None)
    assert mix_into(x, y, mix, 0, 12)[2] is None and mix_into(x, y, mix, 0, 12)[0] is x
    mx, my, w = mix_into(x, y, mix, 2, 12)
    assert mx.shape == (5, 12) and (mx[:2, 0] >= 100).all() and (mx[2:] == 0).all() and (my[2:] == 1).all()
    assert w is None
    w = mix_into(x, y, dict(mix, weights=torch.tensor([-0.5, 0.5])), 2, 12)[2]
    assert w.shape == (5,) and set(w[:2].tolist()) <= {-0.5, 0.5} and w[2:].tolist() == [1, 1, 1]


def test_the_weighted_loss_is_the_plain_loss_at_weight_one_and_weighs_each_row(noise_gen):
    """train.weighted_loss: w = 1 gives model(x, y)'s loss; a row's weight multiplies its tokens' share (over the
    batch's target count, so that the w - 1 windows' zero-sum weights add no scale of their own)."""
    from model import GPT, load_checkpoint
    from train import weighted_loss
    model = GPT.from_checkpoint(load_checkpoint(noise_gen))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(model.config.vocab_size, (3, 16), generator=g)
    y = torch.randint(model.config.vocab_size, (3, 16), generator=g)
    y[0, :5] = -1
    plain = model(x, y)[1]
    assert torch.allclose(weighted_loss(model, x, y, torch.ones(3)), plain, atol=1e-6)
    per_row = [model(x[i:i + 1], y[i:i + 1])[1] * (y[i] != -1).sum() for i in range(3)]
    w = torch.tensor([0.0, 2.0, -1.0])
    expected = (2 * per_row[1] - per_row[2]) / (y != -1).sum()
    assert torch.allclose(weighted_loss(model, x, y, w), expected, atol=1e-5)


def test_tilt_weights_are_self_normalised_importance_weights():
    """tilt.tilt_weights: mean 1 over each prompt's K, ∝ e^{a·f}; a flat judge (or a = 0) weighs every candidate 1,
    so w - 1 is 0: the anchor's judge-off control. Large f does not overflow."""
    from tilt import tilt_weights
    f = np.array([[0.0, np.log(3.0)], [5.0, 5.0], [1000.0, 0.0]])
    w = tilt_weights(f, 1.0)
    assert np.allclose(w.mean(1), 1) and np.allclose(w[0], [0.5, 1.5]) and np.allclose(w[1], 1)
    assert np.allclose(w[2], [2, 0]) and np.allclose(tilt_weights(f, 0.0), 1)


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


def test_the_distillation_bench_reads_an_oracles_tilt_against_its_controls_over_seeds(tmp_path, noise_base, char_ckpt,
                                                                                      char_data):
    """bench_channels.py, the oracle through channel (b): each seed's tilt windows, its judge-off windows, the two arms
    trained as the MLE control is and the MLE control at the distilled arm's FLOPs; every model read on the seed's
    own val windows. The oracle's distilled arm beats its judge-off control and keeps part of its tilt's gain; a
    rerun reads its record (nothing retrained), and a missing judge is a one-line error."""
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(noise_base, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    script = os.path.join(ROOT, 'benchmarks', 'bench_channels.py')
    args = ['--run', str(run), '--judge', char_ckpt, '--judge_flops', '1e9', '--k', '16', '--windows', '64',
            '--epochs', '2', '--seeds', '1,2', '--ppl_windows', '12', '--device', 'cpu']
    r = run_script(script, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    work = run / 'channels'
    digest = file_sha256(char_ckpt)[:8]  # two judges named ckpt.pt get two records
    base = GPT.from_checkpoint(str(run / 'base_model_v1.pt'))
    val = np.memmap(os.path.join(char_data, 'val.bin'), dtype=np.uint16, mode='r')
    record = json.loads((work / f'ckpt_{digest}_k16_a1_w64_e2_m0.5_read12.json').read_text())
    for seed in ('1', '2'):
        ce = {k: np.mean(v) for k, v in record[seed]['ce'].items()}
        assert ce['distilled'] < ce['judge_off'] and ce['tilt'] < ce['base'] and ce['distilled'] < ce['base']
        assert record[seed]['iters'] == 32 and record[seed]['f_kept'] > record[seed]['f_candidates']
        # the matched temperature: flagged exactly when the sweep (0.9 to 1.1) clamped it to an end, and the base's
        # completions read at it
        matched = record[seed]['matched_temperature']
        assert record[seed]['outside_sweep'] == (not 0.9 < matched < 1.1), (matched, record[seed]['outside_sweep'])
        natural = eval_windows(val, 12, base.config.block_size, int(seed))[0]
        at_matched = -completion_logprob(base, natural, PROMPT_LEN, matched) / (natural.shape[1] - PROMPT_LEN)
        np.testing.assert_allclose(record[seed]['ce']['matched'], at_matched.tolist(), rtol=1e-5)
        assert len(record[seed]['ce']['calibrated']) == 12 and ce['calibrated'] != ce['base']
        assert ce['distilled_calibrated'] <= ce['distilled'] + 0.05 and record[seed]['arm_calibrated_temperature'] > 0
        # the MLE control calibrated again: read at its own tail-calibrated temperature, on the seed's windows
        mle_ckpt = load_checkpoint(str(work / f"mle_at_{record[seed]['flops']:.4g}_flops_s{seed}.pt"))
        mle = GPT.from_checkpoint(mle_ckpt)
        t = calibrated_temperature(mle, mle_ckpt, str(char_data), 'cpu')[0]
        assert t == record[seed]['mle_calibrated_temperature'] and t != 1.0
        at_t = -completion_logprob(mle, natural, PROMPT_LEN, t) / (natural.shape[1] - PROMPT_LEN)
        np.testing.assert_allclose(record[seed]['ce']['mle_calibrated'], at_t.tolist(), rtol=1e-5)
        c2st = record[seed]['c2st']  # the two-sample test beside each control; the noise generator's text is far
        assert set(c2st) == {'base', 'matched', 'mle'} and c2st['base']['arm_auc'] > 0.9 and 'label' in c2st['mle']
    rows = [line for line in r.stdout.splitlines() if line.startswith('| 1 |') or line.startswith('| 2 |')]
    assert len(rows) == 4 and all(re.search(r'\| [+-]\d+% \| \w.+ \([\d.]+\) \|$', row) for row in rows[:2])
    assert 'two-sample AUC of the distilled arm' in r.stdout
    assert '**over 2 seeds**' in r.stdout and 'unresolved' in r.stdout  # 2 seeds make no claim on a method
    stamps = {p: p.stat().st_mtime for p in work.glob('*.pt')}
    assert len(stamps) == 8  # 2 seeds x (distilled, judge-off, MLE, MLE's last weights)
    for seed in ('1', '2'):  # the MLE control's last weights: where it stopped, read beside its best
        last = load_checkpoint(str(next(work.glob(f'mle_at_*_s{seed}_last.pt'))))
        assert last['iter_num'] == record[seed]['kept']['mle'][1] and len(record[seed]['ce']['mle_last']) == 12
        assert (record[seed]['ce']['mle_last'] == record[seed]['ce']['mle']) == \
            (record[seed]['kept']['mle'][0] == record[seed]['kept']['mle'][1])
    again = run_script(script, *args)
    def table(out):
        return [line for line in out.splitlines() if line.startswith('|') or line.startswith('gain retained')]
    assert again.returncode == 0 and table(again.stdout) == table(r.stdout)
    assert [line for line in again.stdout.splitlines() if line] == table(r.stdout)  # read back: nothing else ran
    assert {p: p.stat().st_mtime for p in work.glob('*.pt')} == stamps
    # a record read before the MLE control was calibrated again gets that column alone, the same, nothing retrained
    record_path = work / f'ckpt_{digest}_k16_a1_w64_e2_m0.5_read12.json'
    for seed in ('1', '2'):
        del record[seed]['ce']['mle_calibrated'], record[seed]['mle_calibrated_temperature']
    record_path.write_text(json.dumps(record))
    again = run_script(script, *args)
    assert again.returncode == 0 and table(again.stdout) == table(r.stdout), again.stderr[-2000:]
    assert {p: p.stat().st_mtime for p in work.glob('*.pt')} == stamps
    r = run_script(script, '--run', str(run), '--judge', str(tmp_path / 'none.json'), '--judge_flops', '0')
    assert r.returncode == 2 and 'is no file' in r.stderr and 'Traceback' not in r.stderr
    # the w - 1 anchor through the same bench: its own windows (every candidate, weighted) and record
    r = run_script(script, *args[:-6], '--seeds', '1', '--ppl_windows', '12', '--device', 'cpu', '--keep', 'all')
    assert r.returncode == 0, r.stderr[-3000:]
    assert (work / f'ckpt_{digest}_k16_a1_w64_all_e2_m0.5_read12.json').exists()
    assert json.loads((work / 'off_w64_all_s1' / 'meta.json').read_text())['keep'] == 'all'
    assert json.loads((work / f'ckpt_{digest}_k16_a1_w64_all_s1' / 'meta.json').read_text())['rows'] == 64 * 16


def test_the_oracle_plays_the_tilts_game_and_dpg_through_the_same_reads(tmp_path, noise_base, char_ckpt,
                                                                         char_data):
    """Channels (a) and (c), on-policy and with GDC's gated proposal: train_grpo.py from the base with the oracle's
    exact log-ratio as the reward (an n-gram judge scoring beside it), read as channel (b) is. Each game moves the
    generator towards the oracle (its val windows' cross-entropy falls); its judge-off control is the base, and the
    MLE control is given the game's FLOPs. --from_mle starts each seed from its MLE control instead. An oracle played
    without an instrument is a one-line error."""
    from judge import NgramJudge
    from model import load_checkpoint
    from tokenization_manager import TokenizationManager
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(noise_base, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    tokenization = load_checkpoint(noise_base)['tokenization']
    text = TokenizationManager.from_info(tokenization).decode(np.fromfile(f'{char_data}/train.bin', np.uint16)[:4000])
    judge = NgramJudge()
    judge.fit([text[i:i + 24] for i in range(0, 2400, 24)], ['zq' * 12 for _ in range(100)])
    judge.save(str(tmp_path / 'instrument.json'), tokenization)
    script = os.path.join(ROOT, 'benchmarks', 'bench_channels.py')
    common = ['--run', str(run), '--judge', char_ckpt, '--judge_flops', '1e9', '--k', '4', '--steps', '16',
              '--game_lr', '3e-3', '--seeds', '1', '--ppl_windows', '12', '--device', 'cpu']
    r = run_script(script, *common, '--channel', 'game')
    assert r.returncode == 2 and '--instrument' in r.stderr and 'Traceback' not in r.stderr
    ce_base = None
    # the gated DPG starts from the seed's MLE control (--from_mle), its arm and controls read apart from the base's
    for channel, proposal, from_mle in (('game', 'policy', '0'), ('dpg', 'policy', '0'), ('dpg', 'gated', '1e9')):
        r = run_script(script, *common, '--channel', channel, '--instrument', str(tmp_path / 'instrument.json'),
                       '--proposal', proposal, '--from_mle', from_mle)
        assert r.returncode == 0, r.stderr[-3000:]
        digest = file_sha256(char_ckpt)[:8]
        tag = f'ckpt_{digest}_{channel}{"_gated" if proposal == "gated" else ""}_k4_a1_lr0.003_16steps'
        work = run / 'channels' / ('from_mle_1e+09' if from_mle != '0' else '')
        record = json.loads((work / f'{tag}_read12.json').read_text())['1']
        ce = {k: np.mean(v) for k, v in record['ce'].items()}
        assert ce['distilled'] < ce['base'] and ce['tilt'] < ce['base']
        # judge-off is the start itself (f = 0 leaves the weights): no run of its own was kept
        assert record['iters'] == 16 and record['kept']['judge_off'] is None and record['flops'] > 1e9
        played = load_checkpoint(str(work / f'{tag}_s1.pt'))
        assert played['config']['objective'] == ('dpg' if channel == 'dpg' else 'grpo')
        assert played['config']['proposal'] == proposal
        gaps = [h['proposal_gap'] for h in played['metrics']['history']]
        # GDC's gate: the gap read each step, and the proposal handed the policy's weights whenever it fell below 0
        assert (gaps == [None] * 16) if proposal == 'policy' else \
            played['metrics']['history'][-1]['proposal_updates'] == sum(g < 0 for g in gaps) > 0
        assert '| 1 |' in r.stdout and 'the base' in r.stdout
        start = run / 'channels' / 'mle_at_1e+09_flops_s1.pt' if from_mle != '0' else run / 'base_model_v1.pt'
        assert played['config']['policy_path'] == str(start) and record['start'] == str(start)
        assert (f'1: {start}' in r.stdout) == (from_mle != '0')
        ce_base = ce_base or ce['base']
        assert (ce['base'] == ce_base) == (from_mle == '0')  # the MLE start reads apart from the base
    r = run_script(script, *common, '--channel', 'dpg', '--from_mle', '-1')
    assert r.returncode == 2 and '--from_mle takes' in r.stderr and 'Traceback' not in r.stderr


def test_the_w_minus_1_anchor_keeps_every_candidate_and_moves_the_generator_towards_the_oracle(
        tmp_path, noise_gen, char_ckpt, char_data):
    """--keep=all: every candidate of each prompt kept with its weight w - 1 (summing to 0 over the prompt); the
    judge-off control's weights are all 0, so its windows add no gradient. Trained on those windows alone (a few small
    steps: the loss on the tilt's windows less the same loss on the base's own is unbounded below, a first-order move
    near the base, docs/family_bound.md), the oracle's arm lowers val perplexity (44.8 -> 44.0 here) and the judge-off
    arm leaves it (weight decay alone moves it)."""
    def prepare(judge, out):
        r = run_script('prepare_tilt_data.py', f'--model_path={noise_gen}', f'--judge={judge}', '--scale=1', '--k=16',
                       '--windows=64', f'--out_dir={out}', '--device=cpu', f'--dataset={char_data}',
                       '--batch_prompts=32', '--keep=all')
        assert r.returncode == 0, r.stderr[-2000:]
        meta = json.loads((out / 'meta.json').read_text())
        return meta, np.fromfile(out / 'weights.bin', dtype=np.float32)
    tilt, w = prepare(char_ckpt, tmp_path / 'tilt')
    off, w_off = prepare('none', tmp_path / 'off')
    assert tilt['rows'] == 64 * 16 == len(w) and off['rows'] == 64 == len(w_off) and not w_off.any()
    assert np.allclose(w.reshape(64, 16).sum(1), 0, atol=1e-3) and w.min() >= -1
    assert tilt['f_kept'] > tilt['f_candidates'] + 5 and 1 <= tilt['ess'] < 16

    def val_ppl(name):
        r = train_tiny(char_data, str(tmp_path / f'd_{name}'), f'--init_from={noise_gen}',
                       f'--mix_dir={tmp_path / name}', '--mix_fraction=1.0', '--max_iters=20', '--eval_interval=20',
                       '--decay_lr=False', '--learning_rate=3e-4')
        return [float(v) for v in re.findall(r'step \d+: .*val ppl ([\d.]+)', r.stdout)]
    start, anchored = val_ppl('tilt')
    off_start, off = val_ppl('off')
    assert off_start == start and anchored < 0.99 * start and abs(off / start - 1) < 1e-3
