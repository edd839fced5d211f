"""Trial modules that misbehave: print, call sys.exit or os._exit, hang in data(), leave threads,
return NaN or a metric of the wrong shape, import slowly. Each is that trial's error (FAIL after its
retries), or exit 2 before anything is created where the checks before a run meet it; the study
goes on and the workers stay healthy."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import TRIAL_SOURCE, messages, run, run_cli, study_of
from sweep.errors import ConfigError
from sweep.run import preflight
from sweep.study import config as config_lib
from sweep.trial import guard

# What each mode does, and where: the trial runs normally for "ok".
MODES = {
    "print_data": ("data", 'print("PRINTED-BY-DATA")'),
    "print_loss": ("loss", 'print("PRINTED-BY-LOSS")'),
    "sysexit_data": ("data", "sys.exit(3)"),
    "osexit_data": ("data", "os._exit(3)"),
    "sysexit_loss": ("loss", "sys.exit(3)"),
    "osexit_loss": ("loss", "os._exit(3)"),
    "hang_data": ("data", "time.sleep(20)"),
    "thread_init": ("init", 'threading.Thread(target=time.sleep, args=(600,), name="leaky").start()'),
    "nan_loss": ("loss", "return jnp.nan * jnp.mean(batch[0])"),
    "shape_eval": ("evaluate", 'return {"val_loss": jnp.ones(3), "val_mae": jnp.zeros(())}'),
}


def misbehaving_source(import_seconds: float = 0.0, modes: dict[str, tuple[str, str]] = MODES) -> str:
    """The tiny linear trial of test_api, with a `mode` hyperparameter that picks a misbehaviour."""
    source = TRIAL_SOURCE.replace('HYPERPARAMETERS = {"learning_rate": 0.05}',
                                  'HYPERPARAMETERS = {"learning_rate": 0.05, "mode": "ok"}')
    for mode, (function, statement) in modes.items():
        head = source.index(f"def {function}(hp")
        body = source.index("\n", head) + 1
        source = source[:body] + f'    if hp["mode"] == "{mode}":\n        {statement}\n' + source[body:]
    prelude = textwrap.dedent(f"""
        import os, sys, threading, time
        print("PRINTED-AT-IMPORT")
        LEFT = threading.Event()  # what a thread left running in-process waits for (the test sets it)
        time.sleep({import_seconds})  # a slow import (a big framework, a dataset index)
    """)
    return prelude + source


def write_study(root: Path, trial: str, **override: Any) -> Path:
    (root / f"{trial}.py").write_text(misbehaving_source(**override.pop("source", {})))
    data = {"name": "mis", "trial": trial, "workdir": str(root / "runs"), "n_trials": 1,
            "objective": {"metric": "val_loss"}, "sampler": {"type": "grid", "seed": 0}, "search_space": {},
            "train": {"steps": 20, "eval_every": 10}, "checkpoint": {"every_steps": 10},
            "data_timeout_seconds": 2}
    data.update(override)
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("mode, message", [
    ("sysexit_data", "trial: {trial}.data raised TrialExit: the trial's code called sys.exit(3)"),
    ("osexit_data", "trial: {trial}.data raised TrialExit: the trial's code called os._exit(3) (in {trial}.py)"),
    ("sysexit_loss", "trial: {trial}.loss raised TrialExit: the trial's code called sys.exit(3)"),
    ("osexit_loss", "trial: {trial}.loss raised TrialExit: the trial's code called os._exit(3) (in {trial}.py)"),
    ("hang_data", "trial: {trial}.data() did not return within 2 s (data_timeout_seconds)"),
    ("shape_eval", "trial: {trial}.evaluate must return a scalar for metric 'val_loss', got shape (3,)"),
])
def test_the_checks_before_a_run_turn_a_misbehaviour_into_a_study_error(tmp_path, monkeypatch, capsys, mode, message):
    monkeypatch.chdir(tmp_path)
    trial = f"mis_pre_{mode}"  # a module name of its own: modules are imported once per process
    config = config_lib.load(write_study(tmp_path, trial, fixed={"mode": mode}))
    with pytest.raises(ConfigError) as err:
        preflight.check(config)  # os._exit here would end pytest itself
    assert str(err.value).startswith(f"{tmp_path / 'study.yaml'}: {message.format(trial=trial)}"), err.value
    assert "\n" not in str(err.value) and not (tmp_path / "runs").exists()
    assert capsys.readouterr().out == ""  # the import's print went to stderr


def test_an_exit_while_importing_the_trial_module_is_a_study_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_study(tmp_path, "mis_import_exit")
    (tmp_path / "mis_import_exit.py").write_text('print("PRINTED-AT-IMPORT")\nimport sys\nsys.exit(4)\n')
    with pytest.raises(ConfigError) as err:
        config_lib.load(path)
    assert str(err.value) == (f"{path}: trial: importing the module raised TrialExit: the trial's code called "
                              "sys.exit(4), got 'mis_import_exit'")
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_misbehaving_trials_fail_alone_and_the_study_goes_on(tmp_path):
    modes = ["ok", *MODES]
    study = write_study(tmp_path, "mis_run", n_trials=len(modes), max_retries=1, source={"import_seconds": 2},
                        search_space={"mode": {"type": "categorical", "choices": modes}})
    result = run_cli("run", study, "--n-jobs", "2", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "PRINTED" not in result.stdout and "PRINTED-BY-DATA" in result.stderr  # stdout is the summary's
    trials = {t.params["mode"]: t for t in study_of(study).trials}
    assert sorted(trials) == sorted(modes)
    failed = {mode: t.user_attrs["error"] for mode, t in trials.items() if t.state.name == "FAIL"}
    assert failed.keys() == {"sysexit_data", "osexit_data", "sysexit_loss", "osexit_loss", "hang_data", "nan_loss",
                             "shape_eval"}
    assert failed["sysexit_loss"] == "TrialExit: the trial's code called sys.exit(3)"
    assert failed["osexit_data"] == "TrialExit: the trial's code called os._exit(3) (in mis_run.py)"
    assert failed["hang_data"].startswith("DataTimeout: mis_run.data() did not return within 2 s")
    assert "evaluate must return a scalar for metric 'val_loss', got shape (3,)" in failed["shape_eval"]
    assert "NonFiniteMetric" in failed["nan_loss"]
    # Retried once (max_retries: 1), except NaN, which is deterministic.
    assert {m: trials[m].user_attrs["failures"] for m in failed} == {m: 1 if m == "nan_loss" else 2 for m in failed}
    assert all(trials[m].state.name == "COMPLETE" for m in ("ok", "print_data", "print_loss", "thread_init"))
    assert "its code left 1 thread running (leaky)" in result.stderr
    status = run_cli("status", study, "--json", cwd=tmp_path)
    assert status.returncode == 0 and len(json.loads(status.stdout)["trials"]) == len(modes)  # no print in it


def _in_process_study(root: Path, trial: str, **override: Any) -> dict[str, Any]:
    """The misbehaving trial's study as a dict for conftest.run, with the module written under `trial`."""
    path = write_study(root, trial, **override)
    return {**yaml.safe_load(path.read_text()), "workdir": str(root / "runs")}


def test_fifty_trials_with_checkpoint_saves_leave_no_thread_warning(tmp_path, monkeypatch, sweep_log):
    """The real trial path 50 times in one study (each trial saves twice through Orbax, which ends
    each save's event loop without waiting for its executor thread, `asyncio_0`): no trial is told it
    left a thread running, and none is left."""
    monkeypatch.chdir(tmp_path)
    study = _in_process_study(tmp_path, "mis_fifty", n_trials=50, sampler={"type": "random", "seed": 0},
                              search_space={"mode": {"type": "categorical", "choices": ["ok"]}})
    before = set(threading.enumerate())
    run(study)
    assert [m for m in messages(sweep_log) if "running" in m and "thread" in m] == []
    assert guard.leftover_threads(before) == []
    assert len(study_of(tmp_path / "study.yaml").trials) == 50


def test_a_thread_ending_on_its_own_is_not_left_running_one_that_waits_is():
    """The check waits for new threads that are ending (an executor told to stop, as Orbax's loops
    leave theirs) and names only those still running after SETTLE_SECONDS."""
    before = set(threading.enumerate())
    go, stay = threading.Event(), threading.Event()

    def ending() -> None:
        go.wait()
        time.sleep(0.2)  # still ending when the check looks: the work an executor's thread finishes

    threads = [threading.Thread(target=ending, name="ending"), threading.Thread(target=stay.wait, name="waiting")]
    for thread in threads:
        thread.start()
    go.set()
    try:
        assert [t.name for t in guard.leftover_threads(before, settle=0.5)] == ["waiting"]
        assert not threads[0].is_alive()
    finally:
        stay.set()
        for thread in threads:
            thread.join()


def test_a_trial_that_leaves_a_thread_running_is_told_in_process(tmp_path, monkeypatch, sweep_log):
    monkeypatch.chdir(tmp_path)
    modes = {"thread_wait": ("init", 'threading.Thread(target=LEFT.wait, name="waiting").start()')}
    study = _in_process_study(tmp_path, "mis_left", fixed={"mode": "thread_wait"}, source={"modes": modes})
    try:
        run(study)
    finally:
        sys.modules["mis_left"].LEFT.set()
    assert [m for m in messages(sweep_log) if "thread" in m] == [
        "trial 0: its code left 1 thread running (waiting); the run does not wait for them at exit"]


def test_the_checks_before_a_run_skip_a_study_with_nothing_left_to_train(tmp_path, monkeypatch):
    """`run` checks the trial's code (an abstract step) wherever a trial will train, edited code
    included; a study with nothing left to train checks nothing, in `run` or `plan`
    (sweep.run.preflight.needed)."""
    import sweep

    monkeypatch.chdir(tmp_path)
    checked: list[int] = []
    real = preflight._check
    monkeypatch.setattr(preflight, "_check", lambda config: (checked.append(config.study.n_trials), real(config)))
    path = write_study(tmp_path, "mis_once", fixed={"mode": "ok"})

    def run(n_trials: int) -> None:
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**data, "n_trials": n_trials}, sort_keys=False))
        with sweep.open(path) as session:
            session.run(quiet=True, progress=False)

    run(1)
    run(1)  # nothing left to train
    assert checked == [1]
    with sweep.open(path) as session:
        assert not session.plan().has_work and checked == [1]  # `plan` follows the same rule
    run(2)  # one more trial
    trial_file = tmp_path / "mis_once.py"
    trial_file.write_text(trial_file.read_text() + "\n# an edit: other code\n")
    run(3)
    assert checked == [1, 2, 3]
    assert [t.state.name for t in study_of(path).trials] == ["COMPLETE"] * 3
