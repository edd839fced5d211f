"""Schedulers against Optuna's pruners on tabulated learning curves, in the scheduler simulator
(sweep/run/simulator.py): every method decides with its real code, at the same budget of training
steps, over many seeds (issue 40).

    .venv/bin/python benchmarks/scheduler_sim.py --family lcbench --tasks 3945,34539 --seeds 0-19

Families: `lcbench` (YAHPO Gym's LCBench surrogate, benchmarks/lcbench.py: 52 epochs, one step an
epoch, val_cross_entropy; `--tasks` picks its tasks), and `digits_mlp` and `digits_resnet`: the
curves recorded with sweep itself (Tabulated; one task each, `--tasks` is ignored). For each
(task, seed, method) it records the best value reported within 10, 25, 50 and 100% of the budget;
the report gives the mean normalized regret ((best - y*) / (y_worst - y*); y* the best value
any of 10,000 random configurations of an LCBench task reaches, or any recorded configuration
reached; y_worst the median final value of those configurations) and the mean
rank across methods, with bootstrap 95% intervals over (task, seed), as Syne Tune's benchmarking
reports do. Results go to a JSON file (`--out`), which `--report` prints again.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import optuna
import scipy.stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sweep.run.simulator import Curve, simulate  # noqa: E402
from sweep.study import config as config_lib  # noqa: E402

FRACTIONS = (0.1, 0.25, 0.5, 1.0)
GRID = tuple(round(0.05 * k, 2) for k in range(1, 21))  # the figure's budget fractions
WORKERS = 4
FULL_TRIALS = 30  # the budget: this many trials' worth of steps
N_TRIALS = 100_000  # n_trials of each study: the budget of steps ends it first, unless --n-trials says fewer


def methods(steps: int, min_steps: int) -> dict[str, dict[str, Any]]:
    """Each method's study-file keys (sampler, pruner, scheduler)."""
    tpe = {"type": "tpe", "n_startup_trials": 10}
    return {
        "random": {"sampler": {"type": "random"}},
        "tpe+sha": {"sampler": tpe, "pruner": {"type": "successive_halving", "min_resource": min_steps,
                                                "reduction_factor": 3}},
        "tpe+hyperband": {"sampler": tpe, "pruner": {"type": "hyperband", "min_resource": min_steps,
                                                      "max_resource": steps, "reduction_factor": 3}},
        "tpe+median": {"sampler": tpe, "pruner": {"type": "median", "n_startup_trials": 5,
                                                   "n_warmup_steps": min_steps}},
        "asha": {"sampler": tpe, "scheduler": {"type": "asha", "min_steps": min_steps, "reduction_factor": 3}},
        "hyperband": {"sampler": tpe, "scheduler": {"type": "hyperband", "min_steps": min_steps,
                                                    "reduction_factor": 3}},
        # sweep's freeze_thaw (its name in results files: the rule chosen on development seeds, which
        # continues only the paused trials in their rung's top; the other rule, `freeze_thaw` in
        # benchmarks/results/sim_dev_digits.json, was the prototype's at commit 9b79a5e)
        "freeze_thaw_top": {"sampler": tpe, "scheduler": {"type": "freeze_thaw", "min_steps": min_steps,
                                                          "reduction_factor": 3}},
        # the same with `sampler_sees: rung` (BOHB's rule: TPE learns from the trials at the highest
        # step 10 of them reported, sweep/store/samplers.py RungView)
        "asha+rung": {"sampler": tpe, "scheduler": {"type": "asha", "min_steps": min_steps, "reduction_factor": 3,
                                                    "sampler_sees": "rung"}},
        "freeze_thaw+rung": {"sampler": tpe, "scheduler": {"type": "freeze_thaw", "min_steps": min_steps,
                                                           "reduction_factor": 3, "sampler_sees": "rung"}},
    }


class LCBench:
    """One LCBench task as a simulator table: a configuration's 52-epoch val_cross_entropy curve and
    its mean seconds per epoch."""

    steps, min_steps = 52, 1

    def __init__(self, task: str) -> None:
        import lcbench

        self.task, self.surrogate, self.lcbench = task, lcbench.Surrogate(task), lcbench
        self.space = lcbench.SPACE
        final = self.surrogate.curves(lcbench.sample(10_000, 12345))
        self.y_star, self.y_worst = float(final.min()), float(np.median(final[:, -1]))

    def __call__(self, number: int, params: Mapping[str, Any]) -> Curve:
        curve = self.surrogate.curves([params])[0]
        seconds = float(self.surrogate.times([params])[0].mean())
        return Curve({e + 1: float(v) for e, v in enumerate(curve)}, seconds)


class Tabulated:
    """The curves recorded with sweep itself (benchmarks/record_curves.py -> benchmarks/data/curves/
    <family>.json): a sampled configuration trains along the curve of the nearest recorded one, as
    Syne Tune's blackbox repository does for tabulated benchmarks (a 1-nearest-neighbour surrogate).
    Distance: each numeric parameter scaled to [0, 1] over its range (log-scaled where the space
    says `log`), a categorical one 0 if equal and 1 if not; ties go to the first recorded."""

    def __init__(self, family: str) -> None:
        table = json.loads((Path(__file__).resolve().parent / "data" / "curves" / f"{family}.json").read_text())
        self.task, self.space = family, table["search_space"]
        self.steps, self.min_steps = table["steps"], table["eval_every"]
        self.configs = table["configs"]
        self.numeric = [k for k, v in self.space.items() if v["type"] != "categorical"]
        self.categorical = [k for k in self.space if k not in self.numeric]
        self.points = np.array([[self._scale(k, c["params"][k]) for k in self.numeric] for c in self.configs])
        self.curves = [Curve({int(s): float(v) for s, v in c["values"].items()}, c["seconds_per_step"])
                       for c in self.configs]
        finals = np.array([c.values[self.steps] for c in self.curves])
        self.y_star = float(min(min(c.values.values()) for c in self.curves))
        self.y_worst = float(np.median(finals))

    def _scale(self, key: str, value: float) -> float:
        spec = self.space[key]
        lo, hi, v = float(spec["low"]), float(spec["high"]), float(value)
        if spec.get("log"):
            lo, hi, v = np.log(lo), np.log(hi), np.log(v)
        return (v - lo) / (hi - lo)

    def __call__(self, number: int, params: Mapping[str, Any]) -> Curve:
        point = np.array([self._scale(k, params[k]) for k in self.numeric])
        distance = ((self.points - point) ** 2).sum(axis=1)
        for k in self.categorical:
            distance += np.array([c["params"][k] != params[k] for c in self.configs], dtype=float)
        return self.curves[int(np.argmin(distance))]  # argmin: the first of equal distances


FAMILIES = ("lcbench", "digits_mlp", "digits_resnet")


def benches(family: str, tasks: str) -> list[Any]:
    if family == "lcbench":
        return [LCBench(task) for task in tasks.split(",")]
    return [Tabulated(family)]


def study(bench: Any, method: dict[str, Any], seed: int, n_trials: int = 100_000) -> config_lib.Config:
    """The study file of `method` on `bench` (the budget is the simulator's max_steps, unless
    `n_trials` ends it first)."""
    raw = {"name": "sim", "trial": "trials.digits_mlp", "n_trials": n_trials,
           "objective": {"metric": "val_loss", "direction": "minimize"},
           "search_space": bench.space, "train": {"steps": bench.steps, "eval_every": bench.min_steps}, **method}
    raw["sampler"] = {**raw["sampler"], "seed": seed}
    return config_lib.from_dict(raw, import_trial=False)


def best_within(sim: Any, budget: int, fractions: Sequence[float] = FRACTIONS) -> list[float]:
    """The best value reported within each fraction of the budget."""
    out = []
    for f in fractions:
        values = [r.value for r in sim.reports if r.used <= f * budget]
        out.append(min(values) if values else float("inf"))
    return out


def run_one(bench: Any, name: str, method: dict[str, Any], seed: int) -> dict[str, Any]:
    budget = FULL_TRIALS * bench.steps
    start = time.perf_counter()
    sim = simulate(study(bench, method, seed, N_TRIALS), bench, workers=WORKERS, max_steps=budget)
    return {"method": name, "seed": seed, "budget": FULL_TRIALS, "workers": WORKERS, "best": best_within(sim, budget),
            "curve": best_within(sim, budget, GRID), "trials": len(sim.trials),
            "seconds": time.perf_counter() - start, "y_star": bench.y_star, "y_worst": bench.y_worst}


def bootstrap(values: np.ndarray, rng: np.random.RandomState, n: int = 1000) -> tuple[float, float]:
    means = values[rng.randint(len(values), size=(n, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _regret(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([(np.asarray(r[key]) - r["y_star"]) / (r["y_worst"] - r["y_star"]) for r in rows])


def _by_family(results: list[dict[str, Any]]) -> dict[str, tuple[list[str], list[tuple[str, int]], dict]]:
    """family -> (methods, (task, seed) keys, (task, seed, method) -> result); runs with another
    worker count than 4 are a family of their own ("digits_mlp, 1 workers"), and a (task, seed,
    method) given twice is refused (exit with its name). A method that ran on
    only some of a family's (task, seed) pairs is left out of the family's entry and gets one of its
    own, "family, the N pairs <method> ran", where every method is compared on those pairs only
    (a mean over other pairs would not compare)."""
    def group(r: dict[str, Any]) -> str:  # runs with other worker counts are another experiment
        workers = r.get("workers", 4)  # 4: results from before --workers
        return r.get("family", "lcbench") + ("" if workers == 4 else f", {workers} workers")

    out = {}
    for family in dict.fromkeys(map(group, results)):
        mine = [r for r in results if group(r) == family]
        table = {(r["task"], r["seed"], r["method"]): r for r in mine}
        if len(table) < len(mine):
            given = collections.Counter((r["task"], r["seed"], r["method"]) for r in mine)
            twice = sorted(k for k, n in given.items() if n > 1)
            raise SystemExit(f"{family}: results repeat (task, seed, method) {twice[0]} ({len(twice)} in all): "
                             "give the files of one experiment")
        names = list(dict.fromkeys(r["method"] for r in mine))
        keys = sorted({(r["task"], r["seed"]) for r in mine})
        ran = {m: [k for k in keys if k + (m,) in table] for m in names}
        full = [m for m in names if len(ran[m]) == len(keys)]
        out[family] = (full, keys, table)
        for m in names:
            if m not in full:
                shared = [k for k in ran[m] if all(k + (n,) in table for n in full)]
                out[f"{family}, the {len(shared)} pairs {m} ran"] = (full + [m], shared, table)
    return out


def report(results: list[dict[str, Any]], out: Callable[[str], None] = print) -> None:
    for family, (names, keys, table) in _by_family(results).items():
        rng = np.random.RandomState(0)
        regret = {m: _regret([table[k + (m,)] for k in keys], "best") for m in names}
        stacked = np.stack([regret[m] for m in names])  # (methods, runs, fractions)
        ranks = scipy.stats.rankdata(stacked, axis=0)  # ties share their mean rank
        budgets = sorted({r.get("budget", FULL_TRIALS) for r in table.values()})
        workers = sorted({r.get("workers", 4) for r in table.values()})  # 4: results from before --workers
        tasks = sorted({k[0] for k in keys})
        out(f"{family}: {len(keys)} (task, seed) pairs (tasks {', '.join(map(str, tasks))}); budget {budgets} "
            f"full trials of steps; {'/'.join(map(str, workers))} workers")
        out("| method | " + " | ".join(f"regret @{int(f * 100)}%" for f in FRACTIONS) + " | "
            + " | ".join(f"rank @{int(f * 100)}%" for f in FRACTIONS) + " |")
        out("|---" * (1 + 2 * len(FRACTIONS)) + "|")
        for j, m in enumerate(names):
            cells = []
            for i in range(len(FRACTIONS)):
                lo, hi = bootstrap(regret[m][:, i], rng)
                cells.append(f"{regret[m][:, i].mean():.4f} [{lo:.4f}, {hi:.4f}]")
            for i in range(len(FRACTIONS)):
                lo, hi = bootstrap(ranks[j, :, i], rng)
                cells.append(f"{ranks[j, :, i].mean():.2f} [{lo:.2f}, {hi:.2f}]")
            out(f"| {m} | " + " | ".join(cells) + " |")
        out("")


LABELS = {"random": "random search", "tpe+sha": "TPE + SuccessiveHalving pruner", "tpe+hyperband": "TPE + Hyperband pruner",
          "tpe+median": "TPE + median pruner", "asha": "sweep asha", "hyperband": "sweep hyperband",
          "freeze_thaw": "freeze-thaw prototype (beyond the top)", "freeze_thaw_top": "sweep freeze_thaw",
          "asha+rung": "sweep asha, sampler_sees: rung", "freeze_thaw+rung": "sweep freeze_thaw, sampler_sees: rung"}


def figure(results: list[dict[str, Any]], path: Path) -> None:
    """Mean normalized regret against the fraction of the budget spent, one panel a family, a
    bootstrap 95% band a method (the runs that recorded the curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = _by_family([r for r in results if "curve" in r])
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), squeeze=False)
    for ax, (family, (names, keys, table)) in zip(axes[0], families.items()):
        rng = np.random.RandomState(0)
        for m in names:
            regret = _regret([table[k + (m,)] for k in keys], "curve")
            band = np.array([bootstrap(regret[:, i], rng) for i in range(len(GRID))])
            style = "--" if m.startswith("tpe+") else "-"  # Optuna's pruners dashed
            ax.plot(GRID, regret.mean(axis=0), label=LABELS.get(m, m), linestyle=style)
            ax.fill_between(GRID, band[:, 0], band[:, 1], alpha=0.15)
        ax.set_yscale("log")
        ax.set_title(f"{family} ({len(keys)} runs)")
        ax.set_xlabel("fraction of the budget (training steps)")
        ax.set_ylabel("mean normalized regret")
        ax.grid(alpha=0.3)
    handles = {}  # one legend for every panel: a method missing from the last panel is still named
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[0][-1].legend(list(handles.values()), list(handles), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    global FULL_TRIALS, WORKERS, N_TRIALS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="lcbench", choices=FAMILIES)
    parser.add_argument("--tasks", default="3945")
    parser.add_argument("--seeds", default="0-1")
    parser.add_argument("--methods", default=None, help="comma-separated; default: all")
    parser.add_argument("--budget", type=int, default=FULL_TRIALS, help="full trials' worth of steps")
    parser.add_argument("--workers", type=int, default=WORKERS, help="simulated workers")
    parser.add_argument("--n-trials", type=int, default=N_TRIALS, help="n_trials of each study (a real run's)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--report", default=None, nargs="+", help="print the report of results files")
    parser.add_argument("--figure", default=None, type=Path, help="with --report: draw regret against budget (PNG)")
    args = parser.parse_args()
    FULL_TRIALS, WORKERS, N_TRIALS = args.budget, args.workers, args.n_trials
    if args.report:
        results = [r for f in args.report for r in json.loads(Path(f).read_text())]
        report(results)
        if args.figure:
            figure(results, args.figure)
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("sweep").setLevel(logging.WARNING)
    results: list[dict[str, Any]] = []
    for bench in benches(args.family, args.tasks):
        task = bench.task
        chosen = methods(bench.steps, bench.min_steps)
        if args.methods:
            chosen = {k: v for k, v in chosen.items() if k in args.methods.split(",")}
        for seed in _seeds(args.seeds):
            for name, method in chosen.items():
                r = {"family": args.family, "task": task, **run_one(bench, name, method, seed)}
                results.append(r)
                print(f"{task} seed {seed} {name:14s} best@100% {r['best'][-1]:.4f} ({r['trials']} trials, "
                      f"{r['seconds']:.1f} s)", flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(results))
    report(results)


if __name__ == "__main__":
    main()
