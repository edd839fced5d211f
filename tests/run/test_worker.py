"""The scheduler's decisions, in-process: skip finished trials, ask the missing ones, resume, adopt, retry, fail, time out.

The fast tier: a tiny linear-regression trial (40 steps) run by `worker.run` in this process;
interruptions set the `StopSignal` flag from the progress callback instead of sending a signal,
and a dead worker is a forged row in `sweep_claims`. Real processes and real kills are in the
slow tier (test_resume.py, test_workers.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import optuna
import pytest
from optuna.trial import TrialState

from conftest import (STEPS, checkpoint_dir, claim_rows, files, forge_claim, make_study, messages, run,
                      run_interrupted, saved_steps, snapshot, trials, write_trial)
from sweep.commands import status
from sweep.store import claims
from sweep.store.session import Session
from sweep.study import config as config_lib


@dataclasses.dataclass(frozen=True)
class Reference:
    study: dict[str, Any]
    snapshot: list[tuple[Any, ...]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """An uninterrupted run of the 3-trial study, in a workdir of its own."""
    root = tmp_path_factory.mktemp("reference")
    write_trial(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        study = make_study(root)
        run(study)
    return Reference(study, snapshot(study))


# --- skip and ask ----------------------------------------------------------------------------------


def test_run_of_a_finished_study_trains_nothing(reference, sweep_log):
    study = reference.study
    assert [(t[0], t[1]) for t in reference.snapshot] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    for number, _, _, value, reports, best_step, best_value, last_step, _ in reference.snapshot:
        # A trial's value is its best evaluation, and its best and last steps are on disk.
        assert list(reports) == [10, 20, 30, 40] and last_step == STEPS
        assert value == best_value == reports[best_step] == min(reports.values())
        assert {best_step, STEPS} <= set(saved_steps(checkpoint_dir(study, number)))
    on_disk = files(Path(study["workdir"]) / "checkpoints")

    run(study)

    assert snapshot(study) == reference.snapshot  # no new trial, nothing told again
    assert files(Path(study["workdir"]) / "checkpoints") == on_disk  # no checkpoint written or removed
    logged = messages(sweep_log)
    assert "trials 0-2: finished, skipped" in logged
    assert not [m for m in logged if "started" in m or "resumed" in m], logged


def test_raising_n_trials_adds_only_the_missing_trials(here, reference, sweep_log):
    study = make_study(here, n_trials=2)
    run(study)
    assert [(t.number, t.state) for t in trials(study)] == [(0, TrialState.COMPLETE), (1, TrialState.COMPLETE)]
    on_disk = {n: files(checkpoint_dir(study, n)) for n in (0, 1)}
    sweep_log.clear()

    study["n_trials"] = 3
    run(study)

    assert snapshot(study) == reference.snapshot  # trial 2 is the one an uninterrupted study has
    assert {n: files(checkpoint_dir(study, n)) for n in (0, 1)} == on_disk
    logged = messages(sweep_log)
    assert "trials 0-1: finished, skipped" in logged
    assert [m for m in logged if "started" in m] == [f"trial 2: started with params {reference.snapshot[2][2]}"]


# --- resume and adopt ------------------------------------------------------------------------------


def test_interrupted_trial_resumes_under_its_number_and_params_bit_identical(here, reference, sweep_log):
    study = make_study(here)
    run_interrupted(study, number=1, step=20)

    t0, t1 = trials(study)
    assert t0.state == TrialState.COMPLETE
    assert t1.state == TrialState.RUNNING and t1.params == reference.snapshot[1][2]  # never FAIL
    assert sorted(t1.intermediate_values) == [10, 20]
    folder = checkpoint_dir(study, 1)
    assert t1.user_attrs["checkpoint_dir"] == str(folder) and saved_steps(folder)[-1] == 20
    session = Session(config_lib.from_dict(study))
    try:  # its worker (this process's run) is gone: INTERRUPTED, not RUNNING
        assert [t["state"] for t in status.collect(session)["trials"]] == ["COMPLETE", "INTERRUPTED"]
    finally:
        session.close()
    sweep_log.clear()

    run(study)

    after = trials(study)
    assert [t.number for t in after] == [0, 1, 2]
    assert after[1].user_attrs["resumes"] == 1 and after[1].user_attrs["resumed_from"] == [20]
    assert after[1].user_attrs["checkpoint_dir"] == str(folder)
    assert [t.user_attrs["resumes"] for t in (after[0], after[2])] == [0, 0]
    assert snapshot(study) == reference.snapshot
    logged = messages(sweep_log)
    assert "trial 0: finished, skipped" in logged
    assert "trial 1: interrupted, will resume from its newest checkpoint, step 20" in logged
    assert "trial 1: resumed from step 20" in logged


def test_trial_of_a_dead_worker_on_this_host_is_adopted(here, reference, sweep_log):
    study = make_study(here)
    run_interrupted(study, number=2, step=20)
    # A worker of this host that no longer exists, with a heartbeat that looks fresh: on the same
    # host the process table decides, not the heartbeat.
    key = forge_claim(study, 2, f"{claims.HOST}/999999999/0", time.time())
    sweep_log.clear()

    run({**study, "timeout": 30})  # bounded: a scheduler that waited for the dead owner would return

    t2 = trials(study)[2]
    assert t2.number == 2 and t2.user_attrs["resumes"] == 1 and t2.user_attrs["resumed_from"] == [20]
    assert snapshot(study) == reference.snapshot
    assert key not in claim_rows(study)  # released once told
    assert "trial 2: interrupted, will resume from its newest checkpoint, step 20" in messages(sweep_log)


def test_trial_of_a_live_worker_is_left_alone_until_its_lease_expires(here, reference):
    study = make_study(here, parallel={"lease_grace_seconds": 60})
    run_interrupted(study, number=2, step=20)
    before, on_disk = trials(study)[2], files(checkpoint_dir(study, 2))
    parent = os.getppid()
    live_owners = [
        f"not-{claims.HOST}/1234/5678",  # another host, heartbeat within the grace
        f"{claims.HOST}/{parent}/{claims._start_time(parent)}",  # a live process of this host (owner format)
    ]
    for owner in live_owners:
        key = forge_claim(study, 2, owner, time.time())
        # Nothing to ask (3 trials exist) and nothing to adopt: it waits for the other worker, until the timeout.
        run({**study, "timeout": 0.5})
        after = trials(study)[2]
        assert after.state == TrialState.RUNNING, owner
        assert (after.params, after.intermediate_values, after.user_attrs) == (
            before.params, before.intermediate_values, before.user_attrs), owner
        assert files(checkpoint_dir(study, 2)) == on_disk, owner
        assert claim_rows(study)[key][0] == owner

    # The other host stopped renewing its claim longer ago than the grace: its trial is taken over.
    forge_claim(study, 2, live_owners[0], time.time() - 61)
    run({**study, "timeout": 30})  # bounded, as above
    t2 = trials(study)[2]
    assert t2.user_attrs["resumes"] == 1 and t2.user_attrs["resumed_from"] == [20]
    assert snapshot(study) == reference.snapshot


def test_copied_study_resumes_from_its_new_place(here, reference):
    old = make_study(here / "old")
    run_interrupted(old, number=1, step=20)
    new = make_study(here / "new")
    shutil.copytree(old["workdir"], new["workdir"])
    old_files = files(Path(old["workdir"]))

    run(new)

    assert files(Path(old["workdir"])) == old_files  # nothing written at the old place
    t1 = trials(new)[1]
    assert t1.user_attrs["resumed_from"] == [20] and t1.user_attrs["checkpoint_dir"] == str(checkpoint_dir(new, 1))
    assert saved_steps(checkpoint_dir(new, 1))[-1] == STEPS
    assert snapshot(new) == reference.snapshot


# --- retries, failures, timeout --------------------------------------------------------------------


def _fault_at(number: int, step: int) -> Callable[[int, int], None]:
    """An on_step that makes trial `number`'s evaluation at `step` raise, once (not saved: it resumes before)."""
    fired = []

    def on_step(n: int, s: int) -> None:
        if (n, s) == (number, step) and not fired:
            fired.append(s)
            Path("fault").touch()

    return on_step


def test_trial_that_raises_is_retried_from_its_newest_checkpoint_under_its_number(
        here, reference, sweep_log):
    study = make_study(here, n_trials=1, max_retries=1)
    run(study, on_step=_fault_at(0, 30))

    (t0,) = trials(study)
    assert t0.state == TrialState.COMPLETE and t0.user_attrs["failures"] == 1
    assert t0.user_attrs["resumed_from"] == [20]  # the newest checkpoint before the fault at step 30
    assert t0.user_attrs["resumes"] == 0  # a retry is not a resume after an interruption
    assert snapshot(study) == reference.snapshot[:1]  # every report once, the same bits
    failed = [m for m in messages(sweep_log) if m.startswith("Trial 0 failed with parameters")]
    assert len(failed) == 1 and "transient fault" in failed[0]
    assert failed[0].endswith("Retrying (1 of 1) from its newest checkpoint.")


def test_trial_that_raises_without_retries_fails_and_the_study_goes_on(here, reference, sweep_log):
    study = make_study(here, n_trials=2)  # max_retries: 0 by default
    run(study, on_step=_fault_at(0, 30))

    t0, t1 = trials(study)
    assert t0.state == TrialState.FAIL and t0.user_attrs["failures"] == 1
    assert sorted(t0.intermediate_values) == [10, 20] and "resumed_from" not in t0.user_attrs
    assert snapshot(study)[1] == reference.snapshot[1]  # the next trial as in a fault-free study
    assert not [m for m in messages(sweep_log) if "Retrying" in m]
    done, on_disk = snapshot(study), files(checkpoint_dir(study, 0))

    run(study)  # FAIL is finished: never trained again, no retry charged
    assert snapshot(study) == done and trials(study)[0].user_attrs["failures"] == 1
    assert files(checkpoint_dir(study, 0)) == on_disk


def test_nan_metric_fails_the_trial_at_once_without_retry(here, sweep_log):
    study = make_study(here, n_trials=1, max_retries=1)
    Path("nan").touch()
    run(study)

    (t0,) = trials(study)
    assert t0.state == TrialState.FAIL and t0.user_attrs["failures"] == 1
    assert t0.intermediate_values == {} and "resumed_from" not in t0.user_attrs  # a NaN is never reported
    failed = [m for m in messages(sweep_log) if m.startswith("Trial 0 failed")]
    assert len(failed) == 1 and "val_loss is nan at step 10 (non-finite)" in failed[0] and "Retrying" not in failed[0]


def test_timeout_starts_no_new_trial_after_it_and_a_rerun_finishes_the_rest(here, reference):
    study = make_study(here, timeout=2.0)
    slept: list[int] = []

    def slow_first_trial(n: int, s: int) -> None:
        # The timeout counts from before trial 0 started: sleeping that long in it outlasts the timeout.
        if n == 0 and not slept:
            slept.append(s)
            time.sleep(2.1)

    run(study, on_step=slow_first_trial)
    assert [(t.number, t.state) for t in trials(study)] == [(0, TrialState.COMPLETE)]  # finished, not cut off

    del study["timeout"]  # a key that steers the run: it may change between runs
    run(study)
    assert snapshot(study) == reference.snapshot


def test_a_storage_error_mid_trial_stops_the_run_and_never_fails_the_trial(here, reference):
    """A database error that outlived its retries (or no retry knew it: a failed commit) is the
    machine's fault, not the trial's: seen in the chaos campaign as a FAIL after a PostgreSQL restart."""
    from optuna.exceptions import StorageInternalError

    study = make_study(here, n_trials=1)  # max_retries 0: a trial fault would FAIL it at once

    def on_step(n: int, s: int) -> None:
        if (n, s) == (0, 30):
            raise StorageInternalError("An exception is raised during the commit.")

    with pytest.raises(StorageInternalError):
        run(study, on_step=on_step)
    (t0,) = trials(study)
    assert t0.state == TrialState.RUNNING and "failures" not in t0.user_attrs  # resumable, nothing charged
    run(study)
    assert snapshot(study) == reference.snapshot[:1]


def test_a_trial_asked_by_a_killed_process_before_its_first_suggest_is_adopted_with_a_random_sampler(here):
    """Killed between Optuna's ask and the first suggest: the trial is RUNNING without params. The
    next run adopts it and suggests through the study's cached storage, which did not know a trial
    another process created: KeyError (its id) where the sampler reads no trials first (random;
    seen in test_asha's random kills)."""
    study = make_study(here, sampler={"type": "random", "seed": 0})
    session = Session(config_lib.from_dict(study)).open(create=True)
    try:
        other = optuna.load_study(study_name=study["name"], storage=session.storage)
        assert other.ask().number == 0  # the killed process's ask: no params, no claim
    finally:
        session.close()
    run(study)
    found = trials(study)
    assert [t.state for t in found] == [TrialState.COMPLETE] * 3 and "learning_rate" in found[0].params
    reference = make_study(here, sampler={"type": "random", "seed": 0}, workdir=str(here / "reference"))
    run(reference)
    assert [t.params for t in found] == [t.params for t in trials(reference)]  # restart-proof: the same params
