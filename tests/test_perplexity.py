import json
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, evaluate_perplexity
from early_stopping import EarlyStopping
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))


def test_perplexity_matches_hand_computation():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=4, vocab_size=7, n_layer=1, n_head=1, n_embd=8)).eval()
    torch.nn.init.normal_(m.transformer.wte.weight, std=1.0)
    tokens = np.array([1, 3, 5, 2, 6, 0, 4, 4, 1, 2, 3], dtype=np.uint16)  # 10 predictions: windows 4, 4, 2
    nll = []
    for start in (0, 4, 8):
        x = torch.tensor(tokens[start:start + 4].astype(np.int64))
        n = min(4, len(tokens) - 1 - start)
        for t in range(n):
            logits, _ = m(x[None, :t + 1])  # the prediction for position t+1 from the window's own prefix
            nll.append(-F.log_softmax(logits[0, -1], -1)[int(tokens[start + t + 1])].item())
    ce, ppl = evaluate_perplexity(m, tokens, batch_size=1)
    assert len(nll) == 10
    assert math.isclose(ce, sum(nll) / 10, rel_tol=1e-5) and math.isclose(ppl, math.exp(ce), rel_tol=1e-9)
    assert math.isclose(evaluate_perplexity(m, tokens, batch_size=5)[0], ce, rel_tol=1e-5)  # batching agnostic
    _, _, windows = evaluate_perplexity(m, tokens, batch_size=2, per_window=True)
    assert np.allclose(windows, [np.mean(nll[:4]), np.mean(nll[4:8]), np.mean(nll[8:])], rtol=1e-5)
    hot = []  # at temperature 2 the logits are halved before the softmax
    for start in (0, 4, 8):
        x = torch.tensor(tokens[start:start + 4].astype(np.int64))
        logits = m.lm_head(m.hidden_states(x[None]))[0] / 2
        n = min(4, len(tokens) - 1 - start)
        hot += [-F.log_softmax(logits[t], -1)[int(tokens[start + t + 1])].item() for t in range(n)]
    assert math.isclose(evaluate_perplexity(m, tokens, batch_size=3, temperature=2.0)[0], np.mean(hot), rel_tol=1e-5)


def test_early_stopping_helper():
    es = EarlyStopping(patience=2, min_delta=0.1)
    assert es.step(1.0) and not es.should_stop
    assert not es.step(0.95)  # improvement smaller than min_delta
    assert not es.should_stop
    assert not es.step(0.99) and es.should_stop
    es2 = EarlyStopping(patience=2, min_delta=0.1)
    es2.load_state_dict(es.state_dict())
    assert es2.should_stop and es2.best == 1.0
    up = EarlyStopping(patience=1, mode='max')
    assert up.step(0.1) and up.step(0.2) and not up.step(0.2) and up.should_stop
    assert not EarlyStopping(patience=0).should_stop


def test_configurator_types():
    from configurator import UserError, configure
    import pytest
    defaults = {'lr': 1e-3, 'steps': 10, 'name': 'x', 'top_k': None, 'flag': False}
    c = configure(defaults, ['--lr=1', '--steps=20', '--name=1603', '--top_k=5', '--flag=True'])
    assert (c.lr, c.steps, c.name, c.top_k, c.flag) == (1.0, 20, '1603', 5, True)
    with pytest.raises(UserError, match="--steps expects a int"):
        configure(defaults, ['--steps=2.5'])
    with pytest.raises(UserError, match="unknown config key 'stepz'"):
        configure(defaults, ['--stepz=2'])


@pytest.fixture(scope='module')
def tail_base(tmp_path_factory, char_data):
    """A tiny base that holds out a 2,000-token selection tail, as a run folder (base_model_v1.pt, config.json)."""
    from conftest import toy_run_config, train_tiny
    run = tmp_path_factory.mktemp('tail_base')
    train_tiny(char_data, str(run), '--max_iters=30', '--eval_interval=10', '--select_tokens=2000')
    os.replace(run / 'ckpt.pt', run / 'base_model_v1.pt')
    (run / 'config.json').write_text(json.dumps(toy_run_config(char_data)))
    return run


def test_the_tail_calibrated_temperature_is_the_tails_best_and_scales_with_the_logits(tail_base, char_data, capsys):
    """calibration.calibrated_temperature: the temperature at which the base reads its held-out selection tail best (Newton's
    method in 1/T, where the cross-entropy is convex). Known answer: the final LayerNorm's weight and
    bias times s multiply every logit by s, so the calibrated temperature is s times the model's own; a base that
    holds out no tail is a one-line error (a temperature fit on val would be read on val)."""
    from configurator import UserError
    from data_loader import generator_train_tokens
    from model import load_checkpoint
    from shared import calibrated_temperature
    ckpt = load_checkpoint(str(tail_base / 'base_model_v1.pt'))
    model = GPT.from_checkpoint(ckpt)
    train = np.memmap(os.path.join(char_data, 'train.bin'), dtype=np.uint16, mode='r')
    tail = train[len(generator_train_tokens(train, ckpt)):]
    T, ppl, ppl_at_1 = calibrated_temperature(model, ckpt, char_data, 'cpu')
    assert ppl_at_1 == pytest.approx(evaluate_perplexity(model, tail)[1])
    assert ppl <= min(ppl_at_1, *(evaluate_perplexity(model, tail, temperature=T * f)[1] for f in (0.97, 1.03)))
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(1.7)
        model.transformer.ln_f.bias.mul_(1.7)
    assert calibrated_temperature(model, ckpt, char_data, 'cpu')[0] == pytest.approx(1.7 * T, rel=2e-3)
    assert 'bound' not in capsys.readouterr().err
    with torch.no_grad():  # logits 20x the fit's: its best lies past the search's bracket, [0.5, 3], and it says so
        model.transformer.ln_f.weight.mul_(20 / 1.7)
        model.transformer.ln_f.bias.mul_(20 / 1.7)
    assert calibrated_temperature(model, ckpt, char_data, 'cpu')[0] == pytest.approx(3.0, rel=1e-3)
    assert "lies at the search's bound, T = 3" in capsys.readouterr().err
    ckpt['held_out'] = dict(tokens=0, of=len(train))
    with pytest.raises(UserError, match='no selection tail'):
        calibrated_temperature(model, ckpt, char_data, 'cpu')


def test_the_temperature_fits_newton_steps_read_the_cross_entropys_own_slope_and_curvature(tail_base, char_data):
    """evaluate.temperature_moments: the tail's cross-entropy at inverse temperature beta with its first two
    derivatives, which Newton's method in calibrated_temperature steps by. Known answer: each matches the central
    differences of evaluate_perplexity's cross-entropy (to 1e-3 of its scale, float32 logits), and at the fit the
    slope is 0."""
    from data_loader import generator_train_tokens
    from calibration import calibrated_temperature, trunk_states, temperature_moments
    from model import load_checkpoint
    ckpt = load_checkpoint(str(tail_base / 'base_model_v1.pt'))
    model = GPT.from_checkpoint(ckpt)
    train = np.memmap(os.path.join(char_data, 'train.bin'), dtype=np.uint16, mode='r')
    tail = train[len(generator_train_tokens(train, ckpt)):]
    states, eps = trunk_states(model, tail, 'cpu'), 0.02
    for beta in (0.6, 1.0, 1.7):
        ce, slope, curvature = temperature_moments(model, states, beta)
        at = [evaluate_perplexity(model, tail, temperature=1 / b)[0] for b in (beta - eps, beta, beta + eps)]
        assert ce == pytest.approx(at[1], rel=1e-5)
        assert slope == pytest.approx((at[2] - at[0]) / (2 * eps), abs=1e-3)
        assert curvature == pytest.approx((at[2] - 2 * at[1] + at[0]) / eps ** 2, rel=0.02) and curvature > 0
    T = calibrated_temperature(model, ckpt, char_data, 'cpu')[0]
    assert temperature_moments(model, states, 1 / T)[1] == pytest.approx(0, abs=1e-3)


def test_a_trained_checkpoint_records_its_calibrated_temperature_and_sample_and_evaluate_read_it(
        tail_base, char_ckpt, char_data, tmp_path, monkeypatch):
    """calibration.py: train.py with a selection tail records the fit in the checkpoint when it stops; the record is
    read only for the weights and tail it was fit on (a copy into other weights is fit anew); sample.py
    --temperature=calibrated and evaluate.py --temperatures=calibrated sample at it. A checkpoint with no tail, or a
    word the option does not take, stops in one line."""
    import json
    import calibration
    from conftest import run_script
    from model import load_checkpoint
    path = str(tail_base / 'base_model_v1.pt')
    ckpt = load_checkpoint(path)
    T = calibration.calibrated_temperature(GPT.from_checkpoint(ckpt), ckpt, char_data, 'cpu')[0]
    assert ckpt['calibrated']['temperature'] == T and T != pytest.approx(1, abs=0.01)
    monkeypatch.setattr(calibration, 'fit_temperature', lambda *a, **k: pytest.fail('fit again'))
    assert calibration.checkpoint_calibrated_temperature(ckpt, None, 'cpu')[0] == T  # the record, no fit
    other = dict(ckpt, model={k: v * 1.01 if k.endswith('ln_f.weight') else v for k, v in ckpt['model'].items()})
    with pytest.raises(pytest.fail.Exception, match='fit again'):  # another model's record is not its own
        calibration.checkpoint_calibrated_temperature(other, None, 'cpu')
    monkeypatch.undo()
    r = run_script('sample.py', f'--ckpt_path={path}', '--temperature=calibrated', '--num_samples=1',
                   '--max_new_tokens=8', '--device=cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split('temperature ')[1].split(':')[0]) == pytest.approx(T, abs=1e-4)
    out = tmp_path / 'eval.json'
    r = run_script('evaluate.py', path, '--dataset', char_data, '--referee', path, '--temperatures', 'calibrated,1.0',
                   '--num_samples', '8', '--judge_seeds', '0', '--no_mauve', '--no_ppl', '--c2st_folds', '0',
                   '--device', 'cpu', '--out', str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p['temperature'] for p in json.loads(out.read_text())] == [T, 1.0]
    for script, option in (('sample.py', '--temperature=calibrated'), ('sample.py', '--temperature=hot')):
        r = run_script(script, f'--ckpt_path={char_ckpt}', option, '--device=cpu')
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert 'no selection tail' in run_script('sample.py', f'--ckpt_path={char_ckpt}', '--temperature=calibrated',
                                             '--device=cpu').stderr
    r = run_script('evaluate.py', char_ckpt, '--dataset', char_data, '--referee', char_ckpt, '--temperatures',
                   'calibrated', '--device', 'cpu', '--out', str(tmp_path / 'no' / 'eval.json'))
    assert r.returncode == 2 and 'no selection tail' in r.stderr and not (tmp_path / 'no').exists()


def test_comma_separated_checkpoints_are_one_generator_each_member_at_its_calibrated_temperature(
        tail_base, char_data, bpe_ckpt, judge_case, tmp_path):
    """calibration.load_generator: sample.py --ckpt_path=a.pt,b.pt (its tilt by a --judge too; evaluate.py's a.pt,b.pt,
    prepare_reward_data.py --model_path=a.pt,b.pt) read one model.Ensemble whose next-token law is the mean of its
    members' laws, each at its own calibrated temperature (known answer: the mean of the softmaxes of z_a / T_a and
    z_b / T_b). A member of another tokenization, or a missing one, stops in one line."""
    import json
    import torch.nn.functional as F
    from calibration import load_generator
    from conftest import prepare_reward, run_script, train_tiny
    from model import Ensemble, load_checkpoint
    a = str(tail_base / 'base_model_v1.pt')
    train_tiny(char_data, str(tmp_path / 'b'), '--max_iters=20', '--eval_interval=10', '--select_tokens=2000',
               '--seed=7')
    b = str(tmp_path / 'b' / 'ckpt.pt')
    Ts = [load_checkpoint(p)['calibrated']['temperature'] for p in (a, b)]
    ensemble = GPT.from_checkpoint(load_generator(f'{a},{b}', None, 'cpu'))
    assert isinstance(ensemble, Ensemble) and Ts[0] != pytest.approx(Ts[1], abs=1e-3)
    x = torch.from_numpy(np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)[:64].astype(np.int64))
    x = x.view(2, 32)
    mean = sum(F.softmax(GPT.from_checkpoint(p)(x, all_logits=True)[0] / T, -1) for p, T in zip((a, b), Ts)) / 2
    torch.testing.assert_close(F.softmax(ensemble(x, all_logits=True)[0], -1), mean)
    r = run_script('sample.py', f'--ckpt_path={a},{b}', '--num_samples=1', '--max_new_tokens=8', '--device=cpu')
    assert r.returncode == 0 and f"each at its calibrated temperature: {Ts[0]:.4f}, {Ts[1]:.4f}" in r.stdout, r.stderr
    r = run_script('sample.py', f'--ckpt_path={a},{b}', f"--judge={judge_case / 'blind.pt'}", '--resample=2',
                   '--num_samples=2', '--max_new_tokens=8', '--device=cpu')  # the ensemble's tilt
    assert r.returncode == 0 and 'kept 1 of 2 candidates' in r.stdout, r.stderr[-2000:]
    out = tmp_path / 'eval.json'
    r = run_script('evaluate.py', f'{a},{b}', '--dataset', char_data, '--referee', a, '--num_samples', '8',
                   '--judge_seeds', '0', '--no_mauve', '--c2st_folds', '0', '--device', 'cpu', '--out', str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    point = json.loads(out.read_text())[0]
    assert point['checkpoint'] == f'{os.path.abspath(a)},{os.path.abspath(b)}'
    val = np.memmap(os.path.join(char_data, 'val.bin'), dtype=np.uint16, mode='r')
    assert point['val_perplexity'] == pytest.approx(evaluate_perplexity(ensemble, val)[1], rel=1e-5)
    prepare_reward(f'{a},{b}', tmp_path / 'rd', '--max_blocks', '4', data=char_data)
    meta = (tmp_path / 'rd' / 'train_metadata.txt').read_text()
    assert f'model_path: {os.path.abspath(a)},{os.path.abspath(b)}' in meta
    for other, said in ((bpe_ckpt, 'tokenization mismatch'), (a.replace('base_model_v1', 'missing'), 'not found')):
        r = run_script('sample.py', f'--ckpt_path={a},{other}', '--device=cpu')
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_calibrated_base_is_the_base_at_its_tails_temperature(tail_base, char_data, tmp_path):
    """calibrate_base.py: the base with its tail-calibrated temperature folded into its weights (model.fold_temperature)
    scores every window as the base at that temperature, and its own calibrated temperature is 1; the run folder it
    writes is one the benches take. A base with no tail, or an out_dir that holds a base, is a one-line error and
    leaves nothing written."""
    from conftest import ROOT, run_script
    from model import load_checkpoint
    from shared import calibrated_temperature
    script = os.path.join(ROOT, 'benchmarks', 'calibrate_base.py')
    r = run_script(script, '--run', str(tail_base), '--out_dir', str(tmp_path / 'cal'), '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    base = load_checkpoint(str(tail_base / 'base_model_v1.pt'))
    T = calibrated_temperature(GPT.from_checkpoint(base), base, char_data, 'cpu')[0]
    folded = load_checkpoint(str(tmp_path / 'cal' / 'base_model_v1.pt'))
    assert folded['folded_temperature'] == T and 'optimizer' not in folded and T != pytest.approx(1, abs=0.01)
    val = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    assert evaluate_perplexity(GPT.from_checkpoint(folded), val)[0] == pytest.approx(
        evaluate_perplexity(GPT.from_checkpoint(base), val, temperature=T)[0], rel=1e-5)
    T_folded = calibrated_temperature(GPT.from_checkpoint(folded), folded, char_data, 'cpu')[0]
    assert T_folded == pytest.approx(1, abs=2e-3)
    assert (tmp_path / 'cal' / 'config.json').read_text() == (tail_base / 'config.json').read_text()
    assert float(r.stdout.split('folded at T = ')[1].split()[0]) == pytest.approx(T, abs=1e-3)  # 4 digits printed
    # what the temperature gives on val, window by window, beside the two perplexities
    from verdict import perplexity_effect
    (_, p1, ce1), (_, pT, ceT) = (evaluate_perplexity(GPT.from_checkpoint(base), val, temperature=t, per_window=True)
                                  for t in (1.0, T))
    e = perplexity_effect(ceT, ce1)
    import re
    printed = re.search(r'ppl ([0-9.]+) at T = 1, ([0-9.]+) at T = [0-9.]+: (\w+)[^%]*? ([-+][0-9.]+)%', r.stdout)
    assert [float(v) for v in printed.group(1, 2)] == pytest.approx([p1, pT], abs=1e-4)  # 4 decimals printed
    assert printed.group(3) == e['label'] and float(printed.group(4)) / 100 == pytest.approx(e['effect'], abs=1e-4)
    r = run_script(script, '--run', str(tail_base), '--out_dir', str(tmp_path / 'cal'))
    assert r.returncode == 2 and 'already holds a base' in r.stderr and 'Traceback' not in r.stderr
    n = len(np.memmap(os.path.join(char_data, 'train.bin'), dtype=np.uint16, mode='r'))
    torch.save({**base, 'held_out': dict(tokens=0, of=n)}, tmp_path / 'base_model_v1.pt')
    (tmp_path / 'config.json').write_text((tail_base / 'config.json').read_text())
    r = run_script(script, '--run', str(tmp_path), '--out_dir', str(tmp_path / 'none'), '--device', 'cpu')
    assert r.returncode == 2 and 'no selection tail' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'none').exists()


def test_the_ensemble_of_calibrated_bases_is_written_sampled_and_never_trained(tail_base, char_data, tmp_path):
    """calibrate_base.py --run R1,R2: each base at its own tail-calibrated temperature, written as one ensemble (a
    base ensembled with its twin is its calibrated self: the same val perplexity, effect 0); bases of other tails are a
    one-line error that writes nothing; train.py refuses to start from an ensemble. bench_judge_curve.py samples an
    ensemble's negatives and reads its judge against the ensemble of its members each trained further for half the
    point's FLOPs and calibrated again (shared.ensemble_mle_control)."""
    import shutil
    from conftest import ROOT, run_script
    from model import Ensemble, load_checkpoint
    script = os.path.join(ROOT, 'benchmarks', 'calibrate_base.py')
    twin = tmp_path / 'twin'
    shutil.copytree(tail_base, twin)
    out = tmp_path / 'ensemble'
    r = run_script(script, '--run', f'{tail_base},{twin}', '--out_dir', str(out), '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    ensemble = GPT.from_checkpoint(str(out / 'base_model_v1.pt'))
    assert isinstance(ensemble, Ensemble) and len(ensemble.members) == 2
    import re
    first, pair = re.search(r'ppl ([0-9.]+) the first base at T = [0-9.]+, ([0-9.]+) the ensemble', r.stdout).groups()
    label, effect = re.search(r'the ensemble: (\w+)[^%]*? ([-+][0-9.]+)%', r.stdout.splitlines()[-1]).groups()
    # the ensemble with its twin is the base up to float32 rounding, whose sign is the CPU's: 'equal', never a sign
    assert float(first) == pytest.approx(float(pair), rel=1e-4) and label == 'equal' and abs(float(effect)) < 1e-3
    val = np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)
    T = float(r.stdout.split('folded at T = ')[1].split()[0])
    assert evaluate_perplexity(ensemble, val)[1] == pytest.approx(
        evaluate_perplexity(GPT.from_checkpoint(str(tail_base / 'base_model_v1.pt')), val, temperature=T)[1], rel=1e-4)
    for args, message in (([f'--run={out}'], 'holds an ensemble: calibrate its members'),  # one T is not each's
                          ([f'--run={tail_base}', '--temperature=nan'], 'not a finite number')):
        r = run_script(script, *args, '--out_dir', str(tmp_path / 'refused'), '--device', 'cpu')
        assert r.returncode == 2 and message in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / 'refused').exists()
    other = tmp_path / 'other_tail'
    shutil.copytree(tail_base, other)
    ckpt = load_checkpoint(str(other / 'base_model_v1.pt'))
    torch.save({**ckpt, 'held_out': dict(ckpt['held_out'], tokens=3000)}, other / 'base_model_v1.pt')
    r = run_script(script, '--run', f'{tail_base},{other}', '--out_dir', str(tmp_path / 'mixed'), '--device', 'cpu')
    assert r.returncode == 2 and 'one held-out tail' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'mixed').exists()
    ensemble_path = out / 'base_model_v1.pt'
    for script, *args in (('train.py', f'--dataset={char_data}', f'--out_dir={tmp_path / "t"}',
                           f'--init_from={ensemble_path}', '--max_iters=1', '--block_size=32'),
                          ('train_grpo.py', f'--policy_path={ensemble_path}', f'--out_path={tmp_path / "g.pt"}',
                           f'--reward_model_path={tmp_path / "none.pt"}', '--device=cpu'),
                          ('train_spin.py', f'--policy_path={ensemble_path}', f'--out_path={tmp_path / "s.pt"}',
                           f'--dataset={char_data}', '--device=cpu')):
        r = run_script(script, *args)
        assert r.returncode != 0 and 'never trained' in r.stderr and 'Traceback' not in r.stderr, (script, r.stderr)
    curve = os.path.join(ROOT, 'benchmarks', 'bench_judge_curve.py')
    common = ['--run', str(out), '--windows', '0', '--negatives', '1', '--select_windows', '4', '--num_samples', '12',
              '--read_negatives', '2']
    r = run_script(curve, *common)
    assert r.returncode == 0, r.stderr[-3000:]
    row = next(line for line in r.stdout.splitlines() if 'C = ' in line)
    assert not any(cell.strip(' |') == '–' for cell in row.split(' | ')[-3:]), row
    # its MLE control: each member trained further for half the point's FLOPs, then at its own tail temperature
    control_path, = (out / 'recipes').glob('*/mle_at_*_flops_s1337.pt')
    control, flops = load_checkpoint(str(control_path)), float(control_path.name.split('_')[2])
    from calibration import base_calibrated_temperature
    from run_cycles import DEFAULTS, mle_args
    from configurator import configure
    with open(out / 'config.json') as f:
        C = configure(DEFAULTS, [f'--{k}={v}' for k, v in json.load(f).items() if k in DEFAULTS])
    x = torch.from_numpy(val[:32].astype(np.int64))[None]
    for i, member in enumerate(GPT.from_checkpoint(control).members):
        trained_path = str(control_path) + f'.member{i}.pt'
        trained = load_checkpoint(trained_path)
        assert trained['config']['max_iters'] == mle_args(C, trained_path, flops / 2, 0)[0] < mle_args(
            C, trained_path, flops, 0)[0]
        T = base_calibrated_temperature(trained_path, char_data, 'cpu')[0]
        assert torch.allclose(member(x)[0], GPT.from_checkpoint(trained)(x)[0] / T, atol=1e-4)
    r = run_script(curve, *common, '--over_seeds', '1337,1337')
    assert r.returncode == 0 and not r.stdout.splitlines()[-1].endswith('| – | – |'), r.stderr[-2000:]


def test_gain_retained_is_a_share_only_of_a_tilt_that_gains():
    """bench_channels' retained column: the arm's gain over its tilt's, and '–' where the tilt gained nothing or lost
    (a share of a loss would read a loss as kept)."""
    from bench_channels import retained_text
    assert retained_text(0.002, 0.004) == '+50%' and retained_text(-0.001, 0.004) == '-25%'
    assert retained_text(0.002, 0.0) == '–' and retained_text(0.002, -0.001) == '–'


@torch.no_grad()
def test_an_ensemble_is_the_mean_of_its_members_laws_read_and_sampled(tmp_path):
    """model.Ensemble: one member, or a member twice, is that member; two members' law is at each token exactly log of
    the mean of their probabilities (so at least the mean of their log-probabilities, Jensen, and at most the better
    one's), held-out perplexity included; its KV-cached sampling draws from that law (each step's entropy is the
    law's, recomputed without a cache, and one member samples its member's tokens); its checkpoint reads back as the
    same ensemble with the smallest held-out tail, and it is never a trainer's start (its members, taken apart, are)."""
    from model import Ensemble, ensemble_checkpoint, ensemble_members, load_checkpoint, sampling_entropy, start_problem
    from tilt import completion_logprob
    torch.manual_seed(0)
    a = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=1, n_head=1, n_embd=8)).eval()
    b = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16)).eval()
    windows = torch.randint(0, 11, (5, 16))
    own = completion_logprob(a, windows, 4, 1.2)
    np.testing.assert_allclose(completion_logprob(Ensemble([a]), windows, 4, 1.2), own, rtol=1e-6)
    np.testing.assert_allclose(completion_logprob(Ensemble([a, a]), windows, 4, 1.2), own, rtol=1e-6)
    pair = Ensemble([a, b])
    la, lb = (torch.log_softmax(m(windows, all_logits=True)[0].double(), -1) for m in (a, b))
    np.testing.assert_allclose(pair(windows, all_logits=True)[0].double(), torch.log((la.exp() + lb.exp()) / 2),
                               atol=1e-6)
    lp, la_c, lb_c = (completion_logprob(m, windows, 4) for m in (pair, a, b))
    assert (lp >= (la_c + lb_c) / 2 - 1e-6).all() and (lp <= np.maximum(la_c, lb_c) + 1e-6).all()
    tokens = np.random.default_rng(0).integers(0, 11, 200).astype(np.uint16)
    ce = evaluate_perplexity(pair, tokens)[0]
    assert evaluate_perplexity(a, tokens)[0] != pytest.approx(ce) and pair.flops_per_token() == \
        a.flops_per_token() + b.flops_per_token()
    gen = torch.Generator().manual_seed(3)
    out, ent = pair.generate(windows[:, :4], 12, 0.8, generator=gen, entropy=True, sampler='static')
    for t in range(4, 16):  # the cached steps' laws are the ensemble's own, read afresh on each prefix
        torch.testing.assert_close(ent[:, t - 4], sampling_entropy(pair(out[:, :t])[0][:, -1], 0.8), atol=1e-5,
                                   rtol=1e-5)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(a.generate(windows[:, :4], 12, 0.8, generator=g1),
                       Ensemble([a]).generate(windows[:, :4], 12, 0.8, generator=g2))
    ckpts = [dict(model=m.state_dict(), model_args=vars(m.config).copy(), tokenization=dict(method='char'),
                  held_out=dict(tokens=n, of=1000)) for m, n in ((a, 300), (b, 200))]
    path = tmp_path / 'ensemble.pt'
    torch.save(ensemble_checkpoint(ckpts), path)
    ckpt = load_checkpoint(str(path))
    back = GPT.from_checkpoint(ckpt)
    assert isinstance(back, Ensemble) and ckpt['held_out'] == dict(tokens=200, of=1000)
    torch.testing.assert_close(back(windows, all_logits=True)[0], pair(windows, all_logits=True)[0])
    assert 'never trained' in start_problem(ckpt, str(path)) and start_problem(ckpts[0], 'a') == ''
    for member, model in zip(ensemble_members(ckpt), (a, b), strict=True):  # its members, each a start again
        assert start_problem(member, 'm') == '' and member['held_out'] == ckpt['held_out']
        torch.testing.assert_close(GPT.from_checkpoint(member)(windows, all_logits=True)[0],
                                   model(windows, all_logits=True)[0])
    with pytest.raises(ValueError, match='never trained'):
        GPT.from_checkpoint(ckpt, mode='reward')


def test_the_ensemble_bench_reads_an_ensemble_against_the_calibrated_base(tail_base, char_data, tmp_path):
    """bench_ensemble.py: a base ensembled with itself is the calibrated base (effect 0 on every draw, its twin's too);
    with a wider base of another seed, each draw's row reads the wider member and the ensemble against the calibrated
    base (each effect's sign the perplexities'), and the compute line each member's FLOPs; a run without a base is a
    one-line error."""
    import shutil
    from conftest import ROOT, run_script, train_tiny
    script = os.path.join(ROOT, 'benchmarks', 'bench_ensemble.py')
    twin = tmp_path / 'twin'
    shutil.copytree(tail_base, twin)
    r = run_script(script, '--runs', f'{tail_base},{twin}', '--draws', '1,2', '--windows', '8', '--num_samples', '16',
                   '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split(' | ') for line in r.stdout.splitlines() if line.startswith(('| 1 |', '| 2 |'))]
    assert len(rows) == 2
    for row in rows:  # every ppl the same, and each effect 'equal' at 0 (float32 rounding has the CPU's sign)
        ppls = [float(v) for v in row[1].split(' / ')]
        assert ppls == pytest.approx([ppls[0]] * len(ppls), rel=1e-4), row
        assert all(cell.split()[0] == 'equal' and abs(float(cell.split()[1].rstrip('%'))) < 1e-3 for cell in row[2:4])
    other = tmp_path / 'other'
    train_tiny(char_data, str(other), '--max_iters=30', '--eval_interval=10', '--select_tokens=2000', '--seed=7',
               '--n_embd=64')
    os.replace(other / 'ckpt.pt', other / 'base_model_v1.pt')
    shutil.copy(tail_base / 'config.json', other / 'config.json')
    r = run_script(script, '--runs', f'{tail_base},{other}', '--draws', '1,2', '--windows', '8', '--num_samples', '16',
                   '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    assert '**over 2 draws**' in r.stdout and "2 bases' training" in r.stdout and '(2 forward passes)' in r.stdout
    # calibrate_base.py on two different bases: each member folded at its own tail-calibrated temperature
    from model import ensemble_checkpoint, ensemble_members, load_checkpoint
    from shared import base_calibrated_temperature
    cal = run_script(os.path.join(ROOT, 'benchmarks', 'calibrate_base.py'), '--run', f'{tail_base},{other}',
                     '--out_dir', str(tmp_path / 'pair'), '--device', 'cpu')
    assert cal.returncode == 0, cal.stderr[-2000:]
    own = [base_calibrated_temperature(str(d / 'base_model_v1.pt'), char_data, 'cpu')[0] for d in (tail_base, other)]
    assert abs(own[0] - own[1]) > 1e-3  # two temperatures, so folding one into both would show
    x = torch.from_numpy(np.fromfile(os.path.join(char_data, 'val.bin'), dtype=np.uint16)[:32].astype(np.int64))[None]
    members = ensemble_members(load_checkpoint(str(tmp_path / 'pair' / 'base_model_v1.pt')))
    for member, d, T in zip(members, (tail_base, other), own, strict=True):
        base = GPT.from_checkpoint(str(d / 'base_model_v1.pt'))
        torch.testing.assert_close(GPT.from_checkpoint(member)(x, all_logits=True)[0],
                                   base(x, all_logits=True)[0] / T, rtol=1e-4, atol=1e-4)
    # its MLE control would train the wider member with the first run's recipe: refused in one line
    from configurator import UserError
    from shared import ensemble_mle_control
    mixed = tmp_path / 'mixed.pt'
    torch.save(ensemble_checkpoint([load_checkpoint(str(d / 'base_model_v1.pt')) for d in (tail_base, other)]), mixed)
    with pytest.raises(UserError, match="members differ in shape or dropout"):
        ensemble_mle_control({}, str(mixed), 1e9, str(tmp_path / 'mixed_mle.pt'), 1, 'cpu')
    for row in (line.split(' | ') for line in r.stdout.splitlines() if line.startswith(('| 1 |', '| 2 |'))):
        first, wide, pair = (float(v) for v in row[1].split(' / '))
        assert (first > wide) == (row[2].split('%')[0].split()[-1][0] == '+') and len(row) == 4
    flops = r.stdout.split("each member's ")[1].split(' / ')
    assert len(flops) == 2 and float(flops[1]) > 2 * float(flops[0])
    r = run_script(script, '--runs', f'{tail_base},{tmp_path / "none"}')
    assert r.returncode == 2 and 'lacks base_model_v1.pt' in r.stderr and 'Traceback' not in r.stderr
