"""End to end: the real CLI in a subprocess, killed for real, resumed with the same command."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import yaml

from conftest import checkpoint_dir, gated_trial, kill9, kill_mid_trial, cli_here, run_cli, Running, signalled_after_a_save, snapshot, study_of

pytestmark = pytest.mark.slow  # every test here starts real processes


def _finish(study_file: Path) -> str:
    result = run_cli("run", study_file, cwd=study_file.parent)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_run_uninterrupted_finishes_with_summary(reference):
    # The suite's uninterrupted reference run (that the same study file gives the same results run
    # after run, on one machine, is what every comparison with it below shows).
    study, stdout = reference.run()
    assert re.search(r"study t: 4/4 trials finished", stdout)
    best = study_of(study).best_trial
    assert f"best trial: {best.number}  val_loss={best.value!r}" in stdout
    assert str(best.params) in stdout


def test_run_killed_mid_trial_resumes_from_newest_checkpoint(write_study, reference, tmp_path, held):
    # Held at the process's 17th evaluation (trial 0's 12, then trial 1's at step 250, after its
    # save at 200): the kill lands mid-trial however fast the machine.
    study = write_study(trial=gated_trial(tmp_path, 17))
    newest = kill_mid_trial(study, 1, 200, held(tmp_path / "hold"))[-1]
    assert 200 <= newest < 600
    stderr = _finish(study)
    # Resumed under its own number from the newest checkpoint: the saved steps were not recomputed.
    assert f"trial 1: resumed from step {newest}" in stderr
    assert "trial 0: started" not in stderr and "trial 1: started" not in stderr
    trial1 = study_of(study).trials[1]
    assert trial1.user_attrs["resumes"] == 1
    assert trial1.user_attrs["checkpoint_dir"] == str(checkpoint_dir(study, 1))
    assert snapshot(study) == reference()


def test_run_killed_repeatedly_equals_uninterrupted(write_study, reference):
    study = write_study()
    for number in (0, 2, 3):
        kill_mid_trial(study, number, 100)
    _finish(study)
    assert snapshot(study) == reference()
    assert len(study_of(study).trials) == 4


def test_run_killed_between_trials_equals_uninterrupted(write_study, reference):
    study = write_study()
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 1: (complete|pruned)")
    kill9(proc)
    stderr = _finish(study)
    assert re.search(r"trials 0-1: finished, skipped", stderr)
    assert snapshot(study) == reference()


def test_run_killed_right_after_start_equals_uninterrupted(write_study, reference):
    study = write_study()
    proc = Running("run", study, cwd=study.parent)
    kill9(proc)  # at once: in its imports, before it wrote anything
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")  # the study and trial 0 exist, nothing trained yet
    kill9(proc)
    _finish(study)
    assert snapshot(study) == reference()


def test_sigterm_checkpoints_current_step_and_exits_143(write_study, reference, tmp_path, held):
    # Held at the process's 15th evaluation (trial 0's 12, then trial 1's at step 150, after its
    # save at 100): the signal lands mid-trial however fast the machine. (status reads the study
    # in this process: a module name of this test's own.)
    study = write_study(trial=gated_trial(tmp_path, 15, name="gated_sigterm"))
    proc = signalled_after_a_save(study, 1, signal.SIGTERM, hold=held(tmp_path / "hold"))  # exit 143
    stopped = int(re.search(r"trial 1: stopped at step (\d+); checkpoint saved", proc.stderr).group(1))
    status = json.loads(cli_here("status", study, "--json", cwd=tmp_path).stdout)
    trial1 = status["trials"][1]
    assert trial1["state"] == "INTERRUPTED"
    # The current step was saved, even off the every_steps cadence; the next run starts there.
    newest = max(int(p.name) for p in checkpoint_dir(study, 1).iterdir() if p.name.isdigit())
    assert newest == stopped
    stderr = _finish(study)
    assert f"trial 1: resumed from step {newest}" in stderr
    assert snapshot(study) == reference()


def test_rerun_of_finished_study_trains_nothing_and_raising_n_trials_adds_only_the_missing_trials(
        write_study, reference):
    study = write_study(n_trials=2)
    first = run_cli("run", study, cwd=study.parent)
    assert first.returncode == 0, first.stderr
    _status_json_follows_the_reference(study)
    workdir = Path(yaml.safe_load(study.read_text())["workdir"])
    before = {p: p.stat().st_mtime_ns for p in (workdir / "checkpoints").rglob("*")}
    again = run_cli("run", study, cwd=study.parent)
    assert again.returncode == 0, again.stderr
    assert "trials 0-1: finished, skipped" in again.stderr
    assert "started" not in again.stderr and "resumed" not in again.stderr
    assert {p: p.stat().st_mtime_ns for p in (workdir / "checkpoints").rglob("*")} == before
    assert again.stdout == first.stdout
    # n_trials raised: only the missing trials run, and the study equals one run with 4 from the start
    study = write_study(n_trials=4)
    stderr = _finish(study)
    assert "trials 0-1: finished, skipped" in stderr
    assert "trial 2: started" in stderr and "trial 3: started" in stderr
    assert snapshot(study) == reference()


def test_two_processes_on_one_sqlite_study_run_each_trial_once(write_study):
    study = write_study(n_trials=6, pruner={"type": "none"})
    procs = [Running("run", study, cwd=study.parent) for _ in range(2)]
    codes = [p.finish() for p in procs]
    assert codes == [0, 0], [p.stderr for p in procs]
    for p in procs:
        assert "Traceback" not in p.stderr and "locked" not in p.stderr
    started = [int(m) for p in procs for m in re.findall(r"trial (\d+): started", p.stderr)]
    assert sorted(started) == list(range(6))  # each trial run by exactly one process, once
    trials = study_of(study).trials
    assert [t.number for t in trials] == list(range(6))
    assert all(t.state.name == "COMPLETE" and t.user_attrs["resumes"] == 0 for t in trials)
    assert all(len(t.intermediate_values) == 12 for t in trials)


def _status_json_follows_the_reference(study: Path) -> None:
    """status --json of a finished study: every field docs/reference.md promises, equal to Optuna's record."""
    result = cli_here("status", study, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["study"] == "t" and status["n_trials"] == 2 and status["storage"].startswith("sqlite:///")
    for entry, trial in zip(status["trials"], study_of(study).trials):
        assert set(entry) >= {"number", "state", "params", "value", "best_step", "best_value", "last_step",
                              "checkpoint_dir", "resumes"}
        assert entry["state"] == trial.state.name and entry["params"] == trial.params
        values = trial.intermediate_values
        assert entry["best_value"] == min(values.values()) == entry["value"] or entry["state"] == "PRUNED"
        assert values[entry["best_step"]] == entry["best_value"]
        assert entry["last_step"] == max(values)
        assert Path(entry["checkpoint_dir"]).is_absolute() and (Path(entry["checkpoint_dir"]) / str(
            entry["best_step"])).is_dir()
    table = run_cli("status", study)
    assert table.returncode == 0 and "COMPLETE" in table.stdout and "*" in table.stdout


def test_compiles_are_counted_per_trial_and_a_new_process_compiles_nothing_cached(write_study, tmp_path):
    # Every trial of the same shapes: the second process finds all it needs in the study's cache.
    shapes = dict(search_space={"learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
                  fixed={"batch_size": 32, "hidden": 32}, train={"steps": 100, "eval_every": 50})
    own = {"SWEEP_COMPILATION_CACHE": str(tmp_path / "own_cache")}  # empty: not the tests' shared one
    study = write_study(n_trials=1, **shapes)
    assert run_cli("run", study, cwd=study.parent, env=own).returncode == 0
    study = write_study(n_trials=2, **shapes)
    again = run_cli("run", study, cwd=study.parent, env=own)
    assert again.returncode == 0, again.stderr
    first, second = json.loads(cli_here("status", study, "--json").stdout)["trials"]
    assert first["compiles"]["compilations"] > 0 and first["compiles"]["compile_seconds"] > 0
    assert second["compiles"]["compilations"] == 0 and second["compiles"]["cache_hits"] > 0, second["compiles"]
    assert re.search(r"compilation: \d+ XLA compilations? in [\d.]+ s, \d+ executables? from the "
                     r"persistent cache, over 2 trials", again.stdout), again.stdout


def test_status_of_missing_study_is_a_clear_error(write_study, tmp_path):
    study = write_study()
    result = cli_here("status", study)
    assert result.returncode == 1
    assert "not found" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_timeout_stops_asking_new_trials_and_rerun_continues(write_study, reference):
    study = write_study(timeout=0.5)
    first = run_cli("run", study, cwd=study.parent)
    assert first.returncode == 0, first.stderr
    assert re.search(r"study t: [1-3]/4 trials finished", first.stdout)  # the running trial finished
    study = write_study()  # same study without the timeout
    _finish(study)
    assert snapshot(study) == reference()
