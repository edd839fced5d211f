"""The goodput ledger: where a trial's wall time went, and what its interruptions cost.

Each run of a trial (the first, and every resume or retry) times its parts; the trial's user
attribute `ledger` holds the sum over its runs, written every LEDGER_WRITE_SECONDS while it trains
and when the run ends, so a `kill -9` loses at most that much of the account. No peer reports this;
Optuna's trial durations alone cannot tell training from restarts.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

from sweep.store import record

LEDGER_ATTR = record.LEDGER
# Trial user attribute: its interruptions, i.e. runs of it that ended without the trial finishing
# (a kill, a signal, a crash, a machine fault, a lost lease), at whatever step, also while it was
# building its state or compiling before its first step. Counted by the run that takes the trial
# up again (a kill -9 records nothing); a retry after the trial's own failure is not one.
RESUMES_ATTR = record.RESUMES
LEDGER_WRITE_SECONDS = 10.0
# Seconds, each measured on the training thread; `waiting` is the rest of the run's wall time
# (building the state, loading data, the storage, the writer at the last step, the pipeline).
PARTS = ("training", "evaluating", "compiling", "restoring", "checkpoint_blocking", "waiting")
# Saves written and deferred by the write budget, and the steps and seconds between consecutive
# saves (sweep/train/cadence.py): sums, so that a trial's mean checkpoint interval stays derivable.
# With checkpoint.ram: the RAM tier's saves, and the training thread's seconds in them (also part of
# checkpoint_blocking; a disk save's cost is measured without them).
SAVE_KEYS = ("saves", "deferred_saves", "save_gaps", "save_gap_steps", "save_gap_seconds", "ram_saves", "ram_blocking")
KEYS = (*PARTS, "checkpoint_background", "wall", "lost", "lost_steps", "interruptions", *SAVE_KEYS)
# `checkpoint: {every: auto}` (sweep/train/young_daly.py): the interval chosen last and its inputs,
# the seconds per save and the mean time between interruptions; the newest values, not sums.
AUTO_KEYS = ("auto_every_seconds", "auto_save_seconds", "auto_mtbi_seconds")


class RunLedger:
    """The account of one run of a trial; `total()` adds the trial's earlier runs.

    A run that takes the trial up after an interruption (`resumed`) measures what it cost:
    `lost_steps` are the steps it trains again; `lost` is the time it took to get back to the step
    the trial had reached before (the newest reported evaluation, or the restored step: exact
    within `eval_every` steps), counted from the run's start, so it includes the restart itself
    (building the state, restoring, compiling). `interruptions` is the trial's count so far
    (`RESUMES_ATTR`, this run's included), stored with the account so that the two agree.
    `study`: the study's account when the run started (`study_account`), read for `every: auto`.
    """

    def __init__(self, before: Mapping[str, float] | None,
                 write: Callable[[dict[str, float]], None] | None = None, interruptions: int = 0,
                 resumed: bool = False, study: Mapping[str, float] | None = None) -> None:
        self.before = {k: float(v) for k, v in (before or {}).items() if k in KEYS}
        self.study = study
        self.auto = {k: float(v) for k, v in (before or {}).items() if k in AUTO_KEYS}  # set by the cadence
        self.start = time.monotonic()
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.background = 0.0
        self.reached: int | None = None  # the step reached before the interruption; None if not resumed
        self.lost: float | None = 0.0
        self.lost_steps = 0
        self._write = write
        self._written = self.start
        self.interruptions = interruptions
        self.resumed = resumed
        self.saves: dict[str, float] = dict.fromkeys(SAVE_KEYS, 0.0)  # set by the loop (Cadence.counts)

    def started_at(self, step: int, reached: int) -> None:
        """This run starts at `step` (restored, or 0) of a trial that had reached `reached`
        before; after an interruption the work from `step` up to `reached` is done again."""
        if not self.resumed:
            return
        reached = max(reached, step)
        self.reached, self.lost, self.lost_steps = reached, None, reached - step
        self.at_step(step)

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] += seconds

    def timed(self, part: str) -> _Timer:
        return _Timer(self, part)

    def at_step(self, step: int) -> None:
        """Training reached `step`: the redone work ends at the step reached before; write now and then."""
        now = time.monotonic()
        if self.lost is None and self.reached is not None and step >= self.reached:
            self.lost = now - self.start
        if self._write is not None and now - self._written >= LEDGER_WRITE_SECONDS:
            self._written = now
            self._write(self.total())

    def total(self) -> dict[str, float]:
        """This run's account plus the earlier runs', rounded to 0.1 ms."""
        wall = time.monotonic() - self.start
        parts = dict(self.parts)
        parts["waiting"] = max(0.0, wall - sum(v for k, v in parts.items() if k != "waiting"))
        mine = {**parts, "checkpoint_background": self.background, "wall": wall,
                "lost": self.lost if self.lost is not None else wall, "lost_steps": float(self.lost_steps),
                "interruptions": 0.0, **self.saves}
        total = {k: round(self.before.get(k, 0.0) + mine[k], 4) for k in KEYS}
        total["interruptions"] = float(self.interruptions)  # a count of the trial's, not a sum of runs
        return {**total, **self.auto}

    def finish(self) -> None:
        if self._write is not None:
            self._write(self.total())


class _Timer:
    def __init__(self, ledger: RunLedger, part: str) -> None:
        self.ledger, self.part = ledger, part

    def __enter__(self) -> None:
        self.t0 = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.ledger.add(self.part, time.monotonic() - self.t0)


def of_trial(attrs: Mapping[str, Any]) -> dict[str, float] | None:
    """A trial's ledger as readers show it (from its user attributes), its `interruptions` the
    trial's `RESUMES_ATTR`: the one count of interruptions (a ledger written before a kill -9
    may lag it). None for a trial without either."""
    ledger = attrs.get(LEDGER_ATTR)
    resumes = int(attrs.get(RESUMES_ATTR, 0))
    if not ledger and not resumes:
        return None
    kept = {k: v for k, v in (ledger or {}).items() if k not in AUTO_KEYS}  # readers show them apart (`auto_of`)
    return {**dict.fromkeys(KEYS, 0.0), **kept, "interruptions": float(resumes)}


def auto_of(ledger: Mapping[str, Any] | None) -> dict[str, float | None] | None:
    """A trial's `every: auto` interval and its inputs as `status` shows them (None where it has none)."""
    if not ledger or "auto_every_seconds" not in ledger:
        return None
    return {"every_seconds": float(ledger["auto_every_seconds"]), "save_seconds": ledger.get("auto_save_seconds"),
            "mtbi_seconds": float(ledger["auto_mtbi_seconds"])}


def study_account(attrs: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """The study's ledger, the sum of its trials' (`of_trial` of each trial's user attributes)."""
    return study_total(of_trial(a) for a in attrs)


def study_total(ledgers: Iterable[Mapping[str, float] | None]) -> dict[str, float] | None:
    """The sum of the trials' ledgers (None if no trial has one)."""
    found = [ledger for ledger in ledgers if ledger]
    if not found:
        return None
    return {k: round(sum(float(ledger.get(k, 0.0)) for ledger in found), 3) for k in KEYS}


def duration(seconds: float) -> str:
    """'42 s', '3 min 5 s', '1 h 12 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def summary_line(total: Mapping[str, Any]) -> str:
    """'lost to 3 interruptions: 42 s of 1 h 12 min, 1.0%' plus where the time went."""
    wall = float(total["wall"]) or 1e-9
    n = int(total["interruptions"])
    shares = ", ".join(f"{k.replace('_', ' ')} {100 * float(total[k]) / wall:.0f}%" for k in PARTS)
    return (f"lost to {n} interruption{'s' if n != 1 else ''}: {duration(float(total['lost']))} of "
            f"{duration(float(total['wall']))}, {100 * float(total['lost']) / wall:.1f}% (time: {shares})")
