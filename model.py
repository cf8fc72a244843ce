"""
One GPT, two modes, in the shape of nanoGPT's model.py.
  generator: next-token logits, lm_head tied to wte.
  reward:    the final hidden state of the last token -> MLP -> softmax over [P(natural), P(synthetic)]; or the mean
             of the states over positions ('mean'); or every position judged on its own ('token': P(this token is
             natural), the sequence's P(natural) being their mean, an estimate of the natural share K/N).
Also here, because every script needs them the same way: the KV-cache sampler (`GPT.generate`), the checkpoint
format (`save_checkpoint`, `load_checkpoint`, `GPT.from_checkpoint`) and held-out perplexity (`evaluate_perplexity`).
"""

import inspect
import math
import os
import warnings
import weakref
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

MODES = ('generator', 'reward')
POOLINGS = ('last', 'mean', 'token')
SAMPLERS = ('auto', 'eager', 'static', 'graph', 'compile')  # GPT.generate's decode loops
HEAD_PREFIX = {'generator': 'lm_head.', 'reward': 'reward_head.'}


def auto_sampler(device):
    """The decode loop sampler='auto' runs: the CUDA graph on a GPU, where benchmarks/bench_decode.py measured it
    drawing the eager loop's tokens 3.8x faster (docs/gpu.md); the eager loop elsewhere (no graphs on CPU)."""
    return 'graph' if torch.device(device).type == 'cuda' else 'eager'


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class KVCache:
    """
    Per-layer key/value buffers, filled in place as generation advances. Each buffer stays contiguous and only as
    long as needed, rounded up to `chunk` positions: a single-token step then reads one dense block (a slice of a
    longer buffer would make PyTorch copy it on every step, and the step is bound by reading the cache).
    """

    def __init__(self, n_layer, max_len, chunk=64):
        self.max_len, self.chunk = max_len, chunk
        self.k = [None] * n_layer
        self.v = [None] * n_layer

    def update(self, layer, k, v, pos):
        """Store k, v (B, H, T, D) at positions pos..pos+T-1; returns the whole buffers (B, H, capacity, D). A tensor
        pos (one element) writes one position in place, with no host read: the buffers must already hold it (a cache
        made with chunk=max_len has its whole length from the prefill on, so its addresses never change)."""
        if torch.is_tensor(pos):
            self.k[layer].index_copy_(2, pos, k)
            self.v[layer].index_copy_(2, pos, v)
            return self.k[layer], self.v[layer]
        end = pos + k.size(2)
        if self.k[layer] is None or self.k[layer].size(2) < end:
            capacity = min(self.max_len, -(-end // self.chunk) * self.chunk)
            for bufs, new in ((self.k, k), (self.v, v)):
                grown = new.new_zeros(new.size(0), new.size(1), capacity, new.size(3))  # zeros: masked, but finite
                if bufs[layer] is not None:
                    grown[:, :, :bufs[layer].size(2)] = bufs[layer]
                bufs[layer] = grown
        self.k[layer][:, :, pos:end] = k
        self.v[layer][:, :, pos:end] = v
        return self.k[layer], self.v[layer]


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.layer_idx = layer_idx
        self.causal = not config.bidirectional

    def heads(self, x):
        """q, k, v of x (B, T, C), each (B, nh, T, hs)."""
        B, T, C = x.size()
        return (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                for z in self.c_attn(x).split(self.n_embd, dim=2))

    def forward(self, x, cache=None, pos=0):
        B, T, C = x.size()
        q, k, v = self.heads(x)
        if cache is not None:
            assert T == 1 or pos == 0, "a multi-token step must be a prefill from position 0"
            keys, values = cache.update(self.layer_idx, k, v, pos)
        if cache is not None and T == 1:
            # one new token attends to every cached position up to its own; the rest of the buffer is padding,
            # masked by an additive row fused into the batched matmul
            BH, cap = B * self.n_head, keys.size(2)
            later = torch.arange(cap, device=x.device) > pos  # pos: an int, or a tensor in a recorded step
            mask = torch.zeros(1, 1, cap, device=x.device, dtype=q.dtype).masked_fill_(later, float('-inf'))
            att = torch.baddbmm(mask, q.reshape(BH, 1, -1), keys.view(BH, cap, -1).transpose(1, 2),
                                alpha=1.0 / math.sqrt(k.size(-1)))
            y = torch.bmm(att.softmax(dim=-1), values.view(BH, cap, -1)).view(B, self.n_head, 1, -1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=T > 1 and self.causal,
                                               dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend_candidates(self, x, cache, positions):
        """Candidate tokens x (B, S·V, C), V a position of each row's `positions` (B, S), each attending to its row's
        true tokens before its position (their keys and values at this layer in `cache`, a KVCache filled by the
        true rows' prefill) and to itself, as if it stood there in place of the true token: GPT.candidate_states."""
        k, v = cache.k[self.layer_idx], cache.v[self.layer_idx]
        (B, _, T, hs), C = k.size(), x.size(2)
        q_c, k_c, v_c = self.heads(x)
        own_position = positions.repeat_interleave(x.size(1) // positions.size(1), dim=1)
        later = torch.arange(T, device=x.device) >= own_position[:, None, :, None]  # (B, 1, S·V, T): no prefix key
        att = (q_c @ k.transpose(-2, -1)).masked_fill_(later, float('-inf'))
        att = torch.cat([att, (q_c * k_c).sum(-1, keepdim=True)], -1).mul_(1.0 / math.sqrt(hs)).softmax(dim=-1)
        y = att[..., :T] @ v + att[..., T:] * v_c
        return self.c_proj(y.transpose(1, 2).reshape(B, -1, C))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, pos=0):
        x = x + self.attn(self.ln_1(x), cache, pos)
        return x + self.mlp(self.ln_2(x))

    def candidates(self, x, cache, positions):
        """This block on candidate tokens standing in for the true ones (GPT.candidate_states)."""
        x = x + self.attn.attend_candidates(self.ln_1(x), cache, positions)
        return x + self.mlp(self.ln_2(x))


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for efficiency
    # the tokenizer's ids, 0..n_tokens-1 (0: all vocab_size): the head's law is over these alone, so a padded id is
    # never sampled nor given mass (its embedding row is there for the matmul's shape only)
    n_tokens: int = 0
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    mode: str = 'generator'  # 'generator' (next-token LM) or 'reward' (natural/synthetic discriminator)
    reward_head_hidden_dim: int = 256
    reward_pooling: str = 'last'  # reward head input: 'last' token's state, the 'mean' over positions, or each 'token'
    gelu_approximate: str = 'none'  # 'tanh' for GPT-2's weights, which were trained with that GELU
    @property
    def tokens(self):
        return self.n_tokens or self.vocab_size

    # a whole-window judge whose positions attend both ways (the energy net of Deng et al. 2020 and Lin et al. 2021):
    # it reads every token from every position, which a causal trunk cannot; never a generator or a per-token judge
    bidirectional: bool = False


class TokenHead(nn.Linear):
    """The generator's head, tied to wte: logits over the tokenizer's n_tokens ids only. The rows past them pad the
    vocabulary to a multiple of 64 (nanoGPT's habit, for the matmul's speed); their logits would hold mass that a
    sampler draws and a tokenizer cannot decode, so they are left out of the law (and of the matmul)."""

    def __init__(self, n_embd, vocab_size, n_tokens):
        super().__init__(n_embd, vocab_size, bias=False)
        self.n_tokens = n_tokens

    def forward(self, x):
        return F.linear(x, self.weight[:self.n_tokens])


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.mode not in MODES:
            raise ValueError(f"GPTConfig.mode must be one of {MODES}, got {config.mode!r}")
        if config.reward_pooling not in POOLINGS:
            raise ValueError(f"GPTConfig.reward_pooling must be one of {POOLINGS}, got {config.reward_pooling!r}")
        if config.bidirectional and (config.mode != 'reward' or config.reward_pooling == 'token'):
            raise ValueError("bidirectional attention is for whole-window judges (mode='reward' with reward_pooling "
                             f"'last' or 'mean'), not mode={config.mode!r} with pooling {config.reward_pooling!r}")
        assert config.vocab_size is not None and config.block_size is not None
        if not 0 <= config.n_tokens <= config.vocab_size:
            raise ValueError(f"GPTConfig.n_tokens must lie in [0, vocab_size {config.vocab_size}], "
                             f"got {config.n_tokens}")
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.mode == 'generator':
            self.lm_head = TokenHead(config.n_embd, config.vocab_size, config.tokens)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        else:
            self.reward_head = nn.Sequential(
                nn.Linear(config.n_embd, config.reward_head_hidden_dim), nn.ReLU(),
                nn.Linear(config.reward_head_hidden_dim, 2), nn.Softmax(dim=-1))
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):  # GPT-2's scaled init of residual projections
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.mode == 'reward':
            self.init_reward_head()

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def init_reward_head(self):
        # He init keeps the ReLU layer's activations at unit scale whatever the hidden size; a zero output
        # layer starts every prediction at [0.5, 0.5], the centre of the label range.
        hidden, out = self.reward_head[0], self.reward_head[2]
        nn.init.kaiming_normal_(hidden.weight, nonlinearity='relu')
        nn.init.zeros_(hidden.bias)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def flops_per_token(self, backward=False):
        """Compute per token: 2 FLOPs per parameter forward, 6 with the backward (the usual 6N estimate, attention
        left out). The cycle's compute matching counts every stage with it, so it is deterministic."""
        return (6 if backward else 2) * self.get_num_params()

    def new_cache(self, max_len):
        """An empty KV cache for max_len positions, which hidden_states fills."""
        return KVCache(self.config.n_layer, max_len)

    def hidden_states(self, idx, cache=None, pos=0):
        """The trunk: (B, T) token ids -> (B, T, n_embd) after the final LayerNorm."""
        T = idx.size(1)
        assert torch.is_tensor(pos) or pos + T <= self.config.block_size, \
            f"Cannot forward sequence of length {pos + T}, block size is only {self.config.block_size}"
        positions = torch.arange(T, dtype=torch.long, device=idx.device) + pos
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x, cache, pos)
        return self.transformer.ln_f(x)

    def candidate_states(self, idx, positions):
        """
        The trunk's final states (B, S, V, n_embd) of each row with its token at position t, for each t of
        `positions` (S,) or of its row's (B, S), set to every token v of the vocabulary in turn: what hidden_states of
        the edited row cut after t ends with. One pass over the true rows up to the last position (a prefill of their
        keys and values), one over the S·V candidates, each attending to its row's true prefix and to itself. Eval
        mode (no dropout).
        """
        B, V, C = idx.size(0), self.config.tokens, self.config.n_embd
        positions = positions.expand(B, -1)
        idx = idx[:, :int(positions.max())]  # the true tokens any candidate attends to
        cache = KVCache(self.config.n_layer, idx.size(1), chunk=max(idx.size(1), 1))
        self.hidden_states(idx, cache)
        wte, wpe = self.transformer.wte, self.transformer.wpe
        c = (wte.weight[:V] + wpe(positions)[..., None, :]).reshape(B, -1, C)
        for block in self.transformer.h:
            c = block.candidates(c, cache, positions)
        return self.transformer.ln_f(c).view(B, positions.size(1), V, C)

    def reward_features(self, idx):
        """The input of the reward head: (B, n_embd) the last token's state, or the mean over positions, which
        sees every token directly instead of through what the causal trunk carried to the end; (B, T, n_embd) every
        position's state for a token judge."""
        x = self.hidden_states(idx)
        pooling = self.config.reward_pooling
        return x[:, -1, :] if pooling == 'last' else x.mean(dim=1) if pooling == 'mean' else x

    def forward(self, idx, targets=None, all_logits=False, per_token=False):
        """Generator: (logits, loss); logits at every position with targets or all_logits, else at the last only.
        Reward: (probs (B, 2), MSE loss against targets if given); a token judge's sequence probs are the mean over
        positions, its per-position probs (B, T, 2) come with per_token=True."""
        if self.config.mode == 'reward':
            probs = self.reward_head(self.reward_features(idx))
            probs = probs if per_token else sequence_probs(probs)
            loss = F.mse_loss(probs, targets) if targets is not None else None
            return probs, loss
        x = self.hidden_states(idx)
        if all_logits:
            return self.lm_head(x), None
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position is needed
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        # matrices and embeddings decay; biases and norm gains do not
        decay_params = [p for p in param_dict.values() if p.dim() >= 2]
        nodecay_params = [p for p in param_dict.values() if p.dim() < 2]
        optim_groups = [{'params': decay_params, 'weight_decay': weight_decay},
                        {'params': nodecay_params, 'weight_decay': 0.0}]
        use_fused = 'fused' in inspect.signature(torch.optim.AdamW).parameters and device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_lengths=None, generator=None,
                 entropy=False, sampler='auto'):
        """
        Continue each row of idx (B, T), any integer dtype, by max_new_tokens sampled tokens, with a KV cache so each
        new token costs one position; returns int64 tokens (B, T + max_new_tokens). prompt_lengths (B,), optional:
        row b's prompt is idx[b, :prompt_lengths[b]] and everything after it is generated, so rows with different
        prompt lengths advance together. Beyond block_size the context is cropped as in nanoGPT, which needs a full
        forward per token. generator: a torch.Generator for reproducible sampling. entropy=True also returns
        (B, total - start) the entropy (nats) of the law each position was drawn from (an evaluation reads the
        sampler's diversity here instead of running the model again over its samples).
        sampler: how the decode steps run, drawing the same tokens from the same generator state:
          'eager'   a growing cache, one Python step per token;
          'static'  fixed-size buffers and a position tensor: a step that allocates nothing new and never reads
                    back to the host, the step 'graph' records (run eagerly here, on any device);
          'graph'   'static' recorded once per shape as a CUDA graph and replayed per token (CUDA only);
          'compile' 'static' through torch.compile (fused kernels), recorded as a CUDA graph on CUDA;
          'auto'    'graph' on CUDA, 'eager' elsewhere (auto_sampler): on an H200 the graph loop drew the eager tokens
                    3.8x faster at GRPO's shape; 'compile' was 5.0x but its bf16 tokens parted from eager's.
        A 'graph' or 'compile' loop that fails to compile or record, or a static loop whose buffers or prefill run out
        of CUDA memory, falls back to 'eager', with one warning; the failure is remembered for that shape and
        settings, whose later calls go straight to 'eager'. Every call
        checks, once after the loop, that the logits were finite and the tokens in the vocabulary.
        """
        assert self.config.mode == 'generator', "generate() needs a generator-mode model"
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"generate() takes integer token ids, got a {idx.dtype} tensor")
        idx = idx.long()
        B, T = idx.shape
        total = T + max_new_tokens
        start = T
        if prompt_lengths is not None:
            prompt_lengths = torch.as_tensor(prompt_lengths, device=idx.device).long().view(B)
            start = int(prompt_lengths.min())
            assert 1 <= start and int(prompt_lengths.max()) <= T, "prompt lengths must lie in [1, T]"
        args = (idx, total, start, prompt_lengths, temperature, top_k, generator, entropy)
        sampler = auto_sampler(idx.device) if sampler == 'auto' else sampler
        result = decoder = None
        if sampler != 'eager' and total <= self.config.block_size and start < total:
            rng = rng_snapshot(generator, idx.device)
            try:
                with torch.cuda.device(idx.device) if idx.device.type == 'cuda' else nullcontext():
                    decoder = static_decoder(self, B, total, temperature, top_k, entropy, sampler)
                    if decoder is not None:  # None: this shape failed before, so the eager loop, silently
                        result = decoder.run(idx, start, prompt_lengths, generator)
            except (RecordingFailed, torch.cuda.OutOfMemoryError) as e:
                if decoder is not None:
                    decoder.evict()  # its buffers are freed with the last reference
                    decoder = None
                reason = (f"failed to compile or record its decode step ({e})" if isinstance(e, RecordingFailed)
                          else f"ran out of device memory for its buffers ({str(e).splitlines()[0][:120]})")
                warnings.warn(f"sampler {sampler!r} {reason}; this call samples with the eager loop instead",
                              RuntimeWarning, stacklevel=2)
                rng.restore()
        out, ent, finite = result or self._generate_eager(*args)
        check_sampled(out, start, finite, self.config.tokens)
        return (out, ent) if entropy else out

    def _generate_eager(self, idx, total, start, prompt_lengths, temperature, top_k, generator, entropy):
        """The growing-cache loop, one Python step per token: (out (B, total), entropies (B, total - start) or None,
        finite=True: each step's sampler checks its logits itself)."""
        B, T = idx.shape
        bs = self.config.block_size
        out = idx.new_full((B, total), -1)
        out[:, :T] = idx
        cache = self.new_cache(min(total, bs))
        entropies = []
        for t in range(start, total):
            if t == start and t <= bs:
                logits = self.lm_head(self.hidden_states(out[:, :t], cache, 0)[:, -1])  # prefill
            elif t <= bs:
                logits = self.lm_head(self.hidden_states(out[:, t - 1:t], cache, t - 1)[:, -1])
            else:
                logits = self.lm_head(self.hidden_states(out[:, t - bs:t])[:, -1])
            if entropy:
                entropies.append(sampling_entropy(logits, temperature, top_k))
            next_tok = sample_next_token(logits, temperature, top_k, generator)
            if prompt_lengths is not None:
                next_tok = torch.where(t < prompt_lengths, out[:, t], next_tok)
            out[:, t] = next_tok
        return out, (torch.stack(entropies, dim=1) if entropy else None), True

    def _decode_step(self, out, pos, u, plen, cache, temperature, top_k, ent, finite):
        """One token for every row: reads out[:, pos], writes out[:, pos + 1] (a row still inside its prompt keeps
        its prompt token), then advances pos. Fixed shapes, no host reads: the unit a CUDA graph records."""
        logits = self.lm_head(self.hidden_states(out.index_select(1, pos), cache, pos)[:, -1])
        finite.logical_and_(torch.isfinite(logits).all())
        nxt = pos + 1
        if ent is not None:
            ent.index_copy_(1, nxt, sampling_entropy(logits, temperature, top_k)[:, None])
        tok = sample_next_token(logits, temperature, top_k, u=u)
        tok = torch.where(nxt < plen, out.index_select(1, nxt).view(-1), tok)
        out.index_copy_(1, nxt, tok[:, None])
        pos.add_(1)

    @classmethod
    def from_pretrained(cls, name_or_dir, dropout=0.0):
        """A generator with GPT-2's weights (see load_gpt2_state), in eval mode."""
        config, state = load_gpt2_state(name_or_dir, dropout)
        model = cls(config)
        model.load_state_dict(state, strict=True)
        return model.eval()

    def crop_block_size(self, block_size):
        """Shorten the context (nanoGPT's model surgery), e.g. GPT-2's 1024 to a smaller block for a cheap run."""
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    @classmethod
    def from_checkpoint(cls, path, mode=None, device='cpu', **overrides):
        """
        Build a model from a checkpoint (a path, or a dict already loaded with load_checkpoint) of either mode.
        mode='reward' on a generator checkpoint keeps the trunk and starts a fresh reward head, and the reverse;
        any other missing or unexpected key, or a shape that does not fit, is an error. Returns it in eval mode.
        """
        ckpt = load_checkpoint(path) if isinstance(path, (str, os.PathLike)) else path
        if 'ensemble_args' in ckpt:
            if mode not in (None, 'generator') or overrides:
                raise ValueError("an ensemble checkpoint is read and sampled as it is, never trained or turned into a "
                                 "judge: train or start from one of its members instead")
            ensemble = Ensemble([cls(GPTConfig(**with_token_count(a, ckpt))) for a in ckpt['ensemble_args']])
            ensemble.load_state_dict(ckpt['model'], strict=True)
            return ensemble.to(device).eval()
        args = with_token_count(ckpt['model_args'], ckpt)
        saved_mode = args.get('mode', 'generator')
        args['mode'] = mode or saved_mode
        unknown = set(overrides) - {f.name for f in fields(GPTConfig)}
        if unknown:
            raise ValueError(f"unknown GPTConfig overrides: {sorted(unknown)}")
        args.update(overrides)
        model = cls(GPTConfig(**args))
        state = {k.removeprefix('_orig_mod.'): v for k, v in ckpt['model'].items()}
        expected = model.state_dict()
        if args['mode'] != saved_mode:  # the source's head goes, the target's head stays freshly initialised
            state = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIX[saved_mode])}
            state.update({k: v for k, v in expected.items() if k.startswith(HEAD_PREFIX[args['mode']])})
        if args['mode'] == 'generator' and 'transformer.wte.weight' in state:
            state['lm_head.weight'] = state['transformer.wte.weight']  # tied: both names, one tensor
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit a {args['mode']} GPT: missing keys {missing}, "
                             f"unexpected keys {unexpected}")
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"checkpoint does not fit a {args['mode']} GPT: {e}") from None
        return model.to(device).eval()


def with_token_count(model_args, ckpt):
    """A checkpoint's model args with n_tokens set: a checkpoint written before the field existed takes its
    tokenizer's vocabulary size where that is below the model's (GPT-2 BPE padded to 50,304), so its sampler too
    never draws a padded id."""
    args = dict(model_args)
    known = ckpt.get('tokenization', {}).get('vocab_size')
    if 'n_tokens' not in args and known and int(known) < args['vocab_size']:
        args['n_tokens'] = int(known)
    return args


class Ensemble(nn.Module):
    """
    Generators averaged token by token, read and sampled as one generator: each next token's probability the mean
    of the members', p(x_t | x_<t) = (1/M) sum_m p_m(x_t | x_<t), so its perplexity is exact and sampling it draws
    each token from that law. What a user with spare compute buys instead of a judge (Kim et al. 2026): an ensemble
    of bases, each at its own tail-calibrated temperature (benchmarks/calibrate_base.py folds them in and writes one).
    It stands where a generator is read or sampled: its logits are log p (a temperature and a softmax act on them as
    on a GPT's), its hidden state the members' side by side, which its lm_head turns into those logits, and its KV
    cache one a member. Sampled by the eager loop only (the static and graph loops record one model's step); never
    trained (train.py, GRPO and SPIN refuse its checkpoint: start_problem).
    """

    def __init__(self, members):
        super().__init__()
        first = members[0].config
        if any(m.config.mode != 'generator' or (m.config.vocab_size, m.config.tokens, m.config.block_size)
               != (first.vocab_size, first.tokens, first.block_size) for m in members):
            raise ValueError("an ensemble takes generators of one vocabulary and block size")
        self.members = nn.ModuleList(members)
        self.widths = [m.config.n_embd for m in members]
        self.config = GPTConfig(**{**asdict(first), 'n_embd': sum(self.widths)})  # the side-by-side state's width

    forward = GPT.forward
    _generate_eager = GPT._generate_eager

    def get_num_params(self, non_embedding=True):
        return sum(m.get_num_params(non_embedding) for m in self.members)

    def flops_per_token(self, backward=False):
        """Every member's pass: an ensemble of M costs M forward passes a token."""
        return sum(m.flops_per_token(backward) for m in self.members)

    def new_cache(self, max_len):
        return [m.new_cache(max_len) for m in self.members]

    def hidden_states(self, idx, cache=None, pos=0):
        """(B, T) token ids -> (B, T, sum of the members' n_embd): their final states side by side."""
        caches = cache or [None] * len(self.members)
        return torch.cat([m.hidden_states(idx, c, pos) for m, c in zip(self.members, caches)], dim=-1)

    def lm_head(self, states):
        """The members' side-by-side states -> the ensemble's logits, log of the mean of their next-token laws
        (float32)."""
        log_probs = [F.log_softmax(m.lm_head(s).float(), dim=-1)
                     for m, s in zip(self.members, states.split(self.widths, dim=-1))]
        return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(self.members))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_lengths=None, generator=None,
                 entropy=False, sampler='auto'):
        """GPT.generate with the eager loop, whatever the sampler asked."""
        return GPT.generate(self, idx, max_new_tokens, temperature, top_k, prompt_lengths, generator, entropy, 'eager')


def ensemble_checkpoint(ckpts):
    """One checkpoint of generator checkpoints, read as their Ensemble by GPT.from_checkpoint: the first one's fields
    (its tokenization and run config), the members' weights and shapes, and the held-out tail that none of them
    trained on (the smallest of theirs)."""
    members = [GPT.from_checkpoint(c) for c in ckpts]
    first = {k: v for k, v in ckpts[0].items()
             if k not in ('model', 'model_args', 'optimizer', 'held_out', 'calibrated')}
    held = [c.get('held_out') for c in ckpts]
    if all(held):
        first['held_out'] = dict(tokens=min(h['tokens'] for h in held), of=held[0]['of'])
    return dict(first, model=Ensemble(members).state_dict(), model_args=asdict(members[0].config),
                ensemble_args=[asdict(m.config) for m in members])


def ensemble_members(ckpt):
    """The member checkpoints of an ensemble checkpoint (ensemble_checkpoint's inverse): each the ensemble's fields
    (the first member's and the held-out tail none trained on), its own shape and weights."""
    shared_fields = {k: v for k, v in ckpt.items() if k not in ('model', 'model_args', 'ensemble_args')}
    return [dict(shared_fields, model_args=args, model={k.split('.', 2)[2]: v for k, v in ckpt['model'].items()
                                                  if k.startswith(f'members.{i}.')})
            for i, args in enumerate(ckpt['ensemble_args'])]


def start_problem(ckpt, path):
    """Why the checkpoint at path cannot start a generator's training (train.py, GRPO, SPIN), or '': a judge is no
    generator, and an ensemble is read and sampled, never trained."""
    if ckpt['model_args'].get('mode', 'generator') != 'generator':
        return f"{path} is a {ckpt['model_args']['mode']} checkpoint: start from a generator checkpoint"
    if 'ensemble_args' in ckpt:
        return (f"{path} is an ensemble of {len(ckpt['ensemble_args'])} generators, read and sampled, never trained: "
                f"start from one of its members")
    return ''


GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


class PretrainedUnavailable(Exception):
    """GPT-2 weights that cannot be had here: transformers missing, or no cached copy and no network."""


def load_gpt2_state(name_or_dir, dropout=0.0):
    """
    GPT-2 weights through Hugging Face transformers (imported here, on use): a hub name from GPT2_NAMES or a local
    directory written by save_pretrained. Returns (GPTConfig, state dict in this model's names). Offline, a hub name
    resolves only from the local cache (HF_HUB_OFFLINE=1 is honoured by transformers itself).
    """
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        raise PretrainedUnavailable("GPT-2 weights need the transformers package: pip install transformers") from None
    try:
        hf = GPT2LMHeadModel.from_pretrained(name_or_dir)
    except (OSError, ValueError) as e:
        raise PretrainedUnavailable(
            f"cannot load GPT-2 weights {name_or_dir!r} ({str(e).splitlines()[0][:120]}): run "
            f"`python -c \"from transformers import GPT2LMHeadModel as M; M.from_pretrained('{name_or_dir}')\"` "
            f"once online to cache them, or pass a local directory saved with save_pretrained") from None
    c = hf.config
    gelu = {'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh', 'gelu': 'none'}.get(c.activation_function)
    if gelu is None or c.n_inner not in (None, 4 * c.n_embd) or c.scale_attn_by_inverse_layer_idx \
            or not c.scale_attn_weights:
        raise ValueError(f"{name_or_dir}: a GPT-2 variant this model does not implement (activation "
                         f"{c.activation_function}, n_inner {c.n_inner}, attention scaling options)")
    config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                       n_embd=c.n_embd, dropout=dropout, bias=True, gelu_approximate=gelu)
    state = {}
    for k, v in hf.state_dict().items():
        if k.endswith('.attn.bias') or k.endswith('.attn.masked_bias'):
            continue  # causal-mask buffers of older transformers versions
        # HF's Conv1D stores (in, out); nn.Linear wants (out, in), as nanoGPT's from_pretrained transposes
        conv1d = k.endswith(('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight'))
        state[k] = v.t().contiguous() if conv1d else v
    state['lm_head.weight'] = state['transformer.wte.weight']
    return config, state


def sequence_probs(probs):
    """A reward head's output as a sequence's (B, 2): a token judge's per-position (B, T, 2) averaged over
    positions (its estimate of the natural share K/N); pooled outputs as they are."""
    return probs.mean(dim=1) if probs.dim() == 3 else probs


def softmax_entropy(logits):
    """Entropy (nats) of softmax(logits) over the last dim; a -inf logit (a masked token) has probability 0."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp.nan_to_num(0.0)).sum(-1)


def sampling_entropy(logits, temperature=1.0, top_k=None):
    """(B, V) logits -> (B,) entropy (nats) of the law sample_next_token draws from at this temperature and top_k."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        logits = torch.topk(logits, top_k).values  # the other tokens have probability 0
    return softmax_entropy(logits)


def sample_next_token(logits, temperature=1.0, top_k=None, generator=None, u=None):
    """
    (B, V) logits -> (B,) token ids, with nanoGPT's temperature and top-k. Draws by inverse CDF: one uniform per
    row against the running sum of the probabilities. Same law as torch.multinomial, which on a 50k-token vocabulary
    costs several times the lm_head matmul; reproducible from `generator`. Every pass after the softmax works in
    place: at this size allocating a fresh (B, V) tensor costs as much as computing it. u (B, 1): the uniforms,
    already drawn (a recorded step draws nothing and checks nothing on the host; its caller checks the logits).
    """
    logits = logits.float()
    candidates = None
    if top_k is not None and top_k < logits.size(-1):
        logits, candidates = torch.topk(logits, top_k)  # sample among the k best only
    cdf = torch.softmax(logits, dim=-1)
    if temperature != 1.0:
        # softmax(l / T) is proportional to softmax(l) ** (1 / T); scaling by the row max first keeps it from
        # underflowing at low T (the running sum is normalised by its total below)
        cdf.div_(cdf.max(dim=-1, keepdim=True).values).pow_(1.0 / temperature)
    cdf.cumsum_(dim=-1)
    total = cdf[:, -1:]
    if u is None:
        if not torch.isfinite(total).all():
            raise ValueError("non-finite logits: the model produced NaN or inf, nothing to sample from")
        u = torch.rand(total.shape, generator=generator, device=cdf.device)
    # the first index whose running sum exceeds u: a zero-probability token never is one
    idx = torch.searchsorted(cdf, u * total, right=True).clamp_(max=cdf.size(-1) - 1).view(-1)
    return idx if candidates is None else candidates.gather(1, idx.view(-1, 1)).view(-1)


# -----------------------------------------------------------------------------
# the static decode loop (GPT.generate's 'static', 'graph' and 'compile'): fixed buffers, recorded once per shape

class RecordingFailed(Exception):
    """torch.compile or CUDA-graph recording of the decode step failed: generate falls back to the eager loop."""


def can_record(device):
    """Whether a 'graph' or 'compile' loop records its step as a CUDA graph on this device (tests force it on CPU)."""
    return device.type == 'cuda'


class StaticDecoder:
    """
    The static loop for one (batch, length, settings): output, KV cache, position, uniforms and checks in buffers
    that never move, and the step over them. 'graph' and 'compile' on CUDA record the step as a CUDA graph after
    two warm-up steps and replay it for every later token, of this call and of every later call of the same shape:
    a GRPO run records once, not once per step (a capture synchronises the device and empties the allocator's
    cache). The warm-up and the recording run under the same autocast settings, with the weight-cast cache off
    (casts cached inside a capture would be freed under the graph), so torch.compile sees one setting.
    """

    def __init__(self, model, B, total, temperature, top_k, entropy, sampler, device):
        self.model, self.temperature, self.top_k = weakref.ref(model), temperature, top_k
        self.out = torch.full((B, total), -1, dtype=torch.long, device=device)
        self.plen = torch.zeros(B, dtype=torch.long, device=device)
        self.cache = KVCache(model.config.n_layer, total, chunk=total)  # whole length at once: fixed addresses
        self.ent = torch.zeros(B, total, device=device) if entropy else None
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.u = torch.empty(B, 1, device=device)
        self.finite = torch.ones((), dtype=torch.bool, device=device)
        self.step = GPT._decode_step
        if sampler == 'compile':  # compiles on its first call; a Python torch.compile rejects fails here
            self.step = self.guarded(lambda: torch.compile(GPT._decode_step, fullgraph=True, dynamic=False))
        self.records = sampler in ('graph', 'compile') and can_record(device)
        self.checked = sampler != 'compile'  # a compiled step proves itself on its first call
        self.graph, self.warm_steps = None, 0

    def run(self, idx, start, prompt_lengths, generator):
        """Fill out[:, start:] (see GPT.generate) with the length, temperature, top-k and entropy this decoder was
        made for: the prefill and the first token eagerly, every later token by the fixed step. The uniforms are drawn
        outside the step, one (B, 1) draw per token as the eager loop draws them. Returns fresh tensors (out,
        entropies or None, finite), the buffers staying with the decoder."""
        model, T, total = self.model(), idx.size(1), self.out.size(1)
        temperature, top_k, entropy = self.temperature, self.top_k, self.ent is not None
        self.out[:, :T] = idx
        self.out[:, T:] = -1  # a position no step wrote stays out of the vocabulary: check_sampled catches it
        self.plen.copy_(prompt_lengths if prompt_lengths is not None else torch.zeros_like(self.plen))
        self.finite.fill_(True)
        logits = model.lm_head(model.hidden_states(self.out[:, :start], self.cache, 0)[:, -1])
        if entropy:
            self.ent.zero_()
            self.ent[:, start] = sampling_entropy(logits, temperature, top_k)
        next_tok = sample_next_token(logits, temperature, top_k, generator)
        self.out[:, start] = torch.where(start < self.plen, self.out[:, start], next_tok)
        self.pos.fill_(start)  # the input position of the next step; the step advances it
        for _ in range(total - start - 1):
            torch.rand(self.u.shape, generator=generator, device=self.u.device, out=self.u)
            self.next_token(model)
        ent = self.ent[:, start:].clone() if entropy else None
        return self.out.clone(), ent, self.finite.clone()

    def next_token(self, model):
        args = (model, self.out, self.pos, self.u, self.plen, self.cache, self.temperature, self.top_k, self.ent,
                self.finite)
        if self.graph is not None:
            self.graph.replay()
        elif self.records:
            with torch.autocast('cuda', dtype=torch.get_autocast_dtype('cuda'),
                                enabled=torch.is_autocast_enabled('cuda'), cache_enabled=False):
                self.warm_up(args) if self.warm_steps < 2 else self.record(args)
            if self.graph is not None:
                self.graph.replay()  # recording runs nothing: the replay is this token's step
        elif self.checked:
            self.step(*args)
        else:
            self.guarded(self.step, *args)
            self.checked = True

    def warm_up(self, args):
        """A real step on a side stream (allocator and kernel warm-up, torch.compile's compilation)."""
        side = torch.cuda.Stream() if self.u.is_cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else nullcontext():
            self.guarded(self.step, *args)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        self.warm_steps += 1

    def record(self, args):
        """Record the step once; an empty graph (captured on another device or stream: every replay would do
        nothing) is a failure, never a silent no-op."""
        def capture():
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                with torch.cuda.graph(graph):
                    self.step(*args)
            if any('empty' in str(w.message).lower() for w in caught):
                raise RuntimeError("the recorded CUDA graph is empty")
            return graph
        self.graph = self.guarded(capture)

    @staticmethod
    def guarded(fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            raise RecordingFailed(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e) else ''}") \
                from e


_decoders = weakref.WeakKeyDictionary()  # model -> {settings: StaticDecoder}; freed with the model
# the static decoders a model keeps, each with its buffers (output, KV cache) and graph: the least recently used is
# freed beyond this (GRPO samples one shape, an evaluation a few more; a sweep of temperatures would otherwise keep a
# whole KV cache for every one of them)
MAX_DECODERS = 4


def static_decoder(model, B, total, temperature, top_k, entropy, sampler):
    """The model's StaticDecoder for this shape and these settings, made on first use; None where one failed before
    (its failure is remembered, so it is not compiled or recorded again at every call). The cache and the failures
    are dropped when a parameter moved or changed shape (model.to, crop_block_size, a new tensor): a graph reads
    fixed addresses. At most MAX_DECODERS are kept, the least recently used freed first. A decoder whose buffers
    do not fit in CUDA memory is a failure too (torch.cuda.OutOfMemoryError, raised to generate)."""
    device = model.transformer.wte.weight.device
    weights = tuple((p.data_ptr(), tuple(p.shape)) for p in model.parameters())
    autocast = (torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda')) if device.type == 'cuda' else ()
    key = (B, total, float(temperature), top_k, bool(entropy), sampler, str(device), model.training, autocast)
    entry = _decoders.get(model)
    if entry is None or entry['weights'] != weights:
        entry = _decoders[model] = {'weights': weights, 'decoders': {}, 'failed': set()}
    if key in entry['failed']:
        return None
    decoders = entry['decoders']
    if key not in decoders:
        while len(decoders) >= MAX_DECODERS:
            decoders.pop(next(iter(decoders)))
        try:
            decoders[key] = StaticDecoder(model, B, total, temperature, top_k, entropy, sampler, device)
        except torch.cuda.OutOfMemoryError:
            entry['failed'].add(key)
            raise
    decoder = decoders[key] = decoders.pop(key)  # the most recently used last
    def evict():  # after a failure: a failed recording is never replayed, nor tried again for this shape
        decoders.pop(key, None)
        entry['failed'].add(key)
    decoder.evict = evict
    return decoder


class rng_snapshot:
    """The state of the generator a sampling call draws from (the device's default one when None), to restore
    before a fallback samples again from the start."""

    def __init__(self, generator, device):
        self.generator, self.device = generator, device
        if generator is not None:
            self.state = generator.get_state()
        elif device.type == 'cuda':
            self.state = torch.cuda.get_rng_state(device)
        else:
            self.state = torch.get_rng_state()

    def restore(self):
        if self.generator is not None:
            self.generator.set_state(self.state)
        elif self.device.type == 'cuda':
            torch.cuda.set_rng_state(self.state, self.device)
        else:
            torch.set_rng_state(self.state)


def check_sampled(out, start, finite, vocab_size):
    """After the decode loop, once: the logits were finite and every generated token is a token of the vocabulary
    (a step that never ran leaves -1 behind)."""
    if not bool(finite):
        raise ValueError("non-finite logits: the model produced NaN or inf, nothing to sample from")
    generated = out[:, start:]
    if generated.numel() == 0:
        return
    lo, hi = int(generated.min()), int(generated.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"generate produced token id {lo if lo < 0 else hi}, outside the vocabulary [0, {vocab_size}):"
                         f" the decode loop or the model's output width is broken")


# -----------------------------------------------------------------------------
# checkpoints: plain dicts, loadable with torch.load(weights_only=True)

def save_checkpoint(path, model, *, iter_num=0, best_val_loss=None, config=None, tokenization=None,
                    optimizer=None, **extra):
    """Write a checkpoint atomically (temp name, then rename), so a crash never leaves a half-written file."""
    raw = getattr(model, 'module', model)  # unwrap DDP
    raw = getattr(raw, '_orig_mod', raw)  # unwrap torch.compile
    ckpt = dict(model=raw.state_dict(), model_args=asdict(raw.config), iter_num=int(iter_num),
                best_val_loss=None if best_val_loss is None else float(best_val_loss),
                config=dict(config or {}), tokenization=dict(tokenization or {}), **extra)
    if optimizer is not None:
        ckpt['optimizer'] = optimizer.state_dict()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_atomic(ckpt, path)


def update_checkpoint(path, **fields):
    """Set top-level fields of a saved checkpoint, rewriting it atomically."""
    ckpt = load_checkpoint(path)
    ckpt.update(fields)
    save_atomic(ckpt, path)


def save_atomic(ckpt, path):
    """torch.save under a temp name, then a rename: a kill mid-write leaves the previous file whole."""
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def fold_temperature(ckpt, temperature):
    """A copy of a generator checkpoint whose logits are ckpt's divided by temperature, so it samples and scores as
    ckpt at that temperature: the head is tied to the embedding and has no bias, so the final LayerNorm's gain and bias
    times 1 / T scale every logit alike. The same family at zero FLOPs; the optimizer's state (of the old weights) is
    left out."""
    if ckpt['model_args'].get('mode', 'generator') != 'generator':
        raise ValueError("only a generator's logits have a temperature to fold")
    model = {k: (v / temperature if k.endswith(('ln_f.weight', 'ln_f.bias')) else v) for k, v in ckpt['model'].items()}
    kept = {k: v for k, v in ckpt.items() if k not in ('optimizer', 'calibrated')}  # the record was of other weights
    return {**kept, 'model': model, 'folded_temperature': temperature}


def load_checkpoint(path, map_location='cpu'):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path} (train one with train.py, or fix the path)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is not a readable checkpoint of this project ({type(e).__name__}: "
                         f"{str(e).splitlines()[0]})") from None


# -----------------------------------------------------------------------------
# held-out perplexity: the one place it is computed

LOGITS_BYTES = 256 * 2 ** 20  # a scoring batch's logits at the most: a BPE evaluation stays within a laptop's memory


def perplexity_windows(tokens, block_size, batch_size=32, device='cpu'):
    """The windows held-out perplexity reads a token array in: contiguous and non-overlapping, of block_size tokens
    (the last one may be shorter), so that every token but the first is predicted once. Yields (inputs, targets),
    (B, length) int64 tensors on device, batch_size full windows a batch."""
    n_pred = len(tokens) - 1
    assert n_pred >= 1, "need at least two tokens"
    starts = list(range(0, n_pred, block_size))
    full = [s for s in starts if s + block_size <= n_pred]
    groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)] + [[s] for s in starts[len(full):]]
    for group in groups:
        length = min(block_size, n_pred - group[0])
        yield tuple(torch.from_numpy(np.stack([tokens[s + o:s + o + length] for s in group]).astype(np.int64))
                    .to(device) for o in (0, 1))


@torch.no_grad()
def evaluate_perplexity(model, tokens, block_size=None, batch_size=32, device=None, ctx=None, temperature=1.0,
                        per_window=False, max_tokens=0):
    """
    Mean next-token cross-entropy and perplexity of a generator over a whole token array, in contiguous
    non-overlapping windows of block_size (the last one may be shorter): every token but the first is predicted
    once. temperature scales the logits (the model as sampled at that temperature). Returns (mean_cross_entropy,
    perplexity), and with per_window=True also each window's mean cross-entropy (for paired comparisons).
    max_tokens > 0: only the first max_tokens tokens (a cheaper estimate during training).
    """
    block_size = block_size or model.config.block_size
    device = device or next(model.parameters()).device
    tokens = np.asarray(tokens[:max_tokens] if max_tokens > 0 else tokens)
    n_pred = len(tokens) - 1
    was_training = model.training
    model.eval()
    window_sums, window_lengths = [], []
    for x, y in perplexity_windows(tokens, block_size, batch_size, device):
        with ctx or nullcontext():
            logits = model.lm_head(model.hidden_states(x))
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)) / temperature, y.view(-1), reduction='none')
        window_sums += ce.view(y.shape).sum(-1).tolist()
        window_lengths += [y.size(1)] * len(y)
    model.train(was_training)
    mean_ce = sum(window_sums) / n_pred
    if per_window:
        return mean_ce, math.exp(mean_ce), [s / n for s, n in zip(window_sums, window_lengths)]
    return mean_ce, math.exp(mean_ce)
