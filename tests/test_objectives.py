"""The rewards' one home (rewards.py) and the objectives whose fixed point is the judge's tilt: the KL inside the
reward, distribution matching (dpg, resample_mle) and the judge as a next-token teacher, on known cases."""
import os
import re

import numpy as np
import pytest
import torch

from conftest import positive_control_run, run_script, same_weights, script_python, toy_run_config
from model import GPT, evaluate_perplexity, load_checkpoint
from policy import token_logprobs
from train_grpo import group_advantages, grpo_loss


def test_the_kl_inside_the_reward_gives_the_gradient_of_the_regularised_objective(char_ckpt):
    """The fixed point made right (--reward_form=log_odds --kl_in_reward=True --beta=0 --scale_rewards=none): with
    the completion's exact log-ratio to the reference inside the reward and centred, unscaled advantages, the mean
    update of the loss points along the gradient of E_pi[f] - KL(pi || pi_ref), which is computed exactly here by
    enumerating every two-token completion of a prompt (G-sized groups shrink it by (G - 1) / G)."""
    from rewards import kl_regularised
    torch.manual_seed(0)
    policy = GPT.from_checkpoint(char_ckpt)
    reference = GPT.from_checkpoint(char_ckpt).requires_grad_(False)
    with torch.no_grad():  # a policy already moved away from its reference
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    V, P, G, n = policy.config.vocab_size, 4, 8, 10000
    prompt = torch.arange(1, P + 1)[None, :]
    f_table = torch.randn(V, V, generator=torch.Generator().manual_seed(1))  # the judge: any function of the text

    def regularised(seqs):  # (f, log pi, log pi_ref, mask) of two-token completions
        mask = torch.zeros(len(seqs), P + 1)
        mask[:, P - 1:] = 1
        logps = token_logprobs(policy, seqs, 1.0)[0]
        return f_table[seqs[:, P], seqs[:, P + 1]], logps, token_logprobs(reference, seqs, 1.0)[0], mask

    grid = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    f, logps, ref, mask = regularised(torch.cat([prompt.repeat(V * V, 1), grid], 1))
    log_pi = (logps * mask).sum(1)
    objective = (log_pi.exp() * (f - log_pi + (ref * mask).sum(1))).sum()  # E_pi[f] - KL(pi || pi_ref), exactly
    exact = torch.autograd.grad(objective, list(policy.parameters()))
    with torch.no_grad():
        seqs = policy.generate(prompt.repeat(n, 1), 2, generator=torch.Generator().manual_seed(2))
    f, logps, ref, mask = regularised(seqs)
    advantages = group_advantages(kl_regularised(f, logps.detach(), ref, mask), G, 'none')[0]
    loss = grpo_loss(logps, logps.detach(), None, advantages, mask, beta=0.0, loss_type='dr_grpo',
                     max_completion_length=2)[0]
    update = torch.autograd.grad(-loss, list(policy.parameters()))
    flat = [torch.cat([g.flatten() for g in grads]) for grads in (exact, update)]
    cosine = float(torch.nn.functional.cosine_similarity(*flat, dim=0))
    ratio = float(flat[1].norm() / flat[0].norm()) / ((G - 1) / G / 2)  # dr_grpo divides by 2 completion tokens
    # (the same reward without the KL inside it reads cosine 0.85 and ratio 0.29 here)
    assert cosine > 0.97 and 0.85 < ratio < 1.15, (cosine, ratio)


def test_a_users_reward_plugs_in_as_a_function_of_texts(tmp_path, judge_case, char_ckpt):
    """--reward=file.py:function (or module:function) plays a user's own reward, called as TRL calls its
    reward_funcs: with the prompts' and completions' texts and ids, one float back a completion; a function that
    returns the wrong number of scores is refused with a one-line error."""
    from types import SimpleNamespace
    from configurator import UserError
    from rewards import user_reward
    (tmp_path / 'my_rewards.py').write_text(
        "def vowels(prompts, completions, prompt_ids, completion_ids, **kwargs):\n"
        "    assert len(prompts) == len(completions) == len(prompt_ids) == len(completion_ids)\n"
        "    return [sum(c in 'aeiou' for c in text) for text in completions]\n"
        "def short(prompts, completions, **kwargs):\n"
        "    return [1.0]\n")
    r = SimpleNamespace(seqs=torch.tensor([[1, 2, 3], [4, 5, 6]]), prompt_lengths=[1, 2], prompts=['x', 'yy'],
                        completions=['aeb', 'zz'])
    rewards, per_position = user_reward(f"{tmp_path / 'my_rewards.py'}:vowels")(r)
    assert rewards.tolist() == [2.0, 0.0] and per_position is None
    with pytest.raises(UserError, match='returned 1 scores for 2 completions'):
        user_reward(f"{tmp_path / 'my_rewards.py'}:short")(r)
    m = positive_control_run(judge_case, 'user.pt', char_ckpt, f"--reward={tmp_path / 'my_rewards.py'}:vowels",
                             '--max_steps=2')
    assert all(h['reward'] >= 0 and h['reward'] == int(h['reward'] * 32) / 32 for h in m['history'])


USER_REWARDS = """\
def vowel_share(prompts, completions, **kw):
    return [sum(c in 'aeiou' for c in text) / max(len(text), 1) for text in completions]
def broken(prompts, completions, **kw):
    return [1 / 0 for text in completions]
def short(prompts, completions, **kw):
    return [0.0]
def nan_third(prompts, completions, **kw):
    return [0.0, 0.0, float('nan')] + [0.0] * (len(completions) - 3)
"""


def test_a_reward_that_reads_no_judge_runs_without_one_and_several_are_weighted(tmp_path, char_ckpt):
    """TRL's GRPOTrainer(model, reward_funcs=[fn]) needs no judge: nor does --reward=file.py:fn here (the judge's
    instruments off, said once); several rewards are summed with --reward_weights, each one's mean logged."""
    import json
    (tmp_path / 'myreward.py').write_text(USER_REWARDS)
    common = [f'--policy_path={char_ckpt}', '--device=cpu', '--max_steps=2', '--prompts_per_step=4',
              '--num_generations=4', '--eval_interval=1']
    vowel = f"{tmp_path / 'myreward.py'}:vowel_share"
    r = run_script('train_grpo.py', *common, f'--reward={vowel}', f"--out_path={tmp_path / 'vowel.pt'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count('no judge') == 2 and 'sight' not in r.stdout.split('no judge')[1].split('\n')[1]
    rows = [json.loads(line) for line in (tmp_path / 'vowel_log.jsonl').read_text().splitlines()]
    assert len(rows) == 2 and all(0 <= row['reward'] <= 1 and row['judge_sight'] is None for row in rows)
    r = run_script('train_grpo.py', *common, f'--reward=known_words,{vowel}', '--reward_weights=0.5,2',
                   f"--out_path={tmp_path / 'both.pt'}")
    assert r.returncode == 0, r.stderr[-2000:]
    for row in (json.loads(line) for line in (tmp_path / 'both_log.jsonl').read_text().splitlines()):
        parts = row['reward_known_words'], row[f'reward_{vowel}']
        assert 0 < parts[1] < 1 and row['reward'] == pytest.approx(0.5 * parts[0] + 2 * parts[1], abs=1e-6)
    assert 'known_words 0.' in r.stdout and f'{vowel} 0.' in r.stdout


@pytest.mark.parametrize('args, message', [
    (['--reward=DIR:broken'], 'myreward.py:broken raised ZeroDivisionError: division by zero ('),
    (['--reward=DIR:short'], 'myreward.py:short returned 1 scores for 16 completions'),
    (['--reward=DIR:nan_third'], 'myreward.py:nan_third returned nan for completion 2 ('),
    (['--reward=known_words,DIR:vowel_share', '--reward_weights=1'], '2 finite numbers, comma-separated'),
    (['--reward=known_words,known_words'], 'names a reward twice'),
    (['--reward=judge'], 'pass --reward_model_path=PATH')])
def test_a_broken_reward_is_one_line_before_any_update_and_leaves_nothing(tmp_path, char_ckpt, args, message):
    (tmp_path / 'myreward.py').write_text(USER_REWARDS)
    args = [a.replace('DIR', str(tmp_path / 'myreward.py')) for a in args]
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', '--device=cpu', '--max_steps=2',
                   '--prompts_per_step=4', '--num_generations=4', f"--out_path={tmp_path / 'out' / 'p.pt'}", *args)
    assert r.returncode == 2 and message in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
    if args[0].endswith(':broken'):  # the user's file and the line that raised
        assert f"{tmp_path / 'myreward.py'}, line 4)" in r.stderr
    assert not (tmp_path / 'out').exists() and r.stderr.strip().splitlines()[-1].startswith('error:')


def test_the_tilts_advantages_weigh_each_group_by_its_own_weights():
    """dpg: G·w - 1 with w the softmax of a group's log-weights (a group of equal weights: all 0); resample_mle: G at
    the one rollout kept, drawn in proportion to w (a weight of 1 is always kept)."""
    from train_grpo import tilt_advantages
    log_w = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, -50.0, -50.0, -50.0])
    adv, equal, _, ess = tilt_advantages(log_w, 4, 'dpg', None)
    assert adv[:4].abs().max() < 1e-6 and adv[4] == pytest.approx(3.0) and adv[5:] == pytest.approx([-1.0] * 3)
    assert equal == 1 and ess == pytest.approx((4 + 1) / 2)
    adv, *_ = tilt_advantages(log_w, 4, 'resample_mle', np.random.default_rng(0))
    assert sorted(adv[:4].tolist()) == [0, 0, 0, 4] and adv[4:].tolist() == [4, 0, 0, 0]


@torch.no_grad()
def forward_kl_to(teacher_path, policy_path, data_dir, n=16):
    """The exact forward KL(teacher || policy) per token, over the vocabulary, on n fixed val windows."""
    teacher, policy = GPT.from_checkpoint(str(teacher_path)), GPT.from_checkpoint(str(policy_path))
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
    N = policy.config.block_size
    x = torch.from_numpy(np.stack([np.asarray(val[i * N:(i + 1) * N], dtype=np.int64) for i in range(n)]))
    law = torch.log_softmax(teacher(x[:, :-1], all_logits=True)[0], -1)
    return float(token_logprobs(policy, x, 1.0, kl_to=law, kl_forward=True)[2].mean())


@pytest.mark.parametrize('objective', ['dpg', 'resample_mle', 'judge_teacher'])
def test_the_tilts_objectives_carry_a_tiny_teachers_sequence_ratio(judge_case, char_ckpt, char_data, objective):
    """The known case of distribution matching: the reward is a tiny teacher's exact sequence log-ratio to the
    reference (--reward=teacher_ratio, one scalar a completion, as a judge gives it), whose tilt at scale 1 is the
    teacher; every objective brings the nearly uniform generator closer to it: the exact forward KL to the teacher
    falls. dpg and resample_mle log the weights' effective sample size (1 to G); judge_teacher distils the tilt's
    next-token law, at scale 1 the teacher's own (its logged KL to that law falls too)."""
    d, start = judge_case, judge_case / 'gen' / 'ckpt.pt'
    m = positive_control_run(d, f'{objective}.pt', start, '--reward=teacher_ratio', f'--teacher_path={char_ckpt}',
                             f'--objective={objective}', '--beta=0', '--loss_type=dr_grpo')
    before = forward_kl_to(char_ckpt, start, char_data)
    after = forward_kl_to(char_ckpt, d / f'{objective}.pt', char_data)
    assert after < 0.97 * before, (before, after)  # 24 steps: dpg -11%, resample_mle -7%, judge_teacher -66%
    if objective == 'judge_teacher':
        kls = [h['teacher_kl'] for h in m['history']]
        assert kls[-1] < kls[0] and all(h['ess'] is None for h in m['history']), kls
    else:
        assert all(1 <= h['ess'] <= 4 for h in m['history'])


def test_the_judge_teachers_law_is_the_teachers_at_scale_one_and_a_token_judges_by_its_scores(char_ckpt):
    """judge_teacher's law: from teacher_ratio at scale 1, the teacher's next-token law exactly; from a token judge,
    pi_ref's law reweighted by e^{a·f(x<t v)} (tilt.judge_token_scores) and normalised over the vocabulary. With
    law_positions, the same law at that many completion targets a row, drawn among them (elsewhere pi_ref's own)."""
    from types import SimpleNamespace
    from tilt import judge_token_scores
    from train_grpo import judge_teacher_law
    from runtime import setup_runtime
    torch.manual_seed(0)
    reference = GPT.from_checkpoint(str(char_ckpt))
    teacher = GPT.from_checkpoint(str(char_ckpt))
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.1 * torch.randn_like(p))
    judge = GPT.from_checkpoint(str(char_ckpt), mode='reward', reward_pooling='token')
    with torch.no_grad():  # its head starts at zero, silent: give it a view
        for p in judge.reward_head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    seqs = torch.randint(reference.config.vocab_size, (3, 12))
    mask = (torch.arange(11) >= torch.tensor([[2], [5], [7]])).float()  # prompts of 3, 6 and 8 tokens
    batch = SimpleNamespace(seqs=seqs, mask=mask)
    C = SimpleNamespace(judge_update_interval=0, temperature=1.0, reward='teacher_ratio', reward_scale=1.0,
                        law_positions=0)
    run = SimpleNamespace(C=C, rt=setup_runtime('cpu', 'auto', 'float32', 0), reference=reference, teacher=teacher,
                          policy=None, reward_model=judge, law_rng=np.random.default_rng(0))
    law, read_at = judge_teacher_law(run, batch)
    with torch.no_grad():
        torch.testing.assert_close(law, torch.log_softmax(teacher(seqs[:, :-1], all_logits=True)[0], -1),
                                   atol=1e-5, rtol=0)
        assert torch.equal(read_at, mask)
        C.reward, C.reward_scale = 'judge', 0.5
        log_ref = torch.log_softmax(reference(seqs[:, :-1], all_logits=True)[0], -1)
        f = judge_token_scores(judge, seqs, torch.arange(1, 12)).float()
        expected = torch.log_softmax(log_ref + 0.5 * f, -1)
        torch.testing.assert_close(judge_teacher_law(run, batch)[0], expected, atol=1e-5, rtol=0)
        C.law_positions = 4
        drawn, read_at = judge_teacher_law(run, batch)
        assert read_at.sum(1).tolist() == [4, 4, 4] and not (read_at * (1 - mask)).any()
        torch.testing.assert_close(drawn[read_at.bool()], expected[read_at.bool()], atol=1e-5, rtol=0)
        torch.testing.assert_close(drawn[~read_at.bool()], log_ref[~read_at.bool()], atol=1e-5, rtol=0)
        assert not torch.equal(judge_teacher_law(run, batch)[1], read_at)  # drawn afresh


def test_a_token_judge_co_trained_online_teaches_through_its_next_token_law(tmp_path, char_ckpt, char_data,
                                                                             char_reward):
    """--objective=judge_teacher with a token judge that keeps up (binary: natural windows against the policy's own
    rollouts, every step), its law read at 3 drawn positions a rollout (--law_positions): the law's KL is logged each
    step, the judge moves and is saved, and the law's cost (V candidate tokens a position read, through the judge)
    is in the run's FLOPs. More positions than the shortest completion has is a one-line error."""
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={tmp_path / "tj.pt"}', '--device=cpu', '--max_iters=5', '--reward_pooling=token')
    assert r.returncode == 0, r.stderr[-2000:]
    game = [f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "tj.pt"}', f'--dataset={char_data}',
            '--device=cpu', '--max_steps=3', '--eval_interval=100', '--beta=0', '--objective=judge_teacher',
            '--reward_scale=0.5', '--judge_update_interval=1', '--judge_loss=binary', '--judge_natural_windows=8',
            '--prompts_per_step=2', '--num_generations=2', f'--out_path={tmp_path / "p.pt"}']
    r = run_script('train_grpo.py', *game, '--law_positions=3')
    assert r.returncode == 0, r.stderr[-3000:]
    m = load_checkpoint(str(tmp_path / 'p.pt'))['metrics']
    kls = [h['teacher_kl'] for h in m['history']]  # the first step's judge barely reads (5 iterations): a KL of ~0
    assert all(h['judge_loss'] is not None for h in m['history']) and min(kls) > -1e-6 and kls[-1] > 1e-4, kls
    assert not same_weights(tmp_path / 'p_judge.pt', tmp_path / 'tj.pt')
    start, policy = GPT.from_checkpoint(str(tmp_path / 'tj.pt')), GPT.from_checkpoint(str(char_ckpt))
    V, N = policy.config.vocab_size, policy.config.block_size
    assert m['flops'] > 3 * 4 * 3 * V * start.flops_per_token()
    r = run_script('train_grpo.py', *game, f'--law_positions={N}')
    assert r.returncode != 0 and 'more than the shortest completion' in r.stderr and 'Traceback' not in r.stderr


def test_the_share_a_game_carries_is_read_in_the_judges_nats():
    """bench_share.py's per-seed figures on hand numbers: an arm 1% below its control in perplexity gains -ln(0.99)
    nats a token, 120 of them a completion; an arm above its control loses."""
    seed_share = bench_share_module().seed_share
    effect, gain = seed_share(5.94, 6.0, 120)
    assert effect == pytest.approx(0.01) and gain == pytest.approx(-np.log(0.99) * 120)
    effect, gain = seed_share(6.06, 6.0, 120)
    assert effect == pytest.approx(-0.01) and gain < 0


def bench_share_module():
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
    import bench_share
    return bench_share


def arm_checkpoint(path, policy_path, data_dir, temperature_of_arm=1.0, flops=0):
    """A stand-in for a train_grpo.py arm: the policy at policy_path made exactly the policy at another temperature
    (its final layer norm's output, so its logits, divided by it), with the options bench_share reads."""
    ckpt = load_checkpoint(policy_path)
    model = {k: v / temperature_of_arm if k.startswith('transformer.ln_f.') else v for k, v in ckpt['model'].items()}
    torch.save(dict(ckpt, model=model, metrics=dict(flops=flops),
                    config=dict(policy_path=policy_path, dataset=data_dir, temperature=1.0, top_k=None,
                                ppl_max_tokens=0, min_prompt_len=1, max_prompt_len=0)), path)
    return str(path)


def test_the_calibrated_control_is_the_base_at_its_tail_temperature(tmp_path, char_data):
    """--control calibrated: the base at the temperature its held-out tail reads best. An arm that is exactly that
    (its base's logits over T) reads the control's cross-entropy on every window: no gain to credit."""
    from types import SimpleNamespace
    from conftest import train_tiny
    from calibration import base_calibrated_temperature
    bench_share = bench_share_module()
    train_tiny(char_data, str(tmp_path / 'base'), '--max_iters=30', '--eval_interval=10', '--select_tokens=3000')
    base = str(tmp_path / 'base' / 'ckpt.pt')
    T = base_calibrated_temperature(base, char_data, 'cpu')[0]
    assert abs(T - 1) > 0.01  # a base that is not calibrated already, so the test can tell
    arm = arm_checkpoint(tmp_path / 'arm.pt', base, char_data, temperature_of_arm=T)
    windows = bench_share.seed_windows(arm, 7, 20, 'cpu')
    ce, note = bench_share.control_ce(SimpleNamespace(control='calibrated'), [], 7, arm, None, windows, 1.0)
    assert note == f" (T {T:.3f})"
    np.testing.assert_allclose(ce, bench_share.window_ce(GPT.from_checkpoint(arm), windows, 1.0), rtol=1e-4)


def test_the_matched_temperature_control_finds_a_temperature_it_is_given(tmp_path, char_ckpt, char_data):
    """An arm that is its base at T = 1.05 (logits divided by 1.05) samples with that entropy, so the matched
    temperature is 1.05 and the control's cross-entropy is the arm's own on every window: no gain. The arm that is
    its base reads T* = 1."""
    bench_share = bench_share_module()
    hot = arm_checkpoint(tmp_path / 'hot.pt', char_ckpt, char_data, temperature_of_arm=1.05)
    windows = bench_share.seed_windows(hot, 7, 20, 'cpu')
    t_star, outside, ce = bench_share.matched_temperature_ce(hot, 7, windows, 32, [0.9, 1.0, 1.05, 1.1])
    assert t_star == pytest.approx(1.05, abs=1e-3) and not outside
    np.testing.assert_allclose(ce, bench_share.window_ce(GPT.from_checkpoint(hot), windows, 1.0), rtol=1e-3)
    between = bench_share.matched_temperature_ce(hot, 7, windows, 32, [0.9, 1.0, 1.1])[0]  # interpolated: near it
    assert between == pytest.approx(1.05, abs=0.01)
    same = arm_checkpoint(tmp_path / 'same.pt', char_ckpt, char_data)
    assert bench_share.matched_temperature_ce(same, 7, windows, 32, [0.9, 1.0, 1.1])[0] == pytest.approx(1.0)
    assert bench_share.matched_temperature_ce(hot, 7, windows, 32, [0.8, 0.9])[1]  # beyond the sweep: flagged


def test_each_seed_reads_its_own_val_windows_by_one_reader(tmp_path, char_ckpt, char_data):
    """bench_share's evaluation draws are the seed's own: random val windows from the seed (the same seed, the same
    windows); the reader's perplexity over them is the model's at the arm's temperature."""
    bench_share = bench_share_module()
    arm = arm_checkpoint(tmp_path / 'arm.pt', char_ckpt, char_data)
    a, b = bench_share.seed_windows(arm, 1338, 10, 'cpu'), bench_share.seed_windows(arm, 2001, 10, 'cpu')
    assert a.shape == (10, 32) and not torch.equal(a, b)
    assert torch.equal(a, bench_share.seed_windows(arm, 1338, 10, 'cpu'))
    model = GPT.from_checkpoint(arm)
    ce = bench_share.window_ce(model, a, 1.0)
    assert ce.shape == (10,)
    np.testing.assert_allclose(ce, [evaluate_perplexity(model, w.numpy(), 32)[0] for w in a], rtol=1e-5)
    assert bench_share.window_ce(model, a, 2.0).mean() != pytest.approx(ce.mean())


def test_bench_share_resumes_a_run_its_evaluations_saved_and_reuses_a_finished_one(tmp_path, char_ckpt, char_data,
                                                                                  monkeypatch):
    """train_grpo.py writes its checkpoint at every evaluation: bench_share reruns (resumes) a run whose checkpoint
    has no final perplexity yet, and reads a finished one without running it."""
    bench_share = bench_share_module()
    calls = []
    monkeypatch.setattr(bench_share.subprocess, 'run', lambda cmd, check: calls.append(cmd))
    path = arm_checkpoint(tmp_path / 'arm.pt', char_ckpt, char_data)
    bench_share.run(['--seed=1'], path)
    assert len(calls) == 1 and f'--out_path={path}' in calls[0] and '--resume=True' in calls[0]
    ckpt = load_checkpoint(path)
    torch.save(dict(ckpt, metrics=dict(ckpt['metrics'], final_val_ppl=5.0)), path)
    assert bench_share.run(['--seed=1'], path)['final_val_ppl'] == 5.0 and len(calls) == 1


def test_bench_share_trains_a_run_once_when_two_reads_ask_for_it_at_once(tmp_path, char_ckpt, char_data,
                                                                        monkeypatch):
    """Reads side by side (plateau_game.sh PARALLEL=1) may both find an arm unfinished: the lock on its name lets one
    train it while the other waits, then reads the finished run without training it again."""
    import threading
    import time
    bench_share = bench_share_module()
    path = arm_checkpoint(tmp_path / 'arm.pt', char_ckpt, char_data)
    calls = []

    def train(cmd, check):  # a slow run that finishes the arm
        calls.append(cmd)
        time.sleep(0.5)
        ckpt = load_checkpoint(path)
        torch.save(dict(ckpt, metrics=dict(ckpt['metrics'], final_val_ppl=5.0)), path)
    monkeypatch.setattr(bench_share.subprocess, 'run', train)
    reads = [threading.Thread(target=bench_share.run, args=(['--seed=1'], path)) for _ in range(2)]
    for t in reads:
        t.start()
    for t in reads:
        t.join()
    assert len(calls) == 1 and load_checkpoint(path)['metrics']['final_val_ppl'] == 5.0


def test_the_judge_that_played_is_each_games_own(tmp_path):
    """bench_share divides by the worth of the judge the arm played: the n-gram judge's texts beside the arm, the
    online judge's checkpoint beside it, or the frozen reward model; a reward that is no judge has no share."""
    bench_share = bench_share_module()
    cases = [(dict(reward='judge', judge='ngram', judge_update_interval=1), str(tmp_path / 'a_judge.json')),
             (dict(reward='judge', judge='model', judge_update_interval=1, reward_model_path='rm.pt'),
              str(tmp_path / 'a_judge.pt')),
             (dict(reward='judge', judge='model', judge_update_interval=0, reward_model_path='rm.pt'), 'rm.pt'),
             (dict(reward='teacher_ratio', judge='model', judge_update_interval=0), None)]
    for config, expected in cases:
        torch.save(dict(config=config), tmp_path / 'a.pt')
        assert bench_share.played_judge(str(tmp_path / 'a.pt')) == expected, config
    assert bench_share.share_text(0.1, 0.05, None, None) == 'not defined (the reward is no judge)'


@pytest.fixture(scope='module')
def plateau_run(tmp_path_factory, char_ckpt, char_data):
    """A toy plateau run (base and config.json) whose n-gram games plateau_game.sh played, two seeds."""
    import json
    import shutil
    import subprocess
    from conftest import ROOT
    run = tmp_path_factory.mktemp('plateau') / 'run'
    run.mkdir()
    shutil.copy(char_ckpt, run / 'base_model_v1.pt')
    cfg = toy_run_config(char_data)
    (run / 'config.json').write_text(json.dumps(cfg))
    env = dict(os.environ, RUN=str(run), OUT=str(run / 'out'), TOY='1', DEVICE='cpu', SEEDS='1338,2001',
               PY=script_python())
    r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'play', 'ngram_frozen'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return run, env


def test_the_plateau_games_read_divides_by_the_worth_of_the_judge_that_played(plateau_run):
    """plateau_game.sh read (PARALLEL=1): every control's table names each seed's own judge file, as its game saved
    it, with its worth read on the base the game started from (shared.judge_worth on the seed's own draw)."""
    import subprocess
    import numpy as np
    from conftest import ROOT
    judge_worth = bench_share_module().judge_worth  # benchmarks/shared.py's
    run, env = plateau_run
    r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'read', 'ngram_frozen'], cwd=ROOT,
                       env=dict(env, PARALLEL='1'), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count('share of the worth of the judge that played') == 4  # shuffled, base, temperature, mle
    val = np.memmap(os.path.join(env_dataset(run), 'val.bin'), dtype=np.uint16, mode='r')
    for seed in (1338, 2001):
        judge = run / 'game' / f'ngram_frozen_s{seed}_judge.json'
        worth = judge_worth(str(judge), str(run / 'base_model_v1.pt'), val, 8, [seed, 1], 'cpu')
        rows = [line for line in r.stdout.splitlines() if line.startswith(f'| {seed} |')]
        assert len(rows) == 4 and all(f"{judge.name}: {worth['dv']:.2f} [" in row for row in rows), rows


def test_the_plateau_games_read_stops_when_the_shuffled_read_fails(plateau_run, tmp_path):
    """The shuffled read finishes any arm cut short before the other controls read side by side: if it fails, the
    script says so in one line and exits 1 before any other read starts."""
    import subprocess
    from conftest import ROOT
    run, env = plateau_run
    py = tmp_path / 'py'
    py.write_text('#!/usr/bin/env bash\n[[ " $* " == *" --control shuffled "* ]] && { echo broken >&2; exit 3; }\n'
                  f'exec {script_python()} "$@"\n')
    py.chmod(0o755)
    out = tmp_path / 'out'
    r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'read', 'ngram_frozen'], cwd=ROOT,
                       env=dict(env, PARALLEL='1', PY=str(py), OUT=str(out)), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and 'the shuffled read of ngram_frozen failed' in r.stderr, r.stderr
    assert not list(out.glob('read_*'))  # no other control was started


def test_a_failed_parallel_read_ends_the_reads_beside_it(tmp_path):
    """PARALLEL=1: when one control's read fails, stop ends the reads still running beside it (every process under
    each) and waits for them, so none trains on after the script has exited. The reads are stand-ins: the base read
    fails at once, the temperature and MLE reads would run for minutes."""
    import subprocess
    import time
    from conftest import ROOT
    py, started = tmp_path / 'py', tmp_path / 'started'
    py.write_text('#!/usr/bin/env bash\ncase " $* " in\n  *" --control shuffled "*) exit 0 ;;\n'
                  '  *" --control base "*) sleep 1; echo broken >&2; exit 3 ;;\nesac\n'
                  f'sleep 300 & echo $! >> {started}\nwait\n')
    py.chmod(0o755)
    env = dict(os.environ, RUN=str(tmp_path / 'run'), OUT=str(tmp_path / 'out'), PARALLEL='1', PY=str(py))
    t0 = time.time()
    r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'read', 'ngram_frozen'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and 'the base read of ngram_frozen failed' in r.stderr, r.stderr
    sleepers = [int(pid) for pid in started.read_text().split()]
    assert len(sleepers) == 2 and time.time() - t0 < 60
    for pid in sleepers:  # each gone, or a zombie that no one reaps (here PID 1 may not)
        state = subprocess.run(['ps', '-o', 'stat=', '-p', str(pid)], capture_output=True, text=True).stdout.strip()
        assert state in ('', 'Z'), (pid, state)


def test_the_plateau_game_plays_a_saved_judge_frozen(plateau_run):
    """plateau_game.sh play ngram_saved: the n-gram judge at JUDGE played frozen from the first step (no warm-up),
    beside its shuffled control, and named as the judge that played; without a JUDGE file, or with an unknown arm, a
    one-line error and exit 2."""
    import subprocess
    from conftest import ROOT
    run, env = plateau_run
    judge = str(run / 'game' / 'ngram_frozen_s1338_judge.json')
    r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'play', 'ngram_saved'], cwd=ROOT,
                       env=dict(env, SEEDS='1338', JUDGE=judge, STEPS='2'), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ('ngram_saved_s1338.pt', 'ngram_saved_shuffled_s1338.pt'):
        ckpt = load_checkpoint(str(run / 'game' / name))
        assert ckpt['config']['reward_model_path'] == judge and ckpt['metrics']['judge_warmup'] == []
        assert len(ckpt['metrics']['history']) == 2
    assert bench_share_module().played_judge(str(run / 'game' / 'ngram_saved_s1338.pt')) == judge
    for arm, extra, says in (('ngram_saved', {}, 'plays the n-gram judge at JUDGE'),
                             ('ngram_other', {}, 'no arm ngram_other')):
        r = subprocess.run(['bash', 'benchmarks/plateau_game.sh', 'play', arm], cwd=ROOT,
                           env=dict(env, **extra), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def env_dataset(run):
    import json
    return json.load(open(run / 'config.json'))['dataset']


def test_the_mle_control_trains_the_base_for_the_arms_flops(tmp_path, char_ckpt, char_data):
    """--control mle: the base trained further by next-token loss for the arm's FLOPs with its run's options
    (run_cycles.mle_args); no run config beside the base is a one-line error."""
    import json
    import shutil
    from run_cycles import DEFAULTS, mle_args
    from configurator import configure
    bench_share = bench_share_module()
    base = tmp_path / 'run' / 'base_model_v1.pt'
    base.parent.mkdir()
    shutil.copy(char_ckpt, base)
    arm = arm_checkpoint(tmp_path / 'arm.pt', str(base), char_data, flops=1e6)
    with pytest.raises(SystemExit, match='config.json is missing'):
        bench_share.mle_path(arm, load_checkpoint(arm)['metrics'], 3, str(tmp_path / 'mle.pt'))
    cfg = toy_run_config(char_data)
    (base.parent / 'config.json').write_text(json.dumps(cfg))
    flops = 3 * GPT.from_checkpoint(str(base)).flops_per_token(backward=True) * 8 * 32
    arm = arm_checkpoint(tmp_path / 'arm.pt', str(base), char_data, flops=flops)
    path = bench_share.mle_path(arm, load_checkpoint(arm)['metrics'], 3, str(tmp_path / 'mle.pt'))
    iters, _ = mle_args(configure(DEFAULTS, [f'--{k}={v}' for k, v in cfg.items()]), str(base), flops, 3)
    assert iters == 3 and not os.path.exists(tmp_path / 'mle.pt.work') and path == str(tmp_path / 'mle.pt')
    assert not same_weights(tmp_path / 'mle.pt', base)


def test_an_mle_control_cut_off_goes_on_from_its_last_evaluation(tmp_path, monkeypatch, char_ckpt, char_data):
    """shared.mle_control: a control killed after an evaluation leaves its state in out.work, and the same call again
    asks train.py to resume it there, ending with the weights of a control never stopped."""
    import subprocess
    import train
    from conftest import kill_after_save
    bench_share_module()  # benchmarks/ on the path
    import shared
    cfg = toy_run_config(char_data)
    flops = 6 * GPT.from_checkpoint(char_ckpt).flops_per_token(backward=True) * 8 * 32  # 6 iterations, 3 evaluations
    whole = shared.mle_control(cfg, char_ckpt, flops, str(tmp_path / 'whole.pt'), 5)
    commands, real_run = [], subprocess.run

    def recorded(cmd, **kw):
        commands.append(cmd)
        if len(commands) == 1:  # the first call: its command run here, cut right after the evaluation at 2
            kill_after_save(monkeypatch, train, at=2)
            with pytest.raises(KeyboardInterrupt):
                train.main(cmd[2:])
            raise KeyboardInterrupt
        assert os.path.exists(os.path.join(tmp_path / 'cut.pt.work', 'ckpt_resume.pt'))  # left for train.py
        return real_run(cmd, **kw)
    monkeypatch.setattr(subprocess, 'run', recorded)
    with pytest.raises(KeyboardInterrupt):
        shared.mle_control(cfg, char_ckpt, flops, str(tmp_path / 'cut.pt'), 5)
    shared.mle_control(cfg, char_ckpt, flops, str(tmp_path / 'cut.pt'), 5)
    assert len(commands) == 2 and commands[1][-1] == '--resume=True'
    assert same_weights(whole, tmp_path / 'cut.pt') and not (tmp_path / 'cut.pt.work').exists()


def test_the_plateau_is_read_against_mle_controls_at_each_learning_rate(tmp_path, char_ckpt, char_data):
    """bench_plateau.py: one MLE control a seed and a held learning rate (0: the cycle's rule, the base's final one;
    run_cycles.mle_learning_rate otherwise), each read against the base on the seed's own windows, and a line that
    says whether the base is at its plateau; a folder without a base is a one-line error."""
    import json
    import shutil
    from conftest import ROOT
    from conftest import train_tiny
    run = tmp_path / 'run'
    run.mkdir()
    # a base that held out its selection tail, as run_cycles.py's do
    train_tiny(char_data, str(tmp_path / 'base'), '--max_iters=60', '--eval_interval=20', '--select_tokens=4000')
    shutil.copy(tmp_path / 'base' / 'ckpt.pt', run / 'base_model_v1.pt')
    cfg = toy_run_config(char_data)
    (run / 'config.json').write_text(json.dumps(cfg))
    flops = 4 * GPT.from_checkpoint(char_ckpt).flops_per_token(backward=True) * 8 * 32
    r = run_script(os.path.join(ROOT, 'benchmarks', 'bench_plateau.py'), '--run', str(run), '--flops', str(flops),
                   '--seeds', '1,2,3', '--learning_rates', '0,1e-5', '--ppl_windows', '10')
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count('**over 3 seeds**') == 2 and re.search(r'plateau: (yes|no) \(the MLE control reads', r.stdout)
    assert re.search(r'in word units \([\d.]+ tokens a word on val, spaces included\): the rule: ', r.stdout)
    fit = re.search(r'base v1 perplexity: its training tokens \(the first [\d,]+ of [\d,]+\) ([\d.]+), its selection '
                    r'tail \(4,000 tokens\) [\d.]+, val ([\d.]+): train ([+-][\d.]+)% of val '
                    r'\((within 1%: no over-fit|over 1% apart)\)', r.stdout)
    calibrated = re.search(r'the tail-calibrated temperature ([\d.]+): val ppl ([\d.]+) there '
                           r'\(([+-][\d.]+)% of T = 1', r.stdout)
    assert calibrated and float(calibrated[3]) == pytest.approx(100 * (float(calibrated[2]) / float(fit[2]) - 1),
                                                                abs=0.015)
    assert fit and float(fit[3]) == pytest.approx(100 * (float(fit[1]) / float(fit[2]) - 1), abs=0.15)
    for lr, held in (('0', 3e-4), ('1e-05', 1e-5)):
        for seed in (1, 2, 3):
            control = load_checkpoint(str(run / 'plateau' / f'mle_lr{lr}_s{seed}.pt'))
            assert control['config']['learning_rate'] == pytest.approx(held) and control['config']['seed'] == seed
    r = run_script(os.path.join(ROOT, 'benchmarks', 'bench_plateau.py'), '--run', str(tmp_path), '--flops', '1')
    assert r.returncode == 2 and 'lacks base_model_v1.pt' in r.stderr and 'Traceback' not in r.stderr


def test_the_shuffled_judge_control_plays_the_same_rewards_on_other_texts(judge_case, char_ckpt):
    """--reward_shuffle: each step's rewards permuted across its rollouts. The first step's rollouts are the arm's
    (the same seed), so its rewards have the same mean and spread, but each sits on another text: the policy moves
    elsewhere."""
    arm = positive_control_run(judge_case, 'words_arm.pt', char_ckpt, '--reward=known_words', '--max_steps=2')
    shuffled = positive_control_run(judge_case, 'words_shuffled.pt', char_ckpt, '--reward=known_words',
                                    '--max_steps=2', '--reward_shuffle=True')
    first, other = arm['history'][0], shuffled['history'][0]
    assert first['reward'] == pytest.approx(other['reward']) and first['reward_std'] == pytest.approx(other['reward_std'])
    assert not same_weights(judge_case / 'words_arm.pt', judge_case / 'words_shuffled.pt')


def test_a_token_judges_sequence_reward_is_the_telescoped_sequence_log_ratio():
    """A hand-built per-prefix judge whose log-odds are exact log-ratios, f_t = log p_data(x<=t) - log pi(x<=t) (the
    running sum of per-token ratios): the game's reward (rewards.judge_log_odds) is the completion's sequence
    log-ratio, the sum of the ratios after the prompt; the old sum of f_t over the completion weighs an early ratio
    by every later position."""
    from types import SimpleNamespace
    from rewards import judge_log_odds
    torch.manual_seed(0)
    B, N = 6, 12
    ratios = 0.3 * torch.randn(B, N, dtype=torch.float64)
    f = ratios.cumsum(1)
    p = torch.sigmoid(f)
    lengths = torch.tensor([1, 2, 3, 5, 8, 11])
    generated = (torch.arange(N)[None, :] >= lengths[:, None]).float()
    r = SimpleNamespace(probs=torch.stack([p, 1 - p], -1), generated=generated, prompt_lengths=lengths.tolist())
    expected = (ratios * generated).sum(1)
    torch.testing.assert_close(judge_log_odds(r)[0].double(), expected, atol=1e-5, rtol=0)
    assert not torch.allclose((f * generated).sum(1), expected, atol=1e-2)  # the old reward


def test_the_judges_worth_reads_the_log_odds_the_game_plays():
    """tilt.judge_log_odds (what worth.py's bound and the tilt read) gives a token judge's windows the same figure the
    game's reward gives them: its log-odds telescoped after the prompt."""
    from types import SimpleNamespace
    from model import GPTConfig
    from rewards import judge_log_odds as game_reward
    from tilt import judge_log_odds
    torch.manual_seed(0)
    judge = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16, mode='reward',
                          reward_pooling='token')).eval()
    with torch.no_grad():
        for p in judge.reward_head.parameters():
            p.normal_(0, 0.5)
    windows = torch.randint(0, 11, (5, 16))
    with torch.no_grad():
        probs = judge(windows, per_token=True)[0]
    generated = (torch.arange(16)[None, :] >= 4).float().expand(5, -1)
    played = game_reward(SimpleNamespace(probs=probs, generated=generated, prompt_lengths=[4] * 5))[0]
    np.testing.assert_allclose(judge_log_odds(judge, windows, 4), played.double().numpy(), atol=1e-4)


def test_the_shuffled_judge_permutes_rewards_within_each_group():
    """--reward_shuffle's permutation keeps each group's rewards (so its within-group spread, all that centred
    advantages read) and moves them among that group's rollouts only."""
    from train_grpo import shuffled_within_groups
    rewards = torch.arange(24, dtype=torch.float32) * 1.5
    shuffled = shuffled_within_groups(rewards, 4, np.random.default_rng(0))
    for g in range(6):
        assert sorted(shuffled[4 * g:4 * g + 4].tolist()) == rewards[4 * g:4 * g + 4].tolist()
    assert not torch.equal(shuffled, rewards)


def test_top_k_and_an_unanchored_kl_anchor_are_refused_with_one_line(tmp_path):
    """--top_k samples a truncated law while the tilt's games read log pi untruncated: refused with them, as is
    kl_anchor='judge' without an online judge; one line, no traceback, nothing written."""
    common = ['--policy_path=x.pt', '--reward_model_path=y.pt', f'--out_path={tmp_path / "p.pt"}', '--beta=0']
    for extra, message in ((['--kl_in_reward=True', '--top_k=5'], '--top_k samples from a truncated law'),
                           (['--objective=dpg', '--top_k=5'], '--top_k samples from a truncated law'),
                           (['--kl_in_reward=True', '--kl_anchor=judge'], "kl_anchor must be 'reference' or 'judge'")):
        r = run_script('train_grpo.py', *common, *extra)
        assert r.returncode != 0 and message in r.stderr and 'Traceback' not in r.stderr, r.stderr
    assert not os.listdir(tmp_path)


def test_an_online_token_judges_head_update_is_counted_at_every_position():
    """A head-only update of a token judge runs its head at each of the N positions of every row: N times a pooled
    judge's FLOPs."""
    from types import SimpleNamespace
    from train_grpo import judge_update_flops

    def flops(pooling):
        C = SimpleNamespace(judge_batch_size=8, judge_steps=2)
        return judge_update_flops(SimpleNamespace(
            C=C, rt=SimpleNamespace(world_size=1), judge_loss_kind='mse', judge_trunk=False, N=32, head_params=100,
            reward_model=SimpleNamespace(config=SimpleNamespace(reward_pooling=pooling))))
    assert flops('mean') == 8 * 2 * 6 * 100 and flops('token') == 32 * flops('mean')


def test_teacher_ratio_reads_the_reference_pass_the_trainer_already_took(char_ckpt):
    """rewards.teacher_ratio uses the reference's log-probs score() computed for the KL (counted once in the step's
    FLOPs) rather than a second, uncounted pass."""
    from types import SimpleNamespace
    from rewards import teacher_ratio

    class NoPass:
        def __call__(self, *a, **k):
            raise AssertionError('the reference was run again')
    teacher = GPT.from_checkpoint(char_ckpt)
    seqs = torch.randint(0, teacher.config.vocab_size, (3, 10))
    ref_logps = token_logprobs(teacher, seqs, 1.0)[0]
    mask = torch.ones(3, 9)
    r = SimpleNamespace(teacher=teacher, reference=NoPass(), seqs=seqs, mask=mask, temperature=1.0,
                        ref_logps=ref_logps)
    torch.testing.assert_close(teacher_ratio(r)[0], torch.zeros(3), atol=1e-5, rtol=0)


def test_the_kl_anchored_at_the_judge_follows_each_refit(judge_case, char_ckpt):
    """--kl_anchor=judge: at each refit of the online judge the KL's anchor moves to the policy it was just fit
    against (the step's rollout policy). With a refit every step the anchor at step t is the policy of step t - 1:
    the first two steps play as with the anchor held at the reference (pi_0 either way), the third reads the KL to
    pi_1, one step's move, below the held anchor's two."""
    game = ['--judge_update_interval=1', '--judge_warmup_steps=1', '--reward_form=log_odds', '--kl_in_reward=True',
            '--beta=0', '--scale_rewards=none', '--loss_type=dr_grpo', '--max_steps=3', '--warmup_steps=0']
    held = positive_control_run(judge_case, 'anchor_held.pt', char_ckpt, *game)
    moved = positive_control_run(judge_case, 'anchor_judge.pt', char_ckpt, *game, '--kl_anchor=judge')
    for step in (0, 1):
        assert moved['history'][step]['reward'] == pytest.approx(held['history'][step]['reward'])
    assert held['history'][1]['kl'] > 1e-6  # the policy moved at step 0
    assert 0 < moved['history'][2]['kl'] < held['history'][2]['kl']
    assert moved['history'][2]['reward'] != pytest.approx(held['history'][2]['reward'])


def test_the_share_carries_the_worths_uncertainty():
    """Fieller's interval of gain / worth: an exact worth gives the gain's interval over it; an uncertain one widens
    it, more on the high side; a worth whose interval holds 0 has no share."""
    from verdict import share_interval
    assert share_interval(0.3, 0.1, 1.5, [1.5, 1.5]) == pytest.approx([0.2 / 1.5, 0.4 / 1.5])
    lo, hi = share_interval(0.27, 0.16, 0.12, [0.05, 0.20])
    assert lo < 0.11 / 0.12 and hi > 0.43 / 0.12 and hi - 0.27 / 0.12 > 0.27 / 0.12 - lo
    assert share_interval(0.10, 0.06, 0.05, [-0.03, 0.14]) is None
    assert share_interval(0.10, np.inf, 1.5, [1.3, 1.6]) is None  # one seed: no spread to carry
    share_text = bench_share_module().share_text
    assert share_text(0.10, 0.06, 0.05, [-0.03, 0.14]).startswith('not defined')
    assert share_text(0.3, 0.1, 1.5, [1.5, 1.5]) == '20% [13%, 27%]'
    assert share_text(0.3, np.inf, 1.5, [1.4, 1.6]).startswith('20% (no bounded interval')


def test_the_judge_recipes_benchmark_reads_the_new_recipes_in_nats(tmp_path, char_ckpt, char_data):
    """bench_judge_recipes.py --recipes: only the named GPT recipes are trained, the ranking one on --negatives
    continuations of each window's prompt (its data named by K), each read in nats beside the n-gram judges and an MLE
    control named by its FLOPs; an unknown recipe is a one-line error."""
    import json
    import shutil
    from conftest import ROOT
    from reward_dataset_loader import RewardDataset
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(char_ckpt, run / 'base_model_v1.pt')
    cfg = toy_run_config(char_data)
    (run / 'config.json').write_text(json.dumps(cfg))
    script = os.path.join(ROOT, 'benchmarks', 'bench_judge_recipes.py')
    r = run_script(script, '--run', str(run), '--windows', '24', '--epochs', '1', '--num_samples', '16',
                   '--law_windows', '4', '--recipes', 'bidirectional,ranking', '--negatives', '3')
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split(' | ')[0].lstrip('| ') for line in r.stdout.splitlines() if line.startswith('| ')][1:]
    assert rows[:2] == ['bidirectional', 'ranking'] and rows[-1] == 'MLE control, exact log-ratio', rows
    from data_loader import file_sha256
    work = run / 'recipes' / f'base_{file_sha256(run / "base_model_v1.pt")[:12]}'  # keyed by the base
    assert RewardDataset(str(work / 'data_window_24w'), 'train').metadata['model_sha256'] == file_sha256(char_ckpt)
    assert GPT.from_checkpoint(str(work / 'judge_bidirectional_24w.pt')).config.bidirectional
    assert load_checkpoint(str(work / 'judge_ranking3_24w.pt'))['config']['loss'] == 'ranking'
    assert RewardDataset(str(work / 'data_negatives3_24w'), 'train').samples_per_chunk == 3
    assert not list(work.glob('judge_window*')) and len(list(work.glob('mle_at_*_flops.pt'))) == 1
    r = run_script(script, '--run', str(run), '--recipes', 'windows')
    assert r.returncode == 2 and '--recipes takes some of' in r.stderr and 'Traceback' not in r.stderr
    # --select_windows: every recipe selects on held-out train windows of its own data, the n-gram judge its C
    r = run_script(script, '--run', str(run), '--windows', '24', '--epochs', '2', '--num_samples', '16',
                   '--law_windows', '4', '--recipes', 'window', '--select_windows', '6')
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'selected on 6 held-out train windows' in r.stdout and '| n-gram (C = ' in r.stdout
    assert len(RewardDataset(str(work / 'data_window_24w_select6'), 'select')) == 6
    assert 'the checkpoint was selected on 6 held-out train samples' in r.stderr
    assert [p.name for p in work.glob('judge_window*')] == ['judge_window_24w_select6.pt']
    from judge import NgramJudge
    assert NgramJudge.load(str(work / 'judge_ngram_24w_select6.json')).C == float(re.search(r'n-gram \(C = ([\d.]+)\)',
                                                                                      r.stdout).group(1))


def test_the_judge_curve_samples_once_and_nests_its_points(tmp_path, char_ckpt, char_data):
    """bench_judge_curve.py: every train window's negatives are sampled once and serve every point (the windows
    nested, the first k negatives of each); each point's n-gram judge is fit on exactly those texts, chooses its L2
    strength on held-out train windows, is saved, and is read in nats beside an MLE control at its FLOPs, which grow
    with its data; --temperature samples every negative from the base at T, under names of their own; bad counts
    and temperatures are a one-line error."""
    import json
    import shutil
    import numpy as np
    from conftest import ROOT
    from data_loader import file_sha256
    from judge import NgramJudge
    from reward_dataset_loader import RewardDataset
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(char_ckpt, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    script = os.path.join(ROOT, 'benchmarks', 'bench_judge_curve.py')
    r = run_script(script, '--run', str(run), '--windows', '6,0', '--negatives', '1,3', '--select_windows', '4',
                   '--num_samples', '12', '--read_negatives', '2')
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split(' | ') for line in r.stdout.splitlines() if line.startswith('| ') and 'C = ' in line]
    work = run / 'recipes' / f'base_{file_sha256(run / "base_model_v1.pt")[:12]}'
    assert [p.name for p in work.glob('data_*')] == ['data_negatives3_allw_select4_s1337']
    blocks = len(RewardDataset(str(work / 'data_negatives3_allw_select4_s1337'), 'train').natural)
    assert [row[0].lstrip('| ').split(' (')[0] for row in rows] == \
        ['6 / 6', '6 / 18', f'{blocks} / {blocks}', f'{blocks} / {3 * blocks}']
    flops = [float(row[1]) for row in rows]
    assert flops[0] < flops[1] < flops[3] and flops[0] < flops[2] < flops[3]
    small = NgramJudge.load(str(work / 'judge_ngram_curve_6w_1neg_s1337.json'))
    large = NgramJudge.load(str(work / 'judge_ngram_curve_allw_3neg_s1337.json'))
    assert [len(t) for t in small.fitted_on] == [6, 6] and [len(t) for t in large.fitted_on] == [blocks, 3 * blocks]
    assert set(small.fitted_on[0]) <= set(large.fitted_on[0])  # nested
    assert 's a million characters' in r.stdout and len(list(work.glob('mle_at_*_flops_s1337.pt'))) == 4
    assert 'resumed' not in r.stdout
    # a rerun reads the points it recorded (no judge refit) and draws the curve
    stamp = os.path.getmtime(work / 'judge_ngram_curve_6w_1neg_s1337.json')
    again = run_script(script, '--run', str(run), '--windows', '6,0', '--negatives', '1,3', '--select_windows', '4',
                       '--num_samples', '12', '--read_negatives', '2', '--plot', str(tmp_path / 'curve.png'))
    assert again.returncode == 0, again.stderr[-3000:]
    assert [line for line in again.stdout.splitlines() if 'C = ' in line] == \
        [line for line in r.stdout.splitlines() if 'C = ' in line]
    assert os.path.getmtime(work / 'judge_ngram_curve_6w_1neg_s1337.json') == stamp
    assert (tmp_path / 'curve.png').stat().st_size > 0
    # --over_seeds reads the seeds' records together, computing nothing: here one seed twice, so no spread
    common = ['--run', str(run), '--windows', '6,0', '--negatives', '1,3', '--select_windows', '4', '--num_samples',
              '12', '--read_negatives', '2']
    r = run_script(script, *common, '--over_seeds', '1337,1337')
    assert r.returncode == 0, r.stderr[-3000:]
    point = json.loads(next(work.glob('curve_s1337_*.json')).read_text())[-1]
    judge, mle = point['judge']['per_prompt'], point['mle']['per_prompt']
    assert f"| {judge:.2f} / {judge:.2f} | {judge:.2f} [{judge:.2f}, {judge:.2f}] |" in r.stdout.splitlines()[-1]
    assert r.stdout.splitlines()[-1].endswith(f"| {judge - mle:+.2f} [{judge - mle:+.2f}, {judge - mle:+.2f}] |")
    r = run_script(script, *common, '--over_seeds', '1337,7')
    assert r.returncode == 2 and 'no curve recorded for seed 7' in r.stderr and 'Traceback' not in r.stderr
    r = run_script(script, '--run', str(run), '--windows', '5000,x')
    assert r.returncode == 2 and '--windows takes comma-separated counts' in r.stderr and 'Traceback' not in r.stderr
    # --temperature: every negative (the judges' and the read's) from the base at T, under names of their own
    data = work / 'data_negatives1_allw_select4_s1337_T2.5'
    (work / f'{data.name}.progress').mkdir()  # as a cut generation leaves it: its time is then no timing
    hot = run_script(script, *common[:4], '--negatives', '1', *common[6:], '--temperature', '2.5')
    assert hot.returncode == 0, hot.stderr[-3000:]
    assert '(resumed: the time of its last part alone' in hot.stdout and not (work / f'{data.name}.progress').exists()
    assert RewardDataset(str(data), 'train').metadata['temperature'] == '2.5' and 'at temperature 2.5' in hot.stdout
    assert (work / 'judge_ngram_curve_6w_1neg_s1337_T2.5.json').exists() and len(list(work.glob('curve_*_T2.5.json')))
    cold = RewardDataset(str(work / 'data_negatives3_allw_select4_s1337'), 'train')
    assert not np.array_equal(RewardDataset(str(data), 'train').x[:6], cold.x.reshape(-1, 3, cold.block_size)[:6, 0])
    for bad, says in (('calibrated', 'holds out no selection tail'), ('-1', "positive number or 'calibrated'")):
        r = run_script(script, *common, '--temperature', bad)
        assert r.returncode == 2 and says in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]


def test_the_gpt_judge_curve_trains_each_point_on_its_cut(tmp_path, char_ckpt, char_data):
    """bench_judge_curve.py --recipe window: each point's GPT judge trains on a reward dataset cut from the negatives'
    (prepare_reward_data.write_subset: those blocks, the first k samples of each, its FLOPs the kept share), selects on
    the select windows, is saved and read; its point's FLOPs are the n-gram point's (the same negatives) plus its own
    training's, the MLE control is given them, and a rerun (one of fewer negatives too) reads the record without
    sampling or training again."""
    import json
    import shutil
    import numpy as np
    from conftest import ROOT
    from data_loader import file_sha256
    from model import load_checkpoint
    from prepare_reward_data import write_subset
    from reward_dataset_loader import RewardDataset
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(char_ckpt, run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    script = os.path.join(ROOT, 'benchmarks', 'bench_judge_curve.py')
    common = ['--run', str(run), '--windows', '6', '--negatives', '1,3', '--select_windows', '4', '--num_samples', '12',
              '--read_negatives', '2']
    ngram = run_script(script, *common)
    gpt = run_script(script, *common, '--recipe', 'window', '--epochs', '2')
    assert ngram.returncode == 0 and gpt.returncode == 0, (ngram.stderr + gpt.stderr)[-3000:]
    work = run / 'recipes' / f'base_{file_sha256(run / "base_model_v1.pt")[:12]}'
    data = work / 'data_negatives3_allw_select4_s1337'
    rows = [line.split(' | ') for line in gpt.stdout.splitlines() if 'best at step' in line]
    assert [row[0].lstrip('| ').split(' (')[0] for row in rows] == ['6 / 6', '6 / 18']
    ngram_flops = [float(line.split(' | ')[1]) for line in ngram.stdout.splitlines() if 'C = ' in line]
    for k, row, negatives_flops in zip((1, 3), rows, ngram_flops):
        ckpt = load_checkpoint(str(work / f'judge_window_curve_6w_{k}neg_s1337.pt'))
        assert ckpt['flops'] > 0 and float(row[1]) == pytest.approx(negatives_flops + ckpt['flops'], rel=1e-3)
        assert f"best at step {ckpt['iter_num']})" in row[0]
    assert not list(work.glob('*_data')) and len(list(work.glob('curve_window_2ep_s1337_*.json'))) == 1
    # a rerun reads its record without training again; one of fewer negatives reuses the larger count's sampling
    stamp = os.path.getmtime(work / 'judge_window_curve_6w_1neg_s1337.pt')
    again = run_script(script, *common[:4], '--negatives', '1', *common[6:], '--recipe', 'window', '--epochs', '2')
    assert again.returncode == 0 and os.path.getmtime(work / 'judge_window_curve_6w_1neg_s1337.pt') == stamp
    assert [line for line in again.stdout.splitlines() if 'best at step' in line] == \
        [line for line in gpt.stdout.splitlines() if 'best at step' in line][:1]
    assert [p.name for p in work.glob('data_*')] == [data.name]
    # the cut itself: the chosen blocks, the first k samples of each, their share of the generation's FLOPs
    src = RewardDataset(str(data), 'train')
    write_subset(str(data), str(tmp_path / 'cut'), {'train': ([4, 1], 2), 'select': ([0], 3), 'val': ([0, 1], 1)})
    cut = RewardDataset(str(tmp_path / 'cut'), 'train')
    assert cut.samples_per_chunk == 2 and np.array_equal(cut.x, src.x[[12, 13, 3, 4]])
    assert np.array_equal(cut.natural, src.natural[[4, 1]]) and np.array_equal(cut.y, src.y[[12, 13, 3, 4]])
    assert int(cut.metadata['flops']) == int(src.metadata['flops']) * 4 // src.num_samples
    assert RewardDataset(str(tmp_path / 'cut'), 'select').num_samples == 3
    assert not (tmp_path / 'cut.partial').exists()
    with pytest.raises(ValueError, match='k must be 1 to 3'):
        write_subset(str(data), str(tmp_path / 'cut2'), {'train': ([0], 4)})
    assert not (tmp_path / 'cut2.partial').exists()  # a bad pick is refused before anything is written
