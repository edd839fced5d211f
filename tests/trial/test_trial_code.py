"""The trial's own code (its module and the local modules it imports): hashed, recorded per trial
when it trains, warned about at resume and export where it changed, exported as trained."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TRIAL_SOURCE, Running, kill9, run_cli, study_of, wait_for_checkpoint
from sweep.trial import code as trial_code


def write_trial(root: Path, trial: str, models: str) -> None:
    """A tiny linear trial whose initial scale comes from a local module `models`."""
    source = TRIAL_SOURCE.replace("import optax", f"import optax\nfrom {models} import SCALE")
    (root / f"{trial}.py").write_text(source.replace('return {"w": 0.01', 'return {"w": SCALE'))
    (root / f"{models}.py").write_text("SCALE = 0.01\n")


def test_modules_are_the_trial_and_its_local_imports_not_libraries(tmp_path, monkeypatch):
    write_trial(tmp_path, "tc_scan_trial", "tc_scan_models")
    (tmp_path / "tc_scan_pkg").mkdir()
    (tmp_path / "tc_scan_pkg" / "__init__.py").write_text("from . import helpers\n")
    (tmp_path / "tc_scan_pkg" / "helpers.py").write_text("X = 1\n")
    with (tmp_path / "tc_scan_trial.py").open("a") as fh:
        fh.write("\ndef later():\n    import tc_scan_pkg\n    import json\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tc_scan_trial  # noqa: F401 (imported as the config loader would)

    found = trial_code.modules(sys.modules["tc_scan_trial"])
    assert found == {name: str(tmp_path / path) for name, path in [
        ("tc_scan_models", "tc_scan_models.py"), ("tc_scan_pkg", "tc_scan_pkg/__init__.py"),
        ("tc_scan_pkg.helpers", "tc_scan_pkg/helpers.py"), ("tc_scan_trial", "tc_scan_trial.py")]}
    before = trial_code.record(sys.modules["tc_scan_trial"])
    assert before["files"]["tc_scan_models"] == hashlib.sha256(b"SCALE = 0.01\n").hexdigest()
    (tmp_path / "tc_scan_pkg" / "helpers.py").write_text("X = 2\n")
    after = trial_code.record(sys.modules["tc_scan_trial"])
    assert trial_code.differences(before, after) == ["tc_scan_pkg.helpers"]
    assert trial_code.differences(None, after) == [] and trial_code.differences(after, after) == []


@pytest.mark.slow
def test_a_models_edit_between_kill_and_resume_warns_and_export_keeps_the_trained_hash(tmp_path):
    write_trial(tmp_path, "tc_trial", "tc_models")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "tc", "trial": "tc_trial", "workdir": str(tmp_path / "runs"), "n_trials": 1,
        "objective": {"metric": "val_loss"}, "sampler": {"type": "random", "seed": 0},
        "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}},
        "train": {"steps": 400000, "eval_every": 20000}, "checkpoint": {"every_steps": 20000}}))
    first = Running("run", study, cwd=tmp_path)
    first.wait_for(r"trial 0: started")
    wait_for_checkpoint(tmp_path / "runs" / "checkpoints" / "trial_0000", 20000)
    kill9(first)
    trained = study_of(study).trials[0].user_attrs["trial_code"]
    assert set(trained["files"]) == {"tc_trial", "tc_models"}

    (tmp_path / "tc_models.py").write_text("SCALE = 0.02\n")  # Dense(500) -> Dense(400), in small
    plan = run_cli("plan", study, cwd=tmp_path)
    assert "warning: the trial code changed since this study last ran: tc_models" in plan.stdout, plan.stdout
    second = Running("run", study, cwd=tmp_path)
    assert second.finish() == 0, second.stderr
    assert "trial 0: resumed from step" in second.stderr, second.stderr
    assert "trial 0: its code changed since it last trained: tc_models (sha256 " in second.stderr, second.stderr
    resumed = study_of(study).trials[0].user_attrs["trial_code"]
    assert resumed["files"]["tc_models"] == hashlib.sha256(b"SCALE = 0.02\n").hexdigest() != trained["files"][
        "tc_models"]

    (tmp_path / "tc_models.py").write_text("SCALE = 0.03\n")  # edited after training: export says so
    result = run_cli("export", study, "--out", tmp_path / "export", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "trial 0: its params were trained with other code than the trial's modules hold now: tc_models" \
        in result.stderr
    meta = json.loads((tmp_path / "export" / "trial_0000" / "meta.json").read_text())
    assert meta["trial_code_sha256"] == resumed["sha256"] and meta["trial_code_files"] == resumed["files"]
    assert meta["trial_code_recorded"] is True
    assert meta["trial_source_sha256"] == hashlib.sha256((tmp_path / "tc_trial.py").read_bytes()).hexdigest()
