import json

import pytest

from conftest import run_script
from evaluate import distinct_n, repetition_rate, text_statistics, unknown_word_rate, words_of


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


TINY_CYCLE = ['--num_cycles=1', '--n_layer=1', '--n_head=2', '--n_embd=16', '--block_size=32', '--base_max_iters=30',
              '--base_eval_interval=10', '--reward_max_blocks=10', '--reward_max_iters=60', '--grpo_max_steps=4',
              '--grpo_prompts_per_step=2', '--grpo_num_generations=4', '--eval_num_samples=16', '--device=cpu']


@pytest.fixture(scope='module')
def cycle_run(tmp_path_factory, char_data):
    out = tmp_path_factory.mktemp('cycles') / 'run'
    r = run_script('run_cycles.py', f'--out_dir={out}', f'--dataset={char_data}', *TINY_CYCLE)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out, r.stdout


def test_one_cycle_produces_versioned_outputs_and_report(cycle_run):
    out, stdout = cycle_run
    for name in ('base_model_v1.pt', 'reward_data_v1', 'reward_model_v1.pt', 'base_model_v2.pt', 'eval_v1.json',
                 'eval_v2.json', 'grpo_v1_log.jsonl', 'grpo_v1_curves.png', 'report.md', 'grpo_curves.png', 'cycles.png'):
        assert (out / name).exists(), name
    assert not list(out.glob('*.partial'))
    report = (out / 'report.md').read_text()
    assert '| v1 |' in report and '| v2 |' in report and 'grpo_curves.png' in report
    assert (out / 'grpo_curves.png').read_bytes()[:4] == b'\x89PNG'
    e = json.loads((out / 'eval_v2.json').read_text())[0]
    assert {'val_perplexity', 'mauve', 'distinct_4_tokens', 'mean_p_natural', 'fresh_judge_r2',
            'fresh_judge_boundary_error', 'unknown_word_rate', 'natural_unknown_word_rate'} <= set(e)
    assert 0.0 <= e['unknown_word_rate'] <= 1.0 and 'unknown words (natural)' in report
    assert 'finished: num_cycles (1)' in stdout


def test_rerun_skips_complete_stages_and_redoes_a_deleted_one(cycle_run, char_data):
    out, _ = cycle_run
    import shutil
    before = (out / 'base_model_v1.pt').stat().st_mtime_ns
    shutil.rmtree(out / 'reward_data_v1')
    (out / 'base_model_v2.pt.partial').write_text('an interrupted GRPO stage')  # never trusted
    r = run_script('run_cycles.py', f'--out_dir={out}', f'--dataset={char_data}', *TINY_CYCLE)
    assert r.returncode == 0, r.stderr[-2000:]
    assert '[skip] cycle 0: base model' in r.stdout and '[skip] evaluate base v1' in r.stdout
    for later in ('cycle 1: reward data', 'cycle 1: reward model', 'cycle 1: GRPO -> base v2', 'evaluate base v2'):
        assert f'[run]  {later}' in r.stdout  # the deleted stage and every successor, whose inputs changed
    assert (out / 'base_model_v1.pt').stat().st_mtime_ns == before
    assert not (out / 'base_model_v2.pt.partial').exists()
