"""XLA compilations counted (from JAX's monitoring events), JAX's persistent compilation cache, and
the compile lock that lets the workers of a study compile a program once.

The events are process-wide, so their counter (`COMPILES`) is too: callers take differences of
snapshots around a trial.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import jax
import numpy as np

from sweep import internals
from sweep.host import slots
from sweep.trial import code

# Executables this process needed ("requests"), and of those the ones the persistent cache served
# ("cache_hits"); XLA compiled the rest, counted per function name too ("compiled:window"). From
# JAX's monitoring events, which are process-wide; callers take differences of
# `COMPILES.copy()` snapshots around a trial.
COMPILES: collections.Counter[str] = collections.Counter()
_LISTENING = threading.Event()
_LISTEN_LOCK = threading.Lock()
_HIT = threading.local()  # a cache hit seen by this thread, not yet attributed to a function
CACHE_MAX_BYTES = 8 * 2**30  # the persistent compilation cache's size, past which the oldest-used entries go


def count_compilations() -> None:
    """Start counting XLA compilations into `COMPILES` (JAX's listeners are registered once)."""
    with _LISTEN_LOCK:
        if _LISTENING.is_set():
            return
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _LISTENING.set()


def compilations(counts: collections.Counter[str] | None = None, fun_name: str | None = None) -> int:
    """XLA compilations in `counts` (default: this process so far), of `fun_name` if given."""
    counts = COMPILES if counts is None else counts
    if fun_name is not None:
        return counts[f"compiled:{fun_name}"]
    return counts["requests"] - counts["cache_hits"]


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    # JAX times each backend compile request around its persistent-cache lookup; a hit inside it
    # is reported first (below), so what is not a hit was compiled.
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES["requests"] += 1
        if getattr(_HIT, "pending", False):
            _HIT.pending = False
        else:
            name = _plain_name(str(kwargs.get("fun_name", "?")))
            COMPILES[f"compiled:{name}"] += 1
            COMPILES[f"seconds:{name}"] += duration_secs
            COMPILES["compile_seconds"] += duration_secs


def spent(counts: collections.Counter[str], fun_name: str | None = None) -> float:
    """Seconds compiling in `counts` (of `fun_name` if given), with the waits for another worker's
    compile of the same program (`compiled_once`): time the trial spent on getting its executables."""
    if fun_name is not None:
        return counts[f"seconds:{fun_name}"] + counts[f"waited:{fun_name}"]
    return counts["compile_seconds"] + counts["compile_wait_seconds"]


def _plain_name(fun_name: str) -> str:
    """"window" for JAX's "jit(window)" (the form its compile events name a jitted function by)."""
    return fun_name[4:-1] if fun_name.startswith("jit(") and fun_name.endswith(")") else fun_name


def _on_event(event: str, **kwargs: str | int) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        COMPILES["cache_hits"] += 1
        _HIT.pending = True


def use_compilation_cache(directory: Path) -> None:
    """JAX's persistent compilation cache in `directory`: a resumed trial, a new process or another
    worker finds the executables already compiled for these shapes (every compile is cached: ours
    take ~0.5 s, under JAX's default 1 s threshold). A second study in the same process switches
    the cache to its own folder."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    count_compilations()
    if jax.config.jax_compilation_cache_dir != str(directory):
        cc.reset_cache()  # JAX opens the cache folder once; a new folder needs a reset
        cc.set_cache_dir(str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX otherwise puts XLA's GPU autotune-cache folder (under the cache dir) into the compile
    # options, so every key depends on the workdir's path: a copied or shared cache never hit.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    # Workers on forced CPU devices train on cpu:0, cpu:1, ...: without this, each device's program
    # had a key of its own and no worker ever read another's executable (as JAX already does on GPUs).
    internals.cache_key_without_cpu_device_assignment()
    # The workers of a study, and the studies that name one $SWEEP_COMPILATION_CACHE, read and write
    # the folder at once. Without a size limit JAX writes an entry in place with no lock, and a
    # reader can meet half of it (a warning, and a compile again); with one, JAX takes its file
    # lock around every read and write and evicts the least recently used entries past the limit
    # (jax/_src/lru_cache.py; it needs the `filelock` package).
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)


LOCK_WAIT_S = 600.0  # the longest a worker waits for another's compile of the same program
LOCKS = "sweep-compile-locks"  # in the cache folder: one empty file per program, its compile lock


def program_key(module: Any, fn_name: str, parts: tuple[Any, ...], args: tuple[Any, ...]) -> str:
    """What makes `fn_name` of the trial `module` one program in every worker of a study: the
    trial's code (its record's hash, not the module object), `parts` (what else its program is
    built from: static hyperparameters, traced names, ...) and the arguments' shapes and dtypes, not
    the device they are on (every worker's slot compiles the same program; see
    internals.cache_key_without_cpu_device_assignment). Two keys for one program cost a shared
    compile, never a wrong executable: JAX's own cache key decides what is read."""
    leaves, tree = jax.tree.flatten(args)
    shapes = [(np.shape(x), str(getattr(x, "dtype", type(x).__name__))) for x in leaves]
    text = repr((module.__name__, code.record(module)["sha256"], fn_name, parts, str(tree), shapes))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def functions_key(functions: Any, fn_name: str, traced: tuple[str, ...], args: tuple[Any, ...]) -> str:
    """`program_key` of the window or evaluation of a trial's `functions` (compiled.Functions)."""
    devices = functions.devices
    where = devices if devices == 1 else tuple(d.id for d in slots.local_devices(devices))
    static = repr(sorted((k, v) for k, v in functions.hp.items() if k not in traced))
    return program_key(functions.module, fn_name, (static, traced, where, functions.kind.static_key()), args)


@contextlib.contextmanager
def compiled_once(program: str | None, fn_name: str) -> Iterator[None]:
    """Hold `program`'s compile lock (a file lock in the cache folder) around its first call here.

    Workers of a study that start together would all compile the same program at once (4 workers
    on 2 cores: 4 compiles, each slower). With the lock the first compiles and writes the persistent
    cache (JAX writes the entry before the call returns), and the others, waiting, then read it: a
    cache hit. The wait is counted (`waited:<fn_name>`, `compile_wait_seconds`: see `spent`).

    flock locks are released by the kernel when their process dies (a killed worker leaves no stale
    lock), work across the hosts of an NFS workdir (Linux maps them to POSIX locks there), and a
    thread holds one program's lock at a time, only around one call: no lock order, no deadlock.
    """
    folder = jax.config.jax_compilation_cache_dir
    if program is None or not folder:
        yield
        return
    path = Path(folder) / LOCKS / f"{program}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.monotonic()
        # Bounded: a holder frozen mid-compile (SIGSTOP, a paused VM) keeps its lock, and the worker
        # that takes its trial over needs the same program. Past the bound it compiles unlocked
        # (only time is lost: JAX's own cache key decides what is reused).
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > LOCK_WAIT_S:
                    break
                time.sleep(0.05)
        waited = time.monotonic() - start
        COMPILES[f"waited:{fn_name}"] += waited
        COMPILES["compile_wait_seconds"] += waited
        yield
    finally:
        os.close(fd)  # releases the lock
