"""The step inside the trial's code: `loss(hp, params, batch, key, step)` gets the step being
trained (the one `batch` gets), a resumed trial gets the same steps, a bad `loss` or `batch`
signature is a study error; and a non-finite training loss names the first step it was non-finite.

In-process, on tests/trials/step_loss.py (linear.py with a penalty from a step on, and a NaN loss
at the step `nan_at` names) beside tests/trials/linear.py, its stepless twin.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from conftest import (checkpoint_dir, cli_here, make_study, messages, run, run_interrupted, saved_steps, snapshot,
                      trials, write)
from tests.trials.files import trial_source, write_trial

SWITCH_AT = 20  # tests/trials/step_loss.py's: the first step, counted from 0, with the penalty


def _evaluations(study: dict) -> dict[int, dict[str, float]]:
    (trial,) = trials(study)
    return {int(k.split(":")[1]): v for k, v in trial.user_attrs.items() if k.startswith("eval:")}


def test_loss_with_a_step_gets_the_trained_step_and_a_resumed_trial_the_same_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_trial(tmp_path, "stepless_linear", "linear")
    write_trial(tmp_path, "step_linear", "step_loss")
    without, with_step, resumed = (make_study(tmp_path / name, n_trials=1, trial=trial, name=name)
                                   for name, trial in (("without", "stepless_linear"), ("with", "step_linear"),
                                                       ("resumed", "step_linear")))
    run(without)
    run(with_step)
    a, b = _evaluations(without), _evaluations(with_step)
    assert sorted(a) == sorted(b) == [10, 20, 30, 40]
    # Steps 0-19 (the first 20) train as the stepless trial does, bit for bit; step 20 on has the penalty.
    assert [a[s] == b[s] for s in sorted(a)] == [True, True, False, False], (a, b)
    assert b[30]["train_loss"] > a[30]["train_loss"]  # the penalty is in the loss

    run_interrupted(resumed, number=0, step=SWITCH_AT + 5)  # saved at its signal's step, past the switch
    assert trials(resumed)[0].state == TrialState.RUNNING
    assert SWITCH_AT < saved_steps(checkpoint_dir(resumed, 0))[-1] < 40
    run(resumed)
    assert trials(resumed)[0].user_attrs["resumes"] == 1
    assert snapshot(resumed) == snapshot(with_step)


@pytest.mark.parametrize("function, written, shown", [
    ("loss", "def loss(hp, params, batch, key, step):", "loss(hp, params, batch, key, t)"),
    ("loss", "def loss(hp, params, batch, key, step):", "loss(hp, params, batch, key, step, scale)"),
    ("loss", "def loss(hp, params, batch, key, step):", "loss(hp, params, batch)"),
    ("batch", "def batch(hp, data, key):", "batch(hp, data, key, epoch)"),
])
def test_a_loss_or_batch_that_cannot_take_the_protocol_arguments_exits_2_naming_it(tmp_path, function, written,
                                                                                    shown):
    trial = f"bad_signature_{len(shown)}_{function}"  # a module name of its own: imported once per process
    (tmp_path / f"{trial}.py").write_text(trial_source("step_loss").replace(written, f"def {shown}:"))
    path = write(make_study(tmp_path, n_trials=1, trial=trial), tmp_path)
    result = cli_here("run", path, cwd=tmp_path)
    args = "hp, params, batch, key" if function == "loss" else "hp, data, key"
    assert result.returncode == 2
    assert result.stderr == (f"error: {path}: trial: module {trial} does not provide the trial protocol: {function} "
                             f"must take ({args}) or ({args}, step); any other parameter needs a default, "
                             f"got {shown!r}\n")
    assert not (tmp_path / "runs").exists()


def test_a_non_finite_training_loss_names_the_first_step_it_was_non_finite(tmp_path, monkeypatch, sweep_log):
    monkeypatch.chdir(tmp_path)
    write_trial(tmp_path, "nan_linear", "step_loss")
    # Windows end at evaluations and saves (50, 100) and grow 8x from one step, so the NaN at step 36
    # (counted from 0: the 37th step) is inside a window of many steps, whose range the error named.
    study = make_study(tmp_path, n_trials=1, trial="nan_linear", fixed={"nan_at": 36}, max_retries=1,
                       train={"steps": 100, "eval_every": 50, "seed": 0}, checkpoint={"every_steps": 50})
    run(study)
    (trial,) = trials(study)
    assert trial.state == TrialState.FAIL and trial.user_attrs["failures"] == 1  # deterministic: no retry
    said = "trial 0: the training loss is nan at step 37 (non-finite); the trial failed"
    assert trial.user_attrs["error"] == f"NonFiniteMetric: {said}"
    assert [m for m in messages(sweep_log) if said in m]


def test_the_docs_say_where_a_non_finite_loss_is_reported_and_that_loss_may_take_the_step():
    docs = Path(__file__).resolve().parents[2] / "docs"
    trials_md, reference, faults = (" ".join((docs / f).read_text().split())
                                    for f in ("trials.md", "reference.md", "faults.md"))
    for text in (trials_md, reference):
        assert "loss(hp, params, batch, key, step)" in text
    for text in (trials_md, faults):
        assert "first step whose training loss is non-finite" in text
