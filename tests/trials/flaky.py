"""A trial whose `mode` hyperparameter picks how it fails: "ok" trains, "raise" raises in init,
"nan" reports a NaN val_loss. LEARNING_RATE, when set, replaces the hyperparameter (1e30: the
training loss is non-finite within the first window). A linear fit of x.sum(1), full batch.
Used by test_runner.py (flaky_trial, diverging_trial)."""

import jax.numpy as jnp
import numpy as np
import optax

HYPERPARAMETERS = {"mode": "ok", "learning_rate": 0.05}
METRICS = ("val_loss",)
LEARNING_RATE = None  # a fixed learning rate in place of the hyperparameter's

def data(hp):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}

def init(hp, key, data):
    if hp["mode"] == "raise":
        raise RuntimeError("init exploded")
    return {"w": jnp.zeros(4)}

def optimizer(hp):
    return optax.sgd(hp["learning_rate"] if LEARNING_RATE is None else LEARNING_RATE)

def batch(hp, data, key):
    return data["x"], data["y"]

def loss(hp, params, batch, key):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)

def evaluate(hp, params, data):
    value = loss(hp, params, (data["x"], data["y"]), None)
    return {"val_loss": jnp.nan * value if hp["mode"] == "nan" else value}
