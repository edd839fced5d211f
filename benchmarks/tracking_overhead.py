"""Issue 32: training with both tracking writers on (TensorBoard + MLflow) vs off.

Both sides are real `python -m sweep run` processes on the example study (digits, 3 trials of
20,000 steps, ~3 s each here, an evaluation every 500 steps: 40 evaluations a trial for the
writers to send), alternating ABBA in fresh workdirs; "on" logs to TensorBoard files and to a
real `mlflow server` on localhost (SQLite backend, on the same cores), started once before the
rounds. Measured: the trials' own time (the sum of each trial's start -> complete, from the
study's storage) and the process's wall time (which also holds mlflow's import, made before the
first trial, and the export artifacts logged after the trials). Target: on/off <= 1.02 on the
trials' time. Also printed: the trials after each run's first, and with --split the
TensorBoard-only and MLflow-only sides, to tell the writers' costs apart. `--steps 2000` (trials
of ~1.7 s) shows the fixed cost of each trial's MLflow requests (its run's start and end).

    python benchmarks/tracking_overhead.py [--rounds 4] [--split] [--steps 20000]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import harness
import optuna
import yaml


def mlflow_server(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/m.db",
                             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            # No job runner: its 8 idle processes (huey consumers) would share the cores
                            # with the "on" side's training while serving no tracking request.
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("mlflow server did not start")
            time.sleep(0.3)


STEPS = [20000]  # --steps


def run_once(root: Path, name: str, logging: dict | None) -> tuple[list[float], float]:
    """(each trial's own seconds, by number; the process's wall seconds) of one study run."""
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    raw.update(name=name, workdir=str(root / name), n_trials=3, pruner={"type": "none"},
               train={"steps": STEPS[0], "eval_every": STEPS[0] // 40, "seed": 0})
    if logging:
        raw["logging"] = logging
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", "run", str(path), "--quiet"], check=True, cwd=root,
                   capture_output=True)
    wall = time.perf_counter() - t0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{root / name / 'study.db'}")
    trials = [(t.datetime_complete - t.datetime_start).total_seconds()
              for t in sorted(study.trials, key=lambda t: t.number)]
    return trials, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--split", action="store_true", help="also TensorBoard only and MLflow only")
    ap.add_argument("--steps", type=int, default=20000, help="steps per trial (an evaluation every steps/40)")
    args = ap.parse_args()
    STEPS[0] = args.steps
    harness.quiet()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server, url = mlflow_server(root)
        try:
            settings = {"on": {"tensorboard": True, "mlflow": url}, "off": None}
            if args.split:
                settings.update({"tb": {"tensorboard": True}, "mlflow": {"mlflow": url}})
            walls: dict[str, list[float]] = {key: [] for key in settings}
            later: dict[str, list[float]] = {key: [] for key in settings}

            def side(key: str):
                def go(r: int) -> float:
                    trials, wall = run_once(root, f"{key}{r}", settings[key])
                    walls[key].append(wall)
                    later[key].append(sum(trials[1:]))
                    return sum(trials)
                return go

            run_once(root, "warmup", settings["on"])  # compile cache, server warm
            times = harness.alternate({key: side(key) for key in settings}, args.rounds)
        finally:
            server.terminate()
            server.wait(timeout=30)
    harness.report("trials' own time, writers on vs off", "on", "off", times, "<= 1.02")
    harness.report("trials after each run's first, writers on vs off", "on", "off", later, "(context)")
    harness.report("process wall time, writers on vs off", "on", "off", walls, "(context)")
    for key in ("tb", "mlflow") if args.split else ():
        harness.report(f"trials' own time, {key} only vs off", key, "off", times, "(split)")
    for label, seconds in (("trials' own time", times), ("process wall time", walls)):  # the spread, for the noise
        for key in settings:
            print(f"{label}, {key}, per round (s): {' '.join(f'{v:.2f}' for v in seconds[key])}")


if __name__ == "__main__":
    main()
