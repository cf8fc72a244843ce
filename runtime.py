"""
Device, precision and DDP set-up shared by the training and generation scripts, nanoGPT style: under torchrun
(RANK set) each process joins the group; CUDA gets autocast, the CPU plain float32.
"""

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from configurator import UserError, end_process, launched_by_torchrun
from data_loader import file_sha256
from model import save_atomic
from tracking import TRACKING_DEFAULTS


def resolve_device(device):
    """'auto' -> 'cuda' when available, else 'cpu'; a CUDA request on a machine without CUDA is a user error. A CUDA
    device becomes the current one, so the streams and graphs a script makes live where its tensors do (without it,
    --device=cuda:1 would record CUDA graphs on cuda:0)."""
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available: use --device=cpu or --device=auto")
    if device != 'cpu' and not device.startswith(('cuda', 'mps')):
        raise UserError(f"unknown device {device!r}: use auto, cpu or cuda")
    if device.startswith('cuda'):
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise UserError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} GPU(s): "
                            f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        if index is not None:
            torch.cuda.set_device(index)
    return device


@dataclass
class Runtime:
    device: str
    device_type: str
    ctx: object  # autocast context for forward passes
    ptdtype: torch.dtype
    ddp: bool = False
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def master(self):
        return self.rank == 0

    def close(self):
        """Every rank calls this at the same point, the end of its script. The barrier keeps a rank that finished first
        from tearing down its gloo connections while rank 0 still writes its outputs. Without it that rank aborted
        now and then ('terminate called without an active exception'): 13 of 122 runs of a two-rank script on 2 CPU
        cores, 0 of 70 with it. A rank torchrun started then ends here (exit code 0, its output flushed, as run_cli
        ends it): freeing the script's DDP model on return joins gloo's worker threads with the GIL held, while a
        worker may still need the GIL to free the last collective's tensors, and that rank then hung for good (once
        in a test suite's torchrun of train.py)."""
        if self.ddp and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        if launched_by_torchrun():
            end_process(0)


def setup_runtime(device='auto', backend='auto', dtype='auto', seed=1337):
    device = resolve_device(device)
    ddp = launched_by_torchrun()
    rank = local_rank = 0
    world_size = 1
    if ddp:
        if backend == 'auto':
            backend = 'nccl' if device.startswith('cuda') else 'gloo'
        dist.init_process_group(backend=backend)
        rank, local_rank, world_size = dist.get_rank(), int(os.environ['LOCAL_RANK']), dist.get_world_size()
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    if dtype == 'auto':
        dtype = ('bfloat16' if torch.cuda.is_bf16_supported() else 'float16') if device_type == 'cuda' else 'float32'
    if dtype not in ('float32', 'bfloat16', 'float16'):
        raise UserError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    if device_type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ctx = nullcontext() if device_type == 'cpu' or ptdtype == torch.float32 else \
        torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    torch.manual_seed(seed + rank)
    return Runtime(device, device_type, ctx, ptdtype, ddp, rank, local_rank, world_size)


def all_reduce_mean(value, rt):
    """Average a float across DDP ranks (identity without DDP)."""
    if not rt.ddp:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return t.item() / rt.world_size


def global_sum(value, rt):
    """A tensor's sum over every rank's copy (float64; the value itself without DDP)."""
    total = value.detach().double().clone()
    if rt.ddp:
        dist.all_reduce(total)
    return total


def global_std(values, rt):
    """The unbiased std of a 1-D tensor pooled over every rank's values, as one process holding them all would
    compute it (TRL gathers before its 'batch' std); values.std() without DDP."""
    if not rt.ddp:
        return values.std()
    v = values.detach().double()
    n, s, ss = global_sum(torch.stack([torch.tensor(float(v.numel()), dtype=torch.float64, device=v.device), v.sum(),
                                       (v * v).sum()]), rt)
    return torch.sqrt(((ss - s * s / n) / (n - 1)).clamp_min(0)).to(values.dtype)


def gather_lists(items, rt):
    """Every rank's list, joined in rank order (a copy of the list itself without DDP)."""
    if not rt.ddp:
        return list(items)
    parts = [None] * rt.world_size
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def broadcast_stop(stop, rt):
    """Rank 0 decides whether to stop; every rank follows (identity without DDP)."""
    if not rt.ddp:
        return stop
    flag = torch.tensor([int(stop)], device=rt.device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


# -----------------------------------------------------------------------------
# resume state: what a trainer needs to continue an interrupted run exactly (GRPO and SPIN)

def resume_file(out_path, rank=0):
    """Where an interrupted run keeps its state: beside its output, one file per DDP rank."""
    stem = os.path.splitext(out_path)[0]
    return f"{stem}_resume.pt" if rank == 0 else f"{stem}_resume.rank{rank}.pt"


def run_signature(config, input_paths, data_paths=()):
    """What a resume state must match: the run's settings (all but resume itself, max_steps, which a resumed run
    may extend, and the tracking settings, which change where it reports, not what it computes), the sha256 of
    each of its input files, and each data file's size and modification time (a train.bin may be gigabytes: hashed
    at every start it would cost more than it guards; a file written again is then never resumed over)."""
    settings = {k: v for k, v in sorted(config.items()) if k not in ('resume', 'max_steps', *TRACKING_DEFAULTS)}
    signature = {'settings': settings, 'inputs': [file_sha256(p) for p in input_paths]}
    if data_paths:
        signature['data'] = [[os.path.abspath(p), (st := os.stat(p)).st_size, st.st_mtime_ns] for p in data_paths]
    return signature


def save_resume_state(path, state):
    """Write the state atomically (model.save_atomic): a kill mid-write leaves the previous state."""
    save_atomic(state, path)


def load_resume_state(path, signature):
    """The saved state of an interrupted run, or None when there is none. One written with other settings or inputs
    is never continued (that would mix two runs): the run starts afresh, says so, and replaces it at its next save."""
    if not os.path.isfile(path):
        return None
    state = torch.load(path, map_location='cpu', weights_only=True)
    if state.get('signature') != signature:
        print(f"not resuming: {path} was written by a run with other settings or inputs; starting afresh")
        return None
    return state


def rng_states(np_rng, *generators):
    """The states of a numpy Generator and torch Generators (None entries skipped), to store in a resume state."""
    return {'numpy': np_rng.bit_generator.state, 'torch': [g.get_state() if g is not None else None for g in generators]}


def set_rng_states(states, np_rng, *generators):
    np_rng.bit_generator.state = states['numpy']
    for g, s in zip(generators, states['torch']):
        if g is not None:
            g.set_state(s)


def global_rng_state():
    """torch's default generators (the CPU's and, when CUDA is up, every device's): what train.py's batches and
    dropout draw from, to store in a resume state."""
    return {'cpu': torch.get_rng_state(),
            'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []}


def set_global_rng_state(state):
    torch.set_rng_state(state['cpu'])
    if state['cuda']:
        torch.cuda.set_rng_state_all(state['cuda'])
