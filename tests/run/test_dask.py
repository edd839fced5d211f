"""parallel.backend: dask: the workers run on a real Dask cluster (distributed.LocalCluster) through joblib."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from conftest import Running, checkpoint_dir, run_cli, snapshot, study_of, wait_for_checkpoint
from tests.trials.files import write_trial

distributed = pytest.importorskip("distributed")  # in the `test` extra; CI installs it

pytestmark = pytest.mark.slow  # every test here starts real processes

SETTINGS = dict(n_trials=4, sampler={"type": "random", "seed": 11}, pruner={"type": "none"})


def trained_pids(folder: Path) -> set[int]:
    """The processes that trained (tests/trials/digits_recording.py logs each step's pid): the
    cluster's workers, not the CLI (which only evaluates the best checkpoint for its summary)."""
    return {int(line.split(" ", 1)[0]) for line in (folder / "pids.txt").read_text().splitlines()}


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as local:
        with distributed.Client(local) as client:
            yield local.scheduler_address, set(client.run(os.getpid).values())


def test_dask_backend_sigterm_checkpoints_on_the_cluster_and_resumes(write_study, reference, cluster, held):
    address, _ = cluster
    # Each worker waits at its 3rd evaluation (step 3000, after its save at 2000) while `hold`
    # exists (tests/trials/gated.py; an absolute path: the cluster's workers run elsewhere), so
    # trial 0 cannot end before the stop reaches it, on any machine.
    settings = dict(SETTINGS, n_trials=2, train={"steps": 20000, "eval_every": 1000},
                    checkpoint={"every_steps": 2000})
    study = write_study(trial="gated_dask", parallel={"n_jobs": 2, "backend": "dask", "address": address},
                        **settings)
    hold = held(study.parent / "hold")
    write_trial(study.parent, "gated_dask", "gated", AT=3, HOLD=str(hold))
    proc = Running("run", study, cwd=study.parent)
    wait_for_checkpoint(checkpoint_dir(study, 0), 2000, proc=proc)
    proc.signal(signal.SIGTERM)
    # Released once the run took the signal (it forwards it to the workers through a
    # distributed.Event within 0.1 s; a released worker has 17 windows and 8 saves to go).
    proc.wait_for(r"signal 15 received")
    hold.unlink()
    assert proc.finish(timeout=120) == 143, proc.stderr
    steps = [int(p.name) for p in checkpoint_dir(study, 0).iterdir() if p.name.isdigit()]
    assert steps and max(steps) < 20000  # stopped mid-trial, on the cluster, with a checkpoint
    again = run_cli("run", study, cwd=study.parent)
    assert again.returncode == 0, again.stderr
    assert "study t: 2/2 trials finished" in again.stdout
    assert snapshot(study) == reference(**settings)


def test_dask_backend_unreachable_scheduler_is_a_clear_error(write_study):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    study = write_study(parallel={"n_jobs": 2, "backend": "dask", "address": f"tcp://127.0.0.1:{port}"})
    result = run_cli("run", study, cwd=study.parent, timeout=120)
    assert result.returncode == 1, result.stderr
    assert f"parallel.address: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not Path(study.parent / "runs").exists()  # nothing written before the cluster answered


def test_dask_backend_runs_trials_on_the_cluster_one_worker_per_device_and_equals_one_process(write_study, reference):
    # Two Dask workers of two threads, each with one "device" (dask-cuda's one worker per GPU, here
    # on CPUs): resources {device: 1} put the two sweep workers on two Dask workers, never two on one.
    # Every step is trained by the cluster's workers (none in the CLI's process), and the study
    # equals one process's bit for bit (random sampler: params and values).
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                                  silence_logs=40, resources={"device": 1}) as local:
        with distributed.Client(local) as client:
            worker_pids = set(client.run(os.getpid).values())
        study = write_study(trial="pid_trial", **SETTINGS,
                            parallel={"n_jobs": 2, "backend": "dask", "address": local.scheduler_address,
                                      "resources": {"device": 1}})
        write_trial(study.parent, "pid_trial", "digits_recording", LOG="pids.txt")
        result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert f"running 2 workers on the Dask cluster at {local.scheduler_address}" in result.stderr
    assert "each with resources {'device': 1.0}" in result.stderr
    assert "study t: 4/4 trials finished (4 complete" in result.stdout
    pids = trained_pids(study.parent)
    assert pids == worker_pids, (pids, worker_pids)  # both Dask workers trained: one sweep worker each
    assert all(t.user_attrs["devices"] == ["cpu:0"] for t in study_of(study).trials)
    assert snapshot(study) == reference(**SETTINGS)
