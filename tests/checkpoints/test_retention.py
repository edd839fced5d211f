"""The study's disk budget (sweep/checkpoints/retention.py), in-process: keep_trials, max_disk, removal that a
kill cuts short, a reader holding a folder. Two real worker processes are in test_workers.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from conftest import checkpoint_dir, make_study, run, saved_steps, trials
from sweep.checkpoints import retention
from sweep.commands import export as export_lib
from sweep.commands import status
from sweep.errors import DiskFault
from sweep.store.session import Session
from sweep.study import config as config_lib


def opened(study: dict[str, Any]) -> Session:
    return Session(config_lib.from_dict(study)).open(create=False)


def top(study: dict[str, Any], k: int, finished: set[int] | None = None) -> set[int]:
    """The k best COMPLETE trials (of `finished` only, if given), in the study's direction."""
    sign = 1 if study["objective"]["direction"] == "minimize" else -1
    complete = [t for t in trials(study) if t.state == TrialState.COMPLETE
                and (finished is None or t.number in finished)]
    return {t.number for t in sorted(complete, key=lambda t: (sign * t.value, t.number))[:k]}


def folders(study: dict[str, Any]) -> set[int]:
    root = Path(study["workdir"]) / "checkpoints"
    return {int(p.name[len("trial_"):]) for p in root.iterdir() if p.name.startswith("trial_") and p.name[-1].isdigit()}


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_keep_trials_keeps_exactly_the_k_best_finished_trials_as_they_finish(here, direction):
    study = make_study(here, n_trials=5, checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": 2},
                       objective={"metric": "val_loss", "direction": direction})
    seen = {}

    def on_step(number: int, step: int) -> None:
        # As each trial starts: the folders there are (those of trials before it, all finished).
        if step == 0 and number not in seen:
            seen[number] = folders(study) - {number}

    run(study, on_step=on_step)
    assert sorted(seen) == list(range(5))
    for number, present in seen.items():  # the 2 best of the trials finished before it, no more
        assert present == top(study, 2, set(range(number))), (number, present)
    assert folders(study) == top(study, 2)
    session = opened(study)
    try:
        report = status.collect(session)
        for entry in report["trials"]:
            if entry["number"] in top(study, 2):
                assert entry["checkpoint_dir"] and entry["checkpoints_removed"] is None
            else:
                assert entry["checkpoint_dir"] is None
                assert "keep_trials 2: not among the 2 best COMPLETE trials" in entry["checkpoints_removed"]
        assert "removed" in status.table(report)
        gone = min(set(range(5)) - top(study, 2))
        with pytest.raises(retention.CheckpointsRemoved, match=rf"trial {gone}: its checkpoints at .* were removed "
                                                               r"by the study's disk budget \(keep_trials 2"):
            export_lib.export(session, here / "one", trial=gone)
        index = export_lib.export(session, here / "all")
    finally:
        session.close()
    assert {e["number"] for e in index["trials"]} == top(study, 2)
    assert set(index["removed"]) == {str(n) for n in set(range(5)) - top(study, 2)}
    assert sorted(p.name for p in (here / "all").iterdir()) == sorted(
        ["index.json", *(f"trial_{n:04d}" for n in top(study, 2))])


def test_removal_cut_short_by_a_kill_is_finished_by_the_next_run(here):
    # The two states a kill can leave: the intent recorded but the folder still in place, and the
    # folder renamed and half deleted. The next run finishes both; export reads only whole trials.
    study = make_study(here, n_trials=3, checkpoint={"every_steps": 20, "keep_last": 2})
    run(study)
    worst = max(trials(study), key=lambda t: t.value).number
    middle = (set(range(3)) - top(study, 1) - {worst}).pop()
    session = opened(study)
    try:
        session.set_study_attr(f"{retention.REMOVED_ATTR}{worst}", "keep_trials 1: (a kill came next)")
        doomed = checkpoint_dir(study, middle)
        half = doomed.with_name(f".{doomed.name}.removing")
        os.rename(doomed, half)
        victim = next(p for p in half.rglob("*") if p.is_file())
        victim.unlink()
        session.set_study_attr(f"{retention.REMOVED_ATTR}{middle}", "keep_trials 1: (a kill came next)")
    finally:
        session.close()
    run({**study, "checkpoint": {**study["checkpoint"], "keep_trials": 1}})
    assert folders(study) == top(study, 1)
    assert not [p for p in (Path(study["workdir"]) / "checkpoints").iterdir() if p.name.endswith(".removing")]
    session = opened(study)
    try:
        index = export_lib.export(session, here / "out")
    finally:
        session.close()
    assert [e["number"] for e in index["trials"]] == sorted(top(study, 1))


def test_a_folder_being_read_is_not_removed_until_the_reader_is_done(here):
    study = make_study(here, n_trials=2, checkpoint={"every_steps": 20, "keep_last": 2})
    run(study)
    loser = max(trials(study), key=lambda t: t.value)
    folder = checkpoint_dir(study, loser.number)
    session = opened(study)
    try:
        with retention.reading(folder, loser.number):
            assert retention.remove_trial(session, None, loser, folder, "test") == 0
            assert folder.exists()
        assert retention.remove_trial(session, None, loser, folder, "test") > 0
        assert not folder.exists()
        with pytest.raises(retention.CheckpointsRemoved, match="removed by the study's disk budget \\(test\\)"):
            with retention.reading(folder, loser.number, "test"):
                pass
    finally:
        session.close()


def test_max_disk_strips_finished_trials_to_their_best_step_and_refuses_a_save_beyond_it(here):
    study = make_study(here, n_trials=2, checkpoint={"every_steps": 10, "keep_last": 3, "max_write_share": None})
    run({**study, "n_trials": 1})
    one_trial = retention.folder_bytes(Path(study["workdir"]) / "checkpoints")
    steps = saved_steps(checkpoint_dir(study, 0))
    assert len(steps) >= 3
    # Room for trial 0 stripped to its best step plus trial 1 at its peak (keep_last + 1 steps).
    per_step = one_trial // len(steps)
    cap = int(per_step * 5.5)
    study["checkpoint"]["max_disk"] = cap
    run(study)
    t0, t1 = trials(study)
    assert t1.state == TrialState.COMPLETE
    assert saved_steps(checkpoint_dir(study, 0)) == [t0.user_attrs["best_step"]]
    assert retention.folder_bytes(Path(study["workdir"]) / "checkpoints") <= cap

    # A third trial cannot fit beside them (once trial 1 is stripped too): refused before a save,
    # not a full disk; the trial stays resumable and finishes once the cap is raised.
    study["n_trials"], study["checkpoint"]["max_disk"] = 3, retention.folder_bytes(
        Path(study["workdir"]) / "checkpoints") + per_step // 2
    with pytest.raises(DiskFault, match=r"trial 2: cannot write its checkpoint of step \d+ to .*trial_0002: "
                                        r"checkpoint.max_disk .* would be exceeded .* stays resumable"):
        run(study)
    assert trials(study)[2].state == TrialState.RUNNING and max(saved_steps(checkpoint_dir(study, 2))) < 40
    assert saved_steps(checkpoint_dir(study, 1)) == [t1.user_attrs["best_step"]]
    study["checkpoint"]["max_disk"] = "1GB"
    run(study)
    assert trials(study)[2].state == TrialState.COMPLETE


def test_a_run_makes_its_final_pass_only_where_a_trial_finished_meanwhile(here, monkeypatch):
    """The pass as a run ends (a host's stale copies, test_remote) reads every trial: a run of a
    finished study makes only its start's pass; a run that finished trials makes its final one."""
    study = make_study(here, n_trials=2, checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": 1})
    passes: list[int] = []
    real = retention.enforce

    def counted(session: Session, *args: Any, **kwargs: Any) -> Any:
        passes.append(len(session.trials()))
        return real(session, *args, **kwargs)

    monkeypatch.setattr(retention, "enforce", counted)
    run(study)
    assert passes == [0, 1, 2, 2]  # the start's, after each trial, the final one
    passes.clear()
    run(study)  # finished: nothing to train, nothing finished since the start's pass
    assert passes == [2]
