"""The digits MLP (trials.digits_mlp) that a test can hold at an evaluation: while a file HOLD exists
in the current directory and a step >= AFTER is committed under it (runs/*/checkpoints/trial_*/),
each evaluation waits, so the process cannot finish the trial before the test has seen what it
waits for (an upload, a lease) and killed it. Numbers are those of trials.digits_mlp: the wait is a
host callback that returns nothing. Used by test_clusters (a node held once its step is local)."""

import time
from pathlib import Path

import jax

from trials import digits_mlp
from trials.digits_mlp import HYPERPARAMETERS, METRICS, batch, data, init, loss, optimizer, test  # noqa: F401

HOLD = "hold"  # in the current directory: a process started elsewhere is never held
AFTER = 20000  # hold once a committed step >= AFTER is under the current directory

# A host callback with the CPU client's asynchronous dispatch can hang the process for good
# (jax-ml/jax#25861, open; tests/trials/digits_recording.py); synchronous dispatch computes the same.
jax.config.update("jax_cpu_enable_async_dispatch", False)


def _committed() -> bool:
    return any(int(p.name) >= AFTER for p in Path("runs").glob("*/checkpoints/trial_*/*") if p.name.isdigit())


def _wait() -> None:
    while Path(HOLD).exists() and _committed():
        time.sleep(0.05)


def evaluate(hp, params, data):
    # When an evaluation runs, not when it is traced.
    jax.debug.callback(_wait)
    return digits_mlp.evaluate(hp, params, data)
