"""Issue 39: what a `sweep run` process costs where the study already ran the trial's code, before
vs after `run` stopped re-checking code it already ran (sweep.run.preflight.needed).

Two cases, each a fresh `python -m sweep run` process on a warm compilation cache: the rerun of a
finished study (nothing to train) and one more trial (n_trials raised by one). "before" runs
sweep's code of `--before` (a git revision, extracted from this repository's history), "after" this
checkout's; the sides alternate (ABBA), medians printed side by side with their ratio.

    python benchmarks/resume_start.py --before HEAD --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from shared_compile import extract  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="git revision of sweep to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-resume-start-"))
    code = {"before": extract(args.before, root / "before_code"), "after": harness.REPO}
    cache = root / "cache"

    def run(side: str, study: Path) -> float:
        path = [str(code[side]), str(harness.REPO), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "SWEEP_COMPILATION_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(filter(None, path))}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sweep", "run", str(study), "--quiet"], check=True,
                       capture_output=True, cwd=root, env=env)
        return time.perf_counter() - t0

    def study(name: str, n_trials: int) -> Path:
        raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
        raw.update(name=name, workdir=str(root / name), n_trials=n_trials, train={"steps": 200, "eval_every": 100,
                                                                                   "seed": 0})
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    times: dict[str, dict[str, list[float]]] = {"rerun": {}, "one more trial": {}}
    try:
        for side in ("before", "after"):  # a finished study per side (and the cache warmed)
            run(side, study(f"{side}_done", 1))

        def side(name: str):
            def measure(r: int) -> float:
                times["rerun"].setdefault(name, []).append(run(name, root / f"{name}_done.yaml"))
                base = study(f"{name}_more{r}", 1)
                run(name, base)
                more = study(f"{name}_more{r}", 2)
                times["one more trial"].setdefault(name, []).append(run(name, more))
                return 0.0
            return measure

        harness.alternate({"before": side("before"), "after": side("after")}, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"`sweep run` processes, digits MLP, warm cache, {args.rounds} rounds ABBA, before = {args.before}, "
          f"{len(os.sched_getaffinity(0))} cores; medians:")
    print(f"  {'':16} {'before':>8} {'after':>8} {'after/before':>13}")
    for case, sides in times.items():
        b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
        print(f"  {case:16} {b:7.2f}s {a:7.2f}s {a / b:13.2f}")


if __name__ == "__main__":
    main()
