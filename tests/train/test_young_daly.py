"""`checkpoint: {every: auto}`: Young-Daly's interval from the measured save cost and the study's
interruption rate, bounded by the write budget; the study file's rules; a study whose interval moves
with its interruptions is bit-identical to a fixed cadence's, and `status` shows the interval and its
inputs (in-process)."""

from __future__ import annotations

import math

import pytest

from conftest import make_study, run, run_interrupted, snapshot, trials
from sweep.commands import status
from sweep.errors import ConfigError
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.train import cadence, young_daly
from sweep.train import ledger as ledger_lib


def test_interval_is_young_daly_bounded_by_the_write_budget():
    assert young_daly.interval(2.0, 3600.0, None) == pytest.approx(120.0)  # sqrt(2 x 2 x 3600)
    assert young_daly.interval(2.0, 3600.0, 0.03) == pytest.approx(120.0)  # 2 / 0.03 = 66.7 s: not binding
    assert young_daly.interval(2.0, 100.0, 0.03) == pytest.approx(2.0 / 0.03)  # sqrt(400) = 20 s: bounded
    # The interval grows with the save cost and with the time between interruptions, as their square root.
    assert young_daly.interval(8.0, 3600.0, None) == pytest.approx(2 * young_daly.interval(2.0, 3600.0, None))
    assert young_daly.interval(2.0, 900.0, None) == pytest.approx(young_daly.interval(2.0, 3600.0, None) / 2)


def test_mean_time_between_interruptions_starts_at_the_prior_and_follows_the_study():
    assert young_daly.mean_time_between(3600.0, 0.0, 0) == 3600.0  # before anything: the prior
    assert young_daly.mean_time_between(3600.0, 3600.0, 0) == 7200.0  # an hour without one: rarer than thought
    assert young_daly.mean_time_between(3600.0, 3600.0, 3) == 1800.0
    assert young_daly.mean_time_between(60.0, 36000.0, 100) == pytest.approx(360.0, rel=0.01)  # the data win


def test_save_cost_is_the_training_thread_s_part_plus_the_writer_s_per_write():
    assert young_daly.save_cost(1.0, 4, 6.0, 3) == pytest.approx(0.25 + 2.0)  # the 4th write still in flight
    assert young_daly.save_cost(1.0, 1, 0.0, 0) is None  # no write done yet: not measured
    assert young_daly.save_cost(0.0, 0, 0.0, 0) is None


def _chosen(study_wall: float, interruptions: int, mtbi: float | None = None) -> float:
    """The interval a run of a trial chooses at its start: its earlier runs saved 4 times at 0.5 s each
    (0.5 s blocking, 1.5 s writing in all), the study ran `study_wall` s with `interruptions`."""
    checkpoint = config_lib.Checkpoint(every="auto", **({"mtbi_seconds": mtbi} if mtbi else {}))
    before = {"checkpoint_blocking": 0.5, "checkpoint_background": 1.5, "saves": 4.0}
    ledger = ledger_lib.RunLedger(before, study={"wall": study_wall, "interruptions": float(interruptions)})
    run = cadence.Cadence.of(checkpoint, 0, ledger)
    assert ledger.total()["auto_every_seconds"] == run.every_seconds  # recorded where status reads it
    assert ledger.total()["auto_save_seconds"] == 0.5
    return run.every_seconds


def test_the_cadence_s_interval_shrinks_as_interruptions_come_and_grows_as_they_stop():
    # sqrt(2 x 0.5 s x M) = sqrt(M), M = (3600 + wall) / (1 + interruptions)
    assert _chosen(0.0, 0) == pytest.approx(60.0, abs=1e-3)
    assert _chosen(3600.0, 0) == pytest.approx(math.sqrt(7200), abs=1e-3)  # no interruption in an hour: longer
    frequent = [_chosen(3600.0, n) for n in (1, 3, 10)]
    assert frequent[0] > frequent[1] > frequent[2] and frequent[-1] == pytest.approx(math.sqrt(7200 / 11), abs=1e-3)
    calmer = [_chosen(wall, 10) for wall in (3600.0, 36000.0, 360000.0)]  # ... then none for longer and longer
    assert calmer[0] < calmer[1] < calmer[2] and calmer[-1] > 3 * calmer[0]
    assert _chosen(3600.0, 1000) == pytest.approx(0.5 / 0.03, abs=1e-3)  # the write budget's bound
    assert _chosen(0.0, 0, mtbi=1000.0) == pytest.approx(math.sqrt(1000), abs=1e-3)  # the prior is the user's


def test_before_any_measured_save_auto_saves_at_the_default_interval():
    ledger = ledger_lib.RunLedger(None, study=None)
    run = cadence.Cadence.of(config_lib.Checkpoint(every="auto"), 0, ledger)
    assert run.every_seconds == young_daly.UNMEASURED_SECONDS and run.every_steps is None and run.share == 0.03
    assert "auto_save_seconds" not in ledger.total() and ledger.total()["auto_mtbi_seconds"] >= 3600.0


@pytest.mark.parametrize("checkpoint, key, fragment", [
    ({"every": "auto", "every_steps": 100}, "checkpoint.every_steps", "cannot be given with every: auto"),
    ({"every": "auto", "every_seconds": 60}, "checkpoint.every_seconds", "cannot be given with every: auto"),
    ({"mtbi_seconds": 600}, "checkpoint.mtbi_seconds", "is only used with every: auto"),
    ({"every": "auto", "mtbi_seconds": 0}, "checkpoint.mtbi_seconds", "must be > 0"),
    ({"every": "often"}, "checkpoint.every", "must be one of 'auto'"),
])
def test_every_auto_study_file_rules(here, checkpoint, key, fragment):
    with pytest.raises(ConfigError) as raised:
        config_lib.from_dict(make_study(here, checkpoint=checkpoint), origin="study.yaml")
    message = str(raised.value)
    assert raised.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"study.yaml: {key}: {fragment}") and ", got " in message


def test_every_auto_alone_or_with_a_budget_or_null_seconds_is_valid(here):
    for checkpoint, share in (({"every": "auto"}, 0.03), ({"every": "auto", "max_write_share": 0.1}, 0.1),
                              ({"every": "auto", "every_seconds": None, "mtbi_seconds": 600}, 0.03)):
        c = config_lib.from_dict(make_study(here, checkpoint=checkpoint)).study.checkpoint
        assert (c.every, c.write_share, c.explicit_cadence) == ("auto", share, False)


def _auto(study):
    return [t.user_attrs[ledger_lib.LEDGER_ATTR] for t in trials(study)]


def test_every_auto_follows_the_study_s_interruptions_and_is_bit_identical_to_a_fixed_cadence(here):
    fixed = make_study(here / "fixed", n_trials=3)  # every_steps 20
    run(fixed)
    auto = make_study(here / "auto", n_trials=3, checkpoint={"every": "auto", "keep_last": 2})
    seen = []  # trial 0's ledger after each of its runs: stopped as by SIGTERM at 10, 20 and 30
    for step in (10, 20, 30):
        run_interrupted(auto, 0, step)
        seen.append(_auto(auto)[0])
    run(auto)
    ledgers = _auto(auto)
    assert snapshot(auto) == snapshot(fixed)  # the cadence moved saves only

    # The mean time between interruptions: the prior (3600 s) over 1 + the study's interruptions
    # (trial 0's, counted by the run that takes it up) and growing with the wall time after them.
    runs = [*seen, ledgers[0]]
    assert [int(r["interruptions"]) for r in runs] == [0, 1, 2, 3]
    mtbi = [r["auto_mtbi_seconds"] for r in runs]
    assert mtbi[0] >= 3600.0 and all(a > b for a, b in zip(mtbi, mtbi[1:]))  # more frequent: shorter
    assert all(r["auto_mtbi_seconds"] * (1 + r["interruptions"]) >= 3600.0 for r in runs)  # prior + wall
    later = [ledgers[1]["auto_mtbi_seconds"], ledgers[2]["auto_mtbi_seconds"]]
    assert mtbi[-1] < later[0] < later[1]  # none since: longer again, trial after trial
    # Each interval is Young-Daly's of the inputs recorded beside it, under the default budget; the
    # first run may end before its only write is measured (then the default interval stands).
    if "auto_save_seconds" not in runs[0]:
        assert runs[0]["auto_every_seconds"] == young_daly.UNMEASURED_SECONDS
    for r in [*runs[1:], ledgers[1], ledgers[2]] + ([runs[0]] if "auto_save_seconds" in runs[0] else []):
        assert r["auto_save_seconds"] > 0  # measured: the trial's own saves, or the study's before them
        chosen = young_daly.interval(r["auto_save_seconds"], r["auto_mtbi_seconds"], 0.03)
        assert r["auto_every_seconds"] == pytest.approx(chosen, abs=1e-3)

    session = Session(config_lib.from_dict(auto))
    try:
        report = status.collect(session)
    finally:
        session.close()
    shown = [t["checkpoint_auto"] for t in report["trials"]]
    assert shown == [{"every_seconds": r["auto_every_seconds"], "save_seconds": r["auto_save_seconds"],
                      "mtbi_seconds": r["auto_mtbi_seconds"]} for r in ledgers]
    assert all(not any(k.startswith("auto_") for k in t["ledger"]) for t in report["trials"])
    text = status.table(report)
    assert f"checkpoint every: auto: {shown[2]['every_seconds']:.3g} s (trial 2)" in text
    assert f"{shown[2]['mtbi_seconds']:.0f} s between interruptions" in text
