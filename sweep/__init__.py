"""sweep: hyperparameter sweeps with Optuna, JAX/Flax trials and Orbax checkpoints, resumable per trial."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_best", "load_export"]


def load_export(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, meta) of an exported trial (see `python -m sweep export`); needs no JAX."""
    from sweep.export_format import load_export as _load

    return _load(path)


def load_best(study_file: Any, trial: int | None = None) -> Any:
    """The full training state of a trial's best checkpoint (default: the study's best trial)."""
    from sweep.best import load_best as _load

    return _load(study_file, trial)
