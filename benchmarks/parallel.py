"""Issue 5: trials per hour with --n-jobs 2 vs --n-jobs 1, and the time to take over a dead worker's trial.

1. The example study (fresh workdir each time, warm JAX cache copied in for both sides so neither
   pays more compilation than the other) run with `--n-jobs 1` and `--n-jobs 2`, alternating.
   With n_jobs 2 this process trains too and one loky worker (started while the study file is
   validated) takes the other core.
   Target: trials/hour ratio n_jobs 2 / n_jobs 1 >= 1.6 on 2 cores.
2. Takeover: a 1-trial study on SQLite; worker A (SWEEP_HOST=host-a) is killed with SIGKILL
   mid-trial while worker B waits; time from the kill to B's "resumed from step" line, for B on
   the same host (no lease to wait for) and on another host (lease_grace_seconds = --grace).

    python benchmarks/parallel.py [--rounds 2] [--grace 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import yaml


def write(root: Path, name: str, **update) -> Path:
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    raw.update(name=name, workdir=str(root / name), **update)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Proc:
    def __init__(self, study: Path, host: str) -> None:
        env = {**os.environ, "SWEEP_HOST": host}
        self.p = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(study)], env=env, cwd=study.parent,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stderr:  # type: ignore[union-attr]
            self.lines.append((time.monotonic(), line))

    def when(self, pattern: str, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if re.search(pattern, line):
                    return t
            time.sleep(0.005)
        raise SystemExit(f"no {pattern!r}")


def takeover(root: Path, same_host: bool, grace: float, i: int) -> float:
    study = write(root, f"takeover{i}", n_trials=1, pruner={"type": "none"},
                  train={"steps": 10**6, "eval_every": 500, "seed": 0},
                  checkpoint={"every_steps": 1000, "keep_last": 2, "keep_best": 1},
                  parallel={"n_jobs": 1, "lease_grace_seconds": grace})
    a = Proc(study, "host-a")
    a.when(r"trial 0: started")
    ckpt = root / f"takeover{i}" / "checkpoints" / "trial_0000"
    while not any(p.name.isdigit() for p in ckpt.glob("*")):
        time.sleep(0.01)
    b = Proc(study, "host-a" if same_host else "host-b")
    time.sleep(2.0)  # B is up and waiting
    os.kill(a.p.pid, signal.SIGKILL)
    killed = time.monotonic()
    a.p.wait()
    took = b.when(r"trial 0: resumed from step") - killed
    b.p.send_signal(signal.SIGTERM)
    b.p.wait()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--grace", type=float, default=5.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-parallel-"))
    try:
        # Warm JAX's cache with every shape either side samples: TPE with two workers asks other
        # hidden sizes than with one, and a shape missing from the cache costs ~14 compiles.
        for i, n_jobs in enumerate((1, 2, 2)):
            warm = write(root, f"warm{i}", parallel={"n_jobs": n_jobs})
            if i:
                shutil.copytree(root / f"warm{i - 1}" / "jax_cache", root / f"warm{i}" / "jax_cache")
            subprocess.run([sys.executable, "-m", "sweep", "run", str(warm), "--quiet"], check=True,
                           capture_output=True, cwd=root)
        cache = root / "warm2" / "jax_cache"
        counter = iter(range(10**6))

        def side(n_jobs: int):
            def run(r: int) -> float:
                study = write(root, f"jobs{n_jobs}_{next(counter)}", parallel={"n_jobs": n_jobs})
                shutil.copytree(cache, root / study.stem / "jax_cache")
                return harness.timed(lambda: subprocess.run(
                    [sys.executable, "-m", "sweep", "run", str(study), "--quiet"], check=True,
                    capture_output=True, cwd=root))
            return run

        times = harness.alternate({"n_jobs_1": side(1), "n_jobs_2": side(2)}, args.rounds)
        same = [takeover(root, True, args.grace, 100 + i) for i in range(args.rounds)]
        other = [takeover(root, False, args.grace, 200 + i) for i in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t1, t2 = sum(times["n_jobs_1"]), sum(times["n_jobs_2"])
    print(f"example study (20 trials), {args.rounds} runs each: n_jobs 1 {t1:.1f} s, n_jobs 2 {t2:.1f} s in total")
    print(f"trials/hour ratio n_jobs 2 / n_jobs 1: {t1 / t2:.2f}  (target >= 1.6)")
    print(f"takeover, kill -9 -> other worker resumed the trial: same host {', '.join(f'{s:.2f}' for s in same)} s; "
          f"other host (lease_grace_seconds={args.grace:g}) {', '.join(f'{s:.2f}' for s in other)} s")


if __name__ == "__main__":
    main()
