"""Start-up of a sweep process, side by side: what the installed ml_dtypes costs against another release.

Every CLI process (each `run`, each restart after a kill, each worker of `--n-jobs`) imports JAX, Flax,
Optax and Orbax before it trains; JAX imports ml_dtypes, whose 0.7.0 release takes ~1 s here to
initialise its C extension (0.6.0: ~0.01 s). This script times, in alternating rounds (the machine is
shared and noisy), a fresh interpreter importing what `sweep run` imports, once with the installed
ml_dtypes and once with OTHER put first on sys.path (a wheel of that release, downloaded from the
package registry into a temporary folder), and prints the medians and their ratio.

    python benchmarks/startup.py [--other 0.7.0] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# What a `sweep run` process imports before its first trial (sweep/run/worker.py and its families).
PROBE = ("import time; t = time.perf_counter(); import sweep.run.worker, sweep.__main__; import ml_dtypes; "
         "print(ml_dtypes.__version__, time.perf_counter() - t)")


def _unpacked(version: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into),
                    f"ml_dtypes=={version}"], check=True, capture_output=True)
    wheel = next(into.glob("ml_dtypes-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into / "site")
    return into / "site"


def _once(pythonpath: str | None) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    version, seconds = out.stdout.split()
    return version, float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", default="0.7.0", help="the ml_dtypes release to compare with")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = _unpacked(args.other, Path(tmp))
        times: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # alternating, so a busy moment hits both sides alike
            for path in (None, str(other)):
                version, seconds = _once(path)
                times.setdefault(version, []).append(seconds)
    medians = {v: statistics.median(t) for v, t in times.items()}
    for version, seconds in medians.items():
        print(f"ml_dtypes {version}: import of what `sweep run` imports, median {seconds:.2f} s "
              f"over {len(times[version])} fresh interpreters")
    if len(medians) == 2:
        (a, ta), (b, tb) = medians.items()
        print(f"ratio {a} / {b}: {ta / tb:.2f}")


if __name__ == "__main__":
    main()
