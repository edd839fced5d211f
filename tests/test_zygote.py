"""The tests' fork server (tests/zygote.py): a CLI process forked from it looks, to the code it
runs, as a `python -m sweep` process started through exec does, and dies by signals as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import conftest, zygote
from tests.conftest import Running, cli_env, make_study, run_cli, wait_for_file
from tests.trials.files import trial_source, write_trial


def _study(folder: Path, trial: str = "view_trial") -> Path:
    folder.mkdir()
    write_trial(folder, trial, "linear", VIEW="view.json")
    study = make_study(folder, trial=trial, n_trials=1, train={"steps": 20, "eval_every": 10, "seed": 0})
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_forked_cli_process_sees_what_an_execd_one_sees(tmp_path: Path) -> None:
    env = {"SWEEP_HOST": "viewhost", "SWEEP_VIEW_MARKER": "on"}
    forked_study, execd_study = _study(tmp_path / "forked"), _study(tmp_path / "execd")
    forked = run_cli("run", forked_study, cwd=forked_study.parent, env=env)
    execd = subprocess.run([sys.executable, "-m", "sweep", "run", str(execd_study)], cwd=execd_study.parent,
                           env={**cli_env(), **env}, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert forked.returncode == execd.returncode == 0, (forked.stderr, execd.stderr)
    views = [json.loads((study.parent / "view.json").read_text()) for study in (forked_study, execd_study)]
    # the first was forked by the server, the second exec'd by this process
    assert [view.pop("ppid") for view in views] == [conftest._ZYGOTE["server"].pid, os.getpid()]
    for view, study in zip(views, (forked_study, execd_study)):
        assert view["cwd"] == str(study.parent)
        assert view["path_head"] == [str(study.parent), str(conftest.REPO)]  # `-m`: the folder, then PYTHONPATH
        assert view["argv"][1:] == ["run", str(study)]
    for view in views:
        view["cwd"] = view["path_head"][0] = view["argv"][2] = "<folder>"
    assert views[0] == views[1]
    assert views[0]["host"] == "viewhost" and views[0]["marker"] == "on"  # sweep read SWEEP_HOST at its import
    assert views[0]["main"] == ["sweep.__main__", str(conftest.REPO / "sweep" / "__main__.py")]
    # the same study, to the bit, and the same report but for the folder and the clock
    values = [run_cli("status", s, "--json", cwd=s.parent).stdout for s in (forked_study, execd_study)]
    trials = [[(t["number"], t["state"], t["params"], t["value"]) for t in json.loads(v)["trials"]] for v in values]
    assert trials[0] == trials[1] and trials[0][0][1] == "COMPLETE"


@pytest.mark.slow
def test_a_forked_cli_process_is_killed_and_reports_as_an_execd_one(tmp_path: Path, held) -> None:
    study = _study(tmp_path / "killed", trial="held_linear")
    (study.parent / "held_linear.py").write_text(trial_source("linear", MARKERS=True))
    held(study.parent / "hold").write_text("1")
    proc = Running("run", study, cwd=study.parent)
    assert isinstance(proc.proc, zygote.Forked)
    wait_for_file(study.parent / "held", proc=proc)
    assert proc.proc.poll() is None
    os.kill(proc.proc.pid, 0)  # a process of its own, alive
    proc.signal(signal.SIGKILL)
    assert proc.finish() == -signal.SIGKILL
    assert proc.proc.poll() == -signal.SIGKILL
    # and a refusal: exit 2, one line, as from exec
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\nn_trials: -1\n")
    forked = run_cli("run", bad, cwd=tmp_path)
    execd = subprocess.run([sys.executable, "-m", "sweep", "run", str(bad)], cwd=tmp_path, env=cli_env(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (execd.returncode, execd.stdout, execd.stderr)
    assert forked.returncode == 2 and forked.stderr.startswith(f"error: {bad}")


def test_an_environment_read_at_import_is_exec_d_not_forked() -> None:
    server = {"PATH": "/bin", "SWEEP_HOST": "a"}
    assert zygote.needs_exec({**server, "SWEEP_HOST": "b", "AWS_ENDPOINT_URL": "x"}, server) is None
    assert zygote.needs_exec({**server, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, server) == "XLA_FLAGS"
    assert zygote.needs_exec({**server, "JAX_PLATFORMS": "cpu"}, {**server, "JAX_PLATFORMS": "cuda"}) == "JAX_PLATFORMS"
    assert zygote.needs_exec({"PATH": "/bin"}, {**server, "PYTHONHASHSEED": "0"}) == "PYTHONHASHSEED"
