"""What one scheduler decision costs with N trials in the study (issue 40: at most 1 s with 500).

    .venv/bin/python benchmarks/decision_cost.py --trials 100,500

Builds a study of N trials in the scheduler simulator (sweep/run/simulator.py; synthetic curves,
asha's rungs), then times the decision a free worker would make next on it, read only:
asha's `next_promotion` and freeze_thaw's `choose` (sweep/schedulers/freeze_thaw.py: a fit of its
curve model to every report, then its predictions), the latter twice: as a worker decides while
trials may still start (only asha's promotable trials are predicted; with none, no fit), and once
n_trials have started (every paused trial predicted: the dearest decision). The first call of a
shape compiles the model's programs (XLA); the median of 5 later calls is the cost of a decision.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sweep.run.simulator import Curve, simulate  # noqa: E402
from sweep.schedulers.asha import next_promotion  # noqa: E402
from sweep.schedulers.freeze_thaw import FreezeThaw  # noqa: E402
from sweep.study import config as config_lib  # noqa: E402

SPACE = {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
         "hidden": {"type": "int", "low": 16, "high": 256, "step": 16},
         "optimizer": {"type": "categorical", "choices": ["adam", "sgd"]}}


def table(number: int, params: Mapping[str, Any]) -> Curve:
    """A synthetic curve: better near learning rate 3e-3, wider layers, adam."""
    q = abs(math.log10(params["learning_rate"]) + 2.5) + 0.2 * (params["optimizer"] == "sgd")
    q += 16.0 / params["hidden"]
    return Curve({s: q + 1.0 / (1.0 + s * params["learning_rate"]) for s in range(100, 2001, 100)})


def study(n: int, scheduler: dict[str, Any]) -> config_lib.Config:
    return config_lib.from_dict({
        "name": "cost", "trial": "trials.digits_mlp", "n_trials": n,
        "objective": {"metric": "val_loss", "direction": "minimize"}, "sampler": {"type": "random", "seed": 0},
        "scheduler": scheduler, "search_space": SPACE, "train": {"steps": 2000, "eval_every": 100}},
        import_trial=False)


def timed(call: Any) -> tuple[float, float]:
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    later = []
    for _ in range(5):
        start = time.perf_counter()
        call()
        later.append(time.perf_counter() - start)
    return first, statistics.median(later)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", default="100,500")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for n in (int(v) for v in args.trials.split(",")):
        # asha's decisions fill the study, cut while trials are still paused (~312 steps a trial
        # with these rungs); then both decide on it.
        config = study(10 * n, {"type": "asha", "min_steps": 100, "reduction_factor": 3})
        sim = simulate(config, table, workers=4, max_steps=n * 312)
        trials = sim.trials
        ft = FreezeThaw(type="freeze_thaw", min_steps=100, reduction_factor=3)
        reports = sum(len(t.intermediate_values) for t in trials)
        paused = sum(1 for t in trials if t.state.name == "WAITING")
        a_first, a_cost = timed(lambda: next_promotion(config, trials))
        f_first, f_cost = timed(lambda: ft.choose(config, trials, can_start=False))
        _, f_start = timed(lambda: ft.choose(config, trials, can_start=True))
        print(f"{len(trials)} trials ({paused} paused, {reports} reports): asha {a_cost * 1e3:.1f} ms; "
              f"freeze_thaw {f_start * 1e3:.0f} ms while trials may start, {f_cost * 1e3:.0f} ms with every "
              f"paused trial predicted (its first call, compiling: {f_first:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
