"""`python -m sweep replay`: retrain a PBT member's lineage from scratch and compare its final
state, bit for bit, with the one the study saved (sweep/schedulers/pbt.py).

A member's final state was made by segments of several members' runs: trial 3 trained steps
0-500, trial 0 copied it at 500 and trained to 1000 with perturbed params, and so on
(`pbt.lineage_path`). The replay runs the same segments, in this process, one after the other in
one temporary folder: each segment restores the previous one's state (the copy an exploit made)
and trains it with the member's params and its data seed, to the next exploit or the end. Ray
Tune's PopulationBasedTrainingReplay replays the hyperparameter schedule; this replays the
weights: the checksum of the replayed final state must equal the recorded one.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

from sweep.checkpoints import integrity
from sweep.errors import ConfigError, SweepError
from sweep.schedulers import pbt
from sweep.store.record import BEST_STEP
from sweep.store.session import Session
from sweep.words import count

log = logging.getLogger("sweep")


@dataclasses.dataclass
class ReplayReport:
    trial: int
    segments: list[tuple[int, int, int, dict[str, Any]]]  # (member, from step, to step, params)
    recorded: str  # the checksum of the trial's final state as the study saved it (integrity.checksum)
    replayed: str | None  # ... as the replay computed it
    # Its best step (what `export` writes), where it is not the last: (step, recorded, replayed);
    # None where the best is the last step or either side no longer keeps it.
    best: tuple[int, str, str | None] | None = None

    @property
    def identical(self) -> bool:
        return self.replayed == self.recorded and (self.best is None or self.best[1] == self.best[2])

    def lines(self) -> list[str]:
        out = [f"trial {self.trial}'s lineage: {count(len(self.segments), 'segment')}, retrained from scratch"]
        out += [f"  steps {a}-{b}: trained as trial {m} with {p}" for m, a, b, p in self.segments]
        out.append(f"recorded final state  checksum {self.recorded}")
        out.append(f"replayed final state  checksum {self.replayed}")
        if self.best is not None:
            out.append(f"recorded best step {self.best[0]} (exported)  checksum {self.best[1]}")
            out.append(f"replayed best step {self.best[0]}             checksum {self.best[2]}")
        out.append("bit-identical: yes" if self.identical else "bit-identical: NO")
        return out


class _Silent:
    """The runner's reporter: the replay reports nothing to Optuna."""

    def report(self, value: float, step: int) -> None:
        del value, step

    def should_prune(self) -> bool:
        return False


def replay(session: Session, trial: int | None = None) -> ReplayReport:
    """Retrain trial `trial`'s lineage (default: the best trial) and compare (module docstring).

    Raises:
        ConfigError: the study has no scheduler pbt.
        SweepError: the trial is not COMPLETE, or its final step's checksum is not on disk.
    """
    from sweep.host.signals import StopSignal
    from sweep.train.loop import run_trial
    from sweep.train.state import trial_checkpoints

    config = session.config
    if not pbt.active(config):
        raise ConfigError(str(config.path), "scheduler.type", "replay retrains a PBT lineage: it needs scheduler pbt",
                          config.study.scheduler.type if config.study.scheduler else "no scheduler")
    session.open(create=False)
    trials = {t.number: t for t in session.trials()}
    if trial is None:
        best = session.best_trial()
        if best is None:
            raise SweepError(f"{config.path}: no COMPLETE trial to replay yet")
        trial = best.number
    if trial not in trials or not trials[trial].state.name == "COMPLETE":
        state = trials[trial].state.name if trial in trials else "not in the study"
        raise SweepError(f"trial {trial}: replay needs a COMPLETE trial (it is {state})")
    steps = config.study.train.steps
    recorded = integrity.read_checksum(config.checkpoint_dir(trial), steps)
    if recorded is None:
        raise SweepError(f"trial {trial}: the checksum of its final step {steps} is not in "
                         f"{integrity.sums_dir(config.checkpoint_dir(trial))} (the disk budget removed it?)")
    segments = pbt.lineage_path(trials, trial, steps)
    with tempfile.TemporaryDirectory(prefix="sweep-replay-") as tmp:
        folder = Path(tmp) / "lineage"
        for member, start, end, params in segments:
            log.info("replay: steps %d-%d as trial %d with %s", start, end, member, params)
            ckpt = trial_checkpoints(config, member, folder)
            ckpt.checksum_algorithm = integrity.algorithm_of(recorded)  # a study saved by an older release: sha256
            try:
                run_trial(config, member, config.hyperparameters(params), _Silent(), {}, ckpt,
                          StopSignal(hard_exit=False), seed_number=session.seed_number(member),
                          pause_at=end if end < steps else None)
                ckpt.wait()
            finally:
                ckpt.close()
        replayed = integrity.read_checksum(folder, steps)
        best_step = trials[trial].user_attrs.get(BEST_STEP)
        saved_best = integrity.read_checksum(config.checkpoint_dir(trial), best_step) if best_step != steps else None
        best = (best_step, saved_best, integrity.read_checksum(folder, best_step)) if saved_best else None
    return ReplayReport(trial, segments, recorded, replayed, best)
