import math
import re

import numpy as np
import pytest
import torch

from conftest import run_script
from model import GPT, load_checkpoint
from judge import crossover_targets, judge_loss, pair_accuracy, pairwise_loss, reward_metrics


def train_rm(ckpt, data, out, *extra):
    r = run_script('train_reward_model.py', f'--model_path={ckpt}', f'--data_dir={data}', f'--out_path={out}',
                   '--device=cpu', '--batch_size=16', '--eval_interval=20', '--feature_batch_size=32', *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def val_losses(stdout):
    return [float(v) for v in re.findall(r"iter \d+: val loss ([\d.]+)", stdout)]


@pytest.fixture(scope='module')
def trained_rm(tmp_path_factory, char_ckpt, learnable_reward):
    out = tmp_path_factory.mktemp('rm') / 'rm.pt'
    r = train_rm(char_ckpt, learnable_reward, out, '--max_iters=300', '--learning_rate=3e-3',
                 '--reward_head_hidden_dim=64')
    return str(out), r.stdout


def test_training_lowers_val_loss_and_keeps_trunk_frozen(trained_rm, char_ckpt):
    path, stdout = trained_rm
    losses = val_losses(stdout)
    assert min(losses) < 0.5 * losses[0]  # the label is learnable from the last token: a working head finds it
    assert load_checkpoint(trained_rm[0])['metrics']['r2'] > 0.3
    assert 'trunk tensors changed: 0' in stdout
    base = load_checkpoint(char_ckpt)['model']
    rm = load_checkpoint(path)['model']
    trunk = [k for k in rm if not k.startswith('reward_head.')]
    assert trunk and all(torch.equal(rm[k], base[k]) for k in trunk)


def test_checkpoint_round_trips_as_reward_model(trained_rm, learnable_reward):
    path, _ = trained_rm
    ckpt = load_checkpoint(path)
    assert ckpt['model_args']['mode'] == 'reward' and ckpt['model_args']['reward_head_hidden_dim'] == 64
    assert set(ckpt['metrics']) >= {'mse', 'baseline_mse', 'r2', 'mae', 'boundary_error'}
    assert ckpt['tokenization']['method'] == 'char'
    model = GPT.from_checkpoint(path)
    assert model.config.mode == 'reward'
    from reward_dataset_loader import RewardDataset
    val = RewardDataset(learnable_reward, 'val')
    select, test = val.selection_and_test_rows()
    assert len(select) == len(test) == 100 and not set(select) & set(test)
    baseline = float(np.mean(RewardDataset(learnable_reward, 'train').y[:, 0]))
    for rows, key in ((test, 'metrics'), (select, 'selection_metrics')):
        with torch.no_grad():
            probs = model(torch.from_numpy(val.x[rows].astype(np.int64)))[0]
        m = reward_metrics(probs[:, 0].numpy(), val.y[rows, 0], val.block_size, baseline)
        assert m['mse'] == pytest.approx(ckpt[key]['mse'], rel=1e-4)  # the saved figures are the saved model's
    assert ckpt['metrics'] != ckpt['selection_metrics'] and ckpt['data_block_size'] == val.block_size


@pytest.mark.parametrize('pooling', ['last', 'mean', 'token'])
def test_cached_features_equal_full_forward(tmp_path, char_ckpt, char_reward, pooling):
    a = train_rm(char_ckpt, char_reward, tmp_path / 'a.pt', '--max_iters=12', '--eval_interval=4',
                 f'--reward_pooling={pooling}')
    b = train_rm(char_ckpt, char_reward, tmp_path / 'b.pt', '--max_iters=12', '--eval_interval=4',
                 f'--reward_pooling={pooling}', '--use_feature_cache=False')
    assert load_checkpoint(str(tmp_path / 'a.pt'))['model_args']['reward_pooling'] == pooling
    assert 'cached features' in a.stdout and 'cached features' not in b.stdout
    np.testing.assert_allclose(val_losses(a.stdout), val_losses(b.stdout), rtol=1e-5)
    ha, hb = load_checkpoint(str(tmp_path / 'a.pt'))['model'], load_checkpoint(str(tmp_path / 'b.pt'))['model']
    for k in ha:
        if k.startswith('reward_head.'):
            torch.testing.assert_close(ha[k], hb[k], rtol=1e-4, atol=1e-6)


def test_unfreeze_layers_trains_only_the_last_blocks(tmp_path, char_ckpt, char_reward):
    out = tmp_path / 'u.pt'
    r = train_rm(char_ckpt, char_reward, out, '--max_iters=5', '--eval_interval=5', '--unfreeze_layers=1', '--loss=ce')
    assert 'cached features' not in r.stdout
    assert 'trunk tensors changed: 14 ' in r.stdout  # the last block's 12 tensors and ln_f's 2, nothing else
    base, rm = load_checkpoint(char_ckpt)['model'], load_checkpoint(str(out))['model']
    assert torch.equal(base['transformer.h.0.mlp.c_fc.weight'], rm['transformer.h.0.mlp.c_fc.weight'])
    assert torch.equal(base['transformer.wte.weight'], rm['transformer.wte.weight'])


def test_sight_auc_known_answers():
    from auc import sight_auc
    assert sight_auc([0.9, 0.8], [0.1, 0.2, 0.3]) == 1.0  # every natural window above every sample
    assert sight_auc([0.1, 0.2], [0.8, 0.9]) == 0.0
    assert sight_auc([0.5] * 3, [0.5] * 4) == 0.5  # a blind judge: all ties
    assert sight_auc([0.3, 0.7], [0.5]) == 0.5 and sight_auc([0.6], [0.5, 0.6, 0.7]) == pytest.approx(0.5)


def test_sight_spread_is_the_bootstrap_sd_over_texts():
    """Perfect separation has no spread; a blind judge on 200 + 200 texts spreads as the AUC's null sd,
    sqrt((n + m + 1) / (12 n m)) = 0.029; one seed, one figure."""
    from auc import sight_auc_sd
    assert sight_auc_sd([0.9, 0.8, 0.7], [0.1, 0.2], seed=0) == 0.0
    rng = np.random.default_rng(1)
    natural, samples = rng.random(200), rng.random(200)
    assert 0.022 < sight_auc_sd(natural, samples, seed=0) < 0.036
    assert sight_auc_sd(natural, samples, seed=3) == sight_auc_sd(natural, samples, seed=3)


def test_a_judge_trains_its_whole_network_or_starts_from_random_weights(tmp_path, char_ckpt, char_reward):
    """unfreeze_layers=-1 trains every tensor of the trunk, embeddings included; init_from='random' keeps the
    base's shape and tokenization and none of its weights."""
    r = train_rm(char_ckpt, char_reward, tmp_path / 'w.pt', '--max_iters=5', '--eval_interval=5',
                 '--unfreeze_layers=-1')
    assert 'trunk tensors changed: 28 ' in r.stdout  # wte, wpe, both blocks' 24 and ln_f's 2
    train_rm(char_ckpt, char_reward, tmp_path / 'rand.pt', '--max_iters=0', '--init_from=random')
    base, rand = load_checkpoint(char_ckpt), load_checkpoint(str(tmp_path / 'rand.pt'))
    assert rand['tokenization'] == base['tokenization'] and rand['config']['init_from'] == 'random'
    for k in ('transformer.wte.weight', 'transformer.h.0.mlp.c_fc.weight'):
        assert base['model'][k].shape == rand['model'][k].shape and not torch.equal(base['model'][k], rand['model'][k])
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={tmp_path / "x.pt"}', '--device=cpu', '--unfreeze_layers=5')
    assert r.returncode == 2 and 'unfreeze_layers must be in [-1, 2]' in r.stderr and 'Traceback' not in r.stderr


def test_resume_continues_from_the_saved_best(tmp_path, char_ckpt, learnable_reward):
    out = tmp_path / 'r.pt'
    train_rm(char_ckpt, learnable_reward, out, '--max_iters=10', '--eval_interval=5', '--reward_head_hidden_dim=16',
             '--learning_rate=3e-3')
    assert load_checkpoint(str(out))['iter_num'] == 10  # still improving, so the best is the last
    r = train_rm(char_ckpt, learnable_reward, out, '--max_iters=20', '--eval_interval=5', '--init_from=resume',
                 '--learning_rate=3e-3')
    assert 'iter 10:' in r.stdout and 'iter 0:' not in r.stdout
    assert load_checkpoint(str(out))['model_args']['reward_head_hidden_dim'] == 16


def test_tokenization_mismatch_is_a_clear_error(tmp_path, bpe_ckpt, char_reward):
    r = run_script('train_reward_model.py', f'--model_path={bpe_ckpt}', f'--data_dir={char_reward}',
                   f'--out_path={tmp_path / "x.pt"}', '--device=cpu')
    assert r.returncode == 2 and 'Traceback' not in r.stderr
    assert 'tokenization mismatch' in r.stderr and 'method' in r.stderr
    assert not (tmp_path / 'x.pt').exists()


def test_reward_metrics_hand_values():
    m = reward_metrics([0.5, 0.25], [0.75, 0.25], 8, 0.5)
    assert m['mse'] == pytest.approx((0.0625 + 0) / 2) and m['baseline_mse'] == pytest.approx((0.0625 + 0.0625) / 2)
    assert m['r2'] == pytest.approx(0.5) and m['mae'] == pytest.approx(0.125) and m['boundary_error'] == pytest.approx(1.0)


def test_torchrun_two_ranks(tmp_path, char_ckpt, learnable_reward):
    out = tmp_path / 'ddp.pt'
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train_reward_model.py',
                   f'--model_path={char_ckpt}', f'--data_dir={learnable_reward}', f'--out_path={out}', '--device=cpu',
                   '--backend=gloo', '--max_iters=40', '--eval_interval=20', '--batch_size=16', '--learning_rate=3e-3',
                   env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(str(out))['metrics']['r2'] > 0.2


def test_token_labels_match_the_crossover_exactly():
    N = 8
    y = torch.tensor([[1 / N, (N - 1) / N], [5 / N, 3 / N], [7 / N, 1 / N]])
    t = crossover_targets(y, N)
    assert t.shape == (3, N, 2) and torch.equal(t[..., 0] + t[..., 1], torch.ones(3, N))
    for row, K in enumerate((1, 5, 7)):
        assert t[row, :, 0].tolist() == [1.0] * K + [0.0] * (N - K)
    probs = torch.full((3, N, 2), 0.5)  # a blind token judge: every position off by 0.5 on both outputs
    assert judge_loss(probs, y, 'mse').item() == pytest.approx(0.25)


@pytest.fixture(scope='module')
def tokenwise_reward(tmp_path_factory, char_data):
    """Crossover samples whose natural part is written from one half of the vocabulary and whose generated part
    from the other: each token says on which side of K it stands."""
    from prepare_reward_data import labels_for, write_split
    from tokenization_manager import TokenizationManager
    out = tmp_path_factory.mktemp('rd') / 'tokenwise'
    out.mkdir()
    tok = TokenizationManager('char', data_dir=char_data)
    rng, half = np.random.default_rng(0), tok.vocab_size // 2
    for split, n in (('train', 400), ('val', 200)):
        K = rng.integers(1, 32, size=n)
        x = np.where(np.arange(32)[None, :] < K[:, None], rng.integers(0, half, (n, 32)),
                     rng.integers(half, tok.vocab_size, (n, 32))).astype(np.uint16)
        write_split(str(out), split, x, labels_for(K, 32), dict(tokenization_method='char', vocab_size=tok.vocab_size,
                                                                 meta_path=tok.meta_path))
    return str(out)


def test_token_judge_reads_the_boundary(tmp_path, char_ckpt, tokenwise_reward):
    """Trained on per-position labels, the token judge's sequence P(natural) (its mean over positions) recovers K/N
    on held-out samples: R² near 1, boundary error within about a token, where the last-token judge sees far less."""
    train_rm(char_ckpt, tokenwise_reward, tmp_path / 't.pt', '--reward_pooling=token', '--max_iters=300',
             '--learning_rate=3e-3')
    train_rm(char_ckpt, tokenwise_reward, tmp_path / 'l.pt', '--reward_pooling=last', '--max_iters=300',
             '--learning_rate=3e-3')
    token, last = load_checkpoint(str(tmp_path / 't.pt'))['metrics'], load_checkpoint(str(tmp_path / 'l.pt'))['metrics']
    assert token['r2'] > 0.9 and token['boundary_error'] < 2.0, token
    assert token['r2'] > last['r2'] + 0.2, (token, last)
    judge = GPT.from_checkpoint(str(tmp_path / 't.pt'))
    x = torch.randint(0, 10, (2, 32))
    with torch.no_grad():
        per_position, seq = judge(x, per_token=True)[0], judge(x)[0]
    assert per_position.shape == (2, 32, 2) and torch.allclose(per_position.mean(dim=1), seq)


def test_pairwise_loss_matches_hand_computation():
    """D = log P(natural) / P(synthetic); the loss is -log sigma(D(natural) - D(sample)), the accuracy how often
    D(natural) > D(sample), a tie half."""
    natural = torch.tensor([[0.8, 0.2], [0.5, 0.5], [0.3, 0.7]])
    sample = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.6, 0.4]])
    d = [math.log(4) - 0.0, 0.0, math.log(3 / 7) - math.log(1.5)]
    by_hand = sum(math.log(1 + math.exp(-x)) for x in d) / 3
    assert pairwise_loss(natural, sample).item() == pytest.approx(by_hand, rel=1e-5)
    assert pairwise_loss(natural[1:2], sample[1:2]).item() == pytest.approx(math.log(2))
    assert pair_accuracy(natural, sample) == pytest.approx((1 + 0.5 + 0) / 3)
    token = natural[:, None, :].expand(3, 5, 2)  # a token judge's per-position probs: scored by their mean
    assert pairwise_loss(token, sample).item() == pytest.approx(by_hand, rel=1e-5)


def test_pairwise_judge_learns_to_rank_natural_text_first(tmp_path, char_ckpt, char_data, noise_gen):
    """Paired with the natural block each of a noise generator's samples was cut from, a blind judge ranks them at
    chance (0.5) and a pairwise judge trained on the train split ranks the natural block first on nearly every
    held-out pair. A dataset without natural blocks is a one-line error."""
    from conftest import prepare_reward
    prepare_reward(noise_gen, tmp_path / 'rd', '--max_blocks', '40', data=char_data)
    blind = train_rm(char_ckpt, tmp_path / 'rd', tmp_path / 'blind.pt', '--max_iters=0', '--loss=pairwise')
    assert 'pair accuracy 0.500' in blind.stdout
    train_rm(char_ckpt, tmp_path / 'rd', tmp_path / 'pw.pt', '--max_iters=200', '--loss=pairwise',
             '--learning_rate=3e-3', '--reward_pooling=mean')
    m = load_checkpoint(str(tmp_path / 'pw.pt'))
    assert m['metrics']['pair_accuracy'] > 0.9 and m['config']['loss'] == 'pairwise'
    for name in ('val_natural.bin', 'train_natural.bin'):
        (tmp_path / 'rd' / name).unlink()
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={tmp_path / "rd"}',
                   f'--out_path={tmp_path / "x.pt"}', '--device=cpu', '--loss=pairwise')
    assert r.returncode == 2 and 'natural block' in r.stderr and 'Traceback' not in r.stderr


def test_whole_window_judge_learns_natural_windows_from_continuations(tmp_path, char_ckpt, char_data, noise_gen):
    """--crossover_k 4: every sample keeps its block's first 4 tokens and the generator writes the rest; loss=binary
    trains on each sample and its natural block (label [1, 0]) and tells held-out pairs apart. A crossover_k beyond
    the block is a one-line error before any work."""
    from conftest import prepare_reward
    from reward_dataset_loader import RewardDataset
    prepare_reward(noise_gen, tmp_path / 'rd', '--max_blocks', '40', '--samples_per_chunk', '1', '--crossover_k', '4',
                   data=char_data)
    ds = RewardDataset(str(tmp_path / 'rd'), 'train')
    assert np.allclose(ds.y, [[4 / 32, 28 / 32]])
    assert np.array_equal(ds.x[:, :4], ds.natural[:, :4]) and (ds.x[:, 4:] != ds.natural[:, 4:]).mean() > 0.5
    r = train_rm(char_ckpt, tmp_path / 'rd', tmp_path / 'w.pt', '--max_iters=150', '--loss=binary',
                 '--learning_rate=3e-3', '--reward_pooling=token')
    assert re.search(r"iter 20: val loss [\d.]+ \| pair accuracy [\d.]+\n", r.stdout)  # no R² of constant labels
    m = load_checkpoint(str(tmp_path / 'w.pt'))
    assert m['metrics']['pair_accuracy'] > 0.9 and m['config']['loss'] == 'binary'
    # two ranks of 8 rows train the whole network as one process of 16 does: the same rows, the averaged gradient
    common = ('--max_iters=10', '--eval_interval=10', '--loss=binary', '--learning_rate=3e-3', '--unfreeze_layers=-1',
              '--reward_pooling=mean')
    train_rm(char_ckpt, tmp_path / 'rd', tmp_path / 'one.pt', *common)
    r = run_script('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train_reward_model.py',
                   f'--model_path={char_ckpt}', f'--data_dir={tmp_path / "rd"}', f'--out_path={tmp_path / "two.pt"}',
                   '--device=cpu', '--backend=gloo', '--batch_size=8', '--feature_batch_size=32', *common,
                   env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    one, two = load_checkpoint(str(tmp_path / 'one.pt')), load_checkpoint(str(tmp_path / 'two.pt'))
    assert one['iter_num'] == two['iter_num'] == 10
    # Adam turns rounding in near-zero gradients (the attention's key bias) into steps: a tolerance scaled by the
    # movement
    start = load_checkpoint(char_ckpt)['model']
    moved = max((one['model'][k] - start[k]).abs().max().item() for k in one['model'] if k in start)
    gap = max((two['model'][k] - one['model'][k]).abs().max().item() for k in one['model'])
    assert gap < 0.02 * moved, (gap, moved)
    r = run_script('prepare_reward_data.py', '--model_path', noise_gen, '--input_mode', 'binary', '--train_bin',
                   f'{char_data}/train.bin', '--val_bin', f'{char_data}/val.bin', '--output_dir', str(tmp_path / 'x'),
                   '--crossover_k', '32')
    assert r.returncode == 2 and '--crossover_k must be below the block size 32' in r.stderr
    assert 'Traceback' not in r.stderr and not (tmp_path / 'x').exists()


def test_a_bidirectional_judge_reads_every_token_from_every_position():
    """bidirectional=True: the first position's state moves when the last token changes (a causal trunk's cannot),
    while a generator stays causal: its logits before the changed token are untouched. Only whole-window judges may
    attend both ways."""
    from model import GPTConfig
    torch.manual_seed(0)
    shape = dict(n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=11)
    x = torch.randint(0, 11, (2, 12))
    edited = x.clone()
    edited[:, -1] = (edited[:, -1] + 1) % 11
    for bidirectional in (False, True):
        judge = GPT(GPTConfig(**shape, mode='reward', reward_pooling='mean', bidirectional=bidirectional)).eval()
        with torch.no_grad():
            moved = (judge.hidden_states(x)[:, 0] - judge.hidden_states(edited)[:, 0]).abs().max().item()
        assert (moved > 1e-4) == bidirectional, (bidirectional, moved)
    generator = GPT(GPTConfig(**shape)).eval()
    with torch.no_grad():
        a, b = generator(x, all_logits=True)[0], generator(edited, all_logits=True)[0]
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])
    for bad in (dict(mode='generator'), dict(mode='reward', reward_pooling='token')):
        with pytest.raises(ValueError, match='whole-window judges'):
            GPT(GPTConfig(**shape, bidirectional=True, **bad))


def test_ranking_loss_matches_hand_computation():
    """Ranking NCE: -log softmax over [D(natural), D(its K samples)] with the natural first; K = 1 is Bradley-Terry,
    and a constant added to one group's scores changes nothing."""
    from judge import ranking_loss
    natural = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    samples = torch.tensor([[0.5, 0.5], [0.6, 0.4], [0.9, 0.1], [0.2, 0.8]])  # two a block
    d = lambda p: math.log(p[0] / p[1])  # noqa: E731
    by_hand = 0.0
    for g in range(2):
        scores = [d(natural[g])] + [d(samples[2 * g + j]) for j in range(2)]
        by_hand += -(scores[0] - math.log(sum(math.exp(s) for s in scores))) / 2
    assert ranking_loss(natural, samples).item() == pytest.approx(by_hand, rel=1e-5)
    assert ranking_loss(natural, samples[::2]).item() == pytest.approx(pairwise_loss(natural, samples[::2]).item())
    def shifted(p, c):  # the same probs with c added to D = logit P(natural)
        q = torch.sigmoid(torch.logit(p[:, 0]) + c)
        return torch.stack([q, 1 - q], 1)
    c = torch.tensor([1.5, -0.7])  # one constant a group, added to D of its natural block and its samples
    assert ranking_loss(shifted(natural, c), shifted(samples, c.repeat_interleave(2))).item() == \
        pytest.approx(by_hand, rel=1e-4)


def test_the_ranking_losss_optimum_is_the_log_ratio_of_data_to_noise():
    """The known answer of ranking NCE (Lin et al. 2021; Ma and Collins 2018): with natural x ~ p and K noise samples
    ~ pi a positive, the expected loss is minimised by D = log p/pi + const. A free score per outcome, trained on a
    four-outcome case by this loss (D read through the judge's 2-class probabilities, as the network's head gives it),
    recovers the log-ratios to sampling error; a judge at this optimum tilts pi to p exactly."""
    from judge import ranking_loss
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    pi = torch.tensor([0.1, 0.2, 0.3, 0.4])
    K, G = 8, 20000
    gen = torch.Generator().manual_seed(0)
    natural = torch.multinomial(p, G, replacement=True, generator=gen)
    noise = torch.multinomial(pi, G * K, replacement=True, generator=gen)
    d = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([d], lr=0.1)
    as_probs = lambda x: torch.stack([torch.sigmoid(d[x]), torch.sigmoid(-d[x])], 1)  # noqa: E731
    for _ in range(150):
        opt.zero_grad()
        ranking_loss(as_probs(natural), as_probs(noise)).backward()
        opt.step()
    learnt = (d - d.mean()).detach()
    exact = (p / pi).log() - (p / pi).log().mean()
    assert torch.allclose(learnt, exact, atol=0.06), (learnt, exact)
    tilted = pi * learnt.exp()
    assert torch.allclose(tilted / tilted.sum(), p, atol=0.01)


def test_ranking_judge_learns_from_many_samples_a_window(tmp_path, char_ckpt, char_data, noise_gen):
    """--crossover_k 4 with 4 samples a block: loss=ranking trains each natural window against its block's 4
    continuations at once, frozen (cached features) or bidirectional with every weight, and ranks held-out natural
    windows first; a bidirectional per-token judge, or co-training a ranking judge online, is a one-line error."""
    from conftest import prepare_reward
    prepare_reward(noise_gen, tmp_path / 'rd', '--max_blocks', '30', '--samples_per_chunk', '4', '--crossover_k', '4',
                   data=char_data)
    for name, extra in (('frozen', ()), ('bidirectional', ('--bidirectional=True', '--unfreeze_layers=-1'))):
        train_rm(char_ckpt, tmp_path / 'rd', tmp_path / f'{name}.pt', '--max_iters=120', '--loss=ranking',
                 '--learning_rate=3e-3', '--reward_pooling=mean', *extra)
        m = load_checkpoint(str(tmp_path / f'{name}.pt'))
        assert m['metrics']['pair_accuracy'] > 0.9, (name, m['metrics'])
        assert m['model_args']['bidirectional'] == (name == 'bidirectional')
    assert GPT.from_checkpoint(str(tmp_path / 'bidirectional.pt')).config.bidirectional
    r = run_script('train_grpo.py', f'--policy_path={char_ckpt}', f'--reward_model_path={tmp_path / "frozen.pt"}',
                   f'--dataset={char_data}', f'--out_path={tmp_path / "p.pt"}', '--device=cpu', '--max_steps=1',
                   '--judge_update_interval=1')  # its online update is not built: a one-line error
    assert r.returncode == 2 and 'ranking NCE' in r.stderr and not (tmp_path / 'p.pt').exists()
    r = run_script('train_reward_model.py', f'--model_path={char_ckpt}', f'--data_dir={tmp_path / "rd"}',
                   f'--out_path={tmp_path / "x.pt"}', '--device=cpu', '--bidirectional=True', '--reward_pooling=token')
    assert r.returncode == 2 and 'per-position labels would leak' in r.stderr and 'Traceback' not in r.stderr


def test_a_judge_selects_on_held_out_train_windows_never_on_val(tmp_path, char_ckpt, char_data, noise_gen):
    """--select_blocks 10: ten more blocks of the generator's own training tokens, none in the train split, make a
    select split; train_reward_model.py keeps the checkpoint whose loss on it is lowest and reports on all of val.
    The val split is the same as without a select split."""
    from conftest import prepare_reward
    from data_loader import generator_train_tokens
    from reward_dataset_loader import RewardDataset
    from train_reward_model import loss_of
    common = ('--max_blocks', '30', '--samples_per_chunk', '1', '--crossover_k', '4')
    prepare_reward(noise_gen, tmp_path / 'rd', *common, '--select_blocks', '10', data=char_data)
    prepare_reward(noise_gen, tmp_path / 'plain', *common, data=char_data)
    sets = {s: RewardDataset(str(tmp_path / 'rd'), s) for s in ('train', 'val', 'select')}
    offsets = {s: np.fromfile(tmp_path / 'rd' / f'{s}_block_offsets.bin', dtype=np.int64) for s in sets}
    N = sets['train'].block_size
    own = len(generator_train_tokens(np.fromfile(f'{char_data}/train.bin', dtype=np.uint16), load_checkpoint(noise_gen)))
    assert len(offsets['select']) == 10 and len(offsets['train']) == 30
    assert not set(offsets['select']) & set(offsets['train']) and offsets['select'].max() + N <= own
    assert sets['select'].metadata['held_out_tail'] == sets['train'].metadata['held_out_tail']
    assert sets['train'].metadata['excluded_select_blocks'] == '10'
    plain_val = RewardDataset(str(tmp_path / 'plain'), 'val')
    assert np.array_equal(plain_val.x, sets['val'].x) and not (tmp_path / 'plain' / 'select_x.bin').exists()

    r = train_rm(char_ckpt, tmp_path / 'rd', tmp_path / 'j.pt', '--max_iters=60', '--loss=binary',
                 '--learning_rate=3e-3', '--reward_pooling=mean')
    assert f"val ({len(sets['val'])} samples; the checkpoint was selected on 10 held-out train samples)" in r.stdout
    saved = load_checkpoint(str(tmp_path / 'j.pt'))
    judge = GPT.from_checkpoint(saved, device='cpu').eval()

    def read(ds):  # the kept judge's loss and pair accuracy on a whole split
        with torch.no_grad():
            probs = judge(torch.from_numpy(ds.x.astype(np.int64)), per_token=True)[0].float()
            natural = judge(torch.from_numpy(ds.natural.astype(np.int64)), per_token=True)[0].float()
        return loss_of('binary', probs, natural, torch.from_numpy(np.array(ds.y))).item(), pair_accuracy(natural, probs)
    assert saved['best_val_loss'] == pytest.approx(read(sets['select'])[0], abs=1e-5)  # chosen on the select split
    assert saved['metrics']['pair_accuracy'] == pytest.approx(read(sets['val'])[1], abs=1e-9)  # reported on val
    r = run_script('prepare_reward_data.py', '--model_path', noise_gen, '--input_mode', 'binary', '--train_bin',
                   f'{char_data}/train.bin', '--val_bin', f'{char_data}/val.bin', '--output_dir', str(tmp_path / 'x'),
                   '--select_blocks', '100000')
    assert r.returncode == 2 and 'lower --select_blocks' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'x').exists()
