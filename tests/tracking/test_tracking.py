"""Curves where users look (sweep/tracking/curves.py): TensorBoard event files and MLflow runs, one clean
curve per trial across a kill -9 and a resume; the `logging` key's rules."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from conftest import gated_trial, Running, checkpoint_dir, kill9, run_cli, study_of
from sweep.__main__ import main
from sweep.errors import ConfigError
from sweep.store.record import MLFLOW_RUN_ID
from sweep.study import config as config_lib
from sweep.study import fingerprint

# One trial, one compiled shape (hidden fixed): the processes' start is most of these tests' time.
SMALL = {"n_trials": 1, "train": {"steps": 300, "eval_every": 50}, "pruner": {"type": "none"},
         "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
         "fixed": {"batch_size": 32, "hidden": 16}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_mlflow(root: Path) -> tuple[subprocess.Popen, str]:
    """A real `mlflow server` on localhost with its SQLite backend under `root`, in a process group
    of its own (it runs uvicorn as a child): (its process, its URL) once healthy."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/m.db",
                             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            # No job runner: its 8 processes (huey consumers) serve no tracking request.
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_mlflow(proc)
                raise AssertionError("mlflow server did not start")
            time.sleep(0.3)


def _stop_mlflow(proc: subprocess.Popen) -> None:
    """Stops the server and its children (SIGTERM to its group; SIGKILL if it lingers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    try:  # a child that outlived its parent
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` (its start takes ~10-20 s: one per module)."""
    pytest.importorskip("mlflow")
    proc, url = _start_mlflow(tmp_path_factory.mktemp("mlflow"))
    yield url
    _stop_mlflow(proc)


def _scalars(run: Path) -> tuple[dict[str, list[tuple[int, float]]], Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, acc


# Two trials of cheap steps (~35 us each): a trial trains for a second or more after its compile,
# while the writers' thread (mlflow's import, a few requests to a fresh server) catches up with it.
# Four evaluations and four saves per trial (the one trial of 300 steps before had six and three).
LONG = {**SMALL, "n_trials": 2, "train": {"steps": 40000, "eval_every": 10000},
        "checkpoint": {"every_steps": 10000}}
STEPS = list(range(10000, 40001, 10000))
TAGS = ("val_loss", "val_accuracy", "train_loss")  # the digits trial's METRICS and the training loss


def _trial_runs(client: Any, study: str = "t") -> dict[int, Any]:
    """number -> the MLflow run of each trial of `study` on the server (tagged sweep.number)."""
    experiment = client.get_experiment_by_name(study)
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id], "tags.`sweep.role` = 'trial'")
    return {int(r.data.tags["sweep.number"]): r for r in runs}


@pytest.mark.slow
def test_curves_after_kill9_hold_each_evaluation_once(write_study, mlflow_server, held):
    """Two trials, trial 0 killed once its MLflow run is recorded and a checkpoint is committed,
    then resumed: each trial is one TensorBoard run and one MLflow run, nested under the study's;
    every metric's curve (the training loss too) is the study's storage step for step, once each;
    trial 0 went on in the run it started in."""
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.plugins.hparams import plugin_data_pb2

    from sweep.store.record import history

    # The digits MLP held at its 2nd evaluation (step 20000, after the save at 10000) while `hold`
    # exists (tests/trials/gated.py): trial 0 cannot finish before the writers' thread has recorded
    # its MLflow run, however loaded the machine (it once did, in 3 s, under two busy processes).
    study = write_study(trial="gated_digits", **LONG, logging={"tensorboard": True, "mlflow": mlflow_server})
    gated_trial(study.parent, 2, name="gated_digits")
    hold = held(study.parent / "hold")
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    deadline = time.monotonic() + 300
    while True:  # mid-trial, once the trial's MLflow run is recorded and a checkpoint committed
        trial = study_of(study).trials[0]
        assert trial.state.name == "RUNNING", f"trial 0 ended before its MLflow run was recorded:\n{proc.stderr}"
        if trial.user_attrs.get(MLFLOW_RUN_ID) and any(p.name.isdigit() for p in checkpoint_dir(study, 0).glob("*")):
            break
        assert time.monotonic() < deadline, proc.stderr
        time.sleep(0.02)
    kill9(proc)
    hold.unlink()
    killed = study_of(study).trials
    assert len(killed) == 1 and killed[0].state.name == "RUNNING", "killed in trial 0"
    run_id = killed[0].user_attrs[MLFLOW_RUN_ID]
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "resumed from step" in result.stderr and "failed twice" not in result.stderr

    trials = sorted(study_of(study).trials, key=lambda t: t.number)
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert trials[0].user_attrs["resumed_from"] and "resumed_from" not in trials[1].user_attrs
    stored = {t.number: dict(sorted(history(t).items())) for t in trials}  # step -> every metric, as stored
    for t in trials:
        assert list(stored[t.number]) == STEPS == sorted(t.intermediate_values)
        assert all(set(m) == set(TAGS) for m in stored[t.number].values())
        assert [m["val_loss"] for m in stored[t.number].values()] == [t.intermediate_values[s] for s in STEPS]
    workdir = Path(yaml.safe_load(study.read_text())["workdir"])
    for t in trials:
        run = workdir / "tensorboard" / f"trial_{t.number:04d}"
        assert len(list(run.glob("*tfevents*"))) == 1  # trial 0: the lost segment's file was rewritten and removed
        scalars, acc = _scalars(run)
        assert set(TAGS) <= set(scalars)
        for tag in TAGS:  # each step once, increasing; scalars are float32 in the event protocol, Optuna keeps float64
            assert scalars[tag] == [(s, float(np.float32(m[tag]))) for s, m in stored[t.number].items()], tag
        hparams = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
        assert set(start.session_start_info.hparams) == {"learning_rate", "hidden", "batch_size"}
        experiment = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
        assert {m.name.tag for m in experiment.metric_infos} >= {"val_loss", "train_loss"}
        saved = [e.step for e in acc.Tensors("checkpoints/text_summary")]  # the checkpoint steps, as text
        resumed = t.user_attrs.get("resumed_from", ())
        assert saved == sorted(set(saved)) and {*resumed, STEPS[-1]} <= set(saved) <= set(STEPS)

    client = MlflowClient(mlflow_server)
    assert trials[0].user_attrs[MLFLOW_RUN_ID] == run_id  # the resumed trial went on in its own run
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    mine = _trial_runs(client)
    assert len(runs) == 3 and sorted(mine) == [0, 1]  # the study's run and one run per trial, nested under it
    assert mine[0].info.run_id == run_id
    parent = [r for r in runs if r.data.tags.get("sweep.role") == "study"]
    assert len(parent) == 1
    for t in trials:
        trial_run = mine[t.number].info.run_id
        assert t.user_attrs.get(MLFLOW_RUN_ID, trial_run) == trial_run  # recorded where the trial was running still
        got = client.get_run(trial_run)
        assert got.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
        assert got.data.tags["sweep.state"] == "COMPLETE" and got.info.status == "FINISHED"
        assert got.data.tags["sweep.best_step"] == str(t.user_attrs["best_step"])
        assert got.data.params["learning_rate"] == str(t.params["learning_rate"])
        for tag in TAGS:  # each step once, the stored values exactly (MLflow keeps float64)
            logged = sorted((m.step, m.value) for m in client.get_metric_history(trial_run, tag))
            assert logged == [(s, m[tag]) for s, m in stored[t.number].items()], (t.number, tag)
        # The best checkpoint's export is the run's artifact, as `sweep export` writes it.
        assert got.data.tags["sweep.export"] == str(t.user_attrs["best_step"])
        folder = f"export/trial_{t.number:04d}"
        files = {a.path for a in client.list_artifacts(trial_run, folder)}
        assert {f"{folder}/meta.json", f"{folder}/params.safetensors"} <= files
        meta = json.loads(Path(client.download_artifacts(trial_run, f"{folder}/meta.json",
                                                         str(study.parent))).read_text())
        assert meta["number"] == t.number and meta["best_step"] == t.user_attrs["best_step"]


@pytest.mark.slow
def test_mlflow_server_stopped_during_a_run_the_study_finishes_with_one_warning(write_study, tmp_path, held):
    """A real server, stopped once trial 0's run exists on it and before the trials are done: the
    run exits 0 with one warning about the server, and the study's storage holds every evaluation
    of every trial."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from sweep.store.record import history

    server, url = _start_mlflow(tmp_path / "mlflow")
    try:
        # Trial 0 is the digits MLP held at its 2nd evaluation while `hold` exists (tests/trials/
        # gated.py): the study cannot finish before the server is stopped, however loaded the
        # machine (on a CI machine both trials once completed before the test saw trial 0's run).
        study = write_study(trial="gated_digits", **LONG, logging={"mlflow": url})
        gated_trial(study.parent, 2, name="gated_digits")
        hold = held(study.parent / "hold")
        proc = Running("run", study, cwd=study.parent)
        client, deadline = MlflowClient(url), time.monotonic() + 300
        while 0 not in _trial_runs(client):  # trial 0's run exists on the server: its writer is logging
            assert proc.proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
    finally:
        _stop_mlflow(server)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=1)  # stopped: nothing listens there
    assert [t.state.name for t in study_of(study).trials] == ["RUNNING"], "stopped while trial 0 is held"
    hold.unlink()  # the trials go on, with the server away
    assert proc.finish() == 0, proc.stderr
    said = [line for line in proc.lines if "mlflow" in line or "urllib3" in line]
    assert len(said) == 1 and "failed twice" in said[0] and "skipped" in said[0], proc.stderr
    trials = sorted(study_of(study).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    for t in trials:  # nothing lost: every evaluation, every metric and the training loss
        assert sorted(t.intermediate_values) == STEPS and sorted(history(t)) == STEPS
        assert all(set(m) == set(TAGS) for m in history(t).values())


@pytest.mark.slow
def test_mlflow_server_away_the_study_finishes_with_one_warning(write_study):
    pytest.importorskip("mlflow")
    study = write_study(**{**SMALL, "n_trials": 2, "train": {"steps": 100, "eval_every": 50}},
                        logging={"mlflow": f"http://127.0.0.1:{_free_port()}"})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "mlflow" in line or "urllib3" in line]
    assert len(said) == 1 and "failed twice" in said[0] and "skipped" in said[0], result.stderr
    trials = study_of(study).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all(len(t.intermediate_values) == 2 for t in trials)


@pytest.mark.parametrize("key,module,extra", [("tensorboard", "tensorboardX", "tensorboard"),
                                               ("mlflow", "mlflow", "mlflow")])
def test_logging_without_its_package_exits_2_naming_the_key(write_study, monkeypatch, capsys, key, module, extra):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else find(name, *a))
    study = write_study(logging={key: True if key == "tensorboard" else "http://localhost:5000"})
    assert main(["run", str(study)]) == 2
    err = capsys.readouterr().err
    assert f"logging.{key}: needs the `{module}` package (pip install 'sweep[{extra}]')" in err
    assert "Traceback" not in err and not (study.parent / "runs").exists()


@pytest.mark.parametrize("logging,rule", [({"tensorboard": ""}, "true, false or a folder"),
                                          ({"tensorboard": 3}, "true, false or a folder"),
                                          ({"mlflow": 3}, "string"), ({"wandb": True}, "unknown key")])
def test_logging_bad_values_are_study_file_errors(write_study, logging, rule):
    with pytest.raises(ConfigError, match=rule):
        config_lib.load(write_study(logging=logging))


def test_logging_does_not_change_what_the_trials_mean(write_study):
    plain = config_lib.load(write_study())
    logged = config_lib.load(write_study("b.yaml", logging={"tensorboard": "tb", "mlflow": "http://localhost:5000"}))
    assert fingerprint.meaning(plain) == fingerprint.meaning(logged)
    assert "logging" in fingerprint.STEERING
    assert logged.tensorboard_dir == Path("tb").resolve() and plain.tensorboard_dir is None


def _tb_events(folder: Path) -> list[tuple[str, int, Any]]:
    """(tag, step, value) of every scalar and text event of a run, in file order, wall times aside."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for path in sorted(folder.glob("*tfevents*")):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                out.append((v.tag, event.step, v.simple_value if v.HasField("simple_value") else bytes(v.tensor.string_val[0])
                            if v.tensor.string_val else v.metadata.plugin_data.plugin_name))
    return out


def test_tensorboard_run_resumed_after_a_kill_equals_an_uninterrupted_one(tmp_path):
    """In-process: the writer's rewrite on a (re)start; a kill leaves a half-written record and
    evaluations past the checkpoint that the resumed run computes again."""
    pytest.importorskip("tensorboard")
    from sweep.tracking.events import TrialStart
    from sweep.tracking.tensorboard_runs import TensorBoardWriter, run_dir

    evals = {s: {"val_loss": 1.0 / s, "train_loss": 2.0 / s} for s in range(50, 301, 50)}

    def start(step: int, saved: tuple[int, ...] = ()) -> TrialStart:
        return TrialStart(0, step, saved, {"lr": 0.1, "act": "relu"}, ("val_loss", "train_loss"),
                          {s: m for s, m in evals.items() if s <= 250}, {}, lambda k, v: None)

    def train(writer: TensorBoardWriter, begin: int, end: int) -> None:
        for s in range(begin + 50, end + 1, 50):
            writer.evaluation(0, s, evals[s])
            if s % 100 == 0:
                writer.checkpoint(0, s)

    plain = TensorBoardWriter(tmp_path / "plain")
    plain.start(start(0))
    train(plain, 0, 300)
    plain.end(0, "COMPLETE", 100)

    killed = TensorBoardWriter(tmp_path / "killed")
    killed.start(start(0))
    train(killed, 0, 250)  # checkpoint at 200; evaluated up to 250 when the kill came
    folder = run_dir(tmp_path / "killed", 0)
    with open(next(folder.glob("*tfevents*")), "ab") as fh:
        fh.write(b"\x40\x00\x00\x00\x00\x00\x00\x00half")  # a record the kill cut short
    resumed = TensorBoardWriter(tmp_path / "killed")
    resumed.start(start(200, saved=(200,)))  # step 100 removed by retention: its note comes from the old file
    train(resumed, 200, 300)
    resumed.end(0, "COMPLETE", 100)

    assert len(list(folder.glob("*tfevents*"))) == 1
    assert _tb_events(folder) == _tb_events(run_dir(tmp_path / "plain", 0))
    assert [s for t, s, _ in _tb_events(folder) if t == "val_loss"] == list(range(50, 301, 50))


def test_tracker_a_failing_writer_is_skipped_with_one_warning_until_the_trial_starts_again(monkeypatch, caplog):
    from sweep.tracking import curves as tracking

    monkeypatch.setattr(tracking, "RETRY_S", 0.0)
    seen: list[tuple[str, int]] = []

    class Flaky:  # away for the steps before 200
        def start(self, trial):
            seen.append(("start", trial))

        def evaluation(self, number, step, metrics):
            seen.append(("evaluation", step))
            if step < 200:
                raise ConnectionError("server away")

        def checkpoint(self, number, step): ...

        def end(self, number, state, best_step): ...

        def close(self): ...

    tracker = tracking.Tracker([("flaky", Flaky)])
    for trial in (0, 1):
        tracker.put("start", trial, trial)
        tracker.put("evaluation", trial, trial, 50, {})
        tracker.put("evaluation", trial, trial, 100, {})  # skipped: trial's writer failed twice
    tracker.put("start", 1, 1)  # the trial starts again (a resume): its events go out again
    tracker.put("evaluation", 1, 1, 200, {})
    assert tracker.close(30)
    tried_twice = [("evaluation", 50)] * 2  # then the trial's step 100 is not tried
    assert seen == [("start", 0), *tried_twice, ("start", 1), *tried_twice, ("start", 1), ("evaluation", 200)]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "flaky: trial 0: evaluation failed twice (ConnectionError: server away)" in \
        warnings[0].getMessage()


def test_tracker_sends_the_evaluations_queued_meanwhile_in_one_call_in_order(monkeypatch):
    """A writer with `evaluations` gets the evaluations queued while it waited (PACE_S) in one
    call (one MLflow request, one TensorBoard flush: issue 32's overhead was a request per
    evaluation), every step once, in order; a checkpoint note (it names its step) comes after the
    batch, a start or an end where it came."""
    import threading

    from sweep.tracking import curves as tracking

    monkeypatch.setattr(tracking, "PACE_S", 0.3)
    seen: list[tuple] = []
    first = threading.Event()

    class Batching:
        def start(self, trial):
            seen.append(("start", trial))

        def evaluation(self, number, step, metrics):
            raise AssertionError("a writer with evaluations gets them batched")

        def evaluations(self, number, rows):
            seen.append(("evaluations", number, [step for step, _ in rows]))
            first.set()

        def checkpoint(self, number, step):
            seen.append(("checkpoint", number, step))

        def end(self, number, state, best_step):
            seen.append(("end", number, state))

        def close(self): ...

    tracker = tracking.Tracker([("batching", Batching)])
    tracker.put("start", 0, 0)
    tracker.put("evaluation", 0, 0, 10, {"val_loss": 1.0})
    assert first.wait(10)  # the first goes out at once; the next ones wait for the pace
    for step in (20, 30, 40):
        tracker.put("evaluation", 0, 0, step, {"val_loss": 1.0})
    tracker.put("checkpoint", 0, 0, 40)
    tracker.put("evaluation", 0, 0, 50, {"val_loss": 1.0})
    tracker.put("end", 0, 0, "COMPLETE", 50)
    assert tracker.close(30)
    # the checkpoint note (of step 40) does not split the batch: it comes after it
    assert seen == [("start", 0), ("evaluations", 0, [10]), ("evaluations", 0, [20, 30, 40, 50]), ("checkpoint", 0, 40),
                    ("end", 0, "COMPLETE")]


def test_tracker_waits_for_its_writers_to_be_made_at_most_start_s(monkeypatch, write_study):
    """A run makes its writers (mlflow's import: seconds) before its first trial, so the import
    does not compete with that trial's compile; a writer that takes longer than START_S to make is
    left starting in the background."""
    import time

    from sweep.study import config as config_lib
    from sweep.tracking import curves as tracking

    config = config_lib.load(write_study())
    made: list[float] = []

    def slow(seconds: float):
        def make():
            time.sleep(seconds)
            made.append(time.monotonic())

            class Nothing:
                def close(self): ...
            return Nothing()
        return make

    monkeypatch.setattr(tracking, "writers", lambda config: [("slow", slow(0.5))])
    t0 = time.monotonic()
    tracker = tracking.Tracker.of(config)
    tracker.wait_made()
    assert made and made[0] <= time.monotonic() and time.monotonic() - t0 >= 0.5  # waited for it
    assert tracker.close(10)
    made.clear()
    monkeypatch.setattr(tracking, "START_S", 0.2)
    monkeypatch.setattr(tracking, "writers", lambda config: [("slower", slow(2.0))])
    t0 = time.monotonic()
    tracker = tracking.Tracker.of(config)
    tracker.wait_made()
    assert time.monotonic() - t0 < 1.5 and not made  # not waited for beyond START_S
    assert tracker.close(10) and made


def _notes(workdir: Path, number: int) -> list[tuple[int, str]]:
    """(step, text) of a trial's checkpoint notes, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(workdir / "tensorboard" / f"trial_{number:04d}"), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("checkpoints/text_summary")]


def test_checkpoint_notes_are_every_save_also_those_retention_removed_and_across_a_resume(here):
    """Saved every 20 steps, keeping the last 2: the notes are each of the 10 saves, in step order,
    uninterrupted and after a stop at step 110 and a resume from step 100 (the notes the first
    run wrote are kept, not only those of the steps still on disk)."""
    pytest.importorskip("tensorboard")
    from conftest import make_study, run, run_killed, saved_steps, trials

    override = {"n_trials": 1, "train": {"steps": 200, "eval_every": 10, "seed": 0},
                "checkpoint": {"every_steps": 20, "keep_last": 2}, "logging": {"tensorboard": True}}
    saves = [(s, f"step {s} saved") for s in range(20, 201, 20)]
    plain = make_study(here / "plain", **override)
    run(plain)
    assert _notes(Path(plain["workdir"]), 0) == saves
    assert saved_steps(checkpoint_dir(plain, 0)) == [180, 200]  # the others' notes stay: saves that happened

    resumed = make_study(here / "resumed", **override)
    run_killed(resumed, 0, 110)
    assert saved_steps(checkpoint_dir(resumed, 0)) == [80, 100]
    run(resumed)
    assert trials(resumed)[0].user_attrs["resumed_from"] == [100]
    assert _notes(Path(resumed["workdir"]), 0) == saves
