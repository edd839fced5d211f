"""Progress of `run`: log lines off a terminal, a live table on one, and the decisions at start."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from conftest import Running, checkpoint_dir, gated_trial, kill9, kill_mid_trial, wait_for_checkpoint
from sweep.commands import progress
from sweep.store.session import Session
from sweep.study import config as config_lib

pytestmark = pytest.mark.slow  # every test here starts real processes

LONG = {"n_trials": 1, "train": {"steps": 100000, "eval_every": 500}, "checkpoint": {"every_steps": 1000}}


def test_log_lines_report_step_metric_speed_and_checkpoint_age(write_study):
    study = write_study(**LONG)
    proc = Running("run", study, "--log-every", "0.5", cwd=study.parent)
    m = proc.wait_for(r"trial 0: step (\d+)/100000, val_loss=([\d.]+) \(best ([\d.]+)\), (\d+) steps/s, "
                      r"eta (\d+:\d\d), checkpoint (\d+:\d\d) ago")
    assert int(m.group(1)) >= 500 and int(m.group(4)) > 0  # per step: the runner shares its step in-process
    assert float(m.group(3)) <= float(m.group(2))
    proc.wait_for(r"study: 0/1 trial finished, no trial complete yet")
    kill9(proc)


def test_monitor_sees_live_trials_only(write_study):
    study = write_study(**LONG)
    proc = Running("run", study, cwd=study.parent)
    wait_for_checkpoint(checkpoint_dir(study, 0), 2000)
    monitor = progress.Monitor(Session(config_lib.load(study)))
    _, first = monitor.poll()
    deadline = time.monotonic() + 60
    while True:  # until the trial has reported a new step (or its worker is gone)
        study_line, lines = monitor.poll()
        if not lines or lines[0].step != first[0].step or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [line.number for line in lines] == [0] and study_line.finished == 0
    assert lines[0].step > first[0].step and lines[0].steps_per_s and lines[0].eta_s > 0
    assert lines[0].ckpt_age_s is not None and lines[0].ckpt_age_s >= 0
    kill9(proc)
    assert monitor.poll()[1] == []  # its worker is gone: no longer running


def test_live_table_redraws_running_trials(write_study):
    study = write_study(**LONG)
    proc = Running("run", study, cwd=study.parent)
    wait_for_checkpoint(checkpoint_dir(study, 0), 1000)
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=140)

    def text() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())

    def drawn() -> bool:
        return "0/1 trial finished" in text() and re.search(r"\b0\b.*\d+/100000", text()) is not None

    with progress.Display(Session(config_lib.load(study)), live=True, console=console):
        deadline = time.monotonic() + 60
        while not drawn() and time.monotonic() < deadline:  # the first redraw with the trial's row
            time.sleep(0.05)
    kill9(proc)
    assert "0/1 trial finished" in text()
    assert re.search(r"\b0\b.*\d+/100000", text())


def test_resume_decision_is_logged_with_its_step(write_study, tmp_path, held):
    # Held at the process's 17th evaluation (trial 0's 12, then trial 1's at step 250, after its
    # save at 200): the kill lands mid-trial however fast the machine.
    study = write_study(trial=gated_trial(tmp_path, 17), n_trials=2)
    step = kill_mid_trial(study, 1, 200, held(tmp_path / "hold"))[-1]
    again = Running("run", study, cwd=study.parent)
    assert again.finish() == 0
    assert "trial 0: finished, skipped" in again.stderr
    assert f"trial 1: interrupted, will resume from its newest checkpoint, step {step}" in again.stderr
    assert f"trial 1: resumed from step {step}" in again.stderr
