"""Issue 13: the cost of fencing (a worker checking it still holds its trial before each write).

Runs the example study's trial 0 (2000 steps, an evaluation every 100, a save every 200) in this
process through the scheduler, on SQLite and on PostgreSQL (if one answers on localhost), once
with the fence and once with it replaced by a no-op, in ABBA order; prints the median trial
time of each side, their ratio, and the fence's own cost: checks per trial x the median latency
of one check, as a share of the trial.

    .venv/bin/python benchmarks/fencing.py [--rounds 4] [--postgres URL]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import harness

from sweep.host.signals import StopSignal
from sweep.run import worker
from sweep.store import claims as claims_lib
from sweep.store.session import Session


def trial_seconds(workdir: Path, storage: str | None, fenced: bool, counter: list[int]) -> float:
    config = harness.example(workdir, n_trials=1, checkpoint={"every_steps": 200, "every_seconds": None})
    if storage:
        config.storage = storage
    config.study = config.study.model_copy(update={"name": f"fence-{uuid.uuid4().hex[:8]}"})
    original = claims_lib.Claims.check

    def counted(self, key, what):  # counts the checks that asked the database (not reused ones)
        if fenced:
            before = self._checked.get(key)
            original(self, key, what)
            counter[0] += self._checked.get(key) != before

    claims_lib.Claims.check = counted
    try:
        session = Session(config)
        start = time.perf_counter()
        worker.run(session, StopSignal())
        took = time.perf_counter() - start
        session.close()
    finally:
        claims_lib.Claims.check = original
    return took


def check_latency(session: Session, n: int = 500) -> float:
    key = session.claims.key(10**6)
    session.claims.try_take(key)
    times = []
    for _ in range(n):
        session.claims._checked.clear()  # each one asks the database
        t0 = time.perf_counter()
        session.claims.check(key, "benchmark")
        times.append(time.perf_counter() - t0)
    session.claims.release(key)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@localhost/postgres")
    args = ap.parse_args()
    harness.quiet()
    storages: list[tuple[str, str | None]] = [("sqlite", None)]
    try:
        import sqlalchemy as sa

        sa.create_engine(args.postgres).connect().close()
        storages.append(("postgresql", args.postgres))
    except Exception as exc:  # no server here: SQLite only
        print(f"(no PostgreSQL at {args.postgres}: {type(exc).__name__})")
    for label, storage in storages:
        with tempfile.TemporaryDirectory() as tmp:
            counter = [0]
            run = iter(range(10**6))
            trial_seconds(Path(tmp) / "warm", storage, True, counter)  # compile once
            counter[0] = 0
            times = harness.alternate({
                "fenced": lambda r: trial_seconds(Path(tmp) / f"f{next(run)}", storage, True, counter),
                "unfenced": lambda r: trial_seconds(Path(tmp) / f"u{next(run)}", storage, False, counter),
            }, args.rounds)
            checks = counter[0] / args.rounds  # the fenced runs
            ratio = harness.report(f"{label}: one trial (2000 steps, 20 reports, 10 saves)", "fenced", "unfenced",
                                   times, "<= 1.02")
            config = harness.example(Path(tmp) / "lat")
            if storage:
                config.storage = storage
            config.study = config.study.model_copy(update={"name": f"fence-lat-{uuid.uuid4().hex[:8]}"})
            session = Session(config).open(create=True)
            latency = check_latency(session)
            session.close()
            share = checks * latency / statistics.median(times["fenced"])
            print(f"  {checks:.1f} database checks per trial x {latency * 1e3:.2f} ms = {share:.2%} of the trial "
                  f"({'met' if share <= 0.02 else 'NOT met'}; the ratio above is {ratio:.3f}, within noise)")


if __name__ == "__main__":
    main()
