"""Checksums of saved steps: the algorithm this release records (xxh3-128) and sha256, the one of
earlier releases, both verified; every kind of damage detected with either. Steps "as the previous
release wrote them" are OCDBT steps with a sha256 sidecar (this release writes neither); this release
writes a small state as one file (sweep/checkpoints/compact.py), a larger one in Orbax's layout."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import array_files
from sweep.checkpoints import compact, folder, integrity
from sweep.checkpoints.folder import DamagedCheckpoint, TrialCheckpoints
from sweep.internals import uncompressed_standard_handler


def _state(value: float) -> dict:
    rng = np.random.default_rng(int(value))
    return {"params": {"w": rng.standard_normal((64, 32)).astype(np.float32),
                       "big": rng.standard_normal((300_000,)).astype(np.float32)},  # > 1 MiB: a whole array
            "step": np.asarray(int(value), np.int32)}


def _sha256_as_released(state: dict) -> str:
    """The checksum of the release before issue 42 (sweep/checkpoints/integrity.py at c4c1c8d), written out."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


LAYOUTS = {"compact": "xxh3_128", "orbax": "xxh3_128", "sha256": "sha256"}  # layout -> the algorithm it records


def _saved(directory: Path, layout: str, steps=(100, 200)) -> None:
    """Steps saved by this release (`compact`: this state's size; `orbax`: the layout of a state past
    compact.SMALL_STATE_BYTES), or as the previous release saved them (`sha256`: OCDBT, sha256)."""
    algorithm = LAYOUTS[layout]
    handler, small = folder._uncompressed, compact.SMALL_STATE_BYTES
    if layout == "sha256":
        folder._uncompressed = lambda: uncompressed_standard_handler(use_ocdbt=True, copy_host_arrays=True)
    if layout != "compact":
        compact.SMALL_STATE_BYTES = 0
    try:
        ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0)
        ckpt.checksum_algorithm = algorithm
        for step in steps:
            ckpt.save((step, _state(step), {"val_loss": 1.0 / step}))
        ckpt.close()
    finally:
        folder._uncompressed, compact.SMALL_STATE_BYTES = handler, small
    for step in steps:
        assert (directory / str(step) / "default" / "manifest.ocdbt").exists() == (layout == "sha256")
        assert compact.is_compact(directory / str(step)) == (layout == "compact")


def _flip(step_dir: Path) -> None:
    for path in array_files(step_dir):
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))


def _truncate(step_dir: Path) -> None:
    for path in array_files(step_dir):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _remove_a_data_file(step_dir: Path) -> None:
    max(array_files(step_dir), key=lambda p: p.stat().st_size).unlink()  # the arrays' bytes (names are random)


def _remove_the_checksum(step_dir: Path) -> None:
    integrity.checksum_file(step_dir.parent, int(step_dir.name)).unlink()


def test_a_save_records_xxh3_128_beside_its_digest(tmp_path):
    _saved(tmp_path / "t", "compact", steps=(100,))
    record = json.loads(integrity.checksum_file(tmp_path / "t", 100).read_text())
    assert set(record) == {"step", "xxh3_128"} and len(record["xxh3_128"]) == 32
    recorded = integrity.read_checksum(tmp_path / "t", 100)
    assert recorded == integrity.checksum(_state(100)) == f"xxh3_128:{record['xxh3_128']}"


def test_a_step_written_with_sha256_as_the_previous_release_did_restores_and_verifies(tmp_path):
    directory = tmp_path / "t"
    _saved(directory, "sha256")
    for step in (100, 200):  # exactly the previous release's sidecar
        assert json.loads(integrity.checksum_file(directory, step).read_text()) == {
            "step": step, "sha256": _sha256_as_released(_state(step))}
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0)
    try:
        restored = ckpt.restore_verified(200, _state(0))
        assert integrity.read_checksum(directory, 200) == _sha256_as_released(_state(200))  # bare hex, as before
        step, state = ckpt.restore_intact(_state(0), lambda s: None)
        assert step == 200
        for got in (restored, state):
            assert jax.tree.all(jax.tree.map(np.array_equal, got, _state(200)))
        ckpt.save((300, _state(300), {"val_loss": 0.001}))  # a new step beside the old ones: the new algorithm
        ckpt.wait()
        assert integrity.algorithm_of(integrity.read_checksum(directory, 300)) == "xxh3_128"
        assert ckpt.restore_intact(_state(0), lambda s: None)[0] == 300
    finally:
        ckpt.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Steps 100 and 200 saved in each layout, written once; each test damages a copy."""
    out = {}
    for layout in LAYOUTS:
        out[layout] = tmp_path_factory.mktemp(layout) / "t"
        _saved(out[layout], layout)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("damage", [_flip, _truncate, _remove_a_data_file, _remove_the_checksum])
def test_every_damaged_step_is_detected_and_resume_falls_back(tmp_path, written, layout, damage):
    directory = tmp_path / "t"
    shutil.copytree(written[layout], directory)
    shutil.copytree(integrity.sums_dir(written[layout]), integrity.sums_dir(directory))
    damage(directory / "200")
    if damage is not _remove_the_checksum:
        ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0, read_only=True)
        with pytest.raises(DamagedCheckpoint):
            ckpt.restore_verified(200, _state(0))
        ckpt.close()
    ckpt = TrialCheckpoints(directory, "val_loss", "minimize", keep_last=3, keep_best=0)
    try:
        step, state = ckpt.restore_intact(_state(0), lambda s: None)
    finally:
        ckpt.close()
    assert step == 100 and jax.tree.all(jax.tree.map(np.array_equal, state, _state(100)))
    assert [p.name.split("-")[0] for p in (tmp_path / "t.quarantine").iterdir()] == ["200"]


def test_a_digest_recorded_with_one_algorithm_never_matches_another_state(tmp_path):
    for algorithm in ("xxh3_128", "sha256"):
        recorded = integrity.checksum(_state(1), algorithm)
        assert integrity.matches(_state(1), recorded) and not integrity.matches(_state(2), recorded)
    assert not integrity.matches(_state(1), None)
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        integrity.checksum(_state(1), "md5")


def test_this_release_s_steps_are_read_from_their_files_and_earlier_ones_by_orbax(written):
    """sweep/checkpoints/direct_read.py: one uncompressed chunk per array is read straight from its file
    (64-byte aligned, so JAX on the CPU takes it without a copy); an OCDBT step is left to Orbax."""
    from sweep.checkpoints import direct_read, packing

    host = packing.packed_template(_state(0), host=True)
    read = direct_read.read(written["orbax"] / "200" / "default", host)
    assert read is not None and jax.tree.structure(read) == jax.tree.structure(host)
    assert all(a.ctypes.data % direct_read.ALIGN == 0 for a in jax.tree.leaves(read))
    assert jax.tree.all(jax.tree.map(np.array_equal, packing.unpack(read, _state(0)), _state(200)))
    assert direct_read.read(written["sha256"] / "200" / "default", host) is None
