"""The study file's `scheduler` section: pause-and-promote successive halving (asha), brackets of
it (hyperband) and population-based training (pbt); sweep/study/config.py checks it against the rest."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sweep.study.params import StrictModel

MAX_STEP = 2 ** 31 - 1
ASHA_KEYS = ("min_steps", "reduction_factor")  # asha and hyperband only
PBT_KEYS = ("population", "interval_steps", "quantile", "perturbation_factors", "resample_probability")


class Scheduler(StrictModel):
    """asha (sweep/schedulers/asha.py, docs/schedulers.md): rungs at min_steps * reduction_factor**k below
    train.steps; hyperband: brackets of it, each starting at a higher rung; pbt (sweep/schedulers/pbt.py):
    populations of `population` trials that pause every `interval_steps`, where the worst
    `quantile` copy the state of a better member and perturb its float hyperparameters."""
    type: Literal["asha", "hyperband", "pbt"]
    min_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    reduction_factor: Annotated[int, Field(ge=2)] = 3
    population: Annotated[int, Field(ge=2)] | None = None
    interval_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    quantile: Annotated[float, Field(gt=0, le=0.5)] = 0.25  # the worst share copies the best share
    # An exploited float hyperparameter is multiplied by one of these (Ray Tune's PBT: 0.8, 1.2).
    perturbation_factors: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)] = [0.8, 1.2]
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25  # else perturbed

    @model_validator(mode="after")
    def _check_keys(self) -> Scheduler:
        own, other = (PBT_KEYS, ASHA_KEYS) if self.type == "pbt" else (ASHA_KEYS, PBT_KEYS)
        for key in other:
            if key in self.model_fields_set:
                raise ValueError(f"{key}: only with type {'pbt' if key in PBT_KEYS else 'asha or hyperband'}"
                                 f" (keys of type {self.type}: {', '.join(own)}), got {getattr(self, key)!r}")
        required = ("population", "interval_steps") if self.type == "pbt" else ("min_steps",)
        for key in required:
            if getattr(self, key) is None:
                raise ValueError(f"{key}: is required with type {self.type}")
        return self

    @staticmethod
    def allowed_keys(kind: object) -> list[str]:
        """The keys a scheduler of type `kind` takes (an unknown key's message lists these)."""
        return ["type", *(PBT_KEYS if kind == "pbt" else ASHA_KEYS)]

    @property
    def first(self) -> int:
        """The first pause: the first rung (asha, hyperband) or the first interval (pbt)."""
        return int(self.interval_steps if self.type == "pbt" else self.min_steps)  # type: ignore[arg-type]

    def rungs(self, steps: int) -> list[int]:
        """The steps below `steps` a trial pauses at: min_steps * reduction_factor**k, or every
        interval_steps for pbt (a trial's last step is never one: it ends there)."""
        out, rung = [], self.first
        while rung < steps:
            out.append(rung)
            rung = rung + self.first if self.type == "pbt" else rung * self.reduction_factor
        return out
