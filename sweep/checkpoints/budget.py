"""The write budget of a session's checkpoints: what the newest write cost and when it ended."""

from __future__ import annotations

import time


class WriteBudget:
    """What the newest checkpoint write cost and when it ended, for every trial of a session.

    A write costs the longer of its wall time and the CPU time its threads took (sweep/host/cpu_time.py:
    the writer's hashing and copies, tensorstore's pool, Orbax's threads compete with training for
    the cores). The share of time spent writing (see `TrialCheckpoints.busy`) is the process's,
    not a trial's: trials one after the other share one budget.
    """

    def __init__(self) -> None:
        self.last_write = (0.0, 0.0)  # (seconds charged, monotonic end)

    def record(self, seconds: float) -> None:
        self.last_write = (seconds, time.monotonic())

    def rested(self, share: float) -> bool:
        """The writer has rested long enough for writing to take at most `share` of the time."""
        took, ended = self.last_write
        return time.monotonic() - ended >= took * (1 / share - 1)
