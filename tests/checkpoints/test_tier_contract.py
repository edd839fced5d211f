"""The checkpoint tier contract (sweep/checkpoints/tiers.py) from the outside: a toy tier in the test
folder (tests/checkpoints/mirror_tier.py, a second local folder as a mirror) registered by the study
file alone, run through the real CLI: steps are committed to it, and a trial whose local folder is
gone is taken over from it, verified, ending bit-identical to an uninterrupted study. A tier the
file names wrongly is refused with exit 2 before anything is written."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from conftest import checkpoint_dir, cli, gated_trial, kill9, cli_here, run_cli, Running, snapshot, study_of
from sweep.words import numbered

MIRROR = "tests.checkpoints.mirror_tier:MirrorTier"


def tiered(mirror: Path, path: str = MIRROR, remote: str | None = None) -> dict:
    return {"checkpoint": {"tiers": {"mirror": path}, "remote": remote or f"mirror://{mirror}"}}


def mirrored(mirror: Path, trial: str) -> list[int]:
    """The steps of `trial` committed to the mirror (its commit marks), of the one study in it."""
    marks = list(mirror.glob(f"*/marks/{trial}"))
    return sorted(int(p.name) for p in marks[0].iterdir() if p.name.isdigit()) if marks else []


def wait_for_mirrored(mirror: Path, trial: str, min_step: int, proc: Running, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.proc.poll() is None:
        steps = mirrored(mirror, trial)
        if steps and steps[-1] >= min_step:
            return steps[-1]
        time.sleep(0.005)
    raise AssertionError(f"no step >= {min_step} of {trial} committed to {mirror}; stderr:\n{proc.stderr}")


@pytest.mark.slow
def test_a_tier_from_the_test_folder_commits_and_a_trial_is_taken_over_from_it(write_study, reference, tmp_path,
                                                                                 held):
    mirror = tmp_path / "mirror"
    # Held at the process's 17th evaluation (trial 0's 12, then trial 1's at step 250, after its
    # save at 200): the mirror's upload of step 200 (a background thread) cannot lag past trial 1's
    # end, however loaded the machine.
    study = write_study(trial=gated_trial(tmp_path, 17), **tiered(mirror))
    hold = held(tmp_path / "hold")
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 1: started")
    wait_for_mirrored(mirror, "trial_0001", 200, proc)
    kill9(proc)
    hold.unlink()
    assert study_of(study).trials[1].state.name == "RUNNING"
    committed = mirrored(mirror, "trial_0001")
    shutil.rmtree(checkpoint_dir(study, 1).parent)  # every local checkpoint: this host's disk is new

    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert f"trial 1: fetched {numbered('step', committed)} from mirror://{mirror}" in result.stderr
    assert f"trial 1: resumed from step {committed[-1]}" in result.stderr  # the mirror's newest, restored verified
    assert snapshot(study) == reference()
    # The mirror follows the local folders' retention: it holds what they keep (trial 0, finished
    # before the kill, is kept only in the mirror now).
    assert mirrored(mirror, "trial_0000") and not checkpoint_dir(study, 0).exists()
    for number in (1, 2, 3):
        local = sorted(int(p.name) for p in checkpoint_dir(study, number).iterdir() if p.name.isdigit())
        assert mirrored(mirror, f"trial_{number:04d}") == local
    shown = json.loads(cli_here("status", study, "--json", cwd=study.parent).stdout)
    assert [t["remote_step"] for t in shown["trials"]] == [mirrored(mirror, f"trial_{n:04d}")[-1] for n in range(4)]


@pytest.mark.parametrize("path, remote, key, rule", [
    (MIRROR, "gs://bucket/x", "checkpoint.remote", "must be s3://bucket/prefix .* or a URL of a scheme named in "
                                                   "checkpoint.tiers \\(mirror\\)"),
    ("tests.checkpoints.no_such_tier:MirrorTier", None, "checkpoint.tiers.mirror", "cannot import module"),
    ("tests.checkpoints.mirror_tier:NoSuchTier", None, "checkpoint.tiers.mirror",
     "must name a checkpoint tier class .*: module tests.checkpoints.mirror_tier has no class NoSuchTier"),
    ("tests.checkpoints.mirror_tier:NotATier", None, "checkpoint.tiers.mirror",
     "must name a checkpoint tier class .*: it lacks list, verify, fetch, remove"),
])
def test_a_tier_the_study_file_names_wrongly_is_refused_before_anything_is_written(write_study, tmp_path, capsys,
                                                                                    path, remote, key, rule):
    study = write_study(**tiered(tmp_path / "mirror", path, remote))
    code, _, err = cli(capsys, "run", study)
    assert code == 2, err
    (line,) = err.strip().splitlines()
    value = remote if remote is not None else path
    assert re.fullmatch(rf"error: {re.escape(str(study))}: {key}: {rule}.*, got '{re.escape(value)}'", line), line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mirror").exists()
