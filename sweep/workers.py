"""Running the scheduler in this process, or in `n_jobs` worker processes through joblib."""

from __future__ import annotations

import os
import signal
import threading
import time

import optuna

from sweep import scheduler
from sweep.config import Config
from sweep.errors import Interrupted
from sweep.runner import StopSignal


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


def run_workers(config: Config, n_jobs: int, stop: StopSignal, quiet: bool = False,
                verbose: bool = False) -> optuna.Study:
    """Run until the study is done; returns the study (opened in this process)."""
    if n_jobs == 1:
        return scheduler.run(config, stop)
    import joblib

    joblib.Parallel(n_jobs=n_jobs, backend="loky")(
        joblib.delayed(_worker)(str(config.path), quiet, verbose) for _ in range(n_jobs))
    study, _ = scheduler.open_study(config)
    return study
