"""A trial whose training window compiles for seconds (a loss with a big unrolled Python loop,
UNROLL iterations) while a step stays cheap: a signal can arrive mid-compile. A linear fit of
x.sum(1). Used by test_signals.py (slow_compile_trial)."""

import jax.numpy as jnp

from tests.trials.sum_fit import batch, data, evaluate, init, optimizer  # noqa: F401 (protocol functions it shares)

HYPERPARAMETERS = {"learning_rate": 0.05}
METRICS = ("val_loss",)
UNROLL = 200  # a big unrolled Python loop: the training window compiles for seconds

def loss(hp, params, batch, key):
    x, y = batch
    h = x @ params["w"]
    for i in range(UNROLL):
        h = h + 1e-4 * jnp.sin(h * (1 + i % 7))
    return jnp.mean((h - y) ** 2)
