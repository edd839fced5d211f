"""A tiny linear regression (4 weights and a bias, 64 rows): a trial step takes microseconds, so a
study of it takes seconds. The trial of the in-process tests: test_api.py (which other files derive
their variants from, as test_api.TRIAL_SOURCE) and conftest.make_study (with MARKERS on and
METRICS ("val_loss",)), each written under a name of its own beside the study.

MARKERS: files in the current directory steer evaluation: `fault` makes the next one raise (and is
removed, so a retry succeeds), `nan` makes every val_loss NaN, `hold` holding a number N makes the
process's N-th evaluation (and later ones) wait while it exists, after creating `held` (a test kills
the process there: mid-trial, past a save, on any machine). Without the files the values are those
of MARKERS = False, so a run with a fault compares bit for bit with one without.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

HYPERPARAMETERS = {"learning_rate": 0.05}
METRICS = ("val_loss", "val_mae")
MARKERS = False  # the marker files `fault` and `nan` steer evaluation (a host callback in it)
VIEW = None  # a file name: data() writes there, as JSON, what the process looks like to the code it runs


def _view(path):
    """argv, folder, sys.path's head, the main module, the host name sweep read at its import, an
    environment variable, stdin and the parent: tests/test_zygote.py compares a CLI process forked
    by the tests' fork server with an exec'd one."""
    import json
    import sys
    import threading

    import sweep.store.claims

    main = sys.modules["__main__"]
    view = {"argv": sys.argv, "cwd": os.getcwd(), "path_head": sys.path[:2],
            "main": [main.__spec__.name if main.__spec__ else None, getattr(main, "__file__", None)],
            "host": sweep.store.claims.HOST, "marker": os.environ.get("SWEEP_VIEW_MARKER"),
            "stdin": os.path.realpath("/proc/self/fd/0"), "ppid": os.getppid(),
            "python_threads": len(threading.enumerate())}
    with open(path, "w") as f:
        json.dump(view, f)


def data(hp):
    if VIEW:
        _view(VIEW)
    rng = np.random.RandomState(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1 * rng.normal(size=64).astype(np.float32)
    return {"x_train": x[:48], "y_train": y[:48], "x_val": x[48:], "y_val": y[48:]}


def init(hp, key, data):
    return {"w": 0.01 * jax.random.normal(key, (4,)), "b": jnp.zeros(())}


def optimizer(hp):
    return optax.sgd(hp["learning_rate"])


def batch(hp, data, key):
    idx = jax.random.randint(key, (16,), 0, 48)
    return data["x_train"][idx], data["y_train"][idx]


def loss(hp, params, batch, key):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


_evaluations = [0]  # of this process


def _scale(_):
    _evaluations[0] += 1
    if os.path.exists("hold") and _evaluations[0] >= int(open("hold").read() or 1):
        open("held", "w").close()
        while os.path.exists("hold"):
            time.sleep(0.05)
    if os.path.exists("fault"):
        os.remove("fault")
        raise RuntimeError("transient fault")
    return np.asarray(np.nan if os.path.exists("nan") else 1.0, np.float32)


def evaluate(hp, params, data):
    error = data["x_val"] @ params["w"] + params["b"] - data["y_val"]
    val_loss = jnp.mean(error ** 2)
    if MARKERS:
        val_loss = jax.pure_callback(_scale, jax.ShapeDtypeStruct((), jnp.float32), params["b"]) * val_loss
    return {"val_loss": val_loss, "val_mae": jnp.mean(jnp.abs(error))}
