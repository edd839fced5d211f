"""train.devices: K: data-parallel trials over K devices (4 forced CPU devices here), resumable bit for bit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import (gated_trial, REPO, Running, checkpoint_dir, cli_env, kill9, cli_here, snapshot, study_of,
                      wait_for_checkpoint)

pytestmark = pytest.mark.slow  # every test here starts real processes

FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
SETTINGS = dict(n_trials=1, sampler={"type": "random", "seed": 2}, pruner={"type": "none"},
                train={"steps": 3000, "eval_every": 100, "devices": 4}, checkpoint={"every_steps": 200})


def _run(study, env=FOUR) -> Running:
    proc = Running("run", study, cwd=study.parent, env=env)
    assert proc.finish() == 0, proc.stderr
    return proc


def test_four_device_trial_killed_and_resumed_equals_uninterrupted(write_study):
    reference = write_study("reference.yaml", name="ref", **SETTINGS)
    first = _run(reference)
    assert "trial 0: data parallel: each batch split over 4 devices, params replicated on 4" in first.stderr

    study = write_study(**SETTINGS)
    proc = Running("run", study, cwd=study.parent, env=FOUR)
    proc.wait_for(r"trial 0: data parallel")
    wait_for_checkpoint(checkpoint_dir(study, 0), 600)
    kill9(proc)
    killed_at = max(int(p.name) for p in checkpoint_dir(study, 0).iterdir() if p.name.isdigit())
    assert killed_at < 3000
    again = _run(study)
    assert f"trial 0: resumed from step {killed_at}" in again.stderr
    # logged from the restored state: Orbax restored it into the replicated sharding
    assert "trial 0: data parallel: each batch split over 4 devices, params replicated on 4" in again.stderr
    assert snapshot(study) == snapshot(reference)  # params, values, every report: bit for bit
    assert study_of(study).trials[0].user_attrs["resumes"] == 1


def test_window_all_reduces_gradients_over_four_devices():
    # The compiled training window really is data parallel: a sharded batch, an all-reduce of the
    # gradients, and replicated outputs (checked on XLA's compiled program).
    code = textwrap.dedent("""
        import jax, numpy as np
        from sweep.train import compiled
        from trials import digits_mlp as m
        hp = dict(m.HYPERPARAMETERS, batch_size=32)
        data = jax.device_put(m.data(hp), compiled.replicated(4))
        params = jax.device_put(m.init(hp, jax.random.PRNGKey(0), data), compiled.replicated(4))
        opt = jax.device_put(m.optimizer(hp).init(params), compiled.replicated(4))
        fn = compiled.FUNCTIONS.get(m, hp, ("learning_rate",), devices=4).window
        args = (params, opt, {}, np.float32(0), jax.random.PRNGKey(1), data, np.int32(0), np.int32(5),
                {"learning_rate": 1e-3})
        text = fn.lower(*args).compile().as_text()
        out = fn(*args)
        print("all-reduce" in text, {len(x.sharding.device_set) for x in jax.tree.leaves(out)})
    """)
    result = subprocess.run([sys.executable, "-c", code], env={**cli_env(), **FOUR}, cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "True {4}", result.stdout


def test_more_devices_than_jax_sees_is_a_study_file_error(write_study):
    study = write_study(**SETTINGS)
    proc = Running("run", study, cwd=study.parent, env={"XLA_FLAGS": ""})
    assert proc.finish() == 2
    assert ("train.devices: must be at most the 1 cpu device JAX sees "
            "(on the CPU: XLA_FLAGS=--xla_force_host_platform_device_count=4), got 4") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (study.parent / "runs").exists()


def test_batch_not_divisible_by_devices_is_a_study_error_before_anything_exists(write_study):
    study = write_study(**{**SETTINGS, "n_trials": 1, "fixed": {"batch_size": 30}})
    proc = Running("run", study, cwd=study.parent, env=FOUR)
    assert proc.finish() == 2, proc.stderr  # found by the check before anything is created
    assert "trials.digits_mlp's training step (batch, loss, optimizer) raised ValueError: train.devices: 4 " \
           "devices must divide the leading axis of every batch array, got shape (30, 64)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not Path(yaml.safe_load(study.read_text())["workdir"]).exists()


# Device slots (sweep/host/slots.py): each worker process trains on devices of its own.

SLOTS = dict(n_trials=4, sampler={"type": "random", "seed": 4}, pruner={"type": "none"},
             train={"steps": 400, "eval_every": 100}, checkpoint={"every_steps": 200})


def _intervals(study) -> dict[int, tuple[float, float]]:
    return {t.number: (t.datetime_start.timestamp(), t.datetime_complete.timestamp())
            for t in study_of(study).trials}


def test_n_jobs_2_x_devices_2_on_4_devices_trains_on_disjoint_slots_and_equals_one_process(write_study):
    settings = {**SLOTS, "train": {**SLOTS["train"], "devices": 2}}
    reference = write_study("reference.yaml", name="ref", **settings)
    assert Running("run", reference, "--n-jobs", "1", cwd=reference.parent, env=FOUR).finish() == 0
    study = write_study(**settings)
    proc = _run_jobs(study, "2")
    assert "2 workers on 4 cpu devices (XLA_FLAGS): cpu:0,cpu:1 | cpu:2,cpu:3" in proc.stderr
    trials = study_of(study).trials
    devices = {t.number: tuple(t.user_attrs["devices"]) for t in trials}
    assert all(len(d) == 2 for d in devices.values()), devices
    assert set(devices.values()) == {("cpu:0", "cpu:1"), ("cpu:2", "cpu:3")}  # both slots used
    spans = _intervals(study)
    overlapping = [(a, b) for a in spans for b in spans
                   if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
    assert overlapping, spans  # the two workers did train at the same time
    for a, b in overlapping:  # and trials that ran at the same time never shared a device
        assert not set(devices[a]) & set(devices[b]), (a, b, devices)
    status = json.loads(cli_here("status", study, "--json", cwd=study.parent).stdout)
    assert {t["number"]: tuple(t["devices"]) for t in status["trials"]} == devices
    assert "devices" in cli_here("status", study, cwd=study.parent).stdout.splitlines()[1]
    assert snapshot(study) == snapshot(reference)  # bit for bit as one process on cpu:0,cpu:1


def _run_jobs(study, n_jobs: str, env=FOUR, *extra: str) -> Running:
    proc = Running("run", study, "--n-jobs", n_jobs, *extra, cwd=study.parent, env=env)
    assert proc.finish() == 0, proc.stderr
    return proc


def test_n_jobs_4_worker_killed_mid_trial_its_slot_is_reused_and_study_equals_one_process(write_study, reference,
                                                                                         held):
    from conftest import _loky_children

    # Each process waits at its 3rd evaluation (step 7500, after its save at 5000) while `hold`
    # exists (tests/trials/gated.py): the victim is killed mid-trial on any machine.
    settings = dict(n_trials=5, sampler={"type": "random", "seed": 9}, pruner={"type": "none"},
                    train={"steps": 20000, "eval_every": 2500}, checkpoint={"every_steps": 5000})
    study = write_study(trial="gated_digits", **settings)
    gated_trial(study.parent, 3, name="gated_digits")
    hold = held(study.parent / "hold")
    proc = Running("run", study, "--n-jobs", "4", "--verbose", cwd=study.parent, env=FOUR)
    m = proc.wait_for(r"trial (\d+): on (cpu:[123])\n")  # a trial in a helper process (cpu:0 is this one's)
    number, slot = int(m.group(1)), m.group(2)
    victim = int(proc.wait_for(rf"worker process (\d+): devices {slot}\n").group(1))
    wait_for_checkpoint(checkpoint_dir(study, number), 5000, proc=proc)
    assert victim in _loky_children(proc.proc.pid)
    mark = len(proc.lines)
    os.kill(victim, signal.SIGKILL)
    hold.unlink()
    assert proc.finish() == 0, proc.stderr
    after = "".join(proc.lines[mark:])
    assert "a worker process died" in after
    replacement = re.search(rf"worker process (\d+): devices {slot}\n", after)
    # a new process runs a worker on the same slot (whether a trial is left for it is a race)
    assert replacement and int(replacement.group(1)) != victim, after
    assert f"trial {number}: resumed from step" in after
    assert {d for t in study_of(study).trials for d in t.user_attrs["devices"]} <= {f"cpu:{i}" for i in range(4)}
    assert snapshot(study) == reference(**settings)  # one process on one device: the same numbers


def test_trials_per_device_2_packs_n_jobs_auto_4_workers_on_2_devices(write_study):
    study = write_study(**{**SLOTS, "parallel": {"n_jobs": "auto", "trials_per_device": 2}})
    proc = Running("run", study, cwd=study.parent, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert proc.finish() == 0, proc.stderr
    assert "4 workers on 2 cpu devices (XLA_FLAGS): cpu:0 | cpu:1 | cpu:0 | cpu:1" in proc.stderr
    trials = study_of(study).trials
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert {tuple(t.user_attrs["devices"]) for t in trials} <= {("cpu:0",), ("cpu:1",)}


def test_n_jobs_3_x_devices_2_on_4_devices_is_a_study_file_error_before_anything_exists(write_study):
    study = write_study(**{**SLOTS, "train": {**SLOTS["train"], "devices": 2}, "parallel": {"n_jobs": 3}})
    proc = Running("run", study, cwd=study.parent, env=FOUR)
    assert proc.finish() == 2
    assert ("study.yaml: parallel.n_jobs: 3 workers x train.devices 2 need 6 cpu devices, the host has 4: at most "
            "2 workers (n_jobs: auto), or let workers share devices (parallel.trials_per_device), got 3") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not Path(yaml.safe_load(study.read_text())["workdir"]).exists()
