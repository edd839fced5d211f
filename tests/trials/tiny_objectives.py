"""A tiny trial with two competing metrics: a quadratic fit whose val_loss falls as `hidden`
(its n_params) grows. Seconds per trial; copied beside the study file by tests/test_objectives.py."""

import jax
import jax.numpy as jnp
import optax

HYPERPARAMETERS = {"x": 0.5, "hidden": 8, "learning_rate": 0.1}
METRICS = ("val_loss", "n_params")


def data(hp):
    return {"target": jnp.arange(4, dtype=jnp.float32) / 4}


def init(hp, key, data):
    return {"w": jax.random.normal(key, (4,))}


def optimizer(hp):
    return optax.sgd(hp["learning_rate"])


def batch(hp, data, key):
    return data["target"] + 0.01 * jax.random.normal(key, (4,))


def loss(hp, params, batch, key):
    return jnp.mean((params["w"] - batch) ** 2)


def evaluate(hp, params, data):
    fit = jnp.mean((params["w"] - data["target"]) ** 2)
    return {"val_loss": fit + (hp["x"] - 0.3) ** 2 + 1.0 / hp["hidden"], "n_params": jnp.float32(hp["hidden"])}
