"""The digits MLP (trials.digits_mlp) that a test can hold: while the file HOLD exists, a process
waits at its AT-th evaluation (and at every later one) until HOLD is removed. A test that saves
before that evaluation knows each process is held mid-trial with a committed step: it cannot
finish the trial before the test has seen what it waits for (a step in the bucket, a step of
every trial) and killed or signalled it, however slow or loaded the machine. Removing HOLD lets
the trials go on (after a SIGTERM: to their stop); a file HOLD.<pid> lets that process alone go on. Numbers are those of trials.digits_mlp: the
wait is a host callback that returns nothing. A relative HOLD is the current directory's, so a
process started elsewhere (another "node") is never held."""

import os
import time
from pathlib import Path

import jax

from trials import digits_mlp
from trials.digits_mlp import HYPERPARAMETERS, METRICS, batch, data, init, loss, optimizer, test  # noqa: F401

HOLD = "hold"
AT = 3  # the evaluation of this process that waits first (1: the first); eval_every x AT > every_steps

# A host callback with the CPU client's asynchronous dispatch can hang the process for good
# (jax-ml/jax#25861, open; tests/trials/digits_recording.py); synchronous dispatch computes the same.
jax.config.update("jax_cpu_enable_async_dispatch", False)

_evaluations = [0]  # of this process, run (not traced)


def _wait() -> None:
    _evaluations[0] += 1
    while _evaluations[0] >= AT and Path(HOLD).exists() and not Path(f"{HOLD}.{os.getpid()}").exists():
        time.sleep(0.05)


def evaluate(hp, params, data):
    jax.debug.callback(_wait)  # when an evaluation runs, not when it is traced
    return digits_mlp.evaluate(hp, params, data)
