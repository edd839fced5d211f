"""A trial whose process fails at its third evaluation (step 150 at eval_every 50): a transient
fault, so a retry from the newest checkpoint succeeds. HANG_MARKER, when set (a path), makes that
evaluation create the file and sleep 120 s instead: a trial stuck mid-training. A linear fit of
x.sum(1). Used by test_runner.py (first_attempt_fails, stuck_trial)."""

import time

import jax
import jax.numpy as jnp
import numpy as np

from tests.trials.sum_fit import optimizer  # noqa: F401 (protocol functions it shares)

HYPERPARAMETERS = {"learning_rate": 0.05}
METRICS = ("val_loss",)
HANG_MARKER = None  # a path: the third evaluation creates it and hangs instead of raising
_evaluations = [0]

def _count(_):
    _evaluations[0] += 1
    if _evaluations[0] == 3:  # the third evaluation of this process: a transient fault
        if HANG_MARKER is None:
            raise RuntimeError("transient fault")
        open(HANG_MARKER, "w").close()
        time.sleep(120)

def data(hp):
    x = np.random.RandomState(0).normal(size=(256, 4)).astype(np.float32)
    return {"x": x, "y": x.sum(1)}

def init(hp, key, data):
    return {"w": 0.01 * jax.random.normal(key, (4,))}

def batch(hp, data, key):
    idx = jax.random.randint(key, (32,), 0, 256)
    return data["x"][idx], data["y"][idx]

def loss(hp, params, batch, key):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)

def evaluate(hp, params, data):
    value = loss(hp, params, (data["x"], data["y"]), None)
    jax.debug.callback(_count, value)
    return {"val_loss": value}
