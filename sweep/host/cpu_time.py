"""The CPU a checkpoint write takes, on Linux: what the write budget charges (sweep/train/cadence.py)
besides the write's wall time.

A save runs on the writer thread, on tensorstore's pool ("ts_pool_worker" threads: Orbax's array
I/O) and on short-lived threads Orbax starts and joins for each save (its asyncio loops). Over a
write: the writer's own thread and tensorstore's pool are measured by their per-thread CPU clocks,
and the CPU of threads started meanwhile, and of those that ended meanwhile (the process's CPU that
no living thread accounts for), is the write's too. Everything else (the training thread, XLA's pools, sweep's data prefetch,
uploads, tracking) is not charged. No library reports CPU time by group of threads, so it is read
here: Linux's per-thread CPU clock (clock_gettime of a thread's clock id, exact, no file to read)
and /proc for the threads' names. Where either is missing (macOS), the meter reads nothing and
the budget charges wall time alone.
"""

from __future__ import annotations

import os
import time

_TASKS = "/proc/self/task"
WRITER_POOLS = ("ts_pool_worker",)  # tensorstore's I/O threads (Orbax writes arrays through it)
_NAMES: dict[int, str] = {}  # tid -> its name, read once


def _thread_cpu(tid: int) -> float:
    """A thread's CPU seconds: Linux encodes a thread's CPU clock as ((~tid) << 3) | 6."""
    return time.clock_gettime((~tid << 3) | 6)


def _name(tid: int) -> str:
    if tid not in _NAMES:
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                _NAMES[tid] = f.read().strip()
        except OSError:
            return ""
    return _NAMES[tid]


def threads_cpu() -> dict[int, float] | None:
    """tid -> CPU seconds of every thread of this process; None where Linux does not tell."""
    try:
        tids = [int(t) for t in os.listdir(_TASKS)]
    except (OSError, ValueError):
        return None
    out = {}
    for tid in tids:
        try:
            out[tid] = _thread_cpu(tid)
        except OSError:  # ended meanwhile (or no per-thread clocks here)
            continue
    return out or None


class Meter:
    """Started on the writer thread before a write; `writer_seconds()` after it: the CPU seconds
    of the write (its thread, tensorstore's pool, the threads that ended meanwhile)."""

    def __init__(self, writer: int) -> None:
        self.writer = writer  # the native id of the thread that writes
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, dict[int, float]] | None:
        """(process CPU, every thread's CPU) at one moment, as near as can be: the process clock is
        read before and after the threads' clocks, and what other threads burnt in between (the
        reader preempted on a loaded machine: 0.2 s was seen) would be charged to the write or
        taken from it. So the snapshot is taken again while that window exceeds 2 ms (at most 5
        times), and the process clock is the window's middle."""
        best = None
        for _ in range(5):
            before = time.process_time()
            threads = threads_cpu()
            after = time.process_time()
            if threads is None:
                return None
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) / 2, threads)
            if after - before <= 0.002:
                break
        return best[1], best[2]

    def writer_seconds(self) -> float:
        end = self._read()
        if end is None or self._start is None:
            return 0.0
        (p0, before), (p1, after) = self._start, end
        spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}  # a new thread: all of it
        ended = (p1 - p0) - sum(spent.values())  # threads that ended meanwhile (Orbax's loops)
        # A thread started during the write is the write's too: Orbax's per-save loops, one of
        # them still listed while it exits after its join (a loaded machine: 0.2 s was missed so).
        mine = sum(cpu for tid, cpu in spent.items()
                   if tid == self.writer or tid not in before or _name(tid).startswith(WRITER_POOLS))
        return max(0.0, mine + max(0.0, ended))
