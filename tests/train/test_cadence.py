"""The checkpoint cadence: an explicit one is exact, the default one runs under the write budget,
an explicit budget caps any cadence and its deferrals are shown; the cost of an exact cadence is said."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from conftest import Running, checkpoint_dir, kill9, run_cli, wait_for_checkpoint


def test_cadence_saves_every_n_steps_or_every_t_seconds_whichever_first(monkeypatch):
    from sweep.train import cadence

    now = [100.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: now[0])
    both = cadence.Cadence(every_steps=50, every_seconds=10.0, share=None)
    assert not both.due(49) and both.due(50)
    now[0] += 10.0
    assert both.due(51)  # ten seconds passed: due off the step cadence
    both.saved(51)
    assert not both.due(52)
    seconds_only = cadence.Cadence(every_steps=None, every_seconds=2.0, share=None)
    assert not seconds_only.due(1000)
    now[0] += 2.0
    assert seconds_only.due(1001)
    never = cadence.Cadence(every_steps=None, every_seconds=None, share=None)
    now[0] += 1e6
    assert not never.due(100)


@pytest.mark.parametrize("checkpoint, share", [
    ({}, 0.03),  # no cadence key: the default every_seconds under the default budget
    ({"keep_last": 3}, 0.03),
    ({"every_steps": 100}, None),  # an explicit cadence is exact
    ({"every_seconds": 60}, None),
    ({"every_steps": 100, "max_write_share": 0.05}, 0.05),  # an explicit budget caps it
    ({"max_write_share": 0.1}, 0.1),
    ({"max_write_share": None}, None),  # null: the default cadence, exact
])
def test_write_share_in_force(write_study, checkpoint, share):
    from sweep.study import config as config_lib

    path = write_study()
    data = yaml.safe_load(path.read_text())
    data["checkpoint"] = checkpoint
    path.write_text(yaml.safe_dump(data))
    c = config_lib.load(path).study.checkpoint
    assert c.write_share == share
    assert c.explicit_cadence == bool({"every_steps", "every_seconds"} & set(checkpoint))


def _ledger(training: float, blocking: float):
    from sweep.train.ledger import RunLedger

    ledger = RunLedger(None)
    ledger.parts.update(training=training, checkpoint_blocking=blocking)
    return ledger


@pytest.mark.parametrize("share, saves, training, blocking, warns", [
    (None, 3, 10.0, 0.6, True),  # 6% of training, exact cadence: said
    (None, 3, 10.0, 0.4, False),  # 4%: not
    (None, 2, 10.0, 5.0, False),  # too few saves to judge (the first pays Orbax's set-up)
    (0.03, 3, 10.0, 5.0, False),  # under a write budget the cost is capped, nothing to say
])
def test_cost_warning_only_for_an_exact_cadence_above_five_percent(caplog, share, saves, training, blocking, warns):
    from sweep.train.cadence import Cadence

    cadence = Cadence(every_steps=10, every_seconds=None, share=share)
    cadence.saves = saves
    with caplog.at_level(logging.WARNING, logger="sweep"):
        cadence.check_cost(4, _ledger(training, blocking))
        cadence.check_cost(4, _ledger(training, blocking))  # once per trial run, however often checked
    said = [r.getMessage() for r in caplog.records if "of its training time" in r.getMessage()]
    assert len(said) == (1 if warns else 0), said
    if warns:
        assert said[0].startswith("trial 4: checkpoints at every_steps: 10 take 6% of its training time")
        assert "checkpoint.every_seconds" in said[0] and "checkpoint.max_write_share" in said[0]


def test_cadence_counts_deferred_saves_once_and_the_mean_interval(monkeypatch):
    from sweep.train import cadence

    class Busy:
        def __init__(self):
            self.busy_now = True

        def busy(self, share):
            return self.busy_now

    now = [0.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: now[0])
    c, writer = cadence.Cadence(every_steps=10, every_seconds=None, share=0.5), Busy()
    assert c.due(10) and c.defer(writer)  # due at 10, writer busy: owed
    assert c.due(12) and c.defer(writer)  # still owed: the same deferral
    writer.busy_now = False
    now[0] = 3.0
    assert c.due(14) and not c.defer(writer)
    c.saved(14)
    counts = c.counts()
    assert counts["deferred_saves"] == 1 and counts["saves"] == 1
    assert cadence.effective_interval({**counts}) == {"steps": 14.0, "seconds": 3.0, "deferred_saves": 1}
    now[0] = 4.0
    c.saved(20)
    assert cadence.effective_interval(c.counts()) == {"steps": 10.0, "seconds": 2.0, "deferred_saves": 1}
    exact = cadence.Cadence(every_steps=10, every_seconds=None, share=None)
    assert exact.due(10) and not exact.defer(writer := Busy())  # no budget: never owed, the save waits


def _steps(folder):
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_explicit_every_steps_is_exact_by_default_then_a_kill(write_study):
    # Steps far faster than a write (~1 ms against tens of ms): under the old default budget most
    # of these saves were deferred, so a kill lost far more than every_steps.
    settings = dict(n_trials=1, pruner={"type": "none"}, train={"steps": 3000, "eval_every": 100},
                    checkpoint={"every_steps": 50, "keep_last": 1000})
    study = write_study(**settings)
    data = yaml.safe_load(study.read_text())
    del data["checkpoint"]["max_write_share"]  # as a user writes it: no budget key
    study.write_text(yaml.safe_dump(data))
    plan = run_cli("plan", study, cwd=study.parent)
    assert plan.returncode == 0, plan.stderr
    assert ("saves:   every 50 steps or every 300 s (whichever comes first; 300 s is every_seconds' default, "
            "`every_seconds: null` saves by steps alone), exactly") in plan.stdout, plan.stdout
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    wait_for_checkpoint(checkpoint_dir(study, 0), 1000)
    kill9(proc)
    before = _steps(checkpoint_dir(study, 0))
    assert before == list(range(50, before[-1] + 1, 50)), before  # every multiple, none skipped
    again = run_cli("run", study, cwd=study.parent)
    assert again.returncode == 0, again.stderr
    assert f"trial 0: resumed from step {before[-1]}" in again.stderr
    after = _steps(checkpoint_dir(study, 0))
    assert after == list(range(50, 3001, 50)), after
    status = json.loads(run_cli("status", study, "--json", cwd=study.parent).stdout)
    interval = status["trials"][0]["checkpoint_interval"]
    assert interval["steps"] == 50 and interval["deferred_saves"] == 0, json.dumps(status["trials"][0]["ledger"])


@pytest.mark.slow
def test_explicit_budget_defers_saves_and_status_and_plan_show_it(write_study):
    # max_write_share 0.01 with a save every 10 steps of ~1 ms: the writer must rest ~99x a
    # write's time between saves, so most due saves are deferred.
    study = write_study(n_trials=1, pruner={"type": "none"}, train={"steps": 2000, "eval_every": 500},
                        checkpoint={"every_steps": 10, "max_write_share": 0.01})
    plan = run_cli("plan", study, cwd=study.parent)
    assert "under checkpoint.max_write_share of 0.01" in plan.stdout, plan.stdout
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "of its training time" not in result.stderr  # a budgeted cadence is not warned about
    status = run_cli("status", study, "--json", cwd=study.parent)
    trials = json.loads(status.stdout)["trials"]
    for t in trials:
        interval = t["checkpoint_interval"]
        assert interval["deferred_saves"] > 0 and interval["steps"] > 10, interval
        assert t["ledger"]["deferred_saves"] == interval["deferred_saves"]
    table = run_cli("status", study, cwd=study.parent).stdout
    assert "ckpt_every" in table and "deferred)" in table, table


@pytest.mark.slow
def test_an_exact_cadence_that_costs_more_than_five_percent_is_said_once(write_study):
    study = write_study(n_trials=1, pruner={"type": "none"}, train={"steps": 300, "eval_every": 100},
                        checkpoint={"every_steps": 5, "keep_last": 2})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "of its training time" in line]
    assert len(said) == 1 and "trial 0: checkpoints at every_steps: 5 take" in said[0], result.stderr


def _burn(seconds: float) -> None:
    """Busy Python for `seconds` of this thread's CPU time."""
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def test_the_write_budget_charges_the_cpu_of_the_write_s_threads_only():
    """cpu_time.Meter (issue 29 item 5), started on the writer thread: the writer's own CPU and that
    of a thread that starts and ends during the write (as Orbax's per-save loops do) are the
    write's; a thread that goes on working beside it (training, sweep's data prefetch, uploads) and
    the thread that trains are not."""
    import threading

    from sweep.host import cpu_time

    charged: list[float] = []
    stop_beside = threading.Event()

    def beside() -> None:  # a long-lived thread working through the write, like the data prefetch
        while not stop_beside.is_set():
            sum(range(1000))

    def write() -> None:
        meter = cpu_time.Meter(threading.get_native_id())
        _burn(0.2)  # the writer's own work
        loop = threading.Thread(target=_burn, args=(0.2,))  # started and joined within the write
        loop.start()
        loop.join()
        charged.append(meter.writer_seconds())

    other = threading.Thread(target=beside, daemon=True)
    other.start()
    try:
        writer = threading.Thread(target=write)
        writer.start()
        _burn(0.3)  # the training thread works meanwhile
        writer.join()
    finally:
        stop_beside.set()
        other.join()
    assert 0.35 <= charged[0] < 0.6, charged  # 0.2 + 0.2 of the write, not the 0.3 training nor beside's


def test_a_write_is_charged_the_longer_of_its_wall_and_cpu_time(tmp_path, monkeypatch):
    """A write that took 0.1 s of wall but used 2 s of CPU beside training (Orbax's threads, the
    hashing) is charged 2 s: the budget then rests 2 s x (1/share - 1)."""
    from sweep.checkpoints import folder as checkpoints
    from sweep.host import cpu_time

    monkeypatch.setattr(cpu_time.Meter, "writer_seconds", lambda self: 2.0)
    ckpt = checkpoints.TrialCheckpoints(tmp_path / "t", "val_loss", "minimize", keep_last=2, keep_best=1)
    try:
        ckpt.save((1, {"w": __import__("numpy").ones(4, "float32")}, {"val_loss": 1.0}))
        ckpt.wait()
        charged, _ = ckpt.budget.last_write
        assert charged == 2.0 and ckpt.written_seconds < 2.0
        assert ckpt.busy(0.5)  # rests 2 s x (1/0.5 - 1) = 2 s before the next write
    finally:
        ckpt.close()
