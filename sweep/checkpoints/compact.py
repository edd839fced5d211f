"""Small states in one file a step: a kept step costs its state's bytes and a few KiB (issue 42 item 7).

Orbax writes a step as ten files in five folders (its step and item metadata, a commit file per
item, the metrics item, a `.zarray` per array), each a 4 KiB block at least on the disk, so a
64 KiB state took 120 KiB a step by `du`. Orbax has no single-file layout (each of its handlers
writes a folder, and its atomic-rename protocol a commit file per folder), so for a state of at
most SMALL_STATE_BYTES sweep writes its own:

    <step>/state.sweep    8 bytes: the header's length (little-endian), the header (JSON),
                          then each array's bytes in C order at a 64-byte-aligned offset

The header: `{"format": "sweep-step/1", "arrays": [{"name", "dtype", "shape", "offset"}, ...],
"metrics": {...}}`. A step commits as every step sweep brings into a folder (`integrity.install_step`:
its checksum recorded first, written into a dot-folder, fsynced, renamed, the folder fsynced);
retention applies Orbax's own preservation policies to the folder's steps (folder.py); every
restore is verified by the checksum. Larger states keep Orbax's layout: its writer runs several
threads, and its files' few KiB are nothing beside the state.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sweep.checkpoints.direct_read import ALIGN, arrays_of, read_exactly
from sweep.checkpoints.steps import kept_steps

FILE = "state.sweep"
FORMAT = "sweep-step/1"
SMALL_STATE_BYTES = 16 << 20  # 16 MiB: below it Orbax's ~40 KiB of files a step are over 0.25% of it
_LENGTH = struct.Struct("<Q")


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def fits(tree: Mapping[str, Any]) -> bool:
    """The packed tree (`packing.pack`) is small and every leaf a plain numpy array: one file."""
    leaves = [leaf for _, _, leaf in arrays_of(tree)]
    return (all(isinstance(a, np.ndarray) and a.dtype != object for a in leaves)
            and sum(a.nbytes for a in leaves) <= SMALL_STATE_BYTES)


def write(step_dir: Path, tree: Mapping[str, Any], metrics: Mapping[str, float] | None) -> None:
    """Write the packed `tree` and the step's `metrics` as `step_dir/state.sweep` (`step_dir` is
    the dot-folder install_step commits; it fsyncs)."""
    entries, offset = [], 0
    for name, _, array in arrays_of(tree):
        entries.append({"name": name, "dtype": str(array.dtype), "shape": list(array.shape), "offset": offset})
        offset = _up(offset + array.nbytes)
    header = json.dumps({"format": FORMAT, "arrays": entries,
                         "metrics": None if metrics is None else {k: float(v) for k, v in metrics.items()}}).encode()
    start = _up(_LENGTH.size + len(header))
    step_dir.mkdir(parents=True, exist_ok=True)
    with open(step_dir / FILE, "wb") as f:
        f.write(_LENGTH.pack(len(header)) + header)
        for entry, (_, _, array) in zip(entries, arrays_of(tree)):
            f.seek(start + entry["offset"])
            f.write(memoryview(np.ascontiguousarray(array)).cast("B"))


def is_compact(step_dir: Path) -> bool:
    return (step_dir / FILE).exists()


def header(step_dir: Path) -> tuple[dict[str, Any], int]:
    """(the header, where the arrays start) of a compact step. Raises OSError, ValueError."""
    with open(step_dir / FILE, "rb") as f:
        (length,) = _LENGTH.unpack(f.read(_LENGTH.size) or b"\0" * 8)
        if not 0 < length <= 1 << 30:
            raise ValueError(f"{step_dir / FILE}: no header")
        head = json.loads(f.read(length))
    if not isinstance(head, dict) or head.get("format") != FORMAT or not isinstance(head.get("arrays"), list):
        raise ValueError(f"{step_dir / FILE}: not a {FORMAT} header")
    return head, _up(_LENGTH.size + length)


def unreadable(step_dir: Path) -> str | None:
    """Why a compact step's header does not read (None where it does, or the step is Orbax's)."""
    if not is_compact(step_dir):
        return None
    try:
        header(step_dir)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return f"{FILE}'s header is unreadable ({type(exc).__name__})"
    return None


def metrics(step_dir: Path) -> dict[str, Any] | None:
    """The metrics a step was saved with (a compact step's header, or Orbax's metrics item);
    None where it has none or they do not read (retention then ranks it by age only)."""
    try:
        if is_compact(step_dir):
            return header(step_dir)[0].get("metrics")
        return json.loads((step_dir / "metrics" / "metrics").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read(step_dir: Path, template: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tree `template` (nested dicts of numpy arrays: `packing.packed_template(..., host=True)`)
    read from a compact step, each array 64-byte aligned; None where the step is Orbax's.
    Raises ValueError where the step holds other arrays than the template's, OSError for a short file."""
    if not is_compact(step_dir):
        return None
    head, start = header(step_dir)
    wanted = arrays_of(template)
    have = {e.get("name"): e for e in head["arrays"] if isinstance(e, dict)}
    if set(have) != {name for name, _, _ in wanted}:
        raise ValueError(f"{step_dir / FILE}: holds {sorted(have)}, not the state's arrays")
    out: dict[str, Any] = {}
    with open(step_dir / FILE, "rb", buffering=0) as f:
        for name, path, leaf in wanted:
            entry = have[name]
            if entry.get("dtype") != str(leaf.dtype) or tuple(entry.get("shape", ())) != leaf.shape:
                raise ValueError(f"{step_dir / FILE}: {name} is {entry.get('dtype')}{entry.get('shape')}, "
                                 f"the state's {leaf.dtype}{list(leaf.shape)}")
            f.seek(start + int(entry["offset"]))
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = read_exactly(f, leaf.shape, leaf.dtype, step_dir / FILE)
    return out


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A step as Orbax's preservation policies see it (`PolicyCheckpointInfo`)."""

    step: int
    metrics: dict[str, Any] | None
    time: datetime.datetime = dataclasses.field(default_factory=datetime.datetime.now)


def retain(directory: Path, should_preserve: Callable[[Sequence[_Kept]], Sequence[bool]]) -> None:
    """Remove the steps of `directory` that `should_preserve` (Orbax's preservation policy, as
    its manager calls it) does not keep; a step's metrics are those it was saved with."""
    infos = [_Kept(step, metrics(directory / str(step))) for step in kept_steps(directory)]
    for info, keep in zip(infos, should_preserve(infos)):
        if not keep:  # out of the steps' names first: a kill mid-removal leaves no half step
            gone = directory / f".{info.step}.removing"
            os.rename(directory / str(info.step), gone)
            shutil.rmtree(gone, ignore_errors=True)
