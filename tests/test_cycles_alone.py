"""The cycles that need no shared run: GPT-2 BPE end to end, and SPIN. A module of their own, so that pytest-xdist
runs them beside tests/test_cycles.py's (each module stays on one worker; that one holds the two-cycle fixture)."""
import json
import os

import pytest
import torch

from model import load_checkpoint
from test_cycles import assert_consistent, cycles, stages_run


def test_bpe_cycle_runs_every_stage(tmp_path, bpe_data):
    """GPT-2 BPE end to end on a tiny model: base, reward data, judge, GRPO and the instruments with a fresh judge.
    The controls are the same stages on other checkpoints (train.py from a checkpoint, GRPO, evaluate), run on BPE by
    test_train and here, and as controls by the char cycle tests."""
    out = tmp_path / 'bpe'
    stdout = cycles(out, bpe_data, '--num_cycles=1', '--block_size=24', '--eval_num_samples=8', '--base_eval_iters=2',
                    '--control_temperatures=1.0', '--controls=False', '--judge_seeds=1', '--base_max_iters=10',
                    '--base_eval_interval=10')  # a 50,257-token softmax costs 0.3 s an iteration here
    assert 'finished: num_cycles (1)' in stdout
    for name in ('base_model_v2.pt', 'eval_v1.json', 'eval_v2.json', 'reward_model_v1.pt'):
        assert (out / name).exists(), name
    assert load_checkpoint(str(out / 'base_model_v2.pt'))['tokenization']['method'] == 'bpe'
    assert load_checkpoint(str(out / 'base_model_v1.pt'))['config']['eval_iters'] == 2
    e = json.loads((out / 'eval_v2.json').read_text())[0]
    assert 0 <= e['unknown_word_rate'] <= 1 and e['val_perplexity'] > 1 and e['fresh_judge_n'] == 1
    assert 0 <= e['c2st_auc'] <= 1 and 'mauve' in e


def test_spin_cycles_run_with_the_same_instruments_and_controls(tmp_path, char_data):
    """trainer='spin': no judge stages; SPIN writes each new base (cycle 2 playing partly against base v1), every
    version is measured by the same instruments and controls, the MLE control matched to SPIN's own FLOPs.
    base_select_tokens (any trainer): base v1 and the MLE control both keep the checkpoint that the last N train
    tokens choose, held out of their training, so val chooses nothing, read whole with base_select_pass; the verdict
    and report say so. base_min_lr ends base v1's cosine, and its MLE controls hold that rate."""
    out = tmp_path / 'spin'
    stdout = cycles(out, char_data, '--num_cycles=2', '--trainer=spin', '--spin_max_steps=3', '--spin_batch_size=4',
                    '--spin_opponent_mix=0.5', '--control_temperatures=1.0', '--judge_seeds=1', '--tensorboard_log=True',
                    '--base_select_tokens=2000', '--base_select_pass=True', '--base_min_lr=1e-4')
    assert 'finished: num_cycles (2)' in stdout
    assert not any(s.startswith(('cycle 1: reward', 'cycle 1: GRPO')) for s in stages_run(stdout))
    assert 'cycle 2: SPIN -> base v3' in stages_run(stdout)
    for name in ('base_model_v2.pt', 'base_model_v3.pt', 'spin_v1_log.jsonl', 'spin_v2_log.jsonl', 'mle_v3.pt',
                 'verdict_v2.json'):
        assert (out / name).exists(), name
    assert not (out / 'reward_model_v1.pt').exists()
    spin_cfg = load_checkpoint(str(out / 'base_model_v3.pt'))['config']
    assert spin_cfg['opponent_mix'] == 0.5 and spin_cfg['opponent_paths'].endswith('base_model_v1.pt')
    v = json.loads((out / 'verdict_v1.json').read_text())
    assert v['cycle_flops'] == load_checkpoint(str(out / 'base_model_v2.pt'))['metrics']['flops']
    report = (out / 'report.md').read_text()
    assert '(SPIN)' in report and 'held-out margin' in report and 'Cycle 2 verdict' in report
    assert 'best loss on the last 2,000 train tokens, held out of training' in report
    for name in ('base_model_v1.pt', 'mle_v2.pt', 'mle_v3.pt'):
        ckpt = load_checkpoint(str(out / name))
        assert ckpt['config']['select_tokens'] == 2000 and ckpt['best_val_loss'] == ckpt['metrics']['select_loss']
        assert ckpt['config']['select_pass']
    # base_min_lr: where base v1's cosine ends, and the rate its MLE controls hold
    assert load_checkpoint(str(out / 'base_model_v1.pt'))['config']['min_lr'] == 1e-4
    assert load_checkpoint(str(out / 'mle_v2.pt'))['config']['learning_rate'] == 1e-4
    assert v['mle_select_tokens'] == 2000
    assert_consistent(out)
    # tracking on: each trainer stage its own TensorBoard folder under the run's, with the trainer's own keys
    from test_tracking import tensorboard_scalars
    assert {'base_v1', 'spin_v1', 'spin_v2', 'mle_v2', 'mle_v3'} <= set(os.listdir(out / 'tensorboard'))
    assert {'loss', 'margin', 'heldout_margin'} <= set(tensorboard_scalars(str(out / 'tensorboard' / 'spin_v2')))
    assert 'val_loss' in tensorboard_scalars(str(out / 'tensorboard' / 'base_v1'))


def test_base_hold_iters_trains_the_cosines_kept_checkpoint_on_at_its_final_rate(tmp_path, char_data):
    """base_hold_iters: base v1 is its cosine's kept checkpoint (base_cosine_v1.pt) trained on at the cosine's final
    learning rate held, its best checkpoint by the same selection kept (the MLE control's recipe): never worse on the
    selection split than the cosine, and the rest of the run reads it as base v1."""
    out = tmp_path / 'hold'
    stdout = cycles(out, char_data, '--num_cycles=0', '--base_min_lr=1e-4', '--base_hold_iters=20',
                    '--base_select_pass=True', '--eval_num_samples=8', '--judge_seeds=1')
    assert stages_run(stdout)[:3] == ['base v1', 'base v1 held', 'evaluate v1']
    cosine, held = (load_checkpoint(str(out / n)) for n in ('base_cosine_v1.pt', 'base_model_v1.pt'))
    assert held['config']['init_from'] == str(out / 'base_cosine_v1.pt') and held['config']['learning_rate'] == 1e-4
    assert held['config']['decay_lr'] is False and held['config']['max_iters'] == 20
    assert held['best_val_loss'] <= cosine['best_val_loss'] + 1e-6
    assert held['held_out'] == cosine['held_out']
    assert_consistent(out)
    assert '[skip] base v1 held' in cycles(out, char_data, '--num_cycles=0', '--base_min_lr=1e-4',
                                           '--base_hold_iters=20', '--base_select_pass=True', '--eval_num_samples=8',
                                           '--judge_seeds=1')


def test_a_killed_base_stage_goes_on_from_its_last_evaluation(tmp_path, char_data, monkeypatch, capsys):
    """base v1 killed right after train.py wrote its resume state at iteration 10 (of 30): run_cycles, run again,
    goes on from there in the stage's work folder (train.py --resume=True), and base v1 is the weights of the run
    never stopped; the stage's log holds both parts."""
    import train
    from conftest import ROOT, kill_after_save
    args = ['--num_cycles=0', '--eval_num_samples=8', '--judge_seeds=1', '--dropout=0.1']
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    cycles(whole, char_data, *args)
    command = json.loads((whole / 'manifests' / 'base_v1.json').read_text())['command']
    kill_after_save(monkeypatch, train, at=10)  # the kill, with the state of iteration 10 on disk
    with pytest.raises(KeyboardInterrupt):
        train.main([f'--out_dir={cut / "base_model_v1.pt.work"}'] + [a.replace('$ROOT', ROOT, 1) for a in command[1:]]
                   + ['--resume=True'])
    monkeypatch.undo()
    (cut / 'logs').mkdir()
    (cut / 'logs' / 'base_v1.log').write_text(capsys.readouterr().out)  # what run_cycles had logged of it
    stdout = cycles(cut, char_data, *args)
    assert stages_run(stdout)[:2] == ['base v1', 'evaluate v1']
    log = (cut / 'logs' / 'base_v1.log').read_text()
    killed, resumed = log.split('resumed at iteration 10')
    assert 'step 10:' in killed and 'step 10:' not in resumed and 'step 30:' in resumed
    a, b = (load_checkpoint(str(d / 'base_model_v1.pt')) for d in (whole, cut))
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model']) and a['iter_num'] == b['iter_num']
    assert not (cut / 'base_model_v1.pt.work').exists()
    assert_consistent(cut)
