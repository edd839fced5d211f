"""The in-process cache of compiled programs: bounded by count and by measured memory, and a grid
study drops the programs of its taken points (in-process)."""

from __future__ import annotations

import types

import numpy as np

from conftest import make_study, run
from sweep.train import compiled
from sweep.train.compiled import FUNCTIONS, FunctionCache
from tests.trials.files import write_trial


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.batch = lambda hp, data, key: None  # jitted lazily: these tests never call the programs
    module.loss = lambda hp, params, batch, key: None  # (their signatures are read when a program is built)
    return module


def test_cache_drops_least_recently_used_programs_past_its_memory_bound(monkeypatch):
    module = _module("mem_trial")
    cache = FunctionCache(max_entries=8, max_bytes=60 << 20)
    held = []
    # The process's resident memory as the cache reads it is what these calls hold: the real
    # /proc reading also moves with other threads of the test process (a collection freeing an
    # earlier test's arrays mid-call: seen once in the fast tier under -n 2).
    monkeypatch.setattr(compiled, "resident_bytes", lambda: sum(a.nbytes for a in held))

    def compile_like(size: int) -> None:  # what a first call costs: resident memory that stays
        held.append(np.ones(size, np.uint8))

    values = []
    for width in range(3):
        value = cache.get(module, {"width": width}, ())
        values.append(value)
        cache.call(value, "window", lambda: compile_like(40 << 20))
        cache.call(value, "window", lambda: compile_like(40 << 20))  # measured once, not again
    # 40 MB each: the third pushed the total past 60 MB, so only the newest remains.
    assert len(cache) == 1 and cache.bytes() >= 40 << 20
    assert cache.get(module, {"width": 2}, ()) is values[2]
    assert cache.get(module, {"width": 0}, ()) is not values[0]  # dropped: built anew


def test_cache_count_bound_and_retain():
    module, other = _module("count_trial"), _module("other_trial")
    cache = FunctionCache(max_entries=3)
    for width in range(5):
        cache.get(module, {"width": width, "lr": 0.1}, ("lr",))
    assert len(cache) == 3  # widths 2, 3, 4
    cache.get(other, {"width": 3}, ())  # pushes width 2 out
    dropped = cache.retain(module, lambda static: static["width"] != 3)
    assert dropped == 1 and len(cache) == 2  # width 4, and the other module's width 3
    assert cache.retain(module, lambda static: "lr" not in static) == 0  # lr is traced, not static


GRID_TRIAL = "grid_width"  # tests/trials/grid_width.py, a name no other test file uses


def test_grid_study_drops_the_programs_of_points_it_has_taken(tmp_path, monkeypatch):
    write_trial(tmp_path, GRID_TRIAL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    study = make_study(tmp_path, trial=GRID_TRIAL, n_trials=3, sampler={"type": "grid"},
                       search_space={"width": {"type": "int", "low": 2, "high": 4}})
    cached = []

    def on_step(number: int, step: int) -> None:
        if step == 0:  # a trial starts: which widths still have programs in this process
            cached.append(sorted({e.static["width"] for e in FUNCTIONS._entries.values()
                                  if e.module_key[0] == GRID_TRIAL}))

    run(study, on_step=on_step)
    # Each trial's width leaves the cache as soon as it is taken: at most the current one is there.
    assert all(len(widths) <= 1 for widths in cached), cached
    assert not [e for e in FUNCTIONS._entries.values() if e.module_key[0] == GRID_TRIAL]
    assert compiled.resident_bytes() is not None


def test_the_persistent_compilation_cache_takes_jaxs_file_lock_for_processes_sharing_it(tmp_path):
    """Workers (and studies naming one $SWEEP_COMPILATION_CACHE) read and write one folder at once:
    with a size limit set, JAX locks the folder around each read and write and evicts past it."""
    import jax
    import jax.numpy as jnp

    from sweep.train.compile_events import CACHE_MAX_BYTES, use_compilation_cache

    use_compilation_cache(tmp_path / "cache")
    assert jax.config.jax_compilation_cache_max_size == CACHE_MAX_BYTES
    jax.jit(lambda x: jnp.sin(x) * 3.25)(jnp.arange(5.0)).block_until_ready()  # a program no other test has
    assert (tmp_path / "cache" / ".lockfile").exists()  # JAX's filelock, taken for the write
    assert [p for p in (tmp_path / "cache").iterdir() if p.name.endswith("-cache")]  # and the entry written
