"""The trial record: every user attribute sweep keeps on a trial (and the study-wide ones that
describe trials), and the readers of them. One home for the keys, so no module spells them.

A trial's record lives in Optuna's storage, so it moves with the study and optuna-dashboard and
`optuna.load_study(...)` read it. The fields are documented in docs/reference.md ("Trial and
study user attributes").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from optuna.trial import FrozenTrial, TrialState

from sweep.errors import SweepError
from sweep.study import config as config_lib
from sweep.study.config import Config

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

# Trial user attributes.
CHECKPOINT_DIR = "checkpoint_dir"  # absolute path of its checkpoint folder, where it ran last
BEST_STEP, BEST_VALUE, LAST_STEP = "best_step", "best_value", "last_step"  # once finished
METRICS = "metrics"  # every declared metric at the best step
RESUMES = "resumes"  # interruptions: runs that ended without finishing it (sweep/train/ledger.py)
RESUMED_FROM = "resumed_from"  # the steps it was resumed from after an interruption
FAILURES, ERROR = "failures", "error"  # retries used, and the last error (truncated)
# Each `retry` of a FAIL trial (sweep/commands/retry.py), in order: {"error", "failures", "last_step",
# "from_step"}: the failure it ended with, the retries max_retries had used, its last evaluated step,
# the step the retry went on from (0 from scratch).
RETRIED = "retried"
LEDGER = "ledger"  # where its time went (sweep/train/ledger.py)
DEVICES = "devices"  # ["<platform>:<host index>", ...]: the devices its latest run trained on (sweep/host/slots.py)
CONTINUED_FROM = "continued_from"  # {"study", "number", "last_step"} of the trial `continue` trains further
# Pause and promote (sweep/schedulers/asha.py): the rung steps it paused at, in order (a paused trial is
# Optuna's WAITING with this attribute: its last entry is the rung it waits at), and the step its
# current run trains to (a higher rung or train.steps), set when it is promoted.
PAUSED_AT, RUNG_TARGET = "paused_at", "rung_target"
# ... and the pause steps it went on from at the scheduler's decision (promoted; pbt: its next
# generation), in order: kept apart from `resumed_from`, which lists its interruptions only.
PROMOTED_AT = "promoted_at"
# Population-based training (sweep/schedulers/pbt.py): the params a member trains with now (its sampled
# params until an exploit gives it a donor's, perturbed), and its exploits in order: {"step",
# "source", "source_step", "source_checksum", "source_value", "old_value", "old_params", "new_params"}
# ("source" null where every donor's checkpoint was damaged: it went on with its own).
PBT_PARAMS, LINEAGE = "pbt_params", "lineage"
# Trial user attribute of a warm-start observation (sweep/store/warm_start.py): {"study", "number"} of the
# trial of the other study it copies. Such a trial is never run, counted, resumed or exported.
WARM_START = "warm_start"
MLFLOW_RUN_ID = "mlflow_run_id"  # the MLflow run its curves go to (sweep/tracking/mlflow_runs.py), kept across resumes
# Trial user attribute per evaluation: every declared metric plus "train_loss" at that step (the
# curves); rows in Optuna's storage, so they move with the study and optuna-dashboard shows them.
EVAL_ATTR_PREFIX = "eval:"
TRAIN_LOSS = "train_loss"  # beside the declared metrics in each eval:<step>: the mean training loss
# Trial user attribute: what its runs compiled, summed ({"compilations", "cache_hits", "compile_seconds"}).
COMPILES_ATTR = "compiles"
# Trial user attribute: the shapes and dtypes of its data, so loaders need no training data.
DATA_SHAPES_ATTR = "data_shapes"


def checkpoint_folder(config: Config, trial: FrozenTrial) -> Path | None:
    """Where trial `trial`'s checkpoints are now: under the study's workdir, wherever the study was
    moved or copied to (the `checkpoint_dir` attribute says where it ran last); None for a trial
    sweep did not run."""
    return config.checkpoint_dir(trial.number) if CHECKPOINT_DIR in trial.user_attrs else None


def paused_rung(trial: FrozenTrial) -> int | None:
    """The rung step a paused trial waits at; None for any other trial (an enqueued WAITING one too)."""
    rungs = trial.user_attrs.get(PAUSED_AT)
    return int(rungs[-1]) if trial.state == TrialState.WAITING and rungs else None


def params_in_force(trial: FrozenTrial) -> dict[str, Any]:
    """The params a trial trains with now: Optuna's (sampled, immutable) unless a PBT exploit
    replaced them (sweep/schedulers/pbt.py)."""
    return dict(trial.user_attrs.get(PBT_PARAMS) or trial.params)


def exploited_at(trial: FrozenTrial) -> int:
    """The step of a PBT member's latest exploit (0 if none): its state before it was another
    member's, so its best step and its resume never go below it (sweep/schedulers/pbt.py)."""
    return max((int(e["step"]) for e in trial.user_attrs.get(LINEAGE, []) if e.get("source") is not None), default=0)


def counted_reports(trial: FrozenTrial, metric: str) -> dict[int, float]:
    """The reports that count for a trial now: every one, but for a PBT member only from its latest
    exploit on (its best step, its value and its resume never reach back into a lineage it left)."""
    since = exploited_at(trial)
    return {s: v for s, v in reports(trial, metric).items() if s >= since}


def eval_attr(step: int) -> str:
    return f"{EVAL_ATTR_PREFIX}{step}"


def history(trial: FrozenTrial) -> dict[int, dict[str, float]]:
    """step -> every metric recorded at that evaluation (empty for trials run before they were)."""
    return {int(k[len(EVAL_ATTR_PREFIX):]): v for k, v in trial.user_attrs.items()
            if k.startswith(EVAL_ATTR_PREFIX) and isinstance(v, dict)}


def metrics_at(trial: FrozenTrial, step: int | None, metric: str | None = None) -> dict[str, float] | None:
    """Every declared metric recorded at `step`; for a trial recorded before they were kept, the
    objective `metric` alone from its reports (None if `metric` is not given or not reported)."""
    if step is None:
        return None
    found = trial.user_attrs.get(eval_attr(step))
    if isinstance(found, dict):
        return {k: v for k, v in found.items() if k != TRAIN_LOSS}
    if metric is not None and step in trial.intermediate_values:
        return {metric: trial.intermediate_values[step]}
    return None


def reports(trial: FrozenTrial, metric: str) -> dict[int, float]:
    """step -> `metric` at each evaluation: Optuna's intermediate values where the trial reported
    them, else its `eval:<step>` records (a multi-objective trial reports nothing to Optuna)."""
    if trial.intermediate_values:
        return dict(trial.intermediate_values)
    return {step: m[metric] for step, m in history(trial).items() if metric in m}


def is_warm_start(trial: FrozenTrial) -> bool:
    return WARM_START in trial.user_attrs


def train_loss_at(trial: FrozenTrial, step: int | None) -> float | None:
    """The mean training loss of the evaluation interval ending at `step`, if recorded."""
    found = trial.user_attrs.get(eval_attr(step)) if step is not None else None
    return found.get(TRAIN_LOSS) if isinstance(found, dict) else None


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
    if BEST_STEP in trial.user_attrs:
        return int(trial.user_attrs[BEST_STEP]), float(trial.user_attrs[BEST_VALUE])
    best = best_of_reports(trial.intermediate_values, direction)
    if best is None:
        raise SweepError(f"trial {trial.number} has no evaluation")
    return best


# Study user attributes.
TEST = "best_test"  # the best trial's test metrics, computed once
WARM_STARTED = "sweep:warm_start"  # {"study", "added", "skipped"}: the warm start was done (once)
COMPANION_INFIX = ".continued-"  # <study>.continued-<steps>: the companion study `continue` creates


def companion_name(study: str, steps: int) -> str:
    return f"{study}{COMPANION_INFIX}{steps}"


def companions(storage: BaseStorage, study: str) -> dict[int, str]:
    """steps -> the name of each companion study of `study` in `storage` (names only; no trial is loaded)."""
    prefix = f"{study}{COMPANION_INFIX}"
    found = {}
    for summary in storage.get_all_studies():
        rest = summary.study_name[len(prefix):]
        if summary.study_name.startswith(prefix) and rest.isdigit():
            found[int(rest)] = summary.study_name
    return found


def add_compiles(trial: Any, stored: Mapping[str, Any], counts: dict[str, float]) -> None:
    """Add a run's compile counts to the trial's `compiles` attribute (`stored`: its user attributes)."""
    before = stored.get(COMPILES_ATTR) or {}
    total = {k: before.get(k, 0) + v for k, v in counts.items()}
    total["compile_seconds"] = round(total["compile_seconds"], 3)
    trial.set_user_attr(COMPILES_ATTR, total)


def is_promotion(stored: Mapping[str, Any], step: int) -> bool:
    """Whether a run restored at `step` goes on from a pause (the scheduler promoted it there)
    rather than after an interruption: `step` is the pause it waited at last, and no run went on
    from that pause yet (a kill before the promoted run's first save restores there again: an
    interruption). `stored`: the trial's user attributes."""
    paused, promoted = stored.get(PAUSED_AT) or [], stored.get(PROMOTED_AT) or []
    return bool(paused) and step == paused[-1] and len(promoted) < len(paused)


def add_restore(trial: Any, stored: Mapping[str, Any], step: int) -> bool:
    """Append `step` to the trial's `promoted_at` (a promotion, see is_promotion) or `resumed_from`
    (an interruption; plot marks these on the curve); True for a promotion."""
    key = PROMOTED_AT if is_promotion(stored, step) else RESUMED_FROM
    trial.set_user_attr(key, [*stored.get(key, []), step])
    return key == PROMOTED_AT


def rung_path(attrs: Mapping[str, Any], last_step: int | None) -> list[int]:
    """The steps a paused-and-promoted trial went through: each pause, then the last step it
    reached past the last pause ([] for a trial that never paused)."""
    paused = [int(s) for s in attrs.get(PAUSED_AT) or []]
    return [*paused, last_step] if paused and last_step is not None and last_step > paused[-1] else paused
