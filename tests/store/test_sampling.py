"""Restart-proof sampling: a trial's params depend on (seed, number, finished trials), not on history."""

from __future__ import annotations

import math
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


def test_the_rung_view_shows_the_trials_at_the_highest_step_enough_reported():
    """scheduler.sampler_sees: rung (sweep/store/samplers.py RungView): before `least` trials
    reported at one step the sampler sees the study as it is; then the trials at the highest such
    step, COMPLETE with their value there, and no other finished trial. A paused trial counts up
    to the step it waits at, a running one not at all (what it reported depends on the moment)."""
    from optuna.trial import TrialState

    from sweep.store.samplers import RungView

    study = optuna.create_study()
    done = study.ask()
    done.report(0.9, 100)
    study.tell(done, 0.8)
    view = RungView(study, least=3)
    assert [(t.number, t.state, t.values) for t in view.get_trials()] == [(0, TrialState.COMPLETE, [0.8])]
    paused, running, unrep = study.ask(), study.ask(), study.ask()
    paused.report(0.7, 100)
    paused.report(0.6, 200)  # past the step it waits at: not counted (a killed continuation's)
    running.report(0.5, 100)
    study._storage.set_trial_user_attr(paused._trial_id, "paused_at", [100])
    study._storage.set_trial_state_values(paused._trial_id, TrialState.WAITING)
    study.tell(unrep, state=TrialState.PRUNED)  # pruned before any report: hidden once the view shows a step
    assert [t.number for t in view.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))] == [0, 3]
    study.tell(running, 0.5)  # now finished: 3 reported at 100
    seen = view._get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert [(t.number, t.values) for t in seen] == [(0, [0.9]), (1, [0.7]), (2, [0.5])]
    assert [t.number for t in view.get_trials(states=(TrialState.WAITING,))] == []  # shown COMPLETE instead
    assert study.trials[1].state == TrialState.WAITING and study.trials[0].values == [0.8]  # storage as it was


def test_with_sampler_sees_rung_tpe_is_guided_by_the_paused_trials():
    """Under asha few trials finish early, so TPE (learning from finished trials) samples at
    random; with `sampler_sees: rung` it learns from the trials at the rung: the same seed gives
    the same start-up (random) trials, then better ones than at random while the view is at the
    first rung (here: fewer than 10 trials pass it in 20). Simulated: no trial trains."""
    from sweep.run.simulator import Curve, simulate

    def quality(p):  # the value every curve approaches; all have one shape, so a rung ranks as the end
        return abs(math.log10(p["learning_rate"]) + 1.5) + 8.0 / p["hidden"]

    def curve(number, params):
        return Curve({s: quality(params) + 100.0 / (100.0 + s) for s in range(100, 1601, 100)})

    def params(sees):
        config = config_lib.from_dict(merge(BASE_STUDY, {
            "name": "rung-view", "n_trials": 20, "sampler": {"type": "tpe", "seed": 1, "n_startup_trials": 10},
            "pruner": {"type": "none"}, "train": {"steps": 1600, "eval_every": 100},
            "scheduler": {"type": "asha", "min_steps": 100, "reduction_factor": 4, "sampler_sees": sees}}),
            import_trial=False)
        run = simulate(config, curve, workers=1)
        return [t.params for t in sorted(run.trials, key=lambda t: t.number)]

    finished, rung = params("finished"), params("rung")
    assert finished[:10] == rung[:10]  # the start-up trials: at random either way
    assert finished[10:] != rung[10:]
    assert sum(map(quality, rung[10:])) < 0.75 * sum(map(quality, finished[10:]))
