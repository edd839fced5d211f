"""status: RUNNING while a live worker has a trial, INTERRUPTED once its worker is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import Running, gated_trial, kill9, run_cli, wait_for_checkpoint

pytestmark = pytest.mark.slow  # every test here starts real processes


def _states(study: Path) -> list[str]:
    result = run_cli("status", study, "--json", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    return [t["state"] for t in json.loads(result.stdout)["trials"]]


def test_status_running_for_live_worker_then_interrupted_after_kill9(write_study, tmp_path, held):
    # One trial, held at its 2nd evaluation (step 2000, after its save at 1000) while `hold`
    # exists: the status processes (which import the trial module) look while it runs, however
    # fast the machine.
    study = write_study(trial=gated_trial(tmp_path, 2), n_trials=1, train={"steps": 100000, "eval_every": 1000},
                        checkpoint={"every_steps": 1000})
    hold = held(tmp_path / "hold")
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    wait_for_checkpoint(Path(yaml.safe_load(study.read_text())["workdir"]) / "checkpoints" / "trial_0000", 1000)
    assert _states(study) == ["RUNNING"]
    table = run_cli("status", study, cwd=study.parent).stdout
    assert "RUNNING" in table and "study t: 0/1 trial finished" in table
    kill9(proc)
    hold.unlink()
    assert _states(study) == ["INTERRUPTED"]
    assert "INTERRUPTED" in run_cli("status", study, cwd=study.parent).stdout
