"""When a trial saves and what: the checkpoint cadence, the write budget that may defer it, what it
costs, and the best state held back in memory until the next save.

The rule (docs/reference.md, `checkpoint`): an explicit `every_steps` / `every_seconds` is
honoured exactly, like Orbax's `save_interval_steps` or Lightning's `every_n_train_steps`; with
no cadence key, the default `every_seconds` runs under the write budget `max_write_share`, and
`every: auto` chooses its seconds from cost and risk (sweep/train/young_daly.py) under it too; an
explicit `max_write_share` caps any cadence, and then every save it defers is counted (the ledger,
`status`, `plan`, the drill). The last step and a signal's save are never deferred.

Each save's measured cost is also held against the grace period after SIGTERM (`StopSignal`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from sweep.store.record import best_of_reports
from sweep.train import young_daly
from sweep.words import count

if TYPE_CHECKING:
    from sweep.checkpoints.folder import TrialCheckpoints
    from sweep.host.signals import StopSignal
    from sweep.study.config import Checkpoint
    from sweep.train.ledger import RunLedger

log = logging.getLogger("sweep")

# An exact cadence that takes more than this share of the training time is said once per trial:
# the user asked for it, so it is kept, but they learn what it costs and which keys trade it.
COST_WARNING_SHARE = 0.05
# The share is judged after this many saves of the run: the first save also pays Orbax's set-up.
COST_WARNING_SAVES = 3


class Cadence:
    """Periodic saves every N steps and/or every T seconds, whichever comes first.

    Under a write budget (`share` not None), a save that comes due while the writer is busy, or
    has not rested long enough for writing to stay within that share of the time, is owed
    instead and happens at the first window end that allows it: waiting would stall training
    whenever a write outlasts the steps between two saves. Without one, every due save happens,
    waiting for the save in flight.
    """

    def __init__(self, every_steps: int | None, every_seconds: float | None, share: float | None,
                 start: int = 0) -> None:
        self.every_steps, self.every_seconds, self.share = every_steps, every_seconds, share
        self.last_time = time.monotonic()
        self.last_step = start  # intervals count from where this run started
        self.owed = False
        self.saves = 0  # periodic and final saves of this run
        self.deferred = 0  # due saves the budget deferred (each counted once, however long owed)
        self.gap_steps = 0  # steps and seconds from the run's start to its first save, and between saves
        self.gap_seconds = 0.0
        self.warned = False
        self.asked = ""  # the cadence keys the study file gives, as the cost warning names them
        self.auto: young_daly.AutoInterval | None = None  # every: auto (sets every_seconds)
        self.save_seconds: float | None = None  # a disk save's cost, measured or predicted (`measure`)
        self.ram_saves = 0  # checkpoint.ram: this run's saves to the RAM tier, and their blocking seconds
        self.ram_blocking = 0.0

    @classmethod
    def of(cls, checkpoint: Checkpoint, start: int, ledger: RunLedger | None = None,
           stop: StopSignal | None = None, number: int = 0) -> Cadence:
        """The cadence of a run starting at `start`; with `every: auto` its first interval from the
        accounts of `ledger`, whose save cost (predicted: earlier saves) `stop` holds against its grace."""
        auto = checkpoint.every == "auto"
        cadence = cls(checkpoint.every_steps, None if auto else checkpoint.every_seconds, checkpoint.write_share, start)
        given = [k for k in ("every_steps", "every_seconds") if k in checkpoint.model_fields_set]
        cadence.asked = " and ".join(f"{k}: {getattr(checkpoint, k):g}" for k in given if getattr(checkpoint, k))
        if ledger is not None:
            prior = checkpoint.mtbi_seconds or young_daly.DEFAULT_MTBI_SECONDS
            cadence.auto = young_daly.AutoInterval(prior, cadence.share, ledger.study) if auto else None
            cadence.measure(number, ledger, None, stop, "predicted from earlier saves")
        return cadence

    def due(self, step: int) -> bool:
        if self.owed or (self.every_steps and step > 0 and step % self.every_steps == 0):
            return True
        return self.every_seconds is not None and time.monotonic() - self.last_time >= self.every_seconds

    def defer(self, ckpt: TrialCheckpoints) -> bool:
        """Owe the due save if there is a write budget and the writer is not ready; True if owed."""
        busy = self.share is not None and ckpt.busy(self.share)
        if busy and not self.owed:
            self.deferred += 1
        self.owed = self.owed or busy
        return busy

    def saved(self, step: int, wrote: bool = True) -> None:
        """The save due at `step` is done (`wrote` False: the step was on disk already)."""
        now = time.monotonic()
        if wrote:
            self.gap_steps += step - self.last_step
            self.gap_seconds += now - self.last_time
            self.saves += 1
        self.last_step, self.last_time, self.owed = step, now, False

    def after_save(self, number: int, ledger: RunLedger, ckpt: TrialCheckpoints, stop: StopSignal) -> None:
        """A save was started: judge the cadence's cost, and measure the saves written so far."""
        ledger.saves = self.counts()
        self.check_cost(number, ledger)
        ledger.background = ckpt.written_seconds  # also in the ledger written mid-run (a kill -9 keeps it)
        self.measure(number, ledger, ckpt, stop, "measured")

    def measure(self, number: int, ledger: RunLedger, ckpt: TrialCheckpoints | None, stop: StopSignal | None,
                how: str) -> None:
        """The trial's seconds per save (earlier runs', and this run's writes done), held against the
        grace period; with `every: auto`, the interval chosen from it, recorded in the ledger."""
        before = ledger.before
        writes = self.saves - (ckpt is not None and ckpt.busy())  # the newest may still be in flight
        blocking = before.get("checkpoint_blocking", 0.0) + ledger.parts["checkpoint_blocking"]
        blocking -= before.get("ram_blocking", 0.0) + self.ram_blocking  # the RAM tier's saves are no disk saves
        own = young_daly.save_cost(max(blocking, 0.0),
                                   before.get("saves", 0.0) + self.saves,
                                   before.get("checkpoint_background", 0.0) + ledger.background,
                                   before.get("saves", 0.0) + writes)
        if self.auto is not None:  # before the trial's first measured save, the study's stands in
            ledger.auto = self.auto.choose(own, time.monotonic() - ledger.start)
            self.every_seconds = ledger.auto["auto_every_seconds"]
            own = ledger.auto.get("auto_save_seconds")
        if own is not None:
            self.save_seconds = own
        if stop is not None and own is not None:
            stop.check_save_time(number, own, how)

    def counts(self) -> dict[str, float]:
        """This run's saves for the ledger (sums over runs: the mean interval stays derivable)."""
        return {"saves": float(self.saves), "deferred_saves": float(self.deferred),
                "save_gaps": float(self.saves), "save_gap_steps": float(self.gap_steps),
                "save_gap_seconds": self.gap_seconds, "ram_saves": float(self.ram_saves),
                "ram_blocking": self.ram_blocking}

    def check_cost(self, number: int, ledger: RunLedger) -> None:
        """Say once per run when an exact cadence takes more than COST_WARNING_SHARE of training."""
        if self.warned or self.share is not None or self.saves < COST_WARNING_SAVES:
            return
        training = ledger.parts["training"] + ledger.parts["evaluating"]
        spent = ledger.parts["checkpoint_blocking"]
        if training <= 0 or spent / training <= COST_WARNING_SHARE:
            return
        self.warned = True
        asked = self.asked or keys_text(self.every_steps, self.every_seconds, " and ")
        log.warning("trial %d: checkpoints at %s take %.0f%% of its training time (%.2f s of %.2f s over %d saves); "
                    "kept as asked. To trade it: a longer checkpoint.every_steps, checkpoint.every_seconds instead, "
                    "or checkpoint.max_write_share (e.g. 0.03) to defer saves while writing exceeds that share",
                    number, asked, 100 * spent / training, spent, training, self.saves)


def keys_text(every_steps: int | None, every_seconds: float | None, sep: str) -> str:
    """The cadence keys as the study file writes them, e.g. "every_steps: 100 and every_seconds: 60"."""
    return sep.join(x for x in (f"every_steps: {every_steps}" if every_steps else "",
                                f"every_seconds: {every_seconds:g}" if every_seconds else "") if x)


def describe(checkpoint: Checkpoint) -> str:
    """The effective cadence in words, as `plan` states it."""
    if checkpoint.every == "auto":
        share, prior = checkpoint.write_share, checkpoint.mtbi_seconds or young_daly.DEFAULT_MTBI_SECONDS
        bound = f", at least the save cost / max_write_share {share:g}" if share else ""
        return (f"every: auto, every sqrt(2 x save cost x mean time between interruptions) seconds{bound}: the save "
                f"cost measured, the interruptions the study's own ({prior:g} s between them before any); every "
                f"{young_daly.UNMEASURED_SECONDS:g} s until a save is measured, and at the last step")
    parts = [x for x in (f"every {count(checkpoint.every_steps, 'step')}" if checkpoint.every_steps else "",
                         f"every {checkpoint.every_seconds:g} s" if checkpoint.every_seconds else "") if x]
    asked = " or ".join(parts)
    if len(parts) > 1:  # a user who set every_steps alone learns that the seconds are a default (issue 43)
        default = "every_seconds" not in checkpoint.model_fields_set
        asked += (f" (whichever comes first; {checkpoint.every_seconds:g} s is every_seconds' default, "
                  "`every_seconds: null` saves by steps alone)" if default else " (whichever comes first)")
    share = checkpoint.write_share
    if not parts:
        return "at the last step only (no cadence)"
    if share is None:
        return f"{asked}, exactly, and at the last step"
    given = "max_write_share" in checkpoint.model_fields_set
    why = "checkpoint.max_write_share" if given else "the default write budget"
    return (f"{asked}, under {why} of {share:g}: a save due while writing would take more than {100 * share:g}% "
            f"of the time is deferred to the first step that allows it (the last step and a signal's save never are)")


def effective_interval(ledger: Mapping[str, Any] | None) -> dict[str, float] | None:
    """A trial's mean checkpoint interval and deferred saves, from its ledger (None before a save)."""
    if not ledger or not ledger.get("save_gaps"):
        return None
    gaps = float(ledger["save_gaps"])
    return {"steps": round(float(ledger["save_gap_steps"]) / gaps, 1),
            "seconds": round(float(ledger["save_gap_seconds"]) / gaps, 3),
            "deferred_saves": int(ledger.get("deferred_saves", 0))}


@dataclasses.dataclass
class Best:
    """The trial's best evaluation so far, and its state while that is not on disk yet."""

    sign: int  # +1 minimise, -1 maximise
    step: int | None = None
    value: float = math.inf
    pending: tuple[int, Any, dict[str, float]] | None = None  # (step, host copy, metrics) not yet on disk

    def offer(self, step: int, value: float) -> bool:
        if self.step is None or self.sign * value < self.sign * self.value:
            self.step, self.value = step, value
            return True
        return False


def best_of(reported: Mapping[int, float], step: int, sign: int) -> Best:
    """The best of the evaluations reported up to `step`."""
    best = Best(sign=sign)
    found = best_of_reports({s: v for s, v in reported.items() if s <= step}, sign)
    if found is not None:
        best.step, best.value = found
    return best


def flush(ckpt: TrialCheckpoints, best: Best, current: tuple[int, Callable[[], Any], dict | None] | None) -> bool:
    """Write the best state if it is not on disk yet, then the current step (if given); False if
    there was nothing to write (the step is on disk already: a resumed run's restored step).

    The best state waits in memory for the next save: a resumed run recomputes it bit-identically,
    so writing it at once would buy nothing but I/O.
    """
    items: list[tuple[int, Any, dict[str, float] | None]] = []
    if best.pending is not None:
        items.append(best.pending)
        best.pending = None
    if current is not None and current[0] not in (i[0] for i in items) and (
            ckpt.last_saved is None or current[0] > ckpt.last_saved):
        step, snapshot, metrics = current
        items.append((step, snapshot(), metrics))
    ckpt.save(*items)
    return bool(items)
