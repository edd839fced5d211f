"""Target 6: re-running a finished study of 2,000 trials vs re-running a finished study of 1 trial.

Both are real `python -m sweep run` processes on finished studies (nothing to train): the
difference is what 1,999 more finished trials cost a restart (Optuna's own cold load of 2,000
trials took 1.94 s here). The studies are made by running one real trial, then adding finished
trials through Optuna (`study.add_trials`), each with the user attributes sweep records and 20
intermediate values. Also timed: `python -m sweep --help` (the bare CLI) for context.
Target: (2000-trial restart) - (1-trial restart) < 1.94 s.

    python benchmarks/big_study_restart.py [--trials 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import optuna
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial


def make_study(root: Path, name: str, n_trials: int) -> Path:
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    raw.update(name=name, workdir=str(root / name), n_trials=1, train={"steps": 200, "eval_every": 10, "seed": 0})
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run([sys.executable, "-m", "sweep", "run", str(path), "--quiet"], check=True, capture_output=True,
                   cwd=root)
    if n_trials > 1:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{root / name / 'study.db'}")
        dists = {"learning_rate": FloatDistribution(1e-4, 1e-1, log=True), "hidden": IntDistribution(16, 256, step=16),
                 "optimizer": CategoricalDistribution(["adam", "sgd"])}
        trials = []
        for i in range(1, n_trials):
            values = {s: 10.0 + i + s / 1000 for s in range(10, 210, 10)}  # worse than the real trial 0
            state = TrialState.COMPLETE if i % 3 else TrialState.PRUNED
            trials.append(create_trial(
                state=state, value=min(values.values()) if state == TrialState.COMPLETE else None,
                params={"learning_rate": 0.001, "hidden": 64, "optimizer": "adam"}, distributions=dists,
                intermediate_values=values,
                user_attrs={"checkpoint_dir": str(root / name / "checkpoints" / f"trial_{i:04d}"), "resumes": 0,
                            "best_step": 10, "best_value": min(values.values()), "last_step": 200}))
        study.add_trials(trials)
        raw["n_trials"] = n_trials
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-big-"))
    try:
        big, small = make_study(root, "big", args.trials), make_study(root, "small", 1)

        def run(study: Path | None):
            cmd = [sys.executable, "-m", "sweep", *(["run", str(study)] if study else ["--help"])]
            return lambda r: harness.timed(lambda: subprocess.run(cmd, check=True, capture_output=True, cwd=root))

        out = subprocess.run([sys.executable, "-m", "sweep", "run", str(big)], capture_output=True, text=True,
                             cwd=root)
        assert out.returncode == 0 and f"{args.trials}/{args.trials} trials finished" in out.stdout, out.stderr
        times = harness.alternate({"big": run(big), "small": run(small), "help": run(None)}, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"restart of a finished study: {args.trials} trials {med['big']:.2f} s, 1 trial {med['small']:.2f} s, "
          f"`--help` {med['help']:.2f} s (medians of {args.rounds})")
    print(f"added by {args.trials - 1} more finished trials: {med['big'] - med['small']:.2f} s  (target < 1.94 s)")
    print(f"ratio big/small: {med['big'] / med['small']:.3f}")


if __name__ == "__main__":
    main()
