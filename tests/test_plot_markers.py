"""Where the learning curve marks a resume: at the exact step, an evaluation step or not."""

from __future__ import annotations

import optuna

from conftest import BASE_STUDY, merge
from sweep import config as config_lib
from sweep.plot import markers, value_at


def test_a_resume_between_evaluations_is_marked_at_its_step_on_the_curve():
    config = config_lib.from_dict(merge(BASE_STUDY, {}), origin="s.yaml")
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=0.2,
                                      params={}, distributions={},
                                      intermediate_values={200: 0.5, 250: 0.3, 300: 0.2},
                                      user_attrs={"resumed_from": [221, 250]})
    assert markers(config, trial)["resumed"] == [221, 250]
    assert value_at(trial, 250) == 0.3 and abs(value_at(trial, 221) - (0.5 - 0.2 * 21 / 50)) < 1e-12
