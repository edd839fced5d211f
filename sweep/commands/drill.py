"""`drill`: the recovery drill. Kill a short copy of the study with SIGKILL, restart it, measure, compare.

The copy runs trial 0 of the study (same trial module, sampler, hyperparameters, steps and
checkpoint settings; pruning off) in a temporary workdir, three times as real processes: once
uninterrupted (the reference), once killed at a random evaluation step, once restarted.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import yaml

from sweep.checkpoints.steps import newest_step
from sweep.errors import SweepError
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.study.config import Config
from sweep.train.cadence import keys_text
from sweep.train.ledger import LEDGER_ATTR
from sweep.words import count


@dataclasses.dataclass
class DrillReport:
    killed_at_step: int
    aimed_at_step: int  # the random evaluation step; the kill waits for a committed checkpoint too
    resumed_from_step: int
    lost_steps: int
    lost_seconds: float
    restart_to_restored_s: float  # restart -> state restored (the "resumed from step" line)
    restart_to_first_new_step_s: float  # restart -> first training step after the resume step
    bit_identical: bool
    why_none: str  # why the restart began at step 0, if it did
    differences: list[str]
    # periodic saves the write budget (checkpoint.max_write_share) deferred, both runs together
    deferred_saves: int = 0

    def lines(self) -> list[str]:
        return [
            f"killed (SIGKILL) at step        {self.killed_at_step}" + (
                f" (aimed at step {self.aimed_at_step}; waited for the first committed checkpoint)"
                if self.killed_at_step > self.aimed_at_step and self.resumed_from_step > self.aimed_at_step else ""),
            f"resumed from step               {self.resumed_from_step}",
            f"work lost                       {count(self.lost_steps, 'step')}, {self.lost_seconds:.2f} s",
            *([f"saves deferred                  {self.deferred_saves} (by checkpoint.max_write_share: the newest "
               "checkpoint lagged the cadence)"] if self.deferred_saves else []),
            "recovery: restart -> restored   " + (
                f"{self.restart_to_restored_s:.2f} s" if self.resumed_from_step else
                f"- (no checkpoint had been committed at the kill: {self.why_none})"),
            f"recovery: restart -> new step   {self.restart_to_first_new_step_s:.2f} s",
            f"bit-identical to uninterrupted  {'yes' if self.bit_identical else 'NO'}",
            *[f"  differs: {d}" for d in self.differences],
        ]


def _copy(config: Config, root: Path, tag: str) -> tuple[Path, Session]:
    """The drill's copy of the study: a study file for the CLI runs, and a session to read it."""
    raw = copy.deepcopy(config.source.raw)
    raw.update(name=f"{config.name}-drill-{tag}", workdir=str(root / tag), n_trials=1, pruner={"type": "none"})
    for key in ("storage", "timeout", "parallel", "logging"):  # a drill's trials are no curves for the team
        raw.pop(key, None)
    path = root / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, Session(config_lib.from_dict(raw, origin=str(path), env=config.source.env))


def _cli(study: Path) -> list[str]:
    return [sys.executable, "-m", "sweep", "run", str(study)]


def _finished_trial(session: Session) -> optuna.trial.FrozenTrial:
    trial = _trial(session)
    if trial is None:
        raise SweepError(f"the drill's study {session.config.path} has no trial")
    return trial


def _trial(session: Session) -> optuna.trial.FrozenTrial | None:
    try:
        trials = session.open(create=False).trials()
    except SweepError:  # not created yet
        return None
    return trials[0] if trials else None


def _run(study: Path) -> None:
    result = subprocess.run(_cli(study), capture_output=True, text=True)
    if result.returncode != 0:
        raise SweepError(f"the drill's reference run failed:\n{result.stderr.strip()}")


class _Watched:
    """A run whose stderr lines are time-stamped as they arrive."""

    def __init__(self, study: Path) -> None:
        self.start, self.start_wall = time.monotonic(), time.time()
        self.proc = subprocess.Popen(_cli(study), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append((time.monotonic() - self.start, line))

    def first(self, pattern: str) -> tuple[float, re.Match[str]] | None:
        for t, line in list(self.lines):
            m = re.search(pattern, line)
            if m:
                return t, m
        return None


def _kill_after(victim: _Watched, session: Session, step: int, ckpt_dir: Path, last: int) -> None:
    """SIGKILL `victim` as soon as its trial has reported `step` and committed a checkpoint, or
    reported `last` (its last evaluation before the end) without one.

    Without a committed checkpoint a kill proves little about recovery (the restart begins at
    step 0), so on a trial too fast for its cadence the kill waits for the first one. Polls one
    open session (a fresh `load_study` per poll costs tens of ms, long enough for a fast trial
    to run to its end between two polls on a loaded machine).
    """
    while True:
        if victim.proc.poll() is not None:
            time.sleep(0.2)  # let the reader thread collect the last lines
            if victim.proc.returncode != 0:
                raise SweepError(f"the drill's run failed (exit {victim.proc.returncode}):\n"
                                 + "".join(line for _, line in victim.lines).strip())
            raise SweepError(f"the drill's run finished before it could be killed at step {step} with a "
                             "checkpoint committed; use more train.steps or a shorter checkpoint cadence")
        trial = _trial(session) if session.config.workdir.exists() else None
        reported = max(trial.intermediate_values, default=0) if trial is not None else 0
        if reported >= step and (newest_step(ckpt_dir) is not None or reported >= last):
            os.kill(victim.proc.pid, signal.SIGKILL)
            return
        time.sleep(0.002)


def _compare(ref: optuna.trial.FrozenTrial, got: optuna.trial.FrozenTrial) -> list[str]:
    out = []
    for name in ("state", "params", "value", "intermediate_values"):
        a, b = getattr(ref, name), getattr(got, name)
        if a != b:
            out.append(f"{name}: uninterrupted {a!r} vs resumed {b!r}"[:300])
    return out


def _why_none(config: Config, killed_step: int) -> str:
    c = config.study.checkpoint
    cadence = "every: auto" if c.every == "auto" else keys_text(c.every_steps, c.every_seconds, " / ")
    return (f"the trial reached step {killed_step} of {config.study.train.steps} before its checkpoint cadence "
            f"({cadence}) came due; the restart began at step 0")


def drill(config: Config, seed: int | None = None, keep: bool = False) -> DrillReport:
    """Run the drill; see the module docstring."""
    study = config.study
    evals = [s for s in range(study.train.eval_every, study.train.steps, study.train.eval_every)]
    if not evals:
        raise SweepError(f"{config.path}: train.steps must exceed train.eval_every for the drill to kill mid-trial")
    kill_at = random.Random(seed).choice(evals)
    root = Path(tempfile.mkdtemp(prefix="sweep-drill-"))
    sessions: list[Session] = []
    try:
        reference, ref_session = _copy(config, root, "reference")
        sessions.append(ref_session)
        _run(reference)
        ref = _finished_trial(ref_session)
        for attempt in range(3):
            # A kill that lands after the trial's last step (a fast trial, a loaded machine: the
            # clean-clone run saw one aimed at 1300 land at 2000) proves nothing: a fresh copy again.
            drilled, session = _copy(config, root, f"drill{attempt or ''}")
            sessions.append(session)
            ckpt_dir = session.config.checkpoint_dir(0)
            victim = _Watched(drilled)
            _kill_after(victim, session, kill_at, ckpt_dir, evals[-1])
            killed_time = time.time()
            victim.proc.wait()
            killed_step = max(_finished_trial(session).intermediate_values)
            if killed_step < study.train.steps:
                break
        saved = newest_step(ckpt_dir)
        saved_time = (ckpt_dir / str(saved)).stat().st_mtime if saved is not None else None
        restart = _Watched(drilled)
        restart.proc.wait()
        if restart.proc.returncode != 0:
            raise SweepError("the drill's restart failed:\n" + "".join(line for _, line in restart.lines))
        restored = restart.first(r"trial 0: resumed from step (\d+)")
        first_step = restart.first(r"trial 0: training again, step \d+ done")
        started = victim.first(r"trial 0: started")
        resumed = int(restored[1].group(1)) if restored else 0
        since = saved_time if saved_time else victim.start_wall + (started[0] if started else 0.0)
        drilled_trial = session.trial(0)
        differences = _compare(ref, drilled_trial)
        ledger = drilled_trial.user_attrs.get(LEDGER_ATTR) or {}
        return DrillReport(
            killed_at_step=killed_step, aimed_at_step=kill_at, resumed_from_step=resumed,
            lost_steps=killed_step - resumed,
            lost_seconds=killed_time - since, restart_to_restored_s=restored[0] if restored else float("nan"),
            restart_to_first_new_step_s=first_step[0] if first_step else float("nan"),
            bit_identical=not differences, differences=differences, why_none=_why_none(config, killed_step),
            deferred_saves=int(ledger.get("deferred_saves", 0)))
    finally:
        for opened in sessions:
            opened.close()
        if not keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
