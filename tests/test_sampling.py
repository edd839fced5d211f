"""Restart-proof sampling: a trial's params depend on (seed, number, finished trials), not on history."""

from __future__ import annotations

import optuna
import pytest

from conftest import BASE_STUDY, merge
from sweep import config as config_lib
from sweep.samplers import build_sampler as build_inner, suggest_all
from sweep.session import RestartProofSampler, random_states


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
