"""Search spaces as rich as Optuna's (docs/search.md): enqueued trials (Optuna's WAITING ones and
the file's `enqueue`), sampler arguments a study file cannot give, conditional parameters and the
define-by-run `search_space(trial)` of a trial module. Through the real CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from conftest import BASE_STUDY, kill_mid_trial, merge, cli_here, run_cli, snapshot, study_of

FAST = {"train": {"steps": 200, "eval_every": 50}, "checkpoint": {"every_steps": 50}, "pruner": {"type": "none"}}


def _storage(study_file):
    data = yaml.safe_load(study_file.read_text())
    return f"sqlite:///{data['workdir']}/study.db"


@pytest.mark.slow
def test_trials_enqueued_through_optuna_run_and_count(write_study):
    study = write_study(n_trials=3, **FAST)
    first = run_cli("run", study, cwd=study.parent)
    assert first.returncode == 0, first.stderr
    # What a new user tries: Optuna's own enqueue_trial on the finished study, then run.
    optuna_study = optuna.load_study(study_name="t", storage=_storage(study))
    optuna_study.enqueue_trial({"learning_rate": 0.02, "hidden": 32})
    optuna_study.enqueue_trial({"learning_rate": 0.005, "hidden": 48})
    plan = cli_here("plan", study, cwd=study.parent)
    assert plan.returncode == 0, plan.stderr
    assert "waiting: trials 3-4" in plan.stdout, plan.stdout
    assert plan.stdout.splitlines()[-1] == "run would start 2 new trials"
    second = run_cli("run", study, cwd=study.parent)
    assert second.returncode == 0, second.stderr
    trials = study_of(study).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5
    assert trials[3].params == {"learning_rate": 0.02, "hidden": 32}
    assert trials[4].params == {"learning_rate": 0.005, "hidden": 48}


@pytest.mark.slow
def test_waiting_trials_of_a_new_study_count_toward_n_trials(write_study):
    study = write_study(n_trials=3, **FAST)
    (study.parent / "runs" / "t").mkdir(parents=True)
    optuna_study = optuna.create_study(study_name="t", storage=_storage(study))
    optuna_study.enqueue_trial({"learning_rate": 0.02, "hidden": 32})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    trials = study_of(study).trials
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    assert trials[0].params == {"learning_rate": 0.02, "hidden": 32}


@pytest.mark.parametrize("sampler, key, words", [
    ({"type": "tpe", "constraints_func": "mod:fn"}, "sampler.constraints_func", "a Python object"),
    ({"type": "tpe", "gamma": "lambda n: n"}, "sampler.gamma", "a Python object"),
    ({"type": "cmaes", "independent_sampler": "random"}, "sampler.independent_sampler", "a Python object"),
    ({"type": "tpe", "n_startup_trials": "10"}, "sampler.n_startup_trials", "int here"),
    ({"type": "tpe", "multivariate": 1}, "sampler.multivariate", "bool or None here"),
])
def test_sampler_arguments_a_study_file_cannot_give_are_config_errors(tmp_path, monkeypatch, sampler, key, words):
    from sweep.errors import ConfigError
    from sweep.store.samplers import check_config
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    config = config_lib.from_dict(merge(BASE_STUDY, {"sampler": sampler}), origin="s.yaml")
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert err.value.key == key and words in str(err.value), str(err.value)


@pytest.mark.slow
def test_a_string_for_a_function_exits_2_before_anything_is_created(write_study):
    study = write_study(sampler={"type": "tpe", "constraints_func": "mod:fn"}, **FAST)
    for command in ("run", "plan"):
        result = cli_here(command, study, cwd=study.parent)
        out = result.stderr + result.stdout
        assert result.returncode == 2, (command, out)
        assert "sampler.constraints_func" in out and "Traceback" not in out, out
    assert not (study.parent / "runs").exists()  # nothing created


@pytest.mark.slow
def test_pruner_argument_of_the_wrong_type_exits_2(write_study):
    study = write_study(**{**FAST, "pruner": {"type": "median", "n_warmup_steps": 1.5}})
    result = cli_here("run", study, cwd=study.parent)
    assert result.returncode == 2 and "pruner.n_warmup_steps" in result.stderr, result.stderr


@pytest.mark.slow
def test_a_stored_argument_that_never_worked_may_be_dropped(write_study):
    """The way out for a study an older release started with `constraints_func: "mod:fn"`."""
    from sweep.study import fingerprint

    study = write_study(n_trials=1, **FAST)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    optuna_study = optuna.load_study(study_name="t", storage=_storage(study))
    stored = optuna_study.user_attrs[fingerprint.STUDY_ATTR]
    optuna_study.set_user_attr(fingerprint.STUDY_ATTR, {**stored, "sampler.constraints_func": "mod:fn"})
    data = yaml.safe_load(study.read_text())
    data["n_trials"] = 2
    study.write_text(yaml.safe_dump(data))
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    # A usable argument stored and dropped is still a refused edit.
    optuna_study.set_user_attr(fingerprint.STUDY_ATTR, {**stored, "sampler.n_ei_candidates": 24})
    result = cli_here("plan", study, cwd=study.parent)
    assert result.returncode == 2 and "sampler.n_ei_candidates: 24 -> (absent)" in result.stderr + result.stdout


# --- conditional parameters and the file's enqueue --------------------------------------------

TWO_OPTIMIZERS = {
    "trial": "two_optimizers",
    "n_trials": 5,
    "sampler": {"type": "tpe", "seed": 3, "n_startup_trials": 3},
    "search_space": {
        "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
        "learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True},
        "momentum": {"type": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
        "b1": {"type": "float", "low": 0.8, "high": 0.95, "when": {"optimizer": ["adam"]}},
    },
    "enqueue": [{"optimizer": "sgd", "learning_rate": 0.02, "momentum": 0.9}, {"optimizer": "adam"}],
    "fixed": {},
    **FAST,
}
ACTIVE = {"sgd": {"optimizer", "learning_rate", "momentum"}, "adam": {"optimizer", "learning_rate", "b1"}}


def _beside(tmp_path, name, **override):
    """A study folder holding the study file and the two-optimizer trial module (a user's own)."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "trials" / "two_optimizers.py", folder)
    data = merge(BASE_STUDY, {**TWO_OPTIMIZERS, **override})
    data["workdir"] = str(folder / "runs")
    study = folder / "study.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    return study


@pytest.mark.slow
def test_conditional_space_killed_and_resumed_is_bit_identical_and_enqueued_trials_run_once(tmp_path):
    clean = _beside(tmp_path, "clean")
    assert run_cli("run", clean, cwd=clean.parent).returncode == 0
    killed = _beside(tmp_path, "killed")
    plan = run_cli("plan", killed, cwd=killed.parent)
    assert "momentum is sampled only when optimizer in [\"sgd\"]" in plan.stdout, plan.stdout
    assert 'enqueue: {"optimizer": "adam"}' in plan.stdout, plan.stdout
    kill_mid_trial(killed, 1, 100)  # the second enqueued trial
    kill_mid_trial(killed, 3, 100)  # a sampled one, after the startup trials
    result = run_cli("run", killed, cwd=killed.parent)
    assert result.returncode == 0, result.stderr
    assert snapshot(killed) == snapshot(clean)
    trials = study_of(killed).trials
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" for t in trials)
    assert [t.user_attrs.get("enqueue_index") for t in trials] == [0, 1, None, None, None]
    assert trials[0].params == {"optimizer": "sgd", "learning_rate": 0.02, "momentum": 0.9}
    assert trials[1].params["optimizer"] == "adam"
    for t in trials:
        assert set(t.params) == ACTIVE[t.params["optimizer"]], t.params


def _space(**params):
    base = TWO_OPTIMIZERS["search_space"]
    return {**base, **params}


@pytest.mark.parametrize("override, key, words", [
    ({"search_space": _space(momentum={"type": "float", "low": 0.5, "high": 0.99, "when": {"optimiser": "sgd"}})},
     "search_space.momentum.when.optimiser", "must name a parameter of search_space"),
    ({"search_space": _space(momentum={"type": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "rmsprop"}})},
     "search_space.momentum.when.optimizer", "can never hold: 'rmsprop'"),
    ({"search_space": _space(momentum={"type": "float", "low": 0.5, "high": 0.99, "when": {"learning_rate": 0.1}})},
     "search_space.momentum.when.learning_rate", "continuous float range"),
    ({"search_space": _space(optimizer={"type": "categorical", "choices": ["sgd", "adam"], "when": {"b1": 0.9}},
                             b1={"type": "float", "values": [0.9, 0.95], "when": {"optimizer": "adam"}})},
     "search_space.optimizer.when", "must not form a cycle"),
    ({"sampler": {"type": "grid"}, "search_space": {
        "optimizer": {"type": "categorical", "choices": ["sgd", "adam"]},
        "momentum": {"type": "float", "values": [0.5, 0.9], "when": {"optimizer": "sgd"}}}, "enqueue": []},
     "search_space.momentum.when", "not grid"),
    ({"enqueue": [{"optimizer": "sgd", "learning_rate": 0.5}]}, "enqueue.0.learning_rate", "outside the search space"),
    ({"enqueue": [{"optimizer": "adam"}, {"optimiser": "sgd"}]}, "enqueue.1.optimiser", "must name a parameter"),
    ({"enqueue": [{"optimizer": "adam", "momentum": 0.9}]}, "enqueue.0.momentum", "not active for this entry"),
    ({"enqueue": [{"optimizer": "sgd", "momentum": 0.9, "learning_rate": True}]}, "enqueue.0.learning_rate",
     "outside the search space"),
])
def test_bad_conditions_and_enqueue_entries_are_config_errors(tmp_path, monkeypatch, override, key, words):
    from sweep.errors import ConfigError
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "trials"))  # two_optimizers, as if beside the file
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(merge(BASE_STUDY, {**TWO_OPTIMIZERS, **override}), origin="s.yaml")
    assert err.value.key == key and words in str(err.value), str(err.value)


@pytest.mark.slow
def test_a_bad_condition_exits_2_through_the_cli(tmp_path):
    study = _beside(tmp_path, "bad", search_space=_space(
        b1={"type": "float", "low": 0.8, "high": 0.95, "when": {"optimiser": "adam"}}))
    result = cli_here("run", study, cwd=study.parent)
    assert result.returncode == 2 and "search_space.b1.when.optimiser" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (study.parent / "runs").exists()


def test_the_fingerprint_knows_conditions_and_enqueue(tmp_path, monkeypatch):
    from sweep.study import config as config_lib
    from sweep.study import fingerprint

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "trials"))  # two_optimizers
    old = fingerprint.meaning(config_lib.from_dict(merge(BASE_STUDY, TWO_OPTIMIZERS)))
    new_space = _space(b1={"type": "float", "low": 0.8, "high": 0.95, "when": {"optimizer": ["adam", "sgd"]}})
    new = fingerprint.meaning(config_lib.from_dict(merge(BASE_STUDY, {**TWO_OPTIMIZERS, "search_space": new_space,
                                                                       "enqueue": [{"optimizer": "adam"}]})))
    assert [key for key, _, _ in fingerprint.changes(old, new)] == ["search_space.b1.when", "enqueue"]
    plain = fingerprint.meaning(config_lib.from_dict(dict(BASE_STUDY)))
    assert "enqueue" not in plain and all("when" not in v for k, v in plain.items() if k.startswith("search_space"))


# --- define-by-run: the trial module's search_space(trial) ------------------------------------


@pytest.mark.slow
def test_define_by_run_space_resumes_with_recorded_params_and_its_source_is_trial_defining(tmp_path):
    hatch = {"search_space": None, "enqueue": [], "n_trials": 3, "sampler": {"type": "tpe", "seed": 5,
                                                                          "n_startup_trials": 2}}
    clean = _beside(tmp_path, "clean", **hatch)
    killed = _beside(tmp_path, "killed", **hatch)
    for study in (clean, killed):  # no search_space key at all
        data = yaml.safe_load(study.read_text())
        del data["search_space"], data["enqueue"]
        study.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = run_cli("plan", killed, cwd=killed.parent)
    assert "space:   define-by-run, two_optimizers.search_space(trial)" in plan.stdout, plan.stdout + plan.stderr
    assert run_cli("run", clean, cwd=clean.parent).returncode == 0
    kill_mid_trial(killed, 2, 100)  # sampled by TPE's model
    before = {t.number: t.params for t in study_of(killed).trials}
    result = run_cli("run", killed, cwd=killed.parent)
    assert result.returncode == 0, result.stderr
    assert "trial 2: resumed from step" in result.stderr
    assert snapshot(killed) == snapshot(clean)
    trials = study_of(killed).trials
    assert trials[2].params == before[2]
    for t in trials:
        assert set(t.params) == ACTIVE[t.params["optimizer"]], t.params
    # The function's source defines the space: an edit is refused, naming it.
    module = killed.parent / "two_optimizers.py"
    module.write_text(module.read_text().replace("0.5, 0.99", "0.6, 0.99"))
    result = run_cli("run", killed, cwd=killed.parent)
    assert result.returncode == 2 and "search_space:" in result.stderr and "sha256" in result.stderr, result.stderr


def test_no_search_space_without_a_define_by_run_function_is_a_config_error(tmp_path, monkeypatch):
    from sweep.errors import ConfigError
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    data = {k: v for k, v in BASE_STUDY.items() if k != "search_space"}
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(data, origin="s.yaml")
    assert err.value.key == "search_space" and "search_space(trial)" in str(err.value)


def test_define_by_run_suggesting_a_fixed_name_is_a_config_error(tmp_path, monkeypatch):
    from sweep.errors import ConfigError
    from sweep.run import preflight
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "trials"))  # two_optimizers
    data = {k: v for k, v in merge(BASE_STUDY, TWO_OPTIMIZERS).items() if k not in ("search_space", "enqueue")}
    data["fixed"] = {"learning_rate": 0.01}
    config = config_lib.from_dict(data, origin="s.yaml")
    with pytest.raises(ConfigError) as err:
        preflight.define_by_run_point(config)
    assert "suggests 'learning_rate', which is fixed" in str(err.value)


@pytest.mark.slow
def test_an_entry_enqueued_by_a_run_killed_before_its_ask_runs_once(tmp_path):
    """The state a kill between the enqueue write and the ask leaves: entry 0 WAITING."""
    study = _beside(tmp_path, "cut", n_trials=2)
    (study.parent / "runs").mkdir()
    cut = optuna.create_study(study_name="t", storage=_storage(study))
    cut.enqueue_trial(TWO_OPTIMIZERS["enqueue"][0], user_attrs={"enqueue_index": 0})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    trials = study_of(study).trials
    assert [t.user_attrs.get("enqueue_index") for t in trials] == [0, 1]
    assert [t.params for t in trials] == [TWO_OPTIMIZERS["enqueue"][0], {**trials[1].params, "optimizer": "adam"}]


def test_nested_conditions_sample_exactly_the_active_parameters(tmp_path, monkeypatch):
    from sweep.store.samplers import suggest_all
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    nested = {
        "hidden": {"type": "int", "low": 16, "high": 64, "step": 16, "when": {"depth": 2}},  # before its parent
        "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
        "depth": {"type": "int", "low": 1, "high": 2, "when": {"optimizer": "sgd"}},
        "weight_decay": {"type": "float", "values": [0.0, 1.0e-4], "when": {"optimizer": "sgd", "depth": [1]}},
    }
    config = config_lib.from_dict(merge(BASE_STUDY, {"search_space": nested, "sampler": {"type": "random"}}))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        params = suggest_all(config, study.ask())
        expected = {"optimizer"}
        if params["optimizer"] == "sgd":
            expected |= {"depth"} | ({"hidden"} if params["depth"] == 2 else {"weight_decay"})
        assert set(params) == expected, params
        seen.add(frozenset(params))
    assert len(seen) == 3  # every branch was taken


# --- constraints on reported metrics ------------------------------------------------------------


@pytest.mark.slow
def test_a_constraint_keeps_infeasible_trials_from_best_in_status_export_and_summary(write_study, tmp_path):
    import json

    plain = write_study("plain.yaml", name="plain", n_trials=3, sampler={"type": "random", "seed": 4}, **FAST)
    assert run_cli("run", plain, cwd=tmp_path).returncode == 0
    ranked = sorted(study_of(plain).trials, key=lambda t: t.value)
    threshold = (ranked[0].value + ranked[1].value) / 2  # the best trial's val_loss is below it
    # The same trials (random sampling does not read constraints), the best one now infeasible.
    study = write_study("c.yaml", name="c", n_trials=3, sampler={"type": "random", "seed": 4},
                        constraints=[{"metric": "val_loss", "min": threshold}], **FAST)
    result = run_cli("run", study, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"best trial: {ranked[1].number} " in result.stdout, result.stdout
    status = json.loads(cli_here("status", study, "--json", cwd=tmp_path).stdout)
    assert {t["number"]: t["feasible"] for t in status["trials"]} == {
        ranked[0].number: False, ranked[1].number: True, ranked[2].number: True}
    table = cli_here("status", study, cwd=tmp_path).stdout
    starred = [line.split()[1] for line in table.splitlines() if line.startswith("*")]
    assert starred == [str(ranked[1].number)], table
    assert cli_here("export", study, "--out", tmp_path / "out", cwd=tmp_path).returncode == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [e["number"] for e in index["trials"]] == [ranked[1].number, ranked[2].number, ranked[0].number]
    assert [e["feasible"] for e in index["trials"]] == [True, True, False]
    # Optuna's own record, which its samplers (TPE, GP) read: <= 0 where the constraint holds.
    by_number = {t.number: t for t in study_of(study).trials}
    assert by_number[ranked[0].number].constraints == {"0.val_loss": pytest.approx(threshold - ranked[0].value)}
    assert by_number[ranked[1].number].constraints["0.val_loss"] <= 0
    assert "feasible" not in json.loads(cli_here("status", plain, "--json", cwd=tmp_path).stdout)["trials"][0]


@pytest.mark.parametrize("constraint, key, words", [
    ({"metric": "n_params", "max": 1.0e6}, "constraints.0.metric", "must be a metric of trials.digits_mlp"),
    ({"metric": "val_loss"}, "constraints.0.max", "give max and/or min"),
    ({"metric": "val_loss", "min": 2.0, "max": 1.0}, "constraints.0.min", "must be <= max"),
])
def test_bad_constraints_are_config_errors(tmp_path, monkeypatch, constraint, key, words):
    from sweep.errors import ConfigError
    from sweep.study import config as config_lib

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        config_lib.from_dict(merge(BASE_STUDY, {"constraints": [constraint]}), origin="s.yaml")
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_constraint_values_and_they_are_trial_defining(tmp_path, monkeypatch):
    from sweep.study import config as config_lib
    from sweep.study import constraints, fingerprint

    monkeypatch.chdir(tmp_path)
    config = config_lib.from_dict(merge(BASE_STUDY, {"constraints": [{"metric": "val_accuracy", "min": 0.9}]}))
    assert constraints.values(config.study.constraints, {"val_accuracy": 0.95}) == pytest.approx([-0.05])
    assert constraints.values(config.study.constraints, {"val_accuracy": float("nan")}) == [float("inf")]
    plain = fingerprint.meaning(config_lib.from_dict(dict(BASE_STUDY)))
    assert [k for k, _, _ in fingerprint.changes(plain, fingerprint.meaning(config))] == ["constraints"]
