"""Workers of one study that need the same program compile it once: the first holds the program's
compile lock while it compiles and writes the persistent cache, the others wait and read it
(sweep/train/compile_events.py). Real processes on 4 forced CPU devices, an empty cache."""

from __future__ import annotations

import re

import pytest

from conftest import gated_trial, Running, snapshot, study_of

pytestmark = pytest.mark.slow  # real processes

FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
# One program for every trial: the learning rate is traced, the shapes are fixed.
ONE_SHAPE = dict(n_trials=4, sampler={"type": "random", "seed": 3}, pruner={"type": "none"},
                 search_space={"learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
                 fixed={"batch_size": 32, "hidden": 32}, train={"steps": 100, "eval_every": 50},
                 checkpoint={"every_steps": 100})
COUNTS = re.compile(r"trial (\d+): XLA compilations \d+ \(window (\d+), evaluate (\d+);")


def test_four_workers_of_one_shape_compile_its_window_once_and_read_the_others_from_the_cache(
        write_study, held, tmp_path):
    study = write_study(trial="gated_shared", **ONE_SHAPE)
    # Each trial waits at its first evaluation while `hold` exists, after its window compiled: no
    # worker can take a second trial, so the 4 trials run in the 4 workers, whatever the load.
    gated_trial(study.parent, 1, name="gated_shared")
    hold = held(study.parent / "hold")
    env = {**FOUR, "SWEEP_COMPILATION_CACHE": str(tmp_path / "empty_cache")}  # not the tests' shared one
    proc = Running("run", study, "--n-jobs", "auto", "--verbose", cwd=study.parent, env=env)
    proc.wait_for(r"trial \d+: on cpu:\d\n", count=4)
    hold.unlink()
    assert proc.finish() == 0, proc.stderr
    assert "4 workers on 4 cpu devices (XLA_FLAGS): cpu:0 | cpu:1 | cpu:2 | cpu:3" in proc.stderr
    trials = study_of(study).trials
    assert sorted(t.user_attrs["devices"][0] for t in trials) == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    windows = {int(n): int(w) for n, w, _ in COUNTS.findall(proc.stderr)}
    assert sorted(windows) == [0, 1, 2, 3], proc.stderr
    assert sum(windows.values()) == 1, windows  # one compile of the window; 3 executables from the cache
    assert sum(t.user_attrs["compiles"]["cache_hits"] for t in trials) >= 3
    assert all(t.state.name == "COMPLETE" for t in trials)


def test_the_numbers_of_workers_sharing_a_compile_equal_one_process(write_study, tmp_path):
    # An executable compiled by another worker for another device computes the same bits.
    settings = {**ONE_SHAPE, "train": {"steps": 200, "eval_every": 50}}
    reference = write_study("reference.yaml", name="ref", **settings)
    one = Running("run", reference, "--n-jobs", "1", cwd=reference.parent,
                  env={**FOUR, "SWEEP_COMPILATION_CACHE": str(tmp_path / "cache_one")})
    assert one.finish() == 0, one.stderr
    study = write_study(**settings)
    four = Running("run", study, "--n-jobs", "auto", cwd=study.parent,
                   env={**FOUR, "SWEEP_COMPILATION_CACHE": str(tmp_path / "cache_four")})
    assert four.finish() == 0, four.stderr
    assert snapshot(study) == snapshot(reference)
