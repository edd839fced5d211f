"""Pause-and-promote asynchronous successive halving (ASHA): where a trial pauses, which paused
trial goes on next, and how the paused trials end. Every decision reads only the stored study.

A trial trains to its rung (`scheduler.min_steps * reduction_factor**k`, below train.steps), is
checkpointed at exactly that step and paused: Optuna's WAITING state (not RUNNING, which a
sampler's constant liar would count for ever; not finished, since it may go on) with its rungs
in the `paused_at` user attribute (sweep/store/record.py; the pause and promote steps every
scheduler shares are in sweep/schedulers/base.py). A free worker promotes, from the top rung
down, the best paused trial whose value at its rung ranks in the top 1/reduction_factor of the
trials that reached that rung; it resumes from its rung checkpoint to the next rung or the end.
Only where none is promotable does the worker start a new trial. Once n_trials have started and
nothing is promotable or running, the paused trials end PRUNED with their rung value; a study
with no COMPLETE trial by then first promotes its best paused trial of the highest rung, so that
it has a best trial. docs/schedulers.md says it for users.

Hyperband (`type: hyperband`, sweep/schedulers/hyperband.py) runs brackets of the same: a trial
is ranked only against the trials of its own bracket (`Asha.bracket`: 0 for every asha trial).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Annotated, Any, Literal, Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState
from pydantic import Field, model_validator

from sweep.schedulers import base
from sweep.store import enqueue
from sweep.store.record import RUNG_TARGET, paused_rung
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.study.scheduler_keys import MAX_STEP

log = logging.getLogger("sweep")


@dataclasses.dataclass(frozen=True)
class Promotion:
    """Paused trial `number` goes on from its rung `rung` to step `to` (the next rung or the end)."""
    number: int
    rung: int
    to: int
    value: float  # its value at the rung
    rank: int  # its place among the trials that reached the rung (0: best)
    reached: int  # how many trials reached the rung


class Asha(base.Scheduler):
    """`scheduler: {type: asha, min_steps, reduction_factor, sampler_sees}`: rungs at min_steps *
    reduction_factor**k below train.steps (docs/schedulers.md); what the sampler learns from:
    the finished trials (Optuna's way) or, `rung`, the trials at the highest step enough of them
    reported (sweep/store/samplers.py RungView)."""

    min_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    reduction_factor: Annotated[int, Field(ge=2)] = 3
    sampler_sees: Literal["finished", "rung"] = "finished"

    @model_validator(mode="after")
    def _required(self) -> Asha:
        if self.min_steps is None:  # not a required field: the message names the type
            raise ValueError(f"min_steps: is required with type {self.type}")
        return self

    def rungs(self, steps: int) -> list[int]:
        return list(_rungs(self.first, self.reduction_factor, steps))

    def meaning(self) -> dict[str, Any]:
        # sampler_sees only where given: fingerprints stored before it existed stay equal.
        out = super().meaning()
        if out["sampler_sees"] == "finished":
            del out["sampler_sees"]
        return out

    def bracket(self, number: int, steps: int) -> int:
        """The bracket of trial `number`, which it is ranked within: 0 for every asha trial."""
        return 0

    def pause_at(self, config: Config, trial: FrozenTrial) -> int | None:
        """A new trial goes to the first rung of its bracket, a promoted one to the step its
        promotion recorded (`rung_target`)."""
        levels, steps = self.rungs(config.study.train.steps), config.study.train.steps
        if not levels:
            return None
        b = self.bracket(trial.number, steps)
        target = int(trial.user_attrs.get(RUNG_TARGET, levels[b] if b < len(levels) else steps))
        return target if target < steps else None

    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        """The promotion `next_promotion` names, if any. Where no trial can start or run any more
        and none completed, the best paused one of the highest rung goes on (relaxed), so that the
        study has a best trial."""
        config, paused_now = session.config, base.paused(trials)
        promotion = next_promotion(config, trials)
        if (promotion is None and paused_now and not enqueue.waiting(states, paused_now) and not session.running()
                and enqueue.counted(states, paused_now) >= config.study.n_trials
                and TrialState.COMPLETE not in states.values()):
            promotion = next_promotion(config, trials, relaxed=True)
        if promotion is None or not base.promote(session, promotion.number, promotion.to):
            return None
        log.info("trial %d: promoted from rung %d (%s=%r, rank %d of %d), trains on to step %d", promotion.number,
                 promotion.rung, config.study.objective.metric, promotion.value, promotion.rank + 1,
                 promotion.reached, promotion.to)
        return promotion.number

    def plan_note(self) -> str:
        return (f"scheduler {self.type}: each goes on when it ranks in its rung's top, else ends PRUNED once no "
                "trial is left to start")


def _scheduler(config: Config) -> Asha:
    s = config.study.scheduler
    assert isinstance(s, Asha), type(s)
    return s


def next_promotion(config: Config, trials: Sequence[FrozenTrial], relaxed: bool = False) -> Promotion | None:
    """The paused trial to promote now, from the top rung down: at each rung the trials of a
    bracket that reported there are ranked by their value at it (ties: the lower number); a paused
    one ranked below floor(reached / reduction_factor) goes on, the best of the rung first.
    `relaxed`: every paused one may go (the best of the highest rung that has one)."""
    s, steps = _scheduler(config), config.study.train.steps
    sign, levels = config.study.objective.sign, s.rungs(steps)
    paused = {t.number: rung for t in trials if (rung := paused_rung(t)) is not None}
    if not paused:
        return None
    groups: dict[int, list[FrozenTrial]] = {}  # bracket -> its trials
    for t in trials:
        groups.setdefault(s.bracket(t.number, steps), []).append(t)
    for i in reversed(range(len(levels))):
        rung = levels[i]
        if rung not in paused.values():  # nothing waits here (the same answer, without the ranking)
            continue
        found = []
        for group in groups.values():
            reached = sorted((t for t in group if rung in t.intermediate_values),
                             key=lambda t: (sign * t.intermediate_values[rung], t.number))
            top = len(reached) if relaxed else len(reached) // s.reduction_factor
            to = s.next_stop(rung, steps)
            found += [Promotion(t.number, rung, to, t.intermediate_values[rung], rank, len(reached))
                      for rank, t in enumerate(reached[:top]) if paused.get(t.number) == rung][:1]
        if found:
            return min(found, key=lambda p: (sign * p.value, p.number))
    return None


@functools.lru_cache(maxsize=256)
def _rungs(first: int, factor: int, steps: int) -> tuple[int, ...]:
    """first * factor**k below steps (a decision asks for every trial's bracket: computed once)."""
    out, rung = [], first
    while rung < steps:
        out.append(rung)
        rung *= factor
    return tuple(out)
