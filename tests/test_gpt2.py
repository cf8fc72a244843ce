"""GPT-2 weights through transformers, checked offline against the peer implementation on a tiny random GPT-2."""
import os

import pytest
import torch

from conftest import run_script

transformers = pytest.importorskip('transformers')

from model import GPT, load_checkpoint  # noqa: E402


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    """A tiny random GPT2LMHeadModel with GPT-2's vocabulary, saved as a Hugging Face directory."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50257,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    out = tmp_path_factory.mktemp('hf_gpt2')
    hf.save_pretrained(out)
    return str(out), hf


def test_logits_equal_transformers(hf_dir):
    path, hf = hf_dir
    model = GPT.from_pretrained(path)
    assert model.config.gelu_approximate == 'tanh' and model.config.block_size == 64
    idx = torch.randint(0, 50257, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx, idx)  # with targets: logits at every position
        theirs = hf(idx).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()


def test_greedy_generate_equals_transformers(hf_dir):
    path, hf = hf_dir
    model = GPT.from_pretrained(path)
    idx = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(2))
    ours = model.generate(idx, 20, top_k=1)
    theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=20, do_sample=False,
                         pad_token_id=hf.config.eos_token_id)
    assert torch.equal(ours, theirs)


def test_train_init_from_hf_dir_records_bpe(tmp_path, hf_dir, bpe_data):
    path, _ = hf_dir
    r = run_script('train.py', f'--dataset={bpe_data}', f'--out_dir={tmp_path}', f'--init_from={path}',
                   '--block_size=32', '--batch_size=4', '--max_iters=2', '--eval_interval=2', '--eval_iters=1',
                   '--device=cpu', '--compile=False', '--warmup_iters=1')
    assert r.returncode == 0, r.stderr
    ckpt = load_checkpoint(os.path.join(tmp_path, 'ckpt.pt'))
    assert ckpt['tokenization']['method'] == 'bpe' and ckpt['tokenization']['vocab_size'] == 50257
    assert ckpt['model_args']['block_size'] == 32 and ckpt['model_args']['gelu_approximate'] == 'tanh'
    assert GPT.from_checkpoint(ckpt).transformer.wpe.weight.shape[0] == 32


def test_pretrained_needs_bpe_data(tmp_path, hf_dir, char_data):
    r = run_script('train.py', f'--dataset={char_data}', f'--out_dir={tmp_path}', f'--init_from={hf_dir[0]}',
                   '--device=cpu')
    assert r.returncode == 2 and 'BPE' in r.stderr and 'Traceback' not in r.stderr


def test_offline_without_cache_is_one_line_exit_2(tmp_path, bpe_data):
    env = {'HF_HUB_OFFLINE': '1', 'HF_HOME': str(tmp_path / 'hf_home'), 'TRANSFORMERS_OFFLINE': '1'}
    r = run_script('train.py', f'--dataset={bpe_data}', f'--out_dir={tmp_path}', '--init_from=gpt2', '--device=cpu',
                   env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error:') and "'gpt2'" in lines[0] and 'save_pretrained' in lines[0]
    assert not os.path.exists(tmp_path / 'ckpt.pt')


def test_the_gpt2_gpu_configs_first_two_stages_run_on_cpu_at_a_toy_size(tmp_path, hf_dir, bpe_data):
    """config/cycles_gpt2_gpu.py as a lease runs it, at a toy size on CPU: GPT-2's vocabulary from a
    save_pretrained directory, base v1 fine-tuned and evaluated (num_cycles=0), every sample decodable."""
    import json
    from conftest import ROOT
    out = tmp_path / 'run'
    r = run_script('run_cycles.py', os.path.join(ROOT, 'config', 'cycles_gpt2_gpu.py'), f'--out_dir={out}',
                   f'--init_from={hf_dir[0]}', f'--dataset={bpe_data}', '--device=cpu', '--compile=False',
                   '--num_cycles=0', '--block_size=32', '--batch_size=4', '--base_max_iters=4',
                   '--base_eval_interval=2', '--base_select_tokens=1000', '--eval_num_samples=8', '--judge_seeds=1',
                   '--judge_max_blocks=8', '--judge_max_iters=2')
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = load_checkpoint(str(out / 'base_model_v1.pt'))
    assert ckpt['tokenization']['vocab_size'] == 50257 and GPT.from_checkpoint(ckpt).config.tokens == 50257
    point = json.loads((out / 'eval_v1.json').read_text())[0]
    assert point['val_perplexity'] > 1 and len(point['c2st_sample_texts']) == 8
