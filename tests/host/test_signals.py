"""A signal while a trial starts up (building its state, restoring, compiling): no wait for the
compile, nothing new saved, exit 128 + signum at once, the trial resumes from its newest checkpoint.

Python runs signal handlers only between bytecodes, so not during an XLA compile; the trial here
(tests/trials/slow_compile.py) compiles for seconds (a loss with a big unrolled Python loop), so the
old behaviour (the handler and the grace period starting only once the compile returned) is visible."""

from __future__ import annotations

import signal
import time

import pytest

from conftest import Running, checkpoint_dir, kill9, study_of, wait_for_checkpoint
from tests.trials.files import write_trial

GRACE_S = 5.0


def steps_of(study, number=0) -> list[int]:
    folder = checkpoint_dir(study, number)
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def sigterm_while_compiling(study, cache, after: str) -> tuple[Running, float]:
    """A run with its own (empty) compilation cache, SIGTERMed as soon as `after` is logged: the trial
    is starting up from before that line until its first step, after a trace and compile of seconds
    (sweep/host/signals.py: StopSignal's starting trials); (run, exit seconds)."""
    proc = Running("run", study, cwd=study.parent, env={"SWEEP_COMPILATION_CACHE": str(study.parent / cache)})
    proc.wait_for(after)
    proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert proc.finish(timeout=300) == 143, proc.stderr
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_sigterm_while_a_trial_compiles_exits_at_once_and_saves_nothing_new(write_study):
    study = write_study(trial="slow_compile_trial", n_trials=1, pruner={"type": "none"}, fixed={},
                        search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                        train={"steps": 400, "eval_every": 50},
                        checkpoint={"every_steps": 50, "grace_seconds": GRACE_S})
    write_trial(study.parent, "slow_compile_trial", "slow_compile")

    # A new trial: stopped before its first step, it has nothing to save.
    first, seconds = sigterm_while_compiling(study, "cache1", r"trial 0: started")
    assert "before any new step: exiting now without waiting for the compile" in first.stderr, first.stderr
    assert seconds < GRACE_S and steps_of(study) == []

    # A resumed trial, its program not in the (new) compilation cache: stopped while compiling, it
    # saves no new step and resumes from the one it had.
    proc = Running("run", study, cwd=study.parent, env={"SWEEP_COMPILATION_CACHE": str(study.parent / "cache2")})
    wait_for_checkpoint(checkpoint_dir(study, 0), 100)
    kill9(proc)
    kept = steps_of(study)
    second, seconds = sigterm_while_compiling(study, "cache3", rf"trial 0: resumed from step {kept[-1]}")
    assert "trial 0: signal 15 while it starts up" in second.stderr
    assert f"resumes from step {kept[-1]}" in second.stderr
    assert seconds < GRACE_S, second.stderr
    assert steps_of(study) == kept  # nothing new written
    assert study_of(study).trials[0].state.name == "RUNNING"
    last = Running("run", study, cwd=study.parent, env={"SWEEP_COMPILATION_CACHE": str(study.parent / "cache3")})
    assert last.finish(timeout=600) == 0, last.stderr
    assert f"trial 0: resumed from step {kept[-1]}" in last.stderr
    (trial,) = study_of(study).trials
    assert trial.state.name == "COMPLETE" and trial.user_attrs["resumes"] == 3
