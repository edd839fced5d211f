"""A trial whose loss branches in Python on a float hyperparameter (`dropout`), as flax's
nn.Dropout does: the compiled window makes only that hyperparameter static. A linear fit of
x.sum(1). Used in-process by test_runner.py (dropout_trial_fb)."""

import jax
import jax.numpy as jnp

from tests.trials.sum_fit import batch, data, evaluate, init, optimizer  # noqa: F401 (protocol functions it shares)

HYPERPARAMETERS = {"learning_rate": 0.05, "dropout": 0.0}
METRICS = ("val_loss",)

def loss(hp, params, batch, key):
    x, y = batch
    if hp["dropout"] > 0:  # a Python branch on a float hyperparameter, as flax's nn.Dropout has
        x = x * jax.random.bernoulli(key, 1 - hp["dropout"], x.shape) / (1 - hp["dropout"])
    return jnp.mean((x @ params["w"] - y) ** 2)
