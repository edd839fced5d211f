"""Issue 42 item 1: checkpoints of 1-8 GB states against the disk's own speed, one process per case.

The multi-GB companion of large_state.py (~100 MB, in one process). The state is shaped like a
model's params with Adam's two moments: per tree, two large arrays (an embedding and its
output projection, ~all of the bytes) and 100 layers of three small arrays (a 256x256 matrix, a
bias, a scale): 6 large and 903 small arrays in all, random float32 values (as trained moments
are; zeros would be no test of anything), placed on the default device as a trial's state is.

Each case runs in a fresh subprocess, so one case's memory and Orbax's caches never reach
another's, and the peak RSS is the kernel's own (VmHWM, reset just before the save with
/proc/self/clear_refs):

- sweep: `TrialCheckpoints.save` of the state (host copy and hand-off on the calling thread: the
  blocking time; then the writer's checksum, Orbax's write and the fsyncs, waited for), then
  `restore_verified` of that step into the state (Orbax's read, the checksum, the large arrays
  put on the device);
- plain: the same host copy, the same bytes written into one file with one fsync (the floor: one
  stream, no format), and read back into arrays with `readinto`.

Each side first copies the state to numpy once, untimed (a fresh device array's first copy is
slower, seconds at 4 GB; a training state's saves after the first do not pay it). Both read from
the page cache (the files were just written; a cold read would be bound by the disk for both).
The sides alternate plain, sweep, sweep, plain over `--rounds`, per size.

    .venv/bin/python benchmarks/big_state.py --gb 1,4 [--rounds 2] [--dir DIR]

DIR (default: a temporary folder, `$BENCH_DIR` if set) needs room for one step and one plain file
of the largest size. Each case's process holds the state twice while it saves (the device state
and its host copy: on the CPU both are host memory; on a GPU the host holds one), so the machine
needs a little over 2x the largest state free, plus room for the page cache of the files.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYERS, SMALL = 100, 256
GB = 1 << 30


def shapes(nbytes: int) -> dict:
    """The params' shapes for a state (params, mu, nu) of about `nbytes`."""
    small = LAYERS * (SMALL * SMALL + 2 * SMALL) * 4
    width = 4096
    vocab = max(1, (nbytes // 3 - small) // (2 * width * 4))
    tree = {"embed": (vocab, width), "unembed": (width, vocab)}
    for i in range(LAYERS):
        tree[f"layer_{i:03d}"] = {"w": (SMALL, SMALL), "b": (SMALL,), "scale": (SMALL,)}
    return tree


def build_state(nbytes: int):
    import jax
    import numpy as np

    rng = np.random.default_rng(0)

    def params() -> dict:
        return jax.tree.map(lambda shape: jax.device_put(rng.random(shape, dtype=np.float32)), shapes(nbytes),
                            is_leaf=lambda x: isinstance(x, tuple))

    state = {"params": params(), "opt_state": {"count": jax.device_put(np.int32(7)), "mu": params(), "nu": params()},
             "step": jax.device_put(np.int32(7)), "key": jax.random.PRNGKey(1)}
    jax.block_until_ready(state)
    return state


def status(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def fresh_peak() -> int:
    """Free what malloc holds, reset the peak RSS to the RSS now, and return that RSS."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (Linux >= 4.0)
    return status("VmRSS")


def child_sweep(nbytes: int, folder: Path) -> dict:
    import jax

    from sweep.checkpoints import integrity
    from sweep.checkpoints.folder import TrialCheckpoints, host_copy

    state = build_state(nbytes)
    ckpt = TrialCheckpoints(folder, "val_loss", "minimize", keep_last=1, keep_best=0)
    del host_copy(state)[next(iter(state))]  # untimed: a fresh device array's first copy to numpy is slower
    before = fresh_peak()
    t0 = time.perf_counter()
    snapshot = host_copy(state)  # what the training thread does per save
    ckpt.save((1, snapshot, {"val_loss": 1.0}))
    t1 = time.perf_counter()
    del snapshot
    ckpt.wait()
    t2 = time.perf_counter()
    save_peak = status("VmHWM") - before
    template = state  # a trial restores into its freshly initialised state (device arrays)
    before = fresh_peak()
    t3 = time.perf_counter()
    restored = ckpt.restore_verified(1, template)
    t4 = time.perf_counter()
    restore_peak = status("VmHWM") - before
    integrity.checksum(restored)
    t5 = time.perf_counter()
    on_disk = sum(p.stat().st_size for p in (folder / "1").rglob("*") if p.is_file())
    ckpt.close()
    return {"save": t2 - t0, "blocking": t1 - t0, "restore": t4 - t3, "checksum": t5 - t4,
            "save_peak": save_peak, "restore_peak": restore_peak, "on_disk": on_disk,
            "arrays": len(jax.tree.leaves(state))}


def child_plain(nbytes: int, folder: Path) -> dict:
    import jax
    import numpy as np

    state = build_state(nbytes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "state.bin"
    del [np.array(x, copy=True) for x in jax.tree.leaves(state)][0]  # untimed, as on the sweep side
    before = fresh_peak()
    t0 = time.perf_counter()
    copy = [np.array(x, copy=True) for x in jax.tree.leaves(state)]
    t1 = time.perf_counter()
    with open(path, "wb") as f:
        for leaf in copy:
            f.write(memoryview(np.ascontiguousarray(leaf)).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t2 = time.perf_counter()
    save_peak = status("VmHWM") - before
    layout = [(x.shape, x.dtype) for x in copy]
    del copy
    fresh_peak()
    t3 = time.perf_counter()
    with open(path, "rb") as f:
        back = []
        for shape, dtype in layout:
            a = np.empty(shape, dtype)
            f.readinto(memoryview(a).cast("B"))
            back.append(a)
    t4 = time.perf_counter()
    return {"save": t2 - t0, "blocking": t1 - t0, "write": t2 - t1, "restore": t4 - t3, "save_peak": save_peak}


def state_bytes(nbytes: int) -> int:
    import math

    leaves = [s for s in _leaves(shapes(nbytes))]
    return 3 * sum(math.prod(s) * 4 for s in leaves) + 4 + 4 + 8


def _leaves(tree: dict):
    for v in tree.values():
        if isinstance(v, dict):
            yield from _leaves(v)
        else:
            yield v


def run_case(side: str, gb: float, folder: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", side, "--gb", str(gb), "--dir", str(folder)],
                         capture_output=True, text=True, check=False)
    shutil.rmtree(folder, ignore_errors=True)
    if out.returncode:
        raise SystemExit(f"{side} {gb} GB failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(gb: float, runs: dict[str, list[dict]]) -> None:
    size = state_bytes(int(gb * GB))
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    s, p = med["sweep"], med["plain"]
    mb = size / 1e6
    print(f"--- {size / GB:.2f} GiB state ({s['arrays']:.0f} arrays), {len(runs['sweep'])} rounds, medians")
    print(f"save: sweep {mb / s['save']:.0f} MB/s ({s['save']:.2f} s), plain host copy + write + fsync "
          f"{mb / p['save']:.0f} MB/s ({p['save']:.2f} s; the write + fsync alone {mb / p['write']:.0f} MB/s); "
          f"ratio sweep/plain {p['save'] / s['save']:.3f}  (target >= 0.7); sweep's whole save vs the plain "
          f"write + fsync alone {p['write'] / s['save']:.3f}")
    print(f"verified restore: sweep {mb / s['restore']:.0f} MB/s ({s['restore']:.2f} s, of which checksum "
          f"{s['checksum']:.2f} s), plain read {mb / p['restore']:.0f} MB/s ({p['restore']:.2f} s); ratio "
          f"sweep/plain {p['restore'] / s['restore']:.3f}  (target >= 0.5)")
    print(f"peak RSS above the RSS before the save: sweep {max(r['save_peak'] for r in runs['sweep']) / size:.2f}x "
          f"the state (target <= 1.2), plain {max(r['save_peak'] for r in runs['plain']) / size:.2f}x; during the "
          f"restore: sweep {max(r['restore_peak'] for r in runs['sweep']) / size:.2f}x")
    print(f"blocking of the training thread per save: sweep {s['blocking']:.3f} s, plain host copy "
          f"{p['blocking']:.3f} s; ratio {s['blocking'] / p['blocking']:.3f}")
    print(f"a step on disk: {s['on_disk'] / size:.4f}x the state")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", default="1,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", choices=("sweep", "plain"))
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        fn = child_sweep if args.child == "sweep" else child_plain
        print(json.dumps(fn(int(float(args.gb) * GB), Path(args.dir))))
        return
    root = Path(tempfile.mkdtemp(dir=args.dir or os.environ.get("BENCH_DIR")))
    try:
        for gb in (float(g) for g in args.gb.split(",")):
            runs: dict[str, list[dict]] = {"sweep": [], "plain": []}
            for r in range(args.rounds):
                for side in (("plain", "sweep") if r % 2 == 0 else ("sweep", "plain")):
                    runs[side].append(run_case(side, gb, root / f"{side}{r}"))
            report(gb, runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
