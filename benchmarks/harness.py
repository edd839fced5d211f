"""What the benchmarks share: the example study in a temporary workdir, and side-by-side timing."""

from __future__ import annotations

import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.study import config as config_lib  # noqa: E402


def quiet() -> None:
    import optuna

    logging.getLogger("sweep").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def example(workdir: Path, study: str = "studies/digits_mlp.yaml", **study_updates: Any) -> config_lib.Config:
    """The study file's config, with its workdir/storage moved to `workdir` and fields replaced."""
    config = config_lib.load(REPO / study)
    config.workdir = workdir
    config.storage = f"sqlite:///{workdir / 'study.db'}"
    updates = {}
    for key, value in study_updates.items():
        current = getattr(config.study, key)
        updates[key] = current.model_copy(update=value) if isinstance(value, dict) else value
    config.study = config.study.model_copy(update=updates)
    return config


def alternate(sides: dict[str, Callable[[int], float]], rounds: int) -> dict[str, list[float]]:
    """Run the sides in ABBA order `rounds` times; each call returns its own measured seconds."""
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(sides[name](r))
    return times


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def report(label: str, a: str, b: str, times: dict[str, list[float]], target: str, use_median: bool = True) -> float:
    agg = statistics.median if use_median else sum
    ta, tb = agg(times[a]), agg(times[b])
    kind = "median" if use_median else "total"
    print(f"{label}: {a} {kind} {ta * 1000:.2f} ms, {b} {kind} {tb * 1000:.2f} ms over {len(times[a])} runs each")
    print(f"ratio {a}/{b}: {ta / tb:.3f}  (target {target})")
    return ta / tb
