"""What the Python API returns, typed: `StudySession.status()` (the `status --json` object) and
`StudySession.export()` (export's index.json, each entry its trial's meta.json). TypedDicts, not
dataclasses: the objects are the JSON documents themselves, unchanged (every field, and its
meaning: docs/reference.md); a key marked NotRequired is there only where its feature is on.
"""

# No `from __future__ import annotations` here: TypedDict reads NotRequired from the evaluated
# annotations (Python 3.11).
from typing import Any, NotRequired, Optional, TypedDict


class TrialStatus(TypedDict):
    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, INTERRUPTED, PAUSED, WAITING
    params: dict[str, Any]
    value: Optional[float]
    best_step: Optional[int]
    best_value: Optional[float]
    last_step: Optional[int]
    rung: Optional[int]
    paused_at: Optional[list[int]]
    promoted_at: Optional[list[int]]
    checkpoint_dir: Optional[str]
    checkpoints_removed: Optional[str]
    resumes: int
    continued_from: Optional[dict[str, Any]]
    devices: Optional[list[str]]
    metrics: Optional[dict[str, float]]
    train_loss: Optional[float]
    compiles: Optional[dict[str, Any]]
    ledger: Optional[dict[str, float]]
    checkpoint_interval: Optional[dict[str, float]]
    feasible: NotRequired[Optional[bool]]  # with constraints
    values: NotRequired[Optional[dict[str, float]]]  # with several objectives
    pareto: NotRequired[bool]  # with several objectives
    remote_step: NotRequired[Optional[int]]  # with checkpoint.remote
    checkpoint_auto: NotRequired[Optional[dict[str, Optional[float]]]]  # with checkpoint every: auto
    lineage: NotRequired[list[dict[str, Any]]]  # with scheduler pbt: its exploits (sweep/schedulers/pbt.py)
    params_in_force: NotRequired[dict[str, Any]]  # with scheduler pbt: the params it trains with now
    # with scheduler freeze_thaw: the prediction it last went on by (sweep/schedulers/freeze_thaw.py)
    freeze_thaw: NotRequired[Optional[dict[str, float]]]


class StudyStatus(TypedDict):
    study: str
    storage: str  # its password masked
    n_trials: int
    metric: str
    direction: str
    objectives: NotRequired[list[dict[str, Any]]]  # with several objectives
    trials: list[TrialStatus]
    ledger: Optional[dict[str, float]]
    continued: dict[str, str]


class ExportEntry(TypedDict):
    number: int
    dir: str
    state: str
    hyperparameters: dict[str, Any]
    params: dict[str, Any]
    metric: str
    best_step: int
    best_value: float
    last_step: int
    metrics: dict[str, float]
    feasible: NotRequired[Optional[bool]]  # with constraints
    pareto: NotRequired[bool]  # with several objectives
    values: NotRequired[Optional[dict[str, float]]]  # with several objectives
    train_loss: Optional[float]
    collections: list[str]
    continued_from: NotRequired[dict[str, Any]]  # a trial of a companion study (`continue`)
    lineage: NotRequired[list[dict[str, Any]]]  # with scheduler pbt: its exploits (sweep/schedulers/pbt.py)
    freeze_thaw: NotRequired[Optional[dict[str, float]]]  # with scheduler freeze_thaw: as in status
    trial_module: str
    trial_source_sha256: str
    trial_source_file: str
    trial_code_sha256: str
    trial_code_files: dict[str, str]
    trial_code_recorded: bool
    versions: dict[str, str]


class ExportIndex(TypedDict):
    study: str
    metric: str
    direction: str
    trials: list[ExportEntry]
    objectives: NotRequired[list[dict[str, Any]]]  # with several objectives
    removed: NotRequired[dict[str, str]]  # trials whose checkpoints the disk budget removed: why
