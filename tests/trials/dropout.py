"""A trial whose loss branches in Python on a float hyperparameter (`dropout`), as flax's
nn.Dropout does: the compiled window makes only that hyperparameter static. A linear fit of
x.sum(1). Used in-process by test_runner.py (dropout_trial_fb)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

HYPERPARAMETERS = {"learning_rate": 0.05, "dropout": 0.0}
METRICS = ("val_loss",)

def data(hp):
    x = np.random.RandomState(0).normal(size=(64, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}

def init(hp, key, data):
    return {"w": jnp.zeros(4)}

def optimizer(hp):
    return optax.sgd(hp["learning_rate"])

def batch(hp, data, key):
    return data["x"], data["y"]

def loss(hp, params, batch, key):
    x, y = batch
    if hp["dropout"] > 0:  # a Python branch on a float hyperparameter, as flax's nn.Dropout has
        x = x * jax.random.bernoulli(key, 1 - hp["dropout"], x.shape) / (1 - hp["dropout"])
    return jnp.mean((x @ params["w"] - y) ** 2)

def evaluate(hp, params, data):
    return {"val_loss": jnp.mean((data["x"] @ params["w"] - data["y"]) ** 2)}
