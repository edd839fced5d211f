"""Views: where a learning curve marks a resume, and the progress view's speed and compile phase."""

from __future__ import annotations

import time
import types

import optuna
import pytest

from conftest import BASE_STUDY, merge
from sweep.commands.plot import markers, value_at
from sweep.study import config as config_lib


def test_a_resume_between_evaluations_is_marked_at_its_step_on_the_curve():
    config = config_lib.from_dict(merge(BASE_STUDY, {}), origin="s.yaml")
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=0.2,
                                      params={}, distributions={},
                                      intermediate_values={200: 0.5, 250: 0.3, 300: 0.2},
                                      user_attrs={"resumed_from": [221, 250]})
    assert markers(config, trial)["resumed"] == [221, 250]
    assert value_at(trial, 250) == 0.3 and abs(value_at(trial, 221) - (0.5 - 0.2 * 21 / 50)) < 1e-12


def test_speed_comes_from_the_runners_windows_and_the_first_window_shows_compiling(monkeypatch):
    from sweep.commands import progress
    from sweep.commands.progress import Monitor, TrialLine, trial_text
    from sweep.store.session import Session

    clock = [100.0]  # the meter's clock, moved by hand: rates are exact, whatever the machine's load
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    session = Session(config_lib.from_dict(merge(BASE_STUDY, {}), origin="s.yaml"))
    meter = Monitor(session).meter  # it watches the session's progress reports
    session.on_step(3, 0)  # the runner starts: its first window compiles
    assert meter.steps == {3: 0} and meter.rates == {}
    clock[0] += 5.0
    session.on_step(3, 1)  # the first window (with the compile) ends: timing starts here
    assert meter.rates == {}
    clock[0] += 0.1
    session.on_step(3, 11)
    assert meter.rates[3] == pytest.approx(100.0)  # 10 steps in 0.1 s, not counting the compile
    session.on_step(3, -1)
    assert meter.steps == {} and meter.rates == {}

    line = TrialLine(3, 0, 600, None, None, None, None, compiling=True)
    assert "step 0/600, val_loss=- (best -), compiling, checkpoint - ago" in trial_text(line, "val_loss")
    line = TrialLine(3, 300, 600, 0.5, 0.4, 100.0, 2.0)
    assert "100 steps/s, eta 0:03" in trial_text(line, "val_loss")


def test_parallel_coordinates_of_many_parameters_get_room_for_their_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sweep.commands.plot import _readable_axes

    figure, ax = plt.subplots(figsize=(6.4, 4.8))
    ax.set_xticks(range(7), [f"parameter_{i}" for i in range(7)])
    _readable_axes(figure)
    assert figure.get_size_inches()[0] >= 1.3 * 7
    assert all(label.get_rotation() == 30 for label in ax.get_xticklabels())
    plt.close(figure)
