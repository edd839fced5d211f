"""retry: FAIL trials train again under their number and params, from their newest checkpoint or
from scratch; an interrupted retry goes on with `run`; the study ends as if the trial never failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import sweep
from conftest import (Running, checkpoint_dir, kill9, make_study, run, run_cli, run_interrupted, saved_steps,
                      snapshot, trials, wait_for_checkpoint, wait_for_file, write_trial)
from sweep.__main__ import main


def _fail_trial_0_at(study: dict[str, Any], step: int) -> None:
    """Run the study; trial 0's evaluation after `step` raises (the `fault` marker of the tiny trial)."""
    def on_step(number: int, at: int) -> None:
        if number == 0 and at >= step and not Path("failed-once").exists():
            Path("fault").touch()
            Path("failed-once").touch()

    run(study, on_step=on_step)


@pytest.mark.parametrize("from_scratch", [False, True], ids=["newest-checkpoint", "from-scratch"])
def test_a_failed_trial_retried_then_interrupted_ends_as_if_it_never_failed(here, from_scratch):
    reference = make_study(here, workdir=str(here / "reference"))
    run(reference)
    study = make_study(here)
    _fail_trial_0_at(study, 25)  # its saves: 20; the evaluation at 30 raises
    before = trials(study)
    assert [t.state.name for t in before] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert sorted(before[0].intermediate_values) == [10, 20]
    with sweep.open(study) as session:
        assert session.retry(from_scratch=from_scratch) == [0]
    reopened = trials(study)[0]
    assert reopened.state.name == "RUNNING" and reopened.params == before[0].params
    entry = dict(reopened.user_attrs["retried"][0])
    assert entry.pop("error") == before[0].user_attrs["error"]  # its failure, in the record
    assert entry == {"failures": 1, "last_step": 20, "from_step": 0 if from_scratch else 20}
    assert sorted(reopened.intermediate_values) == ([] if from_scratch else [10, 20])
    run_interrupted(study, 0, 30)  # the retry, interrupted past its first new save
    assert trials(study)[0].state.name == "RUNNING"
    run(study)  # the same command goes on
    assert snapshot(study) == snapshot(reference)  # n_trials exact: trial 0 again, nothing added
    after = trials(study)[0]
    assert after.user_attrs["retried"] == reopened.user_attrs["retried"] and after.user_attrs["failures"] == 0
    assert (after.user_attrs["resumed_from"][0] == 20) != from_scratch  # where the retry went on from


def test_retry_refuses_a_changed_study_a_trial_that_did_not_fail_and_reopens_nothing(here, capsys):
    study = make_study(here)
    _fail_trial_0_at(study, 25)
    path = here / "study.yaml"
    path.write_text(yaml.safe_dump({**study, "train": {**study["train"], "steps": 80}}))
    capsys.readouterr()  # the failing run's log (a logger another test set up may write to stderr)
    assert main(["retry", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and "train.steps: 40 -> 80" in err and "Traceback" not in err, err
    path.write_text(yaml.safe_dump(study))
    assert main(["retry", str(path), "--trial", "1"]) == 2
    assert capsys.readouterr().err == "error: --trial 1: trial 1 is COMPLETE, not FAIL: only failed trials are retried\n"
    assert main(["retry", str(path), "--trial", "7"]) == 2
    assert capsys.readouterr().err == f"error: --trial 7: study {study['name']!r} has no trial 7\n"
    assert [t.state.name for t in trials(study)] == ["FAIL", "COMPLETE", "COMPLETE"]  # nothing reopened


def test_retry_on_a_journal_is_refused_before_anything_is_removed(here, capsys):
    """Optuna's journal never changes a finished trial: exit 2, one line, the FAIL trial and its
    checkpoints as they were (--from-scratch would remove them first)."""
    import optuna

    from conftest import optuna_storage

    study = make_study(here, storage=f"journal://{here / 'shared' / 'study.log'}")
    _fail_trial_0_at(study, 25)
    path = here / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    kept = saved_steps(checkpoint_dir(study, 0))
    capsys.readouterr()
    assert main(["retry", str(path), "--from-scratch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: retry: not on a journal storage (journal://") and err.count("\n") == 1, err
    assert "Optuna's journal never changes a finished trial" in err
    states = [t.state.name for t in optuna.load_study(study_name=study["name"],
                                                      storage=optuna_storage(study["storage"])).trials]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"] and saved_steps(checkpoint_dir(study, 0)) == kept == [20]


@pytest.mark.slow
def test_python_m_sweep_retry_killed_mid_trial_then_run_ends_as_if_the_trial_never_failed(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    write_trial(reference)
    study = make_study(reference, n_trials=2, sampler={"type": "random", "seed": 0})
    (reference / "study.yaml").write_text(yaml.safe_dump(study))
    assert run_cli("run", reference / "study.yaml", cwd=reference).returncode == 0
    write_trial(tmp_path)
    study = make_study(tmp_path, n_trials=2, sampler={"type": "random", "seed": 0})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    (tmp_path / "fault").touch()  # trial 0's first evaluation raises: FAIL (max_retries 0)
    first = run_cli("run", path, cwd=tmp_path)
    assert first.returncode == 0 and "Trial 0 failed with parameters" in first.stderr, first.stderr
    assert run_cli("run", path, cwd=tmp_path).returncode == 0  # a rerun leaves a FAIL trial alone
    assert [t.state.name for t in trials(study)] == ["FAIL", "COMPLETE"]
    (tmp_path / "hold").write_text("3")  # the retry waits at its 3rd evaluation (step 30), past its save at 20
    retry = Running("retry", path, cwd=tmp_path)
    wait_for_file(tmp_path / "held", proc=retry)
    wait_for_checkpoint(checkpoint_dir(path, 0), 20, proc=retry)  # its save at 20, committed while it waits
    kill9(retry)
    assert "trial 0: retried from step 0 (it failed with " in retry.stderr, retry.stderr
    assert trials(study)[0].state.name == "RUNNING" and 20 in saved_steps(checkpoint_dir(path, 0))
    (tmp_path / "hold").unlink()
    again = run_cli("run", path, cwd=tmp_path)  # the same command as after any kill
    assert again.returncode == 0, again.stderr
    assert snapshot(path) == snapshot(reference / "study.yaml")
    assert trials(study)[0].user_attrs["resumed_from"] == [20]
    status = run_cli("status", path, cwd=tmp_path)
    assert "2/2 trials finished" in status.stdout
