"""A trial with two optimizers, each with a hyperparameter of its own (sgd: momentum, adam: b1):
the digits MLP of trials.digits_mlp with its own `optimizer`. Also a define-by-run
`search_space(trial)`, used when a study file has no search_space. Copied beside the study file
by tests/test_search.py (a user's own module, found on the current directory)."""

from __future__ import annotations

import optax

from trials.digits_mlp import METRICS, batch, data, evaluate, init, loss  # noqa: F401

HYPERPARAMETERS = {"learning_rate": 1e-2, "hidden": 32, "depth": 1, "optimizer": "adam", "batch_size": 32,
                   "momentum": 0.0, "b1": 0.9}


def optimizer(hp):
    if hp["optimizer"] == "sgd":
        return optax.sgd(hp["learning_rate"], momentum=hp["momentum"])
    return optax.adam(hp["learning_rate"], b1=hp["b1"])


def search_space(trial):
    """Optuna's define-by-run API: momentum only for sgd, b1 only for adam."""
    name = trial.suggest_categorical("optimizer", ["sgd", "adam"])
    trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True)
    if name == "sgd":
        trial.suggest_float("momentum", 0.5, 0.99)
    else:
        trial.suggest_float("b1", 0.8, 0.95)
