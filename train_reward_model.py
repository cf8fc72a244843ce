"""
Train the reward model: the base GPT's trunk (frozen by default) under a fresh MLP head that predicts
[P(natural), P(synthetic)] of a sequence from its last token's final hidden state (or, with
reward_pooling='mean', the mean of the final hidden states over all positions). reward_pooling='token' judges every
position: trained on per-position labels (position t is natural iff t < K), its sequence P(natural) is the mean
over positions, so its figures compare with the other judges' one for one. loss='pairwise' trains a relative judge
(GAD, TextGAIL): for each crossover sample and the natural block it was cut from (one prefix, the generated and the
corpus' own continuation), the Bradley-Terry loss -log sigma(D(natural) - D(sample)), D = log P(natural)/P(synthetic).
loss='binary' trains a whole-window judge on the same pairs: cross-entropy of each sample against its label and of
its natural block against [1, 0] (with prepare_reward_data.py --crossover_k 8: natural windows against the model's
continuations of 8-token prompts, the texts judge sight is measured on).

  python train_reward_model.py [config/train_reward_*.py] --model_path=BASE.pt --data_dir=REWARD_DATA --out_path=RM.pt

With the trunk frozen, a sample's pooled features never change: they are computed once (batched, inference mode)
and the head trains on the cached features. unfreeze_layers=k trains the last k blocks and the final LayerNorm too,
through the full forward; unfreeze_layers=-1 the whole network, embeddings included, and init_from='random' starts
it from random weights of the base's shape: a judge that learns its own features. The val split is cut in two by
block: one half selects (early stopping, the checkpoint kept), the other half gives the reported figures (`metrics`
in the checkpoint; `selection_metrics` beside them). Reward data with a 'select' split (prepare_reward_data.py
--select_blocks: held-out windows of the generator's train tokens) selects on it instead and reports on all of val:
the judge trains to its own stopping without selecting on the generator's val text.
"""

import os
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import UserError, config_defaults, configure, run_cli
from early_stopping import EarlyStopping
from judge import (PAIRED_LOSSES, compute_features, freeze_trunk, judge_loss, pair_accuracy, pairwise_loss,
                   ranking_loss, reward_metrics)
from model import GPT, POOLINGS, load_checkpoint, save_checkpoint, sequence_probs, update_checkpoint
from reward_dataset_loader import RewardDataset
from runtime import broadcast_stop, setup_runtime
from tracking import TRACKING_DEFAULTS, Tracker

SPLITS = ('train', 'val', 'select')  # select: held-out train windows (prepare_reward_data.py --select_blocks)

# -----------------------------------------------------------------------------
model_path = ''  # the base (generator) checkpoint whose trunk the reward model uses
data_dir = 'data/reward_dataset'  # written by prepare_reward_data.py
out_path = 'out-reward/reward_model.pt'
init_from = 'base'  # 'base' (fresh head on model_path's trunk), 'random' (model_path's shape and tokenization,
# random weights) or 'resume' (continue from out_path, the saved best)
reward_head_hidden_dim = 256
reward_pooling = 'last'  # head input: 'last' token's final state (the seed's design), 'mean' over positions, 'token'
unfreeze_layers = 0  # 0: frozen trunk (cached features); k: also train the last k blocks and ln_f; -1: everything
loss = 'mse'  # 'mse', 'ce' (cross-entropy against the soft label), 'pairwise' (Bradley-Terry, natural vs sample),
# 'binary' (cross-entropy of each sample against its label and of its natural block against [1, 0]: whole windows) or
# 'ranking' (ranking NCE: each natural block against all its samples at once, with --crossover_k data of K a block)
bidirectional = False  # every position attends both ways (an energy net); whole-window pooling only
batch_size = 64
learning_rate = 1e-3
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0  # 0 disables
max_iters = 3000  # optimizer steps (0: the untrained head, saved as it is: a blind judge)
max_epochs = 0  # stop after this many passes over the train split too (0: no limit)
eval_interval = 100
patience = 8  # evaluations without an improvement of at least min_delta in val loss (0 disables)
min_delta = 1e-5
feature_batch_size = 256  # batch of the one-off feature pass
use_feature_cache = True  # with a frozen trunk; False forces the full forward every batch (for benchmarks)
backend = 'auto'
device = 'auto'
dtype = 'auto'
seed = 1337
# -----------------------------------------------------------------------------
# each number's range, checked by the configurator before anything is read or written
RANGES = dict(reward_head_hidden_dim='>= 1', unfreeze_layers='>= -1', batch_size='>= 1', learning_rate='> 0',
              weight_decay='>= 0', beta1='[0, 1)', beta2='[0, 1)', grad_clip='>= 0', max_iters='>= 0',
              max_epochs='>= 0', eval_interval='>= 1', patience='>= 0', min_delta='>= 0', feature_batch_size='>= 1',
              seed='>= 0')
DEFAULTS = {**config_defaults(globals()), **TRACKING_DEFAULTS}  # + wandb_log, tensorboard_log, ... (tracking.py)


def check_config(C):
    if C.loss not in ('mse', 'ce', 'pairwise', 'binary', 'ranking'):
        raise UserError(f"loss must be 'mse', 'ce', 'pairwise', 'binary' or 'ranking', got {C.loss!r}")
    if C.bidirectional and C.reward_pooling == 'token':
        raise UserError("--bidirectional=True lets every position see the whole window, so per-position labels would "
                        "leak: use --reward_pooling=mean or last")
    if C.init_from not in ('base', 'random', 'resume'):
        raise UserError(f"init_from must be 'base', 'random' or 'resume', got {C.init_from!r}")
    if C.init_from != 'resume' and not C.model_path:
        raise UserError("pass --model_path=BASE.pt (the generator checkpoint whose trunk the reward model uses)")
    if C.reward_pooling not in POOLINGS:
        raise UserError(f"reward_pooling must be one of {POOLINGS}, got {C.reward_pooling!r}")


def load_judge(C, rt):
    """The source checkpoint (the base, or the saved best when resuming) checked against the reward data; returns
    (the source, its tokenization, the datasets by split: train, val and select where the data has one, the reward
    model with its trunk frozen as asked)."""
    src_path = C.out_path if C.init_from == 'resume' else C.model_path
    src = load_checkpoint(src_path)
    if C.init_from != 'resume' and src['model_args'].get('mode', 'generator') != 'generator':
        raise UserError(f"{C.model_path} is a {src['model_args']['mode']} checkpoint; pass the base generator")
    tokenization = src.get('tokenization') or {}
    datasets = {split: RewardDataset(C.data_dir, split, tokenization or None) for split in SPLITS
                if split != 'select' or os.path.exists(os.path.join(C.data_dir, 'select_x.bin'))}
    train_ds = datasets['train']
    N = train_ds.block_size
    if C.loss in PAIRED_LOSSES and train_ds.natural is None:
        raise UserError(f"loss={C.loss!r} needs each sample's natural block, which {C.data_dir} (format "
                        f"{train_ds.metadata.get('format_version', '1')}) lacks: re-create it with "
                        f"prepare_reward_data.py")
    for ds in datasets.values() if C.loss == 'ranking' else ():
        if ds.num_samples % ds.samples_per_chunk:
            raise UserError(f"loss='ranking' reads every block's samples together, but {ds.split} holds "
                            f"{ds.num_samples} samples of {ds.samples_per_chunk} a block: re-create {C.data_dir}")
    if N > src['model_args']['block_size']:
        raise UserError(f"reward data block size {N} exceeds the model's {src['model_args']['block_size']}")
    if not -1 <= C.unfreeze_layers <= src['model_args']['n_layer']:
        raise UserError(f"unfreeze_layers must be in [-1, {src['model_args']['n_layer']}] (-1: the whole network), "
                        f"got {C.unfreeze_layers}")
    head = src['model_args'] if C.init_from == 'resume' else vars(C)  # a resumed head keeps its own shape
    model = GPT.from_checkpoint(src, mode='reward', device=rt.device,
                                reward_head_hidden_dim=head['reward_head_hidden_dim'],
                                reward_pooling=head.get('reward_pooling', 'last'),
                                bidirectional=head.get('bidirectional', False))
    if C.init_from == 'random':  # the same shape, none of the base's weights (seeded by setup_runtime)
        model = GPT(model.config).to(rt.device)
    freeze_trunk(model, C.unfreeze_layers)
    return src, tokenization, datasets, model


def cache_features(C, model, datasets, pairwise, rt):
    """With a frozen trunk, every sample's pooled features once (and the natural blocks' where pairs need them):
    ({split: features}, {split: natural blocks' features}, FLOPs spent)."""
    t0 = time.time()
    model.eval()
    feats, natural_feats, flops = {}, {}, 0
    for split, ds in datasets.items():
        feats[split] = compute_features(model, ds.x, C.feature_batch_size, rt, f'features ({split})')
        flops += model.flops_per_token() * len(ds) * ds.block_size
        if ds.natural is not None and (pairwise or split != 'train'):  # the other half of each pair
            natural_feats[split] = compute_features(model, ds.natural, C.feature_batch_size, rt,
                                                    f'features ({split}, natural)')
            flops += model.flops_per_token() * len(ds.natural) * ds.block_size
    if rt.master:
        print(f"cached features of {' + '.join(str(len(ds)) for ds in datasets.values())} samples "
              f"in {time.time() - t0:.1f}s")
    return feats, natural_feats, flops


def selection_and_test(datasets):
    """(dataset, rows) that select the checkpoint and (dataset, rows) that report its figures: the select split and
    all of val where the data has a select split, else val's two halves."""
    val_ds = datasets['val']
    if 'select' in datasets:
        return (datasets['select'], np.arange(len(datasets['select']))), (val_ds, np.arange(len(val_ds)))
    select_rows, test_rows = val_ds.selection_and_test_rows()
    return (val_ds, select_rows), (val_ds, test_rows)


def resume_from(src, optimizer, stopper):
    """A resumed run continues the saved best's optimizer and early-stopping state: (iteration, best val loss)."""
    optimizer.load_state_dict(src['optimizer'])
    stopper.load_state_dict(src['early_stopping'])
    return src['iter_num'], src['best_val_loss']


def loss_of(kind, probs, natural_probs, y):
    """The judge's loss on a batch: probs of its samples, natural_probs of their natural blocks (paired losses)."""
    if kind == 'binary':  # the natural blocks are samples too, every position natural
        natural_y = y.new_tensor([[1.0, 0.0]]).expand_as(y)
        return judge_loss(torch.cat([probs, natural_probs]), torch.cat([y, natural_y]), 'ce')
    if kind == 'ranking':
        return ranking_loss(natural_probs, probs)
    return pairwise_loss(natural_probs, probs) if kind == 'pairwise' else judge_loss(probs, y, kind)


def pair_wins(natural_probs, probs):
    """How many samples the judge ranks below their own natural block (ranking reads each block once: repeated)."""
    if natural_probs is None:
        return 0.0
    return pair_accuracy(natural_probs.repeat_interleave(len(probs) // len(natural_probs), 0), probs) * len(probs)


def batch_rows(perm, slot, units_per_batch, group):
    """The rows of one rank's batch: the slot-th run of units_per_batch units of the permutation, a unit being a
    sample, or for ranking a block's `group` samples."""
    units = perm[slot * units_per_batch:][:units_per_batch]
    return (units[:, None] * group + np.arange(group)).ravel()


def figures_line(iter_num, val_loss, m):
    if m['baseline_mse'] == 0 and 'pair_accuracy' in m:  # one crossover for all (--crossover_k): R² says nothing
        return f"iter {iter_num}: val loss {val_loss:.5f} | pair accuracy {m['pair_accuracy']:.3f}"
    return (f"iter {iter_num}: val loss {val_loss:.5f} | mse {m['mse']:.5f} (baseline {m['baseline_mse']:.5f}) "
            f"R2 {m['r2']:.4f} | MAE {m['mae']:.4f} | boundary error {m['boundary_error']:.1f} tokens"
            + (f" | pair accuracy {m['pair_accuracy']:.3f}" if 'pair_accuracy' in m else ''))


def summarize(C, model, trunk_before, iter_num, epochs, elapsed, stop_reason, best_metrics, sets, N):
    """The final lines: iterations, whether the trunk moved, and the test rows' figures of the kept checkpoint."""
    trunk_after = {k: v for k, v in model.state_dict().items() if not k.startswith('reward_head.')}
    changed = sum(not torch.equal(trunk_before[k], trunk_after[k]) for k in trunk_before)
    print(f"done: {iter_num} iterations ({epochs:.1f} epochs), {elapsed:.1f}s; stopped by {stop_reason}")
    print(f"trunk tensors changed: {changed} (unfreeze_layers={C.unfreeze_layers})")
    if best_metrics:
        m, ((select_ds, select_rows), (test_ds, test_rows)) = best_metrics, sets
        where = (f"test half of val ({len(test_rows)} samples; the checkpoint was selected on the other "
                 f"{len(select_rows)})" if select_ds is test_ds else
                 f"val ({len(test_rows)} samples; the checkpoint was selected on {len(select_rows)} held-out "
                 f"train samples)")
        print(f"{where}: mse {m['mse']:.5f} vs constant-mean baseline {m['baseline_mse']:.5f}, "
              f"R2 {m['r2']:.4f}, MAE {m['mae']:.4f}, boundary error {m['boundary_error']:.1f} of {N} tokens"
              + (f", pair accuracy {m['pair_accuracy']:.3f}" if 'pair_accuracy' in m else '')
              + f"; saved {C.out_path}")


def main(argv):
    C = configure(DEFAULTS, argv, RANGES)
    check_config(C)
    rt = setup_runtime(C.device, C.backend, C.dtype, C.seed)
    src, tokenization, datasets, model = load_judge(C, rt)
    train_ds = datasets['train']
    N, pairwise = train_ds.block_size, C.loss in PAIRED_LOSSES  # pairs: each sample and its natural block
    group = train_ds.samples_per_chunk if C.loss == 'ranking' else 1  # ranking trains on whole blocks
    units_per_batch = max(1, C.batch_size // group)
    trunk_before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith('reward_head.')}
    cached = C.unfreeze_layers == 0 and C.use_feature_cache
    optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), rt.device_type)
    stopper = EarlyStopping(C.patience, C.min_delta, 'min')
    iter_num, best_val = resume_from(src, optimizer, stopper) if C.init_from == 'resume' else (0, float('inf'))
    src = None

    t0 = time.time()
    # compute spent (model.flops_per_token), recorded in the checkpoint for the cycle's compute matching
    feats, natural_feats, flops = cache_features(C, model, datasets, pairwise, rt) if cached else ({}, {}, 0)
    tracker = Tracker(C, f"judge/{os.path.splitext(os.path.basename(C.out_path))[0]}",
                      os.path.dirname(os.path.abspath(C.out_path)), rt.master,
                      resume_step=iter_num if C.init_from == 'resume' else None)
    train_module = model.reward_head if cached else model
    trained = DDP(train_module) if rt.ddp else train_module
    baseline_mean = float(np.mean(train_ds.y[:, 0]))

    def predict(ds, rows, training, pairs=False):
        """(probs, the natural blocks' probs with pairs=True else None, labels) for the given rows: the head on
        cached features, or the full forward; a pair goes through one forward (DDP allows one per backward)."""
        nonlocal flops
        rows = np.sort(np.asarray(rows))
        y = torch.from_numpy(np.array(ds.y[rows])).to(rt.device)
        module = trained if training else train_module
        blocks = rows // ds.samples_per_chunk  # each row's natural block; ranking reads each block once
        blocks = np.unique(blocks) if C.loss == 'ranking' else blocks
        if cached:
            inputs = feats[ds.split][torch.from_numpy(rows).to(rt.device)]
            if pairs:
                inputs = torch.cat([inputs, natural_feats[ds.split][torch.from_numpy(blocks).to(rt.device)]])
            out = module(inputs)
        else:
            x = np.concatenate([ds.x[rows], ds.natural[blocks]]) if pairs else ds.x[rows]
            x = torch.from_numpy(x.astype(np.int64)).to(rt.device)
            flops += model.flops_per_token(backward=training) * len(x) * N * (rt.world_size if training else 1)
            with rt.ctx:
                out = module(x, per_token=True)[0].float()
        return out[:len(rows)], (out[len(rows):] if pairs else None), y

    @torch.no_grad()
    def evaluate(ds, rows):
        """Loss and metrics on the given rows of a held-out split (the selection or the test rows)."""
        model.eval()
        p, losses, wins = [], 0.0, 0.0
        chunk = max(group, C.feature_batch_size // group * group)  # whole blocks for ranking
        for i in range(0, len(rows), chunk):
            probs, natural_probs, y = predict(ds, rows[i:i + chunk], False, pairs=ds.natural is not None)
            losses += loss_of(C.loss, probs, natural_probs, y).item() * len(y)
            p.append(sequence_probs(probs)[:, 0].cpu().numpy())
            wins += pair_wins(natural_probs, probs)
        model.train(train_mode)
        m = reward_metrics(np.concatenate(p), ds.y[rows, 0], N, baseline_mean)
        if ds.natural is not None:  # every judge, pointwise or not, ranks each sample against its natural block
            m['pair_accuracy'] = wins / len(rows)
        return losses / len(rows), m

    select_and_test = selection_and_test(datasets)
    best_metrics, stop_reason = None, 'max_iters'

    def evaluate_and_keep_best():
        """Evaluate on the selection rows, log, and when their loss improves save the checkpoint with the figures of
        the test rows: the reported figures never come from the data that chose the checkpoint."""
        nonlocal best_val, best_metrics
        val_loss, m = evaluate(*select_and_test[0])
        tqdm.write(figures_line(iter_num, val_loss, m))
        tracker.log(dict(val_loss=val_loss, loss=last_loss, **{f'val_{k}': v for k, v in m.items()}), iter_num)
        stopper.step(val_loss)
        if val_loss < best_val:
            best_val, best_metrics = val_loss, evaluate(*select_and_test[1])[1]
            save_checkpoint(C.out_path, model, iter_num=iter_num, best_val_loss=best_val, config=vars(C),
                            tokenization=tokenization, optimizer=optimizer, metrics=best_metrics,
                            selection_metrics=m, data_block_size=N, early_stopping=stopper.state_dict())

    gen = torch.Generator().manual_seed(C.seed)  # one permutation, which the ranks slice: one process's batches
    steps_per_epoch = max(1, len(train_ds) // group // (units_per_batch * rt.world_size))
    bar = tqdm(total=min(C.max_iters, C.max_epochs * steps_per_epoch or C.max_iters), initial=iter_num,
               desc='reward head', disable=not rt.master, dynamic_ncols=True, mininterval=2.0)
    train_mode = C.unfreeze_layers != 0  # a frozen trunk runs in eval mode, exactly as its cached features were made
    model.train(train_mode)
    epoch, step, last_loss = -1, steps_per_epoch, None
    while True:
        if step == steps_per_epoch:  # a new pass over the train split
            epoch, step = epoch + 1, 0
            perm = torch.randperm(len(train_ds) // group, generator=gen).numpy()
        done_by = 'max_iters' if iter_num >= C.max_iters else \
            'max_epochs' if C.max_epochs and epoch >= C.max_epochs else None
        if rt.master and (iter_num % C.eval_interval == 0 or done_by):
            evaluate_and_keep_best()
            if stopper.should_stop and not done_by:
                done_by = f"early stopping: val loss did not improve by {C.min_delta} for {C.patience} evaluations"
        stop_reason = done_by or stop_reason
        if broadcast_stop(done_by is not None, rt):
            break
        rows = batch_rows(perm, step * rt.world_size + rt.rank, units_per_batch, group)
        probs, natural_probs, y = predict(train_ds, rows, True, pairs=pairwise)
        loss_t = loss_of(C.loss, probs, natural_probs, y)
        optimizer.zero_grad(set_to_none=True)
        loss_t.backward()
        if C.grad_clip:
            torch.nn.utils.clip_grad_norm_(train_module.parameters(), C.grad_clip)
        optimizer.step()
        iter_num, step, last_loss = iter_num + 1, step + 1, loss_t.item()
        bar.update(1)
        bar.set_postfix(loss=f"{loss_t.item():.4f}", epoch=epoch, refresh=False)
    bar.close()

    if rt.master:
        if best_metrics:  # the saved (best) checkpoint gets the compute of the whole run
            update_checkpoint(C.out_path, flops=flops)
        summarize(C, model, trunk_before, iter_num, iter_num * units_per_batch * group * rt.world_size / len(train_ds),
                  time.time() - t0, stop_reason, best_metrics, select_and_test, N)
    tracker.close()
    rt.close()


if __name__ == '__main__':
    run_cli(main)
