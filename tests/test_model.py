import pytest
import torch

from model import GPT, GPTConfig, load_checkpoint, sample_next_token, save_checkpoint

TINY = dict(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16)


def tiny(mode='generator', **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY, mode=mode, **kw)).eval()


def test_config_defaults_match_nanogpt():
    c = GPTConfig()
    assert (c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.dropout, c.bias, c.mode,
            c.reward_head_hidden_dim) == (1024, 50304, 12, 12, 768, 0.0, True, 'generator', 256)


def test_invalid_mode_raises():
    with pytest.raises(ValueError, match="mode"):
        GPT(GPTConfig(**TINY, mode='critic'))
    with pytest.raises(ValueError, match="reward_pooling"):
        GPT(GPTConfig(**TINY, mode='reward', reward_pooling='max'))


def test_generator_shapes_and_tied_head():
    m = tiny()
    idx = torch.randint(0, 50, (3, 10))
    logits, loss = m(idx)
    assert logits.shape == (3, 1, 50) and loss is None
    logits, loss = m(idx, idx)
    assert logits.shape == (3, 10, 50) and loss.ndim == 0
    assert m.lm_head.weight is m.transformer.wte.weight
    assert not hasattr(m, 'reward_head')


@pytest.mark.parametrize('hidden', [1, 7, 256])
def test_reward_head_shapes_probs_and_init(hidden):
    m = tiny('reward', reward_head_hidden_dim=hidden)
    assert m.reward_head[0].weight.shape == (hidden, 16) and m.reward_head[2].weight.shape == (2, hidden)
    assert not hasattr(m, 'lm_head')
    probs, loss = m(torch.randint(0, 50, (4, 12)))
    assert probs.shape == (4, 2) and loss is None
    assert torch.allclose(probs.sum(-1), torch.ones(4))
    assert torch.allclose(probs, torch.full((4, 2), 0.5))  # zero-initialised output layer
    # the hidden layer is He-initialised: its pre-activations are of unit scale whatever the width
    feats = torch.randn(4096, 16)
    std = m.reward_head[0](feats).std().item()
    assert 0.9 < std / (2 ** 0.5) < 1.1 or hidden == 1


def test_reward_forward_uses_last_token_and_mse():
    m = tiny('reward')
    torch.nn.init.normal_(m.reward_head[2].weight)  # make the head non-constant
    idx = torch.randint(0, 50, (2, 8))
    target = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    probs, loss = m(idx, target)
    assert torch.allclose(loss, ((probs - target) ** 2).mean())
    assert torch.allclose(probs, m.reward_head(m.hidden_states(idx)[:, -1]))
    changed = idx.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 50  # an earlier token changes the last token's state through attention
    assert not torch.allclose(m(changed)[0], probs)


def test_mean_pooling_averages_every_position(tmp_path):
    m = tiny('reward', reward_pooling='mean')
    torch.nn.init.normal_(m.reward_head[2].weight)
    idx = torch.randint(0, 50, (2, 8))
    probs = m(idx)[0]
    assert torch.allclose(probs, m.reward_head(m.hidden_states(idx).mean(dim=1)))
    assert not torch.allclose(probs, m.reward_head(m.hidden_states(idx)[:, -1]))
    save_checkpoint(str(tmp_path / 'rm.pt'), m)
    back = GPT.from_checkpoint(str(tmp_path / 'rm.pt'))
    assert back.config.reward_pooling == 'mean' and torch.allclose(back(idx)[0], probs)


def naive_greedy(m, idx, n):
    for _ in range(n):
        logits, _ = m(idx[:, -m.config.block_size:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize('new_tokens', [5, 30])  # 30 goes beyond block_size: the context slides
def test_kv_cache_generate_equals_naive_greedy(new_tokens):
    m = tiny()
    torch.nn.init.normal_(m.transformer.wte.weight, std=1.0)  # spread the logits: no near-ties
    idx = torch.randint(0, 50, (4, 3))
    assert torch.equal(m.generate(idx, new_tokens, top_k=1), naive_greedy(m, idx, new_tokens))


@pytest.mark.parametrize('shared', [True, False])
def test_candidate_states_are_the_edited_rows_own_states(shared):
    """GPT.candidate_states: each candidate token at position t, attending to its row's true prefix, ends in the
    state hidden_states gives the row with token t set to it, cut after t; at positions shared by the rows or each
    row's own (t = 0 too: a candidate with no prefix)."""
    m = tiny()
    torch.nn.init.normal_(m.transformer.wpe.weight, std=0.5)  # positions that matter
    idx = torch.randint(0, 50, (3, 16))
    positions = torch.tensor([0, 7, 15]) if shared else torch.tensor([[3, 9], [15, 1], [0, 12]])
    with torch.no_grad():
        got = m.candidate_states(idx, positions)
        rows = positions.expand(3, -1)
        for b in range(3):
            for i, t in enumerate(rows[b].tolist()):
                edited = idx[b:b + 1, :t + 1].repeat(50, 1)
                edited[:, t] = torch.arange(50)
                torch.testing.assert_close(got[b, i], m.hidden_states(edited)[:, -1], atol=1e-5, rtol=1e-5)


def test_generate_per_row_prompt_lengths():
    m = tiny()
    torch.nn.init.normal_(m.transformer.wte.weight, std=1.0)
    idx = torch.randint(0, 50, (3, 8))
    lengths = torch.tensor([2, 8, 5])
    out = m.generate(idx, 8, top_k=1, prompt_lengths=lengths)
    assert out.shape == (3, 16)
    for b in range(3):
        L = int(lengths[b])
        assert torch.equal(out[b, :L], idx[b, :L])  # the prompt is kept
        assert torch.equal(out[b], naive_greedy(m, idx[b:b + 1, :L], 16 - L)[0])


def test_generate_sampling_is_seeded():
    m = tiny()
    idx = torch.zeros(2, 1, dtype=torch.long)
    a = m.generate(idx, 10, generator=torch.Generator().manual_seed(1))
    b = m.generate(idx, 10, generator=torch.Generator().manual_seed(1))
    c = m.generate(idx, 10, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize('temperature,top_k', [(1.0, None), (0.7, 5)])
def test_generate_entropy_is_that_of_the_sampled_law(temperature, top_k):
    """entropy=True leaves the draws unchanged and gives, per generated position, the entropy of softmax(logits / T)
    over the top k, as a full forward over the finished samples computes it."""
    m = tiny()
    idx = torch.randint(0, 50, (3, 4), generator=torch.Generator().manual_seed(0))
    plain = m.generate(idx, 8, temperature, top_k, generator=torch.Generator().manual_seed(1))
    out, ent = m.generate(idx, 8, temperature, top_k, generator=torch.Generator().manual_seed(1), entropy=True)
    assert torch.equal(out, plain) and ent.shape == (3, 8)
    with torch.no_grad():
        logits = m(out[:, :-1], all_logits=True)[0][:, 3:] / temperature
    kth = torch.topk(logits, top_k).values[..., [-1]] if top_k else logits.min(-1, keepdim=True).values
    p = torch.softmax(logits.masked_fill(logits < kth, -float('inf')), dim=-1)
    expected = -(p * p.clamp_min(1e-30).log()).sum(-1)
    assert torch.allclose(ent, expected, atol=1e-5)


@pytest.mark.parametrize('temperature,top_k', [(1.0, None), (0.7, None), (1.0, 3)])
def test_sampler_frequencies_match_the_distribution(temperature, top_k):
    """The inverse-CDF sampler draws from softmax(logits / T), restricted to the top k: a chi-square test over 20k
    draws on an 8-way vocabulary (a zero-probability token never drawn)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, -float('inf')])
    n = 20000
    draws = sample_next_token(logits.expand(n, -1), temperature, top_k, torch.Generator().manual_seed(0))
    expected = torch.softmax(logits / temperature, dim=-1)
    if top_k is not None:
        keep = torch.zeros_like(expected, dtype=torch.bool)
        keep[torch.topk(logits, top_k).indices] = True
        expected = torch.where(keep, expected, 0.0)
        expected = expected / expected.sum()
    counts = torch.bincount(draws, minlength=8).double()
    assert counts[expected == 0].sum() == 0
    e = expected[expected > 0].double() * n
    chi2 = (((counts[expected > 0] - e) ** 2) / e).sum().item()
    assert chi2 < 25, (counts, e)  # 6 degrees of freedom at most: p < 0.001 beyond 22.5


def test_sampler_top_k_1_is_greedy_and_rejects_nan():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next_token(logits, 1.0, 1), logits.argmax(-1))
    logits[3, 5] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        sample_next_token(logits)


@pytest.mark.parametrize('sampler', ['static', 'compile'])
def test_static_and_compiled_decode_draw_the_eager_tokens(sampler):
    """The step a CUDA graph records (fixed buffers, a position tensor, uniforms drawn outside it), run eagerly or
    through torch.compile on CPU, draws the eager path's tokens from the same generator state, with the same
    entropies, per-row prompt lengths and top-k; what the graph replays on CUDA is this step."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=48, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (5, 10), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([1, 4, 10, 6, 2])
    for kw in (dict(), dict(temperature=0.7, top_k=5, prompt_lengths=lengths, entropy=True)):
        eager = m.generate(idx, 38, generator=torch.Generator().manual_seed(3), sampler='eager', **kw)
        fast = m.generate(idx, 38, generator=torch.Generator().manual_seed(3), sampler=sampler, **kw)
        if kw:
            assert torch.allclose(eager[1], fast[1], atol=1e-5)
            eager, fast = eager[0], fast[0]
            assert all(torch.equal(fast[b, :L], idx[b, :L]) for b, L in enumerate(lengths.tolist()))
        assert fast.shape == (5, 48) and torch.equal(eager, fast)


def test_static_decode_rejects_nan_after_the_loop():
    m = tiny()
    with torch.no_grad():
        m.transformer.h[0].mlp.c_fc.bias[0] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        m.generate(torch.zeros(2, 2, dtype=torch.long), 5, sampler='static')
    with pytest.raises(ValueError, match='sampler must be one of'):
        m.generate(torch.zeros(2, 2, dtype=torch.long), 5, sampler='fast')


@pytest.mark.parametrize('dtype', [torch.int32, torch.int64, torch.int16])
def test_static_decode_takes_any_integer_prompt_and_reuses_its_buffers(dtype):
    """Every path takes int16/int32/int64 prompts and returns int64; a second call of the same shape reuses the
    decoder's fixed buffers (what a recorded graph replays) and still draws the eager tokens for its new prompts."""
    import model
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    kept = []
    for call in range(2):
        g = torch.Generator().manual_seed(call)
        idx = torch.randint(0, 50, (4, 12), generator=g)
        lengths = torch.randint(1, 13, (4,), generator=g)
        kw = dict(temperature=0.8, top_k=7, prompt_lengths=lengths)
        eager = m.generate(idx.long(), 28, generator=torch.Generator().manual_seed(9), sampler='eager', **kw)
        fast = m.generate(idx.to(dtype), 28, generator=torch.Generator().manual_seed(9), sampler='static', **kw)
        assert fast.dtype == torch.long and torch.equal(eager, fast)
        assert len(model._decoders[m]['decoders']) == 1
        kept.append(next(iter(model._decoders[m]['decoders'].values())))
    assert kept[0] is kept[1]  # the second call replayed the first call's decoder, not one built anew
    with pytest.raises(ValueError, match='integer token ids'):
        m.generate(idx.float(), 5)


def test_auto_sampler_is_the_graph_on_cuda_eager_elsewhere_and_weights_that_move_drop_the_cache():
    """What CPU can check of 'auto': it resolves to the graph loop on CUDA and, on CPU, runs the eager loop (no static
    decoder is built). That 'auto' draws the eager tokens on CUDA is the CUDA test's (gpu_checks.sh's cuda-tests)."""
    import model
    assert model.auto_sampler('cuda') == model.auto_sampler(torch.device('cuda:1')) == 'graph'
    assert model.auto_sampler('cpu') == 'eager'
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (3, 5))
    m.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    assert m not in model._decoders  # 'auto' built no static decoder on CPU: it ran the eager loop
    m.generate(idx, 20, sampler='static')
    first = model._decoders[m]
    m.crop_block_size(30)  # a parameter replaced: a recorded graph would read freed memory
    m.generate(idx, 20, sampler='static')
    assert model._decoders[m] is not first and len(model._decoders[m]['decoders']) == 1


@pytest.mark.parametrize('sampler', ['graph', 'compile'])
def test_a_failed_recording_falls_back_to_the_eager_tokens_with_one_warning(sampler, monkeypatch):
    """The recording branch forced on CPU: 'graph' fails when it records (after two real warm-up steps), 'compile'
    when torch.compile fails on its first call. Either way the call restores the generator, samples with the eager
    loop, warns once, and keeps no decoder that failed."""
    import warnings
    import model
    monkeypatch.setattr(model, 'can_record', lambda device: True)
    monkeypatch.setattr(model.StaticDecoder, 'record',
                        lambda self, args: self.guarded(lambda: (_ for _ in ()).throw(RuntimeError('capture broke'))))

    def broken_compile(fn, **kw):
        def run(*args):
            raise RuntimeError('inductor broke')
        return run
    monkeypatch.setattr(torch, 'compile', broken_compile)
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (4, 8))
    eager = m.generate(idx, 30, temperature=0.9, generator=torch.Generator().manual_seed(5), sampler='eager')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        fast = m.generate(idx, 30, temperature=0.9, generator=torch.Generator().manual_seed(5), sampler=sampler)
    assert torch.equal(eager, fast)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and 'eager loop' in messages[0]
    assert ('capture broke' if sampler == 'graph' else 'inductor broke') in messages[0]
    assert not model._decoders[m]['decoders']
    # the same shape again: no second attempt (nothing compiled or recorded, no warning), the same eager tokens
    attempts = []
    monkeypatch.setattr(model.StaticDecoder, '__init__', lambda self, *a: attempts.append(a))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        again = m.generate(idx, 30, temperature=0.9, generator=torch.Generator().manual_seed(5), sampler=sampler)
    assert torch.equal(again, eager) and not attempts and not caught
    assert len(model._decoders[m]['failed']) == 1


def test_an_empty_recorded_graph_is_a_failure_not_a_silent_no_op(monkeypatch):
    """A capture on the wrong device or stream records nothing, and PyTorch only warns: every replay would do
    nothing. Faked on CPU (a capture that runs no step and warns as PyTorch does): generate refuses the graph and
    samples with the eager loop, naming the reason."""
    import contextlib
    import warnings
    import model

    class EmptyGraph:
        def replay(self):
            pass

    @contextlib.contextmanager
    def capture_nothing(graph):
        yield
        warnings.warn('The CUDA Graph is empty. This usually means that the graph was attempted to be captured on '
                      'wrong device or stream.')
    monkeypatch.setattr(model, 'can_record', lambda device: True)
    monkeypatch.setattr(torch.cuda, 'CUDAGraph', EmptyGraph)
    monkeypatch.setattr(torch.cuda, 'graph', capture_nothing)
    monkeypatch.setattr(model.StaticDecoder, 'warm_up', lambda self, args: setattr(self, 'warm_steps', 2))
    monkeypatch.setattr(GPT, '_decode_step', lambda *args: None)  # what a capture on the wrong stream runs
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (3, 6))
    with pytest.warns(RuntimeWarning, match='recorded CUDA graph is empty'):
        out = m.generate(idx, 20, generator=torch.Generator().manual_seed(2), sampler='graph')
    monkeypatch.undo()
    assert torch.equal(out, m.generate(idx, 20, generator=torch.Generator().manual_seed(2), sampler='eager'))


@pytest.mark.parametrize('sampler', ['eager', 'static'])
def test_a_token_outside_the_vocabulary_raises(sampler):
    """A model whose logits are forced past its vocabulary (an output layer wider than vocab_size) makes generate
    raise once, after the loop, instead of returning ids no tokenizer can read. One new token: fed back, such an id
    would already fail inside the embedding."""
    m = tiny()
    wide = torch.nn.Linear(16, 55, bias=True)
    with torch.no_grad():
        wide.weight.zero_()
        wide.bias.fill_(-10.0)
        wide.bias[52] = 10.0
    m.lm_head = wide
    with pytest.raises(ValueError, match='outside the vocabulary'):
        m.generate(torch.zeros(2, 2, dtype=torch.long), 1, sampler=sampler)


def test_the_static_step_reads_weights_an_optimizer_updated_in_place():
    """GRPO samples, steps AdamW (in place: the same addresses), and samples again through the decoder made at the
    first call. What CPU can check: the decoder is kept (not rebuilt) and its step reads the new weights, as the
    eager loop does. No graph is recorded on CPU; that a replayed CUDA graph reads them too is the CUDA test's
    (test_cuda_graph_replays_weights_an_optimizer_updated_in_place)."""
    import model
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    idx = torch.randint(0, 50, (4, 5))
    m.eval()
    before = m.generate(idx, 20, generator=torch.Generator().manual_seed(3), sampler='static')
    first = model._decoders[m]
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    m.train()
    m(idx, idx)[1].backward()
    opt.step()
    m.eval()
    draws = {s: m.generate(idx, 20, generator=torch.Generator().manual_seed(3), sampler=s) for s in ('eager', 'static')}
    assert torch.equal(draws['eager'], draws['static']) and not torch.equal(before, draws['static'])
    assert model._decoders[m] is first  # the same recorded step, not a rebuilt one


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_decode_loops_draw_the_eager_tokens():
    """On a GPU (python -m pytest -k cuda): eager, static, graph and compile draw the same tokens from the same
    generator state, in float32 and under bf16 autocast; a second call of the same shape replays the graph recorded
    by the first; on the last device, as --device=cuda:N does, the loops record there."""
    import model
    dev = torch.device(f'cuda:{torch.cuda.device_count() - 1}')
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=80, n_layer=2, n_head=2, n_embd=64)).to(dev).eval()
    for dtype in (None, torch.bfloat16):
        ctx = torch.autocast('cuda', dtype=dtype) if dtype else torch.autocast('cuda', enabled=False)
        for call in range(2):
            idx = torch.randint(0, 80, (8, 16), device=dev, generator=torch.Generator(dev).manual_seed(call))
            lengths = torch.randint(1, 17, (8,), device=dev, generator=torch.Generator(dev).manual_seed(call))
            outs = {}
            for sampler in ('eager', 'static', 'graph', 'compile', 'auto'):
                with ctx:
                    outs[sampler] = m.generate(idx, 48, temperature=0.8, top_k=10, prompt_lengths=lengths,
                                               generator=torch.Generator(dev).manual_seed(7), sampler=sampler)
            for sampler in ('static', 'graph', 'compile', 'auto'):
                assert torch.equal(outs['eager'], outs[sampler]), (dtype, call, sampler)
        graphs = [d.graph for d in model._decoders[m]['decoders'].values() if d.records]
        assert graphs and all(g is not None for g in graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_graph_replays_weights_an_optimizer_updated_in_place():
    """On a GPU: GRPO's pattern, sample (the graph recorded), step AdamW in place, sample again: the replayed graph
    reads the new weights (the eager loop's tokens), and it is the same graph, not a new recording."""
    import model
    dev = torch.device('cuda')
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).to(dev)
    idx = torch.randint(0, 50, (4, 5), device=dev)
    m.eval()
    before = m.generate(idx, 20, generator=torch.Generator(dev).manual_seed(3), sampler='graph')
    graphs = [d.graph for d in model._decoders[m]['decoders'].values()]
    assert graphs and all(g is not None for g in graphs)
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    m.train()
    m(idx, idx)[1].backward()
    opt.step()
    m.eval()
    draws = {s: m.generate(idx, 20, generator=torch.Generator(dev).manual_seed(3), sampler=s) for s in ('eager', 'graph')}
    assert torch.equal(draws['eager'], draws['graph']) and not torch.equal(before, draws['graph'])
    assert [d.graph for d in model._decoders[m]['decoders'].values()] == graphs


@pytest.mark.parametrize('where', ['buffers', 'prefill'])
def test_a_static_loop_out_of_cuda_memory_falls_back_to_the_eager_tokens(where, monkeypatch):
    """CUDA out-of-memory injected on CPU, where the static loop allocates its buffers or runs its prefill: the call
    warns once, samples the eager tokens from the restored generator, keeps no decoder, and remembers the failure
    (the next call of that shape goes straight to the eager loop, silently)."""
    import warnings
    import model

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
    monkeypatch.setattr(model.StaticDecoder, '__init__' if where == 'buffers' else 'run', out_of_memory)
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (4, 8))
    eager = m.generate(idx, 30, generator=torch.Generator().manual_seed(5), sampler='eager')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        static = m.generate(idx, 30, generator=torch.Generator().manual_seed(5), sampler='static')
        again = m.generate(idx, 30, generator=torch.Generator().manual_seed(5), sampler='static')
    assert torch.equal(eager, static) and torch.equal(eager, again)
    assert len(caught) == 1 and 'out of device memory' in str(caught[0].message)
    assert not model._decoders[m]['decoders'] and len(model._decoders[m]['failed']) == 1


def test_a_model_keeps_a_bounded_number_of_static_decoders():
    """Each setting's decoder holds a whole KV cache: a sweep of temperatures keeps the MAX_DECODERS most recently
    used, and the one used again stays."""
    import model
    m = GPT(GPTConfig(block_size=40, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).eval()
    idx = torch.randint(0, 50, (2, 4))
    temperatures = [0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    for t in temperatures:
        m.generate(idx, 10, temperature=t, sampler='static')
        m.generate(idx, 10, temperature=0.6, sampler='static')  # used again each time: never the oldest
    kept = sorted(key[2] for key in model._decoders[m]['decoders'])
    assert len(kept) == model.MAX_DECODERS and kept == [0.6, 0.9, 1.0, 1.1]


def save(m, path, **kw):
    save_checkpoint(str(path), m, iter_num=3, best_val_loss=1.5, config={'a': 1},
                    tokenization={'method': 'char', 'vocab_size': 50, 'meta_path': None}, **kw)


def test_checkpoint_is_plain_and_round_trips_both_modes(tmp_path):
    idx = torch.randint(0, 50, (2, 10))
    for mode in ('generator', 'reward'):
        m = tiny(mode)
        if mode == 'reward':
            torch.nn.init.normal_(m.reward_head[2].weight)
        save(m, tmp_path / f'{mode}.pt')
        ckpt = torch.load(tmp_path / f'{mode}.pt', weights_only=True)
        assert set(ckpt) >= {'model', 'model_args', 'iter_num', 'best_val_loss', 'config', 'tokenization'}
        assert ckpt['model_args']['mode'] == mode and ckpt['iter_num'] == 3
        m2 = GPT.from_checkpoint(str(tmp_path / f'{mode}.pt'))
        assert m2.config.mode == mode and not m2.training
        assert torch.equal(m(idx)[0], m2(idx)[0])


def test_mode_switch_keeps_trunk_and_fresh_head(tmp_path):
    g = tiny()
    save(g, tmp_path / 'g.pt')
    r = GPT.from_checkpoint(str(tmp_path / 'g.pt'), mode='reward', reward_head_hidden_dim=8)
    for k, v in g.state_dict().items():
        if k.startswith('transformer.'):
            assert torch.equal(v, r.state_dict()[k])
    assert r.reward_head[0].weight.shape == (8, 16)
    assert torch.allclose(r(torch.randint(0, 50, (2, 5)))[0], torch.full((2, 2), 0.5))
    save(r, tmp_path / 'r.pt')
    g2 = GPT.from_checkpoint(str(tmp_path / 'r.pt'), mode='generator')
    idx = torch.randint(0, 50, (2, 10))
    assert torch.equal(g(idx, idx)[0], g2(idx, idx)[0])  # tied head follows the trunk's wte


def test_from_checkpoint_fails_loudly_on_wrong_keys(tmp_path):
    m = tiny()
    save(m, tmp_path / 'g.pt')
    ckpt = load_checkpoint(str(tmp_path / 'g.pt'))
    ckpt['model']['transformer.extra.weight'] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected keys.*extra"):
        GPT.from_checkpoint(ckpt)
    ckpt['model'].pop('transformer.extra.weight')
    ckpt['model'].pop('transformer.h.1.mlp.c_fc.weight')
    with pytest.raises(ValueError, match="missing keys.*c_fc"):
        GPT.from_checkpoint(ckpt)
    with pytest.raises(ValueError, match="does not fit"):
        GPT.from_checkpoint(str(tmp_path / 'g.pt'), n_embd=32)  # shapes differ


def padded_checkpoint(tmp_path, n_tokens=40, with_field=True):
    """A generator of vocab_size 50 whose tokenizer holds 40 ids, every padded row's logit far above the rest (its
    embedding along the final LayerNorm's constant output); written with n_tokens, or as a checkpoint written before
    the field existed, whose tokenization record alone says 40."""
    m = tiny(**({'n_tokens': n_tokens} if with_field else {}))
    with torch.no_grad():
        m.transformer.ln_f.weight.zero_()
        m.transformer.ln_f.bias.fill_(1.0)
        m.transformer.wte.weight[n_tokens:] = 2.0  # logit 32 on each padded id, about 0 on the real ones
    path = str(tmp_path / 'padded.pt')
    save_checkpoint(path, m, tokenization=dict(method='bpe', vocab_size=n_tokens))
    if not with_field:
        ckpt = load_checkpoint(path)
        ckpt['model_args'].pop('n_tokens', None)
        torch.save(ckpt, path)
    return path


@pytest.mark.parametrize('with_field', [True, False])
def test_no_sampler_draws_a_padded_id_and_the_law_is_over_the_tokenizers_ids(tmp_path, with_field):
    """GPT-2 BPE pads 50,257 ids to 50,304: a padded id holds mass a sampler would draw and tiktoken cannot decode.
    With the padded rows' logits far above the rest, the eager and static loops, the ensemble and the per-prefix
    candidates see the tokenizer's 40 ids only, and the law over them sums to 1; a checkpoint written before
    n_tokens existed takes it from its tokenization record."""
    from model import Ensemble, ensemble_checkpoint, evaluate_perplexity
    path = padded_checkpoint(tmp_path, with_field=with_field)
    m = GPT.from_checkpoint(path)
    assert m.config.tokens == 40 and m.config.vocab_size == 50
    idx = torch.zeros(8, 2, dtype=torch.long)
    for sampler in ('eager', 'static'):
        out = m.generate(idx, 12, generator=torch.Generator().manual_seed(0), sampler=sampler)
        assert int(out.max()) < 40, sampler
    pair = GPT.from_checkpoint(ensemble_checkpoint([load_checkpoint(path)] * 2))
    assert isinstance(pair, Ensemble)
    assert int(pair.generate(idx, 12, generator=torch.Generator().manual_seed(0)).max()) < 40
    logits = m(torch.zeros(1, 5, dtype=torch.long), all_logits=True)[0]
    assert logits.shape[-1] == 40
    torch.testing.assert_close(torch.softmax(logits, -1).sum(-1), torch.ones(1, 5))
    assert m.candidate_states(torch.zeros(1, 4, dtype=torch.long), torch.tensor([2])).shape[2] == 40
    tokens = torch.randint(0, 40, (200,)).numpy()
    assert evaluate_perplexity(m, tokens)[1] < 45  # near uniform over the 40 (not e^32: no mass on the padding)


def test_n_tokens_past_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match='n_tokens'):
        GPT(GPTConfig(**TINY, n_tokens=51))
