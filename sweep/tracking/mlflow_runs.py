"""MLflow runs: one per trial (params, metrics by step, tags), nested under one run for the study;
a resumed trial goes on in its own run, each step's metrics logged once.

MLflow keeps every value logged, so a step is never logged twice: a (re)start reads the run's
metric history and logs only the steps it lacks, from Optuna's storage first (what a kill or an
away server kept from the run), then as the trial evaluates (a resumed trial's evaluations past
its checkpoint are computed again, bit-identically, and skipped where logged already).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from sweep.store.record import BEST_STEP, MLFLOW_RUN_ID
from sweep.tracking.events import QuietOnTrackingThread, TrialStart
from sweep.words import count

if TYPE_CHECKING:
    from sweep.store.session import Session

# MLflow's client retries an unreachable server 7 times with backoff (minutes), and the tracking
# thread's queue would wait behind it: the thread retries once itself, and a trial that starts
# again catches up what was skipped. Left alone where the user set them.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
# MLflow 3's usage telemetry starts a thread per process that polls a remote config every 100 ms
# until it answers (never, on an offline cluster node): off unless the user turned it on.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import Metric, Param, RunTag  # noqa: E402 - after the retry settings above
from mlflow.tracking import MlflowClient  # noqa: E402

logging.getLogger("urllib3.connectionpool").addFilter(QuietOnTrackingThread())
log = logging.getLogger("sweep")
STUDY_TAG, NUMBER_TAG, STATE_TAG, BEST_STEP_TAG = "sweep.study", "sweep.number", "sweep.state", "sweep.best_step"
EXPORT_TAG = "sweep.export"  # the best step whose export is the run's `export/` artifact
ROLE_TAG = "sweep.role"  # "study" on the parent run, "trial" on each trial's run
PARENT_TAG, NAME_TAG = "mlflow.parentRunId", "mlflow.runName"  # MLflow's own: nesting and the shown name
_TERMINAL = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED", "INTERRUPTED": "KILLED"}
_BATCH = 1000  # MLflow's limit of metrics per log_batch


class MlflowWriter:
    def __init__(self, uri: str, study: str) -> None:
        self.uri, self.study = uri, study
        self._client = MlflowClient(tracking_uri=uri)
        self._experiment: str | None = None
        self._parent: str | None = None
        self._runs: dict[int, tuple[str, dict[str, set[int]]]] = {}  # number -> (run id, key -> steps logged)

    def start(self, trial: TrialStart) -> None:
        self._runs.pop(trial.number, None)
        run_id, created = self._run_of(trial)
        if created:  # a new run: RUNNING, tagged so, no metric yet (3 requests a trial, not 9)
            logged: dict[str, set[int]] = {key: set() for key in trial.metrics}
        else:
            logged = {key: {m.step for m in self._client.get_metric_history(run_id, key)} for key in trial.metrics}
            self._client.set_tag(run_id, STATE_TAG, "RUNNING")
            self._client.update_run(run_id, status="RUNNING")
        self._runs[trial.number] = (run_id, logged)
        # what the run lacks of the stored evaluations, in as few requests as MLflow allows
        self._log_rows(trial.number, sorted(trial.history.items()))

    def evaluation(self, number: int, step: int, metrics: dict[str, float]) -> None:
        self.evaluations(number, [(step, metrics)])

    def evaluations(self, number: int, rows: list[tuple[int, dict[str, float]]]) -> None:
        if number in self._runs:
            self._log_rows(number, rows)

    def checkpoint(self, number: int, step: int) -> None:
        return None  # steps are shown by TensorBoard's text; a tag per save would only grow the run

    def end(self, number: int, state: str, best_step: int | None) -> None:
        found = self._runs.pop(number, None)
        if found is None:
            return
        run_id = found[0]
        tags = [RunTag(STATE_TAG, state)] + ([RunTag(BEST_STEP_TAG, str(best_step))] if best_step is not None else [])
        self._client.log_batch(run_id, tags=tags)
        self._client.set_terminated(run_id, _TERMINAL.get(state, "KILLED"))

    def close(self) -> None:
        self._runs.clear()
        if self._parent is not None:  # this process is done with the study; the next run reopens it
            self._client.set_terminated(self._parent, "FINISHED")

    def _log_rows(self, number: int, rows: list[tuple[int, dict[str, float]]]) -> None:
        """The metrics of `rows` ((step, metrics) pairs) that the run lacks, in as few requests as
        MLflow's limit allows."""
        run_id, logged = self._runs[number]
        now = int(time.time() * 1000)
        new = [Metric(k, float(v), now, step) for step, metrics in rows for k, v in sorted(metrics.items())
               if step not in logged.setdefault(k, set())]
        for i in range(0, len(new), _BATCH):
            self._client.log_batch(run_id, metrics=new[i:i + _BATCH])
            for m in new[i:i + _BATCH]:  # only once MLflow has them (a retry sends only the rest)
                logged[m.key].add(m.step)

    def _run_of(self, trial: TrialStart) -> tuple[str, bool]:
        """The trial's run: the one its record names, else one tagged with its number under the
        study's run (created by a run a kill stopped before the record was written), else a new
        one (then True)."""
        stored = trial.recorded.get(MLFLOW_RUN_ID)
        if stored:
            return str(stored), False
        parent = self._parent_run()
        found = self._client.search_runs([self._experiment_id()], max_results=1, filter_string=(
            f"tags.`{PARENT_TAG}` = '{parent}' AND tags.`{NUMBER_TAG}` = '{trial.number}'"))
        if found:
            run_id = found[0].info.run_id
        else:
            tags = {PARENT_TAG: parent, NAME_TAG: f"trial_{trial.number:04d}", STUDY_TAG: self.study,
                    NUMBER_TAG: str(trial.number), ROLE_TAG: "trial", STATE_TAG: "RUNNING"}
            run_id = self._client.create_run(self._experiment_id(), tags=tags).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in sorted(trial.hparams.items())]
            for i in range(0, len(params), 100):
                self._client.log_batch(run_id, params=params[i:i + 100])
        trial.remember(MLFLOW_RUN_ID, run_id)
        return run_id, not found

    def _experiment_id(self) -> str:
        """The study's experiment (named after the study), created by the first worker that needs it."""
        if self._experiment is None:
            found = self._client.get_experiment_by_name(self.study)
            if found is None:
                try:
                    self._experiment = str(self._client.create_experiment(self.study))
                    return self._experiment
                except Exception:  # another worker created it meanwhile
                    found = self._client.get_experiment_by_name(self.study)
                    if found is None:
                        raise
            self._experiment = str(found.experiment_id)
        return self._experiment

    def _parent_run(self) -> str:
        """The study's run. Workers starting together may each create one: every worker then keeps
        the oldest (the same one for all) and deletes its own if it is not that one."""
        if self._parent is None:
            query = f"tags.`{ROLE_TAG}` = 'study' AND tags.`{STUDY_TAG}` = '{self.study}'"
            runs = self._client.search_runs([self._experiment_id()], filter_string=query)
            created = None
            if not runs:
                created = self._client.create_run(self._experiment_id(), tags={
                    ROLE_TAG: "study", STUDY_TAG: self.study, NAME_TAG: self.study}).info.run_id
                runs = self._client.search_runs([self._experiment_id()], filter_string=query)
            oldest = min(runs, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
            if created is not None and created != oldest:
                self._client.delete_run(created)
            if created is None:
                self._client.update_run(oldest, status="RUNNING")
            self._parent = oldest
        return self._parent


def log_exports(session: Session, export: Callable[[int, Path], object]) -> int:
    """Log `sweep export`'s folder of every COMPLETE trial with a run and no export yet as the
    run's `export/` artifacts (safetensors + meta.json); returns how many were logged.
    `export(number, folder)` writes trial `number`'s export into `folder` (sweep/commands/export.py)."""
    from optuna.trial import TrialState

    from sweep.errors import SweepError

    client = MlflowClient(tracking_uri=session.config.study.logging.mlflow)
    logged = 0
    complete = session.trials((TrialState.COMPLETE,))
    # A trial whose writer made its run after the trial had finished (the writer's thread lags
    # behind short trials) could not record the run's id: found by its tags instead.
    untold = {t.number for t in complete if not t.user_attrs.get(MLFLOW_RUN_ID)}
    tagged = _trial_runs(client, session.config.name) if untold else {}
    for trial in complete:
        run_id = trial.user_attrs.get(MLFLOW_RUN_ID) or tagged.get(trial.number)
        best = str(trial.user_attrs.get(BEST_STEP, ""))
        if not run_id or client.get_run(run_id).data.tags.get(EXPORT_TAG) == best:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                export(trial.number, Path(tmp))
            except SweepError as exc:  # its checkpoints were removed by the disk budget
                log.debug("trial %d: no export to log (%s)", trial.number, exc)
                continue
            client.log_artifacts(run_id, tmp, artifact_path="export")
        client.set_tag(run_id, EXPORT_TAG, best)  # last: a kill before it logs the same files again
        logged += 1
    if logged:
        log.info("mlflow: %s logged as artifacts", count(logged, "trial export"))
    return logged


def _trial_runs(client: MlflowClient, study: str) -> dict[int, str]:
    """number -> run id of the study's trial runs on the server (the newest where a number has two)."""
    experiment = client.get_experiment_by_name(study)
    if experiment is None:
        return {}
    query = f"tags.`{ROLE_TAG}` = 'trial' AND tags.`{STUDY_TAG}` = '{study}'"
    found: dict[int, str] = {}
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], filter_string=query, max_results=1000, page_token=token)
        for run in page:  # newest first (MLflow's default order)
            found.setdefault(int(run.data.tags[NUMBER_TAG]), run.info.run_id)
        token = page.token
        if not token:
            return found
