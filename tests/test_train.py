import os
import shutil

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_MODEL, kill_after_save, run_script, spawn_two_ranks, train_tiny
from model import GPT, evaluate_perplexity, load_checkpoint


def test_train_resume_continues_iterations_and_optimizer(tmp_path, char_data):
    out = tmp_path / 'run'
    train_tiny(char_data, str(out), '--max_iters=20', '--eval_interval=10', '--lr_decay_iters=40')
    ckpt = load_checkpoint(str(out / 'ckpt.pt'))
    assert ckpt['iter_num'] == 20 and 'optimizer' in ckpt and ckpt['tokenization']['method'] == 'char'
    r = train_tiny(char_data, str(out), '--max_iters=40', '--eval_interval=10', '--lr_decay_iters=40',
                   '--init_from=resume')
    assert 'step 20:' in r.stdout and 'step 0:' not in r.stdout
    ckpt2 = load_checkpoint(str(out / 'ckpt.pt'))
    assert ckpt2['iter_num'] == 40
    assert ckpt2['optimizer']['state'][0]['step'] == 40  # AdamW state carried over, not restarted


def test_an_interrupted_run_resumes_to_the_weights_of_one_never_stopped(tmp_path, char_data, monkeypatch):
    """A run killed right after its resume state at iteration 10 was written, and started again with --resume=True,
    ends with the weights, kept iteration, stopper and log lines of the run that was never stopped (the drawn batch,
    dropout's generator and AdamW come back; the evaluation at 10 is not read twice). Its state goes at the end, and the
    same command run again after it is not played again; a state written with other settings is not continued."""
    import train
    args = [f'--dataset={char_data}', *TINY_MODEL, '--max_iters=30', '--lr_decay_iters=30', '--eval_interval=5',
            '--dropout=0.2', '--select_tokens=2000', '--always_save_checkpoint=False', '--patience=3', '--resume=True']
    whole = run_script('train.py', *args, f'--out_dir={tmp_path / "whole"}')
    assert whole.returncode == 0, whole.stderr[-2000:]
    cut = tmp_path / 'cut'
    saves = []
    kill_after_save(monkeypatch, train, at=10, saves=saves)
    with pytest.raises(KeyboardInterrupt):
        train.main(args + [f'--out_dir={cut}'])
    assert saves == [0, 5, 10] and (cut / 'ckpt_resume.pt').exists()
    monkeypatch.undo()
    r = run_script('train.py', *args, f'--out_dir={cut}')
    assert r.returncode == 0 and 'resumed at iteration 10' in r.stdout, r.stderr[-2000:]
    assert not (cut / 'ckpt_resume.pt').exists() and not (tmp_path / 'whole' / 'ckpt_resume.pt').exists()
    a, b = load_checkpoint(str(tmp_path / 'whole' / 'ckpt.pt')), load_checkpoint(str(cut / 'ckpt.pt'))
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert [a[k] for k in ('iter_num', 'stopped_at', 'early_stopping')] \
        == [b[k] for k in ('iter_num', 'stopped_at', 'early_stopping')]
    steps = lambda out: [l for l in out.splitlines() if l.startswith('step ')]  # noqa: E731
    assert steps(r.stdout) == steps(whole.stdout)[3:]  # from iteration 15 on, the same readings
    # the same command once more after its end is not played again over its checkpoint
    before = (cut / 'ckpt.pt').read_bytes()
    r = run_script('train.py', *args, f'--out_dir={cut}')
    assert r.returncode == 0 and 'finished: nothing to resume' in r.stdout and 'step ' not in r.stdout, r.stderr[-2000:]
    assert (cut / 'ckpt.pt').read_bytes() == before
    # a state written with other settings is not continued: the run starts afresh
    kill_after_save(monkeypatch, train, at=10)
    with pytest.raises(KeyboardInterrupt):
        train.main(args + [f'--out_dir={tmp_path / "other"}'])
    monkeypatch.undo()
    r = run_script('train.py', *args, f'--out_dir={tmp_path / "other"}', '--learning_rate=1e-3')
    assert r.returncode == 0 and 'not resuming' in r.stdout and 'resumed at' not in r.stdout, r.stderr[-2000:]


def test_training_lowers_val_loss_and_is_deterministic(tmp_path, char_data):
    runs = []
    for name in ('a', 'b'):  # the second in a fresh interpreter: another hash seed, as another user's run has
        r = train_tiny(char_data, str(tmp_path / name), '--max_iters=30', '--eval_interval=30', fresh=name == 'b')
        runs.append(r.stdout)
    losses = [float(l.split('val loss ')[1].split(',')[0]) for l in runs[0].splitlines() if l.startswith('step')]
    assert losses[-1] < losses[0] - 0.5
    sd_a = load_checkpoint(str(tmp_path / 'a' / 'ckpt.pt'))['model']
    sd_b = load_checkpoint(str(tmp_path / 'b' / 'ckpt.pt'))['model']
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_early_stopping_triggers_and_state_is_saved(tmp_path, char_data):
    out = tmp_path / 'es'
    r = train_tiny(char_data, str(out), '--max_iters=200', '--eval_interval=5', '--patience=2', '--min_delta=100.0',
                   '--val_ppl=end')
    assert 'early stopping' in r.stdout
    assert 'step 10:' in r.stdout and 'step 15:' not in r.stdout  # the first eval sets the best, 2 more fail
    # with val_ppl=end the perplexity is computed once, at the evaluation that ends the run
    steps = [line for line in r.stdout.splitlines() if line.startswith('step ')]
    assert ['val ppl' in line for line in steps] == [False, False, True] and 'final:' in r.stdout
    ckpt = load_checkpoint(str(out / 'ckpt.pt'))
    assert ckpt['early_stopping']['bad_evals'] == 2


def test_val_ppl_off_reports_none_and_a_bad_value_is_named(tmp_path, char_data):
    r = train_tiny(char_data, str(tmp_path / 'off'), '--max_iters=10', '--eval_interval=5', '--val_ppl=off')
    assert 'val ppl' not in r.stdout and 'final: train loss' in r.stdout
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={tmp_path / "bad"}', '--val_ppl=sometimes')
    assert r.returncode != 0 and "--val_ppl='sometimes' is not one of every_eval, end, off" in r.stderr
    assert 'Traceback' not in r.stderr and not (tmp_path / 'bad').exists()


def test_eval_only_reports_whole_split_perplexity(tmp_path, char_data, char_ckpt):
    out = os.path.dirname(char_ckpt)
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={out}', '--init_from=resume', '--eval_only=True',
                   '--eval_iters=2', '--device=cpu', '--block_size=32', '--batch_size=4')
    assert r.returncode == 0, r.stderr
    reported = float(r.stdout.split('val ppl ')[1].split()[0])
    model = GPT.from_checkpoint(char_ckpt)
    val = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    assert reported == pytest.approx(evaluate_perplexity(model, val, 32)[1], rel=1e-3)


def test_bad_config_is_one_line_error(tmp_path, char_data):
    r = run_script('train.py', f'--dataset={char_data}', '--n_layers=3')
    assert r.returncode == 2 and "unknown config key 'n_layers'" in r.stderr and 'Traceback' not in r.stderr
    r = run_script('train.py', f'--dataset={tmp_path}')
    assert r.returncode == 2 and 'train.bin not found' in r.stderr and 'Traceback' not in r.stderr
    r = run_script('train.py', f'--dataset={char_data}', '--batch_size=big')
    assert r.returncode == 2 and '--batch_size expects a int' in r.stderr


def test_ddp_two_processes_gloo(tmp_path, char_data):
    out = tmp_path / 'ddp'
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py',
                   f'--dataset={char_data}', f'--out_dir={out}', '--n_layer=1', '--n_head=2', '--n_embd=16',
                   '--block_size=16', '--batch_size=4', '--eval_iters=2', '--max_iters=6', '--eval_interval=3',
                   '--gradient_accumulation_steps=2', '--device=cpu', '--backend=gloo', '--compile=False',
                   env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 6
    # nanoGPT's config with one accumulation step under two ranks: a one-line error naming the fix
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py',
                   f'--dataset={char_data}', f'--out_dir={tmp_path / "bad"}', '--n_layer=1', '--n_head=2',
                   '--n_embd=16', '--block_size=16', '--max_iters=2', '--device=cpu', '--backend=gloo',
                   '--compile=False', env={'OMP_NUM_THREADS': '1'})
    assert r.returncode != 0 and 'AssertionError' not in r.stderr
    assert 'must divide by the 2 processes' in r.stderr and '--gradient_accumulation_steps=2' in r.stderr


def _close_after_rank0_writes(rank, world, port, marker):
    """One rank of the shutdown check: rank 0 is slow to finish (as when it writes the checkpoint); rank 1 notes
    whether rank 0 had finished by the time its own close() returned."""
    import time
    from contextlib import nullcontext
    import torch.distributed as dist
    from runtime import Runtime
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    rt = Runtime('cpu', 'cpu', nullcontext(), torch.float32, ddp=True, rank=rank, world_size=world)
    if rank == 0:
        time.sleep(1.5)
        open(marker, 'w').close()
    rt.close()
    if rank == 1:
        with open(f'{marker}.seen_by_1', 'w') as f:
            f.write(str(os.path.exists(marker)))


def test_no_rank_leaves_the_process_group_before_the_others(tmp_path):
    """Runtime.close() waits for every rank: a rank that tore down its gloo connections while rank 0 still wrote its
    outputs aborted now and then (CI, the torchrun GRPO test)."""
    marker = str(tmp_path / 'rank0_finished')
    spawn_two_ranks(_close_after_rank0_writes, marker)
    assert open(f'{marker}.seen_by_1').read() == 'True'


RANK_THAT_LEAVES_A_THREAD_RUNNING = '''
import sys, threading, time
from configurator import UserError, run_cli
def main(argv):
    threading.Thread(target=time.sleep, args=(3600,)).start()  # stands in for gloo's workers still busy at exit
    print('outputs written', end='')
    if argv:
        raise UserError('bad value: use another')
run_cli(main)
'''


@pytest.mark.parametrize('argv, code', [([], 0), (['--bad'], 2)])
def test_a_torchrun_rank_ends_without_interpreter_teardown(tmp_path, argv, code):
    """Under torchrun run_cli ends the process once main is done, without waiting on threads or finalizing the
    interpreter (where gloo's busy workers aborted a rank now and then: the CI failure of the torchrun tests). Its
    buffered output still arrives and its exit code stands. Without the early exit this run never ends."""
    script = tmp_path / 'rank.py'
    script.write_text(RANK_THAT_LEAVES_A_THREAD_RUNNING)
    r = run_script(str(script), *argv, env={'RANK': '1', 'PYTHONPATH': str(ROOT)}, timeout=60)
    assert r.returncode == code and r.stdout == 'outputs written'
    assert ('error: bad value: use another' in r.stderr) == bool(code)


RANK_WHOSE_LOCALS_HANG_WHEN_FREED = '''
import time
from configurator import run_cli
from runtime import Runtime
class FreedOnReturn:  # stands in for a DDP model whose freeing joined gloo's workers with the GIL held, and hung
    def __del__(self):
        time.sleep(3600)
def main(argv):
    held = FreedOnReturn()
    rt = Runtime('cpu', 'cpu', None, None)
    print('outputs written', end='')
    rt.close()
    print(' after close', end='')
run_cli(main)
'''


def test_a_torchrun_rank_ends_at_runtime_close_before_its_locals_are_freed(tmp_path):
    """Runtime.close ends a rank torchrun started, so nothing of its script is freed after it: a train.py rank once
    hung for good there, its DDP model's destructor joining a gloo worker that waited for the GIL. Without the exit in
    close this run never ends; the output before close arrives, nothing after it runs, and the exit code is 0."""
    script = tmp_path / 'rank.py'
    script.write_text(RANK_WHOSE_LOCALS_HANG_WHEN_FREED)
    r = run_script(str(script), env={'RANK': '1', 'PYTHONPATH': str(ROOT)}, timeout=60)
    assert r.returncode == 0 and r.stdout == 'outputs written', r.stderr[-2000:]


def test_sample_uses_checkpoint_tokenization(char_ckpt):
    r = run_script('sample.py', f'--ckpt_path={char_ckpt}', '--start=KING:', '--num_samples=2', '--max_new_tokens=40',
                   '--device=cpu')
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split('---------------\n')
    assert samples[0].startswith('KING:') and len(samples[0].rstrip('\n')) == 45
    r2 = run_script('sample.py', f'--ckpt_path={char_ckpt}', '--start=KING:', '--num_samples=2', '--max_new_tokens=40',
                    '--device=cpu')
    assert r2.stdout == r.stdout  # seeded


def test_a_moved_char_checkpoint_samples_with_its_own_vocabulary(tmp_path, char_ckpt):
    """A char checkpoint carries its vocabulary: with its meta.pkl gone (the data deleted, the checkpoint copied to
    another machine) it samples as one written before it carried it, which reads its meta.pkl, does."""
    ckpt = torch.load(char_ckpt, weights_only=True)
    assert sorted(ckpt['tokenization']['itos']) == list(range(ckpt['tokenization']['vocab_size']))
    moved, old = tmp_path / 'moved.pt', tmp_path / 'old.pt'
    gone = str(tmp_path / 'gone' / 'meta.pkl')
    torch.save({**ckpt, 'tokenization': {**ckpt['tokenization'], 'meta_path': gone}}, moved)
    torch.save({**ckpt, 'tokenization': {k: v for k, v in ckpt['tokenization'].items() if k != 'itos'}}, old)
    args = ['--start=KING:', '--num_samples=2', '--max_new_tokens=40', '--device=cpu']
    r_moved, r_old = (run_script('sample.py', f'--ckpt_path={p}', *args) for p in (moved, old))
    assert r_moved.returncode == 0 and r_old.returncode == 0, r_moved.stderr[-2000:] + r_old.stderr[-2000:]
    assert r_moved.stdout.startswith('KING:') and r_moved.stdout == r_old.stdout


def test_bpe_checkpoint_trains_and_samples(bpe_ckpt):
    ckpt = load_checkpoint(bpe_ckpt)
    assert ckpt['tokenization'] == {'method': 'bpe', 'vocab_size': 50257, 'meta_path': None}
    assert ckpt['model_args']['vocab_size'] == 50304
    r = run_script('sample.py', f'--ckpt_path={bpe_ckpt}', '--start=The king', '--num_samples=1',
                   '--max_new_tokens=5', '--device=cpu')
    assert r.returncode == 0 and r.stdout.startswith('The king')


def test_continued_training_keeps_its_best_checkpoint_even_the_start(tmp_path, char_data, char_ckpt):
    """The MLE control's rule: from a checkpoint, with the base's early stopping and only improvements saved, a run
    whose every step makes val loss worse (a huge learning rate) stops after `patience` evaluations and keeps the
    model it started from; the checkpoint says where it stopped and why."""
    out = tmp_path / 'worse'
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={out}', f'--init_from={char_ckpt}',
                   '--max_iters=40', '--eval_interval=5', '--eval_iters=2', '--batch_size=8', '--block_size=32',
                   '--learning_rate=1.0', '--decay_lr=False', '--always_save_checkpoint=False', '--patience=2',
                   '--min_delta=0.002', '--device=cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    kept, start = load_checkpoint(str(out / 'ckpt.pt')), load_checkpoint(char_ckpt)
    assert kept['iter_num'] == 0 and kept['stopped_at'] == 10 and kept['stop_reason'].startswith('early stopping')
    assert all(torch.equal(kept['model'][k], start['model'][k]) for k in start['model'])


def test_select_tokens_choose_the_checkpoint_instead_of_val(tmp_path, char_data):
    """With select_tokens the held-out tail of train.bin, not val, decides early stopping and the kept checkpoint:
    a tail of random characters, which training on the text only makes less likely, stops the run at its patience
    and keeps iteration 0, where val alone would have kept training."""
    data = tmp_path / 'data'
    data.mkdir()
    for name in ('val.bin', 'meta.pkl'):
        shutil.copy(os.path.join(char_data, name), data / name)
    train = np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16)
    noise = np.random.default_rng(0).integers(0, train.max() + 1, 5000).astype(np.uint16)
    np.concatenate([train, noise]).tofile(data / 'train.bin')
    args = ('--max_iters=60', '--eval_interval=10', '--always_save_checkpoint=False', '--patience=2',
            '--min_delta=0.0', '--decay_lr=False', '--learning_rate=3e-3')
    on_val = train_tiny(str(data), str(tmp_path / 'val'), *args)
    on_select = train_tiny(str(data), str(tmp_path / 'select'), *args, '--select_tokens=5000')
    assert 'early stopping' not in on_val.stdout and load_checkpoint(str(tmp_path / 'val' / 'ckpt.pt'))['iter_num'] > 0
    kept = load_checkpoint(str(tmp_path / 'select' / 'ckpt.pt'))
    assert kept['iter_num'] == 0 and kept['stopped_at'] == 20 and 'select loss did not improve' in kept['stop_reason']
    assert 'select loss' in on_select.stdout and kept['metrics']['select_loss'] == kept['best_val_loss']
    r = run_script('train.py', f'--dataset={data}', *TINY_MODEL, '--select_tokens=50')
    assert r.returncode == 2 and '--select_tokens=50 must leave' in r.stderr and 'Traceback' not in r.stderr


def test_select_pass_reads_the_whole_held_out_tail(tmp_path, char_data):
    """--select_pass: the select loss is the mean cross-entropy of one whole pass over the held-out tail of train.bin
    (the kept checkpoint's own figure, recomputed here), not a few random batches; without select_tokens it is a
    one-line error."""
    out = tmp_path / 'run'
    train_tiny(char_data, str(out), '--max_iters=20', '--eval_interval=10', '--select_tokens=3000',
               '--select_pass=True', '--eval_iters=1')
    kept = load_checkpoint(str(out / 'ckpt.pt'))
    tail = np.fromfile(os.path.join(char_data, 'train.bin'), dtype=np.uint16)[-3000:]
    whole = evaluate_perplexity(GPT.from_checkpoint(kept), tail, 32)[0]
    assert kept['metrics']['select_loss'] == pytest.approx(whole, rel=1e-5)
    r = run_script('train.py', f'--dataset={char_data}', *TINY_MODEL, '--select_pass=True')
    assert r.returncode == 2 and '--select_tokens=N' in r.stderr and 'Traceback' not in r.stderr
