"""
GPU sampling and training speed, side by side in one run (a ratio, never one absolute time):
  1. GPT.generate at GRPO's shape (default: the GPU config's 32 prompts x 8 completions, 8-token prompts, 248 new
     tokens, a 6 x 384 char model of block 256) with each sampler: 'eager' (one Python step per token, the old path),
     'static' (fixed buffers, no host reads), 'graph' (that step replayed as a CUDA graph) and 'compile'
     (torch.compile of the step, replayed as a CUDA graph). Each is checked to draw the eager path's tokens from the
     same generator state; the time is the median of --repeats runs after one warm-up run.
  2. base training steps (forward, backward, AdamW) with compile=False and compile=True, under the runtime's
     autocast (bf16 on CUDA), median step time after warm-up.

  python benchmarks/bench_decode.py [--device cuda] [--rows 256] [--prompt 8] [--new 248] [--repeats 5]
      [--samplers eager,static,graph,compile] [--train_steps 20] [--model CKPT]

On CPU only 'eager', 'static' and 'compile' (no graph) run; the figures that matter come from a GPU.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from runtime import setup_runtime  # noqa: E402

GPU_CHAR_SHAPE = dict(block_size=256, vocab_size=84, n_layer=6, n_head=6, n_embd=384)  # cycles_shakespeare_char_gpu


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def time_generate(model, prompts, new, sampler, repeats, rt):
    """(median seconds per generate call, the tokens of its first timed call)."""
    times, tokens = [], None
    for r in range(repeats + 1):
        gen = torch.Generator(device=rt.device).manual_seed(1)
        sync(rt.device)
        t0 = time.perf_counter()
        with rt.ctx:
            out = model.generate(prompts, new, 1.0, None, generator=gen, sampler=sampler)
        sync(rt.device)
        if r:  # the first call warms up (and compiles)
            times.append(time.perf_counter() - t0)
            tokens = out if tokens is None else tokens
    return statistics.median(times), tokens


def time_training(model, steps, batch, rt, compiled):
    """Median seconds of one training step (forward, backward, AdamW) on random tokens."""
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.99), rt.device_type)
    fn = torch.compile(model) if compiled else model
    bs, V = model.config.block_size, model.config.vocab_size
    times = []
    for i in range(steps + 3):
        x = torch.randint(0, V, (batch, bs), device=rt.device)
        sync(rt.device)
        t0 = time.perf_counter()
        with rt.ctx:
            _, loss = fn(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(rt.device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='auto')
    p.add_argument('--model', default='', help="a generator checkpoint (default: a fresh 6 x 384 char model)")
    p.add_argument('--rows', type=int, default=256)
    p.add_argument('--prompt', type=int, default=8)
    p.add_argument('--new', type=int, default=248)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--samplers', default='eager,static,graph,compile')
    p.add_argument('--train_steps', type=int, default=20, help="0 skips the training comparison")
    p.add_argument('--train_batch', type=int, default=64)
    a = p.parse_args()
    rt = setup_runtime(a.device, 'auto', 'auto', 1337)
    model = (GPT.from_checkpoint(a.model) if a.model else GPT(GPTConfig(**GPU_CHAR_SHAPE))).to(rt.device).eval()
    print(f"device {rt.device} ({torch.cuda.get_device_name() if rt.device_type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, dtype {rt.ptdtype}; model {model.get_num_params() / 1e6:.2f}M, "
          f"{a.rows} rows x {a.new} new tokens from {a.prompt}-token prompts")
    prompts = torch.randint(0, model.config.vocab_size, (a.rows, a.prompt), device=rt.device)
    samplers = [s for s in a.samplers.split(',') if rt.device_type == 'cuda' or s != 'graph']
    base, reference = None, None
    for s in samplers:
        sec, tokens = time_generate(model, prompts, a.new, s, a.repeats, rt)
        base = base or sec
        reference = tokens if reference is None else reference
        same = bool((tokens == reference).all())
        print(f"  {s:8s} {sec:.4f} s per call, {1e3 * sec / a.new:.3f} ms per decode step, "
              f"{base / sec:.2f}x the {samplers[0]} path; tokens equal to the {samplers[0]} path's: {same}")
    if a.train_steps:
        model.train()
        plain = time_training(model, a.train_steps, a.train_batch, rt, compiled=False)
        fused = time_training(model, a.train_steps, a.train_batch, rt, compiled=True)
        print(f"training step (batch {a.train_batch} x {model.config.block_size}): compile=False {plain * 1e3:.1f} ms, "
              f"compile=True {fused * 1e3:.1f} ms: {plain / fused:.2f}x")


if __name__ == '__main__':
    main()
