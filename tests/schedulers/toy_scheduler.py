"""A scheduler from outside sweep/, named in a study file by its import path only
(`scheduler: {type: "tests.schedulers.toy_scheduler:PromoteInOrder", stops: [...]}`), as a user's
would be: trials pause at the fixed steps of its own key `stops`; once every trial has started,
a free worker promotes every paused trial in number order (the lowest number first), each to its
next stop or its last step. tests/schedulers/test_contract.py runs it through the CLI."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState
from pydantic import Field, model_validator

from sweep.schedulers import base
from sweep.store.record import RUNG_TARGET, paused_rung
from sweep.store.session import Session
from sweep.study.config import Config

log = logging.getLogger("sweep")


class PromoteInOrder(base.Scheduler):
    """Pauses at `stops`; promotes the paused trial with the lowest number once none is left to start."""

    stops: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] | None = None

    first_key = "stops"
    first_what = "the first stop"

    @model_validator(mode="after")
    def _required(self) -> PromoteInOrder:
        if self.stops is None:
            raise ValueError(f"stops: is required with type {self.type}")
        if self.stops != sorted(set(self.stops)):
            raise ValueError(f"stops: must be ascending, each once, got {self.stops}")
        return self

    @property
    def first(self) -> int:
        return self.stops[0]  # type: ignore[index]

    def rungs(self, steps: int) -> list[int]:
        return [s for s in self.stops or [] if s < steps]

    def check(self, study: Any) -> None:
        off = [s for s in self.stops or [] if s % study.train.eval_every]
        if off:
            raise ValueError(f"scheduler.stops: each must be a multiple of train.eval_every "
                             f"({study.train.eval_every}), got {off[0]}")

    def pause_at(self, config: Config, trial: FrozenTrial) -> int | None:
        steps = config.study.train.steps
        target = int(trial.user_attrs.get(RUNG_TARGET, self.first))
        return target if target < steps else None

    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        waiting = sorted((t for t in trials if paused_rung(t) is not None), key=lambda t: t.number)
        paused = {t.number for t in waiting}
        started = sum(1 for n, s in states.items() if s != TrialState.WAITING or n in paused)
        if not waiting or started < session.config.study.n_trials:
            return None  # new trials first: each one reaches its first stop before any goes on
        t = waiting[0]
        stop = int(paused_rung(t))  # type: ignore[arg-type]
        to = self.next_stop(stop, session.config.study.train.steps)
        if not base.promote(session, t.number, to):
            return None
        log.info("trial %d: promoted in number order from step %d to step %d", t.number, stop, to)
        return t.number

    def plan_note(self) -> str:
        return "toy scheduler: each goes on in number order once every trial has started"
