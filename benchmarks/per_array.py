"""Issue 29 item 3: the cost per array of a checkpoint, packed (this release) vs plain (one Orbax
array per leaf, earlier releases) vs one array of the same bytes.

A state of --arrays small float32 arrays (default 963, ~1.3 MB: the 160-layer MLP with Adam) is
saved and restored (verified: checksum included) by TrialCheckpoints with the packed layout and
with packing switched off, side by side in ABBA order; `np.save` + fsync and `np.load` of one
array of the same bytes are the floor. Targets: packed restore <= 3x np.load of one array;
resume -> first new evaluation <= 1.15x a warm fresh start is measured by resume_latency.py.

    python benchmarks/per_array.py [--arrays 963] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import harness
import numpy as np

from sweep.checkpoints import packing
from sweep.checkpoints.folder import TrialCheckpoints


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arrays", type=int, default=963)
    ap.add_argument("--bytes", type=int, default=1_300_000, help="the state's bytes in all")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    harness.quiet()
    rng = np.random.default_rng(0)
    n = args.bytes // 4 // args.arrays
    state = {"params": {f"layer_{i:04d}": rng.normal(size=(n,)).astype(np.float32) for i in range(args.arrays)},
             "step": np.asarray(1, np.int32)}
    one = np.concatenate(list(state["params"].values()))
    template = {"params": {k: np.zeros_like(v) for k, v in state["params"].items()}, "step": np.zeros((), np.int32)}
    pack = packing.pack
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"packed": TrialCheckpoints(Path(tmp) / "packed", "val_loss", "minimize", 2, 1),
                   "plain": TrialCheckpoints(Path(tmp) / "plain", "val_loss", "minimize", 2, 1)}
        step = iter(range(1, 10**6))

        def save(side: str) -> float:
            packing.pack = pack if side == "packed" else (lambda s: s)
            try:
                return harness.timed(lambda: (folders[side].save((next(step), state, {"val_loss": 1.0})),
                                              folders[side].wait()))
            finally:
                packing.pack = pack

        def restore(side: str) -> float:
            ckpt = folders[side]
            return harness.timed(lambda: ckpt.restore_verified(ckpt.latest_step(), template))

        def np_save(_: int) -> float:
            def write() -> None:
                with open(Path(tmp) / "one.npy", "wb") as f:
                    np.save(f, one)
                    f.flush()
                    os.fsync(f.fileno())
            return harness.timed(write)

        def np_load(_: int) -> float:
            return harness.timed(lambda: np.load(Path(tmp) / "one.npy"))

        sides = {"packed": lambda r: save("packed"), "plain": lambda r: save("plain"), "np.save": np_save}
        harness.alternate(sides, 2)  # warm-up: Orbax's first save, file creation
        saves = harness.alternate(sides, args.rounds)
        loads = {"packed": lambda r: restore("packed"), "plain": lambda r: restore("plain"), "np.load": np_load}
        harness.alternate(loads, 1)
        restores = harness.alternate(loads, args.rounds)
        for ckpt in folders.values():
            ckpt.close()
    print(f"state: {args.arrays} arrays, {args.bytes / 1e6:.2f} MB")
    harness.report("save + wait", "packed", "plain", saves, "< 1")
    harness.report("save + wait", "packed", "np.save", saves, "informative (fixed per-save cost)")
    harness.report("verified restore", "packed", "plain", restores, "< 1")
    harness.report("verified restore", "packed", "np.load", restores, "<= 3")


if __name__ == "__main__":
    main()
