"""A study that cannot be broken by editing, moving or failing: refused edits, `plan`, a moved
folder, the trial-code warning and the checks made before anything is created. Through the CLI."""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from conftest import (BASE_STUDY, REPO, Running, checkpoint_dir, cli, kill9, kill_mid_trial, run_cli, snapshot,
                      study_of, wait_for_checkpoint)

pytestmark = pytest.mark.slow  # every test here starts real processes

WITH_CHOICE = {"search_space": {
    "learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True},
    "hidden": {"type": "int", "low": 16, "high": 64, "step": 16},
    "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
}}


def fingerprint_of_disk(study: Path) -> dict[str, str]:
    """Every file under the study's workdir -> hash of its bytes; the SQLite database by content
    (a reader closing the database folds SQLite's write-ahead log into it: other bytes, same rows)."""
    root = Path(yaml.safe_load(study.read_text())["workdir"])
    out = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith("study.db")}
    with contextlib.closing(sqlite3.connect(root / "study.db")) as db:
        out["study.db rows"] = hashlib.sha256("\n".join(db.iterdump()).encode()).hexdigest()
    return out


def edited(study: Path, edit) -> str:
    data = yaml.safe_load(study.read_text())
    edit(data)
    return yaml.safe_dump(data, sort_keys=False)


def test_edits_of_a_half_finished_study_are_refused_and_the_restored_file_finishes_bit_identically(
        write_study, reference, capsys):
    study = write_study(**WITH_CHOICE)
    original = study.read_text()
    kill_mid_trial(study, 1, 200)
    newest = max(int(p.name) for p in checkpoint_dir(study, 1).iterdir() if p.name.isdigit())

    # plan: what run would do, writing nothing. The refusals below run through main() in this
    # process (the exit code and the message are what is tested; test_config.py runs refusals
    # as processes).
    before = fingerprint_of_disk(study)
    code, out, err = cli(capsys, "plan", study)
    assert code == 0, err
    assert re.search(r"skip:\s+trial 0, finished \(COMPLETE\)", out), out
    assert f"resume:  trial 1 from its newest checkpoint, step {newest}" in out
    assert re.search(r"new:\s+trials 2-3, sampled by tpe", out), out
    assert fingerprint_of_disk(study) == before

    edits = {
        "search_space.optimizer.choices: [\"adam\", \"sgd\"] -> [\"adam\"]":
            lambda d: d["search_space"]["optimizer"].update(choices=["adam"]),
        "train.steps: 600 -> 800": lambda d: d["train"].update(steps=800),
        "search_space.learning_rate.high: 0.1 -> 0.05":
            lambda d: d["search_space"]["learning_rate"].update(high=0.05),
    }
    for named, edit in edits.items():
        study.write_text(edited(study, edit))
        for command in ("run", "plan"):
            code, out, err = cli(capsys, command, study)
            out = err + out
            assert code == 2, (command, out)
            assert named in out, (command, out)
            assert "Traceback" not in out
        assert fingerprint_of_disk(study) == before  # database and checkpoints untouched
        study.write_text(original)

    # Keys that only steer the run may change.
    study.write_text(edited(study, lambda d: d["checkpoint"].update(keep_last=3)))
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert snapshot(study) == reference(**WITH_CHOICE)


def test_plan_of_a_new_study_creates_nothing(write_study):
    study = write_study(n_trials=3)
    result = run_cli("plan", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "not created yet" in result.stdout and "trials 0-2, sampled by" in result.stdout
    assert not Path(yaml.safe_load(study.read_text())["workdir"]).exists()


def test_moved_study_folder_resumes_from_the_moved_checkpoints(tmp_path, reference):
    # A study folder as users keep one: the study file beside its workdir, relative paths.
    old = tmp_path / "project"
    old.mkdir()
    study = old / "study.yaml"
    study.write_text(yaml.safe_dump({**BASE_STUDY, "workdir": "runs/t"}, sort_keys=False))
    proc_steps = _kill_relative(study, 1, 200)

    new = tmp_path / "moved"
    shutil.move(old, new)
    result = run_cli("run", new / "study.yaml", cwd=new)
    assert result.returncode == 0, result.stderr
    assert f"trial 1: resumed from step {proc_steps[-1]}" in result.stderr
    assert not old.exists()  # nothing written at the old place
    trial = study_of_relative(new / "study.yaml")[1]
    assert trial.user_attrs["checkpoint_dir"] == str(new / "runs" / "t" / "checkpoints" / "trial_0001")
    assert snapshot_relative(new / "study.yaml") == reference()


def _kill_relative(study: Path, number: int, step: int) -> list[int]:
    proc = Running("run", study.name, cwd=study.parent)
    proc.wait_for(rf"trial {number}: started")
    folder = study.parent / "runs" / "t" / "checkpoints" / f"trial_{number:04d}"
    wait_for_checkpoint(folder, step)
    kill9(proc)
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _absolute(study: Path) -> Path:
    """The same study file with its workdir made absolute (the conftest readers expect one)."""
    data = yaml.safe_load(study.read_text())
    data["workdir"] = str(study.parent / data["workdir"])
    out = study.parent / "absolute.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def study_of_relative(study: Path):
    return sorted(study_of(_absolute(study)).trials, key=lambda t: t.number)


def snapshot_relative(study: Path):
    return snapshot(_absolute(study))


BAD_METRIC = (REPO / "trials" / "digits_mlp.py").read_text().replace(
    'data["y_val"], "val")', 'data["y_val"], "valid")')
BAD_LOSS = (REPO / "trials" / "digits_mlp.py").read_text().replace(
    'return _metrics(hp, params, x, y, "train")["train_loss"]',
    'return _metrics(hp, params, x, y, "train")["train_loss"] * jnp.ones(3)')


@pytest.mark.parametrize("source, message", [
    (BAD_METRIC, "trial: bad_trial.evaluate returns no 'val_loss', a metric its METRICS declares "
                 "(it returns 'valid_accuracy', 'valid_loss')"),
    (BAD_LOSS, "trial: bad_trial's training step (batch, loss, optimizer) raised TypeError: Gradient only "
               "defined for scalar-output functions"),
], ids=["wrong-metric-name", "loss-not-scalar"])
def test_broken_trial_code_is_exit_2_before_anything_exists(write_study, source, message):
    assert source != (REPO / "trials" / "digits_mlp.py").read_text()
    study = write_study(trial="bad_trial")
    (study.parent / "bad_trial.py").write_text(source)
    for command in ("run", "plan"):
        result = run_cli(command, study, cwd=study.parent)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
    assert not Path(yaml.safe_load(study.read_text())["workdir"]).exists()


def test_changed_trial_code_under_an_unfinished_study_is_a_warning(write_study):
    source = (REPO / "trials" / "digits_mlp.py").read_text()
    study = write_study(trial="my_trial", n_trials=1, train={"steps": 100, "eval_every": 50})
    module = study.parent / "my_trial.py"
    module.write_text(source)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    module.write_text(source + "\n# a comment: the code changed\n")
    study.write_text(edited(study, lambda d: d.update(n_trials=2)))
    plan = run_cli("plan", study, cwd=study.parent)
    assert plan.returncode == 0 and "warning: the trial code changed since this study last ran" in plan.stdout
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert re.search(r"the trial code changed since this study last ran: .*my_trial\.py \(sha256 \w+ -> \w+\)",
                     result.stderr), result.stderr
    assert [t.state.name for t in study_of(study).trials] == ["COMPLETE", "COMPLETE"]
    again = run_cli("run", study, cwd=study.parent)  # warned once: the new code is recorded
    assert again.returncode == 0 and "trial code changed" not in again.stderr
