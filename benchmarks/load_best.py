"""Issue 15: `sweep.load_best` as a user waits for it, vs importing sweep plus a raw Orbax restore.

Runs a small study of `--study` (default the example, 2 trials of 300 steps) once, then in ABBA
order, each in a new Python process (what a user's notebook or script pays):
- "load_best": `import sweep; sweep.load_best(study_file)` (opens the storage, picks the best
  trial, builds the restore template, restores and verifies the best step, rebuilds the model);
- "raw": `import sweep` and `orbax.checkpoint.StandardCheckpointer().restore(<that step>/default)`
  without a template (the floor: the same imports and the same bytes read).

    .venv/bin/python benchmarks/load_best.py [--rounds 4] [--study studies/digits_mlp.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import yaml

ENV = {**os.environ, "PYTHONPATH": str(harness.REPO)}


def timed_python(code: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True, text=True,
                   env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--study", default="studies/digits_mlp.yaml")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-load-best-"))
    try:
        raw = yaml.safe_load((harness.REPO / args.study).read_text())
        raw.update(name="lb", workdir=str(root / "runs"), n_trials=2,
                   train={**raw["train"], "steps": 300, "eval_every": 100})
        study = root / "study.yaml"
        study.write_text(yaml.safe_dump(raw, sort_keys=False))
        subprocess.run([sys.executable, "-m", "sweep", "run", str(study), "--quiet"], cwd=root, check=True,
                       env=ENV, capture_output=True)
        status = json.loads(subprocess.run([sys.executable, "-m", "sweep", "status", str(study), "--json"], cwd=root,
                                           check=True, capture_output=True, text=True,
                                           env=ENV).stdout)
        best = min((t for t in status["trials"] if t["state"] == "COMPLETE"), key=lambda t: t["value"])
        step_dir = Path(best["checkpoint_dir"]) / str(best["best_step"]) / "default"
        load = f"import sweep; b = sweep.load_best({str(study)!r}); assert b.step == {best['best_step']}"
        restore = ("import sweep, orbax.checkpoint as ocp; "
                   f"ocp.StandardCheckpointer().restore({str(step_dir)!r})")
        timed_python(load, root), timed_python(restore, root)  # warm the page cache and JAX's caches
        times = harness.alternate({"load_best": lambda r: timed_python(load, root),
                                   "raw": lambda r: timed_python(restore, root)}, args.rounds)
        harness.report(f"new process -> best trial restored ({args.study})", "load_best", "raw", times,
                       "(context: the floor is raw)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
