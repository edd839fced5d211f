"""Target 7: peak RSS of `run` on the example study, and no growth across 100 trials.

1. `python -m sweep run studies/digits_mlp.yaml` in a fresh workdir as a child process: its peak
   RSS (getrusage of the children).
2. In this process, a study of 100 short trials (300 steps) whose hidden size cycles through 12
   shapes (more than the 8 compiled functions kept): RSS and thread count after every trial.
   Growth is the RSS after trial 100 minus after trial 40 (all shapes compiled long before,
   and the cache of compiled functions full). Target: no growth beyond noise (a few MB).
   With `--sampler grid` every trial has a shape of its own (hidden 16, 32, ... one grid point
   each), and the programs of taken points are dropped (issue 19).

    python benchmarks/memory.py [--trials 100] [--sampler grid] [--skip-example]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import harness

from sweep.host.signals import StopSignal
from sweep.run import worker
from sweep.store.session import Session
from sweep.train.compiled import FUNCTIONS


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--sampler", choices=["random", "grid"], default="random")
    ap.add_argument("--skip-example", action="store_true", help="skip part 1")
    args = ap.parse_args()
    harness.quiet()
    root = Path(tempfile.mkdtemp(prefix="sweep-memory-"))
    try:
        if not args.skip_example:
            subprocess.run([sys.executable, "-m", "sweep", "run", str(harness.REPO / "studies" / "digits_mlp.yaml"),
                            "--quiet"], check=True, capture_output=True, cwd=root)
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e3
            print(f"peak RSS of `run` on the example study (20 trials): {peak:.0f} MB")

        import yaml

        raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
        raw.update(name="memory", workdir=str(root / "many"), n_trials=args.trials,
                   sampler={"type": args.sampler, "seed": 0}, pruner={"type": "none"},
                   search_space={"learning_rate": raw["search_space"]["learning_rate"],
                                 "hidden": {"type": "int", "low": 16, "high": 192, "step": 16}}
                   if args.sampler == "random" else
                   {"hidden": {"type": "int", "low": 16, "high": 16 * args.trials, "step": 16}},
                   fixed={"batch_size": 64, "optimizer": "adam"}, train={"steps": 300, "eval_every": 100, "seed": 0},
                   checkpoint={"every_steps": 100, "keep_last": 1, "keep_best": 1})
        (root / "memory.yaml").write_text(yaml.safe_dump(raw))
        config = harness.config_lib.load(root / "memory.yaml")
        samples: list[tuple[int, float, int]] = []
        original = worker._run_claimed

        def measured(*a, **kw):
            original(*a, **kw)
            samples.append((len(samples) + 1, rss_mb(), threading.active_count(), len(FUNCTIONS),
                            FUNCTIONS.bytes() / 1e6))

        worker._run_claimed = measured
        try:
            worker.run(Session(config), StopSignal())
        finally:
            worker._run_claimed = original
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for n, rss, threads, programs, measured in samples:
        if n in (1, 10, 20, 40, 60, 80, args.trials):
            print(f"after trial {n:3d}: RSS {rss:7.1f} MB, threads {threads}, cached programs {programs} "
                  f"({measured:.1f} MB measured)")
    at = {n: rss for n, rss, *_ in samples}
    print(f"growth from trial 40 to {args.trials}: {at[args.trials] - at[40]:+.1f} MB "
          f"({(at[args.trials] - at[40]) / (args.trials - 40) * 1000:+.0f} kB per trial); "
          f"threads {samples[39][2]} -> {samples[-1][2]}")


if __name__ == "__main__":
    main()
