"""Small states in one file a step (sweep/checkpoints/compact.py, issue 42 item 7): a kept step of a
64 KiB state costs at most 80 KiB by `du`, retention keeps what Orbax's keeps, and partial steps a
kill leaves are never read as steps. Damage of every kind: tests/checkpoints/test_integrity.py."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from sweep.checkpoints import compact, integrity
from sweep.checkpoints.folder import DamagedCheckpoint, TrialCheckpoints


def _state(step: int) -> dict:
    """What the training loop keeps of a trial with one 128x128 float32 matrix (64 KiB) under plain SGD."""
    params = {"w": np.random.default_rng(step).standard_normal((128, 128)).astype(np.float32)}
    return {"params": params, "opt_state": optax.sgd(0.1).init(params), "step": np.asarray(step, np.int32),
            "key": np.asarray([0, step], np.uint32), "train_loss_sum": np.asarray(0.5, np.float32)}


def _du_kib(*paths: Path) -> float:
    """The KiB `du -sk --total` counts for `paths` (the blocks allocated to every file and folder in
    them: st_blocks, 512 bytes each), read here without a process."""
    found = [q for p in paths for q in ([p, *p.rglob("*")] if p.is_dir() else [p])]
    return sum(q.lstat().st_blocks for q in found) * 512 / 1024


@pytest.fixture
def orbax_layout(monkeypatch):
    """Saves in Orbax's layout, as a state past compact.SMALL_STATE_BYTES is saved."""
    monkeypatch.setattr(compact, "SMALL_STATE_BYTES", 0)


def _save(directory: Path, steps: list[tuple[int, float | None]], keep_last: int = 2, keep_best: int = 1) -> list[int]:
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=keep_last, keep_best=keep_best)
    try:
        for step, loss in steps:
            ckpt.save((step, _state(step), None if loss is None else {"val_loss": loss}))
        ckpt.wait()
        return ckpt.all_steps()
    finally:
        ckpt.close()


def test_a_kept_step_of_a_64_kib_state_takes_at_most_80_kib_with_its_checksum(tmp_path):
    directory = tmp_path / "trial_0000"
    kept = _save(directory, [(100, 0.9), (200, 0.5), (300, 0.7)])
    assert kept == [200, 300]
    for step in kept:
        step_dir = directory / str(step)
        assert compact.is_compact(step_dir) and [p.name for p in step_dir.iterdir()] == [compact.FILE]
        assert _du_kib(step_dir, integrity.checksum_file(directory, step)) <= 80
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1, read_only=True)
    restored = ckpt.restore_verified(300, _state(0))
    ckpt.close()
    expected = {k: v for k, v in _state(300).items() if k != "opt_state"}  # SGD's has no leaves: not stored
    assert jax.tree.all(jax.tree.map(np.array_equal, restored, expected))
    assert all(a.ctypes.data % 64 == 0 for a in jax.tree.leaves(restored["params"]))


def test_the_same_state_in_orbax_s_layout_takes_more_than_80_kib(tmp_path, orbax_layout):
    """Why a layout of sweep's own: Orbax's ten files and five folders cost a 4 KiB block each."""
    directory = tmp_path / "trial_0000"
    (step,) = _save(directory, [(100, 0.9)])
    assert not compact.is_compact(directory / str(step))
    assert _du_kib(directory / str(step), integrity.checksum_file(directory, step)) > 80


SAVES = [(100, 0.9), (200, 0.1), (300, None), (400, 0.5), (500, 0.1), (600, 0.7), (700, None), (800, 0.3)]


@pytest.mark.parametrize("keep_last,keep_best", [(2, 1), (1, 2), (3, 0)])
def test_compact_steps_are_kept_as_orbax_keeps_its_own(tmp_path, keep_last, keep_best, monkeypatch):
    """Retention is Orbax's preservation policy over the folder's steps, ties and steps saved without
    metrics included, so a small state keeps exactly the steps a large one would."""
    ours = _save(tmp_path / "compact", SAVES, keep_last, keep_best)
    monkeypatch.setattr(compact, "SMALL_STATE_BYTES", 0)
    orbax = _save(tmp_path / "orbax", SAVES, keep_last, keep_best)
    assert ours == orbax and len(ours) <= keep_last + keep_best
    assert sorted(p.name for p in integrity.sums_dir(tmp_path / "compact").iterdir()) == sorted(
        f"{s}{integrity.SIDE_SUFFIX}" for s in ours)


def test_what_a_kill_mid_write_or_mid_removal_leaves_is_removed_and_never_read_as_a_step(tmp_path):
    directory = tmp_path / "trial_0000"
    _save(directory, [(100, 0.9), (200, 0.5)])
    (directory / ".300.compact").mkdir()  # a save killed before its rename
    (directory / ".300.compact" / compact.FILE).write_bytes(b"\0" * 10)
    (directory / "100").rename(directory / ".100.removing")  # retention killed mid-removal
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1, read_only=True)
    assert ckpt.all_steps() == [200] and ckpt.latest_step() == 200
    ckpt.close()
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1)
    ckpt.close()
    assert sorted(p.name for p in directory.iterdir()) == ["200"]


def test_a_compact_step_of_other_arrays_than_the_state_s_is_damaged_not_misread(tmp_path):
    directory = tmp_path / "trial_0000"
    _save(directory, [(100, 0.9)])
    other = {**_state(0), "params": {"w": np.zeros((64, 128), np.float32)}}  # another size of the packed buffer
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1, read_only=True)
    try:
        with pytest.raises(DamagedCheckpoint, match="restore failed: ValueError"):
            ckpt.restore_verified(100, other)
    finally:
        ckpt.close()


def test_a_worker_that_lost_its_trial_while_writing_never_commits_the_step(tmp_path):
    """The fence runs again just before the rename: a worker frozen mid-write past its lease finds
    the trial taken over there, and its step is never committed (issue 41: a shared workdir)."""
    from sweep.errors import TakenOver

    directory = tmp_path / "trial_0000"
    checks: list[int] = []

    def fence() -> None:  # holds the trial at the save's first check, not at the one before the rename
        checks.append(1)
        if len(checks) == 2:
            raise TakenOver("trial 0 was taken over by host-b while this worker was unresponsive")

    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1, fence=fence)
    try:
        ckpt.save((100, _state(100), {"val_loss": 0.5}))
        with pytest.raises(TakenOver):
            ckpt.wait()
    finally:
        ckpt.close()  # the error was the save's, raised once
    assert len(checks) == 2 and not (directory / "100").exists()
    assert [p.name for p in directory.iterdir() if p.name.startswith(".1")] == [".100.compact"]  # not a step
    reopened = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=2, keep_best=1)
    assert reopened.all_steps() == [] and not (directory / ".100.compact").exists()  # the next run removes it
    reopened.close()
