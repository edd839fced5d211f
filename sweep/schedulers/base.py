"""The Scheduler base class: what asha, hyperband, pbt, freeze_thaw and a user's scheduler provide
to the run loop, plan, status, export and the fingerprint, the pause and promote steps they share, and the run's
one way to the study's scheduler (`of`, and the module functions the worker calls).

A scheduler is a pydantic model of the study file's `scheduler` section (its keys and their rules,
sweep/study/scheduler_keys.py) that also says where a trial pauses (`pause_at`) and what a free
worker does next (`promote_next`: a paused trial to go on, or None to start a new trial). A
paused trial is Optuna's WAITING with its pause steps in the `paused_at` user attribute (not
RUNNING, which a sampler's constant liar would count for ever; not finished, since it may go on);
its promotion records the step it trains to (`rung_target`), then takes it WAITING -> RUNNING.
A new scheduler is one module with one such class, and its name in scheduler_keys.REGISTRY (or,
a user's, its import path in the study file): docs/development.md.
"""

from __future__ import annotations

import abc
import logging
from typing import Any, ClassVar, Mapping, Sequence, cast

from optuna.trial import FrozenTrial, TrialState

from sweep.store.record import (BEST_STEP, BEST_VALUE, LAST_STEP, METRICS, PAUSED_AT, RUNG_TARGET, best_of_reports,
                                counted_reports, metrics_at, paused_rung)
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.study.scheduler_keys import SchedulerKeys

log = logging.getLogger("sweep")


class Scheduler(SchedulerKeys):
    """A scheduler: its keys (pydantic fields, with `type`), the steps a trial may pause at (`rungs`)
    and the two decisions only it makes; the rest has the defaults every pausing scheduler shares.
    Every decision must be a function of the stored study (and the file), so that a run killed at
    any moment and the same command again make the same ones."""

    pause_word: ClassVar[str] = "rung"  # what the log calls the step a trial pauses at
    # Each trial trains along its own learning curve, paused and continued: the scheduler simulator
    # (sweep/run/simulator.py) can replay it on tabulated curves. False where a trial may take over
    # another's state (pbt's exploits).
    follows_curves: ClassVar[bool] = True

    @abc.abstractmethod
    def pause_at(self, config: Config, trial: FrozenTrial) -> int | None:
        """The step `trial` pauses at in the run it starts now; None where it trains to the end."""

    @abc.abstractmethod
    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        """Under the ask lock, for a free worker: promote a paused trial (see `promote`) and return
        its number, or None (the worker then starts a new trial, or ends the paused ones where
        none is left to start: `finish_paused`). `states`: every trial's; `trials`: every trial."""

    def next_stop(self, step: int, steps: int) -> int:
        """Where a trial that goes on from `step` trains to: the next of its rungs, or the end."""
        return next((r for r in self.rungs(steps) if r > step), steps)

    def pause(self, session: Session, number: int, step: int) -> None:
        """Trial `number` reached its pause `step` (its checkpoint there is on disk): record the
        step, then RUNNING -> WAITING. A kill between the two leaves it interrupted at the step:
        the next run restores it there, evaluates it again (bit-identical) and pauses it here."""
        done = list(session.trial(number).user_attrs.get(PAUSED_AT, []))
        if not done or done[-1] != step:
            session.set_trial_attr(number, PAUSED_AT, [*done, step])
        session.set_state(number, TrialState.WAITING)
        log.info("trial %d: paused at %s %d, %s=%r", number, self.pause_word, step,
                 session.config.study.objective.metric, session.trial(number).intermediate_values[step])

    def finish_paused(self, session: Session, trials: Sequence[FrozenTrial]) -> None:
        """Nothing is left to start or run: end every paused trial PRUNED with its value at its
        pause (Optuna's value of a pruned trial: its last report), its best step recorded as for
        any finished trial."""
        metric, direction = session.config.study.objective.metric, session.config.study.objective.direction
        for t in trials:
            rung = paused_rung(t)
            if rung is None:
                continue
            best_step, best_value = (best_of_reports(counted_reports(t, metric), direction)
                                     or (rung, t.intermediate_values[rung]))
            for key, value in ((BEST_STEP, best_step), (BEST_VALUE, best_value), (LAST_STEP, rung),
                               (METRICS, metrics_at(t, best_step, metric))):
                session.set_trial_attr(t.number, key, value)
            if session.set_state(t.number, TrialState.PRUNED, t.intermediate_values[rung]):
                log.info("trial %d: paused at rung %d and not promoted: pruned, %s=%r at step %d (best)", t.number,
                         rung, metric, best_value, best_step)

    def plan_note(self) -> str:
        """What `plan` says after the paused trials (in parentheses): when they go on."""
        return (f"scheduler {self.type}: each goes on when the scheduler promotes it, else ends PRUNED once no "
                "trial is left to start")

    def next_decision(self, session: Session, states: Mapping[int, TrialState]) -> str | None:
        """What `plan` says a free worker would do next with the paused trials (its `next:` line),
        from the stored study, read only; None: nothing beyond `plan_note` (the default)."""
        return None

    def status_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        """Fields of its own in a trial's entry of `status --json` (none by default)."""
        return {}

    def export_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        """Fields of its own in a trial's entry of the export's index.json (none by default)."""
        return {}


def promote(session: Session, number: int, to: int) -> bool:
    """Under the ask lock: paused trial `number` goes on to step `to`: record where it trains to,
    then take it WAITING -> RUNNING (one locked row update); False where another worker took it
    first. A kill between the two leaves it paused; the same decision is made again."""
    session.set_trial_attr(number, RUNG_TARGET, to)
    return session.set_state(number, TrialState.RUNNING)


def of(config: Config) -> Scheduler | None:
    """The study's scheduler; None without one."""
    # scheduler_keys.resolve admits only a class with the methods of Scheduler (a Scheduler, as a rule)
    return cast("Scheduler | None", config.study.scheduler)


def paused(trials: Sequence[FrozenTrial]) -> list[int]:
    """The numbers of the paused trials among `trials`."""
    return [t.number for t in trials if paused_rung(t) is not None]


# The run loop's calls (sweep/run/worker.py): the study's scheduler, or nothing without one.

def pause_at(config: Config, trial: FrozenTrial) -> int | None:
    s = of(config)
    return s.pause_at(config, trial) if s is not None else None


def promote_next(session: Session, states: Mapping[int, TrialState], trials: Sequence[FrozenTrial]) -> int | None:
    s = of(session.config)
    return s.promote_next(session, states, trials) if s is not None else None


def pause(session: Session, number: int, step: int) -> None:
    s = of(session.config)
    assert s is not None  # only a scheduler's pause_at makes a trial pause
    s.pause(session, number, step)


def finish_paused(session: Session, trials: Sequence[FrozenTrial]) -> None:
    s = of(session.config)
    if s is not None:
        s.finish_paused(session, trials)
