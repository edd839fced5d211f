"""Target 3: restart -> first new evaluation vs fresh start -> first evaluation, same steps in between.

Real processes (`python -m sweep run --verbose`, which logs every evaluation); times are from
process start to the arrival of the evaluation's log line, so both sides pay the same imports.
- "resume": a 1-trial study saving at every evaluation, killed with SIGKILL after a few; each round
  restarts it, waits for its first new evaluation (restored step + eval_every), kills it again.
- "fresh_warm": the same study started from scratch in a new workdir that holds a copy of the
  resumed study's JAX compilation cache (shapes already compiled), until its first evaluation.
- "fresh_cold": the same, without the cache (what a resume cost before the persistent cache).
Target: resume/fresh_warm <= 1.1. The compilation counts of each side are printed too.

    python benchmarks/resume_latency.py [--rounds 4]
"""

from __future__ import annotations

import argparse
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

EVAL = re.compile(r"trial 0: step (\d+): val_loss=")
COMPILES = re.compile(r"trial 0: (\d+) XLA compilation\(s\) \(window \d+, evaluate \d+; [\d.]+ s\), (\d+) "
                      r"executable\(s\) from the persistent cache")


STUDY, EVAL_EVERY = "digits_mlp.yaml", 500  # set from the command line


def study_file(root: Path, name: str) -> Path:
    path = Path(STUDY) if Path(STUDY).exists() else harness.REPO / "studies" / STUDY
    raw = yaml.safe_load(path.read_text())
    raw.update(name="latency", workdir=str(root / name), n_trials=1, pruner={"type": "none"},
               train={"steps": 10**7, "eval_every": EVAL_EVERY, "seed": 0},
               checkpoint={"every_steps": EVAL_EVERY, "keep_last": 2, "keep_best": 1})
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def until_new_eval(study: Path, after: int) -> tuple[float, int, str]:
    """Start `run`, wait for an evaluation at a step > `after`; (seconds, step, stderr). Kills the run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(study), "--verbose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=study.parent)
    lines: list[str] = []
    found: list[tuple[float, int]] = []

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            m = EVAL.search(line)
            if m and int(m.group(1)) > after and not found:
                found.append((time.perf_counter() - t0, int(m.group(1))))
                proc.send_signal(signal.SIGTERM)  # checkpoint and exit: the next round resumes from here

    reader = threading.Thread(target=read)
    reader.start()
    proc.wait(timeout=600)
    reader.join()
    if not found:
        raise SystemExit("no evaluation seen:\n" + "".join(lines[-30:]))
    return found[0][0], found[0][1], "".join(lines)


def main() -> None:
    global STUDY, EVAL_EVERY
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--study", default=STUDY, help="a study file in studies/ (digits_resnet.yaml: seconds to compile), or a path "
                    "(benchmarks/large_state.yaml: a ~100 MB state)")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    args = ap.parse_args()
    STUDY, EVAL_EVERY = args.study, args.eval_every
    root = Path(tempfile.mkdtemp(prefix="sweep-latency-"))
    try:
        resumed = study_file(root, "resumed")
        _, last, _ = until_new_eval(resumed, 2 * EVAL_EVERY)  # first run: compiles, fills the cache, saves
        counts: dict[str, list[str]] = {}
        n = iter(range(10**6))

        def resume(r: int) -> float:
            nonlocal last
            seconds, last, err = until_new_eval(resumed, last)
            counts.setdefault("resume", []).append(_counts(err))
            return seconds

        def fresh(warm: bool) -> float:
            study = study_file(root, f"fresh{next(n)}")
            if warm:
                shutil.copytree(root / "resumed" / "jax_cache", root / study.stem / "jax_cache")
            seconds, _, err = until_new_eval(study, 0)
            counts.setdefault("fresh_warm" if warm else "fresh_cold", []).append(_counts(err))
            return seconds

        times = harness.alternate({"resume": resume, "fresh_warm": lambda r: fresh(True),
                                   "fresh_cold": lambda r: fresh(False)}, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for side, c in counts.items():
        print(f"{side}: compilations (XLA, from cache) per run: {', '.join(c)}")
    harness.report("process start -> first new evaluation", "resume", "fresh_warm", times, "<= 1.1")
    harness.report("process start -> first new evaluation", "resume", "fresh_cold", times, "(context)")


def _counts(stderr: str) -> str:
    m = COMPILES.search(stderr)
    return f"({m.group(1)}, {m.group(2)})" if m else "(?)"


if __name__ == "__main__":
    main()
