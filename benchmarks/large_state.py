"""Issue 15: checkpoints of a ~100 MB training state, each measured against its floor, side by side.

The state: the digits MLP at `--hidden` (default 2048) and `--depth` (3) with Adam (params, mu and
nu: ~100 MB), built and placed on the default device like a trial's. Runs unchanged on a GPU,
where the device-to-host copy is the floor of blocking. In ABBA order, `--rounds` times:

- save throughput: a sweep save (host copy, sha256 checksum, Orbax write, fsyncs; written and
  waited for) vs writing the same arrays with `np.save` and fsyncing each file and the folder.
  Target: sweep MB/s >= 0.5x plain.
- blocking: what the training thread waits for per save (host copy + handing it to the writer,
  the previous write finished) vs a plain `np.array(x, copy=True)` of the state. Target <= 1.2x.
- restore: `restore_verified` (Orbax read + checksum) vs `np.load` of the plain files (both from
  the page cache: the files were just written). Target <= 2x.
- peak host memory during a save (RSS sampled every ms, above the RSS before it) vs the state's
  size. Target: <= ~2 copies.

    .venv/bin/python benchmarks/large_state.py [--hidden 2048] [--depth 3] [--rounds 4]

States of 1-8 GB are measured by big_state.py (one process per case, the kernel's peak RSS).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import harness  # noqa: F401  (puts the repo on sys.path)
import jax
import numpy as np
import optax

from sweep.checkpoints import integrity
from sweep.checkpoints.folder import TrialCheckpoints, host_copy
from trials.digits_mlp import model


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The highest RSS seen (sampled every millisecond) while the block runs."""

    def __enter__(self) -> PeakRSS:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed copies of earlier rounds leave the baseline
        self.before, self.peak, self._stop = rss(), rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def plain_save(state: dict, folder: Path) -> None:
    folder.mkdir(parents=True)
    for i, leaf in enumerate(jax.tree.leaves(state)):
        path = folder / f"{i}.npy"
        with open(path, "wb") as f:
            np.save(f, np.asarray(leaf))
            f.flush()
            os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def plain_load(folder: Path, n: int) -> list[np.ndarray]:
    return [np.load(folder / f"{i}.npy") for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    params = model({"hidden": args.hidden, "depth": args.depth}).init(jax.random.PRNGKey(0), np.zeros((1, 64)))["params"]
    opt_state = optax.adam(1e-3).init(params)
    # A trained state: Adam's moments are not zeros (zeros would compress to nothing on disk).
    rng = np.random.default_rng(0)
    opt_state = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype) if x.ndim else x, opt_state)
    state = jax.device_put({"params": params, "opt_state": opt_state, "step": np.int32(0),
                            "key": jax.random.PRNGKey(1), "train_loss_sum": np.float32(0)}, jax.devices()[0])
    jax.block_until_ready(state)
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
    n_leaves = len(jax.tree.leaves(state))
    template = host_copy(state)
    tmp = Path(tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR")))
    ckpt = TrialCheckpoints(tmp / "sweep", "val_loss", "minimize", keep_last=2, keep_best=1)
    times: dict[str, list[float]] = {k: [] for k in ("sweep_save", "plain_save", "blocking", "host_copy",
                                                     "restore", "plain_load", "orbax_read", "checksum")}
    peaks: list[float] = []
    step = 0
    for r in range(args.rounds + 1):  # round 0 warms up (first Orbax save, page cache), not counted
        for side in (("sweep", "plain") if r % 2 == 0 else ("plain", "sweep")):
            if side == "sweep":
                step += 1
                ckpt.wait()
                with PeakRSS() as mem:
                    t0 = time.perf_counter()
                    snapshot = host_copy(state)  # what the training thread does per save
                    ckpt.save((step, snapshot, {"val_loss": float(step)}))
                    t1 = time.perf_counter()
                    del snapshot
                    ckpt.wait()
                    t2 = time.perf_counter()
                t3 = time.perf_counter()
                restored = ckpt.restore_verified(step, template)
                t4 = time.perf_counter()
                del restored
                unverified = ckpt.restore(step, template)  # the parts of it: the read (direct_read.py) ...
                t5 = time.perf_counter()
                integrity.checksum(unverified)  # ... and the checksum
                t6 = time.perf_counter()
                del unverified
                if r:
                    times["blocking"].append(t1 - t0)
                    times["sweep_save"].append(t2 - t0)
                    times["restore"].append(t4 - t3)
                    times["orbax_read"].append(t5 - t4)
                    times["checksum"].append(t6 - t5)
                    peaks.append((mem.peak - mem.before) / nbytes)
            else:
                folder = tmp / f"plain{r}"
                t0 = time.perf_counter()
                copy = jax.tree.map(lambda x: np.array(x, copy=True), state)
                t1 = time.perf_counter()
                plain_save(copy, folder)
                t2 = time.perf_counter()
                del copy
                t3 = time.perf_counter()
                plain_load(folder, n_leaves)
                t4 = time.perf_counter()
                shutil.rmtree(folder)
                if r:
                    times["host_copy"].append(t1 - t0)
                    times["plain_save"].append(t2 - t0)
                    times["plain_load"].append(t4 - t3)
    ckpt.close()
    tmp_disk = tmp / "sweep"
    on_disk = sum(f.stat().st_size for f in (tmp_disk / str(step)).rglob("*") if f.is_file())
    shutil.rmtree(tmp)
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = nbytes / 1e6
    print(f"state: {mb:.1f} MB in {n_leaves} arrays (MLP hidden {args.hidden}, depth {args.depth}, Adam) on "
          f"{jax.devices()[0].platform}; a sweep step is {on_disk / 1e6:.1f} MB on disk; {args.rounds} rounds, medians")
    print(f"save throughput: sweep {mb / med['sweep_save']:.0f} MB/s ({med['sweep_save'] * 1e3:.0f} ms), plain numpy "
          f"{mb / med['plain_save']:.0f} MB/s ({med['plain_save'] * 1e3:.0f} ms); ratio sweep/plain "
          f"{med['plain_save'] / med['sweep_save']:.3f}  (target >= 0.5)")
    print(f"blocking per save: sweep {med['blocking'] * 1e3:.1f} ms, host copy {med['host_copy'] * 1e3:.1f} ms; "
          f"ratio {med['blocking'] / med['host_copy']:.3f}  (target <= 1.2)")
    print(f"restore (verified): sweep {med['restore'] * 1e3:.0f} ms, np.load {med['plain_load'] * 1e3:.0f} ms; "
          f"ratio {med['restore'] / med['plain_load']:.3f}  (target <= 2); its parts: the read "
          f"{med['orbax_read'] * 1e3:.0f} ms, checksum {med['checksum'] * 1e3:.0f} ms")
    print(f"peak host memory during a save, above the state: max {max(peaks):.2f}x the state's size "
          f"({max(peaks) * mb:.0f} MB; target <= ~2)")


if __name__ == "__main__":
    main()
