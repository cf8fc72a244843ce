"""The one early-stopping rule of the project, used by train.py, train_reward_model.py, train_grpo.py and the cycles."""


class EarlyStopping:
    """
    Stop after `patience` evaluations in a row without an improvement of at least `min_delta` over the best value
    so far. mode='min' for losses, 'max' for rewards. patience=0 disables stopping (the best is still tracked).
    """

    def __init__(self, patience=0, min_delta=0.0, mode='min'):
        assert mode in ('min', 'max') and patience >= 0 and min_delta >= 0
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.best = None
        self.bad_evals = 0

    def step(self, value):
        """Record one evaluation; returns True when it is a new best by at least min_delta."""
        value = float(value)
        gain = None if self.best is None else (self.best - value if self.mode == 'min' else value - self.best)
        if gain is None or (gain > 0 and gain >= self.min_delta):
            self.best = value
            self.bad_evals = 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self):
        return self.patience > 0 and self.bad_evals >= self.patience

    def state_dict(self):
        return {'best': self.best, 'bad_evals': self.bad_evals}

    def load_state_dict(self, state):
        self.best, self.bad_evals = state['best'], state['bad_evals']
