"""The CPU a checkpoint write takes from training, on Linux: what the write budget charges
(sweep/cadence.py) besides the write's wall time.

A save runs on the writer thread, Orbax's short-lived asyncio threads and tensorstore's pool; the
training runs on the thread that trains and XLA's CPU compute pools ("tf_XLA..." threads). Over a
write, the process's CPU time minus the training threads' is the write's. No library reports CPU
time by group of threads (psutil gives per-thread user/system times at the clock tick's 10 ms);
/proc's schedstat gives each thread's time on a CPU in nanoseconds, so it is read here. Where
there is no /proc (macOS), the meter reads nothing and the budget charges wall time alone.
"""

from __future__ import annotations

import os
import time

_TASKS = "/proc/self/task"
XLA_POOL = "tf_XLA"  # the prefix of XLA's CPU compute threads (its Eigen pools)


def _on_cpu_ns(tid: str) -> int:
    with open(f"{_TASKS}/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def training_seconds(trainer: int | None) -> float | None:
    """CPU seconds of the thread `trainer` (a native id) and of XLA's compute threads so far;
    None where /proc does not tell."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            if int(tid) == trainer:
                total += _on_cpu_ns(tid)
            else:
                with open(f"{_TASKS}/{tid}/comm") as f:
                    if f.read().startswith(XLA_POOL):
                        total += _on_cpu_ns(tid)
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile, or no schedstat
            continue
    return total / 1e9


class Meter:
    """Started before a write; `writer_seconds()` after it: the CPU seconds that were not training's."""

    def __init__(self, trainer: int | None) -> None:
        self.trainer = trainer
        self._start = self._read()

    def _read(self) -> tuple[float, float] | None:
        training = training_seconds(self.trainer)
        return None if training is None else (time.process_time(), training)

    def writer_seconds(self) -> float:
        end = self._read()
        if end is None or self._start is None:
            return 0.0
        return max(0.0, (end[0] - self._start[0]) - (end[1] - self._start[1]))
