"""The grace period after SIGTERM: the study file's `checkpoint.grace_seconds`, else
$SWEEP_GRACE_SECONDS (what a job script knows of its platform), else 30 s; a save of the trial's
state that takes longer is said once per process, naming both figures (in-process)."""

from __future__ import annotations

import re

import pytest

import sweep
from conftest import make_study, run_interrupted
from sweep.errors import UsageError
from sweep.host.signals import DEFAULT_GRACE_SECONDS, GRACE_ENV, StopSignal, grace_seconds

SLOW_SAVE = "longer than the grace period"


def test_grace_is_the_study_file_s_else_the_environment_s_else_30_seconds(monkeypatch):
    monkeypatch.delenv(GRACE_ENV, raising=False)
    assert DEFAULT_GRACE_SECONDS == 30.0
    assert grace_seconds(None) == 30.0 and StopSignal().grace_seconds == 30.0
    assert grace_seconds(12.5) == 12.5
    monkeypatch.setenv(GRACE_ENV, "110")  # e.g. a SLURM job script with --signal=TERM@120
    assert grace_seconds(None) == 110.0 and StopSignal(None).grace_seconds == 110.0
    assert grace_seconds(12.5) == 12.5  # the study file's own key wins


@pytest.mark.parametrize("value", ["", "soon", "0", "-5", "nan", "inf"])
def test_a_bad_grace_in_the_environment_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(GRACE_ENV, value)
    with pytest.raises(UsageError) as raised:
        grace_seconds(None)
    assert raised.value.exit_code == 2
    assert str(raised.value) == f"${GRACE_ENV}: must be seconds > 0 (the grace period after SIGTERM), got {value!r}"


def _said(study, capsys) -> list[str]:
    """Run the study through the Python API (its StopSignal from the study file, as `run`'s); the
    slow-save warnings it logged (its log lines go to stderr)."""
    capsys.readouterr()
    with sweep.open(study) as session:
        session.run(progress=False, read_status=False)
    return [line for line in capsys.readouterr().err.splitlines() if SLOW_SAVE in line]


def test_a_save_longer_than_the_grace_is_said_once_with_both_figures(here, capsys):
    # Two trials saving every 10 of 40 steps: every save after the first is measured against the
    # grace, and none fits in a millisecond.
    said = _said(make_study(here, n_trials=2, checkpoint={"every_steps": 10, "grace_seconds": 0.001}), capsys)
    assert len(said) == 1, said
    found = re.fullmatch(r"\[sweep [0-9:]+\] trial 0: a checkpoint save of its state takes ([0-9.e+-]+) s \(measured\), longer than "
                         r"the grace period of 0\.001 s after SIGTERM .*", said[0])
    assert found and float(found[1]) > 0.001, said[0]
    assert "every_seconds" in said[0] and "every: auto" in said[0] and "state smaller" in said[0]


def test_a_save_within_the_grace_is_not_said(here, capsys, monkeypatch):
    monkeypatch.delenv(GRACE_ENV, raising=False)
    assert _said(make_study(here, n_trials=2, checkpoint={"every_steps": 10}), capsys) == []  # 30 s: far more


def test_a_resumed_trial_s_predicted_save_time_is_held_against_the_grace_at_its_start(here, capsys):
    study = make_study(here, n_trials=1, checkpoint={"every_steps": 20, "grace_seconds": 0.001})
    run_interrupted(study, 0, 20)  # its save at 20 (a signal's: waited for), in the ledger
    said = _said(study, capsys)
    assert len(said) == 1 and "takes" in said[0] and "(predicted from earlier saves)" in said[0], said
