"""Checkpoint integrity that Orbax does not provide: data checksums, quarantine, durable commits.

Orbax keeps no checksum of the array data (flipped bytes restore as wrong values), and it does
not fsync its JSON/metadata files or the parent folder after the final rename, so a committed
step may not survive power loss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

log = logging.getLogger("sweep")
SIDE_SUFFIX = ".sweep.json"  # <trial dir>.sums/<step>.sweep.json: written (and fsynced) before the step


# What a save records (benchmarks/RESULTS.md, "Checkpoints of 1-8 GB"): xxh3-128 hashed at ~16 GB/s
# on one core here, blake3 at ~5 and sha256 (older releases) at ~1; a 128-bit hash detects
# accidental damage (flipped bytes, torn or truncated files) as surely as a cryptographic one, and a
# checkpoint's checksum guards against the disk, not against someone who can rewrite its sidecar too.
ALGORITHM = "xxh3_128"
LEGACY = "sha256"  # what releases before issue 42 recorded; still read and verified


def _hasher(algorithm: str) -> Any:
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == LEGACY:
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


def algorithm_of(digest: str) -> str:
    """The algorithm of a digest as `checksum` and `read_checksum` give it: `<algorithm>:<hex>`,
    or a bare hex digest for sha256 (the form older releases recorded, kept so that digests
    recorded elsewhere by them, in a bucket's commit marks or a PBT lineage, still compare equal)."""
    return digest.split(":", 1)[0] if ":" in digest else LEGACY


def checksum(state: Any, algorithm: str = ALGORITHM) -> str:
    """A digest of every leaf's path, dtype, shape and bytes, in pytree order (see `algorithm_of`)."""
    import jax  # here: the rest of this module serves readers that need no JAX (status, plan)

    h = _hasher(algorithm)
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
        # The array's own buffer, not a `tobytes()` copy: the same digest, half the time (a copy
        # of 100 MB cost as much as hashing it). Typed PRNG keys and other non-buffer dtypes fall
        # back to the copy.
        try:
            h.update(memoryview(a).cast("B"))
        except (TypeError, ValueError):
            h.update(a.tobytes())
    return h.hexdigest() if algorithm == LEGACY else f"{algorithm}:{h.hexdigest()}"


def matches(state: Any, recorded: str | None) -> bool:
    """`state` hashes to the `recorded` digest, with the algorithm it was recorded with."""
    return recorded is not None and checksum(state, algorithm_of(recorded)) == recorded


def sums_dir(directory: Path) -> Path:
    return directory.with_name(directory.name + ".sums")


def checksum_file(directory: Path, step: int) -> Path:
    """Where the checksum of step `step` of a trial folder lives."""
    return sums_dir(directory) / f"{step}{SIDE_SUFFIX}"


def quarantine_dir(directory: Path) -> Path:
    return directory.with_name(directory.name + ".quarantine")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checksum(directory: Path, step: int, digest: str) -> None:
    """Record `digest` (from `checksum`) as `{"step": N, "<algorithm>": "<hex>"}`: the algorithm
    is the key, so an older step's `{"step": N, "sha256": ...}` reads the same way."""
    folder = sums_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{step}.tmp"
    algorithm = algorithm_of(digest)
    tmp.write_text(json.dumps({"step": step, algorithm: digest.removeprefix(f"{algorithm}:")}))
    _fsync(tmp)
    os.replace(tmp, checksum_file(directory, step))
    _fsync(folder)


def read_checksum(directory: Path, step: int) -> str | None:
    """The recorded digest of step `step` in `checksum`'s form; None where none is readable."""
    try:
        record = json.loads(checksum_file(directory, step).read_text())
        if isinstance(record.get(ALGORITHM), str):
            return f"{ALGORITHM}:{record[ALGORITHM]}"
        return record[LEGACY] if isinstance(record.get(LEGACY), str) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def make_durable(step_dir: Path) -> None:
    """fsync every file and folder of a committed step, then the trial folder holding it."""
    for root, dirs, files in os.walk(step_dir):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))
    _fsync(step_dir.parent)


def install_step(directory: Path, step: int, fill: Callable[[Path], None], what: str,
                 fence: Callable[[], None] | None = None) -> None:
    """Commit step `step` into trial folder `directory` (a compact save, a download, a copy) as a
    save commits: its checksum must be in place already; `fill(tmp)` writes the step's files into
    a dot-folder (`.<step>.<what>`, removed first if a kill left one), made durable, then renamed
    (and the rename made durable). `fence()`, where given, runs just before the rename: it raises
    where this worker lost its trial meanwhile (frozen mid-write past its lease), and the step is
    never committed (its dot-folder is removed by the next run there)."""
    tmp = directory / f".{step}.{what}"
    shutil.rmtree(tmp, ignore_errors=True)
    fill(tmp)
    make_durable(tmp)
    if fence is not None:
        fence()
    os.rename(tmp, directory / str(step))
    _fsync(directory)  # the rename itself


def readable_metadata(step_dir: Path) -> str | None:
    """Why Orbax would choke on this step's JSON before any restore (its manager reads them all)."""
    for rel in ("_CHECKPOINT_METADATA", "metrics/metrics"):
        path = step_dir / rel
        if not path.exists():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return f"{rel} is unreadable ({type(exc).__name__})"
    return None


def quarantine(directory: Path, step: int, reason: str, trial: str) -> Path:
    """Move a damaged step aside (never delete it) and say so."""
    target_root = quarantine_dir(directory)
    target_root.mkdir(parents=True, exist_ok=True)
    target = target_root / f"{step}-{time.strftime('%Y%m%dT%H%M%S')}"
    shutil.move(str(directory / str(step)), str(target))
    log.warning("%s: checkpoint step %d is damaged (%s); moved to %s, falling back to an older step",
                trial, step, reason, target)
    return target
