"""Reading a step of this release's layout straight from its files, at the disk's (or the page cache's) speed.

Since issue 42 sweep writes each array of the packed tree (sweep/checkpoints/packing.py) as an
uncompressed zarr v2 array of one chunk, without OCDBT: the chunk file holds the array's bytes in C
order, nothing else. Orbax's restore reads it through tensorstore at about a third of a plain read
(a chunk buffer, then a copy into the result: benchmarks/RESULTS.md, "Checkpoints of 1-8 GB");
here each file is read once into a 64-byte-aligned numpy array, which JAX on the CPU puts on its
device without a copy. Every restore is checked against the step's checksum after it, so a file
that is not what its metadata says cannot pass unnoticed. Steps in any other form (OCDBT, zstd,
several chunks: earlier releases) return None, and Orbax reads them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from sweep.words import count

ALIGN = 64  # XLA's CPU client aliases host buffers aligned to this instead of copying them


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _plain_chunk(meta: Mapping[str, Any], shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    """The one chunk file's name where `.zarray` describes the array as this release writes it."""
    plain = (meta.get("zarr_format") == 2 and meta.get("compressor") is None and not meta.get("filters")
             and meta.get("order", "C") == "C" and tuple(meta.get("shape", ())) == shape
             and tuple(meta.get("chunks", ())) == (shape or (1,)) and np.dtype(meta.get("dtype")) == dtype)
    if not plain:
        return None
    return meta.get("dimension_separator", ".").join("0" for _ in shape) or "0"


def arrays_of(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, tuple[str, ...], Any]]:
    out = []
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out += [(n, (key, *path), leaf) for n, path, leaf in arrays_of(value, name)]
        else:
            out.append((name, (key,), value))
    return out


def read(item_dir: Path, template: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tree `template` (nested dicts of numpy arrays: `packing.packed_template(..., host=True)`)
    read from Orbax's item folder `<step>/default`, or None where the step is not in this release's
    form (then Orbax reads it). Raises OSError for a missing or short file."""
    plan = []
    for name, path, leaf in arrays_of(template):
        if not isinstance(leaf, np.ndarray):
            return None  # a dtype numpy does not hold (typed PRNG keys): Orbax's
        try:
            meta = json.loads((item_dir / name / ".zarray").read_text())
            chunk = _plain_chunk(meta, leaf.shape, leaf.dtype)
        except (OSError, ValueError, TypeError):
            return None
        if chunk is None:
            return None
        plan.append((item_dir / name / chunk, path, leaf))
    out: dict[str, Any] = {}
    for file, path, leaf in plan:
        with open(file, "rb", buffering=0) as f:
            array = read_exactly(f, leaf.shape, leaf.dtype, file)
            if f.read(1):
                raise OSError(f"{file}: longer than the {count(array.nbytes, 'byte')} its array was written with")
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array
    return out


def read_exactly(f: Any, shape: tuple[int, ...], dtype: np.dtype, file: Path) -> np.ndarray:
    """An array of `shape` and `dtype` read from the open file `f` at its position into a 64-byte
    aligned buffer; OSError where the file ends first."""
    array = _aligned(shape, dtype)
    view, got = memoryview(array.reshape(-1).view(np.uint8)), 0
    while got < len(view) and (n := f.readinto(view[got:])):  # one read() stops short of 2 GiB
        got += n
    if got != len(view):
        raise OSError(f"{file}: shorter than the {count(len(view), 'byte')} its array was written with")
    return array
