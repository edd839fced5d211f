"""The Python API: `sweep.open(study)` and the verbs of the CLI as methods of the study session."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from sweep.errors import UsageError
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.study.config import Config

if TYPE_CHECKING:
    from sweep.commands.best import LoadedTrial
    from sweep.commands.drill import DrillReport
    from sweep.results import ExportIndex, StudyStatus
    from sweep.run.plan import Plan
    from sweep.schedulers.replay import ReplayReport


class StudySession:
    """A study opened from Python: what `python -m sweep COMMAND` does, as methods.

    Nothing is created until `run()`; readers (`status`, `export`, ...) need the study to exist.
    Use it as a context manager, or call `close()`, to release the storage connection.

    It wraps the internal session (storage, claims, the restart-proof sampler, the progress meter)
    rather than inheriting it, so that only the methods below are the user's to call.
    """

    def __init__(self, session: Session | Config) -> None:
        self._session = session if isinstance(session, Session) else Session(session)

    @property
    def config(self) -> Config:
        """The validated study (`config.study` holds the study file's keys)."""
        return self._session.config

    def __enter__(self) -> StudySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the storage connection (the session opens it again when used)."""
        self._session.close()

    def run(self, n_jobs: int | str | None = None, *, quiet: bool = False, verbose: bool = False,
            progress: bool = True, log_every: float = 30.0, exit_on_signal: bool = False,
            read_status: bool = True) -> StudyStatus | None:
        """Start the study, or resume it after any interruption, until `n_trials` are finished.

        Args:
            n_jobs: trials at once (default: the study's `parallel.n_jobs`); "auto": one per device
                slot (sweep/host/slots.py).
            quiet / verbose: sweep's log level (warnings only / library logs too).
            progress: show progress on stderr: a live table on a terminal, else a log line per
                running trial every `log_every` seconds.
            exit_on_signal: end the process at once on a second Ctrl-C, past the grace period, or
                on a signal while every trial is still starting up, as `python -m sweep run` does
                (default: a second Ctrl-C raises KeyboardInterrupt, the grace period only logs).
            read_status: False returns None instead of reading `status()` afterwards (every
                trial, again: a big study), e.g. to print `summary()` instead, as the CLI does.

        Returns:
            `status()` of the study afterwards (None with `read_status=False`).

        Raises:
            ConfigError: a sampler/pruner argument or the device count is wrong, or the workers need
                more devices than the host has (nothing created).
            Interrupted: SIGTERM/SIGINT (in the main thread): running trials were checkpointed.
        """
        from sweep.host import slots
        from sweep.run import logs

        config = self.config
        n_jobs = n_jobs if n_jobs is not None else config.study.parallel.n_jobs
        if n_jobs != "auto" and (not isinstance(n_jobs, int) or n_jobs < 1):
            raise UsageError(f"n_jobs: must be >= 1 or 'auto', got {n_jobs!r}")
        if not log_every > 0:
            raise UsageError(f"log_every: must be > 0, got {log_every}")
        logs.setup(quiet, verbose)
        # Before JAX starts here: this process is worker 0, and on GPUs its slot decides what it sees.
        n, worker_slots = slots.for_run(config, n_jobs)
        with slots.assigned(worker_slots[0] if worker_slots else None):
            self._run(n, worker_slots, quiet, verbose, progress, log_every, exit_on_signal)
        return self.status() if read_status else None

    def _run(self, n_jobs: int, worker_slots: list[Any] | None, quiet: bool, verbose: bool, progress: bool,
             log_every: float, exit_on_signal: bool) -> None:
        from sweep.commands import progress as progress_lib
        from sweep.host.signals import StopSignal
        from sweep.run.pool import dask_client, run_workers
        from sweep.store import warm_start
        from sweep.checkpoints.tiers import tier_class
        from sweep.store.samplers import check_config

        config = self.config
        check_config(config)
        tier_class(config)  # checkpoint.remote's tier imports and is one (exit 2 before anything is written)
        warm_start.check(config)  # the other study exists (nothing created before)
        self._session.keep_start_plan(self._check_before_run())  # its lines as the run starts: not read twice
        # The quick exit of a run still starting up only where this process runs every trial
        # (no helper process or Dask worker whose trials it would cut off).
        stop = StopSignal(config.study.checkpoint.grace_seconds, hard_exit=exit_on_signal,
                          quick_exit=n_jobs == 1 and config.study.parallel.backend != "dask")
        if threading.current_thread() is threading.main_thread():
            stop.install()  # elsewhere a Python signal handler cannot be set; the caller stops it
        try:
            # A Dask cluster is reached before anything is written (an unreachable one is an error).
            client = dask_client(config) if config.study.parallel.backend == "dask" else None
            view: Any = contextlib.nullcontext() if quiet or not progress else progress_lib.Display(
                self._session, live=sys.stderr.isatty(), every_s=log_every)
            with view, client or contextlib.nullcontext():
                run_workers(self._session, n_jobs, stop, quiet=quiet, verbose=verbose, client=client, slots=worker_slots)
            if config.study.logging.mlflow is not None:
                from sweep.commands.export import export
                from sweep.tracking.curves import log_exports

                # each finished trial's best export, an artifact of its run
                log_exports(self._session, lambda number, out: export(self._session, out, trial=number))
        finally:
            stop.restore()

    def _check_before_run(self) -> Plan:
        """What `run` checks before it creates or asks anything; returns the plan it found.

        Raises:
            ConfigError: the study file changed keys that define what the study's trials mean, or
                the trial's code cannot train or evaluate (an abstract step: nothing is trained).
        """
        import logging

        from sweep.run import plan as plan_lib
        from sweep.run import preflight
        from sweep.store.samplers import sampler_notes
        from sweep.study import fingerprint

        try:
            plan = plan_lib.make(self._session)
        finally:
            self.close()  # run opens it again to write (and readers keep no connection)
        if plan.refused:
            raise fingerprint.refusal(self.config, self.config.storage, plan.refused)
        log = logging.getLogger("sweep")
        if plan.code_changed and plan.has_work:
            log.warning(plan_lib.code_warning(plan))
        if plan.new:
            for level, note in sampler_notes(self.config):
                log.log(level, note)
        warning = self._session.backend.start_warning(self.config)  # e.g. SQLite on a network filesystem
        if warning is not None:
            log.warning(warning)
        if preflight.needed(plan):
            preflight.check(self.config)
        return plan

    def plan(self) -> Plan:
        """What `run` would do now (skip, resume from which step, start), or the change it would
        refuse (`Plan.refused`); reads only, trains nothing. `str(plan)` is the CLI's text.

        Raises:
            ConfigError: the trial's code cannot train or evaluate, as `run` would.
        """
        from sweep.run import plan as plan_lib
        from sweep.run import preflight
        from sweep.checkpoints.tiers import tier_class
        from sweep.store.samplers import check_config

        check_config(self.config)  # sampler/pruner arguments, as `run` checks them first
        tier_class(self.config)  # and the tier of checkpoint.remote
        plan = plan_lib.make(self._session, decide=True)
        if not plan.refused and preflight.needed(plan):
            preflight.check(self.config)
        return plan

    def summary(self) -> str:
        """The end-of-run summary `run` prints (scores the best checkpoint on the test split once)."""
        from sweep.commands import summary

        return summary.text(self._session.open(create=False))

    def status(self) -> StudyStatus:
        """The `status --json` object (every field: docs/reference.md). Reads only."""
        from sweep.commands import status

        return status.collect(self._session)

    def export(self, out: str | os.PathLike[str], trial: int | None = None,
               include_pruned: bool = False) -> ExportIndex:
        """Write every COMPLETE trial's best checkpoint (or only `trial`'s) to `out`; returns index.json."""
        from sweep.commands.export import export

        return export(self._session, Path(out), trial=trial, include_pruned=include_pruned)

    def plot(self, out: str | os.PathLike[str]) -> list[Path]:
        """Write the study's figures and every trial's learning curve; returns the files written."""
        from sweep.commands.plot import plot

        return plot(self._session, Path(out))

    def load_best(self, trial: int | None = None) -> LoadedTrial:
        """The full training state of a trial's best checkpoint (default: the study's best trial)."""
        from sweep.commands.best import load_trial

        return load_trial(self._session, trial)

    def drill(self, seed: int | None = None, keep: bool = False) -> DrillReport:
        """The recovery drill on real processes (see `python -m sweep drill --help`)."""
        from sweep.commands.drill import drill

        return drill(self.config, seed=seed, keep=keep)

    def replay(self, trial: int | None = None) -> ReplayReport:
        """scheduler pbt: retrain trial `trial`'s lineage (default: the best) from scratch and
        compare its final state with the saved one (see `python -m sweep replay --help`)."""
        from sweep.schedulers.replay import replay

        return replay(self._session, trial)

    def retry(self, trials: list[int] | None = None, *, from_scratch: bool = False) -> list[int]:
        """Reopen FAIL trials (default: every one; else those numbered in `trials`) for the next
        `run()` to train again under the same number and params, from their newest checkpoint or,
        with `from_scratch`, from step 0; returns the numbers reopened (see `python -m sweep retry`).

        Raises:
            ConfigError: the study file changed keys that define what its trials mean.
            UsageError: a number that is no FAIL trial; `from_scratch` with checkpoint.remote.
        """
        from sweep.checkpoints.tiers import tier_class
        from sweep.commands.retry import reopen
        from sweep.host.signals import grace_seconds
        from sweep.run import preflight
        from sweep.store import warm_start
        from sweep.store.samplers import check_config

        check_config(self.config)  # what `run` refuses (exit 2) is refused before a trial is reopened
        tier_class(self.config)
        warm_start.check(self.config)
        grace_seconds(self.config.study.checkpoint.grace_seconds)  # a bad $SWEEP_GRACE_SECONDS
        preflight.check(self.config)  # the fixed code trains and evaluates (an abstract step)
        try:
            return reopen(self._session, trials, from_scratch)
        finally:
            self.close()  # run opens it again

    def continue_(self, steps: int, top: int | None = None, trials: list[int] | None = None, *,
                  quiet: bool = False, exit_on_signal: bool = False) -> StudySession:
        """Train finished trials further to `steps` steps, as `python -m sweep continue`: the `top`
        best COMPLETE trials, or the trials numbered in `trials`. Re-running resumes it.
        `quiet`, `exit_on_signal`: as for `run`.

        Returns:
            The companion study, run (its `status()`, `export()`, ... read the continued trials).

        Raises:
            UsageError: a chosen trial cannot be continued (named, with why).
        """
        from sweep.commands import continuation

        if (top is None) == (trials is None):
            raise UsageError("continue_: give exactly one of top or trials")
        companion = StudySession(continuation.start(self.config, steps, top, trials))
        try:
            companion.run(1, quiet=quiet, exit_on_signal=exit_on_signal)
        except BaseException:
            companion.close()
            raise
        return companion

    def continued(self, steps: int) -> StudySession:
        """The companion study of the trials continued to `steps` steps, to read (`status()`, `export()`, ...).

        Raises:
            StudyNotFound: no trial was continued to `steps` steps.
        """
        from sweep.commands import continuation

        return StudySession(continuation.open_companion(self.config, steps))


def open(study: str | os.PathLike[str] | Mapping[str, Any], *,  # noqa: A001 (like io.open)
         import_trial: bool = True) -> StudySession:
    """Validate a study (a study file's path, or its keys as a mapping) and return its session.

    Relative paths in the study (workdir, storage, a trial module) resolve against the current
    directory, as on the command line. Nothing is created until `run()`. `import_trial=False`
    imports the trial module only when a method needs it (`status()` and `plot()` never do), so a
    study whose module no longer imports can still be read.

    Raises:
        ConfigError: the study breaks a rule of the study file (the message names key and value).
    """
    if isinstance(study, Mapping):
        config = config_lib.from_dict(dict(study), import_trial=import_trial)
    else:
        config = config_lib.load(study, import_trial=import_trial)
    return StudySession(config)
