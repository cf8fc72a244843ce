import json
import math
import os
import sys

import numpy as np
import pytest
import torch

from conftest import kill_after_save, positive_control_run, run_script, same_weights, spawn_two_ranks
from model import GPT, GPTConfig, load_checkpoint
from policy import completion_mask, sample_prompts, token_logprobs
from train_grpo import group_advantages, grpo_loss, token_advantages_of


def test_group_advantages_and_zero_std_groups():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.4])
    adv, zero, group_std = group_advantages(r, 2, 'group')
    std = math.sqrt(0.5)  # unbiased std of (1, 0)
    assert group_std == pytest.approx((std + 0 + math.sqrt(0.02)) / 3)  # the raw std of each group, averaged
    assert torch.allclose(adv[:2], torch.tensor([0.5, -0.5]) / (std + 1e-4))
    assert torch.equal(adv[2:4], torch.zeros(2)) and zero == 1  # equal rewards: zero advantage, no NaN
    adv_b, _, _ = group_advantages(r, 2, 'batch')
    assert torch.allclose(adv_b[:2], torch.tensor([0.5, -0.5]) / (r.std() + 1e-4))
    adv_n, _, _ = group_advantages(r, 2, 'none')
    assert torch.allclose(adv_n, torch.tensor([0.5, -0.5, 0, 0, -0.1, 0.1]))
    all_same, zero, group_std = group_advantages(torch.full((4,), 0.3), 4, 'group')
    assert torch.equal(all_same, torch.zeros(4)) and zero == 1 and not torch.isnan(all_same).any() and group_std == 0


def test_completion_mask_covers_only_generated_tokens():
    mask = completion_mask(torch.tensor([1, 3]), 5)  # targets are tokens 1..4
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]


def hand_case():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, -2.0]])
    old = torch.tensor([[-1.2, -1.0, -0.5], [-0.3, -1.0, -2.5]])
    ref = torch.tensor([[-1.1, -2.0, -0.4], [-0.5, -1.5, -2.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    return logps, old, ref, adv, mask


def per_token_by_hand(logps, old, ref, adv, eps, beta):
    out = []
    for b in range(2):
        row = []
        for t in range(3):
            ratio = math.exp(logps[b, t] - old[b, t])
            a = float(adv[b])
            pg = -min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)
            d = float(ref[b, t] - logps[b, t])
            row.append(pg + beta * (math.exp(d) - d - 1))
        out.append(row)
    return out


@pytest.mark.parametrize('loss_type', ['grpo', 'dr_grpo', 'dapo'])
def test_loss_types_match_hand_computation(loss_type):
    logps, old, ref, adv, mask = hand_case()
    loss, stats = grpo_loss(logps, old, ref, adv, mask, epsilon=0.2, beta=0.1, loss_type=loss_type,
                            max_completion_length=4)
    tok = per_token_by_hand(logps, old, ref, adv, 0.2, 0.1)
    m = mask.tolist()
    if loss_type == 'grpo':
        expected = np.mean([sum(tok[b][t] * m[b][t] for t in range(3)) / sum(m[b]) for b in range(2)])
    elif loss_type == 'dr_grpo':
        expected = sum(tok[b][t] * m[b][t] for b in range(2) for t in range(3)) / (2 * 4)
    else:
        expected = sum(tok[b][t] * m[b][t] for b in range(2) for t in range(3)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_k3_kl_zero_at_reference_positive_elsewhere():
    logps, old, ref, adv, mask = hand_case()
    _, stats = grpo_loss(logps, old, logps.clone(), adv, mask, beta=0.1)
    assert stats['kl'] == pytest.approx(0.0, abs=1e-7)
    _, stats = grpo_loss(logps, old, ref, adv, mask, beta=0.1)
    assert stats['kl'] > 0


def test_ratio_one_on_first_pass_and_clip_counting():
    logps, old, ref, adv, mask = hand_case()
    loss, stats = grpo_loss(logps, logps.detach(), None, adv, mask)
    assert stats['clip_ratio'] == 0.0
    # ratio 1: the loss is minus the advantage-weighted mean, and its gradient is the plain policy gradient
    assert loss.item() == pytest.approx(-(1.0 * 1 + (-2.0) * 1) / 2)
    # clipping counted: row 0 token 1 has ratio e^-1 < 0.8 with A > 0 (not clipped: min keeps ratio*A);
    # row 1 token 1 has ratio e^-0.5 < 0.8 with A < 0 (clipped); row 1 token 2 ratio e^0.5 > 1.2 with A < 0 (not)
    _, stats = grpo_loss(logps, old, None, adv, mask, epsilon=0.2)
    assert stats['clip_ratio'] == pytest.approx(1 / 5)
    _, stats = grpo_loss(logps, old, None, adv, mask, epsilon=0.2, epsilon_high=0.1)
    assert stats['clip_ratio'] == pytest.approx(1 / 5)


def test_prompts_come_from_the_train_split():
    train = np.arange(1000, dtype=np.uint16)
    prompts, lengths, windows = sample_prompts(train, 50, 1, 8, 16, np.random.default_rng(0))
    assert lengths.min() >= 1 and lengths.max() <= 8 and prompts.shape == (50, 8)
    for p, L in zip(prompts, lengths):
        assert np.array_equal(np.diff(p[:L]), np.ones(L - 1))  # a contiguous window of the split
    assert windows.shape == (50, 16) and np.array_equal(windows[:, :8] * (prompts > 0), prompts)
    assert (np.diff(windows, axis=1) == 1).all()  # each prompt's natural continuation, from the same offset


@pytest.fixture(scope='module')
def known_answer_run(tmp_path_factory, char_ckpt, char_data, learnable_reward):
    """The reward model here rewards particular last characters: the policy must learn to end on them."""
    d = tmp_path_factory.mktemp('grpo')
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={learnable_reward}',
                   f'--out_path={d / "rm.pt"}', '--device=cpu', '--max_iters=300', '--learning_rate=3e-3',
                   '--batch_size=16', '--eval_interval=50')
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}',
                   f'--dataset={char_data}', f'--out_path={d / "policy.pt"}', '--device=cpu', '--max_steps=30',
                   '--learning_rate=3e-3', '--warmup_steps=3', '--eval_interval=10', '--beta=0.04',
                   '--num_iterations=2', '--reward_threshold=2.0')
    assert r.returncode == 0, r.stderr[-3000:]
    return d, r.stdout


def test_grpo_raises_the_reward_on_a_known_case(known_answer_run):
    d, stdout = known_answer_run
    history = load_checkpoint(str(d / 'policy.pt'))['metrics']['history']
    rewards = [h['reward'] for h in history]
    assert len(rewards) == 30
    assert np.mean(rewards[-10:]) > np.mean(rewards[:10]) + 0.05
    assert all(set(h) >= {'reward', 'reward_std', 'kl', 'clip_ratio'} for h in history)
    assert any(h['clip_ratio'] > 0 for h in history)  # mu=2: the second pass is off-policy and can clip
    assert 'stopped by max_steps' in stdout
    m = load_checkpoint(str(d / 'policy.pt'))['metrics']
    assert m['final_val_ppl'] == history[-1]['val_ppl'] and m['final_kl'] > 0 and m['flops'] > 0
    assert all(0 <= h['reward_group_std'] <= 0.5 for h in history)
    assert (d / 'policy_curves.png').read_bytes()[:4] == b'\x89PNG'
    lines = open(d / 'policy_log.jsonl').read().splitlines()
    assert len(lines) == 30 and json.loads(lines[0])['step'] == 0


def test_grpo_checkpoint_loads_in_the_other_scripts(known_answer_run, char_data, tmp_path):
    d, _ = known_answer_run
    ckpt = load_checkpoint(str(d / 'policy.pt'))
    assert ckpt['model_args']['mode'] == 'generator' and ckpt['metrics']['stop_reason'] == 'max_steps'
    assert GPT.from_checkpoint(str(d / 'policy.pt')).config.mode == 'generator'
    r = run_script('sample.py', f'--ckpt_path={d / "policy.pt"}', '--max_new_tokens=10', '--num_samples=1',
                   '--device=cpu')
    assert r.returncode == 0, r.stderr
    r = run_script('prepare_reward_data.py', '--model_path', str(d / 'policy.pt'), '--input_mode', 'binary',
                   '--train_bin', os.path.join(char_data, 'train.bin'), '--val_bin', os.path.join(char_data, 'val.bin'),
                   '--output_dir', str(tmp_path / 'rd'), '--device', 'cpu', '--max_blocks', '2')
    assert r.returncode == 0, r.stderr
    out = tmp_path / 'continued'
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={out}', f'--init_from={d / "policy.pt"}',
                   '--max_iters=3', '--eval_interval=3', '--eval_iters=2', '--batch_size=4', '--block_size=32',
                   '--device=cpu')
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 3


def test_max_kl_stops_and_keeps_the_last_policy_under_the_cap(tmp_path, known_answer_run, char_ckpt, char_data):
    d, _ = known_answer_run
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}',
                   f'--dataset={char_data}', f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--max_steps=30',
                   '--learning_rate=1e-2', '--warmup_steps=1', '--max_kl=0.02', '--beta=0.0', '--eval_interval=100')
    assert r.returncode == 0, r.stderr[-2000:]
    ckpt = load_checkpoint(str(tmp_path / 'p.pt'))
    assert ckpt['metrics']['stop_reason'].startswith('max_kl')
    history = ckpt['metrics']['history']
    assert history[-1]['kl'] > 0.02 and all(h['kl'] <= 0.02 for h in history[:-1])
    assert ckpt['iter_num'] == len(history) - 2  # the policy before the step whose rollouts broke the cap
    m = ckpt['metrics']
    assert m['final_kl'] == history[-2]['kl'] <= 0.02  # the saved policy's own KL, not the over-cap one
    from model import evaluate_perplexity
    val = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    saved = GPT.from_checkpoint(str(tmp_path / 'p.pt'))
    assert m['final_val_ppl'] == pytest.approx(evaluate_perplexity(saved, val[:100000], 32)[1], rel=1e-5)
    assert f"val ppl ({m['ppl_tokens']}) {m['val_ppl_start']:.3f} -> {m['final_val_ppl']:.3f}" in r.stdout


def test_policy_log_probs_ignore_dropout(tmp_path, known_answer_run, char_ckpt, char_data):
    """A policy whose config has dropout: GRPO keeps it in eval mode, so at step 0 (policy == reference) the KL is
    exactly 0 and a second pass over the same rollouts (learning rate 0) has ratio exactly 1."""
    d, _ = known_answer_run
    ckpt = load_checkpoint(char_ckpt)
    ckpt['model_args']['dropout'] = 0.5
    torch.save(ckpt, tmp_path / 'dropout.pt')
    r = run_script('train_grpo.py', f'--policy_path={tmp_path / "dropout.pt"}', f'--reward_model_path={d / "rm.pt"}',
                   f'--dataset={char_data}', f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--max_steps=1',
                   '--learning_rate=0.0', '--num_iterations=2', '--epsilon=1e-6', '--eval_interval=100')
    assert r.returncode == 0, r.stderr[-2000:]
    row = load_checkpoint(str(tmp_path / 'p.pt'))['metrics']['history'][0]
    assert row['kl'] == 0.0 and row['clip_ratio'] == 0.0


def test_reward_model_of_another_length_is_refused(tmp_path, known_answer_run, char_ckpt):
    d, _ = known_answer_run
    ckpt = load_checkpoint(str(d / 'rm.pt'))
    ckpt['data_block_size'] = 16
    torch.save(ckpt, tmp_path / 'rm16.pt')
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "rm16.pt"}',
                   f'--out_path={tmp_path / "p.pt"}', '--device=cpu')
    assert r.returncode == 2 and 'trained on sequences of 16 tokens' in r.stderr and 'Traceback' not in r.stderr


def test_the_log_odds_reward_with_the_kl_inside_it_plays_end_to_end(tmp_path, known_answer_run, char_ckpt, char_data):
    """--reward_form=log_odds --kl_in_reward=True: the rewards are the judge's log-odds minus the completion's
    log-ratio to the reference (no longer in [0, 1]); with beta > 0 the k3 term would count the KL twice: refused."""
    from configurator import UserError, configure
    from train_grpo import DEFAULTS, check_config
    d, _ = known_answer_run
    args = [f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}', '--reward_form=log_odds',
            '--kl_in_reward=True']
    r = run_script('train_grpo.py', *args, f'--dataset={char_data}', f'--out_path={tmp_path / "p.pt"}', '--beta=0',
                   '--device=cpu', '--max_steps=2', '--eval_interval=2', '--scale_rewards=none', '--warmup_steps=1')
    assert r.returncode == 0, r.stderr[-3000:]
    history = load_checkpoint(str(tmp_path / 'p.pt'))['metrics']['history']
    assert len(history) == 2 and any(not 0 <= h['reward'] <= 1 for h in history), history
    with pytest.raises(UserError, match='--beta=0'):
        check_config(configure(DEFAULTS, args + ['--beta=0.04']))


def test_eval_interval_zero_is_refused(tmp_path, known_answer_run, char_ckpt):
    d, _ = known_answer_run  # it was a ZeroDivisionError at the first step
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}',
                   f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--eval_interval=0')
    assert r.returncode == 2 and 'eval_interval=0 is out of range' in r.stderr and 'Traceback' not in r.stderr
    assert not list(tmp_path.iterdir())


def test_mismatched_tokenization_is_refused(tmp_path, char_ckpt, bpe_ckpt, known_answer_run):
    d, _ = known_answer_run
    r = run_script('train_grpo.py', f'--policy_path={bpe_ckpt}', f'--reward_model_path={d / "rm.pt"}',
                   f'--out_path={tmp_path / "p.pt"}', '--device=cpu')
    assert r.returncode == 2 and 'tokenization mismatch' in r.stderr and 'Traceback' not in r.stderr


def test_torchrun_two_ranks(tmp_path, known_answer_run, char_ckpt, char_data):
    d, _ = known_answer_run
    out = tmp_path / 'ddp' / 'p.pt'
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train_grpo.py',
                   f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}', f'--dataset={char_data}',
                   f'--out_path={out}', '--device=cpu', '--backend=gloo', '--max_steps=4', '--eval_interval=2',
                   '--prompts_per_step=4', '--learning_rate=1e-3', env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    history = load_checkpoint(str(out))['metrics']['history']
    assert len(history) == 4 and all(0 <= h['reward'] <= 1 for h in history)


def grpo_judge_run(d, name, *extra):
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', f'--reward_model_path={d / "blind.pt"}',
                   f'--out_path={d / name}', '--device=cpu', '--max_steps=40', '--learning_rate=0',
                   '--eval_interval=100', '--prompts_per_step=8', '--num_generations=2', '--reward_threshold=2.0',
                   *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_checkpoint(str(d / name))['metrics']['history']


def heldout_r2(judge_path, data_dir):
    """R² on the held-out samples whose crossover lies where GRPO's prompts end (K <= N/2): what the judge scores."""
    from reward_dataset_loader import RewardDataset
    from judge import reward_metrics
    judge = GPT.from_checkpoint(judge_path)
    ds = RewardDataset(data_dir, 'val')
    rows = np.flatnonzero(ds.y[:, 0] <= 0.5)
    with torch.no_grad():
        p = judge(torch.from_numpy(ds.x[rows].astype(np.int64)))[0][:, 0].numpy()
    y = ds.y[rows, 0]
    return reward_metrics(p, y, ds.block_size, float(y.mean()))['r2']


def test_online_judge_learns_to_see_the_policy(judge_case):
    """With the generator held fixed (lr 0), the online judge learns what its samples look like: on held-out
    crossover data its R² beats the blind start by far, and the R² logged on each step's unseen rollouts rises; the
    frozen judge's logged R² does not move. The saved judge loads as a reward model and kept its trunk."""
    from evaluate import trunk_signature
    d = judge_case
    frozen = grpo_judge_run(d, 'frozen.pt')
    online = grpo_judge_run(d, 'online.pt', '--judge_update_interval=1', '--judge_steps=16',
                            '--judge_learning_rate=1e-2', '--judge_batch_size=32')
    logged = lambda h, a, b, key='judge_r2': np.mean([x[key] for x in h[a:b]])  # noqa: E731
    assert logged(online, -10, None) > logged(online, 0, 5) + 0.3
    assert max(x['judge_r2'] for x in frozen) < 0  # the blind judge stays blind: worse than each batch's mean
    # its sight, on each step's unseen rollouts against their prompts' natural continuations: exactly 0.5 when
    # blind (every score ties), and the online judge comes to rank natural text first
    assert all(x['judge_sight'] == 0.5 for x in frozen) and online[0]['judge_sight'] == 0.5
    assert logged(online, -10, None, 'judge_sight') > 0.8, [x['judge_sight'] for x in online]
    assert all(h['judge_loss'] is None for h in frozen) and all(h['judge_loss'] > 0 for h in online)
    assert not (d / 'frozen_judge.pt').exists()
    blind_r2, online_r2 = heldout_r2(str(d / 'blind.pt'), d / 'heldout'), heldout_r2(str(d / 'online_judge.pt'), d / 'heldout')
    assert online_r2 > 0.05 and online_r2 > blind_r2 + 1.0, (blind_r2, online_r2)  # measured: -2.76 -> 0.19
    judge, blind = load_checkpoint(str(d / 'online_judge.pt')), load_checkpoint(str(d / 'blind.pt'))
    assert judge['data_block_size'] == 32 and judge['model_args']['mode'] == 'reward'
    assert trunk_signature(judge['model']) == trunk_signature(blind['model'])


def test_an_online_judge_that_trains_its_trunk_learns_its_own_features(judge_case):
    """--judge_unfreeze_layers=-1: the online judge trains every parameter of its own copy (the policy is another
    model: lr 0 keeps it fixed), on token ids replayed across steps, after warm-up batches that the policy does not
    move in, with natural windows of the train split beside the rollouts. Its sight on unseen rollouts rises, its
    trunk leaves the one it started from, and its warm-up is logged apart from the policy's steps."""
    from evaluate import trunk_signature
    d = judge_case
    h = grpo_judge_run(d, 'trunk.pt', '--judge_update_interval=1', '--judge_steps=8', '--judge_learning_rate=3e-3',
                       '--judge_batch_size=32', '--judge_unfreeze_layers=-1', '--judge_warmup_steps=6',
                       '--judge_natural_windows=8', '--max_steps=12', '--referee_samples=16')
    metrics = load_checkpoint(str(d / 'trunk.pt'))['metrics']
    warmup = metrics['judge_warmup']
    assert [w['step'] for w in warmup] == list(range(6)) and warmup[0]['judge_sight'] == 0.5  # blind at the start
    assert len(h) == 12 and np.mean([x['judge_sight'] for x in h[-5:]]) > 0.8, [x['judge_sight'] for x in h]
    judge, blind = load_checkpoint(str(d / 'trunk_judge.pt')), load_checkpoint(str(d / 'blind.pt'))
    assert trunk_signature(judge['model']) != trunk_signature(blind['model'])
    assert judge['config']['online_unfreeze_layers'] == -1
    assert all(0 <= x['reward_within_group_share'] <= 1 for x in h)
    # the referee over the game: the two-sample AUC before the first step and at each evaluation (here the last)
    assert 0 <= metrics['referee_auc_start'] <= 1 and 0 <= h[-1]['referee_auc'] <= 1
    assert all('referee_auc' not in x for x in h[:-1]) and (d / 'trunk_curves.png').read_bytes()[:4] == b'\x89PNG'
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', f'--reward_model_path={d / "blind.pt"}',
                   '--judge_unfreeze_layers=-1', f'--out_path={d / "x.pt"}')
    assert r.returncode == 2 and 'judge_update_interval' in r.stderr and 'Traceback' not in r.stderr
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', f'--reward_model_path={d / "blind.pt"}',
                   '--judge_update_interval=1', '--judge_loss=pairwise', '--judge_natural_windows=8',
                   f'--out_path={d / "x.pt"}')
    assert r.returncode == 2 and 'pairwise' in r.stderr and 'Traceback' not in r.stderr


def test_a_binary_online_judge_learns_whole_rollouts_against_natural_windows(judge_case):
    """--judge_loss=binary: whole rollouts are synthetic, natural train windows natural (the offline probe's judges,
    online). On the tests' learnable case its sight on unseen rollouts rises; without natural windows it is a
    one-line error."""
    d = judge_case
    h = grpo_judge_run(d, 'binary.pt', '--judge_update_interval=1', '--judge_steps=8', '--judge_learning_rate=1e-2',
                       '--judge_batch_size=32', '--judge_loss=binary', '--judge_natural_windows=16', '--max_steps=15')
    sight = [x['judge_sight'] for x in h]
    assert sight[0] == 0.5 and np.mean(sight[-5:]) > 0.8, sight
    assert load_checkpoint(str(d / 'binary_judge.pt'))['config']['loss'] == 'binary'
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', f'--reward_model_path={d / "blind.pt"}',
                   '--judge_update_interval=1', '--judge_loss=binary', f'--out_path={d / "x.pt"}')
    assert r.returncode == 2 and 'judge_natural_windows' in r.stderr and 'Traceback' not in r.stderr
    # a judge trained with loss=binary (offline, or this one) keeps that loss online: it too needs natural windows
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}',
                   f'--reward_model_path={d / "binary_judge.pt"}', '--judge_update_interval=1',
                   f'--out_path={d / "x.pt"}', '--device=cpu')
    assert r.returncode == 2 and 'trained with loss=binary' in r.stderr and 'Traceback' not in r.stderr


def test_an_ngram_judge_fitted_online_sees_the_policys_text(judge_case):
    """--judge=ngram: no reward model; the two-sample test's classifier on the completions' text, fitted on warm-up
    batches (unfitted, it says 0.5 to everything: sight exactly 0.5 on the first), then refit every step. On the
    tests' learnable case (near-uniform characters) it sees every step's unseen rollouts, and its reward is what
    it says: P(natural) of each completion. Misuse is a one-line error."""
    d = judge_case
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', '--judge=ngram',
                   f'--out_path={d / "ngram.pt"}', '--device=cpu', '--max_steps=4', '--learning_rate=0',
                   '--eval_interval=100', '--prompts_per_step=8', '--num_generations=2', '--reward_threshold=2.0',
                   '--judge_update_interval=1', '--judge_warmup_steps=2', '--judge_natural_windows=8')
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = load_checkpoint(str(d / 'ngram.pt'))['metrics']
    h, warmup = metrics['history'], metrics['judge_warmup']
    assert warmup[0]['judge_sight'] == 0.5 and warmup[0]['judge_loss'] > 0
    assert min(x['judge_sight'] for x in h) > 0.9 and all(x['judge_loss'] > 0 for x in h), h
    assert all(x['reward'] < 0.5 for x in h)  # it says the policy's text is not natural
    assert 'n-gram judge' in r.stdout and not (d / 'ngram_judge.pt').exists()
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', '--judge=ngram',
                   f'--out_path={d / "ngram_frozen.pt"}', '--device=cpu', '--max_steps=2', '--learning_rate=0',
                   '--eval_interval=100', '--prompts_per_step=8', '--num_generations=2', '--judge_update_interval=1000',
                   '--judge_warmup_steps=2', '--judge_natural_windows=8', '--reward_form=log_odds')
    assert r.returncode == 0, r.stderr[-3000:]  # an interval past the run: fitted on the warm-up, then frozen
    m = load_checkpoint(str(d / 'ngram_frozen.pt'))['metrics']
    assert m['judge_warmup'][-1]['judge_loss'] > 0 and all(x['judge_loss'] is None for x in m['history'])
    assert min(x['judge_sight'] for x in m['history']) > 0.9
    assert all(x['reward'] < 0 for x in m['history'])  # its log-odds, log P(natural) - log P(synthetic): below 0
    # that judge as it saved itself, played frozen from its file: no warm-up, the same sight, no copy written
    saved = str(d / 'ngram_frozen_judge.json')
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}', '--judge=ngram',
                   f'--reward_model_path={saved}', f'--out_path={d / "ngram_saved.pt"}', '--device=cpu',
                   '--max_steps=2', '--learning_rate=0', '--eval_interval=100', '--prompts_per_step=8',
                   '--num_generations=2', '--reward_form=log_odds')
    assert r.returncode == 0, r.stderr[-3000:]
    m2 = load_checkpoint(str(d / 'ngram_saved.pt'))['metrics']
    assert m2['judge_warmup'] == [] and min(x['judge_sight'] for x in m2['history']) > 0.9
    assert all(x['reward'] < 0 and x['judge_loss'] is None for x in m2['history'])
    assert not (d / 'ngram_saved_judge.json').exists()
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
    from bench_share import played_judge
    assert played_judge(str(d / 'ngram_saved.pt')) == saved
    assert played_judge(str(d / 'ngram_frozen.pt')) == saved
    base = [f'--policy_path={d / "gen" / "ckpt.pt"}', '--judge=ngram', f'--out_path={d / "x.pt"}', '--device=cpu']
    for extra, says in ((['--judge_update_interval=1'], 'judge_warmup_steps'),
                        (['--judge_update_interval=1', '--judge_warmup_steps=1',
                          f'--reward_model_path={saved}'], 'plays a saved n-gram judge'),
                        ([f'--reward_model_path={d / "blind.pt"}'], 'plays a saved n-gram judge'),
                        ([f'--reward_model_path={d / "gen" / "x.json"}'], "not an n-gram judge's file"),
                        (['--judge=gpt'], "judge must be 'model'")):
        r = run_script('train_grpo.py', *base, *extra)
        assert r.returncode == 2 and says in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert not (d / 'x.pt').exists()


@pytest.mark.parametrize('judge', ['trunk', 'ngram'])
def test_online_judges_under_torchrun_see_the_policys_text(tmp_path, judge_case, judge):
    """The judges that learn during the game, end to end under two gloo ranks (each rank half the prompts): the
    judge learns from every rank's rollouts and sees them on the learnable case, as in one process."""
    d = judge_case
    args = [f'--policy_path={d / "gen" / "ckpt.pt"}', f'--out_path={tmp_path / "p.pt"}', '--device=cpu',
            '--backend=gloo', '--learning_rate=0', '--eval_interval=100', '--prompts_per_step=8',
            '--num_generations=2', '--reward_threshold=2.0', '--judge_update_interval=1']
    if judge == 'trunk':
        args += [f'--reward_model_path={d / "blind.pt"}', '--judge_steps=8', '--judge_learning_rate=3e-3',
                 '--judge_batch_size=32', '--judge_unfreeze_layers=-1', '--judge_warmup_steps=6',
                 '--judge_natural_windows=8', '--max_steps=12', '--referee_samples=16']
    else:
        args += ['--judge=ngram', '--judge_warmup_steps=2', '--judge_natural_windows=8', '--max_steps=4']
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train_grpo.py', *args,
                   env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-3000:]
    h = load_checkpoint(str(tmp_path / 'p.pt'))['metrics']['history']
    assert np.mean([x['judge_sight'] for x in h[-4:]]) > 0.8, [x['judge_sight'] for x in h]
    assert all(x['judge_loss'] > 0 for x in h)


def _ddp_ngram_fit(rank, world, port, texts, out):
    """One rank of the n-gram judge check: it gathers every rank's texts and fits on them."""
    import os
    from contextlib import nullcontext
    import torch.distributed as dist
    from judge import NgramJudge
    from runtime import Runtime, gather_lists
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    rt = Runtime('cpu', 'cpu', nullcontext(), torch.float32, ddp=True, rank=rank, world_size=world)
    natural, samples = gather_lists(texts[rank][0], rt), gather_lists(texts[rank][1], rt)
    judge = NgramJudge()
    judge.fit(natural, samples)
    torch.save(dict(natural=natural, p=torch.from_numpy(judge.p_natural(['the king is dead', 'zq xv qq']))),
               f'{out}.{rank}')
    dist.destroy_process_group()


def test_the_ngram_judge_under_two_ranks_is_one_judge(tmp_path):
    """Under torchrun every rank fits the n-gram judge on every rank's texts, joined in rank order: the ranks hold the
    judge one process holds on the whole batch."""
    from judge import NgramJudge
    texts = [(['the king is here', 'my lord the queen'], ['zq xv qq', 'kqz zzv']),
             (['and so the king said', 'good my lord'], ['vvq zx', 'qqq xzq'])]
    spawn_two_ranks(_ddp_ngram_fit, texts, str(tmp_path / 'rank'))
    ranks = [torch.load(tmp_path / f'rank.{r}', weights_only=True) for r in range(2)]
    one = NgramJudge()
    one.fit(texts[0][0] + texts[1][0], texts[0][1] + texts[1][1])
    assert ranks[0]['natural'] == ranks[1]['natural'] == texts[0][0] + texts[1][0]
    expected = torch.from_numpy(one.p_natural(['the king is dead', 'zq xv qq']))
    torch.testing.assert_close(ranks[0]['p'], expected, rtol=0, atol=0)
    torch.testing.assert_close(ranks[1]['p'], expected, rtol=0, atol=0)
    assert expected[0] > 0.5 > expected[1]


def test_within_group_share_of_the_reward_spread():
    from train_grpo import within_group_share
    assert within_group_share(torch.tensor([0.1, 0.9, 0.1, 0.9]), 2) == pytest.approx(1.0)  # all within groups
    assert within_group_share(torch.tensor([0.1, 0.1, 0.9, 0.9]), 2) == 0.0  # groups differ, completions do not
    # sum of squares within groups over the total
    assert within_group_share(torch.tensor([0.1, 0.3, 0.7, 0.9]), 2) == pytest.approx(0.04 / 0.40)
    assert within_group_share(torch.full((4,), 0.5), 2) == 0.0


def test_token_advantages_match_hand_computation():
    """Discounted returns of the per-position rewards over the completion, centred per position within each group;
    target j carries position j + 1's advantage; prompt positions get none."""
    r = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.6, 0.1, 0.2], [0.5, 0.5, 0.9, 0.1], [0.5, 0.5, 0.3, 0.3]])
    lengths = torch.tensor([1, 1, 2, 2])
    generated = (torch.arange(4)[None, :] >= lengths[:, None]).float()
    adv = token_advantages_of(r, generated, group_size=2, discount=0.5, scale='none')
    ret = lambda row, t: sum(r[row, s].item() * 0.5 ** (s - t) for s in range(t, 4))
    expected = torch.zeros(4, 4)
    for a, b in ((0, 1), (2, 3)):
        for t in range(int(lengths[a]), 4):
            mean = (ret(a, t) + ret(b, t)) / 2
            expected[a, t], expected[b, t] = ret(a, t) - mean, ret(b, t) - mean
    assert adv.shape == (4, 3)
    torch.testing.assert_close(adv, expected[:, 1:])
    scaled = token_advantages_of(r, generated, group_size=2, discount=0.5, scale='group')
    assert torch.all((scaled.abs() > 0.5) == (adv.abs() > 0))  # each nonzero pair of a group scales to ~±0.71
    loss, _ = grpo_loss(torch.zeros(4, 3), torch.zeros(4, 3), None, adv, completion_mask(lengths, 4))
    assert loss.item() == pytest.approx(-(adv.sum(-1) / completion_mask(lengths, 4).sum(-1)).mean().item(), abs=1e-6)


def test_grpo_with_a_token_judge(tmp_path, char_ckpt, char_data, char_reward, known_answer_run):
    """A token judge scores completions by their mean P(natural) and can give per-token advantages; asking for
    per-token advantages from a pointwise judge is a clear error."""
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={tmp_path / "tj.pt"}', '--device=cpu', '--max_iters=20', '--reward_pooling=token')
    assert r.returncode == 0, r.stderr[-2000:]
    args = ['train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "tj.pt"}',
            f'--dataset={char_data}', '--device=cpu', '--max_steps=3', '--eval_interval=100']
    r = run_script(*args, f'--out_path={tmp_path / "p.pt"}', '--token_advantages=True')
    assert r.returncode == 0, r.stderr[-3000:]
    history = load_checkpoint(str(tmp_path / 'p.pt'))['metrics']['history']
    assert len(history) == 3 and all(0 < h['reward'] < 1 for h in history)
    d, _ = known_answer_run
    r = run_script(*args[:2], f'--reward_model_path={d / "rm.pt"}', *args[3:], f'--out_path={tmp_path / "q.pt"}',
                   '--token_advantages=True')
    assert r.returncode == 2 and 'token judge' in r.stderr and 'Traceback' not in r.stderr


def test_nll_term_pulls_the_policy_to_the_corpus(judge_case):
    """Against the blind judge every reward is 0.5, so every advantage is 0 and GRPO alone leaves the policy where it
    is (the KL's gradient is 0 at the reference); the NLL term on the prompts' natural continuations is then the only
    force, and held-out perplexity of the nearly uniform generator falls. Its loss is logged and its compute counted."""
    d = judge_case
    pure = grpo_judge_run(d, 'pure.pt', '--learning_rate=3e-3', '--max_steps=15', '--eval_interval=15')
    real = grpo_judge_run(d, 'real.pt', '--learning_rate=3e-3', '--max_steps=15', '--eval_interval=15',
                          '--nll_weight=1.0')
    start = load_checkpoint(str(d / 'pure.pt'))['metrics']['val_ppl_start']
    assert abs(pure[-1]['val_ppl'] - start) < 1e-3 * start and all(h['nll'] is None for h in pure)
    assert real[-1]['val_ppl'] < 0.9 * start
    assert all(h['nll'] > 0 for h in real) and np.mean([h['nll'] for h in real[-5:]]) < real[0]['nll']
    assert load_checkpoint(str(d / 'real.pt'))['metrics']['flops'] > load_checkpoint(str(d / 'pure.pt'))['metrics']['flops']


def test_online_pairwise_judge_learns_to_rank_the_prompts_own_continuation_first(judge_case, char_ckpt, char_reward):
    """A pairwise judge in GRPO scores each rollout against its prompt's natural window. Blind at the start, it ranks
    them at chance; online, with the generator held fixed (lr 0), it learns to put the natural window first on the
    rollouts it has not trained on yet, and its Bradley-Terry loss falls."""
    d = judge_case
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={d / "blind_pairwise.pt"}', '--device=cpu', '--max_iters=0', '--reward_pooling=mean',
                   '--loss=pairwise')
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_script('train_grpo.py', f'--policy_path={d / "gen" / "ckpt.pt"}',
                   f'--reward_model_path={d / "blind_pairwise.pt"}', f'--out_path={d / "pairwise.pt"}', '--device=cpu',
                   '--max_steps=30', '--learning_rate=0', '--eval_interval=100', '--prompts_per_step=8',
                   '--num_generations=2', '--reward_threshold=0.1', '--judge_update_interval=1', '--judge_steps=16',
                   '--judge_learning_rate=1e-2', '--judge_batch_size=32')
    assert r.returncode == 0, r.stderr[-3000:]
    h = load_checkpoint(str(d / 'pairwise.pt'))['metrics']['history']
    assert len(h) == 30  # a pairwise judge's score has no absolute level: no reward threshold stops it
    assert h[0]['judge_pair_accuracy'] == pytest.approx(0.5)  # blind: every score equal, every pair a tie
    assert np.mean([x['judge_pair_accuracy'] for x in h[-10:]]) > 0.8
    assert np.mean([x['judge_loss'] for x in h[-10:]]) < np.mean([x['judge_loss'] for x in h[:3]])
    assert load_checkpoint(str(d / 'pairwise_judge.pt'))['config']['loss'] == 'pairwise'


@pytest.mark.parametrize('game', ['k3', 'kl_in_reward', 'dpg'])
def test_judge_off_zeroes_the_policy_gradient(tmp_path, known_answer_run, char_ckpt, char_data, game):
    """The judge-off ablation against the judge that GRPO learns from (known_answer_run raises its reward): every
    reward is 0.5 and every advantage 0, so with no NLL term the policy gradient and the KL's gradient at the
    reference are exactly 0 and the policy does not move, in the seed's game (the k3 penalty), the tilt's (the KL
    inside the reward) and DPG's (uniform weights): bench_channels.py reads the base as the games' judge-off control.
    The NLL term alone then moves it."""
    d, _ = known_answer_run
    objective = dict(k3=['--beta=0.04'], kl_in_reward=['--beta=0', '--kl_in_reward=True', '--scale_rewards=none',
                                                       '--loss_type=dr_grpo'], dpg=['--beta=0', '--objective=dpg'])[game]
    args = ['train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}',
            f'--dataset={char_data}', '--device=cpu', '--max_steps=6', '--learning_rate=3e-3', '--warmup_steps=1',
            '--eval_interval=6', '--num_iterations=2', '--judge_off=True', *objective]
    r = run_script(*args, f'--out_path={tmp_path / "off.pt"}')
    assert r.returncode == 0 and 'judge OFF' in r.stdout, r.stderr[-2000:]
    off = load_checkpoint(str(tmp_path / 'off.pt'))
    assert same_weights(tmp_path / 'off.pt', char_ckpt) and off['metrics']['judge_off']
    h = off['metrics']['history']
    assert all(x['reward'] == 0.5 and x['kl'] == 0.0 for x in h)
    if game != 'dpg':  # DPG's advantages are its weights', not the rewards' spread
        assert all(x['frac_reward_zero_std'] == 1.0 for x in h)
    if game != 'k3':
        return
    assert any(x['judge_r2'] != h[0]['judge_r2'] for x in h)  # the judge still scored each step's rollouts
    r = run_script(*args, f'--out_path={tmp_path / "off_nll.pt"}', '--nll_weight=1.0')
    assert r.returncode == 0, r.stderr[-2000:]
    assert not same_weights(tmp_path / 'off_nll.pt', char_ckpt)


@pytest.mark.parametrize('judge', ['trunk', 'ngram', 'gated'])  # trunk trains the head too: its state is covered
def test_interrupted_grpo_resumes_to_the_uninterrupted_policy(tmp_path, judge_case, char_ckpt, monkeypatch,
                                                                judge):
    """A run killed right after its resume state was written (step 3 of 7) and restarted with --resume=True ends
    with the same policy, online judge and log as the run that was never stopped: policy, optimizer, reference,
    judge head, its optimizer and replay, every generator's state and DPG's gated proposal come back. Settings or
    inputs that differ are never resumed; a finished run is never played again by --resume=True."""
    import train_grpo
    d = judge_case
    args = [f'--policy_path={d / "gen" / "ckpt.pt"}', f'--reward_model_path={d / "blind.pt"}', '--device=cpu',
            '--max_steps=7', '--learning_rate=3e-3', '--warmup_steps=2', '--eval_interval=3', '--prompts_per_step=4',
            '--num_generations=2', '--reward_threshold=2.0', '--judge_update_interval=1', '--judge_steps=2',
            '--judge_learning_rate=1e-2', '--nll_weight=1.0', '--num_iterations=2', '--resume=True']
    if judge == 'trunk':  # the whole judge trains, on replayed token ids, after warm-up batches
        args += ['--judge_unfreeze_layers=-1', '--judge_warmup_steps=2', '--judge_natural_windows=4']
    if judge == 'gated':  # DPG towards a better generator, drawn from GDC's gated proposal, which takes the policy's
        # weights as it nears that generator (8 a group: 2 weigh too few to read the gate by): the proposal and its
        # count of updates resume
        args = [a for a in args if not a.startswith(('--judge_update', '--judge_steps', '--judge_learning',
                                                     '--num_generations'))] \
            + ['--num_generations=8', '--objective=dpg', '--proposal=gated', '--beta=0', '--reward=teacher_ratio',
               f'--teacher_path={char_ckpt}']
    if judge == 'ngram':  # no reward model: the n-gram judge, refit from its texts on resume
        args = [a for a in args if not a.startswith(('--reward_model_path', '--judge_steps', '--judge_learning'))] \
            + ['--judge=ngram', '--judge_warmup_steps=2', '--judge_natural_windows=4']
    whole = d / f'whole_{judge}.pt'
    r = run_script('train_grpo.py', *args, f'--out_path={whole}')
    assert r.returncode == 0, r.stderr[-2000:]

    kill_after_save(monkeypatch, train_grpo)  # the kill, right after the state of step 3 is on disk
    with pytest.raises(KeyboardInterrupt):
        train_grpo.main(args + [f'--out_path={tmp_path / "cut.pt"}'])
    assert (tmp_path / 'cut_resume.pt').exists()
    r = run_script('train_grpo.py', *args, f'--out_path={tmp_path / "cut.pt"}')
    assert r.returncode == 0 and 'resumed at step 3' in r.stdout, r.stderr[-2000:]
    assert not (tmp_path / 'cut_resume.pt').exists()
    assert same_weights(whole, tmp_path / 'cut.pt')
    if judge == 'gated':  # the gate's reads after the resume are the uninterrupted run's
        gate = lambda p: [(x['proposal_gap'], x['proposal_updates']) for x in map(json.loads, open(p))]  # noqa: E731
        assert gate(d / 'whole_gated_log.jsonl') == gate(tmp_path / 'cut_log.jsonl')
        assert gate(tmp_path / 'cut_log.jsonl')[2][1] > 0  # the proposal had moved before the cut
    if judge == 'trunk':  # the n-gram judge is no checkpoint (the rewards in the logs below are its
        # verdicts), the gated run's judge frozen
        assert same_weights(d / f'whole_{judge}_judge.pt', tmp_path / 'cut_judge.pt')
    steps = lambda p: [(x['step'], x['reward'], x['loss']) for x in map(json.loads, open(p))]  # noqa: E731
    assert steps(d / f'whole_{judge}_log.jsonl') == steps(tmp_path / 'cut_log.jsonl')
    # a finished run resumed is left as it is (not played again over its checkpoint and log); it cannot be extended
    before = [(tmp_path / f).read_bytes() for f in ('cut.pt', 'cut_log.jsonl')]
    r = run_script('train_grpo.py', *args, f'--out_path={tmp_path / "cut.pt"}')
    assert r.returncode == 0 and 'finished (7 steps, max_steps): nothing to resume' in r.stdout, r.stderr[-2000:]
    assert [(tmp_path / f).read_bytes() for f in ('cut.pt', 'cut_log.jsonl')] == before
    r = run_script('train_grpo.py', *args, f'--out_path={tmp_path / "cut.pt"}', '--max_steps=9')
    assert r.returncode != 0 and 'cannot be extended to 9' in r.stderr and 'Traceback' not in r.stderr
    # a state written with other settings is not continued
    kill_after_save(monkeypatch, train_grpo)
    with pytest.raises(KeyboardInterrupt):
        train_grpo.main(args + [f'--out_path={tmp_path / "other.pt"}'])
    r = run_script('train_grpo.py', *args, f'--out_path={tmp_path / "other.pt"}', '--learning_rate=1e-3')
    assert r.returncode == 0 and 'not resuming' in r.stdout and 'resumed at' not in r.stdout, r.stderr[-2000:]


def test_judge_off_runs_its_arms_steps_whatever_the_reward_rules_say(tmp_path, known_answer_run, char_ckpt,
                                                                      char_data):
    """The judge-off control reads its arm's step count from the arm's log and runs exactly that many steps: the
    reward threshold and plateau rules that would stop it at once (its constant 0.5 is over the threshold) do not
    apply, and an arm that stopped early is matched too."""
    d, _ = known_answer_run
    args = ['train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={d / "rm.pt"}',
            f'--dataset={char_data}', '--device=cpu', '--prompts_per_step=2', '--num_generations=2',
            '--eval_interval=100', '--ppl_max_tokens=500']
    early = ['--reward_threshold=0.4', '--reward_window=2', '--patience=1', '--max_steps=6']
    r = run_script(*args, '--reward_threshold=0.0', '--reward_window=2', '--max_steps=6',
                   f'--out_path={tmp_path / "arm.pt"}')  # an arm its reward threshold stops after 2 steps
    assert r.returncode == 0 and len(load_checkpoint(str(tmp_path / 'arm.pt'))['metrics']['history']) == 2
    (tmp_path / 'long_log.jsonl').write_text(''.join(json.dumps({'step': i}) + '\n' for i in range(5)))
    for arm_log, arm_steps in ((tmp_path / 'long_log.jsonl', 5), (tmp_path / 'arm_log.jsonl', 2)):
        r = run_script(*args, *early, '--judge_off=True', f'--arm_log={arm_log}', f'--out_path={tmp_path / "off.pt"}')
        assert r.returncode == 0 and f'{arm_steps} steps, as its arm' in r.stdout, r.stderr[-2000:]
        off = load_checkpoint(str(tmp_path / 'off.pt'))['metrics']
        assert len(off['history']) == arm_steps and off['stop_reason'] == 'max_steps'
    r = run_script(*args, f'--arm_log={tmp_path / "arm_log.jsonl"}', f'--out_path={tmp_path / "x.pt"}')
    assert r.returncode == 2 and 'judge_off' in r.stderr and 'Traceback' not in r.stderr


def _ddp_advantages_and_dapo(rank, world, port, case, out):
    """One rank of the gloo check: its share of the batch, the trainer's own advantage and loss code."""
    import os
    from contextlib import nullcontext
    import torch.distributed as dist
    from runtime import Runtime, all_reduce_mean, global_sum
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    rt = Runtime('cpu', 'cpu', nullcontext(), torch.float32, ddp=True, rank=rank, world_size=world)
    torch.save(grpo_batch_figures(case, rt, slice(rank * 8, (rank + 1) * 8), global_sum, all_reduce_mean),
               f'{out}.{rank}')
    dist.destroy_process_group()


def grpo_batch_figures(case, rt, rows, global_sum, mean):
    """'batch'-scaled advantages (sequence and token level) and the 'dapo' loss and its (rank-averaged) gradient of
    the batch rows `rows`, as the trainer computes them."""
    from types import SimpleNamespace
    from train_grpo import advantages_of
    rewards, judged, generated, logps, old = (case[k][rows] for k in ('rewards', 'judged', 'generated', 'logps', 'old'))
    C = SimpleNamespace(num_generations=4, scale_rewards='batch', token_advantages=False, token_discount=0.5,
                        teacher_sampled=True, objective='grpo')
    adv = advantages_of(C, rt, rewards, judged, generated)[0]
    C.token_advantages = True
    token_adv = advantages_of(C, rt, rewards, judged, generated)[0]
    logps = logps.clone().requires_grad_(True)
    mask = generated[:, 1:]
    count = global_sum(mask.sum(), rt).float() / rt.world_size if rt.ddp else None
    loss, _ = grpo_loss(logps, old, None, token_adv, mask, loss_type='dapo', token_count=count)
    loss.backward()
    grad = logps.grad
    if rt.ddp:  # what DDP does to the gradients: their mean over the ranks
        full = torch.zeros(16, *grad.shape[1:])
        full[rows] = grad
        torch.distributed.all_reduce(full)
        grad = full / rt.world_size
    return dict(adv=adv, token_adv=token_adv, loss=mean(loss.item(), rt), grad=grad)


def test_two_gloo_ranks_compute_what_one_process_computes(tmp_path):
    """Two ranks whose rewards differ in scale: 'batch' scaling divides by the std of every rank's rewards pooled
    (TRL gathers them), and 'dapo' by the global token count over the world size, so advantages, the logged loss
    and the averaged gradient equal one process's on the whole batch."""
    from contextlib import nullcontext
    from runtime import Runtime, all_reduce_mean, global_sum
    g = torch.Generator().manual_seed(0)
    rewards = torch.cat([0.5 + 0.01 * torch.randn(8, generator=g), 0.5 + 0.3 * torch.randn(8, generator=g)])
    lengths = torch.randint(2, 9, (4,), generator=g).repeat_interleave(4)  # a group shares its prompt length
    generated = (torch.arange(12)[None, :] >= lengths[:, None]).float()
    case = dict(rewards=rewards, judged=torch.rand(16, 12, generator=g), generated=generated,
                logps=-torch.rand(16, 11, generator=g), old=-torch.rand(16, 11, generator=g))
    spawn_two_ranks(_ddp_advantages_and_dapo, case, str(tmp_path / 'rank'))
    ranks = [torch.load(tmp_path / f'rank.{r}', weights_only=True) for r in range(2)]
    one = grpo_batch_figures(case, Runtime('cpu', 'cpu', nullcontext(), torch.float32), slice(0, 16), global_sum,
                             all_reduce_mean)
    torch.testing.assert_close(torch.cat([r['adv'] for r in ranks]), one['adv'])
    torch.testing.assert_close(torch.cat([r['token_adv'] for r in ranks]), one['token_adv'])
    assert ranks[0]['loss'] == pytest.approx(one['loss'], rel=1e-6) and ranks[0]['loss'] == ranks[1]['loss']
    torch.testing.assert_close(ranks[0]['grad'], one['grad'])
    per_rank_std = [case['rewards'][:8].std(), case['rewards'][8:].std()]
    assert max(per_rank_std) / min(per_rank_std) > 5  # the case where per-rank scaling was wrong


def _tiny_trunk_judge():
    """The online judge that trains its trunk, as train_grpo drives it: a reward-mode GPT read per position."""
    from model import GPTConfig
    torch.manual_seed(0)
    judge = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, mode='reward',
                          reward_head_hidden_dim=8, reward_pooling='mean'))
    return judge, (lambda x: judge(x, per_token=True)[0]), torch.optim.SGD(judge.parameters(), lr=0.5)


def _ddp_judge_update(rank, world, port, replays, out):
    """One rank of the online-judge check: its own replay and row generator, judge.judge_update's averaging."""
    import os
    from contextlib import nullcontext
    import torch.distributed as dist
    from judge import judge_update
    from runtime import Runtime
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world)
    rt = Runtime('cpu', 'cpu', nullcontext(), torch.float32, ddp=True, rank=rank, world_size=world)
    judge, judge_fn, opt = _tiny_trunk_judge()
    judge_update(judge_fn, list(judge.parameters()), opt, [replays[rank]], 3, 4, 'binary',
                 torch.Generator().manual_seed(rank), rt)
    torch.save(judge.state_dict(), f'{out}.{rank}')
    dist.destroy_process_group()


def test_online_trunk_judge_under_two_ranks_takes_the_mean_gradient(tmp_path):
    """Two gloo ranks, each training the online judge's whole network on its own rollouts, end with one judge: the
    one a single process gets by stepping on the mean of the two ranks' losses (rows drawn as each rank draws them).
    SGD, so that a sum in place of the mean would show."""
    from judge import judge_loss
    g = torch.Generator().manual_seed(1)
    replays = [(torch.randint(11, (10, 8), generator=g), torch.tensor([[0.25, 0.75]]).repeat(10, 1)),
               (torch.randint(11, (10, 8), generator=g), torch.tensor([[1.0, 0.0]]).repeat(10, 1))]
    spawn_two_ranks(_ddp_judge_update, replays, str(tmp_path / 'rank'))
    ranks = [torch.load(tmp_path / f'rank.{r}', weights_only=True) for r in range(2)]
    judge, judge_fn, opt = _tiny_trunk_judge()
    start = {k: v.clone() for k, v in judge.state_dict().items()}
    gens = [torch.Generator().manual_seed(r) for r in range(2)]
    for _ in range(3):
        rows = [torch.randint(10, (4,), generator=gens[r]) for r in range(2)]
        loss = sum(judge_loss(judge_fn(x[i]), y[i], 'binary') for (x, y), i in zip(replays, rows)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    one = judge.state_dict()
    assert max((one[k] - start[k]).abs().max() for k in one) > 1e-2  # the judge moved
    for k in one:
        torch.testing.assert_close(ranks[0][k], ranks[1][k], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][k], one[k], rtol=1e-4, atol=1e-6)


def test_the_teacher_reward_pulls_the_policy_toward_the_teacher(judge_case, char_ckpt):
    """A generator of nearly uniform characters (2 training steps) taught by the 150-step model through the
    per-token log-ratio: its reward (minus the reverse KL per token) rises and its val perplexity falls; a teacher
    equal to the policy gives every token a log-ratio of 0, so nothing moves."""
    d = judge_case
    m = positive_control_run(d, 'taught.pt', d / 'gen' / 'ckpt.pt', '--reward=teacher', f'--teacher_path={char_ckpt}',
                             '--token_advantages=True', '--token_discount=1.0')
    rewards = [h['reward'] for h in m['history']]
    assert all(r < 0 for r in rewards[:5]) and np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.1, rewards
    assert m['final_val_ppl'] < m['val_ppl_start'] and m['teacher_flops'] > 0
    assert all('judge_sight' in h for h in m['history'])  # the judge still reads the rollouts
    same = positive_control_run(d, 'self.pt', char_ckpt, '--reward=teacher', f'--teacher_path={char_ckpt}',
                                '--max_steps=2')
    assert all(abs(h['reward']) < 1e-5 and h['frac_reward_zero_std'] == 1 for h in same['history'])


def test_the_exact_single_step_term_pulls_the_policy_toward_the_teacher(judge_case, char_ckpt):
    """MiniLLM's single-step term (teacher_kl_weight): the exact reverse KL to the teacher over the vocabulary, logged
    per step, falls, and val perplexity with it; the judge-off control of the same run gets none of it."""
    d = judge_case
    args = ('--reward=teacher', f'--teacher_path={char_ckpt}', '--token_advantages=True', '--teacher_kl_weight=1.0',
            '--max_steps=12')
    m = positive_control_run(d, 'exact.pt', d / 'gen' / 'ckpt.pt', *args)
    kls = [h['teacher_kl'] for h in m['history']]
    assert np.mean(kls[-3:]) < 0.9 * np.mean(kls[:3]) and m['final_val_ppl'] < m['val_ppl_start'], kls
    off = positive_control_run(d, 'exact_off.pt', d / 'gen' / 'ckpt.pt', *args, '--judge_off=True')
    assert all(h['teacher_kl'] is None for h in off['history'])


def test_the_exact_term_alone_carries_no_sampled_reward(judge_case, char_ckpt):
    """--teacher_sampled=False: every advantage is 0 whatever the rewards (the sampled log-ratios are still logged),
    so the policy moves by the exact term (and the KL anchor) alone, and the exact KL to the teacher falls."""
    from types import SimpleNamespace
    from train_grpo import advantages_of
    rt = SimpleNamespace(ddp=False)
    rewards, judged = torch.randn(8, generator=torch.Generator().manual_seed(0)), torch.randn(8, 6)
    generated = torch.ones(8, 6, dtype=torch.bool)
    C = SimpleNamespace(num_generations=4, scale_rewards='group', token_advantages=True, token_discount=1.0,
                        teacher_sampled=False, objective='grpo')
    assert advantages_of(C, rt, rewards, judged, generated)[0].abs().max() == 0
    C.teacher_sampled = True
    assert advantages_of(C, rt, rewards, judged, generated)[0].abs().max() > 0
    d = judge_case
    m = positive_control_run(d, 'exact_alone.pt', d / 'gen' / 'ckpt.pt', '--reward=teacher',
                             f'--teacher_path={char_ckpt}', '--token_advantages=True', '--teacher_kl_weight=1.0',
                             '--teacher_sampled=False', '--max_steps=12')
    kls = [h['teacher_kl'] for h in m['history']]
    assert np.mean(kls[-3:]) < 0.9 * np.mean(kls[:3]), kls
    assert any(h['reward'] != 0 for h in m['history'])  # the sampled log-ratios, logged beside it


def test_token_logprobs_exact_kl_matches_its_definition():
    """kl_to: each position's KL(model || other) summed over the vocabulary, with the gradient of that sum; with
    kl_forward, KL(other || model)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16))
    seqs = torch.randint(11, (3, 9))
    other = torch.log_softmax(torch.randn(3, 8, 11), dim=-1)
    logps, _, kl = token_logprobs(model, seqs, 0.7, chunk=2, kl_to=other)
    log_p = torch.log_softmax(model(seqs[:, :-1], all_logits=True)[0] / 0.7, dim=-1)
    expected = (log_p.exp() * (log_p - other)).sum(-1)
    torch.testing.assert_close(kl, expected)
    torch.testing.assert_close(logps, log_p.gather(-1, seqs[:, 1:, None]).squeeze(-1))
    grad, = torch.autograd.grad(kl.sum(), model.lm_head.weight)
    expected_grad, = torch.autograd.grad(expected.sum(), model.lm_head.weight)
    torch.testing.assert_close(grad, expected_grad)
    assert (kl > 0).all() and token_logprobs(model, seqs, 0.7, kl_to=log_p.detach())[2].abs().max() < 1e-5
    forward = token_logprobs(model, seqs, 0.7, chunk=2, kl_to=other, kl_forward=True)[2]
    torch.testing.assert_close(forward, (other.exp() * (other - log_p)).sum(-1))


def test_the_known_word_reward_is_the_share_of_known_whole_words():
    """The exact reward, on hand-made rollouts: each completion's share of words found in the train split, its first
    and last words skipped (the window or the prompt may cut them), 0 for a completion without a whole word."""
    from types import SimpleNamespace
    from rewards import known_words
    texts = ['ab xx the king blorf zz', 'ab yy king king king zz', 'ab qqqqqqqqqqqqqqqqqqqq']
    r = SimpleNamespace(completions=[t[3:] for t in texts], known_words={'the', 'king'}, seqs=torch.zeros(3, 1))
    rewards, per_position = known_words(r)
    assert rewards.tolist() == pytest.approx([2 / 3, 1.0, 0.0]) and per_position is None


def test_a_rewards_texts_are_decoded_once_and_only_when_read():
    """Decoding the rollouts costs a step time: a reward's texts are decoded when it first reads them, once, and the
    completions the n-gram judge decoded already are taken as they are."""
    from train_grpo import RewardInputs
    calls = []

    class Letters:
        def decode(self, ids):
            calls.append(ids)
            return ''.join(chr(97 + i) for i in ids)
    seqs = torch.tensor([[0, 1, 2], [3, 4, 5]])
    r = RewardInputs(seqs=seqs, prompt_lengths=[1, 2], tokenizer=Letters(), decoded=None)
    assert not calls
    assert r.prompts == ['a', 'de'] and r.completions == ['bc', 'f'] == r.completions and len(calls) == 4
    assert RewardInputs(seqs=seqs, prompt_lengths=[1, 2], tokenizer=Letters(), decoded=['x', 'y']).completions == \
        ['x', 'y'] and len(calls) == 4


def test_the_known_word_reward_plays_through_grpo(judge_case, char_ckpt):
    """The trainer plays it end to end: rewards are shares, no teacher's compute, no reward-threshold stop. (Whether
    a few RL steps raise it is a matter of the floating-point path on a tiny model, not of the code: the reward's
    effect is measured in docs/results.md, not here.)"""
    m = positive_control_run(judge_case, 'words.pt', char_ckpt, '--reward=known_words', '--max_steps=4')
    assert len(m['history']) == 4 and all(0 <= h['reward'] <= 1 for h in m['history'])
    assert m['teacher_flops'] == 0 and m['stop_reason'] == 'max_steps'


@pytest.mark.parametrize('args, message', [
    (['--reward=teacher'], 'needs --teacher_path'),
    (['--teacher_kl_weight=1'], 'needs --reward=teacher'),
    (['--teacher_kl=both'], "teacher_kl must be 'reverse' or 'forward'"),
    (['--reward=known_words', '--token_advantages=True'], 'drop --token_advantages'),
    (['--reward=known_words', '--judge_update_interval=1'], 'it stays frozen'),
    (['--reward=exact'], "reward must be 'judge'"),
    (['--reward=no_such_module:f'], 'cannot load it'),
    (['--objective=dpg'], 'pass --beta=0'),
    (['--objective=judge_teacher', '--beta=0', '--reward=known_words'], 'per-prefix log-odds'),
    (['--objective=ppo'], 'objective must be'),
    (['--law_positions=4'], 'with --objective=judge_teacher'),
    (['--reward=teacher_ratio'], 'needs --teacher_path'),
    (['--teacher_sampled=False'], 'leaves the exact term alone'),
    (['--reward_shuffle=True', '--judge_off=True'], 'permutes whole completions')])
def test_positive_control_settings_are_checked(args, message, char_ckpt):
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', '--reward_model_path=x.pt', *args)
    assert r.returncode != 0 and message in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
