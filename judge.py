"""
What every judge shares, offline (train_reward_model.py), online in GRPO and fresh in the referee (evaluate.py):
its losses (pointwise against crossover labels, per position for a token judge, Bradley-Terry against a natural
window), its score and pair accuracy, its figures against the crossover labels, the frozen-trunk features, the
online update, and the two commands that make a judge from scratch (reward data, then the reward model).
"""

import copy
import json
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from data_loader import write_atomic
from model import sequence_probs
from two_sample import tfidf_classifier
from worth import log_odds

ROOT = os.path.dirname(os.path.abspath(__file__))


def loss_fn(probs, y, kind):
    if kind == 'mse':
        return F.mse_loss(probs, y)
    return -(y * torch.log(probs.clamp_min(1e-8))).sum(-1).mean()


def crossover_targets(y, N):
    """Per-position targets (B, N, 2) of crossover samples with labels y (B, 2) = [K/N, (N-K)/N]: position t is
    natural ([1, 0]) iff t < K."""
    K = torch.round(y[:, 0] * N)
    natural = (torch.arange(N, device=y.device)[None, :] < K[:, None]).to(y.dtype)
    return torch.stack([natural, 1 - natural], dim=-1)


def judge_loss(probs, y, kind):
    """The loss of a judge's output against crossover labels y (B, 2): per position for a token judge's (B, N, 2)."""
    if probs.dim() == 3:
        return loss_fn(probs.reshape(-1, 2), crossover_targets(y, probs.size(1)).reshape(-1, 2), kind)
    return loss_fn(probs, y, kind)


def judge_score(probs):
    """A judge's score D = log P(natural) - log P(synthetic) of each sequence (a token judge's averaged probs)."""
    p = sequence_probs(probs).float().clamp_min(1e-8)
    return p[:, 0].log() - p[:, 1].log()


# the losses that read each sample's natural block: Bradley-Terry against it, or binary (it is a natural sample too)
PAIRED_LOSSES = ('pairwise', 'binary', 'ranking')


def pairwise_loss(natural_probs, sample_probs):
    """Bradley-Terry: -log sigma(D(natural) - D(sample)), averaged over pairs."""
    return -F.logsigmoid(judge_score(natural_probs) - judge_score(sample_probs)).mean()


def ranking_loss(natural_probs, sample_probs):
    """Ranking NCE with the base's samples as noise (Lin et al. 2021: K noise samples a positive): each natural block
    against the K samples of its prompt, -log softmax of D over the K + 1 with the natural first; sample_probs
    (G·K, 2) grouped by block. D is learnt up to a constant a prompt, which group-centred advantages and a tilt among
    one prompt's completions never read. K = 1 is the Bradley-Terry loss."""
    d_natural = judge_score(natural_probs)
    d_samples = judge_score(sample_probs).view(len(d_natural), -1)
    return -torch.log_softmax(torch.cat([d_natural[:, None], d_samples], 1), 1)[:, 0].mean()


def pair_accuracy(natural_probs, sample_probs):
    """How often the judge ranks the natural block above its crossover sample (a tie counts half)."""
    return float(((judge_score(natural_probs) - judge_score(sample_probs)).sign().mean() + 1) / 2)


def freeze_trunk(model, unfreeze_layers):
    """requires_grad=False everywhere but the head (and the last unfreeze_layers blocks + ln_f); unfreeze_layers=-1:
    the whole network trains, embeddings included (a judge that learns its own features)."""
    for p in model.parameters():
        p.requires_grad = unfreeze_layers < 0
    trainable = [model.reward_head]
    if unfreeze_layers > 0:
        trainable += list(model.transformer.h[-unfreeze_layers:]) + [model.transformer.ln_f]
    for module in trainable:
        for p in module.parameters():
            p.requires_grad = True


@torch.inference_mode()
def compute_features(model, x_all, batch_size, rt, desc):
    """Pooled features (n, n_embd) of every row of x_all (the reward head's input); under DDP each rank computes a
    contiguous share."""
    n = len(x_all)
    per_token = (x_all.shape[1],) if model.config.reward_pooling == 'token' else ()
    feats = torch.zeros(n, *per_token, model.config.n_embd, device=rt.device)
    share = math.ceil(n / rt.world_size)
    lo, hi = rt.rank * share, min(n, (rt.rank + 1) * share)
    for i in tqdm(range(lo, hi, batch_size), desc=desc, disable=not rt.master, dynamic_ncols=True, leave=False):
        x = torch.from_numpy(x_all[i:min(hi, i + batch_size)].astype(np.int64)).to(rt.device)
        with rt.ctx:
            feats[i:i + len(x)] = model.reward_features(x).float()
    if rt.ddp:
        dist.all_reduce(feats)
    return feats.clone()  # a normal tensor, usable outside inference mode


def reward_metrics(p_natural, y_natural, block_size, baseline_mean):
    """MSE (over both outputs, as the training loss), the constant-mean baseline, R², MAE and boundary error."""
    p, t = np.asarray(p_natural, dtype=np.float64), np.asarray(y_natural, dtype=np.float64)
    mse = float(np.mean((p - t) ** 2))  # both columns are 1-p and 1-t, so the 2-column MSE equals this
    baseline = float(np.mean((baseline_mean - t) ** 2))
    mae = float(np.mean(np.abs(p - t)))
    return dict(mse=mse, baseline_mse=baseline, r2=1.0 - mse / baseline if baseline > 0 else 0.0, mae=mae,
                boundary_error=block_size * mae)


def judge_update(judge_fn, params, optimizer, replay, steps, batch_size, loss_kind, gen, rt):
    """steps optimizer steps of the online judge on minibatches of the replay buffer (inputs, labels, and for a
    pairwise judge the inputs of each rollout's natural window) of the latest and earlier rollouts. judge_fn maps
    inputs to the judge's probs: its head on cached features when only the head trains, the whole judge on token
    ids when its trunk trains too. Gradients of params averaged over ranks. Returns the mean loss."""
    inputs, labels = torch.cat([r[0] for r in replay]), torch.cat([r[1] for r in replay])
    natural = torch.cat([r[2] for r in replay]) if loss_kind == 'pairwise' else None
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(inputs), (batch_size,), generator=gen).to(inputs.device)
        with rt.ctx:
            if natural is not None:  # each rollout against its prompt's natural window, through one forward
                out = judge_fn(torch.cat([inputs[rows], natural[rows]])).float()
                loss = pairwise_loss(out[batch_size:], out[:batch_size])
            else:
                loss = judge_loss(judge_fn(inputs[rows]).float(), labels[rows], loss_kind)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rt.ddp:
            for p in params:
                torch.distributed.all_reduce(p.grad)
                p.grad.div_(rt.world_size)
        optimizer.step()
        losses.append(loss.item())
    return float(np.mean(losses))


NGRAM_C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)  # the n-gram judge's L2 strengths fit_selected chooses among


class NgramJudge:
    """A judge outside the GPT form: the two-sample test's classifier (two_sample.py: a logistic regression on TF-IDF
    char 1-4-grams and word unigrams) on the text of a completion, refit from scratch on every update's natural and
    generated texts. Fitted on train-split text, as every judge is, its sight grows with its texts: the plateau base's
    samples at 0.65 on 1,000 a side, 0.75 on 10,000, where the GPT whole-window judge on 10,000 reads 0.71
    (docs/judges.md). It shares every feature with the two-sample test: that referee cannot rule on an arm that
    plays against it. Unfitted, it knows nothing: P(natural) 0.5 for every text."""

    def __init__(self, C=1.0):
        self.classifier, self.fitted_on, self.C = None, None, C  # C: inverse L2 strength (1: the referee's)

    def fit(self, natural_texts, sample_texts):
        """Refit on these texts; returns its log loss on them."""
        features, y = self._features(natural_texts, sample_texts)
        return self._fit_regression(features, y)

    def _features(self, natural_texts, sample_texts):
        """A fresh classifier's features fitted on these texts (the pipeline's own fit, in its two steps, so that
        the regression's fits reuse them), and their labels (natural 0)."""
        texts = np.array(list(natural_texts) + list(sample_texts), dtype=object)
        y = np.r_[np.zeros(len(natural_texts)), np.ones(len(sample_texts))]
        self.classifier = tfidf_classifier(C=self.C)
        self.fitted_on = (list(natural_texts), list(sample_texts))
        return self.classifier[:-1].fit_transform(texts, y), y

    def _fit_regression(self, features, y):
        """The regression at this judge's C on the features; its log loss on them."""
        from sklearn.metrics import log_loss
        self.classifier[-1].set_params(C=self.C).fit(features, y)
        return float(log_loss(y, self.classifier[-1].predict_proba(features)[:, 1], labels=[0, 1]))

    @classmethod
    def fit_selected(cls, natural, samples, held_natural, held_samples, grid=NGRAM_C_GRID):
        """The judge of the C in grid whose fit on (natural, samples) has the lowest log loss on held-out texts, each
        class weighed equally as in the fit: a convex fit's early stopping, chosen on train windows it never saw.
        The features are fitted once (they do not depend on C). Returns (the judge, {C: its held-out loss})."""
        judge = cls(grid[0])
        features, y = judge._features(natural, samples)
        held = [judge.classifier[:-1].transform(np.array(list(t), dtype=object)) for t in (held_natural, held_samples)]
        losses, best = {}, None
        for C in grid:
            judge.C = C
            judge._fit_regression(features, y)
            p_natural = [judge.classifier[-1].predict_proba(h)[:, 0] for h in held]
            losses[C] = float(np.mean([-np.log(np.clip(p_natural[0], 1e-12, 1)).mean(),
                                       -np.log(np.clip(1 - p_natural[1], 1e-12, 1)).mean()]))
            if best is None or losses[C] < losses[best]:
                best, regression = C, copy.deepcopy(judge.classifier[-1])  # fitted at C, kept
        judge.C = best
        judge.classifier.steps[-1] = (judge.classifier.steps[-1][0], regression)
        return judge, losses

    def p_natural(self, texts):
        if self.classifier is None:
            return np.full(len(texts), 0.5)
        return self.classifier.predict_proba(np.array(list(texts), dtype=object))[:, 0]

    def log_odds(self, texts):
        """log P(natural) - log P(synthetic) of each text (worth.log_odds: clipped as the game's reward clips)."""
        p = self.p_natural(texts)
        return log_odds(np.stack([p, 1 - p], axis=1))

    def save(self, path, tokenization):
        """The judge as a file (JSON, written atomically): the texts it was fitted on, the tokenization of the model
        whose windows they were decoded from, and the fitted features and regression, so that NgramJudge.load is
        the same judge without refitting (a refit on every train window and 16 negatives each takes minutes and
        about 6 GB: six games loading one judge ran out of 24 GiB)."""
        if self.fitted_on is None:
            raise ValueError("an unfitted n-gram judge knows nothing: there is nothing to save")
        natural, samples = self.fitted_on
        features = [dict(terms=sorted(v.vocabulary_, key=v.vocabulary_.get), idf=v.idf_.tolist())
                    for _, v in self.classifier[0].transformer_list]
        regression = self.classifier[-1]
        fitted = dict(features=features, coef=regression.coef_[0].tolist(), intercept=float(regression.intercept_[0]))

        def write(tmp):
            with open(tmp, 'w') as f:
                json.dump(dict(kind='ngram', tokenization=dict(tokenization), natural=natural, samples=samples,
                               C=self.C, fitted=fitted), f)
        write_atomic(path, write)

    @classmethod
    def load(cls, path):
        """The judge saved at path: its fitted features and regression restored (a file without them, from before
        they were saved, is refit on its texts: the fit is deterministic); its .tokenization is the one its texts
        were decoded with."""
        with open(path) as f:
            saved = json.load(f)
        if saved.get('kind') != 'ngram':
            raise ValueError(f"{path} is not an n-gram judge's file (NgramJudge.save writes one)")
        judge = cls(saved.get('C', 1.0))
        if 'fitted' in saved:
            judge._restore(saved['fitted'])
            judge.fitted_on = (saved['natural'], saved['samples'])
        else:
            judge.fit(saved['natural'], saved['samples'])
        tokenization = saved['tokenization']
        if tokenization.get('itos'):  # JSON's keys are strings: a char vocabulary's ids again
            tokenization['itos'] = {int(i): c for i, c in tokenization['itos'].items()}
        judge.tokenization = tokenization
        return judge

    def _restore(self, fitted):
        """The classifier as save wrote it: each vectorizer's terms in column order and idf, the regression's
        weights (sklearn's own setters and attributes: the transform and predict_proba of the fitted pipeline)."""
        self.classifier = tfidf_classifier(C=self.C)
        for (_, vectorizer), part in zip(self.classifier[0].transformer_list, fitted['features']):
            vectorizer.vocabulary_ = {term: i for i, term in enumerate(part['terms'])}
            vectorizer.idf_ = np.array(part['idf'])
        regression = self.classifier[-1]
        regression.coef_ = np.array([fitted['coef']])
        regression.intercept_ = np.array([fitted['intercept']])
        regression.classes_ = np.array([0.0, 1.0])
        regression.n_features_in_ = regression.coef_.shape[1]


def reward_data_cmd(model_path, data_dir, out_dir, max_blocks, samples_per_chunk, seed, device, temperature=1.0,
                    top_k=None, crossover_k=0, exclude_eval=None, select_blocks=0):
    """The prepare_reward_data.py call of a judge: the cycle's and the fresh judges' data are made the same way
    (crossover_k: every sample keeps that many natural tokens, the whole-window judges' data; 0: K drawn;
    exclude_eval: (samples, seed) of the evaluation, whose two-sample windows no val block may be; select_blocks:
    held-out train blocks the judge selects its checkpoint on; max_blocks None or 0: every block)."""
    return [os.path.join(ROOT, 'prepare_reward_data.py'), '--model_path', model_path, '--input_mode', 'binary',
            '--train_bin', os.path.join(data_dir, 'train.bin'), '--val_bin', os.path.join(data_dir, 'val.bin'),
            '--output_dir', out_dir] + (['--max_blocks', str(max_blocks)] if max_blocks else []) + [
            '--samples_per_chunk', str(samples_per_chunk),
            '--seed', str(seed), '--device', device, '--temperature', str(temperature), '--top_k', str(top_k)] \
        + (['--crossover_k', str(crossover_k)] if crossover_k else []) \
        + (['--exclude_eval_windows', str(exclude_eval[0]), '--eval_seed', str(exclude_eval[1])]
           if exclude_eval else []) + (['--select_blocks', str(select_blocks)] if select_blocks else [])


def reward_model_cmd(model_path, data_dir, out_path, seed, device, rm_args):
    """The train_reward_model.py call of a judge; rm_args is the recipe (options of train_reward_model.py)."""
    return [os.path.join(ROOT, 'train_reward_model.py'), f'--model_path={model_path}', f'--data_dir={data_dir}',
            f'--out_path={out_path}', f'--seed={seed}', f'--device={device}'] + list(rm_args)
