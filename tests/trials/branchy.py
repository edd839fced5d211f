"""The digits MLP (trials.digits_mlp) with a loss that branches in Python on a float
hyperparameter (learning_rate): it cannot be traced, so sweep makes it a constant and says so.
Used by test_runner.py (branchy_trial)."""

from trials import digits_mlp as _base
from trials.digits_mlp import *  # noqa: F401,F403


def loss(hp, params, batch, key):
    # Python control flow on a float hyperparameter: it cannot be traced.
    scale = 2.0 if hp["learning_rate"] > 0.01 else 1.0
    return scale * _base.loss(hp, params, batch, key)
