"""The packed checkpoint layout: small arrays in one buffer per dtype, restored bit for bit; steps of
the plain layout (earlier releases) still restore."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from conftest import array_files
from sweep.checkpoints import packing
from sweep.checkpoints.folder import TrialCheckpoints


def _state(layers: int = 40) -> dict:
    rng = np.random.default_rng(0)
    params = {f"Dense_{i}": {"kernel": rng.normal(size=(8, 8)).astype(np.float32),
                             "bias": rng.normal(size=(8,)).astype(np.float32)} for i in range(layers)}
    params["big"] = rng.normal(size=(600, 600)).astype(np.float32)  # 1.4 MB: stays whole
    opt_state = optax.adam(1e-3).init(params)
    return jax.tree.map(lambda x: np.array(x, copy=True), {
        "params": params, "opt_state": opt_state, "step": np.asarray(7, np.int32),
        "key": np.array([1, 2], np.uint32), "train_loss_sum": np.asarray(0.5, np.float32)})


def _equal(a, b) -> bool:
    same = jax.tree.map(lambda x, y: x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), a, b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(same))


def test_pack_groups_small_leaves_by_dtype_and_keeps_big_ones_whole():
    state = _state()
    packed = packing.pack(state)
    assert set(packed["params"][packing.PACKED]) == {"float32"}
    big = [i for i, leaf in enumerate(jax.tree.leaves(state["params"])) if leaf is state["params"]["big"]]
    assert list(packed["params"][packing.WHOLE]) == [str(i) for i in big] and len(big) == 1
    assert set(packed["opt_state"][packing.PACKED]) == {"float32", "int32"}  # adam's moments and count
    assert len(jax.tree.leaves(packed)) < 10 < len(jax.tree.leaves(state))
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    assert _equal(packing.unpack(packed, template), state)


def _saved_and_restored(folder, saved, like, verified=True, **options):
    """Step 10 of `saved` written to a fresh checkpoint folder and read back into zeros shaped as `like`."""
    ckpt = TrialCheckpoints(folder, "val_loss", "minimize", 2, 1, **options)
    try:
        ckpt.save((10, saved, {"val_loss": 1.0}))
        ckpt.wait()
        return (ckpt.restore_verified if verified else ckpt.restore)(10, jax.tree.map(np.zeros_like, like))
    finally:
        ckpt.close()


def test_packed_steps_restore_bit_identical_with_their_optax_types(tmp_path):
    state = _state()
    restored = _saved_and_restored(tmp_path / "c", state, state)
    assert _equal(restored, state)
    assert type(restored["opt_state"][0]).__name__ == "ScaleByAdamState"


def test_a_device_template_gets_its_large_arrays_back_on_its_devices_and_its_small_ones_in_numpy(tmp_path):
    """Orbax reads the large arrays into host memory (faster than its device-array restore), the
    checksum is taken there, then they go where the template's arrays are, as before."""
    state = _state()
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = jax.tree.map(lambda x: jax.device_put(np.zeros_like(x), sharding), state)
    ckpt = TrialCheckpoints(tmp_path / "c", "val_loss", "minimize", 2, 1)
    try:
        ckpt.save((10, state, {"val_loss": 1.0}))
        ckpt.wait()
        for restored in (ckpt.restore_verified(10, template), ckpt.restore(10, template)):
            assert _equal(jax.tree.map(np.asarray, restored), state)
            big = restored["params"]["big"]
            assert isinstance(big, jax.Array) and big.sharding == sharding
            assert isinstance(restored["params"]["Dense_0"]["kernel"], np.ndarray)
    finally:
        ckpt.close()


def test_a_step_of_the_plain_layout_still_restores(tmp_path, monkeypatch):
    # What releases before packing wrote: the state's own tree, one Orbax array per leaf.
    state = _state(layers=3)
    monkeypatch.setattr(packing, "pack", lambda s: s)
    ckpt = TrialCheckpoints(tmp_path / "c", "val_loss", "minimize", 2, 1)
    try:
        ckpt.save((10, state, {"val_loss": 1.0}))
        ckpt.wait()
    finally:
        ckpt.close()
    monkeypatch.undo()
    ckpt = TrialCheckpoints(tmp_path / "c", "val_loss", "minimize", 2, 1)
    try:
        assert _equal(ckpt.restore_verified(10, jax.tree.map(np.zeros_like, state)), state)
        ckpt.save((20, state, {"val_loss": 0.5}))  # the new layout beside the old one
        ckpt.wait()
        assert _equal(ckpt.restore_verified(20, jax.tree.map(np.zeros_like, state)), state)
    finally:
        ckpt.close()


def test_a_step_without_an_optional_key_restores_without_it(tmp_path):
    state = _state(layers=2)
    older = {k: v for k, v in state.items() if k != "train_loss_sum"}
    restored = _saved_and_restored(tmp_path / "c", older, state, verified=False, optional_keys=("train_loss_sum",))
    assert "train_loss_sum" not in restored and _equal(restored, older)


def test_a_damaged_packed_buffer_fails_its_checksum(tmp_path):
    from sweep.checkpoints.folder import DamagedCheckpoint

    state = _state(layers=2)
    ckpt = TrialCheckpoints(tmp_path / "c", "val_loss", "minimize", 2, 1)
    try:
        ckpt.save((10, state, {"val_loss": 1.0}))
        ckpt.wait()
        data = array_files(tmp_path / "c" / "10")
        assert data, sorted(str(p) for p in (tmp_path / "c" / "10").rglob("*"))
        for path in data:  # flip bytes in the middle of every data file of the step
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
        with pytest.raises(DamagedCheckpoint):
            ckpt.restore_verified(10, jax.tree.map(np.zeros_like, state))
    finally:
        ckpt.close()
