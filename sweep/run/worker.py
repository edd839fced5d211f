"""Which trials to skip, adopt or ask, and running them until `n_trials` are finished in total."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import retention
from sweep.checkpoints.remote import upload_finished, upload_within_grace
from sweep.checkpoints.steps import newest_step
from sweep.errors import DiskFault, Interrupted, NonFiniteMetric, TakenOver
from sweep.host import slots
from sweep.host.signals import StopSignal
from sweep.run import plan as plan_lib
from sweep.schedulers import base as scheduler
from sweep.store import enqueue, warm_start
from sweep.store.outage import storage_fault
from sweep.store.record import (BEST_STEP, BEST_VALUE, CHECKPOINT_DIR, DATA_SHAPES_ATTR, DEVICES, ERROR, FAILURES,
                                LAST_STEP, METRICS, PBT_PARAMS, add_compiles, add_resume, counted_reports, eval_attr,
                                exploited_at, metrics_at)
from sweep.store.samplers import grid_points, suggest_all
from sweep.store.session import Session
from sweep.study import constraints, objectives
from sweep.study.credentials import scrub
from sweep.tracking.curves import Tracker, TrialLog, trial_start
from sweep.train.compiled import forget_taken_grid_points
from sweep.train.ledger import LEDGER_ATTR, RESUMES_ATTR, RunLedger
from sweep.train.loop import Outcome, TrialEvents, run_trial
from sweep.trial import code as trial_code
from sweep.trial import guard as trial_guard
from sweep.words import count, numbered

log = logging.getLogger("sweep")
WAIT_POLL_S = 0.5
TRACKING_DRAIN_S = 10.0  # at the end of a run, what the writers have not sent yet gets this long at most


@dataclasses.dataclass(frozen=True)
class Claimed:
    number: int
    adopted: bool
    promoted: bool = False  # a paused trial going on from its rung (sweep/schedulers/base.py)


def run(session: Session, stop: StopSignal) -> None:
    """Run the study until `n_trials` trials are finished (or the timeout), resuming what was cut off.

    Raises:
        Interrupted: on SIGTERM/SIGINT, after the running trial was checkpointed.
    """
    tracker = Tracker.of(session.config)  # its writers are made (mlflow's import) while the run starts up
    try:
        code, finished_at_start = _start(session)
    except BaseException:
        tracker.close(0.0)
        raise
    config, claims = session.config, session.claims
    deadline = time.monotonic() + config.study.timeout if config.study.timeout else None
    claims.start_heartbeat()
    tracker.wait_made()
    try:
        while True:
            stop.check()
            with claims.ask_lock():
                claimed = _next_trial(session, deadline)
            if claimed is not None:
                _run_claimed(session, claimed, stop, code, tracker)
            elif _others_running(session) and not _past(deadline):
                time.sleep(WAIT_POLL_S)  # another worker runs the rest; adopt its trial if it dies
            else:
                break
        _wait_uploads(session)
        # One more pass as the run ends: the ranking is final now, and only this host can remove
        # its own stale copies (a trial it was interrupted on that another host finished after
        # this host's last pass: found by the chaos campaign). After the uploads, so that none of
        # them marks a step in the bucket after the pass pruned it; not where no trial finished
        # since the start's pass (a finished study run again: the pass reads every trial).
        if _finished(session) != finished_at_start:
            _after_finish(session)
            _wait_uploads(session)  # the final steps it found missing in the bucket
    finally:
        claims.stop_heartbeat()
        grace = stop.grace_left() - 1.0 if stop.signum is not None else TRACKING_DRAIN_S
        tracker.close(max(0.0, min(TRACKING_DRAIN_S, grace)))


def _wait_uploads(session: Session) -> None:
    if session.remote is not None and not session.remote.wait(0):
        log.info("waiting for the uploads to %s", session.remote.url)
        session.remote.wait()


def _start(session: Session) -> tuple[dict[str, Any], set[int]]:
    """Open the study (refusing a changed study file), apply the disk budget and a warm start;
    the code this process trains with, and the finished trials' numbers."""
    session.open(create=True)
    session.record_fingerprint()  # refuses a changed study file (also for a caller that skipped run's checks)
    session.use_compilation_cache()
    code = trial_code.record(session.config.trial_module)  # what this process imported: its trials' code
    _log_start(session)
    retention.enforce(session, leftovers=True)  # a changed budget, or a removal a kill cut short
    upload_finished(session)  # final steps an outage kept from the bucket
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
    states = session.trial_states()
    trials = session.trials() if config.study.scheduler is not None else []
    paused = scheduler.paused(trials)
    promoted = scheduler.promote_next(session, states, trials)  # the scheduler's decision before any new trial
    if promoted is not None:
        claims.try_take(claims.key(promoted))
        return Claimed(promoted, adopted=False, promoted=True)
    trial = enqueue.ask(session, states, paused)  # enqueued trials first, each exactly once
    if trial is None:
        if enqueue.counted(states, paused) >= config.study.n_trials:
            if paused and not session.running():  # nothing can make a paused trial promotable now
                scheduler.finish_paused(session, trials)
            return None
        trial = session.ask()
    claims.try_take(claims.key(trial.number))
    trial.set_user_attr(CHECKPOINT_DIR, str(config.checkpoint_dir(trial.number)))
    trial.set_user_attr(RESUMES_ATTR, 0)
    return Claimed(trial.number, adopted=False)


def _told(session: Session, number: int, outcome: Outcome) -> float | list[float]:
    """What a COMPLETE trial is told: its best value; with several objectives, each one's metric
    at its best step (by the first objective; sweep/study/objectives.py)."""
    study = session.config.study
    if not study.multi_objective:
        return outcome.best_value
    return objectives.told_values(study.all_objectives, session.trial(number).user_attrs[METRICS])


class _Fenced:
    """The trial as the runner's reporter, checking before each report that this worker still
    holds it (a worker frozen past the lease grace may have lost it to another).

    A multi-objective trial reports nothing and is never pruned: Optuna supports neither for
    several objectives (its per-step metrics are the `eval:<step>` user attributes)."""

    def __init__(self, trial: optuna.Trial, fence: Callable[[], None], multi_objective: bool = False) -> None:
        self.trial, self.fence, self.multi_objective = trial, fence, multi_objective

    def report(self, value: float, step: int) -> None:
        self.fence()
        if not self.multi_objective:
            self.trial.report(value, step)

    def should_prune(self) -> bool:
        return not self.multi_objective and self.trial.should_prune()


def _run_claimed(session: Session, claimed: Claimed, stop: StopSignal, code: dict[str, Any],
                 tracker: Tracker) -> None:
    config, claims = session.config, session.claims
    key = claims.key(claimed.number)

    def fence() -> None:
        claims.check(key, f"trial {claimed.number}")

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
        if (recorded and recorded != ckpt_dir and session.remote is None and newest_step(ckpt_dir) is None
                and newest_step(recorded) is not None):
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
        if not claimed.adopted and not claimed.promoted:
            log.info("trial %d: started with params %s", claimed.number, params)
        outcome = _attempts(session, trial, frozen, params, Path(ckpt_dir), stop, fence, (resumes, claimed.adopted),
                            tracker)
        fence()  # before the tell
        if outcome is None:
            session.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        elif outcome.state == "PAUSED":
            with claims.ask_lock():  # the decisions of other workers see it running or paused, never between
                scheduler.pause(session, claimed.number, outcome.last_step)
            return  # not finished: its checkpoints stay, its claim is released (finally)
        elif outcome.state == "COMPLETE":
            session.study.tell(trial, _told(session, claimed.number, outcome), skip_if_finished=True)
        else:
            session.study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        session.finished_here.add(claimed.number)
        if outcome is not None:
            log.info("trial %d: %s, %s=%r at step %d (best), %d steps", claimed.number, outcome.state.lower(),
                     config.study.objective.metric, outcome.best_value, outcome.best_step, outcome.last_step)
        if session.remote is not None:  # an upload an outage made give up: this trial runs here no more
            session.remote.upload_missing(Path(ckpt_dir), session.upload_fence(claimed.number))
        _after_finish(session)
    except TakenOver as exc:
        log.warning("%s", exc)  # the study goes on; the trial is the other worker's now
    finally:
        claims.release(key)  # only where this worker is still the owner


def _attempts(session: Session, trial: optuna.Trial, frozen: FrozenTrial, params: dict[str, Any],
              ckpt_dir: Path, stop: StopSignal, fence: Callable[[], None],
              interrupted: tuple[int, bool], tracker: Tracker) -> Outcome | None:
    """Run the trial, retrying up to max_retries times from its newest checkpoint; None if it failed.

    Failures are counted in the `failures` user attribute, so a restart does not reset the count.
    `interrupted`: (the trial's interruptions so far, whether this run takes it up after one).
    """
    resumes, resumed = interrupted
    config = session.config
    number, failures = frozen.number, int(frozen.user_attrs.get(FAILURES, 0))
    while True:
        curves = TrialLog(tracker, lambda step, frozen=frozen: trial_start(config, trial, frozen, params, step,
                                                                           ckpt_dir, fence))
        ckpt = session.checkpoints(number, ckpt_dir, fence=fence, on_commit=curves.checkpoint)
        ckpt.restore_floor = exploited_at(frozen)  # a PBT member never resumes into a lineage it left

        def on_step(n: int, step: int) -> None:
            session.on_step(n, step)
            curves.on_step(step)

        def on_evaluation(step: int, metrics: dict[str, float]) -> None:
            fence()
            trial.set_user_attr(eval_attr(step), metrics)
            curves.evaluation(step, metrics)

        def on_restore(step: int) -> None:
            fence()
            add_resume(trial, session.trial(trial.number).user_attrs, step)

        def on_data_shapes(shapes: dict[str, Any]) -> None:
            if frozen.user_attrs.get(DATA_SHAPES_ATTR) != shapes:
                fence()
                trial.set_user_attr(DATA_SHAPES_ATTR, shapes)

        def on_devices(names: list[str]) -> None:
            fence()
            trial.set_user_attr(DEVICES, names)
            if slots.assigned_here():  # a host of several devices: say which slot the trial runs on
                log.info("trial %d: on %s", number, ",".join(names))

        def on_compiles(counts: dict[str, float]) -> None:
            try:
                fence()
            except TakenOver:
                return  # nothing more is written for a trial this worker lost
            add_compiles(trial, session.trial(trial.number).user_attrs, counts)

        def write_ledger(total: dict[str, float]) -> None:
            try:
                fence()
                trial.set_user_attr(LEDGER_ATTR, total)
            except TakenOver:
                return
            except Exception as exc:  # noqa: BLE001 - an account, not the trial's work: never charged
                log.debug("trial %d: ledger not written (%s)", number, exc)

        threads = set(threading.enumerate())
        try:
            with trial_guard.guarded():  # an exit in the trial's code fails the trial, not the run
                outcome = run_trial(config, number, config.hyperparameters(params),
                                    _Fenced(trial, fence, config.study.multi_objective),
                                    counted_reports(frozen, config.study.objective.metric), ckpt, stop,
                                    TrialEvents(on_restore, on_step, on_evaluation, on_compiles, on_data_shapes,
                                                on_devices),
                                    seed_number=session.seed_number(number), pause_at=scheduler.pause_at(config, frozen),
                                    ledger=RunLedger(frozen.user_attrs.get(LEDGER_ATTR), write_ledger, resumes,
                                                     resumed=resumed))
            fence()
            if outcome.state == "PAUSED":  # its rung checkpoint on disk before it is paused
                ckpt.wait()
                return outcome
            # Recorded while the final save is still being written; told only once it is on disk.
            best_metrics = metrics_at(session.trial(number), outcome.best_step, config.study.objective.metric)
            for name, value in ((BEST_STEP, outcome.best_step), (BEST_VALUE, outcome.best_value),
                                (LAST_STEP, outcome.last_step), (METRICS, best_metrics)):
                trial.set_user_attr(name, value)
            _set_constraints(session, trial, best_metrics)
            ckpt.wait()
            curves.end(outcome.state, outcome.best_step)
            return outcome
        except Interrupted:
            curves.end("INTERRUPTED")
            upload_within_grace(session, number, ckpt_dir, stop.grace_left() - 1.0)
            raise
        except (DiskFault, TakenOver):  # not the trial's fault: no retry charged
            raise
        except Exception as exc:  # a trial that raises fails alone; the study goes on
            if storage_fault(exc):  # the database's fault, not the trial's: the run stops, the trial resumes
                raise
            failures += 1
            trial.set_user_attr(FAILURES, failures)
            trial.set_user_attr(ERROR, scrub(f"{type(exc).__name__}: {exc}")[:500])  # a storage row: no secret
            retry = failures <= config.study.max_retries and not isinstance(exc, NonFiniteMetric)
            log.error("Trial %d failed with parameters: %s because of the following error: %r.%s", number,
                      params, exc, f" Retrying ({failures} of {config.study.max_retries}) from its newest checkpoint."
                      if retry else "")
            if not retry:
                curves.end("FAIL")
                return None
            frozen = session.trial(number)  # the failed attempt's new reports
            resumed = False  # a retry after the trial's own failure is no interruption
        finally:
            ckpt.close()
            _warn_leftover_threads(number, threads)


def _warn_leftover_threads(number: int, before: set[threading.Thread]) -> None:
    left = [t.name for t in trial_guard.leftover_threads(before)]
    if left:
        log.warning("trial %d: its code left %s running (%s); the run does not wait for them at exit",
                    number, count(len(left), "thread"), ", ".join(left[:5]))


def _set_constraints(session: Session, trial: optuna.Trial, metrics: dict[str, Any]) -> None:
    """Before the tell: the trial's constraint values, where the sampler and readers find them.
    Optuna keeps the first value of a key (a resumed trial's are the same: bit-identical)."""
    study = session.config.study
    recorded = session.trial(trial.number).constraints
    for key, value in zip(constraints.keys(study.constraints), constraints.values(study.constraints, metrics)):
        if key not in recorded:
            trial.set_constraint(key, value)


def _after_finish(session: Session) -> None:
    """Housekeeping once a trial is finished: the study's disk budget, a grid's compiled programs.
    Its faults are logged, never charged to a trial or the run (the next finish tries again)."""
    try:
        retention.enforce(session)  # a finished trial may push another out of the study's budget
        upload_finished(session)  # a finished trial's steps an outage kept from the bucket
    except Exception as exc:  # noqa: BLE001 - a removal that failed (a lock, a permission, NFS)
        log.warning("the study's disk budget could not be applied now (%s: %s); tried again after the next trial "
                    "or at the next run", type(exc).__name__, exc)
    points = grid_points(session.config)
    if points:  # a grid study: the compiled programs of hyperparameters no remaining point has go
        forget_taken_grid_points(session.config.trial_module, points, [t.params for t in session.trials()])


def _log_start(session: Session) -> None:
    plan, session.start_plan = session.start_plan or plan_lib.make(session), None  # a big study: read once
    if plan.finished:
        log.info("%s: finished, skipped", numbered("trial", plan.finished))
    for number, step in sorted(plan.resume.items()):
        log.info("trial %d: interrupted, will resume from %s", number, plan_lib.resume_text(step))
