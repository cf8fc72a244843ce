"""
Experiment tracking as nanoGPT and TRL users expect it: Weights & Biases with nanoGPT's own settings (wandb_log,
wandb_project, wandb_run_name; WANDB_MODE=offline works without a network) and TensorBoard scalars
(torch.utils.tensorboard). Each backend is imported only when it is switched on. The trainers log the same keys as
their JSONL logs; run_cycles.py groups one cycle run's stages under one wandb group and one TensorBoard directory.
"""

import math
import numbers
import os

from configurator import config_defaults

# the settings every trainer takes (plain config globals, overridable with --key=value)
TRACKING_DEFAULTS = dict(
    wandb_log=False,  # log to Weights & Biases (offline without a network: WANDB_MODE=offline)
    wandb_project='selfplay-gpt',
    wandb_run_name='',  # '' : the script's name and its output's
    wandb_group='',  # runs of one cycle run share a group (run_cycles.py sets it)
    tensorboard_log=False,  # TensorBoard scalars
    tensorboard_dir='',  # '' : a 'tensorboard' folder beside the run's output
)


class Tracker:
    """Logs rows of scalars (a dict per step) to the switched-on backends; a no-op when none is on, or off rank 0.
    Non-numeric and None values are skipped: a row keeps the keys of the JSONL log that have a number.
    A resumed run (resume_step: the step it continues from) continues its wandb run (the id kept in
    <default_dir>/<name>.wandb_id) and its TensorBoard steps (events from resume_step on are purged, so the steps
    it runs again are not written twice); a fresh run starts a new wandb run."""

    def __init__(self, C, default_name, default_dir, master=True, resume_step=None):
        self.wandb_run = self.writer = None
        if not master:
            return
        name = C.wandb_run_name or default_name
        if C.wandb_log:
            try:
                import wandb
            except ImportError:
                raise ImportError("wandb_log=True needs the wandb package: pip install wandb") from None
            run_id = wandb_run_id(os.path.join(default_dir, name.replace('/', '_') + '.wandb_id'), resume_step)
            self.wandb_run = wandb.init(project=C.wandb_project, name=name, group=C.wandb_group or None,
                                        dir=os.path.abspath(default_dir), config=config_defaults(vars(C)),
                                        id=run_id, resume='allow')
        if C.tensorboard_log:
            from torch.utils.tensorboard import SummaryWriter
            logdir = C.tensorboard_dir or os.path.join(default_dir, 'tensorboard', name.replace('/', '_'))
            os.makedirs(logdir, exist_ok=True)
            self.writer = SummaryWriter(log_dir=logdir, purge_step=resume_step)

    def log(self, row, step):
        scalars = {k: float(v) for k, v in row.items()
                   if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)}
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=int(step))
        if self.writer is not None:
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, int(step))

    def close(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.writer is not None:
            self.writer.close()


def wandb_run_id(path, resume_step):
    """The wandb run id of a run: the one kept in path when the run resumes, else a new one, kept there."""
    if resume_step is not None and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip()
    import uuid
    run_id = uuid.uuid4().hex[:16]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(run_id)
    return run_id


def tracking_args(C, stage):
    """The tracking options run_cycles.py passes to a stage's trainer: the cycle run's settings, its group, and a run
    name per stage."""
    if not (C.wandb_log or C.tensorboard_log):
        return []
    group = C.wandb_group or C.wandb_run_name or os.path.basename(os.path.abspath(C.out_dir))
    args = [f'--wandb_run_name={group}/{stage}']
    if C.wandb_log:
        args += ['--wandb_log=True', f'--wandb_project={C.wandb_project}', f'--wandb_group={group}']
    if C.tensorboard_log:
        root = os.path.abspath(C.tensorboard_dir or os.path.join(C.out_dir, 'tensorboard'))
        args += ['--tensorboard_log=True', f'--tensorboard_dir={os.path.join(root, stage)}']
    return args
