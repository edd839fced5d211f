"""What the curve writers are handed (sweep/tracking/curves.py): a trial's start, and the writer protocol."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Protocol

THREAD_NAME = "sweep-tracking"  # every writer's thread


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
    saved: tuple[int, ...]  # its committed checkpoint steps on disk when it started
    hparams: dict[str, Any]
    metrics: tuple[str, ...]
    history: dict[int, dict[str, float]]
    recorded: dict[str, Any]
    remember: Callable[[str, Any], None]


class Writer(Protocol):
    """One destination of curves; called on its own thread only, in the order of events."""

    def start(self, trial: TrialStart) -> None: ...

    def evaluation(self, number: int, step: int, metrics: dict[str, float]) -> None: ...

    def evaluations(self, number: int, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Several evaluations of one trial, in step order, sent at once (optional: without it
        each goes to `evaluation`)."""

    def checkpoint(self, number: int, step: int) -> None: ...

    def end(self, number: int, state: str, best_step: int | None) -> None: ...

    def close(self) -> None: ...


class QuietOnTrackingThread(logging.Filter):
    """Drops an HTTP client's own retry warnings on the tracking thread: the tracker says once
    what failed (the study's log stays the study's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD_NAME or record.levelno >= logging.ERROR
