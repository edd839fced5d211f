"""train.devices: K: data-parallel trials over K devices (4 forced CPU devices here), resumable bit for bit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO, Running, checkpoint_dir, cli_env, kill9, snapshot, study_of, wait_for_checkpoint

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
        from sweep import compiled
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
    assert ("train.devices: must be at most the 1 cpu device(s) JAX sees "
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
