"""
What judges are worth in nats on a real base model, beside the known answers (worth.py): the Donsker-Varadhan bound
of each judge's log-odds on the evaluation's two-sample windows (natural val windows against the base's own
continuations of other val prompts, as evaluate.py draws them), with
  - a constant judge (worth 0),
  - each better model's exact log-ratio over the completion, log p_better - log p_base (worth its exact
    cross-entropy gap on these natural completions: the estimator's known answer at this size),
  - each reward model given (its log-odds, as evaluate.py --reward_model reads them).

  python benchmarks/bench_judge_worth.py --base BASE_V1.pt [--better TEACHER.pt,MLE.pt] [--judges RM.pt,...]
      [--dataset shakespeare_char] [--num_samples 1000] [--seed 1337]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data_loader import resolve_data_dir  # noqa: E402
from model import GPT  # noqa: E402
from tilt import completion_logprob, judge_log_odds  # noqa: E402
from two_sample import PROMPT_LEN, eval_windows  # noqa: E402
from worth import dv_bound, log_mean_exp  # noqa: E402


def row(name, f_natural, f_samples, seed, exact=None):
    b = dv_bound(f_natural, f_samples, seed)
    return (f"| {name} | {b['dv']:.2f} [{b['dv_ci'][0]:.2f}, {b['dv_ci'][1]:.2f}] | ×{b['dv_scale']:g} "
            f"(ESS {b['dv_ess']:.0f}) | {b['dv_at_scale_1']:.2f} | {log_mean_exp(f_samples):.2f} | "
            + (f"{exact:.2f}" if exact is not None else '–') + ' |')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--base', required=True)
    p.add_argument('--better', default='', help="comma-separated generators of the base's tokenization")
    p.add_argument('--judges', default='', help="comma-separated reward models")
    p.add_argument('--dataset', default='shakespeare_char')
    p.add_argument('--num_samples', type=int, default=1000)
    p.add_argument('--seed', type=int, default=1337)
    a = p.parse_args()
    t0 = time.time()
    torch.manual_seed(a.seed)
    base = GPT.from_checkpoint(a.base)
    val = np.memmap(os.path.join(resolve_data_dir(a.dataset), 'val.bin'), dtype=np.uint16, mode='r')
    natural, prompts = eval_windows(val, a.num_samples, base.config.block_size, a.seed)
    with torch.no_grad():
        samples = base.generate(prompts[:, :PROMPT_LEN], natural.shape[1] - PROMPT_LEN,
                                generator=torch.Generator().manual_seed(a.seed))
    print("| judge | DV, nats a window [95%] | its scale | DV at scale 1 | log E_base[e^f] (0 for an exact ratio) "
          "| exact cross-entropy gap |\n|---|---|---|---|---|---|")
    print(row('constant', np.zeros(len(natural)), np.zeros(len(samples)), a.seed))
    base_natural, base_samples = (completion_logprob(base, w, PROMPT_LEN) for w in (natural, samples))
    for path in filter(None, a.better.split(',')):
        better = GPT.from_checkpoint(path)
        f_natural = completion_logprob(better, natural, PROMPT_LEN) - base_natural
        f_samples = completion_logprob(better, samples, PROMPT_LEN) - base_samples
        print(row(f"exact log-ratio of {os.path.basename(path)}", f_natural, f_samples, a.seed, f_natural.mean()))
    for path in filter(None, a.judges.split(',')):
        judge = GPT.from_checkpoint(path)
        f_natural, f_samples = (judge_log_odds(judge, w, PROMPT_LEN) for w in (natural, samples))
        print(row(f"judge {os.path.relpath(path)}", f_natural, f_samples, a.seed))
    print(f"\n{a.num_samples} windows of {natural.shape[1]} tokens a side, {natural.shape[1] - PROMPT_LEN} of them "
          f"written; {time.time() - t0:.0f} s")


if __name__ == '__main__':
    main()
