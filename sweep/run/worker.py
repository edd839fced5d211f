"""Which trials to skip, adopt or ask, and running them until `n_trials` are finished in total."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweep.checkpoints import retention
from sweep.checkpoints.remote import upload_finished
from sweep.checkpoints.study_checkpoints import StudyCheckpoints
from sweep.checkpoints.steps import newest_step
from sweep.errors import TakenOver
from sweep.host.signals import StopSignal
from sweep.run import plan as plan_lib
from sweep.run.attempts import ClaimedTrial, run_attempts
from sweep.schedulers import base as scheduler
from sweep.store import enqueue, warm_start
from sweep.store.record import CHECKPOINT_DIR, METRICS, PBT_PARAMS
from sweep.store.samplers import grid_points, suggest_all
from sweep.store.session import Session
from sweep.study import objectives
from sweep.tracking.curves import Tracker
from sweep.tracking.dashboard import Dashboard
from sweep.train.compiled import forget_taken_grid_points
from sweep.train.ledger import RESUMES_ATTR
from sweep.train.compile_events import use_compilation_cache
from sweep.train.loop import Outcome
from sweep.train.state import OPTIONAL_KEYS
from sweep.trial import code as trial_code
from sweep.words import numbered

log = logging.getLogger("sweep")
WAIT_POLL_S = 0.5
TRACKING_DRAIN_S = 10.0  # at the end of a run, what the writers have not sent yet gets this long at most


@dataclasses.dataclass(frozen=True)
class Claimed:
    number: int
    adopted: bool
    promoted: bool = False  # a paused trial going on from its rung (sweep/schedulers/base.py)
    asked: optuna.Trial | None = dataclasses.field(default=None, compare=False)  # a new trial: Optuna's handle


def run(session: Session, stop: StopSignal) -> None:
    """Run the study until `n_trials` trials are finished (or the timeout), resuming what was cut off.

    Raises:
        Interrupted: on SIGTERM/SIGINT, after the running trial was checkpointed.
    """
    tracker = Tracker.of(session.config)  # its writers are made (mlflow's import) while the run starts up
    ckpts = StudyCheckpoints(session, OPTIONAL_KEYS)
    try:
        code, finished_at_start = _start(session, ckpts)
    except BaseException:
        tracker.close(0.0)
        ckpts.close()
        raise
    config, claims = session.config, session.claims
    deadline = time.monotonic() + config.study.timeout if config.study.timeout else None
    claims.start_heartbeat()
    tracker.wait_made()
    dashboard = Dashboard(session)
    dashboard.started()
    try:
        while True:
            stop.check()
            with claims.ask_lock():
                claimed = _next_trial(session, deadline)
            if claimed is not None:
                _run_claimed(session, ckpts, claimed, stop, code, tracker, dashboard)
            elif _others_running(session) and not _past(deadline):
                time.sleep(WAIT_POLL_S)  # another worker runs the rest; adopt its trial if it dies
            else:
                break
        dashboard.run_ended()
        _wait_uploads(ckpts)
        # One more pass as the run ends: the ranking is final now, and only this host can remove
        # its own stale copies (a trial it was interrupted on that another host finished after
        # this host's last pass: found by the chaos campaign). After the uploads, so that none of
        # them marks a step in the bucket after the pass pruned it; not where no trial finished
        # since the start's pass (a finished study run again: the pass reads every trial).
        if _finished(session) != finished_at_start:
            _after_finish(session, ckpts)
            _wait_uploads(ckpts)  # the final steps it found missing in the bucket
    finally:
        claims.stop_heartbeat()
        grace = stop.grace_left() - 1.0 if stop.signum is not None else TRACKING_DRAIN_S
        tracker.close(max(0.0, min(TRACKING_DRAIN_S, grace)))
        ckpts.close()


def _wait_uploads(ckpts: StudyCheckpoints) -> None:
    if ckpts.remote is not None and not ckpts.remote.wait(0):
        log.info("waiting for the uploads to %s", ckpts.remote.url)
        ckpts.remote.wait()


def _start(session: Session, ckpts: StudyCheckpoints) -> tuple[dict[str, Any], set[int]]:
    """Open the study (refusing a changed study file), apply the disk budget and a warm start;
    the code this process trains with, and the finished trials' numbers."""
    session.open(create=True)
    session.record_fingerprint()  # refuses a changed study file (also for a caller that skipped run's checks)
    use_compilation_cache(session.cache_dir)
    code = trial_code.record(session.config.trial_module)  # what this process imported: its trials' code
    _log_start(session)
    retention.enforce(session, ckpts.remote, leftovers=True)  # a changed budget, or a removal a kill cut short
    upload_finished(session, ckpts.remote)  # final steps an outage kept from the bucket
    if session.config.study.warm_start is not None:
        with session.claims.ask_lock():  # before the first ask, once, whichever worker comes first
            warm_start.apply(session)
    return code, _finished(session)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _finished(session: Session) -> set[int]:
    """The numbers of the study's finished trials (one narrow query)."""
    return {n for n, state in session.trial_states().items() if state.is_finished()}


def _others_running(session: Session) -> bool:
    """A trial is RUNNING: a live worker's, or an orphan the next pass adopts (its owner's lease
    can run out between that pass's look and this one: a frozen host's trial was left so)."""
    return bool(session.running())


def _next_trial(session: Session, deadline: float | None) -> Claimed | None:
    """Adopt the lowest-numbered orphaned trial, else ask a new one while fewer than n_trials exist.

    Runs under the study's ask lock, so counting and asking are one atomic step across processes.
    Orphans go first: TPE's constant liar would otherwise bias new trials towards them.
    """
    config, claims = session.config, session.claims
    running = session.running()
    live = session.live_numbers(running)
    for t in running:
        if t.number not in live and claims.try_take(claims.key(t.number)):
            # Its owner may have finished it and released the claim since `running` was read.
            if session.trial(t.number).state == TrialState.RUNNING:
                return Claimed(t.number, adopted=True)
            claims.release(claims.key(t.number))
    if _past(deadline):
        return None
    claimed = decide(session)
    if claimed is not None:
        claims.try_take(claims.key(claimed.number))
    if claimed is not None and claimed.asked is not None:
        claimed.asked.set_user_attr(CHECKPOINT_DIR, str(config.checkpoint_dir(claimed.number)))
        claimed.asked.set_user_attr(RESUMES_ATTR, 0)
    return claimed


def decide(session: Session) -> Claimed | None:
    """A free worker's decision, under the ask lock, once no orphan is left to adopt: the
    scheduler's promotion of a paused trial, else an enqueued or new trial while fewer than
    n_trials count, else None (ending the paused trials where nothing can promote them any more).
    The scheduler simulator (sweep/run/simulator.py) makes its workers' decisions with this too."""
    config = session.config
    states = session.trial_states()
    trials = session.trials() if config.study.scheduler is not None else []
    paused = scheduler.paused(trials)
    promoted = scheduler.promote_next(session, states, trials)  # the scheduler's decision before any new trial
    if promoted is not None:
        return Claimed(promoted, adopted=False, promoted=True)
    trial = enqueue.ask(session, states, paused)  # enqueued trials first, each exactly once
    if trial is None:
        if enqueue.counted(states, paused) >= config.study.n_trials:
            if paused and not session.running():  # nothing can make a paused trial promotable now
                scheduler.finish_paused(session, trials)
            return None
        trial = session.ask()
    return Claimed(trial.number, adopted=False, asked=trial)


def _told(session: Session, number: int, outcome: Outcome) -> float | list[float]:
    """What a COMPLETE trial is told: its best value; with several objectives, each one's metric
    at its best step (by the first objective; sweep/study/objectives.py)."""
    study = session.config.study
    if not study.multi_objective:
        return outcome.best_value
    return objectives.told_values(study.all_objectives, session.trial(number).user_attrs[METRICS])


def _run_claimed(session: Session, ckpts: StudyCheckpoints, claimed: Claimed, stop: StopSignal,
                 code: dict[str, Any], tracker: Tracker, dashboard: Dashboard) -> None:
    config, claims = session.config, session.claims
    key = claims.key(claimed.number)
    fence = functools.partial(claims.check, key, f"trial {claimed.number}")
    try:
        frozen = session.trial(claimed.number)
        trial = session.handle(claimed.number)
        # Taken up after an interruption (its last run ended without finishing it): counted here,
        # before anything else, since the run that was cut off could record nothing.
        resumes = int(frozen.user_attrs.get(RESUMES_ATTR, 0)) + int(claimed.adopted)
        if claimed.adopted:
            trial.set_user_attr(RESUMES_ATTR, resumes)
        # Resolved from the workdir, not the attribute: a study folder moved or copied as a whole
        # resumes from its new place and writes nothing at the old one. The attribute (for Optuna
        # readers) is set anew wherever it differs, also for a trial killed between ask and set.
        ckpt_dir = str(config.checkpoint_dir(claimed.number))
        recorded = frozen.user_attrs.get(CHECKPOINT_DIR)
        if (recorded and recorded != ckpt_dir and config.study.checkpoint.remote is None
                and newest_step(ckpt_dir) is None and newest_step(recorded) is not None):
            # Not a moved study (its folder would have the steps) but another workdir for the same
            # storage (a relative default workdir run from another directory): keep the trial's work.
            # Not with a bucket: workdirs are then each host's own and the trial comes from the bucket
            # (another host's folder seen at the same path must not be written to, nor left unpruned).
            log.warning("trial %d: no checkpoint under this run's workdir (%s); its checkpoints are at %s, where it "
                        "ran last: resuming from there (run from the directory the study was started in, or set "
                        "workdir, to keep them together)", claimed.number, ckpt_dir, recorded)
            ckpt_dir = recorded
        if recorded != ckpt_dir:
            trial.set_user_attr(CHECKPOINT_DIR, ckpt_dir)
        params = frozen.user_attrs.get(PBT_PARAMS) or suggest_all(config, trial)  # a PBT exploit's (sweep/schedulers/pbt.py)
        if session.prepare_trial(claimed.number, trial, Path(ckpt_dir)):
            frozen = session.trial(claimed.number)
        trial_code.record_on(trial, frozen, code)
        # Starting up from before its first line: a signal right after "started" finds a trial with
        # nothing new to save (the run loop says so again, with its step, once it restored).
        stop.trial_starting(claimed.number)
        if not claimed.adopted and not claimed.promoted:
            log.info("trial %d: started with params %s", claimed.number, params)
        outcome = run_attempts(session, ckpts, ClaimedTrial(trial, frozen, params, Path(ckpt_dir), fence, resumes,
                                                     resumed=claimed.adopted), stop, tracker)
        fence()  # before the tell
        # Its note before the tell: a kill between leaves it unfinished, and its next end writes the note.
        if outcome is None or outcome.state != "PAUSED":
            dashboard.trial_ended(claimed.number, outcome.state if outcome is not None else "FAIL")
        if outcome is None:
            session.tell(trial, state=TrialState.FAIL)
        elif outcome.state == "PAUSED":
            with claims.ask_lock():  # the decisions of other workers see it running or paused, never between
                scheduler.pause(session, claimed.number, outcome.last_step)
            dashboard.trial_ended(claimed.number, "PAUSED")  # once its pause is recorded, which the note shows
            return  # not finished: its checkpoints stay, its claim is released (finally)
        elif outcome.state == "COMPLETE":
            session.tell(trial, _told(session, claimed.number, outcome))
        else:
            session.tell(trial, state=TrialState.PRUNED)
        session.finished_by_this_process(claimed.number)
        if outcome is not None:
            log.info("trial %d: %s, %s=%r at step %d (best), %d steps", claimed.number, outcome.state.lower(),
                     config.study.objective.metric, outcome.best_value, outcome.best_step, outcome.last_step)
        if ckpts.remote is not None:  # an upload an outage made give up: this trial runs here no more
            ckpts.remote.upload_missing(Path(ckpt_dir), ckpts.upload_fence(claimed.number))
        _after_finish(session, ckpts)
    except TakenOver as exc:
        log.warning("%s", exc)  # the study goes on; the trial is the other worker's now
    finally:
        stop.trial_ended(claimed.number)  # also where it ended before its loop began
        claims.release(key)  # only where this worker is still the owner


def _after_finish(session: Session, ckpts: StudyCheckpoints) -> None:
    """Housekeeping once a trial is finished: the study's disk budget, a grid's compiled programs.
    Its faults are logged, never charged to a trial or the run (the next finish tries again)."""
    try:
        retention.enforce(session, ckpts.remote)  # a finished trial may push another out of the study's budget
        upload_finished(session, ckpts.remote)  # a finished trial's steps an outage kept from the bucket
    except Exception as exc:  # noqa: BLE001 - a removal that failed (a lock, a permission, NFS)
        log.warning("the study's disk budget could not be applied now (%s: %s); tried again after the next trial "
                    "or at the next run", type(exc).__name__, exc)
    points = grid_points(session.config)
    if points:  # a grid study: the compiled programs of hyperparameters no remaining point has go
        forget_taken_grid_points(session.config.trial_module, points, [t.params for t in session.trials()])


def _log_start(session: Session) -> None:
    plan = session.take_start_plan() or plan_lib.make(session)  # a big study: read once
    if plan.finished:
        log.info("%s: finished, skipped", numbered("trial", plan.finished))
    for number, step in sorted(plan.resume.items()):
        log.info("trial %d: interrupted, will resume from %s", number, plan_lib.resume_text(step))
