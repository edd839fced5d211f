"""Constraints on the metrics a trial reports (`constraints: [{metric: n_params, max: 1.0e6}]`):
their values in Optuna's convention (<= 0 is feasible), what a trial records, and which trials
may be called best.

Imports neither optuna nor jax (config validates with it). A trial's constraint values come
from its metrics at its best step and are stored before it is told with Optuna's own
`trial.set_constraint` (Optuna 5's replacement of `constraints_func`), one key per constraint:
Optuna's samplers that handle constraints (TPE, GP) read them from there, as do
`FrozenTrial.constraints` and the dashboard.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, model_validator


class Constraint(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    metric: str
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check(self) -> Constraint:
        if self.min is None and self.max is None:
            raise ValueError(f"max: give max and/or min (the metric's allowed range), got None for {self.metric}")
        if self.min is not None and self.max is not None and not self.min <= self.max:
            raise ValueError(f"min: must be <= max ({self.max!r}), got {self.min!r}")
        return self


def values(constraints: Sequence[Constraint], metrics: Mapping[str, Any]) -> list[float]:
    """One value per constraint, <= 0 where it holds (Optuna's convention); a metric missing or
    not finite violates it (+inf)."""
    out = []
    for c in constraints:
        value = metrics.get(c.metric)
        if value is None or not math.isfinite(float(value)):
            out.append(math.inf)
            continue
        over = [float(value) - c.max] if c.max is not None else []
        under = [c.min - float(value)] if c.min is not None else []
        out.append(max(over + under))
    return out


def keys(constraints: Sequence[Constraint]) -> list[str]:
    """The name of each constraint's value in Optuna's trial.constraints: "<index>.<metric>"."""
    return [f"{i}.{c.metric}" for i, c in enumerate(constraints)]


def feasible(trial: Any) -> bool | None:
    """Whether a finished trial met every constraint (None: none recorded, e.g. a study without)."""
    recorded = trial.constraints
    return None if not recorded else all(v <= 0 for v in recorded.values())
