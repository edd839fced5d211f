"""Several objectives (a Pareto front in status and export, kill -9 and resume, what is refused)
and warm starts from another study (docs/search.md). Through the real CLI; a tiny trial of two
competing metrics (tests/trials/tiny_objectives.py) for orchestration, the digits trial for the kill."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

import sweep
from conftest import BASE_STUDY, gated_trial, kill_mid_trial, cli_here, run_cli, study_of
from sweep.commands.status import table
from sweep.errors import ConfigError
from sweep.study import config as config_lib

TWO = [{"metric": "val_loss", "direction": "minimize"}, {"metric": "n_params", "direction": "minimize"}]


def tiny_study(folder: Path, file: str = "study.yaml", **override: Any) -> Path:
    """A study file of the tiny trial (copied beside it), two objectives unless overridden."""
    shutil.copy(Path(__file__).resolve().parents[1] / "trials" / "tiny_objectives.py", folder)
    data: dict[str, Any] = {
        "name": Path(file).stem, "trial": "tiny_objectives", "workdir": str(folder / "runs" / Path(file).stem),
        "n_trials": 6, "objectives": TWO, "sampler": {"type": "tpe", "seed": 1, "n_startup_trials": 3},
        "search_space": {"x": {"type": "float", "low": 0.0, "high": 1.0},
                         "hidden": {"type": "int", "low": 1, "high": 64}},
        "train": {"steps": 100, "eval_every": 25}, "checkpoint": {"every_steps": 50},
    }
    data.update(override)
    data = {k: v for k, v in data.items() if v is not None}
    path = folder / file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _record(study_file: Path) -> list[tuple[Any, ...]]:
    """What must be equal between an interrupted and an uninterrupted multi-objective study."""
    return [(t.number, t.state.name, t.params, t.values, t.user_attrs.get("best_step"),
             t.user_attrs.get("metrics"), {k: v for k, v in t.user_attrs.items() if k.startswith("eval:")})
            for t in sorted(study_of(study_file).trials, key=lambda t: t.number)]


@pytest.mark.slow
def test_pareto_front_in_status_and_export_equals_optuna_best_trials(tmp_path, monkeypatch):
    study = tiny_study(tmp_path)
    result = run_cli("run", study, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    optuna_study = study_of(study)
    front = sorted(t.number for t in optuna_study.best_trials)
    assert 0 < len(front) < 6  # the two metrics compete: a front, not every trial
    assert [d.name for d in optuna_study.directions] == ["MINIMIZE", "MINIMIZE"]
    assert all(not t.intermediate_values for t in optuna_study.trials)  # nothing reported per step

    status = json.loads(cli_here("status", study, "--json", cwd=tmp_path).stdout)
    assert status["objectives"] == TWO
    assert sorted(t["number"] for t in status["trials"] if t["pareto"]) == front
    for t, entry in zip(optuna_study.trials, status["trials"]):
        # Each objective at the trial's best step (by the first objective), as Optuna was told.
        assert entry["values"] == {"val_loss": t.values[0], "n_params": t.values[1]}
        assert entry["values"] == {k: entry["metrics"][k] for k in ("val_loss", "n_params")}
    assert f"Pareto front (*): {', '.join(map(str, front))}" in table(status)  # the table of `status`

    exported = cli_here("export", study, "--out", tmp_path / "out", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["objectives"] == TWO
    marked = [e["number"] for e in index["trials"] if e["pareto"]]
    assert sorted(marked) == front and len(index["trials"]) == 6
    assert [e["pareto"] for e in index["trials"]] == [True] * len(front) + [False] * (6 - len(front))  # front first
    assert (tmp_path / "out" / f"trial_{front[0]:04d}" / "params.safetensors").exists()
    from conftest import _conforms
    from sweep.results import ExportEntry, ExportIndex, StudyStatus, TrialStatus

    _conforms(status, StudyStatus, "status.json")  # the types name the keys of several objectives too
    _conforms(index, ExportIndex, "index.json")
    for entry in status["trials"]:
        _conforms(entry, TrialStatus, "status.json trial")
    for entry in index["trials"]:
        _conforms(entry, ExportEntry, "index.json trial")

    # plot: Optuna's Pareto-front figure; each trial's curve is its first objective's evaluations.
    monkeypatch.chdir(tmp_path)
    with sweep.open(study) as session:
        written = {p.relative_to(tmp_path / "plots").as_posix() for p in session.plot(tmp_path / "plots")}
    assert {"pareto_front.html", "pareto_front.png", "curves/trial_0000.png"} <= written

    # `objectives` defines what the trials mean: an edit is refused with the diff, nothing changed.
    tiny_study(tmp_path, objectives=[TWO[0], {**TWO[1], "direction": "maximize"}])
    refused = cli_here("run", study, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "objectives:" in refused.stderr and '"maximize"' in refused.stderr
    assert len(study_of(study).trials) == 6


@pytest.mark.slow
def test_multi_objective_kill_9_then_run_equals_an_uninterrupted_copy(tmp_path, held):
    def digits(folder: Path, **override: str) -> Path:
        folder.mkdir()
        data = {k: v for k, v in BASE_STUDY.items() if k not in ("objective", "pruner")}
        data.update(objectives=[{"metric": "val_loss"}, {"metric": "val_accuracy", "direction": "maximize"}],
                    n_trials=2, workdir=str(folder / "runs"), train={**BASE_STUDY["train"], "steps": 400}, **override)
        path = folder / "study.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # The killed copy's process is held at its 5th evaluation (step 250, after its save at 200):
    # the kill lands mid-trial however fast the machine.
    reference, killed = digits(tmp_path / "reference"), digits(tmp_path / "killed", trial="gated_trial")
    gated_trial(killed.parent, 5)
    assert run_cli("run", reference, cwd=reference.parent).returncode == 0
    kill_mid_trial(killed, 0, 200, held(killed.parent / "hold"))
    result = run_cli("run", killed, cwd=killed.parent)
    assert result.returncode == 0, result.stderr
    assert "trial 0: resumed from step" in result.stderr
    assert _record(killed) == _record(reference)


@pytest.mark.parametrize("override, key, words", [
    ({"objective": {"metric": "val_loss"}}, "objectives", "cannot be combined with objective"),
    ({"objectives": [TWO[0], {"metric": "latency"}]}, "objectives.1.metric", "must be a metric of tiny_objectives"),
    ({"objectives": [TWO[0]]}, "objectives", "must list at least 2 objectives"),
    ({"objectives": [TWO[0], TWO[0]]}, "objectives", "must not repeat a metric"),
    ({"pruner": {"type": "median"}}, "pruner.type", "must be none for a study with several objectives"),
    ({"sampler": {"type": "cmaes"}}, "sampler.type", "takes one objective only"),
    ({"objectives": None}, "objective", "is required"),
    ({"warm_start": {"study": "missing.yaml"}}, "warm_start.study", "must be a study file"),
])
def test_objectives_bad_study_file(tmp_path, monkeypatch, override, key, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "trials"))  # tiny_objectives
    study = tiny_study(tmp_path, **override)
    with pytest.raises(ConfigError, match=f"study.yaml: {key}: {words}"):
        config_lib.load(study)


@pytest.mark.slow
@pytest.mark.parametrize("override, key, words", [
    ({"objective": {"metric": "val_loss"}}, "objectives", "cannot be combined with objective"),
    ({"warm_start": {"study": "never_run.yaml"}}, "warm_start.study", "names study 'never_run', which does not exist"),
])
def test_objectives_bad_input_exit_2(tmp_path, override, key, words):
    tiny_study(tmp_path, "never_run.yaml")
    study = tiny_study(tmp_path, **override)
    result = cli_here("run", study, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"study.yaml: {key}: {words}" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.slow
def test_warm_start_changes_tpe_first_suggestion_without_training(tmp_path, monkeypatch):
    from sweep.store.samplers import RestartProofSampler, build_sampler, suggest_all

    source = tiny_study(tmp_path, "source.yaml", n_trials=4, sampler={"type": "random", "seed": 3})
    assert run_cli("run", source, cwd=tmp_path).returncode == 0
    warm = tiny_study(tmp_path, "warm.yaml", objectives=None, objective=TWO[0], n_trials=1,
                      sampler={"type": "tpe", "seed": 1, "n_startup_trials": 2}, warm_start={"study": "source.yaml"})
    result = run_cli("run", warm, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warm start: 4 trials of study 'source' (source.yaml) added as observations" in result.stderr

    trials = study_of(warm).trials
    observations = [t for t in trials if "warm_start" in t.user_attrs]
    assert len(observations) == 4 and len(trials) == 5  # n_trials 1: the observations do not count
    source_trials = study_of(source).trials
    assert [(t.params, t.value) for t in observations] == [(t.params, t.user_attrs["metrics"]["val_loss"])
                                                           for t in source_trials]
    checkpoints = tmp_path / "runs" / "warm" / "checkpoints"
    assert {p.name.split(".")[0] for p in checkpoints.iterdir()} == {"trial_0004"}  # nothing trained for them

    # TPE's first suggestion: what the observations make it, not the random startup draw that
    # trial number 4 gets without them (the same sampler, reseeded alike, in memory).
    monkeypatch.chdir(tmp_path)  # the study file's paths and its trial module, as the CLI found them
    config = config_lib.load(warm)

    def first_params(history: list[optuna.trial.FrozenTrial]) -> dict[str, Any]:
        study = optuna.create_study(sampler=RestartProofSampler(build_sampler(config), config.study.sampler.seed))
        for t in history:
            study.add_trial(t)
        return suggest_all(config, study.ask())

    fails = [optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL) for _ in range(4)]
    assert trials[4].params == first_params(observations)
    assert trials[4].params != first_params(fails)

    # Exactly once: a re-run with more trials adds no observation again; export leaves them out.
    tiny_study(tmp_path, "warm.yaml", objectives=None, objective=TWO[0], n_trials=2,
               sampler={"type": "tpe", "seed": 1, "n_startup_trials": 2}, warm_start={"study": "source.yaml"})
    assert run_cli("run", warm, cwd=tmp_path).returncode == 0
    trials = study_of(warm).trials
    assert sum("warm_start" in t.user_attrs for t in trials) == 4 and len(trials) == 6
    status = json.loads(cli_here("status", warm, "--json", cwd=tmp_path).stdout)
    assert [t["number"] for t in status["trials"]] == [4, 5] and "2/2 trials finished" in table(status)
    assert cli_here("export", warm, "--out", tmp_path / "out", cwd=tmp_path).returncode == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert sorted(e["number"] for e in index["trials"]) == [4, 5]
