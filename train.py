"""
Train a GPT generator with next-token loss: nanoGPT's train.py plus early stopping and held-out perplexity.

single process:  python train.py config/train_shakespeare_char.py [--key=value ...]
DDP on CPU:      torchrun --standalone --nproc_per_node=2 train.py config/train_shakespeare_char.py --device=cpu \
                 --backend=gloo --gradient_accumulation_steps=2
evaluate only:   python train.py config/train_shakespeare_char.py --init_from=resume --eval_only=True
after a kill:    the same command with --resume=True continues exactly where its last evaluation left it
"""

import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import UserError, config_defaults, configure, run_cli
from calibration import record_and_say
from data_loader import check_select_tokens, held_out_record, resolve_data_dir
from early_stopping import EarlyStopping
from model import (GPT, GPT2_NAMES, GPTConfig, PretrainedUnavailable, evaluate_perplexity, load_checkpoint,
                   save_checkpoint, start_problem, update_checkpoint)
from runtime import (broadcast_stop, global_rng_state, load_resume_state, resume_file, run_signature,
                     save_resume_state, set_global_rng_state, setup_runtime)
from tokenization_manager import TokenizationManager
from tracking import TRACKING_DEFAULTS, Tracker

# -----------------------------------------------------------------------------
# default config values (nanoGPT's names); override with config files and --key=value
# I/O
out_dir = 'out'
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False  # evaluate (loss estimate and whole-split val perplexity), then exit
always_save_checkpoint = True  # if False, save only when val loss (select loss, with select_tokens) improves
save_last = False  # also write last.pt: the weights where the run stopped, beside the kept ckpt.pt (an MLE control
# read as the games are, which keep their last policy)
init_from = 'scratch'  # 'scratch', 'resume' (out_dir/ckpt.pt), a generator checkpoint's path, or GPT-2 weights:
# 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' or a local Hugging Face directory (needs transformers)
resume = False  # continue an interrupted run from out_dir/ckpt_resume.pt (written at every evaluation, gone at the
# end) when its settings and inputs match: the same weights as a run never stopped; a finished one is left as it is
# (train_grpo.py's --resume)
# data
dataset = 'shakespeare_char'  # a folder under data/, or any folder, holding train.bin and val.bin (+ meta.pkl)
gradient_accumulation_steps = 1
batch_size = 12
block_size = 1024
# model
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True
# adamw optimizer
learning_rate = 6e-4
max_iters = 600000  # 0: evaluate the start, save it and stop
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables
# learning rate decay
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
# early stopping on val loss (select loss, with select_tokens): stop after `patience` evaluations without an
# improvement of at least min_delta
patience = 0  # 0 disables
min_delta = 0.0
# >0: the last select_tokens tokens of train.bin are held out of training, and early stopping and the kept checkpoint
# read their loss instead of val's, so that val (every reported figure's split) never chooses a checkpoint
select_tokens = 0
# with select_tokens: read the select loss over the whole held-out pass instead of eval_iters random batches, whose
# noise (0.02-0.04 between evaluations at 20 batches) is as large as a plateau's slope
select_pass = False
# when the run stops: fit the temperature the held-out selection tail reads best and record it in the checkpoint
# (calibration.py; sample.py --temperature=calibrated reads it), where the model holds out a tail
calibrate = True
# a forward-KL distillation of a tilt (prepare_tilt_data.py's folder; docs/family_bound.md): mix_fraction of every
# train batch's rows are its windows, the loss read on their generated tokens only, the rest natural train windows;
# windows made with --keep=all carry a weight each (w - 1), which multiplies that row's loss
mix_dir = ''
mix_fraction = 0.5
# held-out perplexity over the whole val split (or its first ppl_max_tokens tokens)
ppl_max_tokens = 0  # 0: the whole split
# when: 'every_eval', 'end' (only at the evaluation that ends the run) or 'off' (as nanoGPT; eval_only still reports it)
val_ppl = 'every_eval'  # on nanoGPT's CPU recipe the whole split costs ~1.5 s on 2 threads, ~3.3 s on one
# system
backend = 'auto'  # DDP backend: 'auto' = nccl on CUDA, gloo on CPU
device = 'auto'  # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = 'auto'  # 'auto' = bfloat16/float16 autocast on CUDA, float32 on CPU
compile = True  # torch.compile, on CUDA only
seed = 1337
# -----------------------------------------------------------------------------
# each number's range and the relations between them, checked by the configurator before anything is read or written
RANGES = dict(eval_interval='>= 1', log_interval='>= 1', eval_iters='>= 1',  # I/O
              gradient_accumulation_steps='>= 1', batch_size='>= 1', block_size='>= 1',  # data
              n_layer='>= 1', n_head='>= 1', n_embd='>= 1', dropout='[0, 1)',  # model
              learning_rate='> 0', max_iters='>= 0', weight_decay='>= 0', beta1='[0, 1)', beta2='[0, 1)',
              grad_clip='>= 0', warmup_iters='>= 0', lr_decay_iters='>= 0', min_lr='>= 0',  # optimizer and schedule
              patience='>= 0', min_delta='>= 0', select_tokens='>= 0', mix_fraction='(0, 1]', ppl_max_tokens='>= 0',
              seed='>= 0')
RELATIONS = (('not decay_lr or min_lr <= learning_rate', "the cosine decays from learning_rate down to min_lr"),
             ('n_embd % n_head == 0', "each head takes an equal share of the embedding"))
DEFAULTS = {**config_defaults(globals()), **TRACKING_DEFAULTS}  # + wandb_log, tensorboard_log, ... (tracking.py)
VAL_PPL_WHEN = ('every_eval', 'end', 'off')


def is_pretrained(init_from):
    """GPT-2 weights: a hub name, or a directory written by transformers' save_pretrained."""
    return init_from in GPT2_NAMES or os.path.isfile(os.path.join(init_from, 'config.json'))


def get_lr(it, C):
    """Linear warmup, cosine decay to min_lr, then constant (nanoGPT's schedule)."""
    if not C.decay_lr:
        return C.learning_rate
    if it < C.warmup_iters:
        return C.learning_rate * (it + 1) / (C.warmup_iters + 1)
    if it > C.lr_decay_iters:
        return C.min_lr
    decay_ratio = (it - C.warmup_iters) / max(1, C.lr_decay_iters - C.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return C.min_lr + coeff * (C.learning_rate - C.min_lr)


def init_model(C, tokenizer, data_dir):
    """The model to train: from scratch, from GPT-2's weights (cropped to block_size), or from a generator
    checkpoint (init_from='resume': out_dir/ckpt.pt, continued). Returns (model, the checkpoint read or None)."""
    ckpt = None
    if C.init_from == 'scratch':
        vocab_size = tokenizer.vocab_size if tokenizer.method == 'char' else 50304
        model_args = dict(n_layer=C.n_layer, n_head=C.n_head, n_embd=C.n_embd, block_size=C.block_size,
                          bias=C.bias, vocab_size=vocab_size, n_tokens=tokenizer.vocab_size, dropout=C.dropout)
        model = GPT(GPTConfig(**model_args))
    elif is_pretrained(C.init_from):
        if tokenizer.method != 'bpe':
            raise UserError(f"GPT-2 weights read GPT-2 BPE tokens, but {data_dir} is {tokenizer.method}-level: "
                            f"use a BPE dataset such as data/shakespeare")
        try:
            model = GPT.from_pretrained(C.init_from, dropout=C.dropout)
        except PretrainedUnavailable as e:
            raise UserError(str(e)) from None
        if C.block_size > model.config.block_size:
            raise UserError(f"--block_size={C.block_size} exceeds GPT-2's {model.config.block_size}: pass at most that")
        model.crop_block_size(C.block_size)
    else:
        ckpt_path = os.path.join(C.out_dir, 'ckpt.pt') if C.init_from == 'resume' else C.init_from
        ckpt = load_checkpoint(ckpt_path)
        if problem := start_problem(ckpt, ckpt_path):
            raise UserError(problem)
        if ckpt.get('tokenization', {}).get('vocab_size') not in (None, tokenizer.vocab_size):
            raise UserError(f"{ckpt_path} was trained with vocab size {ckpt['tokenization']['vocab_size']}, "
                            f"but {data_dir} has {tokenizer.vocab_size}: use the matching --dataset")
        model = GPT.from_checkpoint(ckpt, dropout=C.dropout)
        if C.block_size > model.config.block_size:
            raise UserError(f"--block_size={C.block_size} exceeds the checkpoint's {model.config.block_size}: pass at "
                            "most that")
    return model, ckpt


def load_mix(C, tokenizer):
    """prepare_tilt_data.py's windows (n, L) and meta, checked against this run's vocabulary and block."""
    meta_path = os.path.join(C.mix_dir, 'meta.json')
    if not os.path.isfile(meta_path):
        raise UserError(f"--mix_dir={C.mix_dir} holds no meta.json: make it with prepare_tilt_data.py")
    with open(meta_path) as f:
        meta = json.load(f)
    if meta['vocab_size'] != tokenizer.vocab_size or meta['length'] - 1 > C.block_size:
        raise UserError(f"{C.mix_dir}'s windows (vocab {meta['vocab_size']}, {meta['length']} tokens) do not fit this "
                        f"run (vocab {tokenizer.vocab_size}, block {C.block_size}): make them with this run's generator")
    windows = np.fromfile(os.path.join(C.mix_dir, 'windows.bin'), dtype=np.uint16).reshape(-1, meta['length'])
    weights_path = os.path.join(C.mix_dir, 'weights.bin')
    weights = torch.from_numpy(np.fromfile(weights_path, dtype=np.float32)) if os.path.isfile(weights_path) else None
    if weights is not None and len(weights) != len(windows):
        raise UserError(f"{C.mix_dir} holds {len(weights)} weights for {len(windows)} windows: make it again with "
                        f"prepare_tilt_data.py")
    return dict(meta, windows=torch.from_numpy(windows.astype(np.int64)), weights=weights)


def mix_rows(mix, rows, block_size):
    """Inputs and targets (len(rows), block_size) of the tilt's windows: next-token targets on the generated tokens
    only (the natural prompt's are -1, read by no loss), padded to the block with targets -1; and their weights
    (None unless the windows carry them)."""
    w = mix['windows'][rows]
    L = w.size(1)
    x = torch.zeros(len(rows), block_size, dtype=torch.long)
    y = torch.full((len(rows), block_size), -1, dtype=torch.long)
    x[:, :L - 1], y[:, :L - 1] = w[:, :-1], w[:, 1:]
    y[:, :mix['prompt_len'] - 1] = -1
    return x, y, None if mix['weights'] is None else mix['weights'][rows]


def mix_into(x, y, mix, n_mix, block_size):
    """A train batch (x, y) of natural rows with n_mix of the tilt's windows put before them (mix_rows, drawn at
    random), and every row's weight: None unless the windows carry weights, natural rows weighing 1."""
    if not n_mix:
        return x, y, None
    x_mix, y_mix, w_mix = mix_rows(mix, torch.randint(len(mix['windows']), (n_mix,)), block_size)
    w = None if w_mix is None else torch.cat([w_mix, torch.ones(len(x))])
    return torch.cat([x_mix, x]), torch.cat([y_mix, y]), w


def weighted_loss(model, x, y, w):
    """The next-token loss with each row's tokens weighted by w (B,), over the batch's target count: w = 1 is the
    plain loss."""
    logits, _ = model(x, all_logits=True)
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1, reduction='none')
    return (nll.view_as(y) * w[:, None]).sum() / (y != -1).sum()


def resume_signature(C, data_dir):
    """What a resume state must match (runtime.run_signature): the settings, the checkpoint the run started from, and
    the data and tilt windows it reads."""
    data = [os.path.join(data_dir, f) for f in ('train.bin', 'val.bin')]
    if C.mix_dir:
        data += [os.path.join(C.mix_dir, f) for f in sorted(os.listdir(C.mix_dir))]
    return run_signature(vars(C), [C.init_from] if os.path.isfile(C.init_from) else [], data)


def finished_here(out_dir, signature):
    """Whether out_dir's kept checkpoint is this very run's, finished (its end records the run's signature)."""
    path = os.path.join(out_dir, 'ckpt.pt')
    return os.path.isfile(path) and load_checkpoint(path).get('signature') == signature


def restore(state, model, optimizer, scaler, stopper, device):
    """Put a resume state back where the last evaluation left it: weights, optimizer, grad scaler, stopper and
    torch's generators. Returns its iteration, best selection loss, last evaluation and the batch drawn for it."""
    model.load_state_dict(state['model'])
    optimizer.load_state_dict(state['optimizer'])
    scaler.load_state_dict(state['scaler'])
    stopper.load_state_dict(state['early_stopping'])
    set_global_rng_state(state['rng'])
    batch = tuple(None if t is None else t.to(device) for t in state['batch'])
    return state['iter_num'], state['best_val_loss'], state['last'], batch


def main(argv):
    C = configure(DEFAULTS, argv, RANGES, RELATIONS)
    if C.init_from not in ('scratch', 'resume') and not os.path.isfile(C.init_from) and not is_pretrained(C.init_from):
        raise UserError(f"init_from must be 'scratch', 'resume', a checkpoint path, one of {', '.join(GPT2_NAMES)} or "
                        f"a Hugging Face model directory; {C.init_from!r} is none of them")
    if C.val_ppl not in VAL_PPL_WHEN:
        raise UserError(f"--val_ppl={C.val_ppl!r} is not one of {', '.join(VAL_PPL_WHEN)}")
    rt = setup_runtime(C.device, C.backend, C.dtype, C.seed)
    if C.gradient_accumulation_steps % rt.world_size:  # every rank stops here (run_cli ends it, code 2)
        raise UserError(f"gradient_accumulation_steps {C.gradient_accumulation_steps} must divide by the "
                        f"{rt.world_size} processes (each runs an equal share): pass "
                        f"--gradient_accumulation_steps={rt.world_size * max(1, C.gradient_accumulation_steps // rt.world_size)}")
    grad_accum = C.gradient_accumulation_steps // rt.world_size
    tokens_per_iter = grad_accum * rt.world_size * C.batch_size * C.block_size
    data_dir = resolve_data_dir(C.dataset)
    tokenizer = TokenizationManager('auto', data_dir=data_dir)
    if rt.master:
        print(f"tokens per iteration will be: {tokens_per_iter:,}; tokenization: {tokenizer.method} "
              f"(vocab {tokenizer.vocab_size}); device: {rt.device}")
    n_train = len(np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r'))
    check_select_tokens('select_tokens', C.select_tokens, C.block_size, n_train)
    select_split = 'select' if C.select_tokens else 'val'  # the split that early stopping and the checkpoint read
    if C.select_pass and not C.select_tokens:
        raise UserError("--select_pass=True reads the held-out train tokens: give them with --select_tokens=N")

    def split_tokens(split):
        # recreate the memmap at every read to avoid a memory leak (as nanoGPT does)
        data = np.memmap(os.path.join(data_dir, 'val.bin' if split == 'val' else 'train.bin'), dtype=np.uint16,
                         mode='r')
        if C.select_tokens and split != 'val':  # train and select are the two ends of train.bin
            data = data[n_train - C.select_tokens:] if split == 'select' else data[:n_train - C.select_tokens]
        return data

    mix = load_mix(C, tokenizer) if C.mix_dir else None

    def get_batch(split):
        data = split_tokens(split)
        n_mix = round(C.batch_size * C.mix_fraction) if mix is not None and split == 'train' else 0
        ix = torch.randint(len(data) - C.block_size, (C.batch_size - n_mix,)).numpy()
        # one gather for the whole batch (nanoGPT stacks 2 x batch_size slices: 0.3 ms against 0.12 ms a batch)
        windows = torch.from_numpy(data[ix[:, None] + np.arange(C.block_size + 1)].astype(np.int64))
        x, y, w = mix_into(windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), mix, n_mix, C.block_size)
        w = None if w is None else w.to(rt.device)
        if rt.device_type == 'cuda':
            return x.pin_memory().to(rt.device, non_blocking=True), y.pin_memory().to(rt.device, non_blocking=True), w
        return x.to(rt.device), y.to(rt.device), w

    signature = resume_signature(C, data_dir)
    if C.resume and finished_here(C.out_dir, signature):  # the same command again after its end: not played again
        if rt.master:
            print(f"{os.path.join(C.out_dir, 'ckpt.pt')} is this run, finished: nothing to resume")
        rt.close()
        return
    stopper = EarlyStopping(C.patience, C.min_delta, 'min')
    model, ckpt = init_model(C, tokenizer, data_dir)
    # the tail of train.bin that no model of this one's line trained on, which every later stage leaves unread
    # (data_loader.generator_train_tokens): this run's selection split, less what the checkpoint it starts from read
    held_out = held_out_record(ckpt, n_train, C.select_tokens)
    if rt.master:  # every check passed: the run's folder now
        os.makedirs(C.out_dir, exist_ok=True)
    iter_num, best_val_loss = 0, float('inf')
    if C.init_from == 'resume':
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss'] or float('inf')
        if 'early_stopping' in ckpt:
            stopper.load_state_dict(ckpt['early_stopping'])
    model.to(rt.device)
    scaler = torch.amp.GradScaler(enabled=(rt.ptdtype == torch.float16 and rt.device_type == 'cuda'))
    optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), rt.device_type)
    if C.init_from == 'resume' and 'optimizer' in ckpt:
        optimizer.load_state_dict(ckpt['optimizer'])
    ckpt = None  # free memory
    raw_model = model
    state_path = resume_file(os.path.join(C.out_dir, 'ckpt.pt'), rt.rank)
    state = load_resume_state(state_path, signature) if C.resume else None
    last, batch = {}, None
    if state is not None:
        iter_num, best_val_loss, last, batch = restore(state, raw_model, optimizer, scaler, stopper, rt.device)
        if rt.master:
            print(f"resumed at iteration {iter_num} from {state_path}")
    resumed_at = iter_num if state is not None else None
    tracker = Tracker(C, f"train/{os.path.basename(os.path.abspath(C.out_dir))}", C.out_dir, rt.master,
                      resume_step=iter_num if C.init_from == 'resume' or state else None)
    if C.compile and rt.device_type == 'cuda':
        model = torch.compile(model)
    if rt.ddp:
        model = DDP(model, device_ids=[rt.local_rank] if rt.device_type == 'cuda' else None)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in dict.fromkeys(('train', 'val', select_split)):
            if split == 'select' and C.select_pass:
                out[split] = evaluate_perplexity(raw_model, split_tokens('select'), C.block_size, max(C.batch_size, 32),
                                                 ctx=rt.ctx)[0]
                continue
            losses = torch.zeros(C.eval_iters)
            for k in range(C.eval_iters):
                X, Y, _ = get_batch(split)  # weighted windows read unweighted: a report, not a gradient
                with rt.ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def val_perplexity():
        return evaluate_perplexity(raw_model, split_tokens('val'), C.block_size, batch_size=max(C.batch_size, 32),
                                   ctx=rt.ctx, max_tokens=C.ppl_max_tokens)[1]

    def save(losses):
        save_checkpoint(os.path.join(C.out_dir, 'ckpt.pt'), raw_model, iter_num=iter_num, best_val_loss=best_val_loss,
                        config=vars(C), tokenization=tokenizer.info(), optimizer=optimizer,
                        early_stopping=stopper.state_dict(), held_out=held_out,
                        metrics={f'{k}_loss': v for k, v in losses.items()})

    def loss_line(losses):
        select = f", select loss {losses['select']:.4f}" if C.select_tokens else ''
        return f"train loss {losses['train']:.4f}{select}, val loss {losses['val']:.4f}"

    if C.eval_only:
        if rt.master:
            print(f"step {iter_num}: {loss_line(estimate_loss())}, val ppl {val_perplexity():.3f}")
        tracker.close()
        rt.close()
        return

    X, Y, W = get_batch('train') if batch is None else batch
    t_start = t0 = time.time()
    start_iter, stop_reason = iter_num, 'max_iters'
    bar = tqdm(total=C.max_iters, initial=iter_num, disable=not rt.master, desc='train', dynamic_ncols=True,
               mininterval=2.0)
    while True:
        lr = get_lr(iter_num, C)
        for group in optimizer.param_groups:
            group['lr'] = lr

        # evaluate, checkpoint, early-stop (master decides, every rank follows)
        stop = False
        if (iter_num % C.eval_interval == 0 or iter_num >= C.max_iters) and rt.master and iter_num != resumed_at:
            losses = estimate_loss()
            stopper.step(losses[select_split])
            ending = stopper.should_stop or iter_num >= C.max_iters
            ppl = {'ppl': val_perplexity()} if C.val_ppl == 'every_eval' or (C.val_ppl == 'end' and ending) else {}
            last = dict(losses, **ppl, iter=iter_num)
            tqdm.write(f"step {iter_num}: {loss_line(losses)}" + (f", val ppl {ppl['ppl']:.3f}" if ppl else ''))
            tracker.log(dict({f'{k}_loss': v for k, v in losses.items()}, **{f'val_{k}': v for k, v in ppl.items()},
                             lr=lr), iter_num)
            if losses[select_split] < best_val_loss or C.always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses[select_split])
                # a run from a checkpoint keeps its start when no later evaluation beats it (continued training that
                # only got worse returns the model it started from); a resume's start is already on disk
                if iter_num > start_iter or C.init_from != 'resume':
                    save(losses)
            if stopper.should_stop:
                stop, stop_reason = True, (f"early stopping: {select_split} loss did not improve by {C.min_delta} "
                                           f"for {C.patience} evaluations")
        if iter_num >= C.max_iters:
            stop = True
        if broadcast_stop(stop, rt):
            break
        if iter_num % C.eval_interval == 0 and iter_num != resumed_at:  # the state to go on from, every rank its own
            save_resume_state(state_path, dict(
                signature=signature, model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                scaler=scaler.state_dict(), early_stopping=stopper.state_dict(), iter_num=iter_num,
                best_val_loss=best_val_loss, last=last, rng=global_rng_state(),
                batch=[None if t is None else t.cpu() for t in (X, Y, W)]))

        for micro_step in range(grad_accum):
            if rt.ddp:
                model.require_backward_grad_sync = (micro_step == grad_accum - 1)
            with rt.ctx:
                loss = model(X, Y)[1] if W is None else weighted_loss(model, X, Y, W)
                loss = loss / grad_accum
            X, Y, W = get_batch('train')  # prefetch while the backward runs (on CUDA)
            scaler.scale(loss).backward()
        if C.grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), C.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % C.log_interval == 0 and rt.master:
            tqdm.write(f"iter {iter_num}: loss {loss.item() * grad_accum:.4f}, time {dt * 1000:.2f}ms, "
                       f"{tokens_per_iter / max(dt, 1e-9):,.0f} tok/s")
            tracker.log(dict(loss=loss.item() * grad_accum, lr=lr), iter_num)
        iter_num += 1
        bar.update(1)
    bar.close()

    if rt.master:
        ckpt_path = os.path.join(C.out_dir, 'ckpt.pt')
        if os.path.exists(ckpt_path):  # where the run ended, beside the iteration of the checkpoint it kept
            update_checkpoint(ckpt_path, stopped_at=iter_num, stop_reason=stop_reason, signature=signature)
            if C.calibrate:
                record_and_say(ckpt_path, data_dir, rt.device)
        if C.save_last:
            save_checkpoint(os.path.join(C.out_dir, 'last.pt'), raw_model, iter_num=iter_num, config=vars(C),
                            tokenization=tokenizer.info(), held_out=held_out, stopped_at=iter_num,
                            stop_reason=stop_reason)
        elapsed = time.time() - t_start
        trained = iter_num - start_iter
        print(f"done: {trained} iterations in {elapsed:.1f}s ({trained * tokens_per_iter / max(elapsed, 1e-9):,.0f} "
              f"tok/s incl. evaluation); stopped by {stop_reason}")
        if last:
            ppl = f", val ppl {last['ppl']:.3f}" if 'ppl' in last else ''
            print(f"final: {loss_line(last)}{ppl}; "
                  f"best {select_split} loss {best_val_loss:.4f}; checkpoint {os.path.join(C.out_dir, 'ckpt.pt')}")
    if os.path.exists(state_path):  # finished: nothing left to resume
        os.remove(state_path)
    tracker.close()
    rt.close()


if __name__ == '__main__':
    run_cli(main)
