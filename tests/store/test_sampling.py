"""Restart-proof sampling: a trial's params depend on (seed, number, finished trials), not on history."""

from __future__ import annotations

import re

import optuna
import pytest

from conftest import BASE_STUDY, merge
from sweep.internals import sampler_random_states as random_states
from sweep.store.samplers import RestartProofSampler, suggest_all
from sweep.store.samplers import build_sampler as build_inner
from sweep.study import config as config_lib


def build_sampler(config):
    """The sampler a session gives its study: the configured one, made restart-proof."""
    return RestartProofSampler(build_inner(config), config.study.sampler.seed)


def _config(tmp_path, sampler):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(merge(BASE_STUDY, {"sampler": sampler, "search_space": {
        "learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True},
        "hidden": {"type": "int", "low": 16, "high": 64, "step": 16},
        "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]}}})))
    return config_lib.load(path)


def _sweep(config, sampler, disturb: bool) -> list[dict]:
    """Six sequential trials; `disturb` advances every RNG the sampler holds before each trial,
    as a restarted process or a trial killed between two suggests would."""
    study = optuna.create_study(sampler=sampler)
    out = []
    for i in range(6):
        if disturb:
            for state in random_states(getattr(sampler, "inner", sampler)):
                state.random_sample(7 + i)
        trial = study.ask()
        params = suggest_all(config, trial)
        study.tell(trial, (params["learning_rate"] - 0.01) ** 2 + params["hidden"] / 1000)
        out.append(params)
    return out


@pytest.mark.parametrize("sampler", [{"type": "tpe", "seed": 1, "n_startup_trials": 3}, {"type": "random", "seed": 1},
                                     {"type": "qmc", "seed": 1, "scramble": True}])
def test_params_do_not_depend_on_earlier_draws_in_the_process(tmp_path, sampler):
    config = _config(tmp_path, sampler)
    clean = _sweep(config, build_sampler(config), disturb=False)
    assert _sweep(config, build_sampler(config), disturb=True) == clean
    assert len({repr(p) for p in clean}) == 6  # really sampled, not a constant


def test_plain_optuna_sampler_would_depend_on_history(tmp_path):
    # The control: without the wrapper the same disturbance changes the params.
    config = _config(tmp_path, {"type": "random", "seed": 1})
    plain = lambda: optuna.samplers.RandomSampler(seed=1)  # noqa: E731
    assert _sweep(config, plain(), disturb=True) != _sweep(config, plain(), disturb=False)


def test_adopted_trial_reads_back_its_params_and_samples_missing_ones_identically(tmp_path):
    config = _config(tmp_path, {"type": "tpe", "seed": 5})
    study = optuna.create_study(sampler=build_sampler(config))
    first = study.ask()
    full = suggest_all(config, first)
    # Killed after the first suggest: a fresh Trial object (as adoption makes) completes the rest.
    other = optuna.create_study(sampler=build_sampler(config))
    partial = other.ask()
    partial.suggest_float("learning_rate", 1e-3, 1e-1, log=True)
    adopted = optuna.Trial(other, partial._trial_id)  # what Session.handle does
    assert suggest_all(config, adopted) == full


# --- what a sampler needs and what it will really do (the study file's search space as values) ----

def _study(**override):
    return config_lib.from_dict(merge(BASE_STUDY, override), origin="s.yaml")


def test_a_float_grid_has_no_float_drift():
    config = _study(sampler={"type": "grid"}, search_space={
        "learning_rate": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1}})
    from sweep.store.samplers import _grid

    assert _grid(config)["learning_rate"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]  # not 0.30000000000000004


def test_values_lists_work_with_every_sampler_and_make_a_log_scale_grid():
    space = {"learning_rate": {"type": "float", "values": [1.0e-4, 3.0e-4, 1.0e-3]},
             "hidden": {"type": "int", "values": [16, 64]}}
    from sweep.store.samplers import grid_size, sampler_notes

    grid = _study(sampler={"type": "grid"}, search_space=space, n_trials=4)
    assert grid_size(grid) == 6
    assert [note for _, note in sampler_notes(grid)] == ["sampler grid: 6 grid points; n_trials 4 covers 4 of them"]
    for sampler in ({"type": "grid"}, {"type": "tpe", "seed": 0}, {"type": "random", "seed": 1}):
        config = _study(sampler=sampler, search_space=space, n_trials=6)
        study = optuna.create_study(sampler=build_sampler(config))
        for _ in range(6):
            params = suggest_all(config, study.ask())
            assert params["learning_rate"] in space["learning_rate"]["values"]
            assert params["hidden"] in space["hidden"]["values"]


@pytest.mark.parametrize("param, rule", [
    ({"type": "float", "values": [0.1], "low": 0.0}, "values: cannot be combined with low"),
    ({"type": "int", "values": [1, 1]}, "values: must not repeat a value"),
    ({"type": "float", "high": 1.0}, "low: is required (or give the parameter's values as a list)"),
    ({"type": "int", "values": []}, "must not be empty"),
])
def test_bad_values_are_study_file_errors(param, rule):
    with pytest.raises(config_lib.ConfigError, match=re.escape(rule)):
        _study(search_space={"learning_rate": param})


def test_a_model_based_sampler_that_never_leaves_its_startup_trials_is_noted():
    from sweep.store.samplers import sampler_notes

    assert [n for _, n in sampler_notes(_study(sampler={"type": "tpe", "seed": 0}, n_trials=10))] == [
        "sampler tpe: n_trials 10 does not exceed its n_startup_trials 10, so every trial is sampled at random and "
        "its model is never used; raise n_trials or lower sampler.n_startup_trials"]
    assert sampler_notes(_study(sampler={"type": "tpe", "seed": 0, "n_startup_trials": 2}, n_trials=4)) == []


def test_gp_without_torch_is_a_study_file_error_naming_the_package():
    import importlib.util

    from sweep.store.samplers import check_config

    config = _study(sampler={"type": "gp", "seed": 0})
    if importlib.util.find_spec("torch") is not None:
        check_config(config)  # the package is there: the sampler builds
        return
    with pytest.raises(config_lib.ConfigError, match=r"sampler.type: needs the package torch, which is not "
                                                     r"installed \(pip install torch\)"):
        check_config(config)
