"""Running the scheduler in this process, or in `n_jobs` worker processes through joblib."""

from __future__ import annotations

import optuna

from sweep import scheduler
from sweep.config import Config
from sweep.runner import StopSignal


def _worker(study_file: str, quiet: bool, verbose: bool) -> None:
    # Each worker is a full scheduler: claims in the database keep every trial to one worker.
    from sweep import config as config_lib
    from sweep import logs

    logs.setup(quiet, verbose)
    config = config_lib.load(study_file)
    stop = StopSignal(config.study.checkpoint.grace_seconds)
    stop.install()
    scheduler.run(config, stop)


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
