import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import ROOT, run_script
from data_loader import unknown_word_rate, words_of
from evaluate import distinct_n, repetition_rate, text_statistics
from model import load_checkpoint
from two_sample import eval_windows
from verdict import compare, label_text, matched_temperature, perplexity_effect


def test_distinct_n_and_repetition_exact_values():
    seqs = [[1, 2, 1, 2, 1], [3, 3, 3]]
    assert distinct_n(seqs, 1) == pytest.approx(3 / 8)  # unique {1, 2, 3} over 8 tokens
    assert distinct_n(seqs, 2) == pytest.approx(3 / 6)  # (1,2) (2,1) (1,2) (2,1) (3,3) (3,3): 3 distinct of 6
    assert distinct_n(seqs, 4) == pytest.approx(2 / 2)
    assert repetition_rate(seqs, 2) == pytest.approx(((1 - 2 / 4) + (1 - 1 / 2)) / 2)
    assert repetition_rate([[1, 2, 3, 4, 5]], 4) == 0.0
    words = text_statistics([[0]], ["the cat the cat sat"])
    assert words['distinct_1_words'] == pytest.approx(3 / 5) and words['distinct_2_words'] == pytest.approx(3 / 4)


def test_unknown_word_rate_skips_cut_words_and_ignores_case():
    assert words_of("O, 'tis Romeo's KING!") == ['o', 'tis', "romeo's", 'king']
    known = {'the', 'king', "romeo's"}
    # first and last words ('xq', 'zz') may be cut by the window: skipped; of 'The KING blorf', 1 of 3 is unknown
    assert unknown_word_rate(['xq The KING blorf zz'], known) == pytest.approx(1 / 3)
    assert unknown_word_rate(["a romeo's b", 'only two'], known) == 0.0
    stats = text_statistics([[0]], ['xq the blorf zz'], known)
    assert stats['unknown_word_rate'] == pytest.approx(1 / 2)


def test_verdict_rule_on_hand_made_figures():
    # boundary error, higher is better: 3 seeds each
    assert compare((30.0, 0.5, 3), (25.0, 0.5, 3), True) == 'better'
    assert compare((25.0, 0.5, 3), (30.0, 0.5, 3), True) == 'worse'
    assert compare((30.0, 3.0, 3), (29.5, 3.0, 3), True) == 'unresolved'  # a t-test without a margin: never 'equal'
    assert compare((8.0, 0.0, 3), (8.0, 0.0, 3), True) == 'unresolved'
    assert compare((8.1, 0.0, 3), (8.0, 0.0, 3), False) == 'worse'  # no spread: any difference decides
    assert compare((30.0, 0.0, 1), (25.0, 0.0, 1), True) == 'unresolved'  # one judge a side: no spread to test
    # perplexity, lower is better: per-window cross-entropies, paired; 'equal' when the interval holds 0 inside 1%
    rng = np.random.default_rng(0)
    control = rng.normal(2.0, 0.3, 500)
    better = perplexity_effect(control - 0.05 + rng.normal(0, 0.01, 500), control)
    assert better['label'] == 'better' and better['effect'] == pytest.approx(1 - np.exp(-0.05), abs=0.002)
    assert better['ci'][0] < better['effect'] < better['ci'][1]
    assert perplexity_effect(control + 0.05 + rng.normal(0, 0.01, 500), control)['label'] == 'worse'
    # 0.1% lower, with a tiny spread: a real difference, smaller than the margin
    tiny = perplexity_effect(control - 0.001 + rng.normal(0, 0.0001, 500), control)
    assert tiny['ci'][0] > 0 and tiny['label'] == 'better' and tiny['within_margin'] and tiny['can_say_equal']
    # 0.5% apart, inside the margin, but the interval holds 0 and reaches past the margin: neither equal nor a difference
    wide = perplexity_effect(control + 0.005 + rng.normal(0, 0.15, 500), control)
    assert abs(wide['effect']) < 0.01 < max(-wide['ci'][0], wide['ci'][1]) and wide['label'] == 'unresolved'
    # 3% apart, but so noisy the interval holds 0
    noise = rng.normal(0, 1.0, 500)
    assert perplexity_effect(control + 0.03 + noise - noise.mean(), control)['label'] == 'unresolved'
    assert perplexity_effect(control, control)['label'] == 'equal'


def test_matched_temperature_interpolates_along_the_sweep():
    sweep = [dict(temperature=t, sample_entropy=2 * t, fresh_judge_boundary_error=10 * t, fresh_judge_boundary_error_sd=1,
                  unknown_word_rate=t / 2, fresh_judge_n=3) for t in (1.0, 0.6, 0.8)]
    m = matched_temperature(sweep, 1.5)  # between T = 0.6 (entropy 1.2) and T = 0.8 (entropy 1.6)
    assert m['temperature'] == pytest.approx(0.75) and m['fresh_judge_boundary_error'] == pytest.approx(7.5)
    assert not m['outside_sweep'] and m['fresh_judge_n'] == 3
    low = matched_temperature(sweep, 0.5)
    assert low['outside_sweep'] and low['temperature'] == 0.6


def test_evaluation_prompts_are_disjoint_from_the_reference():
    val = np.arange(10_000)
    reference, prompts = eval_windows(val, 20, 100, seed=0)
    assert reference.shape == prompts.shape == (20, 100)
    assert not set(reference.flatten().tolist()) & set(prompts.flatten().tolist())
    with pytest.raises(Exception, match='lower the number of samples to at most 50'):
        eval_windows(val, 60, 100, seed=0)


TINY_CYCLE = ['--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=32', '--base_max_iters=30',
              '--base_eval_interval=10', '--reward_max_blocks=10', '--reward_max_iters=60', '--grpo_max_steps=4',
              '--grpo_prompts_per_step=2', '--grpo_num_generations=4', '--eval_num_samples=16', '--judge_max_blocks=8',
              '--judge_max_iters=40', '--control_temperatures=0.8,1.0', '--device=cpu', '--base_select_tokens=2000']
ARTEFACTS = ('base_model_v', 'base_cosine_v', 'eval_', 'reward_data_v', 'reward_model_v', 'grpo_v', 'mle_v',
             'sweep_v', 'verdict_v', 'judgeoff_v', 'sight_v', 'tilt_v', 'mle_tilt_v', 'tilt_verdict_v')


def cycles(out, data, *extra):
    r = run_script('run_cycles.py', f'--out_dir={out}', f'--dataset={data}', *TINY_CYCLE, *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def stages_run(stdout):
    return [l[len('[run]  '):] for l in stdout.splitlines() if l.startswith('[run]  ')]


def assert_consistent(out):
    """Every manifest's outputs exist and its inputs are the files on disk now; every artefact has a manifest."""
    from run_cycles import Pipeline
    pipe = Pipeline(str(out))
    covered = set()
    for name in os.listdir(out / 'manifests'):
        m = json.loads((out / 'manifests' / name).read_text())
        outputs = [o.replace('$OUT', str(out), 1) for o in m['outputs']]
        assert all(os.path.exists(o) for o in outputs), name
        for rel, sig in m['inputs'].items():
            p = rel.replace('$OUT', str(out), 1).replace('$ROOT', ROOT, 1)
            assert pipe.signature(p) == sig, (name, rel)
        covered |= {os.path.basename(o) for o in outputs}
    on_disk = {n for n in os.listdir(out) if n.startswith(ARTEFACTS) and not n.endswith(('.partial', '.work'))}
    assert on_disk <= covered, on_disk - covered


@pytest.fixture(scope='module')
def cycle_run(tmp_path_factory, char_data):
    out = tmp_path_factory.mktemp('cycles') / 'run'
    return out, cycles(out, char_data, '--num_cycles=2')


def test_two_cycles_produce_versions_controls_verdicts_and_report(cycle_run, char_data):
    out, stdout = cycle_run
    for n in (1, 2):
        for name in (f'reward_data_v{n}', f'reward_model_v{n}.pt', f'base_model_v{n + 1}.pt', f'eval_v{n + 1}.json',
                     f'grpo_v{n}_log.jsonl', f'mle_v{n + 1}.pt', f'eval_mle_v{n + 1}.json', f'sweep_v{n}.json',
                     f'verdict_v{n}.json', f'judgeoff_v{n + 1}.pt', f'judgeoff_v{n}_log.jsonl',
                     f'eval_judgeoff_v{n + 1}.json', f'sight_v{n}.json'):
            assert (out / name).exists(), name
    assert not list(out.glob('*.partial')) and not list(out.glob('*.work'))
    report = (out / 'report.md').read_text()
    assert '| v1 |' in report and '| v3 |' in report and 'Cycle 2 verdict' in report
    assert (out / 'quality_diversity.png').read_bytes()[:4] == b'\x89PNG'
    e = json.loads((out / 'eval_v2.json').read_text())[0]
    assert {'val_perplexity', 'val_window_cross_entropy', 'mauve', 'mauve_sd', 'distinct_4_tokens', 'sample_entropy',
            'mean_p_natural', 'fresh_judge_boundary_error', 'fresh_judge_boundary_error_sd', 'fresh_judge_r2',
            'unknown_word_rate', 'natural_unknown_word_rate', 'c2st_auc', 'c2st_auc_sd', 'c2st_accuracy',
            'fresh_judge_blind', 'fresh_judge_blind_count'} <= set(e)
    assert e['c2st_folds'] == 5 and e['c2st_n'] == 32 and 0 <= e['c2st_auc'] <= 1
    assert len(e['c2st_natural_texts']) == len(e['c2st_sample_texts']) == 16
    assert all('blind' in r for r in e['fresh_judge_runs'])
    assert 0 <= e['judge_sight_auc'] <= 1 and 'judge sight' in report  # the cycle's judge, on the c2st windows
    # and its spread over texts beside it in the report (0 where the tiny judge's scores all tie or never overlap)
    assert 0 <= e['judge_sight_auc_sd'] < 0.5 and f"{e['judge_sight_auc']:.3f} ± {e['judge_sight_auc_sd']:.3f}" in report
    # the judge's sight before the game: on base v1's own evaluation samples (the same draw as eval_v1's), then on v2
    before, v1 = json.loads((out / 'sight_v1.json').read_text())[0], json.loads((out / 'eval_v1.json').read_text())[0]
    assert before['samples'] == v1['samples'] and 'c2st_auc' not in before and 'val_perplexity' not in before
    # and on the judge-off control's samples: how far its sight falls where no judge signal reached the policy
    off = json.loads((out / 'eval_judgeoff_v2.json').read_text())[0]
    assert (f"{before['judge_sight_auc']:.3f} ± {before['judge_sight_auc_sd']:.3f} → "
            f"{e['judge_sight_auc']:.3f} ± {e['judge_sight_auc_sd']:.3f} "
            f"({off['judge_sight_auc']:.3f} ± {off['judge_sight_auc_sd']:.3f})") in report
    assert e['num_samples'] == 16 and e['fresh_judge_n'] == 3 and len(e['fresh_judge_runs']) == 3
    sweep = json.loads((out / 'sweep_v1.json').read_text())
    assert [p['temperature'] for p in sweep] == [0.8] and 'val_perplexity' not in sweep[0]
    v = json.loads((out / 'verdict_v1.json').read_text())
    controls = ('mle', 'temperature', 'judge_off')
    assert {v['verdicts'][c]['fresh_judges'] for c in controls} <= {'better', 'unresolved', 'worse', 'blind'}
    assert {v['verdicts'][c][m] for c in controls for m in ('perplexity', 'c2st')} <= {'better', 'equal', 'worse',
                                                                                      'unresolved'}
    for c in controls:  # every point shares the eval windows: each two-sample effect has one referee for both sides
        x = v['verdicts'][c]
        assert x['c2st_effect']['margin'] == 0.03 and len(x['perplexity_effect']['ci']) == 2
        assert x['c2st_effect']['label'] == x['c2st'] and x['perplexity_effect']['label'] == x['perplexity']
    assert 'c2st_parts' not in v['matched'] and v['margins'] == {'c2st_auc': 0.03, 'perplexity': 0.01}
    assert v['mle_iters'] >= 1 and v['cycle_flops'] > 0
    # the base holds out a tail: the arm is read against it at its tail-calibrated temperature, on perplexity alone
    cal = v['verdicts']['calibrated']
    assert cal['fresh_judges'] == '–' and cal['c2st_effect'] is None and \
        cal['perplexity'] in {'better', 'equal', 'worse', 'unresolved'}
    # read against the base at the one fit's temperature (calibration.base_calibrated_temperature), not at T = 1:
    # its temperature, its val perplexity and the arm's effect over it, each recomputed here
    from calibration import base_calibrated_temperature
    from model import GPT, evaluate_perplexity
    T = base_calibrated_temperature(str(out / 'base_model_v1.pt'), char_data, 'cpu')[0]
    assert v['calibrated']['temperature'] == pytest.approx(T, rel=1e-6) and abs(T - 1) > 1e-3
    val = np.memmap(os.path.join(char_data, 'val.bin'), dtype=np.uint16, mode='r')
    _, ppl, windows = evaluate_perplexity(GPT.from_checkpoint(str(out / 'base_model_v1.pt')), val, temperature=T,
                                          per_window=True)
    assert v['calibrated']['val_perplexity'] == pytest.approx(ppl, rel=1e-5)
    again = perplexity_effect(e['val_window_cross_entropy'], windows)
    assert cal['perplexity_effect']['effect'] == pytest.approx(again['effect'], abs=1e-5)
    assert cal['perplexity_effect']['ci'] == pytest.approx(again['ci'], abs=1e-4) and cal['perplexity'] == again['label']
    assert f"tail-calibrated temperature {v['calibrated']['temperature']:.3f}" in report
    # the verdict as a table: a row a control, each cell its label and interval as verdict_v1.json holds them, and
    # under it the controls the cycle beats
    from run_cycles import VERDICT_CONTROLS, beats
    block = report.split('**Cycle 1 verdict: base v2 against each control**')[1].split('**Cycle 2 verdict')[0]
    rows = {r.split(' | ')[0].lstrip('| '): r.split(' | ')[1:] for r in block.splitlines() if r.startswith('| ')}
    for c, x in v['verdicts'].items():
        fresh, two_sample, perplexity = rows[VERDICT_CONTROLS[c]]
        assert fresh.startswith(f"**{x['fresh_judges']}**" if x['fresh_judges'] != '–' else '–')
        e = x['perplexity_effect']
        assert perplexity.startswith(f"**{label_text(e)}** {e['effect']:+.1%} [{e['ci'][0]:.1%}, {e['ci'][1]:.1%}]")
        assert two_sample == '–' if c == 'calibrated' else two_sample.startswith(f"**{label_text(x['c2st_effect'])}**")
    beaten = [VERDICT_CONTROLS[c] for c, x in v['verdicts'].items() if beats(c, x)]
    assert (f"The cycle beats {' and '.join(beaten)}, not every control." if beaten else
            'The cycle beats no control.') in block or 'The cycle beats every control.' in block
    # the MLE control kept its best val checkpoint within its allowance, and says where it stopped
    assert 0 <= v['mle_best_iter'] <= v['mle_stopped_at'] <= v['mle_iters'] and v['mle_stop_reason']
    assert load_checkpoint(str(out / 'judgeoff_v2.pt'))['metrics']['judge_off']
    # the judge-off control ran its arm's steps; the verdict records both runs' steps and compute
    arm_steps = len(load_checkpoint(str(out / 'base_model_v2.pt'))['metrics']['history'])
    assert v['arm_steps'] == v['judge_off_steps'] == arm_steps and v['judge_off_flops'] > 0 and v['arm_flops'] > 0
    assert f"ran {arm_steps} GRPO steps" in report
    # every stage's wall time and peak memory, in the report and on disk
    times = json.loads((out / 'stage_times.json').read_text())
    assert {'base v1', 'cycle 2: GRPO -> base v3', 'cycle 2: verdict'} <= set(times)
    assert times['base v1']['peak_mb'] > 0 and times['cycle 2: verdict']['peak_mb'] is None
    assert '## Stage times' in report and '| base v1 |' in report and '**all stages**' in report
    assert 'judge-off control' in report and 'two-sample AUC' in report and '| the judge-off control |' in report
    assert 'finished: num_cycles (2)' in stdout
    assert_consistent(out)


def test_each_seed_of_a_method_draws_its_own_controls(cycle_run, char_data, tmp_path):
    """A repeat of the method (trainer_seed s, as bench_arms runs its seeds) keeps base v1 and draws everything after
    it anew: its judge's data, its evaluations' windows, prompts and samples, its temperature sweep, its MLE and
    judge-off controls; its verdict records the draw seed, so the method's interval knows its seeds' draws differ."""
    out = tmp_path / 'seed2000'
    shutil.copytree(cycle_run[0], out)
    ran = stages_run(cycles(out, char_data, '--num_cycles=1', '--trainer_seed=2000', '--judge_seeds=1'))
    assert 'base v1' not in ran and {'evaluate v1', 'cycle 1: MLE control', 'cycle 1: judge-off control',
                                     'temperature sweep of base v1', 'cycle 1: reward data'} <= set(ran), ran
    first = cycle_run[0]
    for name in ('mle_v2.pt', 'reward_model_v1.pt'):
        a, b = (load_checkpoint(str(d / name))['model'] for d in (first, out))
        assert any(not torch.equal(a[k], b[k]) for k in a), name
    # the tiny judge is nearly blind and the judge-off control has no signal, so neither policy need move far; each
    # played its own rollouts
    for name in ('grpo_v1_log.jsonl', 'judgeoff_v1_log.jsonl'):
        assert (first / name).read_text() != (out / name).read_text(), name
    for name in ('eval_v1.json', 'sweep_v1.json', 'eval_mle_v2.json', 'eval_judgeoff_v2.json'):
        a, b = (json.loads((d / name).read_text())[0] for d in (first, out))
        assert a['c2st_sample_texts'] != b['c2st_sample_texts'], name
    v1 = [json.loads((d / 'eval_v1.json').read_text())[0] for d in (first, out)]
    assert v1[0]['c2st_natural_texts'] != v1[1]['c2st_natural_texts']
    verdicts = [json.loads((d / 'verdict_v1.json').read_text()) for d in (first, out)]
    assert [v['draw_seed'] for v in verdicts] == [1337, 2000]
    from verdict import own_draws
    assert own_draws(verdicts)


def test_fresh_judges_and_mauve_use_the_referee_trunk(cycle_run):
    """Every fresh judge of every point, whatever generator it judges, sits on base v1's trunk (the referee)."""
    out, _ = cycle_run
    from evaluate import trunk_signature
    from model import load_checkpoint
    referee = trunk_signature(load_checkpoint(str(out / 'base_model_v1.pt'))['model'])
    assert referee != trunk_signature(load_checkpoint(str(out / 'mle_v2.pt'))['model'])
    points = [p for f in out.glob('*.json') if f.name.startswith(('eval_', 'sweep_'))
              for p in json.loads(f.read_text())]
    assert len(points) == 9  # v1, v2, v3, two MLE controls, two judge-off controls, two sweep points
    for p in points:
        assert p['referee_trunk'] == referee and p['referee'] == str(out / 'base_model_v1.pt')
        assert [r['trunk'] for r in p['fresh_judge_runs']] == [referee] * 3


def test_changed_key_rebuilds_exactly_the_affected_stages(cycle_run, char_data):
    out, _ = cycle_run
    before = (out / 'base_model_v2.pt').stat().st_mtime_ns
    stdout = cycles(out, char_data, '--num_cycles=2', '--control_temperatures=0.7,1.0')
    assert stages_run(stdout) == ['temperature sweep of base v1', 'cycle 1: verdict',
                                  'temperature sweep of base v2', 'cycle 2: verdict']
    assert (out / 'base_model_v2.pt').stat().st_mtime_ns == before
    assert [p['temperature'] for p in json.loads((out / 'sweep_v2.json').read_text())] == [0.7]
    assert_consistent(out)


def test_shorter_rerun_reports_only_its_own_artefacts(cycle_run, char_data, tmp_path):
    import shutil
    out, _ = cycle_run
    short = tmp_path / 'short'
    shutil.copytree(out, short)
    stdout = cycles(short, char_data, '--num_cycles=1', '--control_temperatures=0.7,1.0')
    assert stages_run(stdout) == []  # every stage of the shorter run is there and matches
    report = (short / 'report.md').read_text()
    assert '| v2 |' in report and '| v3 |' not in report and 'Cycle 2' not in report
    assert (short / 'eval_v3.json').exists()  # a longer run's leftover, valid for its inputs, but not reported


def test_the_tilt_is_a_cycle_point_with_verdicts_against_its_controls(cycle_run, char_data, tmp_path):
    """tilt_k: base v1 resampled by its judge is evaluated without RL, an MLE control gets the judge's FLOPs and the
    sampling's, and the tilt's verdict reads it, base v1 and base v1 at the matched temperature on the two-sample
    test and the natural completions' perplexity; the rest of the run is reused."""
    import shutil
    out, _ = cycle_run
    tilted = tmp_path / 'tilted'
    shutil.copytree(out, tilted)
    ran = stages_run(cycles(tilted, char_data, '--num_cycles=1', '--tilt_k=4'))
    tilt_stages = ['cycle 1: tilt of base v1', 'cycle 1: MLE control of the tilt',
                   'evaluate MLE control of the tilt v2', 'cycle 1: tilt verdict']
    # only the sweep may differ (an earlier test of this module changed its temperatures), and what reads it
    assert [s for s in ran if s in tilt_stages] == tilt_stages and \
        set(ran) - set(tilt_stages) <= {'temperature sweep of base v1', 'cycle 1: verdict'}, ran
    point = json.loads((tilted / 'tilt_v1.json').read_text())[0]
    assert point['tilt_kind'] == 'judge' and point['tilt_k'] == 4 and 'fresh_judge_runs' not in point
    assert sorted(point['tilt_perplexity']) == ['128', '32', '4', '8'] and len(point['c2st_sample_texts']) == 16
    v = json.loads((tilted / 'tilt_verdict_v1.json').read_text())
    assert sorted(v['verdicts']) == ['base', 'mle', 'temperature']
    for x in v['verdicts'].values():
        assert x['perplexity'] == x['perplexity_effect']['label'] and x['c2st_effect'] is not None
    flops = v['tilt_flops']
    assert flops > point['tilt_sampling_flops'] > 0 and v['mle_iters'] >= 1
    assert 'the tilt of base v1 without RL' in (tilted / 'report.md').read_text()
    assert_consistent(tilted)
    # a base with no cycle's controls (a plateau's), read over draws of its own with an MLE control, at every K
    r = run_script(os.path.join(ROOT, 'benchmarks', 'bench_tilt.py'), '--runs', str(tilted), '--source', 'judge',
                   '--tilt_k', '4', '--tilt_windows', '4', '--draws', '5,6', '--mle', str(tilted / 'mle_tilt_v2.pt'),
                   '--control', str(tilted / 'mle_tilt_v2.pt'), '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-2000:]
    for seed in (5, 6):
        points = json.loads((tilted / f'points_d{seed}.json').read_text())
        assert len(points) >= 2 and all('c2st_auc' in p for p in points)
        assert len(json.loads((tilted / f'tilt_judge_k4_a1_d{seed}.json').read_text())[0]
                   ['tilt_window_cross_entropy']['128']) == 4
    # each draw's reading printed as it finishes, every control's in it (a lease's step cut off keeps them)
    assert [line.split(':')[0] for line in r.stdout.splitlines() if line.startswith('draw ')] == \
        ['draw 5, K = 4', 'draw 6, K = 4'] and all('; vs control ' in line for line in r.stdout.splitlines()
                                                   if line.startswith('draw '))
    table = r.stdout[r.stdout.index('at each K'):]
    assert [line.split(' | ')[0] for line in table.splitlines() if line.startswith('| ') and line[2].isdigit()] == \
        ['| 4', '| 8', '| 32', '| 128'] and \
        '| vs base | vs temperature | vs calibrated | vs mle | vs mle_calibrated | vs control |' in table
    # --control: another generator read at T = 1 on the same windows (here the MLE control: at the tilt's T, its twin)
    over = {line.split(' vs ')[1].split(':')[0]: line.split('perplexity ')[1].split(';')[0]
            for line in r.stdout.splitlines() if line.startswith('over 2 seeds vs ')}
    assert over['control'] == over['mle'] if json.loads((tilted / 'tilt_judge_k4_a1_d5.json').read_text())[0][
        'temperature'] == 1 else 'control' in over
    # the MLE control holds out the base's tail too: it is read again at its own tail-calibrated temperature
    assert 'over 2 seeds vs mle_calibrated: perplexity' in r.stdout and 'over 2 seeds vs mle: perplexity' in r.stdout
    # calibrated again: the MLE control read at its own tail-calibrated temperature, never at the tilt's
    import sys
    sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
    import bench_tilt
    from calibration import tail_temperature
    tilt = json.loads((tilted / 'tilt_judge_k4_a1_d5.json').read_text())[0]
    controls = bench_tilt.completion_controls(str(tilted), str(tilted / 'mle_tilt_v2.pt'), None, char_data, 'cpu',
                                              tilt, 5)
    T = tail_temperature(str(tilted / 'mle_tilt_v2.pt'), char_data, 'cpu')
    assert controls['mle_calibrated']['temperature'] == T and abs(T - tilt['temperature']) > 1e-3
    assert controls['mle']['temperature'] == tilt['temperature']
    # the base holds out a selection tail: the tail-calibrated control reads on every draw and over them
    assert 'over 2 seeds vs calibrated: perplexity' in r.stdout and all(
        line.rstrip(' |').endswith(')') for line in r.stdout.splitlines() if line.startswith(('| 5 |', '| 6 |')))
    # one judge and MLE control a draw (each seed its own), read back from the same files: the same tables
    mle = str(tilted / 'mle_tilt_v2.pt')
    again = run_script(os.path.join(ROOT, 'benchmarks', 'bench_tilt.py'), '--runs', str(tilted), '--source',
                       'judge,judge', '--tilt_k', '4', '--tilt_windows', '4', '--draws', '5,6', '--mle', f'{mle},{mle}',
                       '--control', mle, '--device', 'cpu')
    def tables(out):
        return out[out.index('| draw seed'):].splitlines()[:-1]  # the last line is the time
    assert again.returncode == 0 and tables(again.stdout) == tables(r.stdout)
    wrong = run_script(os.path.join(ROOT, 'benchmarks', 'bench_tilt.py'), '--runs', str(tilted), '--source',
                       'judge,judge,judge', '--draws', '5,6')
    assert wrong.returncode == 2 and 'one for each of the 2 runs or draws' in wrong.stderr


def test_interrupted_rerun_never_pairs_artefacts_of_different_runs(cycle_run, char_data, tmp_path):
    """Change GRPO's learning rate, kill the run right after cycle 1's GRPO stage: what depended on the old base v2
    (the controls' verdicts among it) is gone, every artefact left matches its manifest; the rerun completes and
    rebuilds only what depends on it (its controls off: the manifests are the subject here)."""
    import shutil
    import signal
    import subprocess
    import sys
    out = tmp_path / 'interrupted'
    shutil.copytree(cycle_run[0], out)
    args = [sys.executable, 'run_cycles.py', f'--out_dir={out}', f'--dataset={char_data}', *TINY_CYCLE,
            '--num_cycles=2', '--grpo_learning_rate=1e-3', '--controls=False']
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen, grpo_running = [], False
    for line in proc.stdout:
        seen.append(line)
        if line.startswith('[run]  '):
            grpo_running = 'cycle 1: GRPO' in line
        if grpo_running and line.startswith('       done'):  # the stage has renamed its outputs: kill now
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert any('[run]  cycle 1: GRPO' in l for l in seen)
    assert not (out / 'eval_v2.json').exists() and not (out / 'reward_model_v2.pt').exists()
    assert not (out / 'verdict_v1.json').exists() and not (out / 'judgeoff_v2.pt').exists()
    assert (out / 'base_model_v1.pt').exists() and (out / 'reward_model_v1.pt').exists()
    assert_consistent(out)
    stdout = cycles(out, char_data, '--num_cycles=2', '--grpo_learning_rate=1e-3', '--controls=False')
    ran = stages_run(stdout)
    assert 'base v1' not in ran and 'cycle 1: reward model' not in ran and 'cycle 1: GRPO -> base v2' not in ran
    assert 'evaluate v2' in ran and 'cycle 2: GRPO -> base v3' in ran
    assert_consistent(out)


def test_stage_progress_is_shown_live_on_a_terminal(tmp_path, monkeypatch):
    import io
    import run_cycles

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    screen = Terminal()
    monkeypatch.setattr('sys.stdout', screen)
    script = tmp_path / 'progress.py'
    script.write_text("import sys, time\nfor i in range(3):\n    sys.stderr.write(f'\\rstep {i}/3'); "
                      "sys.stderr.flush(); time.sleep(0.2)\nprint('all done')\n")
    run_cycles.run([str(script)], str(tmp_path / 'log.txt'))
    shown = screen.getvalue()
    assert 'step 0/3' in shown and 'step 2/3' in shown and 'all done' in shown
    assert 'all done' in (tmp_path / 'log.txt').read_text()
    with pytest.raises(run_cycles.UserError, match='stage failed.*boom'):
        script.write_text("raise SystemExit('boom')\n")
        run_cycles.run([str(script)], str(tmp_path / 'log2.txt'))


def test_stage_peak_memory_is_the_childs_own():
    """run_cycles reports each stage's peak memory: at least what the child touched, with its exit code kept."""
    import subprocess
    import sys
    from run_cycles import wait_with_peak_memory
    code = 'import numpy as np, sys; a = np.ones(20_000_000); a += 1; sys.exit(3)'  # 160 MB touched
    returncode, peak_mb = wait_with_peak_memory(subprocess.Popen([sys.executable, '-c', code]))
    assert returncode == 3
    assert peak_mb is None or 150 < peak_mb < 2000
    returncode, _ = wait_with_peak_memory(subprocess.Popen([sys.executable, '-c', 'pass']))
    assert returncode == 0


def test_whole_window_judge_knobs_reach_the_judge_stages(cycle_run, char_data, tmp_path):
    """reward_crossover_k, reward_loss=binary and reward_max_epochs rebuild the judge's data and model (base v1 and
    its evaluation are kept): every sample keeps k natural tokens, the judge trains on the pairs for that many
    passes."""
    from reward_dataset_loader import RewardDataset
    out = tmp_path / 'run'
    shutil.copytree(cycle_run[0], out)
    stdout = cycles(out, char_data, '--num_cycles=1', '--controls=False', '--reward_crossover_k=4',
                    '--reward_loss=binary', '--reward_max_epochs=1')
    assert stages_run(stdout)[:4] == ['cycle 1: reward data', 'cycle 1: reward model',
                                      'cycle 1: judge sight on base v1', 'cycle 1: GRPO -> base v2']
    ds = RewardDataset(str(out / 'reward_data_v1'), 'train')
    assert np.allclose(ds.y, [[4 / 32, 28 / 32]]) and np.array_equal(ds.x[:, :4], ds.natural_of(range(len(ds)))[:, :4])
    rm = load_checkpoint(str(out / 'reward_model_v1.pt'))
    assert rm['config']['loss'] == 'binary' and rm['config']['max_epochs'] == 1
    assert_consistent(out)


def test_the_referee_over_the_game_reaches_frozen_and_online_judges_alike():
    """grpo_referee_samples is GRPO's instrument, not the online judge's: a frozen-judge cycle passes it too."""
    from configurator import configure
    from run_cycles import DEFAULTS, grpo_cmd
    for online in ('0', '1'):
        C = configure(DEFAULTS, ['--grpo_referee_samples=200', f'--grpo_judge_update_interval={online}'])
        cmd = grpo_cmd(C, 'base.pt', 'rm.pt', 'data', 'out.pt', 1)
        assert '--referee_samples=200' in cmd and f'--referee_seed={C.seed}' in cmd
        assert ('--judge_update_interval=1' in cmd) == (online == '1')
    assert not any(a.startswith('--referee') for a in grpo_cmd(configure(DEFAULTS, []), 'b', 'r', 'd', 'o', 1))


def test_the_tilts_game_reaches_grpo_and_its_judge_off_control(monkeypatch):
    """The game whose fixed point is the tilt (grpo_reward_form, grpo_kl_in_reward, grpo_reward_scale,
    grpo_kl_anchor, grpo_objective, grpo_loss_type) reaches train_grpo.py as options it accepts, for the arm and for its judge-off
    control alike; the default cycle's command carries none of them."""
    from configurator import configure
    import train_grpo
    from run_cycles import DEFAULTS, grpo_cmd
    monkeypatch.syspath_prepend(os.path.join(ROOT, 'benchmarks'))
    import bench_arms
    new = ('--reward_form', '--kl_in_reward', '--reward_scale', '--objective', '--loss_type', '--kl_anchor')
    assert not any(a.startswith(new) for a in grpo_cmd(configure(DEFAULTS, []), 'b', 'r', 'd', 'o', 1))
    anchored = grpo_cmd(configure(DEFAULTS, bench_arms.arms('runs/x')['ngram_kl'][1] + ['--grpo_kl_anchor=judge']),
                        'b', 'r', 'd', 'o', 1)
    train_grpo.check_config(configure(train_grpo.DEFAULTS, anchored[1:]))
    assert '--kl_anchor=judge' in anchored
    for arm in ('teacher_mle_ratio_kl', 'teacher_ratio_dpg', 'ngram_kl'):
        C = configure(DEFAULTS, bench_arms.arms('runs/x')[arm][1])
        for arm_log in (None, 'arm_log.jsonl'):
            cmd = grpo_cmd(C, 'base.pt', 'rm.pt', 'data', 'out.pt', 1, arm_log=arm_log)
            G = configure(train_grpo.DEFAULTS, cmd[1:])
            train_grpo.check_config(G)
            assert G.beta == 0 and G.scale_rewards == 'none' and G.loss_type == 'dr_grpo'
            assert G.judge_off == bool(arm_log)
            assert (G.kl_in_reward, G.objective) == ((False, 'dpg') if arm.endswith('dpg') else (True, 'grpo'))
            assert G.reward_scale == (1.5 if arm == 'ngram_kl' else 0.3)


def test_every_arm_of_the_arms_benchmark_is_a_valid_cycle_config(monkeypatch):
    """A misspelt override in benchmarks/bench_arms.py would only fail an hour into a benchmark: every arm, on the
    configs its documented commands use, must parse as run_cycles.py options."""
    from configurator import configure
    from run_cycles import DEFAULTS
    monkeypatch.syspath_prepend(os.path.join(ROOT, 'benchmarks'))
    import bench_arms
    default = os.path.join(ROOT, 'config', 'cycles_shakespeare_char.py')
    for game in ('game_converged.py', 'game_interleaved.py', 'game_sighted.py'):  # the overlays the commands use
        for arm, (_, overrides) in bench_arms.arms('runs/x').items():
            C = configure(DEFAULTS, [default, os.path.join(ROOT, 'config', game)] + bench_arms.SEED_DESIGN + overrides
                          + ['--trainer_seed=2000'])
            assert C.trainer in ('grpo', 'spin'), arm
    slow = configure(DEFAULTS, bench_arms.arms('')['window_online_slow_pure'][1])
    assert slow.grpo_judge_learning_rate == 3e-5 and slow.grpo_judge_unfreeze_layers == -1 and not slow.grpo_nll_weight
    # the judge that reaches 0.90: 30,000 windows, evaluated every 200 steps as measured; frozen, or co-trained slowly
    frozen, online = (configure(DEFAULTS, bench_arms.arms('')[a][1]) for a in ('window30k', 'window30k_online_slow'))
    assert frozen.reward_max_blocks == online.reward_max_blocks == 30000 and frozen.reward_eval_interval == 200
    assert not frozen.grpo_judge_update_interval and online.grpo_judge_learning_rate == 3e-5
    assert frozen.grpo_nll_weight == online.grpo_nll_weight == 1.0


def test_the_arms_table_reads_the_judges_sight_before_after_and_judge_off(cycle_run, monkeypatch):
    """bench_arms' row says whether the policy fooled its judge: its sight on base v1's samples, on the new base's and
    on the judge-off control's, as the cycle's evaluations measured them."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, 'benchmarks'))
    import bench_arms
    out = cycle_run[0]
    read = lambda name: json.loads((out / name).read_text())  # noqa: E731
    e, before, off = read('eval_v2.json')[0], read('sight_v1.json')[0], read('eval_judgeoff_v2.json')[0]
    row = bench_arms.arm_row('arm', str(out), 1, e, read('verdict_v1.json'))
    assert (f"sight {before['judge_sight_auc']:.3f} → {e['judge_sight_auc']:.3f} ({off['judge_sight_auc']:.3f})"
            in row), row


def test_the_whole_window_fresh_judges_reach_the_evaluations_and_the_report():
    """judge_recipe='window' reaches every evaluate.py call (the default adds nothing, so runs made before keep their
    evaluations), the report prints such a point's sight where a crossover point has its boundary error, and a
    recipe that does not exist is a one-line error."""
    from configurator import configure
    from run_cycles import DEFAULTS, evaluate_cmd, point_row
    window = configure(DEFAULTS, ['--judge_recipe=window'])
    assert evaluate_cmd(window, ['a.pt'], 'd', 'r.pt', 'o.json', [1.0])[-2:] == ['--judge_recipe', 'window']
    assert '--judge_recipe' not in evaluate_cmd(configure(DEFAULTS, []), ['a.pt'], 'd', 'r.pt', 'o.json', [1.0])
    point = dict(fresh_judge_recipe='window', fresh_judge_sight_auc=0.6123, fresh_judge_sight_auc_sd=0.0211,
                 fresh_judge_n=3)
    assert '| 0.612 ± 0.021 |' in point_row('v2', point)
    assert '| 12.35 ± 0.50 |' in point_row('v2', dict(fresh_judge_boundary_error=12.345, fresh_judge_boundary_error_sd=0.5))
    r = run_script('run_cycles.py', '--judge_recipe=windows', '--out_dir=/nonexistent/x')
    assert r.returncode == 2 and "judge_recipe must be one of ['crossover', 'window']" in r.stderr
    assert 'Traceback' not in r.stderr and not os.path.exists('/nonexistent/x')
    r = run_script('run_cycles.py', '--base_select_pass=True', '--base_select_tokens=0', '--out_dir=/nonexistent/x')
    assert r.returncode == 2 and '--base_select_tokens=N' in r.stderr and not os.path.exists('/nonexistent/x')
