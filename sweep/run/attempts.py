"""One claimed trial's attempts on this worker: each run of it, its record written only while the
claim holds, its outcome recorded, and the retries from its newest checkpoint after a failure."""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial

from sweep.checkpoints.remote import upload_within_grace
from sweep.checkpoints.study_checkpoints import StudyCheckpoints
from sweep.errors import DiskFault, Interrupted, NonFiniteMetric, TakenOver
from sweep.host import slots
from sweep.host.signals import StopSignal
from sweep.schedulers import base as scheduler
from sweep.store.outage import storage_fault
from sweep.store.record import (BEST_STEP, BEST_VALUE, DATA_SHAPES_ATTR, DEVICES, ERROR, FAILURES, LAST_STEP, METRICS,
                                add_compiles, add_restore, counted_reports, eval_attr, exploited_at, metrics_at)
from sweep.store.session import Session
from sweep.study import constraints
from sweep.study.credentials import scrub
from sweep.tracking.curves import Tracker, TrialLog, trial_start
from sweep.tracking.events import TrialStart
from sweep.train.ledger import LEDGER_ATTR, RESUMES_ATTR, RunLedger, study_account
from sweep.train.loop import Outcome, TrialEvents, run_trial
from sweep.trial import guard as trial_guard
from sweep.words import count

log = logging.getLogger("sweep")


@dataclasses.dataclass
class ClaimedTrial:
    """The trial this worker holds, as its attempts run it."""

    trial: optuna.Trial
    frozen: FrozenTrial  # read anew before a retry: the failed attempt's reports
    params: dict[str, Any]
    ckpt_dir: Path
    fence: Callable[[], None]  # raises TakenOver once this worker no longer holds the trial
    resumes: int  # the trial's interruptions so far
    resumed: bool  # this run takes it up after one (a retry after its own failure is none)

    @property
    def number(self) -> int:
        return self.frozen.number


def run_attempts(session: Session, ckpts: StudyCheckpoints, claimed: ClaimedTrial, stop: StopSignal,
                 tracker: Tracker) -> Outcome | None:
    """Run the trial, retrying up to max_retries times from its newest checkpoint; None if it failed.

    Failures are counted in the `failures` user attribute, so a restart does not reset the count.
    """
    failures = int(claimed.frozen.user_attrs.get(FAILURES, 0))
    while True:
        attempt = _Attempt(session, ckpts, claimed, tracker)
        try:
            return attempt.run(stop)
        except (Interrupted, DiskFault, TakenOver):  # not the trial's fault: no retry charged
            raise
        except Exception as exc:  # a trial that raises fails alone; the study goes on
            if storage_fault(exc):  # the database's fault, not the trial's: the run stops, the trial resumes
                raise
            failures += 1
            if not _record_failure(session, claimed, exc, failures):
                attempt.curves.end("FAIL")
                return None
            claimed.frozen = session.trial(claimed.number)  # the failed attempt's new reports
            claimed.resumed = False  # a retry after the trial's own failure is no interruption
        finally:
            attempt.close()


def _study_account(session: Session) -> dict[str, float] | None:
    """The study's ledger for `checkpoint: {every: auto}` (its interruptions over its wall time, its
    seconds per save), read in one narrow query; None (not read) for any other cadence."""
    if session.config.study.checkpoint.every != "auto":
        return None
    return study_account(session.trial_attrs(LEDGER_ATTR, RESUMES_ATTR).values())


def _record_failure(session: Session, claimed: ClaimedTrial, exc: Exception, failures: int) -> bool:
    """Count the failure and keep its error on the trial (a storage row: no secret); True if it is retried."""
    max_retries = session.config.study.max_retries
    claimed.trial.set_user_attr(FAILURES, failures)
    claimed.trial.set_user_attr(ERROR, scrub(f"{type(exc).__name__}: {exc}")[:500])
    retry = failures <= max_retries and not isinstance(exc, NonFiniteMetric)
    log.error("Trial %d failed with parameters: %s because of the following error: %r.%s", claimed.number,
              claimed.params, exc, f" Retrying ({failures} of {max_retries}) from its newest checkpoint."
              if retry else "")
    return retry


class _Attempt:
    """One run of the claimed trial: its tracking log and checkpoints, then the trial's outcome."""

    def __init__(self, session: Session, ckpts: StudyCheckpoints, claimed: ClaimedTrial, tracker: Tracker) -> None:
        self.session, self.ckpts, self.claimed, self.frozen = session, ckpts, claimed, claimed.frozen
        number, ckpt_dir, fence = claimed.number, claimed.ckpt_dir, claimed.fence
        self.curves = TrialLog(tracker, self._tracking_start)
        self.ckpt = ckpts.trial(number, ckpt_dir, fence=fence, on_commit=self.curves.checkpoint)
        self.ckpt.restore_floor = exploited_at(self.frozen)  # a PBT member never resumes into a lineage it left
        self.threads = set(threading.enumerate())

    def run(self, stop: StopSignal) -> Outcome:
        """Train the trial; a COMPLETE or PRUNED outcome is recorded and its last save on disk."""
        session, config, claimed, frozen = self.session, self.session.config, self.claimed, self.frozen
        number = claimed.number
        writes = _FencedWrites(session, claimed, frozen, self.curves)
        try:
            with trial_guard.guarded():  # an exit in the trial's code fails the trial, not the run
                outcome = run_trial(config, number, config.hyperparameters(claimed.params), writes,
                                    counted_reports(frozen, config.study.objective.metric), self.ckpt, stop,
                                    writes.events(),
                                    seed_number=session.seed_number(number), pause_at=scheduler.pause_at(config, frozen),
                                    ledger=RunLedger(frozen.user_attrs.get(LEDGER_ATTR), writes.ledger,
                                                     claimed.resumes, resumed=claimed.resumed,
                                                     study=_study_account(session)))
            claimed.fence()
            if outcome.state == "PAUSED":  # its rung checkpoint on disk before it is paused
                self.ckpt.wait()
                self.ckpt.drop_ram()
                return outcome
            _record_outcome(session, claimed.trial, outcome)  # while the final save is still being written
            self.ckpt.wait()  # told only once it is on disk
            self.ckpt.drop_ram()  # its last step is on disk: the RAM tier's copy goes
            self.curves.end(outcome.state, outcome.best_step)
            return outcome
        except Interrupted:
            self.curves.end("INTERRUPTED")
            upload_within_grace(self.ckpts.remote, number, claimed.ckpt_dir, stop.grace_left() - 1.0)
            raise

    def close(self) -> None:
        self.ckpt.close()
        left = [t.name for t in trial_guard.leftover_threads(self.threads)]
        if left:
            log.warning("trial %d: its code left %s running (%s); the run does not wait for them at exit",
                        self.claimed.number, count(len(left), "thread"), ", ".join(left[:5]))

    def _tracking_start(self, step: int) -> TrialStart:
        claimed = self.claimed
        return trial_start(self.session.config, claimed.trial, self.frozen, claimed.params, step, claimed.ckpt_dir,
                           claimed.fence)


def _record_outcome(session: Session, trial: optuna.Trial, outcome: Outcome) -> None:
    """Before the tell: the best step, its value and metrics, the last step, and the constraint
    values (where the sampler and readers find them). Optuna keeps the first value of a
    constraint key (a resumed trial's are the same: bit-identical)."""
    study = session.config.study
    best_metrics = metrics_at(session.trial(trial.number), outcome.best_step, study.objective.metric)
    for name, value in ((BEST_STEP, outcome.best_step), (BEST_VALUE, outcome.best_value),
                        (LAST_STEP, outcome.last_step), (METRICS, best_metrics)):
        trial.set_user_attr(name, value)
    recorded = session.trial(trial.number).constraints
    for key, value in zip(constraints.keys(study.constraints), constraints.values(study.constraints, best_metrics)):
        if key not in recorded:
            trial.set_constraint(key, value)


class _FencedWrites:
    """The running trial's reports and events, written to its record only while this worker holds
    it: each write checks the claim first (a worker frozen past the lease grace may have lost the
    trial to another). Also the loop's reporter.

    A multi-objective trial reports nothing and is never pruned: Optuna supports neither for
    several objectives (its per-step metrics are the `eval:<step>` user attributes)."""

    def __init__(self, session: Session, claimed: ClaimedTrial, frozen: FrozenTrial, curves: TrialLog) -> None:
        self.session, self.trial, self.frozen, self.curves = session, claimed.trial, frozen, curves
        self.fence = claimed.fence
        self.multi_objective = session.config.study.multi_objective

    def events(self) -> TrialEvents:
        return TrialEvents(self.restored, self.step, self.evaluation, self.compiles, self.data_shapes, self.devices)

    def report(self, value: float, step: int) -> None:
        self.fence()
        if not self.multi_objective:
            self.trial.report(value, step)

    def should_prune(self) -> bool:
        return not self.multi_objective and self.trial.should_prune()

    def step(self, number: int, step: int) -> None:
        self.session.on_step(number, step)
        self.curves.on_step(step)

    def evaluation(self, step: int, metrics: dict[str, float]) -> None:
        self.fence()
        self.trial.set_user_attr(eval_attr(step), metrics)
        self.curves.evaluation(step, metrics)

    def restored(self, step: int) -> bool:
        self.fence()
        return add_restore(self.trial, self.session.trial(self.trial.number).user_attrs, step)

    def data_shapes(self, shapes: dict[str, Any]) -> None:
        if self.frozen.user_attrs.get(DATA_SHAPES_ATTR) != shapes:
            self.fence()
            self.trial.set_user_attr(DATA_SHAPES_ATTR, shapes)

    def devices(self, names: list[str]) -> None:
        self.fence()
        self.trial.set_user_attr(DEVICES, names)
        if slots.assigned_here():  # a host of several devices: say which slot the trial runs on
            log.info("trial %d: on %s", self.trial.number, ",".join(names))

    def compiles(self, counts: dict[str, float]) -> None:
        try:
            self.fence()
        except TakenOver:
            return  # nothing more is written for a trial this worker lost
        add_compiles(self.trial, self.session.trial(self.trial.number).user_attrs, counts)

    def ledger(self, total: dict[str, float]) -> None:
        try:
            self.fence()
            self.trial.set_user_attr(LEDGER_ATTR, total)
        except TakenOver:
            return
        except Exception as exc:  # noqa: BLE001 - an account, not the trial's work: never charged
            log.debug("trial %d: ledger not written (%s)", self.trial.number, exc)
