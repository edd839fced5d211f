"""Training curves where users already look (TensorBoard, MLflow): queues the training thread fills
and a daemon thread per writer the study file's `logging` names, which hands them on.

Writers never slow or fail a trial: the training thread only puts events on the queue; a writer
that raises is retried once, then skipped (one warning per writer and process) until the next
trial starts, which catches up from Optuna's storage (the record of truth: every evaluation is
there before its checkpoint commits, sweep/store/record.py). Nothing here is part of a trial's meaning:
the `logging` key is outside the study's fingerprint.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from optuna.trial import FrozenTrial

from sweep.checkpoints.steps import kept_steps
from sweep.store.record import TRAIN_LOSS, history
from sweep.study.config import Config
from sweep.study.credentials import mask_url
from sweep.tracking.events import THREAD_NAME, TrialStart, Writer

if TYPE_CHECKING:
    from sweep.store.session import Session

log = logging.getLogger("sweep")
RETRY_S = 1.0  # one retry after this pause, then the writer is skipped until the next trial
# A lane sends evaluations at most about once per PACE_S, those queued meanwhile in one call
# (`Writer.evaluations`: one MLflow request, one TensorBoard flush): a trial that evaluates every
# few milliseconds costs a request a second, not one an evaluation (issue 32's overhead).
PACE_S = 1.0
START_S = 30.0  # the longest a run waits for its writers to be made before its first trial
_STOP = object()
_WARNED: set[str] = set()  # the writers that warned in this process: a server away is said once


def writers(config: Config) -> list[tuple[str, Callable[[], Writer]]]:
    """(name, maker) of the writers the study file's `logging` asks for: each made on its own
    thread (importing its package: mlflow takes seconds), which `Tracker.of` waits for."""
    found: list[tuple[str, Callable[[], Writer]]] = []
    logdir, uri = config.tensorboard_dir, config.study.logging.mlflow
    if logdir is not None:
        def tensorboard() -> Writer:
            from sweep.tracking.tensorboard_runs import TensorBoardWriter

            return TensorBoardWriter(logdir)

        found.append(("tensorboard", tensorboard))
    if uri is not None:
        def mlflow() -> Writer:
            from sweep.tracking.mlflow_runs import MlflowWriter

            return MlflowWriter(uri, config.name)

        found.append((_mlflow_name(uri), mlflow))
    return found


class Tracker:
    """The process's tracking: one lane (a queue and a daemon thread) per writer, so a slow one
    (an MLflow server far away, its import) holds no other back; a no-op without writers."""

    def __init__(self, makers: list[tuple[str, Callable[[], Writer]]]) -> None:
        self._lanes = [_Lane(name, make) for name, make in makers]

    @classmethod
    def of(cls, config: Config) -> Tracker:
        """The study's tracking; its writers are being made (their packages imported: mlflow takes
        seconds) on their threads: `wait_made` before the first trial."""
        return cls(writers(config))

    def wait_made(self, timeout: float | None = None) -> None:
        """Until every writer is made (or could not be), START_S at most: an import competing with
        the first trial's compile slowed that trial by about as long (issue 32's benchmark); a
        writer that cannot start is said before training."""
        deadline = time.monotonic() + (START_S if timeout is None else timeout)
        for lane in self._lanes:
            lane.made.wait(max(0.0, deadline - time.monotonic()))

    @property
    def active(self) -> bool:
        return bool(self._lanes)

    def put(self, method: str, number: int, *args: Any) -> None:
        for lane in self._lanes:
            lane.queue.put((method, number, args))

    def close(self, timeout: float) -> bool:
        """Send what is queued (for `timeout` seconds at most) and stop; False if some was left."""
        deadline = time.monotonic() + timeout
        for lane in self._lanes:
            lane.queue.put(_STOP)
        left = []
        for lane in self._lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))
            if lane.thread.is_alive():
                left.append(lane.name)
        if left:
            log.warning("tracking: events not sent within %.0f s were left behind (%s); the next run of their "
                        "trials catches up from the study's storage", timeout, ", ".join(left))
        return not left


class _Lane:
    """One writer, made and called on its own daemon thread, in the order of its events."""

    def __init__(self, name: str, make: Callable[[], Writer]) -> None:
        self.name, self._make = name, make
        self.queue: queue.Queue[Any] = queue.Queue()
        self._skipped: set[int] = set()  # trials skipped after a failure, until they start again
        self._warned = False
        self.made = threading.Event()  # the writer is made (or could not be)
        self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            writer = self._make()  # its package's import (mlflow: seconds), before the first trial
        except Exception as exc:  # noqa: BLE001 - a writer that cannot start leaves the others
            _WARNED.add(self.name)
            log.warning("%s: could not start (%s: %s); the study goes on without it", self.name,
                        type(exc).__name__, _short(exc))
            writer = None
        self.made.set()
        batches = writer is not None and hasattr(writer, "evaluations")
        sent = 0.0
        while True:
            items = [self.queue.get()]
            if batches and items[0] is not _STOP and items[0][0] == "evaluation":
                time.sleep(max(0.0, sent + PACE_S - time.monotonic()))
                sent = time.monotonic()
                items += self._queued()
            for item in _batched(items) if batches else items:
                if item is _STOP:
                    if writer is not None:
                        self._call(writer, "close", -1, ())
                    return
                method, number, args = item
                if method == "start":
                    self._skipped.discard(number)  # a new start catches up from the storage
                if writer is not None and number not in self._skipped:
                    self._call(writer, method, number, args)

    def _queued(self) -> list[Any]:
        """What is on the queue now, without waiting."""
        out = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out

    def _call(self, writer: Writer, method: str, number: int, args: tuple[Any, ...]) -> None:
        for attempt in (1, 2):
            try:
                getattr(writer, method)(*args)
                return
            except Exception as exc:  # noqa: BLE001 - a writer's fault is never the trial's
                if attempt == 1:
                    time.sleep(RETRY_S)
                    continue
                self._skipped.add(number)
                if not self._warned:
                    self._warned = True
                    _WARNED.add(self.name)
                    log.warning("%s: trial %d: %s failed twice (%s: %s); its curves are skipped until the trial "
                                "starts again (the study goes on; its storage keeps every metric)", self.name,
                                number, method, type(exc).__name__, _short(exc))
                else:
                    log.debug("%s: %s failed (%s)", self.name, method, exc)


def _batched(items: list[Any]) -> list[Any]:
    """The evaluations of one trial as one ("evaluations", number, (number, [(step, metrics), ...]))
    event, in step order: across its checkpoint notes too (each names its step, so a note may come
    after evaluations of later steps), up to its next start or end; everything else in order."""
    out: list[Any] = []
    open_batch: dict[int, list[tuple[int, dict[str, float]]]] = {}  # number -> rows of its batch in `out`
    for item in items:
        if item is _STOP:
            open_batch.clear()
            out.append(item)
        elif item[0] == "evaluation":
            number, step, metrics = item[2]
            if number in open_batch:
                open_batch[number].append((step, metrics))
            else:
                open_batch[number] = [(step, metrics)]
                out.append(("evaluations", number, (number, open_batch[number])))
        else:
            if item[0] != "checkpoint":  # a start or an end closes the trial's batch
                open_batch.pop(item[1], None)
            out.append(item)
    return out


def log_exports(session: Session, export: Callable[[int, Path], object]) -> int:
    """Attach each COMPLETE trial's export (its best-by-validation checkpoint, `sweep export`'s
    layout, written by `export(number, folder)`) to its MLflow run, once: after the workers, in
    this process, so no export competes with training for the cores. A server that is away is one
    warning (none more where the run's writer warned already); the next run tries again."""
    uri = session.config.study.logging.mlflow
    try:
        from sweep.tracking.mlflow_runs import log_exports as log_to_mlflow

        return log_to_mlflow(session, export)
    except Exception as exc:  # noqa: BLE001 - tracking never fails a study
        level = logging.DEBUG if _mlflow_name(uri) in _WARNED else logging.WARNING
        log.log(level, "%s: exports not logged (%s: %s); the next run tries again", _mlflow_name(uri),
                type(exc).__name__, _short(exc))
        return 0


def trial_start(config: Config, trial: Any, frozen: FrozenTrial, params: dict[str, Any], step: int, folder: Path,
                fence: Callable[[], None]) -> TrialStart:
    """What the writers need when trial `frozen.number` starts training at `step`; `trial` is its
    optuna.Trial, `folder` its checkpoint folder, `fence` raises if this worker lost the trial."""

    def remember(key: str, value: Any) -> None:  # on a writer's thread: never raises into it
        try:
            fence()
            trial.set_user_attr(key, value)
        except Exception as exc:  # noqa: BLE001 - a finished or lost trial: the writer finds its run by tag
            log.debug("trial %d: %s not recorded (%s)", frozen.number, key, exc)

    return TrialStart(frozen.number, step, tuple(kept_steps(folder)), {**config.study.fixed, **params},
                      (*config.trial_module.METRICS, TRAIN_LOSS), history(frozen), dict(frozen.user_attrs), remember)


class TrialLog:
    """One run of one trial, as the scheduler's callbacks see it: what the runner reports, queued."""

    def __init__(self, tracker: Tracker, start: Callable[[int], TrialStart]) -> None:
        self._tracker, self._start, self._started = tracker, start, False
        self.number = -1

    def on_step(self, step: int) -> None:
        """The first call of a run is its start step (after a restore); later ones are ignored."""
        if not self._started and step >= 0 and self._tracker.active:
            self._started = True
            begin = self._start(step)
            self.number = begin.number
            self._tracker.put("start", begin.number, begin)

    def evaluation(self, step: int, metrics: dict[str, float]) -> None:
        if self._started:
            self._tracker.put("evaluation", self.number, self.number, step, dict(metrics))

    def checkpoint(self, step: int) -> None:
        if self._started:
            self._tracker.put("checkpoint", self.number, self.number, step)

    def end(self, state: str, best_step: int | None = None) -> None:
        if self._started:
            self._tracker.put("end", self.number, self.number, state, best_step)


def _mlflow_name(uri: str) -> str:
    """The MLflow writer's name in the log (its lane's, and the exports')."""
    return f"mlflow ({mask_url(uri)})"


def _short(exc: BaseException) -> str:
    """An exception's first line, cut: HTTP clients put whole URLs and causes in theirs."""
    lines = str(exc).strip().splitlines()
    return lines[0][:160] + ("..." if len(lines[0]) > 160 or len(lines) > 1 else "") if lines else ""

