"""XLA compilations counted (from JAX's monitoring events) and JAX's persistent compilation cache.

The events are process-wide, so their counter (`COMPILES`) is too: callers take differences of
snapshots around a trial.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import jax

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
    # The workers of a study, and the studies that name one $SWEEP_COMPILATION_CACHE, read and write
    # the folder at once. Without a size limit JAX writes an entry in place with no lock, and a
    # reader can meet half of it (a warning, and a compile again); with one, JAX takes its file
    # lock around every read and write and evicts the least recently used entries past the limit
    # (jax/_src/lru_cache.py; it needs the `filelock` package).
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
