"""A study's objectives: one (`objective`) or several (`objectives`, a multi-objective study),
the values a trial is told with, and which trials are Pareto-optimal.

Imports neither optuna nor jax (config validates with it). The rules of a multi-objective study
(docs/search.md, "Several objectives"): the FIRST objective steers everything that needs one
number per evaluation (the best step of a trial and so its best checkpoint, keep_best, the
learning curves); a trial is told each objective's metric at that best step. Nothing is
reported to Optuna per step (`Trial.report` is single-objective only: the per-step metrics are
kept in the `eval:<step>` user attributes) and pruning is refused: Optuna has no pruner for
several objectives (optuna#3450).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    metric: str
    direction: Literal["minimize", "maximize"] = "minimize"

    @property
    def sign(self) -> int:
        """+1 when smaller is better, -1 when larger is: `sign * value` is always minimised."""
        return sign(self.direction)


def sign(direction: str) -> int:
    """+1 for "minimize", -1 for "maximize" (the one place that maps a direction to a sign)."""
    return 1 if direction == "minimize" else -1


def check(objective: Objective | None, objectives: list[Objective] | None, pruner: str) -> None:
    """The rules between `objective`, `objectives` and the pruner (raised as "<key>: <rule>, got <value>")."""
    if objective is not None and objectives is not None:
        raise ValueError(f"objectives: cannot be combined with objective; give one objective or a list of several, "
                         f"got {[o.metric for o in objectives]!r}")
    if objective is None and objectives is None:
        raise ValueError("objective: is required (or objectives: a list of several), got None")
    if objectives is None:
        return
    if len(objectives) < 2:
        raise ValueError(f"objectives: must list at least 2 objectives (one is objective:), got "
                         f"{[o.metric for o in objectives]!r}")
    metrics = [o.metric for o in objectives]
    if len(set(metrics)) != len(metrics):
        raise ValueError(f"objectives: must not repeat a metric, got {metrics!r}")
    if pruner != "none":
        raise ValueError(f"pruner.type: must be none for a study with several objectives (Optuna cannot prune a "
                         f"multi-objective study, optuna#3450), got {pruner!r}")


def told_values(objectives: Sequence[Objective], metrics: Mapping[str, Any]) -> list[float]:
    """The values a multi-objective trial is told: each objective's metric at its best step."""
    return [float(metrics[o.metric]) for o in objectives]


def pareto(trials: Sequence[Any], objectives: Sequence[Objective]) -> list[int]:
    """Numbers of the trials not dominated by another of `trials` (Optuna's `best_trials` rule):
    each trial needs `values`; a trial breaking a recorded constraint is never on the front."""
    points = [(t.number, [o.sign * v for o, v in zip(objectives, t.values)]) for t in trials
              if t.values is not None and all(math.isfinite(v) for v in t.values)
              and all(v <= 0 for v in (getattr(t, "constraints", None) or {}).values())]
    return sorted(n for n, p in points if not any(_dominates(q, p) for _, q in points))


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
