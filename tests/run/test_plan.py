"""`plan`, in-process: what `run` would do, in sentences, and the removals the study's disk budget
(keep_trials, max_disk) would make at the next run, listed without removing anything."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import checkpoint_dir, cli, files, make_study, run, saved_steps, write
from sweep.checkpoints import retention
from sweep.store.session import Session
from sweep.study import config as config_lib


def plan_lines(capsys, study, root: Path) -> list[str]:
    capsys.readouterr()  # what a run before it logged
    code, out, err = cli(capsys, "plan", write(study, root))
    assert code == 0 and err == "", err
    return [line for line in out.splitlines() if not line.startswith("  note:")]  # the sampler's notes


SAVES = ("  saves:   every 20 steps or every 300 s (whichever comes first; 300 s is every_seconds' default, "
         "`every_seconds: null` saves by steps alone), exactly, and at the last step")


def test_plan_reads_as_sentences_with_singular_and_plural(here, capsys):
    one = make_study(here, n_trials=1)
    url = f"sqlite:///{one['workdir']}/study.db"
    assert plan_lines(capsys, one, here) == [
        f"study sched ({url}): not created yet",
        "  new:     trial 0, sampled by tpe",
        SAVES,
        "run would create the study and train 1 trial",
    ]
    assert plan_lines(capsys, {**one, "n_trials": 3}, here)[1:] == [
        "  new:     trials 0-2, sampled by tpe",
        SAVES,
        "run would create the study and train 3 trials",
    ]
    run(one)
    assert plan_lines(capsys, one, here) == [
        f"study sched ({url}): 1 of 1 trial finished",
        "  skip:    trial 0, finished (COMPLETE)",
        "run would do nothing: the study is finished (raise n_trials to add trials)",
    ]
    lines = plan_lines(capsys, {**one, "n_trials": 2}, here)
    assert lines[0] == f"study sched ({url}): 1 of 2 trials finished"
    assert lines[2:] == ["  new:     trial 1, sampled by tpe", SAVES, "run would start 1 new trial"]
    run({**one, "n_trials": 2})
    lines = plan_lines(capsys, {**one, "n_trials": 4}, here)
    assert lines[1:] == ["  skip:    trials 0-1, finished (2 COMPLETE)", "  new:     trials 2-3, sampled by tpe",
                         SAVES, "run would start 2 new trials"]
    for line in lines:
        assert "(s)" not in line


def test_plan_says_whether_every_seconds_is_its_default_beside_every_steps(here, capsys):
    study = make_study(here, n_trials=1)
    saves = lambda checkpoint: [line for line in plan_lines(  # noqa: E731
        capsys, {**study, "checkpoint": {**study["checkpoint"], **checkpoint}}, here) if "saves:" in line]
    assert saves({}) == [SAVES]  # every_steps alone: the default seconds are named as a default
    assert saves({"every_seconds": None}) == ["  saves:   every 20 steps, exactly, and at the last step"]
    assert saves({"every_seconds": 60}) == [
        "  saves:   every 20 steps or every 60 s (whichever comes first), exactly, and at the last step"]


def _removals(study):
    session = Session(config_lib.from_dict(study)).open(create=False)
    try:
        return retention.planned(session), retention.study_bytes(session)
    finally:
        session.close()


def test_plan_lists_what_keep_trials_will_remove_and_removes_nothing(here, capsys):
    study = make_study(here, n_trials=3)
    run(study)
    budget = {**study, "checkpoint": {**study["checkpoint"], "keep_trials": 1}}
    before = files(here / "runs")
    lines = plan_lines(capsys, budget, here)
    assert files(here / "runs") == before  # nothing removed, nothing written
    planned, used = _removals(budget)
    assert len(planned) == 2 and {r.kind for r in planned} == {"trial"}
    for r in planned:
        assert r.steps == saved_steps(checkpoint_dir(study, r.number)) and r.bytes > 0
        head, last = ", ".join(map(str, r.steps[:-1])), r.steps[-1]
        steps = f"step {last}" if len(r.steps) == 1 else f"steps {head} and {last}"
        assert (f"  remove:  the checkpoints of trial {r.number} ({steps}, "
                f"{retention.size_text(r.bytes)}), by keep_trials 1: not the best COMPLETE trial") in lines
    total = sum(r.bytes for r in planned)
    assert lines[-1] == (f"run would remove the checkpoints of 2 trials ({retention.size_text(total)}) and train "
                         "nothing: the study is finished (raise n_trials to add trials)")
    run(budget)  # what plan listed is what run removes, to the byte
    gone = {r.number for r in planned}
    assert all(not checkpoint_dir(study, n).exists() for n in gone)
    assert all(checkpoint_dir(study, n).exists() for n in {0, 1, 2} - gone)
    assert _removals(budget) == ([], used - total)
    assert not any(line.startswith("  remove:") for line in plan_lines(capsys, budget, here))


def test_plan_lists_the_steps_max_disk_will_strip(here, capsys):
    study = make_study(here, n_trials=3)
    run(study)
    _, used = _removals(study)
    budget = {**study, "checkpoint": {**study["checkpoint"], "max_disk": used - 1}}  # one step must go
    before = files(here / "runs")
    lines = plan_lines(capsys, budget, here)
    assert files(here / "runs") == before
    planned, _ = _removals(budget)
    (r,) = planned
    kept = saved_steps(checkpoint_dir(study, r.number))
    assert r.kind == "steps" and len(r.steps) == 1 and r.steps[0] in kept
    line = next(line for line in lines if line.startswith("  remove:"))
    size = re.escape(retention.size_text(r.bytes))
    assert re.fullmatch(rf"  remove:  step {r.steps[0]} of trial {r.number} \({size}\), "
                        rf"by max_disk [\d.]+ [KMG]?B: all but its best step \d+", line), line
    assert lines[-1].startswith(f"run would remove 1 step of trial {r.number} (")
    run(budget)
    assert saved_steps(checkpoint_dir(study, r.number)) == [s for s in kept if s not in r.steps]
