"""The Python API end to end, in-process: `sweep.open(dict or file)` -> run, status, export, load_best.

Also what a study run from Python must leave behind in the process: its signal handlers,
`sys.path`, and each study's compilation cache and progress in their own places.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import sqlite3
import stat
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np
import optuna
import pytest
import yaml

import sweep
from conftest import STEPS, TRIAL_SOURCE, saved_steps, sigterm_at, watch_steps
from conftest import make_study as tiny_study
from sweep.host.signals import StopSignal

TRIAL = "api_linear"
REFERENCE_KEYS = {"number", "state", "params", "value", "best_step", "best_value", "last_step", "checkpoint_dir",
                  "resumes"}


def make_study(root: Path, trial: str = TRIAL, **override: Any) -> dict[str, Any]:
    """conftest's 3-trial tiny study under root, named "api", with its trial module (unmarked) written there."""
    (root / f"{trial}.py").write_text(TRIAL_SOURCE)
    return tiny_study(root, **{"name": "api", "trial": trial, **override})


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def handlers() -> tuple[Any, Any]:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class Finished:
    root: Path
    study: dict[str, Any]
    status: dict[str, Any]  # what run() returned
    export: Path  # its export


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The study run to the end through `sweep.open(dict).run()`, and exported, once for this file."""
    root = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        study = make_study(root)
        with sweep.open(study) as session:
            status = session.run()
            session.export(root / "export")
    return Finished(root, study, status, root / "export")


@pytest.fixture
def grace_timers() -> Iterator[Callable[[], list[threading.Timer]]]:
    """Lists StopSignal's grace-period timers still running; cancels them after the test (each one
    would os._exit this process when it fires)."""

    def alive() -> list[threading.Timer]:
        # A cancelled timer's thread may still be alive a moment (it has yet to wake and see its
        # `finished` event, which cancel() sets): a timer counts until cancelled or fired.
        return [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()
                and not t.finished.is_set()
                and getattr(getattr(t, "function", None), "__func__", None) is StopSignal._expire]

    yield alive
    for timer in alive():
        timer.cancel()




# --- run, status, export, load_best ----------------------------------------------------------------


def test_run_returns_the_documented_status(finished):
    status, workdir = finished.status, Path(finished.study["workdir"])
    assert json.loads(json.dumps(status)) == status
    assert (status["study"], status["storage"], status["n_trials"]) == ("api", f"sqlite:///{workdir}/study.db", 3)
    assert [t["number"] for t in status["trials"]] == [0, 1, 2]
    stored = optuna.load_study(study_name="api", storage=status["storage"]).trials  # Optuna's own storage
    for t, frozen in zip(status["trials"], stored):
        assert REFERENCE_KEYS <= set(t), t
        assert (t["state"], t["resumes"], t["last_step"]) == ("COMPLETE", 0, STEPS)
        assert t["params"] == frozen.params and set(t["params"]) == {"learning_rate"}
        # The value is the best evaluation, reported once per step.
        reports = frozen.intermediate_values
        assert sorted(reports) == [10, 20, 30, 40]
        assert t["value"] == frozen.value == t["best_value"] == reports[t["best_step"]] == min(reports.values())
        assert t["checkpoint_dir"] == str(workdir / "checkpoints" / f"trial_{t['number']:04d}")
        assert {t["best_step"], STEPS} <= set(saved_steps(t["checkpoint_dir"]))


def test_status_reads_what_run_returned(finished):
    with sweep.open(finished.study) as session:
        assert session.status() == finished.status


def test_export_writes_index_meta_and_params_best_first(finished, tmp_path):
    out, status = finished.export, {t["number"]: t for t in finished.status["trials"]}
    index = json.loads((out / "index.json").read_text())
    assert (index["study"], index["metric"], index["direction"]) == ("api", "val_loss", "minimize")
    assert sorted(e["number"] for e in index["trials"]) == [0, 1, 2]
    assert [e["best_value"] for e in index["trials"]] == sorted(t["best_value"] for t in status.values())
    for entry in index["trials"]:
        t = status[entry["number"]]
        assert entry["dir"] == f"trial_{t['number']:04d}"
        assert json.loads((out / entry["dir"] / "meta.json").read_text()) == entry
        assert (entry["best_step"], entry["best_value"], entry["last_step"]) == (
            t["best_step"], t["best_value"], t["last_step"])
        assert entry["hyperparameters"] == t["params"]  # the trial's only hyperparameter is sampled
        params, meta = sweep.load_export(out / entry["dir"])
        assert meta == entry
        assert set(params) == {"w", "b"} and params["w"].shape == (4,)
        # Which model definition the params belong to, and what trained them.
        source = finished.root / f"{TRIAL}.py"
        assert (meta["trial_module"], meta["trial_source_file"]) == (TRIAL, source.name)
        assert meta["trial_source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
        assert {"sweep", "jax", "flax", "optax", "orbax-checkpoint"} <= {k for k, v in meta["versions"].items() if v}
        umask = os.umask(0o022)
        os.umask(umask)
        for file in (out / entry["dir"]).iterdir():  # not mkstemp's private 0600
            assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file
    _, best_meta = sweep.load_export(out)  # the folder: its best trial
    assert best_meta == index["trials"][0]

    again = tmp_path / "again"
    with sweep.open(finished.study) as session:
        assert session.export(again) == index
    assert files(again) == files(out)  # exporting twice gives the same files


def test_load_best_restores_the_best_checkpoint_of_the_best_trial(finished, capfd):
    best_trial = min(finished.status["trials"], key=lambda t: t["best_value"])
    exported, meta = sweep.load_export(finished.export)
    capfd.readouterr()
    with sweep.open(finished.study) as session:
        best = session.load_best()
    assert capfd.readouterr().err == ""  # no library noise (Orbax's read-only notice)
    assert best.number == meta["number"] == best_trial["number"]
    assert (best.step, best.value) == (best_trial["best_step"], best_trial["best_value"])
    assert int(best.state["step"]) == best.step and best.hyperparameters == meta["hyperparameters"]
    assert set(best.params) == set(exported)
    assert all(np.array_equal(best.params[k], exported[k]) for k in exported)
    hp, module = best.hyperparameters, best.trial_module
    metrics = jax.jit(lambda p: module.evaluate(hp, p, module.data(hp)))(best.params)
    # The state the best step's metrics were measured on.
    assert float(metrics["val_loss"]) == pytest.approx(best.value, rel=1e-6)
    assert float(metrics["val_mae"]) == pytest.approx(best_trial["metrics"]["val_mae"], rel=1e-6)


def test_open_a_study_file_is_the_same_study_as_its_dict(finished, monkeypatch):
    monkeypatch.chdir(finished.root)
    path = finished.root / "study.yaml"
    path.write_text(yaml.safe_dump({**finished.study, "workdir": "runs"}))  # relative to the current directory
    with sweep.open(path) as session:
        assert session.status() == finished.status
        assert session.run() == finished.status  # finished: nothing to do
    assert sweep.load_best(path).number == min(finished.status["trials"], key=lambda t: t["best_value"])["number"]


def test_export_keeps_the_shape_of_scalar_params(finished):
    exported, _ = sweep.load_export(finished.export)
    with sweep.open(finished.study) as session:
        best = session.load_best()
    assert np.shape(best.params["b"]) == ()
    assert exported["b"].shape == ()


def test_status_and_export_give_every_declared_metric_at_the_best_step(finished):
    exported = {e["number"]: e for e in json.loads((finished.export / "index.json").read_text())["trials"]}
    for t in finished.status["trials"]:
        assert {"val_loss", "val_mae"} <= set(t["metrics"])  # every declared one (sweep may keep more)
        assert t["metrics"]["val_loss"] == t["best_value"]
        assert exported[t["number"]]["metrics"] == t["metrics"]


# --- what a bad or missing study creates: nothing --------------------------------------------------


def _without_n_trials(study: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in study.items() if k != "n_trials"}


@pytest.mark.parametrize("change, key, rule", [
    (lambda s: {**s, "n_trials": 0}, "n_trials", "must be >= 1, got 0"),
    (lambda s: {**_without_n_trials(s), "n_trails": 3}, "n_trails", "unknown key (did you mean 'n_trials'?)"),
    (lambda s: {**s, "search_space": {"learning_rate": {"type": "float", "low": 0.0, "high": 0.3, "log": True}}},
     "search_space.learning_rate.low", "must be > 0 when log is true, got 0.0"),
    (lambda s: {**s, "trial": "api_no_such_trial"}, "trial", "cannot import module"),
], ids=["n_trials", "typo", "log_low", "trial"])
def test_open_a_bad_study_raises_config_error_naming_the_key_and_creates_nothing(
        tmp_path, monkeypatch, change, key, rule):
    monkeypatch.chdir(tmp_path)
    study = change(make_study(tmp_path))
    before = listing(tmp_path)
    with pytest.raises(sweep.ConfigError) as raised:
        sweep.open(study)
    assert raised.value.key == key and str(raised.value).startswith(f"<dict>: {key}: ")
    assert rule in str(raised.value)
    assert isinstance(raised.value, sweep.SweepError) and isinstance(raised.value, ValueError)
    assert listing(tmp_path) == before and not Path(study["workdir"]).exists()


def test_run_with_a_bad_sampler_argument_raises_config_error_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path, sampler={"type": "tpe", "seed": 0, "n_startup": 2})
    before = listing(tmp_path)
    with sweep.open(study) as session:  # sampler keyword arguments are checked against Optuna at run()
        with pytest.raises(sweep.ConfigError) as raised:
            session.run()
    assert raised.value.key == "sampler.n_startup" and "did you mean 'n_startup_trials'?" in str(raised.value)
    assert listing(tmp_path) == before


def test_reading_a_study_never_run_raises_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path)
    before = listing(tmp_path)
    with sweep.open(study) as session:
        with pytest.raises(sweep.SweepError, match="study 'api' not found"):
            session.status()
        with pytest.raises(sweep.SweepError):
            session.export(tmp_path / "export")
        with pytest.raises(sweep.SweepError):
            session.load_best()
    assert listing(tmp_path) == before and not Path(study["workdir"]).exists()


def test_run_with_a_trial_missing_a_metric_raises_before_anything_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path, "api_no_mae")
    (tmp_path / "api_no_mae.py").write_text(TRIAL_SOURCE.replace('"val_mae": jnp.mean', '"mae": jnp.mean'))
    before = listing(tmp_path)
    with sweep.open(study) as session:
        with pytest.raises(sweep.ConfigError, match=r"api_no_mae.evaluate returns no 'val_mae', a metric its "
                                                    r"METRICS declares \(it returns 'mae', 'val_loss'\)"):
            session.run()
        with pytest.raises(sweep.ConfigError, match="api_no_mae.evaluate returns no 'val_mae'"):
            session.plan()
    assert listing(tmp_path) == before


def test_a_changed_study_is_refused_by_run_and_plan_and_a_steering_change_is_not(finished, monkeypatch):
    monkeypatch.chdir(finished.root)
    changed = {**finished.study, "search_space": {"learning_rate": {"type": "float", "low": 1e-3, "high": 0.2,
                                                                    "log": True}},
               "train": {**finished.study["train"], "seed": 1}}
    db = Path(finished.study["workdir"]) / "study.db"

    def dump() -> str:  # by content: a reader closing SQLite folds its write-ahead log into the file
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return "\n".join(conn.iterdump())

    rows = dump()
    with sweep.open(changed) as session:
        with pytest.raises(sweep.ConfigError) as raised:
            session.run()
        plan = session.plan()
    assert "search_space.learning_rate.high: 0.3 -> 0.2" in str(raised.value)
    assert "train.seed: 0 -> 1" in str(raised.value) and "nothing was created or changed" in str(raised.value)
    assert [key for key, _, _ in plan.refused] == ["search_space.learning_rate.high", "train.seed"]
    assert dump() == rows
    with sweep.open({**finished.study, "n_trials": 4, "checkpoint": {"every_steps": 10}}) as session:
        plan = session.plan()  # steering keys: no refusal; one trial to add
    assert not plan.refused and plan.new == 1 and plan.first_new == 3 and len(plan.finished) == 3


# --- process hygiene -------------------------------------------------------------------------------


def test_run_leaves_signal_handlers_and_sys_path_as_it_found_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def mine(signum: int, frame: Any) -> None:  # a handler of the program that calls sweep
        raise AssertionError("not to be called")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        before, path = handlers(), list(sys.path)
        during: list[Any] = []
        with sweep.open(make_study(tmp_path, "api_hygiene", n_trials=1)) as session:  # imports the module
            assert sys.path == path
            watch_steps(session, lambda n, s: during.append(handlers()))
            session.run()
        assert handlers() == before and sys.path == path
        assert during and during[0][0] is not mine  # run had taken SIGTERM over while it trained
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_two_studies_in_one_process_keep_their_own_compilation_cache_and_progress(tmp_path, monkeypatch):
    def entries(cache: Path) -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}

    caches: list[Path] = []
    seen: list[tuple[str, int, int]] = []  # (the study whose session reported, trial, step) at each window
    for name, trial in (("first", "api_cache_a"), ("second", "api_cache_b")):
        root = tmp_path / name
        root.mkdir()
        monkeypatch.chdir(root)
        study = make_study(root, trial, name=name, n_trials=1)
        with sweep.open(study) as session:
            watch_steps(session, lambda n, s, name=name: seen.append((name, n, s)))
            session.run()
        caches.append(Path(study["workdir"]) / "jax_cache")
        if len(caches) == 1:
            first_cache = entries(caches[0])
            during_first = len(seen)
    assert all(cache.is_dir() and any(cache.iterdir()) for cache in caches)  # each compiled into its own
    assert entries(caches[0]) == first_cache  # the second study wrote nothing into the first one's
    # Each session's progress reports are its own trial's, and the first's watcher heard nothing of the second
    assert {name for name, _, _ in seen[:during_first]} == {"first"} and {name for name, _, _ in seen[during_first:]} == {"second"}
    assert {n for _, n, _ in seen} == {0} and seen[during_first - 1][2] == -1 and seen[-1][2] == -1  # stopped: -1


def test_interrupted_run_restores_signal_handlers_and_leaves_the_trial_resumable(tmp_path, monkeypatch,
                                                                                  grace_timers):
    monkeypatch.chdir(tmp_path)
    before = handlers()
    study = make_study(tmp_path, n_trials=1, checkpoint={"every_steps": 20, "grace_seconds": 600})
    with sweep.open(study) as session:
        sigterm_at(session, 0, 20)
        with pytest.raises(sweep.Interrupted) as raised:
            session.run()
        assert raised.value.exit_code == 143 and handlers() == before
        (trial,) = session.status()["trials"]
        assert (trial["state"], trial["last_step"]) == ("INTERRUPTED", 20)
        assert saved_steps(trial["checkpoint_dir"])[-1] == 20

        (trial,) = session.run()["trials"]
    assert (trial["number"], trial["state"], trial["resumes"], trial["last_step"]) == (0, "COMPLETE", 1, STEPS)
    assert handlers() == before


def test_interrupted_run_leaves_no_grace_timer_behind(tmp_path, monkeypatch, grace_timers):
    monkeypatch.chdir(tmp_path)
    study = make_study(tmp_path, n_trials=1, checkpoint={"every_steps": 20, "grace_seconds": 600})
    with sweep.open(study) as session:
        sigterm_at(session, 0, 20)
        with pytest.raises(sweep.Interrupted):
            session.run()
    assert grace_timers() == []
