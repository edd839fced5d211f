"""Issue 41 item 4: trials started per second with 8 worker processes on each storage, and `status`
of a 10,000-trial study on a journal file.

1. Throughput. One study of --trials short trials (the tests' tiny linear trial: 20 steps, an
   evaluation every 10, a save at 20) run by 8 `python -m sweep run` processes at once, each its
   own SWEEP_HOST, on SQLite, PostgreSQL, a journal file and Redis in turn, the compilation cache
   warmed first. Trials started per second: the trials after the first divided by the seconds from
   the first "started" line to the last, over the 8 logs (the processes' start-up is outside it).
   Every trial must have started exactly once.
2. A study of --big finished trials (benchmarks/big_study.py's, built on SQLite) copied to a
   journal file with `optuna.copy_study`; then, each a fresh process, alternated: Optuna's own load
   of each (`optuna.load_study(...).get_trials()`) and `sweep status --json` of each, as ratios to
   Optuna's load of the same storage. Target: status on the journal <= 1.0x Optuna's load of it.

    python benchmarks/storages.py [--trials 256] [--workers 8] [--big 10000] [--skip-big]

PostgreSQL: $SWEEP_TEST_POSTGRES (default postgres@localhost); Redis: $SWEEP_TEST_REDIS
(default redis://localhost:6379), database 9, flushed before and after.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import yaml
from chaos import _create_database, _optuna_storage

from tests.trials.files import trial_source  # noqa: E402

REDIS = os.environ.get("SWEEP_TEST_REDIS", "redis://localhost:6379") + "/9"
STARTED = re.compile(r"\[sweep (\d\d:\d\d:\d\d)\] trial (\d+): started")


def _study(root: Path, storage: str, n_trials: int) -> Path:
    data = {"name": "tput", "trial": "bench_linear", "n_trials": n_trials, "storage": storage,
            "workdir": str(root / "runs"), "objective": {"metric": "val_loss", "direction": "minimize"},
            "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"},
            "search_space": {"learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True}},
            "train": {"steps": 20, "eval_every": 10, "seed": 0},
            "checkpoint": {"every_steps": 20, "keep_last": 1, "keep_best": 1, "max_write_share": None}}
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (root / "bench_linear.py").write_text(trial_source("linear", METRICS=("val_loss",)))
    return path


def _started_per_second(logs: list[str], storage: str, n_trials: int) -> tuple[float, float]:
    """(trials started per second, the window's seconds): from the first trial's start to the last
    one's, as the study records them (datetime_start, microseconds); each trial started once (the logs)."""
    import optuna

    numbers = sorted(int(m.group(2)) for log in logs for m in STARTED.finditer(log))
    assert numbers == list(range(n_trials)), f"each trial once: {numbers}"
    starts = sorted(t.datetime_start for t in optuna.load_study(study_name="tput",
                                                                storage=_optuna_storage(storage)).trials)
    window = (starts[-1] - starts[0]).total_seconds()
    return (n_trials - 1) / window, window


def throughput(kind: str, storage: str, root: Path, n_trials: int, workers: int, env: dict[str, str]) -> dict:
    folder = root / kind
    folder.mkdir()
    study = _study(folder, storage, n_trials)
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "sweep", "run", str(study)], cwd=folder,
                              env={**env, "SWEEP_HOST": f"{kind}-{i}"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in range(workers)]
    logs = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - t0
    assert all(p.returncode == 0 for p in procs), [log[-1500:] for log in logs]
    rate, window = _started_per_second(logs, storage, n_trials)
    return {"storage": kind, "trials_per_s": rate, "window_s": window, "wall_s": wall}


def _flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS).flushdb()


def big_status(root: Path, n: int, rounds: int) -> dict[str, float]:
    import big_study
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    sqlite_study = big_study.make_study(root, n)
    sqlite_url = f"sqlite:///{root / big_study.NAME / 'study.db'}"
    journal = root / "big.log"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.copy_study(from_study_name=big_study.NAME, from_storage=sqlite_url,
                      to_storage=JournalStorage(JournalFileBackend(str(journal))))
    raw = yaml.safe_load(sqlite_study.read_text())
    journal_study = root / "big-journal.yaml"
    journal_study.write_text(yaml.safe_dump({**raw, "storage": f"journal://{journal}"}, sort_keys=False))
    print(f"{n} finished trials on SQLite and in a journal file ({journal.stat().st_size / 1e6:.0f} MB) built in "
          f"{time.monotonic() - t0:.0f} s", flush=True)

    def load(storage: str) -> list[str]:
        opened = (f"JournalStorage(JournalFileBackend({str(journal)!r}))" if storage == "journal" else repr(sqlite_url))
        return [sys.executable, "-c", "import optuna; from optuna.storages import JournalStorage; "
                "from optuna.storages.journal import JournalFileBackend; "
                "optuna.logging.set_verbosity(optuna.logging.WARNING); "
                f"t = optuna.load_study(study_name={big_study.NAME!r}, storage={opened}).get_trials(deepcopy=False); "
                f"assert len(t) == {n}"]

    commands = {"optuna load, SQLite": load("sqlite"),
                "sweep status --json, SQLite": [sys.executable, "-m", "sweep", "status", str(sqlite_study), "--json"],
                "optuna load, journal": load("journal"),
                "sweep status --json, journal": [sys.executable, "-m", "sweep", "status", str(journal_study), "--json"]}

    def side(name: str):
        def go(r: int) -> float:
            def call() -> None:
                out = subprocess.run(commands[name], capture_output=True, text=True, cwd=root)
                assert out.returncode == 0, (name, out.stderr[-2000:])
            return harness.timed(call)
        return go

    times = harness.alternate({k: side(k) for k in commands}, rounds)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--big", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the big study's reads")
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-storages-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(harness.REPO), str(root / "warm")]),
           "SWEEP_COMPILATION_CACHE": str(root / "jax_cache")}
    try:
        (root / "warm").mkdir()
        warm = _study(root / "warm", f"sqlite:///{root / 'warm' / 'study.db'}", 1)  # fills the shared cache
        subprocess.run([sys.executable, "-m", "sweep", "run", str(warm)], cwd=root / "warm", env=env, check=True,
                       capture_output=True)
        pg, drop = _create_database()  # chaos.py's: a fresh PostgreSQL database, dropped after
        _flush_redis()
        rows = []
        try:
            for kind, storage in (("SQLite", None), ("PostgreSQL", pg), ("journal file", "journal"),
                                  ("Redis", REDIS)):
                folder = root / kind.replace(" ", "_")
                url = (f"sqlite:///{folder / 'runs' / 'study.db'}" if storage is None else
                       f"journal://{folder / 'study.log'}" if storage == "journal" else storage)
                env_kind = {**env, "PYTHONPATH": os.pathsep.join([str(harness.REPO), str(folder)])}
                rows.append(throughput(kind.replace(" ", "_"), url, root, args.trials, args.workers, env_kind))
                print(f"{kind:12} {rows[-1]['trials_per_s']:6.2f} trials started/s over {rows[-1]['window_s']:.0f} s "
                      f"({args.trials} trials, {args.workers} processes; wall {rows[-1]['wall_s']:.0f} s)", flush=True)
        finally:
            drop()
            _flush_redis()
        base = rows[0]["trials_per_s"]
        print("| storage | trials started / s | x SQLite |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['storage'].replace('_', ' ')} | {r['trials_per_s']:.2f} | {r['trials_per_s'] / base:.2f} |")
        if not args.skip_big:
            med = big_status(root / "big", args.big, args.rounds)
            print(f"{args.big} finished trials, medians of {args.rounds} (each a fresh process):")
            for k, v in med.items():
                own = med["optuna load, journal" if "journal" in k else "optuna load, SQLite"]
                print(f"  {k:32} {v:7.2f} s  {v / own:5.2f}x optuna's load of the same storage")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
