"""A trial run's saves to the RAM tier (checkpoint.ram; its folders: sweep/checkpoints/ram.py).

Frequent saves to a tmpfs folder, in front of the disk's: they survive a killed process (the next
run promotes the newer RAM steps to disk before it resumes), not a reboot. A signal's save goes
there too where a disk save would outlast the grace period left.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sweep.checkpoints.folder import TrialCheckpoints
from sweep.host.signals import StopSignal
from sweep.study.config import Checkpoint
from sweep.train.cadence import Best, Cadence
from sweep.train.ledger import RunLedger

log = logging.getLogger("sweep")


class RamSaves:
    """The RAM tier's cadence and saves of one run; inert where the study has no RAM tier."""

    def __init__(self, ckpt: TrialCheckpoints, checkpoint: Checkpoint, start: int | None, step: int) -> None:
        self.ckpt, self.start = ckpt, start or 0
        ram = checkpoint.ram
        # Exact (a write to tmpfs is cheap), and never deferred by the disk's write budget.
        self.cadence = Cadence(ram.every_steps, ram.every_seconds, None, step) \
            if ram is not None and ckpt.ram is not None else None
        self.every_steps = ram.every_steps if self.cadence is not None and ram is not None else None

    def due(self, step: int) -> bool:
        return self.cadence is not None and self.cadence.due(step)

    def save_due(self, step: int) -> bool:
        """A periodic RAM save is due at `step` (never at the step the run restored)."""
        return self.due(step) and step > self.start

    def save(self, step: int, snapshot: Any, evaluated: dict[str, float] | None, best: Best, disk: Cadence,
             ledger: RunLedger) -> None:
        """Save `step`, and the best state not yet on disk, to the RAM tier (in the background; the
        best state stays held for the next disk save); counted in the ledger's ram_saves."""
        ram = self.ckpt.ram
        assert ram is not None and self.cadence is not None
        ram.checksum_algorithm = self.ckpt.checksum_algorithm
        start = time.monotonic()
        with ledger.timed("checkpoint_blocking"):
            ram.save(*([best.pending] if best.pending is not None else []), (step, snapshot, evaluated))
        self.cadence.saved(step)
        disk.ram_saves += 1
        disk.ram_blocking += time.monotonic() - start
        ledger.saves = disk.counts()

    def disk_too_slow(self, disk: Cadence, stop: StopSignal) -> bool:
        """A disk save (measured, or predicted from earlier runs) would outlast the grace left."""
        return self.cadence is not None and disk.save_seconds is not None and disk.save_seconds > stop.grace_left()

    def stopped_here(self, number: int, step: int, disk: Cadence, stop: StopSignal) -> bool:
        """On a signal whose save went to the RAM tier: wait for it, say so, and return True."""
        ram = self.ckpt.ram
        if ram is None or ram.last_saved != step or self.ckpt.last_saved == step:
            return False
        ram.wait()
        on_disk = self.ckpt.last_saved
        log.warning("trial %d: stopped at step %d; checkpoint saved to the RAM tier (%s: a disk save takes %.3g s, "
                    "the grace period had %.3g s left), it resumes from it on the next run on this machine (after a "
                    "reboot: %s)", number, step, ram.directory, disk.save_seconds, max(stop.grace_left(), 0.0),
                    f"from step {on_disk} on disk" if on_disk is not None else "from its start")
        return True
