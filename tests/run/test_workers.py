"""--n-jobs: several worker processes through joblib share one study, each trial run once."""

from __future__ import annotations

import re

import pytest

from conftest import gated_trial, _loky_children, run_cli, study_of
from tests.trials.files import write_trial

pytestmark = pytest.mark.slow  # every test here starts real processes


def test_n_jobs_2_runs_exactly_n_trials_each_once_and_keeps_the_2_best_trials_checkpoints(write_study):
    study = write_study(n_trials=5, pruner={"type": "none"}, checkpoint={"keep_trials": 2})
    result = run_cli("run", study, "--n-jobs", "2", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    started = sorted(int(n) for n in re.findall(r"trial (\d+): started", result.stderr))
    assert started == list(range(5))
    trials = study_of(study).trials
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" for t in trials)
    assert "study t: 5/5 trials finished" in result.stdout
    # checkpoint.keep_trials 2: only the two best keep a folder; each removal came after its
    # trial finished (either worker may remove it).
    best = sorted(trials, key=lambda t: (t.value, t.number))
    root = study.parent / "runs" / "t" / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("trial_") and p.name[-1].isdigit()) == sorted(
        f"trial_{t.number:04d}" for t in best[:2])
    removed = [int(n) for n in re.findall(r"trial (\d+): checkpoints removed \(keep_trials 2", result.stderr)]
    assert sorted(set(removed)) == sorted(t.number for t in best[2:])
    for n in removed:
        assert result.stderr.index(f"trial {n}: complete") < result.stderr.index(f"trial {n}: checkpoints removed")
    gone = best[-1].number
    refused = run_cli("export", study, "--out", str(study.parent / "out"), "--trial", str(gone), cwd=study.parent)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"error: trial {gone}: its checkpoints at " in refused.stderr
    assert "removed by the study's disk budget (keep_trials 2: not among the 2 best COMPLETE trials)" in refused.stderr
    assert not (study.parent / "out" / f"trial_{gone:04d}").exists()


def test_n_jobs_zero_is_a_usage_error(write_study):
    study = write_study()
    result = run_cli("run", study, "--n-jobs", "0", cwd=study.parent)
    assert result.returncode == 2 and "--n-jobs: must be >= 1, got 0" in result.stderr
    assert not (study.parent / "runs").exists()


def test_n_jobs_2_parent_killed_then_rerun_equals_one_process(write_study, reference):
    import signal
    import time

    from conftest import Running, snapshot

    # Saves every 2000 steps: a save outlasts 400 steps, and this study runs three times over.
    settings = dict(n_trials=6, sampler={"type": "random", "seed": 5}, pruner={"type": "none"},
                    train={"steps": 4000, "eval_every": 200}, checkpoint={"every_steps": 2000})
    study = write_study(**settings)
    proc = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    proc.wait_for(r"trial 2: started")
    workers = _loky_children(proc.proc.pid)
    proc.signal(signal.SIGKILL)  # the parent only: its loky workers notice and stop
    proc.finish()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_alive(pid) for pid in workers), workers
    again = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    assert again.finish() == 0, again.stderr
    assert "study t: 6/6 trials finished" in again.stdout
    assert snapshot(study) == reference(**settings)  # params and values as with one process


def test_n_jobs_2_sigterm_checkpoints_both_trials_and_rerun_finishes_them(write_study, held):
    # This process trains one trial and a loky worker the other: SIGTERM to this process alone
    # must checkpoint both mid-trial (the worker gets it forwarded) and exit 143 within the grace.
    # Each process waits at its 3rd evaluation (step 3000, after its save at 2000) while `hold`
    # exists (tests/trials/gated.py), so neither trial can end before the signal, on any machine.
    # (Equality with one process is the parent-kill test's.)
    import signal

    from conftest import Running, checkpoint_dir, wait_for_checkpoint

    steps = 20000
    study = write_study(trial="gated_digits", n_trials=2, sampler={"type": "random", "seed": 8},
                        pruner={"type": "none"}, train={"steps": steps, "eval_every": 1000},
                        checkpoint={"every_steps": 2000, "grace_seconds": 15})
    gated_trial(study.parent, 3, name="gated_digits")
    hold = held(study.parent / "hold")
    proc = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    for number in (0, 1):
        wait_for_checkpoint(checkpoint_dir(study, number), 2000, proc=proc)
    proc.signal(signal.SIGTERM)
    # This process goes on to its stop, then forwards the signal to the helper, still held; once
    # the helper says it took the signal (each process does), it goes on to its stop too.
    (study.parent / f"hold.{proc.proc.pid}").touch()
    proc.wait_for(r"signal 15 received", count=2)
    hold.unlink()
    assert proc.finish(timeout=60) == 143, proc.stderr
    stopped = {}
    for number in (0, 1):
        m = re.search(rf"trial {number}: stopped at step (\d+); checkpoint saved", proc.stderr)
        assert m, proc.stderr
        stopped[number] = int(m.group(1))
        assert 2000 <= stopped[number] < steps
        assert max(int(p.name) for p in checkpoint_dir(study, number).iterdir() if p.name.isdigit()) == stopped[number]
    again = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    assert again.finish() == 0, again.stderr
    for number in (0, 1):
        assert f"trial {number}: resumed from step {stopped[number]}" in again.stderr
    trials = study_of(study).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert [t.user_attrs["last_step"] for t in trials] == [steps, steps]


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's exit is reaped by whoever adopted it)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_n_jobs_2_worker_killed_is_replaced_and_study_equals_one_process(write_study, reference, held):
    import os
    import signal

    from conftest import Running, checkpoint_dir, snapshot, wait_for_checkpoint

    # Two trials side by side, each process held at its 3rd evaluation (step 3000, after its save
    # at 2000) while `hold` exists (tests/trials/gated.py): the worker is killed mid-trial.
    settings = dict(n_trials=2, sampler={"type": "random", "seed": 9}, pruner={"type": "none"},
                    train={"steps": 20000, "eval_every": 1000}, checkpoint={"every_steps": 2000})
    study = write_study(trial="gated_digits", **settings)
    gated_trial(study.parent, 3, name="gated_digits")
    hold = held(study.parent / "hold")
    proc = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    for number in (0, 1):
        wait_for_checkpoint(checkpoint_dir(study, number), 2000, proc=proc)
    workers = _loky_children(proc.proc.pid)
    assert len(workers) == 1, workers  # n_jobs 2 = this process + one loky worker
    os.kill(workers[0], signal.SIGKILL)
    hold.unlink()
    assert proc.finish() == 0, proc.stderr
    assert "a worker process died" in proc.stderr
    assert re.search(r"trial [01]: resumed from step [1-9]", proc.stderr), proc.stderr
    assert "study t: 2/2 trials finished" in proc.stdout
    assert snapshot(study) == reference(**settings)  # trials.digits_mlp: the same numbers


def test_n_jobs_2_processes_train_on_disjoint_shares_of_the_cores(write_study):
    import ast
    import os

    cpus = sorted(os.sched_getaffinity(0))
    study = write_study(trial="affinity_trial", n_trials=4, pruner={"type": "none"},
                        search_space={"hidden": {"type": "int", "low": 16, "high": 64, "step": 16}})
    write_trial(study.parent, "affinity_trial", "digits_recording", LOG="affinity.txt")  # pid, cores
    result = run_cli("run", study, "--n-jobs", "2", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    seen: dict[int, set[str]] = {}  # every mask a step of each process ran under
    for line in (study.parent / "affinity.txt").read_text().splitlines():
        pid, _, mask = line.partition(" ")
        seen.setdefault(int(pid), set()).add(mask)
    assert len(seen) == 2 and all(len(m) == 1 for m in seen.values()), seen  # both trained, pinned throughout
    masks = sorted(ast.literal_eval(m.pop()) for m in seen.values())
    if len(cpus) >= 2:  # each on its own half: XLA's pools are sized to it, no oversubscription
        assert masks == sorted([cpus[0::2], cpus[1::2]]), masks
    else:
        assert masks == [cpus, cpus]
