"""The family bound (docs/family_bound.md) on an enumerable case: two tokens over a vocabulary of 3, a data law with
dependence between them, and a family too small for it (the factorised laws q(x1)·q(x2), a model without context).
Every projection is computed exactly: next-token training reaches the forward-KL projection of the data; the tilt's
game (the KL inside the reward, rewards.kl_regularised) reaches the reverse-KL projection of the tilt; a forward-KL
distillation of the tilt (DPG's update, train_grpo.tilt_advantages) reaches the tilt's forward projection. At the
plateau a perfect judge's tilt is the data law, so no member of the family reads a lower cross-entropy than the base:
the judge's gain reaches the generator only through the error next-token training left."""
import numpy as np
import pytest
import torch

from rewards import kl_regularised
from train_grpo import tilt_advantages

DATA = torch.tensor([[0.30, 0.05, 0.02],
                     [0.04, 0.20, 0.06],
                     [0.03, 0.05, 0.25]], dtype=torch.float64)  # x2 mostly repeats x1


def family(a, b):
    """The factorised law of logits a, b: log q(x1, x2) as a 3 x 3 table."""
    return torch.log_softmax(a, 0)[:, None] + torch.log_softmax(b, 0)[None, :]


def marginals_product(r):
    """The forward-KL projection of r onto the family, in closed form: the product of its marginals."""
    return r.sum(1)[:, None] * r.sum(0)[None, :]


def fit(loss, start=None):
    """The family's member that minimises loss(log q), by L-BFGS on the logits from start (a law of the family)."""
    a, b = (torch.zeros(3, dtype=torch.float64) for _ in range(2)) if start is None else \
        (start.sum(1).log(), start.sum(0).log())
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    opt = torch.optim.LBFGS([a, b], max_iter=1000, tolerance_grad=1e-13, tolerance_change=1e-16,
                            line_search_fn='strong_wolfe')

    def closure():
        opt.zero_grad()
        value = loss(family(a, b))
        value.backward()
        return value
    opt.step(closure)
    return family(a, b).detach().exp()


def cross_entropy(r, q):
    return float(-(r * q.log()).sum())


def reverse_projection(t, start, sweeps=500):
    """The reverse-KL projection of t, argmin KL(q || t) over the family, by its own fixed-point equations
    (coordinate ascent: q(x1) ∝ exp E_{q(x2)} log t(x1, x2), and the same for x2), from start."""
    q1, q2 = start.sum(1), start.sum(0)
    for _ in range(sweeps):
        q1 = torch.softmax(t.log() @ q2, 0)
        q2 = torch.softmax(q1 @ t.log(), 0)
    return q1[:, None] * q2[None, :]


def game_optimum(f, reference):
    """The tilt's game at its optimum in the family: E_q[f - log q/pi_ref] maximised, the reward of each text being the
    trainer's own (rewards.kl_regularised: the judge's log-odds less the completion's log-ratio to the reference)."""
    def loss(log_q):
        reward = kl_regularised(f.flatten(), log_q.flatten()[:, None], reference.log().flatten()[:, None],
                                torch.ones(9, 1, dtype=torch.float64))
        return -(log_q.exp().flatten() * reward).sum()
    return fit(loss, start=reference)


def test_next_token_training_reaches_the_forward_projection():
    mle = fit(lambda log_q: -(DATA * log_q).sum())
    torch.testing.assert_close(mle, marginals_product(DATA), atol=1e-6, rtol=0)


def test_at_the_plateau_a_perfect_judges_tilt_is_the_data_and_no_member_of_the_family_beats_the_base():
    """The base at its plateau, fed without limit, is the forward projection pi of the data. The judge that knows
    everything, f = log p/pi, tilts pi to p itself. Its game reaches the reverse projection of p, which covers less and
    reads a higher cross-entropy on the data than pi; the forward distillation of the tilt reaches pi again: no
    change of the weights lowers perplexity, whatever the judge knows."""
    base = marginals_product(DATA)
    f = DATA.log() - base.log()
    tilt = base * f.exp()
    torch.testing.assert_close(tilt / tilt.sum(), DATA, atol=1e-12, rtol=0)
    game = game_optimum(f, base)
    torch.testing.assert_close(game, reverse_projection(DATA, base), atol=1e-6, rtol=0)
    assert (game - base).abs().max() > 0.04  # the family is too small: the two projections differ
    assert cross_entropy(DATA, game) > cross_entropy(DATA, base) + 0.03  # the game loses coverage (0.040 nats) ...
    kl_reverse = lambda q: float((q * (q.log() - DATA.log())).sum())  # noqa: E731
    assert kl_reverse(game) < kl_reverse(base) - 0.01  # ... for precision: KL(q || p) 0.422 against 0.442
    distilled = fit(lambda log_q: -(tilt * log_q).sum(), start=game)
    torch.testing.assert_close(distilled, base, atol=1e-6, rtol=0)
    rng = np.random.default_rng(0)  # and no member of the family at all reads below the base
    others = [family(torch.from_numpy(rng.normal(0, 2, 3)), torch.from_numpy(rng.normal(0, 2, 3))).exp()
              for _ in range(2000)]
    assert min(cross_entropy(DATA, q) for q in others) > cross_entropy(DATA, base)


def test_with_too_little_data_the_judge_gains_what_estimation_left_and_only_distillation_keeps_it():
    """A base fit on 40 draws (the product of their empirical marginals: next-token training's optimum on them) sits
    above the projection by its estimation error. A perfect judge's tilt of it is the data law again; distilling it
    forward gains exactly that error, and the game, reaching the reverse projection, ends above even the projection."""
    rng = np.random.default_rng(1)
    draws = rng.choice(9, size=40, p=DATA.flatten().numpy())
    counts = torch.from_numpy(np.bincount(draws, minlength=9).reshape(3, 3)).double() + 0.5  # no zero marginal
    base = marginals_product(counts / counts.sum())
    best = marginals_product(DATA)
    error = cross_entropy(DATA, base) - cross_entropy(DATA, best)
    assert error > 0.005
    f = DATA.log() - base.log()
    distilled = fit(lambda log_q: -(base * f.exp() * log_q).sum(), start=base)
    assert cross_entropy(DATA, base) - cross_entropy(DATA, distilled) == pytest.approx(error, abs=1e-6)
    game = game_optimum(f, base)
    assert cross_entropy(DATA, game) > cross_entropy(DATA, best) + 0.03


def test_dpgs_update_is_the_forward_distillations_gradient():
    """train_grpo.tilt_advantages('dpg') on one large group drawn from q, weights pi_ref·e^f/q: its update
    sum_i A_i grad log q(x_i) / G points along the exact gradient of -CE(tilt, q), the forward projection's objective."""
    base = marginals_product(DATA)
    f = DATA.log() - base.log()
    a = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([-0.1, 0.4, 0.0], dtype=torch.float64, requires_grad=True)
    log_q = family(a, b).flatten()
    exact = torch.autograd.grad((DATA.flatten() * log_q).sum(), [a, b], retain_graph=True)
    G = 200_000
    x = torch.multinomial(log_q.detach().exp(), G, replacement=True, generator=torch.Generator().manual_seed(0))
    log_w = base.log().flatten()[x] + f.flatten()[x] - log_q.detach()[x]
    advantages = tilt_advantages(log_w, G, 'dpg', None)[0]
    update = torch.autograd.grad((advantages * log_q[x]).sum() / G, [a, b])
    flat = [torch.cat(list(g)) for g in (exact, update)]
    assert float(torch.nn.functional.cosine_similarity(*flat, dim=0)) > 0.99
    assert float(flat[1].norm() / flat[0].norm()) == pytest.approx(1.0, abs=0.05)


def test_gated_dpg_drawn_from_a_proposal_keeps_the_gradient_and_its_gate_reads_the_kl_gap():
    """--proposal=gated: rollouts drawn from a proposal r that is not the policy q, weights pi_ref·e^f / r, and
    Korbak et al.'s baseline q/r (log_rho): the update still points along the exact gradient of -CE(tilt, q), and the
    baseline alone moves nothing in expectation. GDC's gate (train_grpo.proposal_gate) reads KL(t||q) - KL(t||r) from
    the same draws (log Z cancels), exact on a large group, and hands the proposal the policy's weights only when it
    is below 0."""
    from types import SimpleNamespace
    from train_grpo import proposal_gate
    base = marginals_product(DATA)
    f = DATA.log() - base.log()  # the perfect judge: the tilt is the data law
    a = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([-0.1, 0.4, 0.0], dtype=torch.float64, requires_grad=True)
    log_q = family(a, b).flatten()
    log_r = family(torch.tensor([-0.4, 0.2, 0.3], dtype=torch.float64),
                   torch.tensor([0.2, 0.1, -0.5], dtype=torch.float64)).flatten()
    exact = torch.autograd.grad((DATA.flatten() * log_q).sum(), [a, b], retain_graph=True)
    G = 400_000
    x = torch.multinomial(log_r.exp(), G, replacement=True, generator=torch.Generator().manual_seed(1))
    log_w, log_rho = base.log().flatten()[x] + f.flatten()[x] - log_r[x], log_q.detach()[x] - log_r[x]
    advantages = tilt_advantages(log_w, G, 'dpg', None, log_rho)[0]
    update = torch.autograd.grad((advantages * log_q[x]).sum() / G, [a, b], retain_graph=True)
    flat = [torch.cat(list(g)) for g in (exact, update)]
    assert float(torch.nn.functional.cosine_similarity(*flat, dim=0)) > 0.99
    assert float(flat[1].norm() / flat[0].norm()) == pytest.approx(1.0, abs=0.05)
    baseline = torch.autograd.grad((log_rho.exp() * log_q[x]).sum() / G, [a, b])
    assert float(torch.cat(list(baseline)).norm()) < 0.05 * float(flat[0].norm())
    for proposal, closer in ((log_r, True), (DATA.log().flatten(), False)):  # r far from the data, then the data
        draws = torch.multinomial(proposal.exp(), G, replacement=True, generator=torch.Generator().manual_seed(2))
        gap_exact = float((DATA.flatten() * (proposal - log_q.detach())).sum())
        s = SimpleNamespace(rewards=(base.log().flatten() + f.flatten() - proposal)[draws],
                            log_rho=(log_q.detach() - proposal)[draws])
        handed = {}
        run = SimpleNamespace(C=SimpleNamespace(num_generations=G), rt=SimpleNamespace(ddp=False), proposal_updates=0,
                              proposal=SimpleNamespace(load_state_dict=handed.update))
        assert proposal_gate(run, s, {'w': 1}) == pytest.approx(gap_exact, abs=0.01) and (gap_exact < 0) == closer
        assert (handed == {'w': 1}) == closer and run.proposal_updates == closer


def test_the_natural_anchor_stops_halfway_and_the_w_minus_1_anchor_reaches_the_tilts_projection():
    """Channel (b) anchored: next-token loss on a mix of m natural windows and 1 - m of the tilt's is CE of the mixture
    (CE is linear in its first law), so it reaches the forward projection of (1 - m)·D + m·t, short of the tilt's. The
    w - 1 anchor subtracts the same loss on the base's own samples: CE((1 - m)·D + m·t - m·pi, q). The family is
    exponential (its statistics the two marginals), where that objective stays convex and its optimum matches
    moments; the base fit on D matches D's, so at m = 1/2 the optimum is exactly the tilt's forward projection."""
    rng = np.random.default_rng(1)
    draws = rng.choice(9, size=40, p=DATA.flatten().numpy())
    counts = torch.from_numpy(np.bincount(draws, minlength=9).reshape(3, 3)).double() + 0.5
    train = counts / counts.sum()  # the natural windows' law
    base = marginals_product(train)  # next-token training's optimum on them: the base at its plateau on its data
    tilt = DATA  # the perfect judge's tilt of the base
    natural = fit(lambda log_q: -((0.5 * train + 0.5 * tilt) * log_q).sum(), start=base)
    torch.testing.assert_close(natural, marginals_product(0.5 * train + 0.5 * tilt), atol=1e-6, rtol=0)
    w_minus_1 = fit(lambda log_q: -((0.5 * train + 0.5 * tilt - 0.5 * base) * log_q).sum(), start=base)
    torch.testing.assert_close(w_minus_1, marginals_product(tilt), atol=1e-6, rtol=0)
    gain = lambda q: cross_entropy(DATA, base) - cross_entropy(DATA, q)  # noqa: E731
    assert gain(w_minus_1) > 0.005 and 0.6 < gain(natural) / gain(w_minus_1) < 0.9
