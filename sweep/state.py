"""A trial's training state: the fresh one, which is also the template every restore reads into.

Loaders (export, `load_best`) build the template here without importing the training loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from sweep.checkpoints import TrialCheckpoints, WriteBudget
from sweep.config import Config
from sweep.kinds import PlainKind, kind_of

# Keys a checkpoint may lack (written before they existed); restored as their fresh value.
OPTIONAL_KEYS = ("train_loss_sum",)


class Fresh(NamedTuple):
    state: dict[str, Any]  # params, opt_state, step, key, train_loss_sum[, model_state]
    data: Any
    kind: PlainKind


def run_hyperparameters(config: Config, hp: Mapping[str, Any]) -> dict[str, Any]:
    """What the trial's functions get as `hp`: its hyperparameters plus the run's settings under
    "train.*" (read-only; e.g. `hp["train.steps"]` for a schedule's length)."""
    train = config.study.train
    return {**hp, "train.steps": train.steps, "train.eval_every": train.eval_every, "train.seed": train.seed,
            "train.devices": train.devices}


def trial_keys(config: Config, number: int) -> tuple[Any, Any]:
    """(init key, train key) of trial `number`: from the seed, and from the number unless the study
    gives every trial the same initialisation and data order (`train.same_seed_for_all_trials`)."""
    train = config.study.train
    key = jax.random.PRNGKey(train.seed)
    if not train.same_seed_for_all_trials:
        key = jax.random.fold_in(key, number)
    init_key, train_key = jax.random.split(key)
    return init_key, train_key


def initial_state(config: Config, number: int, hp: Mapping[str, Any]) -> Fresh:
    """The fresh training state of trial `number` (also the template to restore into), its data
    and its kind. `hp` are the trial's hyperparameters (`config.hyperparameters(params)`)."""
    module = config.trial_module
    hp = run_hyperparameters(config, hp)
    data = module.data(hp)
    tx = module.optimizer(hp)
    init_key, train_key = trial_keys(config, number)
    initial = module.init(hp, init_key, data)
    kind = kind_of(module, initial)
    params, model_state = kind.start(initial)
    state = {"params": params, "opt_state": tx.init(params), "step": np.zeros((), np.int32), "key": train_key,
             "train_loss_sum": np.zeros((), np.float32)}  # the training loss summed since the last evaluation
    if model_state:  # absent for params-only trials: their checkpoints keep their old layout
        state["model_state"] = model_state
    return Fresh(state, data, kind)


def trial_checkpoints(config: Config, number: int, directory: Path, budget: WriteBudget | None = None,
                      read_only: bool = False) -> TrialCheckpoints:
    """The checkpoint folder of trial `number` with the study's retention settings."""
    c, objective = config.study.checkpoint, config.study.objective
    return TrialCheckpoints(directory, objective.metric, objective.direction, c.keep_last, c.keep_best,
                            read_only=read_only, label=f"trial {number}", budget=budget,
                            optional_keys=OPTIONAL_KEYS)
