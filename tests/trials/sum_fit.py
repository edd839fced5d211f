"""The pieces the tiny test trials share: a linear fit of x.sum(1) on 64 seeded rows of 4 features,
trained with plain SGD on the whole set as one batch. A trial module here imports what it does not
change (`from tests.trials.sum_fit import ...`); the repository root is on the path of every test
process and CLI subprocess (pyproject's pythonpath, conftest.cli_env)."""

import jax.numpy as jnp
import numpy as np
import optax


def data(hp):
    x = np.random.RandomState(0).normal(size=(64, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}


def init(hp, key, data):
    return {"w": jnp.zeros(4)}


def optimizer(hp):
    return optax.sgd(hp["learning_rate"])


def batch(hp, data, key):
    return data["x"], data["y"]


def evaluate(hp, params, data):
    return {"val_loss": jnp.mean((data["x"] @ params["w"] - data["y"]) ** 2)}
