"""Search spaces as rich as Optuna's (docs/search.md): enqueued trials (Optuna's WAITING ones and
the file's `enqueue`), sampler arguments a study file cannot give, conditional parameters and the
define-by-run `search_space(trial)` of a trial module. Through the real CLI."""

from __future__ import annotations

import optuna
import pytest
import yaml
from conftest import BASE_STUDY, kill_mid_trial, merge, run_cli, snapshot, study_of

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
    plan = run_cli("plan", study, cwd=study.parent)
    assert plan.returncode == 0, plan.stderr
    assert "waiting: trials 3-4" in plan.stdout and "finished" not in plan.stdout.splitlines()[-1], plan.stdout
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
    from sweep import config as config_lib
    from sweep.errors import ConfigError
    from sweep.samplers import check_config

    monkeypatch.chdir(tmp_path)
    config = config_lib.from_dict(merge(BASE_STUDY, {"sampler": sampler}), origin="s.yaml")
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert err.value.key == key and words in str(err.value), str(err.value)


@pytest.mark.slow
def test_a_string_for_a_function_exits_2_before_anything_is_created(write_study):
    study = write_study(sampler={"type": "tpe", "constraints_func": "mod:fn"}, **FAST)
    for command in ("run", "plan"):
        result = run_cli(command, study, cwd=study.parent)
        out = result.stderr + result.stdout
        assert result.returncode == 2, (command, out)
        assert "sampler.constraints_func" in out and "Traceback" not in out, out
    assert not (study.parent / "runs").exists()  # nothing created


@pytest.mark.slow
def test_pruner_argument_of_the_wrong_type_exits_2(write_study):
    study = write_study(**{**FAST, "pruner": {"type": "median", "n_warmup_steps": 1.5}})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 2 and "pruner.n_warmup_steps" in result.stderr, result.stderr


@pytest.mark.slow
def test_a_stored_argument_that_never_worked_may_be_dropped(write_study):
    """The way out for a study an older release started with `constraints_func: "mod:fn"`."""
    from sweep import fingerprint

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
    result = run_cli("plan", study, cwd=study.parent)
    assert result.returncode == 2 and "sampler.n_ei_candidates: 24 -> (absent)" in result.stderr + result.stdout
