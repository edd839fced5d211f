"""The checkpoint layout of a training state: small arrays packed into one buffer per dtype.

Orbax writes and reads every array as its own tensorstore entry, at a fixed cost per array:
a state of ~1,000 small arrays (a deep model with Adam) took seconds to save and to restore
where one array of the same bytes took a tenth of that (benchmarks/RESULTS.md, per-array cost).
No Orbax option groups leaves, so sweep does it here: within each top-level entry of the state
(params, opt_state, step, key, ...), leaves of at most PACK_MAX_BYTES are concatenated, in pytree
order, into one flat buffer per dtype; larger arrays stay whole (Orbax writes those near the
disk's speed, and sharded ones keep their sharding).

The layout needs no index: it is a function of the state's structure, which a restore gets from
its template, so `unpack(restored, template)` puts every byte back where it was. Steps written
before packing existed hold the plain tree; `TrialCheckpoints.restore` reads both.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import numpy as np

PACK_MAX_BYTES = 1 << 20
PACKED, WHOLE = "sweep_packed", "sweep_whole"  # the sub-trees of each packed top-level entry


@functools.lru_cache(maxsize=None)
def _group(dtype: np.dtype) -> str | None:
    """The buffer a leaf of `dtype` is packed into (None: never packed)."""
    return dtype.name if dtype.kind in "biufc" else None


def _plan(leaves: list[Any]) -> list[tuple[str | None, tuple[int, ...], int]]:
    """Per leaf: (the dtype buffer it goes into, or None where it stays whole; shape; elements).

    Per-leaf Python work is what packing saves, so this stays lean (math.prod, cached names).
    """
    out: list[tuple[str | None, tuple[int, ...], int]] = []
    for leaf in leaves:
        shape, dtype = tuple(np.shape(leaf)), getattr(leaf, "dtype", None)
        n = math.prod(shape)
        try:
            group = _group(np.dtype(dtype)) if dtype is not None else None
        except TypeError:  # typed PRNG keys and other dtypes numpy does not know
            group = None
        if group is not None and n * np.dtype(dtype).itemsize > PACK_MAX_BYTES:
            group = None
        out.append((group, shape, n))
    return out


def pack(state: Mapping[str, Any]) -> dict[str, Any]:
    """The tree Orbax writes for a host-copied `state` (a dict of pytrees of numpy arrays)."""
    out: dict[str, Any] = {}
    for name, tree in state.items():
        leaves = jax.tree.leaves(tree)
        groups: dict[str, list[np.ndarray]] = {}
        whole: dict[str, Any] = {}
        for i, (leaf, (group, _, _)) in enumerate(zip(leaves, _plan(leaves))):
            if group is None:
                whole[str(i)] = leaf
            else:
                groups.setdefault(group, []).append(np.ravel(np.asarray(leaf)))
        out[name] = _entry({g: np.concatenate(parts) for g, parts in groups.items()}, whole)
    return {k: v for k, v in out.items() if v}


def packed_template(template: Mapping[str, Any], host: bool = False) -> dict[str, Any]:
    """The abstract tree of `pack(state)` for a state shaped like `template` (arrays or
    ShapeDtypeStructs): packed buffers come back as host numpy arrays, whole arrays as the
    template's own leaves (with their sharding), or with `host` as numpy arrays too (`place` puts
    them where the template says after the checksum)."""
    out: dict[str, Any] = {}
    for name, tree in template.items():
        leaves = jax.tree.leaves(tree)
        sizes: dict[str, int] = {}
        whole: dict[str, Any] = {}
        for i, (leaf, (group, shape, n)) in enumerate(zip(leaves, _plan(leaves))):
            if group is None:
                whole[str(i)] = _host(leaf, shape) if host else leaf
            else:
                sizes[group] = sizes.get(group, 0) + n
        out[name] = _entry({g: np.zeros((n,), np.dtype(g)) for g, n in sizes.items()}, whole)
    return {k: v for k, v in out.items() if v}


def _host(leaf: Any, shape: tuple[int, ...]) -> Any:
    """A numpy stand-in of `leaf` (zeros: pages the kernel maps only once written), or the leaf
    itself where numpy has no such dtype (typed PRNG keys)."""
    try:
        return np.zeros(shape, np.dtype(leaf.dtype))
    except TypeError:
        return leaf


def place(state: Any, template: Any) -> Any:
    """`state` with each large array of the packed layout on the device of `template`'s leaf (a
    device array or a ShapeDtypeStruct with a sharding), where `packed_template(..., host=True)` left it in host
    memory; small arrays stay numpy, as they always came back. One entry at a time, so host
    copies are freed as they go. A `template` of None: nothing to move (the plain layout)."""
    if template is None:
        return state
    out: dict[str, Any] = {}
    for name in list(state):
        leaves, treedef = jax.tree.flatten(state.pop(name))
        for i, (leaf, (group, _, _)) in enumerate(zip(jax.tree.leaves(template[name]), _plan(leaves))):
            sharding = getattr(leaf, "sharding", None)
            if group is None and sharding is not None and isinstance(leaves[i], np.ndarray):
                leaves[i] = jax.device_put(leaves[i], sharding)
        out[name] = jax.tree.unflatten(treedef, leaves)
    return out


def _entry(packed: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    # Empty sub-trees are left out: Orbax stores no node without leaves.
    return {k: v for k, v in ((PACKED, packed), (WHOLE, whole)) if v}


def unpack(restored: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """The state `pack` was given, from what Orbax restored and the template it was restored with."""
    out: dict[str, Any] = {}
    for name, tree in template.items():
        if name not in restored:  # an optional entry the step was written without
            continue
        leaves, treedef = jax.tree.flatten(tree)
        buffers, whole = restored[name].get(PACKED, {}), restored[name].get(WHOLE, {})
        offsets = dict.fromkeys(buffers, 0)
        values = []
        host = {g: np.asarray(b) for g, b in buffers.items()}
        for i, (group, shape, n) in enumerate(_plan(leaves)):
            if group is None:
                values.append(whole[str(i)])
                continue
            values.append(host[group][offsets[group]:offsets[group] + n].reshape(shape))
            offsets[group] += n
        out[name] = jax.tree.unflatten(treedef, values)
    return out
