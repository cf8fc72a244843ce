import math

import numpy as np
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, evaluate_perplexity
from early_stopping import EarlyStopping


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


def test_the_tail_calibrated_temperature_is_the_tails_best_and_scales_with_the_logits(tmp_path, char_data):
    """shared.calibrated_temperature: the temperature at which the base reads its held-out selection tail best (a
    golden-section search in 1/T, where the cross-entropy is convex). Known answer: the final LayerNorm's weight and
    bias times s multiply every logit by s, so the calibrated temperature is s times the model's own; a base that
    holds out no tail is a one-line error (a temperature fit on val would be read on val)."""
    import os
    import sys
    import pytest
    from conftest import ROOT, train_tiny
    from configurator import UserError
    from data_loader import generator_train_tokens
    from model import load_checkpoint
    sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))
    from shared import calibrated_temperature
    train_tiny(char_data, str(tmp_path / 'base'), '--max_iters=30', '--eval_interval=10', '--select_tokens=2000')
    ckpt = load_checkpoint(str(tmp_path / 'base' / 'ckpt.pt'))
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
    ckpt['held_out'] = dict(tokens=0, of=len(train))
    with pytest.raises(UserError, match='no selection tail'):
        calibrated_temperature(model, ckpt, char_data, 'cpu')
