"""The scheduler simulator's ranking of freeze_thaw against the best Optuna pruner, checked on real
runs of the digits MLP (issue 40: "one real run confirms the simulator's ranking at the same
training steps").

    .venv/bin/python benchmarks/freeze_thaw_real.py --seeds 0 1 2 [--json-out FILE]
    .venv/bin/python benchmarks/freeze_thaw_real.py --report FILE [FILE ...]   (the table of saved runs)
    .venv/bin/python benchmarks/freeze_thaw_real.py --seeds 100 --sides tpe+median "freeze_thaw+rung view"

The study is the simulator's digits_mlp family (benchmarks/scheduler_sim.py; the search space,
2000 steps and an evaluation every 100 of benchmarks/data/curves/digits_mlp.json), run for real
with `python -m sweep run`, one worker, two sides per seed (sampler TPE, 10 startup trials,
seeded):

  tpe+median    pruner median (5 startup trials, 100 warm-up steps): the best pruner there
  freeze_thaw   scheduler freeze_thaw (min_steps 100, reduction_factor 3)

and, benchmark-only (`--sides`; not the product's behaviour), freeze_thaw+rung view: freeze_thaw
with its sampler seeing, BOHB's way, the trials at the highest step at least 10 trials reported,
COMPLETE with their value there (benchmarks/sampler_views.py, put into every process of the run by
sampler_view_site/sitecustomize.py).

Each side's n_trials is set so that it spends more than B = 15 full trials' worth of steps
(30,000: the simulator's 50% point); a run is stopped with SIGTERM once its log shows it past B
(nothing after B is compared, and with one worker nothing after B changes what came before; runs
saved before this stop, seeds 0-6, went to their end: their `steps` and `trials` are the whole
run's); then, as benchmarks/schedulers.py does, the best val_loss any
evaluation reached within the first B training steps (in the order the log says they were
trained), and within the first B/2, are compared per seed, beside the simulator's means there:
the mean, the normalized regret as the simulator reports it (y* and y_worst of the recorded
table) with a bootstrap 95% interval over the seeds, and the paired difference per seed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from schedulers import REPO, best_within, curve, segment  # noqa: E402

TABLE = json.loads((Path(__file__).resolve().parent / "data" / "curves" / "digits_mlp.json").read_text())
STEPS, EVERY = TABLE["steps"], TABLE["eval_every"]
BUDGET = 15 * STEPS
TPE = {"type": "tpe", "n_startup_trials": 10}
SIDES: dict[str, dict[str, Any]] = {
    "tpe+median": {"n_trials": 60, "pruner": {"type": "median", "n_startup_trials": 5, "n_warmup_steps": EVERY}},
    "freeze_thaw": {"n_trials": 110, "pruner": {"type": "none"},
                    "scheduler": {"type": "freeze_thaw", "min_steps": EVERY, "reduction_factor": 3}},
}
# Variants: a side run as another, with its sampler seeing the study through a view of
# benchmarks/sampler_views.py in every process of the run (benchmark-only), or with more scheduler
# keys (the product's `sampler_sees: rung`, which with one worker is that view: the check below).
VARIANTS: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "freeze_thaw+rung view": ("freeze_thaw", "rung", {}),
    "freeze_thaw+sampler_sees rung": ("freeze_thaw", None, {"sampler_sees": "rung"}),
    "freeze_thaw+rung wide view": ("freeze_thaw", "rung wide", {}),
    "freeze_thaw+predicted view": ("freeze_thaw", "predicted", {}),
}
SITE = Path(__file__).resolve().parent / "sampler_view_site"


def run_until(command: list[str], budget: int, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """Run `sweep run`, reading its log as it goes; SIGTERM it once the segments its log has ended
    (as `curve` counts them) pass `budget` steps. The log, and whether it was stopped."""
    import signal
    import subprocess

    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines, at, spent, stopped = [], {}, 0, False
    for line in process.stderr:
        lines.append(line)
        ended = segment(line, at)
        if ended is not None and not stopped:
            spent += max(0, ended[2] - ended[1])
            if spent > budget:
                process.send_signal(signal.SIGTERM)
                stopped = True
    code = process.wait()
    if code != (143 if stopped else 0):
        raise SystemExit(f"{command[-1]}: exit {code}\n{''.join(lines)[-3000:]}")
    return "".join(lines), stopped


def run_side(folder: Path, side: str, seed: int) -> dict[str, Any]:
    name = f"{side.replace('+', '-').replace(' ', '-')}-{seed}"
    base, view, keys = VARIANTS.get(side, (side, None, {}))
    sides = {**SIDES[base], "scheduler": {**SIDES[base]["scheduler"], **keys}} if keys else SIDES[base]
    data = {"name": name, "trial": TABLE["trial"], "objective": TABLE["objective"],
            "search_space": TABLE["search_space"], "sampler": {**TPE, "seed": seed},
            "train": {"steps": STEPS, "eval_every": EVERY, "seed": seed},
            "checkpoint": {"every_steps": EVERY, "keep_last": 1, "keep_best": 1, "max_write_share": None},
            "workdir": str(folder / name), **sides}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = None
    if view is not None:
        env = {**os.environ, "SWEEP_BENCH_SAMPLER_VIEW": view, "SWEEP_BENCH_STEPS": str(STEPS),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    log, stopped = run_until([sys.executable, "-m", "sweep", "run", str(path)], BUDGET, env)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder / name / 'study.db'}")
    trials = study.get_trials(deepcopy=False)
    points = curve(log, trials)
    steps = sum(max(t.intermediate_values, default=0) for t in trials)
    # the log's order accounts for every step (a stopped run: but the stopped trials' last ones)
    assert max(p[0] for p in points) == steps or stopped and max(p[0] for p in points) > BUDGET, (side, seed)
    return {"side": side, "seed": seed, "trials": len(trials), "steps": steps, "stopped": stopped,
            "seconds": time.perf_counter() - start,
            "best_at_half": best_within(points, BUDGET // 2), "best_at_budget": best_within(points, BUDGET)}


def report(rows: list[dict[str, Any]], out: Any = print, same: dict[str, str] | None = None) -> None:
    """The table of RESULTS.md: per side and point, the mean best val_loss (each seed's), its
    normalized regret with a bootstrap 95% interval over the seeds; then freeze_thaw minus the
    pruner, paired by seed, with its interval and the seeds where freeze_thaw was lower. `same`
    reports one side's runs as another's (two forms of one rule, checked to give the same run)."""
    from scheduler_sim import Tabulated, bootstrap

    same = same or {}
    rows = [{**r, "side": same.get(r["side"], r["side"])} for r in rows]
    twice = sorted(k for k, n in collections.Counter((r["side"], r["seed"]) for r in rows).items() if n > 1)
    if twice:
        raise SystemExit(f"two runs of {', '.join(f'{side} seed {seed}' for side, seed in twice)}: give each seed one run a side")
    bench = Tabulated("digits_mlp")
    by = {(r["side"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    # both sides of the check on every seed; a variant where it ran on every seed
    sides = [*SIDES, *(v for v in VARIANTS if any(r["side"] == v for r in rows))]
    missing = [f"{side} seed {seed}" for seed in seeds for side in sides if (side, seed) not in by]
    if missing:
        raise SystemExit(f"no run of {', '.join(missing)}: each seed needs every side")
    points = {"best_at_half": BUDGET // 2, "best_at_budget": BUDGET}
    # a variant's intervals draw from their own generator: the check's stay as without it
    rng, variant_rng = np.random.RandomState(0), np.random.RandomState(1)
    out(f"{len(seeds)} seeds ({', '.join(map(str, seeds))}); y* {bench.y_star:.4f}, y_worst {bench.y_worst:.4f}")
    out("| side | " + " | ".join(f"val_loss within {n:,} steps (each seed) | regret" for n in points.values()) + " |")
    out("|---" * (1 + 2 * len(points)) + "|")
    values = {side: {k: np.array([by[side, s][k] for s in seeds]) for k in points} for side in sides}
    for side in sides:
        cells = []
        for key in points:
            v = values[side][key]
            regret = (v - bench.y_star) / (bench.y_worst - bench.y_star)
            lo, hi = bootstrap(regret, rng if side in SIDES else variant_rng)
            cells += [f"{v.mean():.4f} ({', '.join(f'{x:.4f}' for x in v)})", f"{regret.mean():.3f} [{lo:.3f}, {hi:.3f}]"]
        out(f"| {side} | " + " | ".join(cells) + " |")
    for side in sides[1:]:
        for key, n in points.items():
            diff = values[side][key] - values["tpe+median"][key]
            lo, hi = bootstrap(diff, rng if side in SIDES else variant_rng)
            out(f"within {n:,} steps, {side} minus tpe+median: {diff.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]; "
                f"{side} lower in {int((diff < 0).sum())}, equal in {int((diff == 0).sum())}, "
                f"higher in {int((diff > 0).sum())} of {len(seeds)} seeds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sides", nargs="+", choices=[*SIDES, *VARIANTS], default=list(SIDES),
                        help="the sides to run on each seed (default: the two of the check)")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--report", type=Path, nargs="+", default=None, help="print the table of saved runs")
    parser.add_argument("--same", nargs="+", default=[], metavar="SIDE=AS",
                        help="with --report: report SIDE's runs as AS's (two forms of one rule checked to give the same run)")
    args = parser.parse_args(argv)
    if args.report is not None:
        same = dict(pair.partition("=")[::2] for pair in args.same)
        unknown = [side for pair in same.items() for side in pair if side not in SIDES and side not in VARIANTS]
        if unknown:
            parser.error(f"--same: no side {', '.join(map(repr, unknown))} (sides: {', '.join([*SIDES, *VARIANTS])})")
        report([row for path in args.report for row in json.loads(path.read_text())], same=same)
        return 0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-freeze-thaw-") as tmp:
        for seed in args.seeds:
            for side in args.sides:
                rows.append(run_side(Path(tmp), side, seed))
                print(json.dumps(rows[-1]), flush=True)
    short = [r["side"] for r in rows if r["steps"] < BUDGET and not r["stopped"]]
    assert not short, f"spent fewer than B = {BUDGET} steps: {short} (raise their n_trials)"
    print()
    if set(SIDES) <= set(args.sides):
        report(rows)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
