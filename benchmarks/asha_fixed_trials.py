"""Where asha lost (issue 40 item 4): the real-run benchmark of 2026-12-03 (benchmarks/schedulers.py,
3 seeds) fixed the number of trials (27) and compared the best value within the steps of the side
that spent the fewest. This replays that setup in the scheduler simulator on the recorded digits
MLP curves (benchmarks/data/curves/digits_mlp.json): 20 seeds, one worker, rungs and pruner
resources from 200 steps (eta 3). It prints each side's mean normalized regret within that budget
with a bootstrap 95% interval, its mean over seeds 0-2 alone, the steps it spent, and its regret
once its 27 trials are done.

    .venv/bin/python benchmarks/asha_fixed_trials.py
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import scheduler_sim as ss  # noqa: E402
from sweep.run.simulator import simulate  # noqa: E402

N_TRIALS, MIN_STEPS, SEEDS = 27, 200, range(20)
SIDES = ("tpe+sha", "tpe+hyperband", "tpe+median", "asha", "hyperband")


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("sweep").setLevel(logging.WARNING)
    bench = ss.Tabulated("digits_mlp")
    sides = {k: v for k, v in ss.methods(bench.steps, MIN_STEPS).items() if k in SIDES}

    def regret(value: float) -> float:
        return (value - bench.y_star) / (bench.y_worst - bench.y_star)

    rows: dict[str, list[tuple[float, int, float]]] = {}  # side -> (regret within B, steps, regret at the end)
    for seed in SEEDS:
        sims = {}
        for name, method in sides.items():
            sims[name] = simulate(ss.study(bench, method, seed, n_trials=N_TRIALS), bench, workers=1)
        budget = min(s.reports[-1].used for s in sims.values())  # B: the side that spent the fewest steps
        for name, s in sims.items():
            rows.setdefault(name, []).append((regret(min(r.value for r in s.reports if r.used <= budget)),
                                              s.reports[-1].used, regret(min(r.value for r in s.reports))))
    rng = np.random.RandomState(0)
    print(f"n_trials={N_TRIALS}, 1 worker, rungs from {MIN_STEPS}, seeds {SEEDS.start}-{SEEDS.stop - 1}")
    print("| side | regret within B [95%] | seeds 0-2 | steps spent | regret at the end |")
    print("|---|---|---|---|---|")
    for name, found in rows.items():
        a = np.array(found)
        lo, hi = ss.bootstrap(a[:, 0], rng)
        print(f"| {name} | {a[:, 0].mean():.4f} [{lo:.4f}, {hi:.4f}] | {a[:3, 0].mean():.4f} | {a[:, 1].mean():.0f} "
              f"| {a[:, 2].mean():.4f} |")
    asha, sha = np.array(rows["asha"])[:, 0], np.array(rows["tpe+sha"])[:, 0]
    print(f"asha below tpe+sha within B in {(asha < sha).sum()} of {len(asha)} seeds, above in {(asha > sha).sum()}")


if __name__ == "__main__":
    main()
