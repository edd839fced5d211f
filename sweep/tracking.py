"""Training curves where users already look (TensorBoard, MLflow): a queue the training thread fills
and one daemon thread that hands its events to the writers the study file's `logging` names.

Writers never slow or fail a trial: the training thread only puts events on the queue; a writer
that raises is retried once, then skipped (one warning per writer and process) until the next
trial starts, which catches up from Optuna's storage (the record of truth: every evaluation is
there before its checkpoint commits, sweep/record.py). Nothing here is part of a trial's meaning:
the `logging` key is outside the study's fingerprint.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Protocol

from sweep.config import Config

log = logging.getLogger("sweep")
RETRY_S = 1.0  # one retry after this pause, then the writer is skipped until the next trial
_STOP = object()


@dataclasses.dataclass(frozen=True)
class TrialStart:
    """A trial (re)starts training at `step` (0: from scratch) in this process.

    `history`: step -> every metric stored in Optuna when it started (eval:<step>, train_loss
    included): evaluations past `step` are computed again, bit-identically, and sent anew.
    `remember(key, value)`: stores a trial user attribute (fenced: a worker that lost the trial
    writes nothing); `recorded`: the trial's user attributes when it started.
    """

    number: int
    step: int
    hparams: dict[str, Any]
    metrics: tuple[str, ...]
    history: dict[int, dict[str, float]]
    recorded: dict[str, Any]
    remember: Callable[[str, Any], None]


class Writer(Protocol):
    """One destination of curves; called on the tracking thread only, in the order of events."""

    name: str

    def start(self, trial: TrialStart) -> None: ...

    def evaluation(self, number: int, step: int, metrics: dict[str, float]) -> None: ...

    def checkpoint(self, number: int, step: int) -> None: ...

    def end(self, number: int, state: str, best_step: int | None) -> None: ...

    def close(self) -> None: ...


def writers(config: Config) -> list[Writer]:
    """The writers the study file's `logging` asks for (their packages are imported only then)."""
    found: list[Writer] = []
    if config.tensorboard_dir is not None:
        from sweep.tracking_tensorboard import TensorBoardWriter

        found.append(TensorBoardWriter(config.tensorboard_dir))
    if config.study.logging.mlflow is not None:
        from sweep.tracking_mlflow import MlflowWriter

        found.append(MlflowWriter(config.study.logging.mlflow, config.name))
    return found


class Tracker:
    """The process's tracking thread and its queue; a no-op without writers."""

    def __init__(self, found: list[Writer]) -> None:
        self._writers = found
        self._queue: queue.Queue[Any] = queue.Queue()
        self._skipped: set[tuple[str, int]] = set()  # (writer, trial) skipped after a failure
        self._warned: set[str] = set()
        self._thread: threading.Thread | None = None
        if found:
            self._thread = threading.Thread(target=self._loop, name="sweep-tracking", daemon=True)
            self._thread.start()

    @classmethod
    def of(cls, config: Config) -> Tracker:
        return cls(writers(config))

    @property
    def active(self) -> bool:
        return bool(self._writers)

    def put(self, method: str, number: int, *args: Any) -> None:
        if self._writers:
            self._queue.put((method, number, args))

    def close(self, timeout: float) -> bool:
        """Send what is queued (for `timeout` seconds at most) and stop; False if some was left."""
        if self._thread is None:
            return True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        left = self._thread.is_alive()
        if left:
            log.warning("tracking: events not sent within %.0f s were left behind (%s); the next run of their "
                        "trials catches up from the study's storage", timeout,
                        ", ".join(w.name for w in self._writers))
        return not left

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                for writer in self._writers:
                    self._call(writer, "close", -1, ())
                return
            method, number, args = item
            for writer in self._writers:
                if method == "start":
                    self._skipped.discard((writer.name, number))  # a new start catches up
                if (writer.name, number) not in self._skipped:
                    self._call(writer, method, number, args)

    def _call(self, writer: Writer, method: str, number: int, args: tuple[Any, ...]) -> None:
        for attempt in (1, 2):
            try:
                getattr(writer, method)(*args)
                return
            except Exception as exc:  # noqa: BLE001 - a writer's fault is never the trial's
                if attempt == 1:
                    time.sleep(RETRY_S)
                    continue
                self._skipped.add((writer.name, number))
                if writer.name not in self._warned:
                    self._warned.add(writer.name)
                    log.warning("%s: %s failed twice (%s: %s); its events are skipped until the trial starts again "
                                "(the study goes on; its storage keeps every metric)", writer.name, method,
                                type(exc).__name__, str(exc)[:300])
                else:
                    log.debug("%s: %s failed (%s)", writer.name, method, exc)


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
