"""A trial's training state: the fresh one, which is also the template every restore reads into.

Loaders (export, `load_best`) build the template here without importing the training loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np

from sweep.checkpoints import TrialCheckpoints, WriteBudget
from sweep.config import Config


def initial_state(config: Config, number: int, hp: Mapping[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """(fresh training state, data, optimizer) of trial `number`; also the template to restore into."""
    module = config.trial_module
    data = module.data(hp)
    tx = module.optimizer(hp)
    init_key, train_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(config.study.train.seed), number))
    params = module.init(hp, init_key, data)
    return {"params": params, "opt_state": tx.init(params), "step": np.zeros((), np.int32), "key": train_key}, data, tx


def trial_checkpoints(config: Config, number: int, directory: Path, budget: WriteBudget | None = None,
                      read_only: bool = False) -> TrialCheckpoints:
    """The checkpoint folder of trial `number` with the study's retention settings."""
    c, objective = config.study.checkpoint, config.study.objective
    return TrialCheckpoints(directory, objective.metric, objective.direction, c.keep_last, c.keep_best,
                            read_only=read_only, label=f"trial {number}", budget=budget)
