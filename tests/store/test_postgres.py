"""Many workers, one study on PostgreSQL: each trial once, and a dead worker's trial taken over
after its lease grace (other hosts are played with SWEEP_HOST on this one machine)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import Running, checkpoint_dir, kill9, run_cli, snapshot, study_of, wait_for_checkpoint

pytestmark = pytest.mark.slow  # every test here starts real processes

RANDOM = {"sampler": {"type": "random", "seed": 3}, "pruner": {"type": "none"}}


def test_four_workers_on_one_postgres_study_run_each_trial_once(write_study, postgres_url, reference):
    study = write_study(storage=postgres_url, n_trials=8, **RANDOM)
    procs = [Running("run", study, cwd=study.parent, env={"SWEEP_HOST": f"host{i}"}) for i in range(4)]
    assert [p.finish() for p in procs] == [0] * 4, [p.stderr[-2000:] for p in procs]
    started = sorted(int(n) for p in procs for n in re.findall(r"trial (\d+): started", p.stderr))
    assert started == list(range(8))  # each trial run by exactly one worker, once
    trials = study_of(study).trials
    assert [t.number for t in trials] == list(range(8)) and all(t.state.name == "COMPLETE" for t in trials)
    assert snapshot(study) == reference(n_trials=8, **RANDOM)  # = one SQLite process, bit for bit


def test_a_dead_hosts_trial_is_taken_over_after_the_lease_grace(write_study, postgres_url, reference):
    grace = 4.0
    # Saves are sparse: a save (~0.05-0.2 s here) outlasts 1000 steps, so a 1000-step cadence made
    # the two full runs of this trial (reference, takeover) mostly checkpoint writing.
    settings = dict(n_trials=1, train={"steps": 100000, "eval_every": 500},
                    checkpoint={"every_steps": 10000}, **RANDOM)
    study = write_study(storage=postgres_url, parallel={"lease_grace_seconds": grace}, **settings)
    first = Running("run", study, cwd=study.parent, env={"SWEEP_HOST": "host-a"})
    first.wait_for(r"trial 0: started")
    wait_for_checkpoint(checkpoint_dir(study, 0), 10000)
    kill9(first)
    killed_at = time.monotonic()
    kept = max(int(p.name) for p in checkpoint_dir(study, 0).iterdir() if p.name.isdigit())
    second = Running("run", study, cwd=study.parent, env={"SWEEP_HOST": "host-b"})
    assert "trial 0: complete" not in first.stderr, "the trial ended before the kill: make it longer"
    assert second.finish() == 0, second.stderr
    m = second.wait_for(r"trial 0: resumed from step (\d+)", timeout=1)
    assert int(m.group(1)) == kept  # same number, from the newest checkpoint
    took_over = second.times[next(i for i, line in enumerate(second.lines) if "resumed from step" in line)]
    # Not before host-a's lease ran out: it runs from host-a's last heartbeat (every grace / 4),
    # which came up to one beat before the kill.
    assert took_over - killed_at >= grace - grace / 4
    assert "trial 0: started" not in second.stderr
    trial = study_of(study).trials[0]
    assert trial.user_attrs["resumes"] == 1
    assert snapshot(study) == reference(parallel={"lease_grace_seconds": grace}, **settings)


def restart_postgres() -> None:
    """Restart the local PostgreSQL server: every connection is cut, the server away for seconds."""
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions or shutil.which("pg_ctlcluster") is None:
        pytest.skip("restarting the local PostgreSQL server needs Debian's pg_ctlcluster")
    result = subprocess.run(["pg_ctlcluster", versions[-1], "main", "restart"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.restarts_postgres
def test_a_postgres_restart_mid_trial_is_waited_for_and_the_study_stays_bit_identical(
        write_study, postgres_url, reference):
    settings = dict(n_trials=2, train={"steps": 3000, "eval_every": 50}, checkpoint={"every_steps": 500}, **RANDOM)
    study = write_study(storage=postgres_url, **settings)
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    wait_for_checkpoint(checkpoint_dir(study, 0), 500)
    restart_postgres()
    assert proc.finish() == 0, proc.stderr
    assert "the study's database is unreachable" in proc.stderr and "the study's database is back after" \
        in proc.stderr, proc.stderr
    trials = study_of(study).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and not any("failures" in t.user_attrs
                                                                                for t in trials)
    assert snapshot(study) == reference(**settings)


def test_a_frozen_worker_that_lost_its_trial_leaves_it_and_writes_nothing_more(write_study, postgres_url, reference):
    grace = 3.0
    settings = dict(n_trials=1, train={"steps": 8000, "eval_every": 50}, checkpoint={"every_steps": 1000}, **RANDOM)
    study = write_study(storage=postgres_url, parallel={"lease_grace_seconds": grace}, **settings)
    first = Running("run", study, cwd=study.parent, env={"SWEEP_HOST": "host-a"})
    first.wait_for(r"trial 0: started")
    wait_for_checkpoint(checkpoint_dir(study, 0), 1000)
    os.kill(first.proc.pid, signal.SIGSTOP)  # frozen: a paused VM, a stalled NFS client
    try:
        second = Running("run", study, cwd=study.parent, env={"SWEEP_HOST": "host-b"})
        second.wait_for(r"trial 0: resumed from step \d+")  # after host-a's lease grace
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    assert first.finish() == 0, first.stderr  # it goes on with the study (nothing left) and exits 0
    assert second.finish() == 0, second.stderr
    assert re.search(r"trial 0 was taken over by host-b while this worker was unresponsive \(\d+ s since its last "
                     r"heartbeat\); leaving it, writing nothing more for it", first.stderr), first.stderr
    assert "trial 0: complete" not in first.stderr and "Traceback" not in first.stderr
    trial = study_of(study).trials[0]
    assert trial.state.name == "COMPLETE" and "failures" not in trial.user_attrs and trial.user_attrs["resumes"] == 1
    assert snapshot(study) == reference(parallel={"lease_grace_seconds": grace}, **settings)


def test_a_database_that_does_not_exist_is_a_clear_error_leaving_nothing_behind(write_study, postgres_url):
    study = write_study(storage=postgres_url.rsplit("/", 1)[0] + "/no_such_database_here")
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 1 and "cannot open storage" in result.stderr and "no_such_database_here" \
        in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "unreachable" not in result.stderr
    assert not Path(yaml.safe_load(study.read_text())["workdir"]).exists()  # no folder, no lock file
