"""The digits MLP (trials.digits_mlp) that records which processes train: each training step
appends "<pid> <its CPU affinity>" to LOG in the current directory. Used by test_dask.py (which
processes trained: the cluster's workers, not the CLI) and test_workers.py (each worker's cores)."""

import os

import jax

from trials import digits_mlp
from trials.digits_mlp import HYPERPARAMETERS, METRICS, batch, data, evaluate, init, optimizer, test  # noqa: F401

LOG = "steps.txt"  # in the current directory, one line per training step

def _record():
    with open(LOG, "a") as fh:
        fh.write(f"{os.getpid()} {sorted(os.sched_getaffinity(0))}\n")

def loss(hp, params, batch, key):
    # When a step runs, not when it is traced (the CLI traces one step before any worker starts).
    jax.debug.callback(_record)
    return digits_mlp.loss(hp, params, batch, key)
