"""--n-jobs: several worker processes through joblib share one study, each trial run once."""

from __future__ import annotations

import re

from conftest import run_cli, study_of


def test_n_jobs_2_runs_exactly_n_trials_each_once(write_study):
    study = write_study(n_trials=5, pruner={"type": "none"})
    result = run_cli("run", study, "--n-jobs", "2", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    started = sorted(int(n) for n in re.findall(r"trial (\d+): started", result.stderr))
    assert started == list(range(5))
    trials = study_of(study).trials
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" for t in trials)
    assert "study t: 5/5 trials finished" in result.stdout


def test_n_jobs_zero_is_a_usage_error(write_study):
    study = write_study()
    result = run_cli("run", study, "--n-jobs", "0", cwd=study.parent)
    assert result.returncode == 2 and "--n-jobs: must be >= 1, got 0" in result.stderr
    assert not (study.parent / "runs").exists()


def test_n_jobs_2_parent_killed_then_rerun_equals_one_process(write_study, reference):
    import signal
    import time

    from conftest import Running, snapshot

    settings = dict(n_trials=6, sampler={"type": "random", "seed": 5}, pruner={"type": "none"},
                    train={"steps": 4000, "eval_every": 200}, checkpoint={"every_steps": 400})
    study = write_study(**settings)
    proc = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    proc.wait_for(r"trial 2: started")
    proc.signal(signal.SIGKILL)  # the parent only: its loky workers notice and stop
    proc.finish()
    time.sleep(1.0)
    again = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    assert again.finish() == 0, again.stderr
    assert "study t: 6/6 trials finished" in again.stdout
    assert snapshot(study) == reference(**settings)  # params and values as with one process
