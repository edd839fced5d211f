"""sweep: hyperparameter sweeps with Optuna, JAX/Flax trials and Orbax checkpoints, resumable per trial.

The public API is what this file exports; everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweep.errors import CheckpointsRemoved, ConfigError, DiskFault, Interrupted, StudyNotFound, SweepError, UsageError

if TYPE_CHECKING:
    from sweep.api import StudySession
    from sweep.commands.best import LoadedTrial

__version__ = "0.1.0"
__all__ = ["CheckpointsRemoved", "ConfigError", "DiskFault", "Interrupted", "LoadedTrial", "StudyNotFound",
           "StudySession", "SweepError", "UsageError", "epoch_batch", "load_best", "load_export", "load_variables", "open"]


def open(study: Any, *, import_trial: bool = True) -> StudySession:  # noqa: A001 (like io.open)
    """Validate a study (a study file's path, or its keys as a dict) and return its `StudySession`:
    `run()`, `status()`, `export(out)`, `plot(out)`, `load_best()`, `summary()`. `import_trial=False`:
    the trial module is imported only where a method needs it (`status()` and `plot()` never do).

    Raises:
        ConfigError: the study breaks a rule of the study file.
    """
    from sweep.api import open as _open

    return _open(study, import_trial=import_trial)


def load_export(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, meta) of an exported trial (see `python -m sweep export`); needs no JAX."""
    from sweep.commands.export_format import load_export as _load

    return _load(path)


def load_variables(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(variables, meta) of an exported trial: {"params": ..., "batch_stats": ...} for Flax's
    `model.apply(variables, x)`; needs no JAX."""
    from sweep.commands.export_format import load_variables as _load

    return _load(path)


def epoch_batch(key: Any, step: Any, size: int, batch_size: int) -> Any:
    """Indices of step `step`'s batch when every epoch visits all `size` examples once in a random
    order (a permutation per epoch, drawn from `key` and the epoch number; the last incomplete
    batch of an epoch is dropped). For `batch(hp, data, key, step)`; works on traced steps."""
    from sweep.trial.data import epoch_batch as _batch

    return _batch(key, step, size, batch_size)


def load_best(study_file: Any, trial: int | None = None) -> LoadedTrial:
    """The full training state of a trial's best checkpoint (default: the study's best trial)."""
    from sweep.commands.best import load_best as _load

    return _load(study_file, trial)


def __getattr__(name: str) -> Any:
    # Importing the session (Optuna, SQLAlchemy) and the trial types costs seconds: only on use.
    if name == "StudySession":
        from sweep.api import StudySession

        return StudySession
    if name == "LoadedTrial":
        from sweep.commands.best import LoadedTrial

        return LoadedTrial
    raise AttributeError(f"module 'sweep' has no attribute {name!r}")
