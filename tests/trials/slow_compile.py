"""A trial whose training window compiles for seconds (a loss with a big unrolled Python loop,
UNROLL iterations) while a step stays cheap: a signal can arrive mid-compile. A linear fit of
x.sum(1). Used by test_signals.py (slow_compile_trial)."""

import jax.numpy as jnp
import numpy as np
import optax

HYPERPARAMETERS = {"learning_rate": 0.05}
METRICS = ("val_loss",)
UNROLL = 200  # a big unrolled Python loop: the training window compiles for seconds

def data(hp):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}

def init(hp, key, data):
    return {"w": jnp.zeros(4)}

def optimizer(hp):
    return optax.sgd(hp["learning_rate"])

def batch(hp, data, key):
    return data["x"], data["y"]

def loss(hp, params, batch, key):
    x, y = batch
    h = x @ params["w"]
    for i in range(UNROLL):
        h = h + 1e-4 * jnp.sin(h * (1 + i % 7))
    return jnp.mean((h - y) ** 2)

def evaluate(hp, params, data):
    return {"val_loss": jnp.mean((data["x"] @ params["w"] - data["y"]) ** 2)}
