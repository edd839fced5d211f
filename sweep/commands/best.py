"""The best checkpoint of a trial: its params, its test score, and `load_best` for notebooks."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints.remote import RemoteTier, open_remote
from sweep.errors import SweepError
from sweep.store import record
from sweep.store.record import DATA_SHAPES_ATTR, best_step, checkpoint_folder, metrics_at
from sweep.study import config as config_lib
from sweep.study.config import Config

if TYPE_CHECKING:  # the runner imports best_of_reports from here: keep the session out of its imports
    from sweep.store.session import Session

TEST_ATTR = record.TEST  # kept for readers of the best trial's test metrics


@dataclasses.dataclass(frozen=True)
class BestState:
    """A trial's best checkpoint, restored: the full training state and the trial's kind."""

    state: dict[str, Any]  # params, opt_state (optax types), step, key, train_loss_sum[, model_state]
    step: int
    value: float
    kind: Any  # sweep.trial.kinds: how params and model state map onto the trial's functions

    def variables(self) -> dict[str, Any]:
        """{"params": ..., <collection>: ...} as numpy: the form Flax's `apply` takes."""
        import jax
        import numpy as np

        return jax.tree.map(np.asarray, self.kind.variables(self.state["params"], self.state.get("model_state", {})))


def best_state(config: Config, trial: FrozenTrial, removed: str | None = None,
               remote: RemoteTier | None = None) -> BestState:
    """The trial's best checkpoint, checksum-verified, held against removal while it is read.

    Read-only: a damaged step is an error here; quarantine and fallback are for resuming.

    `remote`: the study's remote tier (`remote.open_remote`), read where the local folder lacks the step.

    Raises:
        CheckpointsRemoved: the study's disk budget removed them (`removed` says why).
    """
    from sweep.checkpoints.retention import reading
    from sweep.checkpoints.steps import kept_steps
    from sweep.train.state import initial_state  # the template the state was saved from

    step, value = best_step(trial, config.study.objective.direction)
    directory = checkpoint_folder(config, trial)
    if directory is None:
        raise SweepError(f"trial {trial.number} has no checkpoint_dir attribute: it was not run by sweep")
    # The template from the data's recorded shapes: an export or `load_best` needs no training data.
    fresh = initial_state(config, trial.number, config.hyperparameters(record.params_in_force(trial)), abstract=True,
                          data_shapes=trial.user_attrs.get(DATA_SHAPES_ATTR))
    if remote is not None and removed is None and step not in kept_steps(directory):
        # Not here (another host's study, a new machine): read it from the bucket, via a temp folder.
        with tempfile.TemporaryDirectory(prefix="sweep-remote-") as tmp:
            local = Path(tmp) / Path(directory).name
            local.mkdir()
            if step not in remote.steps(local.name):  # a fault reading the tier is raised, not taken for absence
                raise SweepError(f"trial {trial.number}: its best step {step} is neither in {directory} nor in "
                                 f"{remote.url}")
            remote.tier.fetch(local.name, step, local)
            return _restore(config, trial, local, step, value, fresh)
    with reading(Path(directory), trial.number, removed):
        return _restore(config, trial, Path(directory), step, value, fresh)


def _restore(config: Config, trial: FrozenTrial, directory: Path, step: int, value: float, fresh: Any) -> BestState:
    from sweep.checkpoints.folder import DamagedCheckpoint
    from sweep.train.state import trial_checkpoints

    ckpt = trial_checkpoints(config, trial.number, directory, read_only=True)
    try:
        if step not in ckpt.all_steps():
            raise SweepError(f"trial {trial.number}: its best step {step} is missing from {directory}")
        restored = ckpt.restore_verified(step, fresh.state)
        return BestState({**fresh.state, **restored}, step, value, fresh.kind)
    except DamagedCheckpoint as exc:
        raise SweepError(f"trial {trial.number}: its best checkpoint (step {step}) is damaged: {exc}") from None
    finally:
        ckpt.close()


def _jitted(fn_name: str, config: Config, hp: Mapping[str, Any], kind: Any) -> Any:
    """The trial's `fn_name` (evaluate, test) of (params, model state, data), jitted."""
    import jax

    fn = getattr(config.trial_module, fn_name)
    return jax.jit(lambda params, state, data: kind.call(fn, hp, params, state, data))


def best_test_metrics(session: Session) -> dict[str, Any] | None:
    """The best trial's test metrics from its best checkpoint; cached on the study, never retrained.

    None when no trial is complete or the trial module has no `test` function.
    """
    config = session.config
    best = session.best_trial()
    if best is None or not callable(getattr(config.trial_module, "test", None)):
        return None
    step, _ = best_step(best, config.study.objective.direction)
    cached = session.study_attrs().get(TEST_ATTR)
    if cached and cached.get("trial") == best.number and cached.get("step") == step:
        return cached
    from sweep.train.state import run_hyperparameters
    from sweep.trial.protocol import trial_data

    restored = best_state(config, best, remote=open_remote(session))
    hp = run_hyperparameters(config, config.hyperparameters(record.params_in_force(best)))
    metrics = _jitted("test", config, hp, restored.kind)(restored.state["params"],
                                                           restored.state.get("model_state", {}),
                                                           trial_data(config.trial_module, hp,
                                                                      config.study.data_timeout_seconds))
    result = {"trial": best.number, "step": restored.step, "metrics": {k: float(v) for k, v in metrics.items()}}
    session.set_study_attr(TEST_ATTR, result)
    return result


@dataclasses.dataclass(frozen=True)
class LoadedTrial:
    """A trial's best checkpoint, restored with its trial module.

    Flax linen: `loaded.model.apply(loaded.variables, x)`; NNX: `loaded.model(x)` (the module, in
    eval mode, holding the checkpoint's params and state).
    """

    number: int
    step: int
    value: float
    hyperparameters: dict[str, Any]
    state: dict[str, Any]  # params, opt_state (optax types), step, key, train_loss_sum[, model_state]
    model: Any  # linen: the trial module's model(hp) (None if it defines none); NNX: the module itself
    trial_module: Any
    variables: dict[str, Any]  # {"params": ..., <collection>: ...}, the form Flax's apply takes
    metrics: dict[str, float] | None  # every metric recorded at this step

    @property
    def params(self) -> Any:
        return self.state["params"]


def load_best(study_file: str | os.PathLike[str], trial: int | None = None) -> LoadedTrial:
    """Restore the full training state of a trial's best checkpoint (default: the study's best trial).

    Raises:
        SweepError: the study, the trial or its checkpoint does not exist.
    """
    from sweep.store.session import Session

    session = Session(config_lib.load(study_file))
    try:
        return load_trial(session, trial)
    finally:
        session.close()


def load_trial(session: Session, trial: int | None = None) -> LoadedTrial:
    """`load_best` of an (opened or not) session."""
    from sweep.train.state import run_hyperparameters

    config = session.open(create=False).config
    frozen = _pick(session, trial)
    restored = best_state(config, frozen, remote=open_remote(session))
    hp = config.hyperparameters(record.params_in_force(frozen))
    state = restored.state
    model = restored.kind.model(config.trial_module, run_hyperparameters(config, hp), state["params"],
                                state.get("model_state", {}))
    return LoadedTrial(frozen.number, restored.step, restored.value, hp, state, model, config.trial_module,
                       restored.variables(), metrics_at(frozen, restored.step, config.study.objective.metric))


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
