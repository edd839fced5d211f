"""Issue 26: trials/hour with parallel.trials_per_device M = 1, 2, 4 on forced CPU devices.

The example's digits trial at one shape (hidden 128, adam; the learning rate sampled at random, no
pruner: every side trains the same trials), on
`--devices` CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count), `n_jobs: auto`, so
M = 1, 2, 4 run D, 2D, 4D worker processes, M of them on each device. Each side first runs once
to fill its own JAX compilation cache (executables are per device), which every measured run of
it copies in; measured runs alternate (ABBA). trials/hour = trials / wall time of `sweep run`.

    python benchmarks/packing.py [--devices 2] [--trials 16] [--steps 2000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import yaml


def write(root: Path, name: str, args: argparse.Namespace, m: int) -> Path:
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    # One shape (only the learning rate is sampled): each worker compiles once, so the sides differ
    # in how the trials share the devices, not in how many programs they compile.
    raw.update(name=name, workdir=str(root / name), n_trials=args.trials, sampler={"type": "random", "seed": 0},
               search_space={"learning_rate": raw["search_space"]["learning_rate"]},
               fixed={"batch_size": 64, "hidden": 128, "optimizer": "adam"},
               pruner={"type": "none"}, train={"steps": args.steps, "eval_every": 100, "seed": 0},
               parallel={"n_jobs": "auto", "trials_per_device": m})
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.REPO), os.environ.get("PYTHONPATH")]))}
    root = Path(tempfile.mkdtemp(prefix="sweep-packing-"))
    sides = (1, 2, 4)
    counter = iter(range(10**6))

    def run(study: Path) -> None:
        subprocess.run([sys.executable, "-m", "sweep", "run", str(study), "--quiet"], check=True,
                       capture_output=True, cwd=root, env=env)

    def side(m: int):
        def measure(r: int) -> float:
            study = write(root, f"m{m}_{next(counter)}", args, m)
            shutil.copytree(root / f"warm{m}" / "jax_cache", root / study.stem / "jax_cache")
            return harness.timed(lambda: run(study))
        return measure

    try:
        for m in sides:
            run(write(root, f"warm{m}", args, m))
        times = harness.alternate({f"M={m}": side(m) for m in sides}, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = sum(times["M=1"]) / len(times["M=1"])
    print(f"digits trial, {args.trials} trials x {args.steps} steps on {args.devices} forced CPU devices "
          f"({len(os.sched_getaffinity(0))} cores), {args.rounds} run(s) each, n_jobs auto = {args.devices} x M:")
    for m in sides:
        wall = sum(times[f"M={m}"]) / len(times[f"M={m}"])
        print(f"  M={m}: {args.devices * m} workers, {wall:6.1f} s, {args.trials / wall * 3600:7.0f} trials/hour, "
              f"ratio to M=1 {base / wall:.2f}")


if __name__ == "__main__":
    main()
