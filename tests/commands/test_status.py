"""status: RUNNING while a live worker has a trial, INTERRUPTED once its worker is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import Running, kill9, run_cli, wait_for_checkpoint

pytestmark = pytest.mark.slow  # every test here starts real processes


def _states(study: Path) -> list[str]:
    result = run_cli("status", study, "--json")
    assert result.returncode == 0, result.stderr
    return [t["state"] for t in json.loads(result.stdout)["trials"]]


def test_status_running_for_live_worker_then_interrupted_after_kill9(write_study):
    # One long trial (~10 s): status (which imports the trial module) has time to look.
    study = write_study(n_trials=1, train={"steps": 100000, "eval_every": 1000},
                        checkpoint={"every_steps": 1000})
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    wait_for_checkpoint(Path(yaml.safe_load(study.read_text())["workdir"]) / "checkpoints" / "trial_0000", 1000)
    assert _states(study) == ["RUNNING"]
    table = run_cli("status", study).stdout
    assert "RUNNING" in table and "study t: 0/1 trial finished" in table
    kill9(proc)
    assert _states(study) == ["INTERRUPTED"]
    assert "INTERRUPTED" in run_cli("status", study).stdout
