"""sweep's schedulers against Optuna's own pruners on the built-in digits trial (issue 27 item 7).

    .venv/bin/python benchmarks/schedulers.py --seeds 0 1 2 [--trials 27] [--json-out FILE]

Each side is one real `python -m sweep run` of the same study (the digits MLP, learning rate,
width and optimizer searched, 1800 steps, an evaluation every 50) in a fresh workdir, with:

  optuna-sh          pruner successive_halving (min_resource 200, reduction_factor 3): a trial cut at
                     a rung ends for good
  optuna-hyperband   pruner hyperband (min_resource 200, max_resource 1800, reduction_factor 3)
  asha-pause         scheduler asha (min_steps 200, reduction_factor 3): cut trials pause and are
                     promoted later when they rank in the top third of their rung
  hyperband-resume   scheduler hyperband (the same rungs, brackets of asha-pause)
  pbt                scheduler pbt, population 7, interval 300 steps: 7 trials to the end, about
                     the steps the pruned sides spend with 27 trials

For each side and seed (sampler.seed and train.seed): the training steps spent (every trial's
last trained step, summed: sweep never trains a step twice, so a promoted trial's steps count
once), the best COMPLETE trial's value (val_loss, lower is better), and, **at the same budget**,
the best validation value any evaluation reached within the first B training steps, where B is
the smallest total of the sides for that seed. The order in which steps were trained comes from
each run's log (`started`, `paused at`, `promoted`, `goes on`, `complete`, `pruned` lines,
one process: the log order is the training order), each trial's evaluations from Optuna's
storage (for a PBT member, its own value at an exploit step from its lineage).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

REPO = Path(__file__).resolve().parents[1]
STEPS, R, ETA = 1800, 200, 3
BASE: dict[str, Any] = {
    "trial": "trials.digits_mlp",
    "objective": {"metric": "val_loss", "direction": "minimize"},
    "search_space": {
        "learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True},
        "hidden": {"type": "int", "low": 16, "high": 128, "step": 16},
        "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
    },
    "fixed": {"batch_size": 64},
    "checkpoint": {"every_steps": 300, "keep_last": 1, "keep_best": 1, "max_write_share": None},
}
SIDES: dict[str, dict[str, Any]] = {
    "optuna-sh": {"pruner": {"type": "successive_halving", "min_resource": R, "reduction_factor": ETA}},
    "optuna-hyperband": {"pruner": {"type": "hyperband", "min_resource": R, "max_resource": STEPS,
                                    "reduction_factor": ETA}},
    "asha-pause": {"pruner": {"type": "none"}, "scheduler": {"type": "asha", "min_steps": R, "reduction_factor": ETA}},
    "hyperband-resume": {"pruner": {"type": "none"},
                         "scheduler": {"type": "hyperband", "min_steps": R, "reduction_factor": ETA}},
    "pbt": {"pruner": {"type": "none"}, "scheduler": {"type": "pbt", "population": 7, "interval_steps": 300}},
}


def run_side(folder: Path, side: str, seed: int, n_trials: int) -> dict[str, Any]:
    name = f"{side}-{seed}"
    n = SIDES[side].get("scheduler", {}).get("population", n_trials)
    data = {**BASE, **SIDES[side], "name": name, "n_trials": n, "workdir": str(folder / name),
            "sampler": {"type": "tpe", "seed": seed}, "train": {"steps": STEPS, "eval_every": 50, "seed": seed}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "sweep", "run", str(path)], cwd=REPO,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{side} seed {seed}: exit {result.returncode}\n{result.stderr[-3000:]}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder / name / 'study.db'}")
    trials = study.get_trials(deepcopy=False)
    complete = [t.value for t in trials if t.state.name == "COMPLETE"]
    return {"side": side, "seed": seed, "trials": len(trials), "complete": len(complete),
            "best": min(complete) if complete else None,
            "steps": sum(max(t.intermediate_values, default=0) for t in trials),
            "curve": curve(result.stderr, trials)}


END = re.compile(r"trial (\d+): (?:paused at (?:rung|step) (\d+)|(?:complete|pruned), .* (\d+) steps$)")


def segment(line: str, at: dict[int, int]) -> tuple[int, int, int] | None:
    """(trial, from step, to step) where `line` ends a segment of its trial (a `paused at rung R`
    or `complete/pruned ..., N steps` line), `at` holding each trial's step so far (updated); None
    for any other line."""
    m = END.search(line.strip())
    if not m:
        return None
    number, end = int(m.group(1)), int(m.group(2) or m.group(3))
    start = at.get(number, 0)
    at[number] = max(start, end)
    return number, start, end


def curve(log: str, trials: list[Any]) -> list[tuple[int, float]]:
    """(training steps spent so far, value) of every evaluation, in the order they were trained:
    each `paused at rung R` or `complete/pruned ..., N steps` line ends a segment of its trial,
    from where its previous segment ended."""
    values = {t.number: dict(t.intermediate_values) for t in trials}
    for t in trials:  # a PBT recipient's own value at an exploit step, before the copy replaced it
        for e in t.user_attrs.get("lineage", []):
            if e.get("source") is not None:
                values[t.number][e["step"]] = e["old_value"]
    at: dict[int, int] = {}
    spent, out = 0, []
    for line in log.splitlines():
        if (ended := segment(line, at)) is None:
            continue
        number, start, end = ended
        for step in sorted(s for s in values[number] if start < s <= end):
            out.append((spent + step - start, values[number][step]))
        spent += max(0, end - start)
    return out


def best_within(points: list[tuple[int, float]], budget: int) -> float:
    return min(v for spent, v in points if spent <= budget)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=27, help="n_trials of the pruned sides (pbt: its population)")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-schedulers-") as tmp:
        for seed in args.seeds:
            for side in args.sides:
                row = run_side(Path(tmp), side, seed, args.trials)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    budget = {seed: min(r["steps"] for r in rows if r["seed"] == seed) for seed in args.seeds}
    for r in rows:
        r["best_at_budget"] = best_within(r["curve"], budget[r["seed"]])
        assert max(p[0] for p in r["curve"]) == r["steps"], (r["side"], r["seed"], r["steps"])  # log = storage
    print(f"\nbudget B per seed (the smallest side's steps): {budget}")
    print(f"\n| side | best val_loss within B steps, mean of {len(args.seeds)} seeds (each) | best COMPLETE "
          "trial's value, mean | steps spent, mean | trials |")
    print("|---|---|---|---|---|")
    for side in args.sides:
        mine = [r for r in rows if r["side"] == side]
        at_b = [r["best_at_budget"] for r in mine]
        bests = [r["best"] for r in mine]
        print(f"| {side} | {statistics.mean(at_b):.4f} ({', '.join(f'{b:.4f}' for b in at_b)}) | "
              f"{statistics.mean(bests):.4f} | {statistics.mean(r['steps'] for r in mine):.0f} | {mine[0]['trials']} |")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
