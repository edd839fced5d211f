"""What TPE gains where it sees paused trials: asha and freeze_thaw in the scheduler simulator, with
the sampler as a run has it and with paused trials shown to it as PRUNED (issue 40 item 4).

    .venv/bin/python benchmarks/sampler_sees_paused.py --family digits_mlp --seeds 100-119 --out FILE
    .venv/bin/python benchmarks/sampler_sees_paused.py --family digits_mlp --seeds 0-4 --count-random

Why: Optuna's TPESampler learns from COMPLETE and PRUNED trials only (optuna/samplers/_tpe/
sampler.py: `_sample_relative`, `sample_independent`), and samples at random until
`n_startup_trials` of them exist. A trial paused by a sweep scheduler is WAITING until it goes on
or the study ends (docs/schedulers.md, "How a paused trial looks in Optuna's storage"), so under
asha and freeze_thaw TPE samples at random for most of a study: in the simulator's digits MLP with
asha, every trial started before 50% of the budget was sampled at random. Optuna's own pruners
mark a stopped trial PRUNED, and TPE ranks PRUNED trials by the step they reached and their value
there, which is what a paused trial is until it goes on. The "+sees paused" methods show the
sampler each paused trial (WAITING with `paused_at`) as PRUNED at its last report; nothing else
changes (a benchmark-only patch of sweep's RestartProofSampler, not the product's behaviour).
The "+rung view" methods show it, BOHB's way, the trials at the highest step at least 10 trials
reported, COMPLETE with their value there; "+rung below" and "+rung wide" are forms of that view
(benchmarks/sampler_views.py says each view).
Development seeds only (100-119): the held-out 0-19 are the tables' own. `--count-random` only
counts, per seed, the trials started and those TPE sampled at random within 25% and 50% of the
budget (fewer than its n_startup_trials, 10, trials COMPLETE or PRUNED as it started).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scheduler_sim as sim  # noqa: E402
from sampler_views import PausedAsPruned, RungBelow, RungView, RungWide, sampler_view  # noqa: E402,F401 (PausedAsPruned: tests)
from sweep.run.simulator import simulate  # noqa: E402


def sampler_sees_paused() -> Any:
    return sampler_view(PausedAsPruned)


# The rung views of benchmarks/sampler_views.py, by the suffix of their methods' names.
RUNG_VIEWS = {"rung view": RungView, "rung below": RungBelow, "rung wide": RungWide}


def variants(name: str, method: dict[str, Any], rung: bool = True) -> list[tuple[str, Any]]:
    """The method as it is and, with a scheduler, the ones whose sampler sees paused trials as
    PRUNED and (`rung`) sees the trials at the highest step enough of them reported."""
    out: list[tuple[str, Any]] = [(name, contextlib.nullcontext)]
    if "scheduler" in method:
        out.append((f"{name}+sees paused", sampler_sees_paused))
        if rung:
            out += [(f"{name}+{suffix}", functools.partial(sampler_view, view)) for suffix, view in RUNG_VIEWS.items()]
    return out


def count_random(bench: Any, method: dict[str, Any], seed: int, sees_paused: bool,
                 startup: int = 10) -> list[list[int]]:
    """Trials started, those sampled at random, trials finished, and the distinct curves the
    started ones got (a table of recorded curves serves a nearby configuration the same curve
    again), within 25% and 50% of the budget."""
    budget = sim.FULL_TRIALS * bench.steps
    curves: dict[int, int] = {}  # trial number -> id of the curve it trained along

    def table(number: int, params: Any) -> Any:
        curve = bench(number, params)
        curves[number] = id(curve)
        return curve

    run = simulate(sim.study(bench, method, seed), table, workers=sim.WORKERS, max_steps=budget)
    cells = []
    for share in (0.25, 0.5):
        until = max((r.time for r in run.reports if r.used <= share * budget), default=0.0)
        started, at_random, finished, paused = [], 0, 0, set()
        for d in sorted(run.decisions, key=lambda d: d.time):  # sorted() is stable: ties keep their order
            if d.time > until:
                break
            finished += d.kind in ("complete", "prune", "end")
            if d.kind == "pause":
                paused.add(d.number)
            elif d.kind in ("promote", "end"):
                paused.discard(d.number)
            if d.kind == "start":
                started.append(d.number)
                at_random += finished + (len(paused) if sees_paused else 0) < startup
        distinct = len({curves[n] for n in started})
        cells.append([len(started), at_random, finished, distinct])
    return cells


def counts_text(cells: list[list[float]]) -> str:
    return "; ".join(f"@{share}%: {a:.1f} started, {b:.1f} at random, {c:.1f} finished, {d:.1f} distinct curves"
                     for share, (a, b, c, d) in zip((25, 50), cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sim.FAMILIES, default="digits_mlp")
    parser.add_argument("--tasks", default="")
    parser.add_argument("--seeds", type=sim._seeds, default=sim._seeds("100-119"))
    parser.add_argument("--methods", default="asha,tpe+median")
    parser.add_argument("--views", default="as is,sees paused,rung view",
                        help="which of the variants to run (with --out): as is, sees paused, " + ", ".join(RUNG_VIEWS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--count-random", action="store_true", help="count the trials TPE sampled at random")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.count_random:
        for bench in sim.benches(args.family, args.tasks):
            every = sim.methods(bench.steps, bench.min_steps)
            for name in args.methods.split(","):
                for label, patch in variants(name, every[name], rung=False):
                    each = []
                    for seed in args.seeds:
                        with patch():
                            each.append(count_random(bench, every[name], seed, patch is sampler_sees_paused))
                        print(f"{bench.task} {label} seed {seed} {counts_text(each[-1])}", flush=True)
                    mean = np.mean(np.array(each, dtype=float), axis=0).tolist()
                    print(f"{bench.task} {label} mean of {len(each)} seeds {counts_text(mean)}", flush=True)
        return
    if args.out is None:
        parser.error("--out is required (but with --count-random)")
    rows = []
    for bench in sim.benches(args.family, args.tasks):
        every = sim.methods(bench.steps, bench.min_steps)
        for name in args.methods.split(","):
            for label, patch in variants(name, every[name]):
                if (label[len(name) + 1:] or "as is") not in args.views.split(","):
                    continue
                for seed in args.seeds:
                    with patch():
                        row = sim.run_one(bench, label, every[name], seed)
                    rows.append({"family": args.family, "task": str(bench.task), **row})
                    print(json.dumps({k: row[k] for k in ("method", "seed", "best", "trials")}), flush=True)
    args.out.write_text(json.dumps(rows))
    sim.report(rows)


if __name__ == "__main__":
    main()
