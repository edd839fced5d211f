"""Issue 43, item 7: workers of one study compiling one program, before vs after the compile lock.

The example's digits trial at one shape (only the learning rate sampled: every trial needs the same
window and evaluation), `--trials` trials, `n_jobs: auto` on `--devices` forced CPU devices, so one
worker per device starts at once. Every measured run starts from an EMPTY compilation cache. The
"before" side runs sweep's code of `--before` (a git revision, extracted from this repository's
history; the trial module is this checkout's), the "after" side this checkout; runs alternate
(ABBA). Per run: the sum over trials of XLA compilations, executables from the cache and compile
seconds (each trial's `compiles`), of the ledger's `compiling` (compiles and waits for another
worker's compile), and the wall time of `sweep run`.

    python benchmarks/shared_compile.py --before e17a2d3^ [--devices 4] [--trials 4] [--steps 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import harness
import yaml

KEYS = ("compilations", "cache_hits", "compile_seconds", "compiling", "wall")


def write(root: Path, name: str, args: argparse.Namespace) -> Path:
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    raw.update(name=name, workdir=str(root / name), n_trials=args.trials, sampler={"type": "random", "seed": 0},
               search_space={"learning_rate": raw["search_space"]["learning_rate"]},
               fixed={"batch_size": 64, "hidden": 128, "optimizer": "adam"},
               pruner={"type": "none"}, train={"steps": args.steps, "eval_every": 100, "seed": 0},
               parallel={"n_jobs": "auto"})
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def extract(revision: str, into: Path) -> Path:
    """sweep/ of `revision`, from this repository's history, under `into`."""
    archive = subprocess.run(["git", "-C", str(harness.REPO), "archive", revision, "sweep"], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="git revision of sweep before the compile lock")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-shared-compile-"))
    code = {"before": extract(args.before, root / "before_code"), "after": harness.REPO}
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    counter = iter(range(10**6))

    def env(side: str, cache: Path) -> dict[str, str]:
        path = [str(code[side]), str(harness.REPO), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
                "SWEEP_COMPILATION_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(filter(None, path))}

    def side(name: str):
        def measure(r: int) -> float:
            n = next(counter)
            study = write(root, f"{name}{n}", args)
            run_env = env(name, root / f"cache{n}")  # empty: nothing compiled before
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sweep", "run", str(study), "--quiet"], check=True,
                           capture_output=True, cwd=root, env=run_env)
            wall = time.perf_counter() - t0
            status = subprocess.run([sys.executable, "-m", "sweep", "status", str(study), "--json"], check=True,
                                    capture_output=True, text=True, cwd=root, env=env("after", root / "unused"))
            trials = json.loads(status.stdout)["trials"]
            row = {k: sum(float(t["compiles"][k]) for t in trials) for k in KEYS[:3]}
            row["compiling"] = sum(float(t["ledger"]["compiling"]) for t in trials)
            row["wall"] = wall
            results[name].append(row)
            return wall
        return measure

    try:
        harness.alternate({"before": side("before"), "after": side("after")}, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mean = {s: {k: statistics.mean(r[k] for r in rows) for k in KEYS} for s, rows in results.items()}
    print(f"digits trial at one shape, {args.trials} trials x {args.steps} steps, n_jobs auto on {args.devices} "
          f"forced CPU devices ({len(os.sched_getaffinity(0))} cores), empty cache, {args.rounds} run(s) each, "
          f"before = {args.before}; sums over the trials, means over the runs:")
    print(f"  {'':26} {'before':>9} {'after':>9} {'after/before':>13}")
    for key, label in zip(KEYS, ("XLA compilations", "executables from cache", "compile seconds",
                                 "ledger compiling (s)", "wall of sweep run (s)")):
        b, a = mean["before"][key], mean["after"][key]
        ratio = f"{a / b:.2f}" if b else "-"
        print(f"  {label:26} {b:9.2f} {a:9.2f} {ratio:>13}")


if __name__ == "__main__":
    main()
