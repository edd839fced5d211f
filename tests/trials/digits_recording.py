"""The digits MLP (trials.digits_mlp) that records which processes train: each training step
appends "<pid> <its CPU affinity>" to LOG in the current directory. Used by test_dask.py (which
processes trained: the cluster's workers, not the CLI) and test_workers.py (each worker's cores)."""

import os

import jax

from trials import digits_mlp
from trials.digits_mlp import HYPERPARAMETERS, METRICS, batch, data, evaluate, init, optimizer, test  # noqa: F401

LOG = "steps.txt"  # in the current directory, one line per training step

# A host callback in every step, with the CPU client's asynchronous dispatch, can hang the process
# for good (jax-ml/jax#25861, open): seen once in CI as a Dask worker that stopped heartbeating
# mid-trial. Synchronous dispatch computes the same numbers; only this test trial needs it.
jax.config.update("jax_cpu_enable_async_dispatch", False)

def _record():
    with open(LOG, "a") as fh:
        fh.write(f"{os.getpid()} {sorted(os.sched_getaffinity(0))}\n")

def loss(hp, params, batch, key):
    # When a step runs, not when it is traced (the CLI traces one step before any worker starts).
    jax.debug.callback(_record)
    return digits_mlp.loss(hp, params, batch, key)
