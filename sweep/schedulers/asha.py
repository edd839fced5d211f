"""Pause-and-promote asynchronous successive halving (ASHA): where a trial pauses, which paused
trial goes on next, and how the paused trials end. Every decision reads only the stored study.

A trial trains to its rung (`scheduler.min_steps * reduction_factor**k`, below train.steps), is
checkpointed at exactly that step and paused: Optuna's WAITING state (not RUNNING, which a
sampler's constant liar would count for ever; not finished, since it may go on) with its rungs
in the `paused_at` user attribute (sweep/store/record.py). A free worker promotes, from the top rung
down, the best paused trial whose value at its rung ranks in the top 1/reduction_factor of the
trials that reached that rung; it resumes from its rung checkpoint to the next rung or the end.
Only where none is promotable does the worker start a new trial. Once n_trials have started and
nothing is promotable or running, the paused trials end PRUNED with their rung value; a study
with no COMPLETE trial by then first promotes its best paused trial of the highest rung, so that
it has a best trial. docs/schedulers.md says it for users.

Hyperband (`type: hyperband`) runs brackets of the same: with rungs r0 < r1 < ... < rK-1, bracket
b starts its trials at rung rb (bracket K trains them straight to the end); trial N is in bracket
N mod (K + 1), and a trial is ranked only against the trials of its own bracket.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweep.schedulers import pbt
from sweep.store import enqueue
from sweep.store.record import (BEST_STEP, BEST_VALUE, LAST_STEP, METRICS, PAUSED_AT, RUNG_TARGET, best_of_reports,
                                counted_reports, metrics_at, paused_rung)
from sweep.store.session import Session
from sweep.study.config import Config

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


def rungs(config: Config) -> list[int]:
    """The study's rung steps, ascending ([] without a scheduler)."""
    s = config.study.scheduler
    return s.rungs(config.study.train.steps) if s is not None else []


def bracket(config: Config, number: int) -> int:
    """The bracket of trial `number`: 0 for asha; for hyperband, number mod (rungs + 1)."""
    s = config.study.scheduler
    return number % (len(rungs(config)) + 1) if s is not None and s.type == "hyperband" else 0


def pause_at(config: Config, trial: FrozenTrial) -> int | None:
    """The step `trial` pauses at in this run; None where it trains to the end. A new trial goes to
    the first rung of its bracket, a promoted one to the step its promotion recorded (`rung_target`)."""
    levels, steps = rungs(config), config.study.train.steps
    if not levels:
        return None
    b = bracket(config, trial.number)
    target = int(trial.user_attrs.get(RUNG_TARGET, levels[b] if b < len(levels) else steps))
    return target if target < steps else None


def paused(trials: Sequence[FrozenTrial]) -> list[int]:
    return [t.number for t in trials if paused_rung(t) is not None]


def next_promotion(config: Config, trials: Sequence[FrozenTrial], relaxed: bool = False) -> Promotion | None:
    """The paused trial to promote now, from the top rung down: at each rung the trials of a
    bracket that reported there are ranked by their value at it (ties: the lower number); a paused
    one ranked below floor(reached / reduction_factor) goes on, the best of the rung first.
    `relaxed`: every paused one may go (the best of the highest rung that has one)."""
    s = config.study.scheduler
    if s is None:
        return None
    sign, levels = config.study.objective.sign, rungs(config)
    for i in reversed(range(len(levels))):
        rung = levels[i]
        groups: dict[int, list[FrozenTrial]] = {}
        for t in trials:
            if rung in t.intermediate_values:
                groups.setdefault(bracket(config, t.number), []).append(t)
        found = []
        for group in groups.values():
            reached = sorted(group, key=lambda t: (sign * t.intermediate_values[rung], t.number))
            top = len(reached) if relaxed else len(reached) // s.reduction_factor
            to = levels[i + 1] if i + 1 < len(levels) else config.study.train.steps
            found += [Promotion(t.number, rung, to, t.intermediate_values[rung], rank, len(reached))
                      for rank, t in enumerate(reached[:top]) if paused_rung(t) == rung][:1]
        if found:
            return min(found, key=lambda p: (sign * p.value, p.number))
    return None


def promote_next(session: Session, states: Mapping[int, TrialState], trials: Sequence[FrozenTrial]) -> int | None:
    """Under the ask lock: promote the trial `next_promotion` names, if any; its number. Where no
    trial can start or run any more and none completed, the best paused one of the highest rung
    goes on (relaxed), so that the study has a best trial."""
    config, paused_now = session.config, paused(trials)
    if pbt.active(config):  # its own rule: a population goes on once every member paused at the step
        return pbt.promote_next(session, states, trials)
    promotion = next_promotion(config, trials)
    if (promotion is None and paused_now and not enqueue.waiting(states, paused_now) and not session.running()
            and enqueue.counted(states, paused_now) >= config.study.n_trials
            and TrialState.COMPLETE not in states.values()):
        promotion = next_promotion(config, trials, relaxed=True)
    if promotion is None or not promote(session, promotion):
        return None
    return promotion.number


def promote(session: Session, promotion: Promotion) -> bool:
    """Under the ask lock: record where the trial trains to, then take it WAITING -> RUNNING (one
    locked row update). A kill between the two leaves it paused; the same decision is made again."""
    session.set_trial_attr(promotion.number, RUNG_TARGET, promotion.to)
    if not session.set_state(promotion.number, TrialState.RUNNING):
        return False
    log.info("trial %d: promoted from rung %d (%s=%r, rank %d of %d), trains on to step %d", promotion.number,
             promotion.rung, session.config.study.objective.metric, promotion.value, promotion.rank + 1,
             promotion.reached, promotion.to)
    return True


def pause(session: Session, number: int, step: int) -> None:
    """Trial `number` reached its rung `step` (its checkpoint there is on disk): record the rung,
    then RUNNING -> WAITING. A kill between the two leaves it interrupted at its rung: the next run
    restores it there, evaluates it again (bit-identical) and pauses it here."""
    done = list(session.trial(number).user_attrs.get(PAUSED_AT, []))
    if not done or done[-1] != step:
        session.set_trial_attr(number, PAUSED_AT, [*done, step])
    session.set_state(number, TrialState.WAITING)
    log.info("trial %d: paused at %s %d, %s=%r", number, "step" if pbt.active(session.config) else "rung", step,
             session.config.study.objective.metric,
             session.trial(number).intermediate_values[step])


def finish_paused(session: Session, trials: Sequence[FrozenTrial]) -> None:
    """End every paused trial PRUNED with its value at its rung (Optuna's value of a pruned trial:
    its last report), its best step recorded as for any finished trial."""
    config = session.config
    metric, direction = config.study.objective.metric, config.study.objective.direction
    for t in trials:
        rung = paused_rung(t)
        if rung is None:
            continue
        best_step, best_value = best_of_reports(counted_reports(t, metric), direction) or (rung, t.intermediate_values[rung])
        for key, value in ((BEST_STEP, best_step), (BEST_VALUE, best_value), (LAST_STEP, rung),
                           (METRICS, metrics_at(t, best_step, metric))):
            session.set_trial_attr(t.number, key, value)
        if session.set_state(t.number, TrialState.PRUNED, t.intermediate_values[rung]):
            log.info("trial %d: paused at rung %d and not promoted: pruned, %s=%r at step %d (best)", t.number, rung,
                     metric, best_value, best_step)
