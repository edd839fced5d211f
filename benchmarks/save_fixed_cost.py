"""Issue 29 item 2: the fixed cost of one save of a small state, and where it goes.

Side "save": `TrialCheckpoints.save` of a ~26 KB state (the example digits MLP at hidden 32 with
Adam), waited for: the writer's wall time, as the write budget charges it. Side "hand": the same
bytes written by hand into one new file, fsynced with its folder (the floor a checkpoint can
reach). Both write a new step / file each round into the same kind of folder, ABBA. The writer's
time is split into its phases by timing sweep's own calls around Orbax (the checksum over the
state, its checksum file, Orbax's save and wait, sweep's fsyncs of the committed step, the
retention bookkeeping), and the training thread's blocking time (host copy + hand-off) is
measured apart. Targets: save <= 10x hand, blocking <= 2 ms.

Such a state is saved as one file a step (sweep/checkpoints/compact.py, issue 42 item 7);
`--layout orbax` saves it in Orbax's layout instead, as a state past 16 MiB is saved (the
phases then are Orbax's save and wait, and sweep's fsyncs of its step).

    python benchmarks/save_fixed_cost.py [--rounds 30] [--hidden 32] [--depth D] [--layout orbax] [--profile]

--profile (with --layout orbax): then 10 more saves under cProfile, and the Orbax calls that take their time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import harness
import jax
import numpy as np

from sweep.checkpoints import compact, integrity
from sweep.checkpoints import folder as checkpoints
from sweep.checkpoints.folder import host_copy
from sweep.train.state import initial_state, trial_checkpoints

PHASES: dict[str, list[float]] = defaultdict(list)


def timed_phase(name: str, owner, attr: str) -> None:
    """Wrap owner.attr so each call's seconds go to PHASES[name]."""
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            PHASES[name].append(time.perf_counter() - t0)

    setattr(owner, attr, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--depth", type=int, default=None, help="hidden layers (--hidden 2048 --depth 3: ~100 MB)")
    ap.add_argument("--layout", choices=["compact", "orbax"], default="compact")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    harness.quiet()
    if args.layout == "orbax":
        compact.SMALL_STATE_BYTES = 0
    with tempfile.TemporaryDirectory() as tmp:
        config = harness.example(Path(tmp))
        hp = config.hyperparameters({"learning_rate": 0.01, "hidden": args.hidden, "optimizer": "adam",
                                     **({"depth": args.depth} if args.depth else {})})
        state = initial_state(config, 0, hp)[0]
        host = host_copy(state)
        leaves = [np.asarray(x) for x in jax.tree.leaves(host)]
        size = sum(x.nbytes for x in leaves)
        blob = b"".join(x.tobytes() for x in leaves)
        ckpt = trial_checkpoints(config, 0, Path(tmp) / "ckpt")
        hand_dir = Path(tmp) / "hand"
        hand_dir.mkdir()
        step = iter(range(1, 10**6))
        blocking: list[float] = []

        def save(r: int) -> float:
            t0 = time.perf_counter()
            ckpt.save((next(step), host_copy(state), {"val_loss": 1.0}))
            t1 = time.perf_counter()
            ckpt.wait()
            blocking.append(t1 - t0)
            return time.perf_counter() - t0

        files = iter(range(10**6))

        def hand(r: int) -> float:
            t0 = time.perf_counter()
            path = hand_dir / f"{next(files)}.bin"  # a new file each time, as each save is a new step
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)
            dfd = os.open(hand_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            return time.perf_counter() - t0

        harness.alternate({"save": save, "hand": hand}, 4)  # warm-up: Orbax's first save
        blocking.clear()
        for name, owner, attr in (("checksum over the state", integrity, "checksum"),
                                  ("checksum file (write + 2 fsyncs)", integrity, "write_checksum"),
                                  ("sweep's fsyncs of the committed step", integrity, "make_durable"),
                                  ("packing small arrays", checkpoints.packing, "pack")):
            timed_phase(name, owner, attr)
        if args.layout == "orbax":
            manager = ckpt._orbax()
            timed_phase("Orbax save (CheckpointManager.save)", manager, "save")
            timed_phase("Orbax wait_until_finished", manager, "wait_until_finished")
        else:
            timed_phase("one file written (compact.write)", compact, "write")
            timed_phase("install_step in all (write+fsyncs+rename)", integrity, "install_step")
            timed_phase("retention (Orbax's policy)", ckpt, "_retain")
        timed_phase("stale checksum cleanup", ckpt, "_drop_stale_checksums")
        times = harness.alternate({"save": save, "hand": hand}, args.rounds)
        phases = {name: statistics.median(values) for name, values in PHASES.items()}  # before any profiling
        if args.profile and args.layout == "orbax":
            import cProfile
            import pstats

            import orbax.checkpoint as ocp

            # Orbax's save itself, on this thread (the writer thread's calls are not profiled from here)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(10):
                manager.save(next(step), args=ocp.args.StandardSave(checkpoints.packing.pack(host)),
                             metrics={"val_loss": 1.0}, force=True)
                manager.wait_until_finished()
            profile.disable()
        ckpt.close()
    print(f"state: {size / 1e3:.1f} KB in {len(leaves)} arrays, {args.layout} layout; {args.rounds} rounds each, ABBA")
    harness.report("save of a small state (writer wall, waited)", "save", "hand", times, "<= 10")
    print(f"blocking (host copy + hand-off on the training thread): median {statistics.median(blocking) * 1e3:.2f} ms "
          "(target <= 2 ms)")
    total = statistics.median(times["save"])
    print("where a save's time goes (median per save):")
    for name, med in phases.items():
        print(f"  {name:40s} {med * 1e3:7.2f} ms  {med / total:6.1%}")
    if args.profile and args.layout == "orbax":
        print("Orbax's CheckpointManager.save under cProfile, 10 saves (cumulative per save, its own wall "
              "time inflated by the profiler):")
        stats = pstats.Stats(profile)
        wanted = ("deleter.py", "step.py", "asyncio_utils.py", "atomicity.py", "composite_checkpoint_handler.py",
                  "base_pytree_checkpoint_handler.py", "checkpoint_manager.py", "threading.py")
        rows = [(cum / 10, f"{Path(file).name}:{line}({fn})", n) for (file, line, fn), (_, n, _, cum, _) in
                stats.stats.items() if Path(file).name in wanted]
        for cum, where, n in sorted(rows, reverse=True)[:14]:
            print(f"  {cum * 1e3:7.2f} ms  {where}  ({n / 10:g} calls)")


if __name__ == "__main__":
    main()
