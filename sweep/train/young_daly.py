"""`checkpoint: {every: auto}`: the save interval from what a save costs and how often the study is
interrupted, Young's and Daly's sqrt(2 x save cost x mean time between interruptions), never shorter
than the write budget allows.

The save cost is measured: the trial's own saves (the ledger's blocking and background seconds
per save), the study's before its first. The interruption rate is the study's own: its trials'
interruptions over their wall time, with a prior (`checkpoint.mtbi_seconds`) counted as one
interruption-free stretch of that length, so that the estimate starts at the prior, falls as
interruptions come and rises again as they stop. The interval only moves saves: results stay
bit-identical to any fixed cadence's.
"""

from __future__ import annotations

import math
from typing import Mapping

# The prior mean time between interruptions where the study file gives none (checkpoint.mtbi_seconds).
DEFAULT_MTBI_SECONDS = 3600.0
# Until a save of the study was measured, `auto` saves at the default cadence's interval.
UNMEASURED_SECONDS = 300.0


def interval(save_seconds: float, mtbi_seconds: float, share: float | None) -> float:
    """Young-Daly's interval, at least `save_seconds / share` (a save every that long writes that
    share of the time: the write budget `max_write_share`; None: no bound)."""
    chosen = math.sqrt(2.0 * save_seconds * mtbi_seconds)
    return max(chosen, save_seconds / share) if share else chosen


def mean_time_between(prior_seconds: float, wall_seconds: float, interruptions: float) -> float:
    """The mean time between interruptions after `interruptions` in `wall_seconds`, the prior
    counted as one more interruption after `prior_seconds` more (the exponential's conjugate mean)."""
    return (prior_seconds + wall_seconds) / (1.0 + interruptions)


def save_cost(blocking: float, saves: float, background: float, writes: float) -> float | None:
    """Seconds per save: the training thread's part (blocking, over its saves) plus the writer's
    (background, over the writes done); None until a write is done."""
    if saves <= 0 or writes <= 0:
        return None
    return blocking / saves + background / writes


class AutoInterval:
    """The interval of one run of a trial: the study's account at the run's start (the sum of its
    trials' ledgers, sweep/train/ledger.py, this trial's earlier runs included) and what the run
    measures since."""

    def __init__(self, prior_seconds: float, share: float | None, study: Mapping[str, float] | None) -> None:
        self.prior, self.share = prior_seconds, share
        self.study = dict(study or {})

    def choose(self, own_cost: float | None, run_wall: float) -> dict[str, float]:
        """The interval and its inputs as the ledger records them: "auto_every_seconds",
        "auto_save_seconds" (absent before any save was measured) and "auto_mtbi_seconds".

        `own_cost`: the trial's measured seconds per save (None before its first); the study's
        mean stands in before it."""
        study = self.study
        cost = own_cost if own_cost is not None else save_cost(
            study.get("checkpoint_blocking", 0.0), study.get("saves", 0.0), study.get("checkpoint_background", 0.0),
            study.get("saves", 0.0))
        mtbi = round(mean_time_between(self.prior, study.get("wall", 0.0) + run_wall, study.get("interruptions", 0.0)), 4)
        if cost is None:
            return {"auto_every_seconds": UNMEASURED_SECONDS, "auto_mtbi_seconds": mtbi}
        cost = max(round(cost, 6), 1e-6)  # never a zero interval
        return {"auto_every_seconds": round(interval(cost, mtbi, self.share), 4), "auto_save_seconds": cost,
                "auto_mtbi_seconds": mtbi}
