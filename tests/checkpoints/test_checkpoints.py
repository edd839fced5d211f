"""Damaged checkpoints: quarantined (never deleted), resume falls back to an intact step, still bit-identical."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from conftest import array_files, checkpoint_dir, gated_trial, kill_mid_trial, run_cli, snapshot
from sweep.checkpoints.folder import TrialCheckpoints


def _killed_mid_trial(write_study, folder: Path, hold: Path) -> tuple[Path, Path, list[int]]:
    """BASE_STUDY killed once trial 1 has committed step 300; held meanwhile at the process's 19th
    evaluation (trial 0's 12, then trial 1's at step 350, after its save at 300), so that the kill
    lands mid-trial however fast the machine."""
    study = write_study(trial=gated_trial(folder, 19))
    steps = kill_mid_trial(study, 1, 300, hold)
    return study, checkpoint_dir(study, 1), steps


def _garble(folder: Path) -> int:
    """Overwrite every file under folder with garbage of the same size."""
    n = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            path.write_bytes(bytes((i * 151 + 7) % 256 for i in range(path.stat().st_size)))
            n += 1
    return n


@pytest.mark.slow
def test_garbage_in_newest_step_is_quarantined_and_resume_is_bit_identical(write_study, reference, tmp_path, held):
    study, ckpt, steps = _killed_mid_trial(write_study, tmp_path, held(tmp_path / "hold"))
    newest, previous = steps[-1], steps[-2]
    assert _garble(ckpt / str(newest)) > 0  # its one file (a small state's layout: compact.py), or Orbax's
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert f"trial 1: checkpoint step {newest} is damaged" in result.stderr
    assert f"trial 1: resumed from step {previous}" in result.stderr
    quarantined = list((ckpt.parent / "trial_0001.quarantine").iterdir())
    assert [p.name.split("-")[0] for p in quarantined] == [str(newest)]  # moved aside, not deleted
    assert snapshot(study) == reference()


@pytest.mark.slow
def test_corrupt_metrics_file_is_quarantined_before_orbax_opens_the_folder(write_study, reference, tmp_path, held):
    study, ckpt, steps = _killed_mid_trial(write_study, tmp_path, held(tmp_path / "hold"))
    newest = steps[-1]
    step = ckpt / str(newest)  # the metadata a folder's reader parses first: compact's header, or Orbax's JSON
    target = next(p for p in (step / "state.sweep", step / "metrics" / "metrics", step / "_CHECKPOINT_METADATA")
                  if p.exists())
    target.write_bytes(b"\xff\xfe\x00garbage" * 3)
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert f"checkpoint step {newest} is damaged" in result.stderr and "unreadable" in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(study) == reference()


def _state(value: float) -> dict:
    return {"params": {"w": np.full((4, 3), value, np.float32)}, "step": np.asarray(int(value), np.int32)}


def _flip(step_dir: Path) -> None:
    for path in array_files(step_dir):
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))


def test_damaged_older_best_step_sends_resume_below_it(tmp_path):
    directory = tmp_path / "trial_0000"
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1)
    for step, loss in ((100, 0.9), (200, 0.1), (300, 0.5), (400, 0.6)):
        ckpt.save((step, _state(step), {"val_loss": loss}))
    ckpt.close()
    assert sorted(int(p.name) for p in directory.iterdir()) == [200, 300, 400]  # best 200 + newest 2
    best_before = lambda s: 200 if s >= 200 else None  # noqa: E731

    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1)
    step, state = ckpt.restore_intact(_state(0), best_before)
    assert step == 400 and np.array_equal(state["params"]["w"], _state(400)["params"]["w"])
    ckpt.close()

    _flip(directory / "200")  # the best state is damaged: resuming at 400 would lose it for good
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1)
    step, state = ckpt.restore_intact(_state(0), best_before)
    ckpt.close()
    assert step is None and int(state["step"]) == 0  # start over: 200 is recomputed, bit-identically
    assert [p.name.split("-")[0] for p in (tmp_path / "trial_0000.quarantine").iterdir()] == ["200"]


def test_a_pbt_member_never_resumes_below_its_exploit(tmp_path):
    """restore_floor (sweep/schedulers/pbt.py: its latest exploit step): steps below it are another member's
    lineage; with the steps at and above it damaged, the restore fails loudly instead."""
    from sweep.checkpoints.folder import DamagedCheckpoint

    directory = tmp_path / "trial_0000"
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0)
    for step in (100, 200, 300):
        ckpt.save((step, _state(step), {"val_loss": 1.0 / step}))
    ckpt.close()
    _flip(directory / "300")
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0)
    ckpt.restore_floor = 200
    step, _ = ckpt.restore_intact(_state(0), lambda s: None)
    assert step == 200  # the newest intact step at or above the floor
    _flip(directory / "200")
    ckpt.restore_floor = 200
    with pytest.raises(DamagedCheckpoint, match="no intact checkpoint at or after its PBT exploit at step 200"):
        ckpt.restore_intact(_state(0), lambda s: None)
    ckpt.close()
    assert (directory / "100").is_dir()  # below the floor: left alone, never restored


def test_checksums_follow_retention_and_a_step_without_one_is_not_trusted(tmp_path):
    directory = tmp_path / "trial_0000"
    ckpt = TrialCheckpoints(directory, "val_loss", "maximize", keep_last=1, keep_best=1)
    for step, acc in ((10, 0.5), (20, 0.9), (30, 0.7)):
        ckpt.save((step, _state(step), {"val_loss": acc}))
    ckpt.close()
    assert sorted(p.name for p in directory.iterdir()) == ["20", "30"]
    assert sorted(p.name for p in (tmp_path / "trial_0000.sums").iterdir()) == ["20.sweep.json", "30.sweep.json"]
    (tmp_path / "trial_0000.sums" / "30.sweep.json").unlink()
    ckpt = TrialCheckpoints(directory, "val_loss", "maximize", keep_last=1, keep_best=1)
    assert ckpt.latest_step() == 20
    ckpt.close()


def test_a_disk_fault_s_partial_step_is_gone_after_close_also_if_a_late_write_recreated_it(tmp_path):
    """Orbax gathers a step's writes with asyncio.gather, which raises at the first ENOSPC and leaves the
    others running; tensorstore recreates a file's parent folders as it writes (CI's failure of
    test_full_checkpoint_disk_stops_the_run...: a partial step left after the run's exit 1)."""
    import errno

    from sweep.errors import DiskFault

    directory = tmp_path / "trial_0000"

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=0)
    ckpt.save((100, _state(100), {"val_loss": 1.0}))
    ckpt.wait()
    ckpt.room = full  # the next step's write meets a full disk
    ckpt.save((200, _state(200), {"val_loss": 0.5}))
    with pytest.raises(DiskFault, match=r"cannot write its checkpoint of step 200 .*\(ENOSPC\)"):
        ckpt.wait()
    late = directory / "200.orbax-checkpoint-tmp" / "default" / "params.sweep_packed.float32"
    late.mkdir(parents=True)  # what a write still in flight at the fault leaves behind
    (late / "0").write_bytes(b"x" * 100)
    ckpt.close()
    assert sorted(p.name for p in directory.iterdir()) == ["100"]  # the committed step intact, no partial
