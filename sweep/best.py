"""The best checkpoint of a trial: its params, its test score, and `load_best` for notebooks."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from optuna.trial import FrozenTrial, TrialState

from sweep import config as config_lib
from sweep.config import Config
from sweep.errors import SweepError

if TYPE_CHECKING:  # the runner imports best_of_reports from here: keep the session out of its imports
    from sweep.session import Session

TEST_ATTR = "best_test"  # study user attribute: the best trial's test metrics, computed once


def best_of_reports(values: Mapping[int, float], direction: str | int) -> tuple[int, float] | None:
    """(step, value) of the best reported evaluation, the earliest on ties; None if nothing reported.

    `direction`: "minimize" / "maximize", or its sign (+1 / -1). The one definition of a trial's
    best step: the loop, status, export and the plots all use it.
    """
    if not values:
        return None
    sign = direction if isinstance(direction, int) else config_lib.sign(direction)
    step = min(values, key=lambda s: (sign * values[s], s))
    return step, values[step]


def best_step(trial: FrozenTrial, direction: str) -> tuple[int, float]:
    """(best_step, best_value) of a finished trial: its user attributes, else its reports."""
    if "best_step" in trial.user_attrs:
        return int(trial.user_attrs["best_step"]), float(trial.user_attrs["best_value"])
    best = best_of_reports(trial.intermediate_values, direction)
    if best is None:
        raise SweepError(f"trial {trial.number} has no evaluation")
    return best


def best_state(config: Config, trial: FrozenTrial) -> tuple[dict[str, Any], int, float]:
    """(full training state, best_step, best_value) from the trial's best checkpoint, checksum-verified.

    Read-only: a damaged step is an error here; quarantine and fallback are for resuming.
    """
    from sweep.checkpoints import DamagedCheckpoint
    from sweep.state import initial_state, trial_checkpoints  # the template the state was saved from

    step, value = best_step(trial, config.study.objective.direction)
    directory = trial.user_attrs.get("checkpoint_dir")
    if directory is None:
        raise SweepError(f"trial {trial.number} has no checkpoint_dir attribute: it was not run by sweep")
    template, _, _ = initial_state(config, trial.number, config.hyperparameters(trial.params))
    ckpt = trial_checkpoints(config, trial.number, Path(directory), read_only=True)
    try:
        if step not in ckpt.all_steps():
            raise SweepError(f"trial {trial.number}: its best step {step} is missing from {directory}")
        return ckpt.restore_verified(step, template), step, value
    except DamagedCheckpoint as exc:
        raise SweepError(f"trial {trial.number}: its best checkpoint (step {step}) is damaged: {exc}") from None
    finally:
        ckpt.close()


def best_params(config: Config, trial: FrozenTrial) -> tuple[Any, int, float]:
    """(params as numpy, best_step, best_value) from the trial's best checkpoint, checksum-verified."""
    import jax
    import numpy as np

    state, step, value = best_state(config, trial)
    return jax.tree.map(np.asarray, state["params"]), step, value


def _jitted(fn_name: str, config: Config, hp: Mapping[str, Any]) -> Any:
    import jax

    fn = getattr(config.trial_module, fn_name)
    return jax.jit(lambda params, data: fn(hp, params, data))


def best_test_metrics(session: Session) -> dict[str, Any] | None:
    """The best trial's test metrics from its best checkpoint; cached on the study, never retrained.

    None when no trial is complete or the trial module has no `test` function.
    """
    config, study = session.config, session.study
    best = session.best_trial()
    if best is None or not callable(getattr(config.trial_module, "test", None)):
        return None
    step, _ = best_step(best, config.study.objective.direction)
    cached = study.user_attrs.get(TEST_ATTR)
    if cached and cached.get("trial") == best.number and cached.get("step") == step:
        return cached
    params, step, _ = best_params(config, best)
    hp = config.hyperparameters(best.params)
    metrics = _jitted("test", config, hp)(params, config.trial_module.data(hp))
    result = {"trial": best.number, "step": step, "metrics": {k: float(v) for k, v in metrics.items()}}
    study.set_user_attr(TEST_ATTR, result)
    return result


@dataclasses.dataclass(frozen=True)
class LoadedTrial:
    """A trial's best checkpoint, restored with its trial module: `model.apply({"params": params}, x)`."""

    number: int
    step: int
    value: float
    hyperparameters: dict[str, Any]
    state: dict[str, Any]  # params, opt_state (optax types), step, key
    model: Any  # the trial module's model(hp), or None if it defines none
    trial_module: Any

    @property
    def params(self) -> Any:
        return self.state["params"]


def load_best(study_file: str | os.PathLike[str], trial: int | None = None) -> LoadedTrial:
    """Restore the full training state of a trial's best checkpoint (default: the study's best trial).

    Raises:
        SweepError: the study, the trial or its checkpoint does not exist.
    """
    from sweep.session import Session

    session = Session(config_lib.load(study_file))
    try:
        return load_trial(session, trial)
    finally:
        session.close()


def load_trial(session: Session, trial: int | None = None) -> LoadedTrial:
    """`load_best` of an (opened or not) session."""
    config = session.open(create=False).config
    frozen = _pick(session, trial)
    state, step, value = best_state(config, frozen)
    hp = config.hyperparameters(frozen.params)
    model_fn = getattr(config.trial_module, "model", None)
    return LoadedTrial(frozen.number, step, value, hp, state, model_fn(hp) if callable(model_fn) else None,
                       config.trial_module)


def _pick(session: Session, number: int | None) -> FrozenTrial:
    name = session.config.name
    if number is None:
        best = session.best_trial()
        if best is None:
            raise SweepError(f"study {name!r} has no complete trial yet")
        return best
    for t in session.trials():
        if t.number == number:
            if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                raise SweepError(f"trial {number} is {t.state.name}, not finished")
            return t
    raise SweepError(f"study {name!r} has no trial {number}")
