"""A trial module (BASE: the digits MLP, trials.digits_mlp, unless a test sets another; a test writes
it with conftest.gated_trial) that a test can hold: while the file HOLD exists, a process waits at
its AT-th evaluation (and at every later one) until HOLD is removed. A test that saves before that
evaluation knows each process is held mid-trial with a committed step: it cannot finish the trial
before the test has seen what it waits for (a step in the bucket, a step of every trial) and
killed or signalled it, however slow or loaded the machine. Removing HOLD lets the trials go on
(after a SIGTERM: to their stop); a file HOLD.<pid> lets that process alone go on. Numbers are
those of BASE: the wait is a host callback that returns nothing. A relative HOLD is the current
directory's, so a process started elsewhere (another "node") is never held. An evaluation is a
call of BASE's `evaluate`: one per evaluation step for the digits trials (a streaming trial's
evaluate runs once per validation batch)."""

import importlib
import os
import time
from pathlib import Path

import jax

BASE = "trials.digits_mlp"  # the trial module this one is, but for the hold
_base = importlib.import_module(BASE)
globals().update({k: v for k, v in vars(_base).items() if not k.startswith("__") and k != "evaluate"})

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
    return _base.evaluate(hp, params, data)
