"""Running the scheduler in this process, or in `n_jobs` worker processes through joblib."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import optuna

from sweep import scheduler
from sweep.config import Config
from sweep.errors import Interrupted, SweepError
from sweep.runner import StopSignal

log = logging.getLogger("sweep")

_BUSY = threading.Event()  # this worker process is running a study
_WATCHING: list[int] = []  # the parent pid the watcher thread watches (started once per process)


def _watch_parent() -> None:
    """A loky worker outlives a parent killed with SIGKILL (no atexit ran to stop it), keeps
    training, and holds the parent's stdout/stderr open. So: when the parent is gone, a busy worker
    stops as on SIGTERM (its trial checkpoints and stays resumable) and an idle one exits."""
    parent = _WATCHING[0]
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            if not _BUSY.is_set():
                os._exit(0)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _worker(study_file: str, quiet: bool, verbose: bool) -> None:
    # Each worker is a full scheduler: claims in the database keep every trial to one worker.
    from sweep import config as config_lib
    from sweep import logs

    if not _WATCHING:
        _WATCHING.append(os.getppid())
        threading.Thread(target=_watch_parent, name="sweep-parent-watch", daemon=True).start()
    logs.setup(quiet, verbose)
    config = config_lib.load(study_file)
    stop = StopSignal(config.study.checkpoint.grace_seconds)
    stop.install()
    _BUSY.set()
    try:
        scheduler.run(config, stop)
    except Interrupted as exc:
        if os.getppid() != _WATCHING[0]:  # orphaned: checkpointed; nobody to report to
            os._exit(exc.exit_code)
        raise
    finally:
        _BUSY.clear()


def _dask_worker(study_file: str, cwd: str, quiet: bool, verbose: bool, stop_event: str) -> None:
    """A worker in a Dask worker's thread: no signals there (not the main thread), so the parent's
    SIGTERM/SIGINT reaches it through a distributed.Event; paths resolve as in the parent."""
    import distributed

    from sweep import config as config_lib
    from sweep import logs

    os.chdir(cwd)  # relative workdir/storage/trial module paths mean what they meant to the parent
    logs.setup(quiet, verbose)
    config = config_lib.load(study_file)
    stop = StopSignal(config.study.checkpoint.grace_seconds)
    event = distributed.Event(stop_event)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                if event.wait(timeout=1.0):
                    stop.signum = signal.SIGTERM  # checked after every training window
                    return
            except Exception:  # the scheduler went away: keep the trial going, it is claims-safe
                time.sleep(1.0)

    threading.Thread(target=watch, name="sweep-dask-stop", daemon=True).start()
    try:
        scheduler.run(config, stop)
    except Interrupted:
        pass  # checkpointed; the parent, which forwarded the signal, exits with its code
    finally:
        done.set()


def dask_client(config: Config) -> Any:
    """A distributed.Client of the cluster at parallel.address; connected before anything is written."""
    import distributed

    address = config.study.parallel.address
    try:
        return distributed.Client(address, timeout="10s")
    except OSError as exc:
        raise SweepError(f"{config.path}: parallel.address: cannot reach the Dask scheduler at {address} "
                         f"({type(exc).__name__}: {exc})") from None


def _run_dask(config: Config, n_jobs: int, stop: StopSignal, quiet: bool, verbose: bool, client: Any) -> None:
    """n_jobs workers on the Dask cluster of `client`, through joblib's dask backend."""
    import uuid

    import distributed
    import joblib

    name = f"sweep-stop-{uuid.uuid4().hex}"
    finished = threading.Event()

    def forward_stop() -> None:  # the parent's signal handler only sets a flag; tell the cluster
        while not finished.wait(0.1):
            if stop.signum is not None:
                distributed.Event(name, client=client).set()
                return

    threading.Thread(target=forward_stop, name="sweep-dask-forward", daemon=True).start()
    log.info("running %d worker(s) on the Dask cluster at %s", n_jobs, config.study.parallel.address)
    try:
        with joblib.parallel_config(backend="dask"):
            joblib.Parallel(n_jobs=n_jobs)(
                joblib.delayed(_dask_worker)(str(os.path.abspath(config.path)), os.getcwd(), quiet, verbose, name)
                for _ in range(n_jobs))
    except Interrupted:
        raise
    except Exception:
        stop.check()  # a worker stopped by our signal raised Interrupted there: report the signal
        raise
    finally:
        finished.set()
    stop.check()


def run_workers(config: Config, n_jobs: int, stop: StopSignal, quiet: bool = False,
                verbose: bool = False, client: Any = None) -> optuna.Study:
    """Run until the study is done; returns the study (opened in this process).

    `client`: a `dask_client(config)`, where parallel.backend is dask.
    """
    if config.study.parallel.backend == "dask":
        _run_dask(config, n_jobs, stop, quiet, verbose, client or dask_client(config))
        return scheduler.open_study(config)[0]
    if n_jobs == 1:
        return scheduler.run(config, stop)
    import joblib

    joblib.Parallel(n_jobs=n_jobs, backend="loky")(
        joblib.delayed(_worker)(str(config.path), quiet, verbose) for _ in range(n_jobs))
    study, _ = scheduler.open_study(config)
    return study
