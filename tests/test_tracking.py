"""Experiment tracking with the real packages: TensorBoard's event files and wandb's offline run files, read back."""
import glob
import json
import os
import struct

import pytest

from conftest import run_script
from model import load_checkpoint


def tensorboard_scalars(logdir):
    """{tag: [(step, value)]} of every event file under logdir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(logdir, size_guidance={'scalars': 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def wandb_history(run_dir):
    """The history rows of an offline wandb run: its .wandb file is a LevelDB-style log of protobuf records (a
    7-byte header, then 32 KiB blocks of chunks with a 7-byte header each: checksum, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(glob.glob(os.path.join(run_dir, 'run-*.wandb'))[0], 'rb').read()
    rows, pos, buf = [], 7, b''
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof('record_type') == 'history':
                rows.append({i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            buf = b''
    return rows


def numeric_keys(row):
    return {k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_grpo_logs_its_jsonl_keys_to_tensorboard(tmp_path, char_ckpt, char_data, learnable_reward):
    """Every numeric key of each JSONL row reaches TensorBoard at that row's step, with the same value."""
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={learnable_reward}',
                   f'--out_path={tmp_path / "rm.pt"}', '--device=cpu', '--max_iters=20', '--eval_interval=10',
                   '--tensorboard_log=True', f'--tensorboard_dir={tmp_path / "tb_judge"}')
    assert r.returncode == 0, r.stderr[-2000:]
    judge = tensorboard_scalars(str(tmp_path / 'tb_judge'))
    assert {'val_loss', 'val_r2', 'val_boundary_error'} <= set(judge) and [s for s, _ in judge['val_loss']] == [0, 10, 20]
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "rm.pt"}',
                   f'--dataset={char_data}', f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--max_steps=3',
                   '--prompts_per_step=2', '--num_generations=2', '--eval_interval=2', '--ppl_max_tokens=500',
                   '--tensorboard_log=True', f'--tensorboard_dir={tmp_path / "tb"}')
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / 'p_log.jsonl')]
    scalars = tensorboard_scalars(str(tmp_path / 'tb'))
    assert set(scalars) == set().union(*map(numeric_keys, rows))
    for row in rows:
        for key in numeric_keys(row):
            assert (row['step'], pytest.approx(row[key], rel=1e-6, abs=1e-6)) in scalars[key], key


def test_wandb_offline_gets_train_and_spin_rows(tmp_path, char_data, char_ckpt):
    """wandb in offline mode (no network): train.py logs nanoGPT's losses at each evaluation and log step, SPIN its
    JSONL rows, each run under its name and group."""
    env = {'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'}
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={tmp_path / "base"}', '--n_layer=1',
                   '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--eval_iters=2',
                   '--max_iters=6', '--eval_interval=3', '--log_interval=2', '--device=cpu', '--compile=False',
                   '--wandb_log=True', '--wandb_run_name=base', '--wandb_group=g', env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    history = wandb_history(glob.glob(str(tmp_path / 'base' / 'wandb' / 'offline-run-*'))[0])
    evals = [h for h in history if 'val_loss' in h]
    assert [h['_step'] for h in evals] == [0, 3, 6] and {'train_loss', 'val_ppl', 'lr'} <= set(evals[0])
    assert [h['_step'] for h in history if 'loss' in h] == [0, 2, 4]
    r = run_script('train_spin.py', f'--policy_path={char_ckpt}', f'--dataset={char_data}', '--device=cpu',
                   f'--out_path={tmp_path / "spin" / "s.pt"}', '--max_steps=2', '--batch_size=2', '--eval_interval=2',
                   '--eval_prompts=4', '--ppl_max_tokens=500', '--wandb_log=True', env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = load_checkpoint(str(tmp_path / 'spin' / 's.pt'))['metrics']['history']
    history = wandb_history(glob.glob(str(tmp_path / 'spin' / 'wandb' / 'offline-run-*'))[0])
    assert [h['_step'] for h in history] == [0, 1]
    assert all(numeric_keys(row) <= set(h) and h['loss'] == pytest.approx(row['loss'])
               for row, h in zip(rows, history))


def test_a_cycle_run_groups_its_trainers(tmp_path):
    """run_cycles passes each trainer stage one run name under the cycle run's group, and one TensorBoard folder per
    stage under the run's; with tracking off it passes nothing."""
    from types import SimpleNamespace
    from tracking import tracking_args
    C = SimpleNamespace(wandb_log=True, wandb_project='p', wandb_run_name='', wandb_group='', tensorboard_log=True,
                        tensorboard_dir='', out_dir=str(tmp_path / 'myrun'))
    args = tracking_args(C, 'grpo_v1')
    assert '--wandb_group=myrun' in args and '--wandb_run_name=myrun/grpo_v1' in args
    assert f"--tensorboard_dir={tmp_path / 'myrun' / 'tensorboard' / 'grpo_v1'}" in args
    C.wandb_log = C.tensorboard_log = False
    assert tracking_args(C, 'grpo_v1') == []


def test_a_resumed_grpo_run_continues_its_wandb_run_and_tensorboard_steps(tmp_path, char_ckpt, char_data,
                                                                         learnable_reward, monkeypatch):
    """A run killed after logging step 4, its resume state at step 3, restarted with --resume=True: wandb continues
    the same run (one id for both processes) and TensorBoard holds each step once, 0 to 6, with the resumed run's
    values for steps 3 and 4 (the killed run's are purged). Tracking settings are no part of what a resume state
    must match."""
    import train_grpo
    import tracking
    from runtime import run_signature
    assert run_signature({'lr': 1, 'wandb_log': True, 'tensorboard_dir': 'a'}, []) == \
        run_signature({'lr': 1, 'wandb_log': False, 'tensorboard_dir': 'b'}, [])
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={learnable_reward}',
                   f'--out_path={tmp_path / "rm.pt"}', '--device=cpu', '--max_iters=10', '--eval_interval=10')
    assert r.returncode == 0, r.stderr[-2000:]
    args = [f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "rm.pt"}', f'--dataset={char_data}',
            f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--max_steps=7', '--prompts_per_step=2',
            '--num_generations=2', '--eval_interval=3', '--ppl_max_tokens=500', '--reward_threshold=2.0',
            '--resume=True', '--wandb_log=True', '--tensorboard_log=True', f'--tensorboard_dir={tmp_path / "tb"}']
    env = {'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = tracking.Tracker.log

    def log_then_die(self, row, step):
        log(self, row, step)
        if step == 4 and 'reward' in row:
            self.close()  # what was written so far stays on disk, as after a kill
            raise KeyboardInterrupt
    monkeypatch.setattr(tracking.Tracker, 'log', log_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_grpo.main(args)
    monkeypatch.undo()
    r = run_script('train_grpo.py', *args, env=env)
    assert r.returncode == 0 and 'resumed at step 3' in r.stdout, r.stderr[-2000:]
    runs = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*'))
    assert len(runs) == 2 and len({os.path.basename(p).rsplit('-', 1)[1] for p in runs}) == 1, runs
    rows = [json.loads(line) for line in open(tmp_path / 'p_log.jsonl')]
    reward = tensorboard_scalars(str(tmp_path / 'tb'))['reward']
    assert [s for s, _ in reward] == list(range(7))
    assert all(v == pytest.approx(row['reward'], rel=1e-6) for (_, v), row in zip(reward, rows))
