"""Target 1: how long a save blocks the training thread vs copying the state to host and into the page cache.

Side "save": what the runner does on its thread at a save: `host_copy` of the training state
(device -> private numpy) and `TrialCheckpoints.save` (hands it to the background writer; Orbax,
the checksum and the fsyncs run there). Side "raw": `jax.device_get` of the same state and
`np.save` of every leaf into a file (page cache, no fsync). Between two saves the thread "trains"
for --gap seconds (a sleep, as XLA releases the GIL while it computes), so the previous save has
finished, as with any cadence longer than one Orbax write (~30 ms). Target: save/raw <= 2.

    python benchmarks/save_blocking.py [--hidden 1024] [--rounds 40]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import harness
import jax
import numpy as np

from sweep.checkpoints.folder import host_copy
from sweep.train.state import initial_state, trial_checkpoints


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024, help="MLP width (1024: ~0.9 MB of state with Adam)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.1, help="seconds of 'training' between two saves")
    args = ap.parse_args()
    harness.quiet()
    with tempfile.TemporaryDirectory() as tmp:
        config = harness.example(Path(tmp))
        hp = config.hyperparameters({"learning_rate": 0.01, "hidden": args.hidden, "optimizer": "adam"})
        state = initial_state(config, 0, hp)[0]
        size = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
        ckpt = trial_checkpoints(config, 0, Path(tmp) / "ckpt")
        raw_dir = Path(tmp) / "raw"
        raw_dir.mkdir()
        step = iter(range(1, 10**6))

        def save(r: int) -> float:
            time.sleep(args.gap)
            t0 = time.perf_counter()
            ckpt.save((next(step), host_copy(state), {"val_loss": 1.0}))
            return time.perf_counter() - t0

        def raw(r: int) -> float:
            time.sleep(args.gap)
            t0 = time.perf_counter()
            for i, leaf in enumerate(jax.tree.leaves(jax.device_get(state))):
                np.save(raw_dir / f"{r}_{i}.npy", np.asarray(leaf))
            return time.perf_counter() - t0

        harness.alternate({"save": save, "raw": raw}, 4)  # warm-up: Orbax's first save, file creation
        times = harness.alternate({"save": save, "raw": raw}, args.rounds)
        ckpt.close()
    print(f"state: {size / 1e6:.2f} MB in {len(jax.tree.leaves(state))} arrays")
    harness.report("blocking per save", "save", "raw", times, "<= 2")


if __name__ == "__main__":
    main()
