import math

import numpy as np
import pytest
import torch

from conftest import kill_after_save, run_script, train_tiny
from model import GPT, load_checkpoint
from train_spin import spin_loss


def test_spin_loss_matches_hand_computation():
    logp_real, ref_real = torch.tensor([-10.0, -20.0]), torch.tensor([-12.0, -19.0])
    logp_gen, ref_gen = torch.tensor([-30.0, -25.0]), torch.tensor([-28.0, -26.0])
    margins = [(-10 + 12) - (-30 + 28), (-20 + 19) - (-25 + 26)]  # 4, -2
    loss, m = spin_loss(logp_real, ref_real, logp_gen, ref_gen, beta=0.1)
    assert m.tolist() == pytest.approx(margins)
    assert loss.item() == pytest.approx(np.mean([math.log1p(math.exp(-0.1 * x)) for x in margins]))
    loss, _ = spin_loss(logp_real, ref_real, logp_gen, ref_gen, beta=0.5, loss_type='hinge')
    assert loss.item() == pytest.approx(np.mean([max(0.0, 1 - 0.5 * x) for x in margins]))
    assert spin_loss(ref_real, ref_real, ref_gen, ref_gen, 0.1)[0].item() == pytest.approx(math.log(2))


def spin(ckpt, data, out, *extra):
    r = run_script('train_spin.py', f'--policy_path={ckpt}', f'--dataset={data}', f'--out_path={out}',
                   '--device=cpu', '--batch_size=8', '--eval_prompts=32', '--ppl_max_tokens=2000', *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_checkpoint(str(out))['metrics']


def test_spin_raises_the_heldout_margin(tmp_path, char_ckpt, char_data):
    """On a tiny model whose samples differ from the corpus, a short SPIN run raises the margin
    (log pi - log pi_ref)(real) - (log pi - log pi_ref)(generated) on held-out val prompts (0 at the start, where the
    policy is its own reference), and the checkpoint loads as a generator."""
    m = spin(char_ckpt, char_data, tmp_path / 'spin.pt', '--max_steps=30', '--learning_rate=1e-3', '--beta=0.1',
             '--eval_interval=10', '--warmup_steps=2')
    assert m['start']['heldout_margin'] == pytest.approx(0.0, abs=1e-3)
    margins = [h['heldout_margin'] for h in m['history'] if 'heldout_margin' in h]
    assert len(margins) == 3 and margins[-1] > 1.0 and margins[-1] > margins[0], margins
    assert len(m['history']) == 30 and m['flops'] > 0
    assert GPT.from_checkpoint(str(tmp_path / 'spin.pt')).config.mode == 'generator'
    assert (tmp_path / 'spin_log.jsonl').read_text().count('\n') == 30


def test_spin_plays_against_earlier_iterates(tmp_path, char_ckpt, char_data, bpe_ckpt):
    """opponent_mix draws part of each batch from an earlier iterate; an opponent of another tokenization, or a mix
    without opponents, is a one-line error."""
    train_tiny(char_data, str(tmp_path / 'early'), '--max_iters=2', '--eval_interval=1')
    m = spin(char_ckpt, char_data, tmp_path / 'mix.pt', '--max_steps=3', '--eval_interval=3',
             f'--opponent_paths={tmp_path / "early" / "ckpt.pt"}', '--opponent_mix=0.5', '--nll_weight=1.0',
             '--loss_type=hinge')
    assert len(m['history']) == 3 and all(h['nll'] > 0 for h in m['history'])
    for extra in ([f'--opponent_paths={bpe_ckpt}', '--opponent_mix=0.5'], ['--opponent_mix=0.5']):
        r = run_script('train_spin.py', f'--policy_path={char_ckpt}', f'--dataset={char_data}', '--device=cpu',
                       f'--out_path={tmp_path / "bad.pt"}', '--max_steps=1', *extra)
        assert r.returncode == 2 and 'Traceback' not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / 'bad.pt').exists()


def test_interrupted_spin_resumes_to_the_uninterrupted_policy(tmp_path, char_ckpt, char_data, monkeypatch):
    """Killed right after its resume state of step 2 was written and restarted, SPIN ends with the policy of the run
    that was never stopped."""
    import train_spin
    args = [f'--policy_path={char_ckpt}', f'--dataset={char_data}', '--device=cpu', '--batch_size=4',
            '--eval_prompts=8', '--ppl_max_tokens=1000', '--max_steps=5', '--eval_interval=2', '--learning_rate=1e-3',
            '--nll_weight=1.0', '--resume=True']
    r = run_script('train_spin.py', *args, f'--out_path={tmp_path / "whole.pt"}')
    assert r.returncode == 0, r.stderr[-2000:]
    kill_after_save(monkeypatch, train_spin)
    with pytest.raises(KeyboardInterrupt):
        train_spin.main(args + [f'--out_path={tmp_path / "cut.pt"}'])
    r = run_script('train_spin.py', *args, f'--out_path={tmp_path / "cut.pt"}')
    assert r.returncode == 0 and not (tmp_path / 'cut_resume.pt').exists(), r.stderr[-2000:]
    a, b = load_checkpoint(str(tmp_path / 'whole.pt')), load_checkpoint(str(tmp_path / 'cut.pt'))
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert [h['loss'] for h in a['metrics']['history']] == [h['loss'] for h in b['metrics']['history']]
