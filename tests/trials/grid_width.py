"""A linear fit whose integer hyperparameter `width` shapes the parameters: each width compiles
programs of its own. Used in-process by test_compiled.py (a grid study over widths)."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.trials.sum_fit import batch, optimizer  # noqa: F401 (protocol functions it shares)

HYPERPARAMETERS = {"learning_rate": 0.05, "width": 2}
METRICS = ("val_loss",)

def data(hp):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}

def init(hp, key, data):
    return {"w": 0.01 * jax.random.normal(key, (4, hp["width"])), "v": jnp.ones((hp["width"],))}

def loss(hp, params, batch, key):
    x, y = batch
    return jnp.mean((x @ params["w"] @ params["v"] - y) ** 2)

def evaluate(hp, params, data):
    return {"val_loss": loss(hp, params, (data["x"], data["y"]), None)}
