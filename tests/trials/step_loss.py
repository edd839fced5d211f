"""tests/trials/linear.py (MARKERS off) with `loss(hp, params, batch, key, step)`: an L2 penalty on
the weights from step SWITCH_AT on (the step `loss` gets counts from 0), and a NaN loss at the
step the hyperparameter `nan_at` names (-1: never). Before SWITCH_AT, and with no `nan_at`, it
computes what linear.py does, bit for bit: a run of each shows where the step took effect.
"""

import jax
import jax.numpy as jnp

from tests.trials.linear import data, init, optimizer  # noqa: F401 (the trial protocol: linear.py's)

HYPERPARAMETERS = {"learning_rate": 0.05, "nan_at": -1}
METRICS = ("val_loss", "val_mae")
SWITCH_AT = 20  # the first step (as `loss` gets it) with the penalty


def batch(hp, data, key):  # defined here: a test rewrites its signature
    idx = jax.random.randint(key, (16,), 0, 48)
    return data["x_train"][idx], data["y_train"][idx]


def loss(hp, params, batch, key, step):
    x, y = batch
    mse = jnp.mean((x @ params["w"] + params["b"] - y) ** 2)
    penalty = jnp.where(step >= SWITCH_AT, jnp.sum(params["w"] ** 2), 0.0)
    return jnp.where(step == hp["nan_at"], jnp.nan, mse + penalty)


def evaluate(hp, params, data):
    error = data["x_val"] @ params["w"] + params["b"] - data["y_val"]
    return {"val_loss": jnp.mean(error ** 2), "val_mae": jnp.mean(jnp.abs(error))}
