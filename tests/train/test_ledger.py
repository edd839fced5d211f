"""The goodput ledger: where each trial's time went and what its interruptions cost (in-process).

A hard kill is a BaseException raised from the progress callback: it skips the signal's save, as
`kill -9` does, and leaves the trial RUNNING with its reports and its newest checkpoint. The real
`kill -9` is in the slow tier (test_resume.py).
"""

from __future__ import annotations

import pytest

from conftest import make_study, run, run_killed, trials
from sweep.commands import status, summary
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.train import ledger as ledger_lib


def test_ledger_counts_the_steps_redone_after_a_kill_within_the_evaluation_spacing(here):
    # Evaluated every 10 steps, saved every 20: killed at step 40 (as its window ends, before the
    # evaluation at 40), trial 0 resumes from step 20 and had reported up to step 30.
    study = make_study(here, n_trials=2)
    run_killed(study, 0, 40)
    run(study)
    found = {t.number: t.user_attrs[ledger_lib.LEDGER_ATTR] for t in trials(study)}
    killed, clean = found[0], found[1]
    assert killed["interruptions"] == 1 and clean["interruptions"] == 0
    assert killed["lost_steps"] == 10  # 30 (reported) - 20 (restored); the kill was at 40: within 10
    assert 0 < killed["lost"] <= killed["wall"]
    assert clean["lost"] == 0 and clean["lost_steps"] == 0
    for entry in found.values():
        assert set(entry) == set(ledger_lib.KEYS)
        assert entry["training"] > 0 and entry["evaluating"] > 0 and entry["compiling"] >= 0
        measured = sum(entry[k] for k in ledger_lib.PARTS if k != "waiting")
        assert measured <= entry["wall"] and entry["waiting"] >= 0, entry  # parts timed apart fit the wall time

    report, text = _status_and_summary(study)
    assert report["ledger"]["interruptions"] == 1
    assert report["ledger"]["wall"] == pytest.approx(killed["wall"] + clean["wall"], abs=0.01)
    assert "lost to 1 interruption: " in text
    table = status.table(report)
    assert "lost" in table.splitlines()[1] and f"{killed['lost']:.0f}s/1" in table


def _status_and_summary(study):
    """`status --json`'s report and the run summary's text of the study, read in-process."""
    session = Session(config_lib.from_dict(study))
    try:
        return status.collect(session), summary.text(session)
    finally:
        session.close()


def test_ledger_of_a_signal_stop_loses_no_steps(here):
    # SIGTERM saves the step it is seen at: the resume redoes nothing but the restart.
    from conftest import run_interrupted

    study = make_study(here, n_trials=1)
    run_interrupted(study, 0, 30)
    run(study)
    entry = trials(study)[0].user_attrs[ledger_lib.LEDGER_ATTR]
    assert entry["interruptions"] == 1 and entry["lost_steps"] == 0


def test_summary_line_names_interruptions_share_and_parts():
    total = {k: 0.0 for k in ledger_lib.KEYS} | {"wall": 4320.0, "lost": 42.0, "interruptions": 3.0,
                                                   "training": 4000.0}
    line = ledger_lib.summary_line(total)
    assert line.startswith("lost to 3 interruptions: 42 s of 1 h 12 min, 1.0% (time: training 93%")
    assert ledger_lib.study_total([None, {}]) is None


def test_every_run_that_ended_without_finishing_the_trial_counts_once_everywhere(here):
    # Trial 0 is killed as its first window starts (compiling, before any step), then stopped by
    # SIGTERM at step 20, then finished: two interruptions, whatever step each run had reached.
    from conftest import run_interrupted

    study = make_study(here, n_trials=1)
    run_killed(study, 0, 0)
    run_interrupted(study, 0, 20)
    run(study)
    (t,) = trials(study)
    assert t.user_attrs["resumes"] == 2
    assert t.user_attrs[ledger_lib.LEDGER_ATTR]["interruptions"] == 2
    report, text = _status_and_summary(study)
    (entry,) = report["trials"]
    assert entry["resumes"] == 2 and entry["ledger"]["interruptions"] == 2 and report["ledger"]["interruptions"] == 2
    assert "lost to 2 interruptions: " in text
    row = status.table(report).splitlines()[2].split()
    head = status.table(report).splitlines()[1].split()
    assert row[head.index("resumes") + 1] == "2" and row[head.index("lost") + 1].endswith("s/2")  # +1: the '*' column


def test_an_interrupted_trial_not_yet_resumed_counts_its_interruption_when_it_resumes(here):
    study = make_study(here, n_trials=1)
    run_killed(study, 0, 30)
    (t,) = trials(study)
    assert t.user_attrs.get("resumes", 0) == 0  # counted by the run that takes it up (kill -9 records nothing)
    run(study)
    (t,) = trials(study)
    assert t.user_attrs["resumes"] == 1 and t.user_attrs[ledger_lib.LEDGER_ATTR]["interruptions"] == 1
