"""Issue 18: a streaming trial (grain pipeline over ArrayRecord files) vs the same model on data
held in memory, and what the iterator state adds to a checkpoint.

Side "stream": `trials.digits_stream` (train_batches: shuffle per epoch, batch, parse, augment;
val_batches streamed). Side "memory": `trials.digits_mlp`, the same MLP, batch size and
optimizer, its data in device memory. Each round runs one trial of `--steps` steps through the
Python API in a fresh workdir (ABBA order); the first round of each side compiles and is not
counted. Target: stream/memory steps/s >= 0.9.

Then: the bytes the iterator state adds to a checkpoint (on disk, per step) and the save time it
adds (TrialCheckpoints.save of the same state with and without it, written and waited for).

    python benchmarks/streaming.py [--hidden 1024] [--depth 3] [--batch 128] [--steps 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

import sweep
from sweep.checkpoints.folder import TrialCheckpoints
from sweep.train import stream


def study(kind: str, workdir: Path, data_dir: Path, args: argparse.Namespace) -> dict:
    fixed = {"batch_size": args.batch, "hidden": args.hidden, "depth": args.depth, "learning_rate": 1e-3}
    if kind == "stream":
        fixed["data_dir"] = str(data_dir)
    return {"name": kind, "trial": f"trials.{'digits_stream' if kind == 'stream' else 'digits_mlp'}", "n_trials": 1,
            "workdir": str(workdir), "objective": {"metric": "val_loss", "direction": "minimize"},
            "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"},
            "search_space": {"weight_decay": {"type": "categorical", "choices": [0.0]}}, "fixed": fixed,
            "train": {"steps": args.steps, "eval_every": args.steps // 4, "seed": 0},
            "checkpoint": {"keep_last": 1, "keep_best": 1}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    harness.quiet()
    tmp = Path(tempfile.mkdtemp())
    data_dir = tmp / "records"
    from trials import digits_stream

    digits_stream.write_records(data_dir)
    count = {"stream": 0, "memory": 0}

    def side(kind: str):
        def go(r: int) -> float:
            count[kind] += 1
            workdir = tmp / f"{kind}{count[kind]}"
            t = harness.timed(lambda: sweep.open(study(kind, workdir, data_dir, args)).run(progress=False, quiet=True))
            shutil.rmtree(workdir)
            return t
        return go

    sides = {"stream": side("stream"), "memory": side("memory")}
    for go in sides.values():
        go(-1)  # compiles (in this process; later rounds reuse the jitted functions)
    times = harness.alternate(sides, args.rounds)
    print(f"model: MLP hidden {args.hidden}, depth {args.depth}, batch {args.batch}; {args.steps} steps, "
          f"4 evaluations; {os.cpu_count()} CPUs")
    for kind in sides:
        per_step = statistics.median(times[kind]) / args.steps
        print(f"{kind}: median trial {statistics.median(times[kind]):.2f} s ({per_step * 1e3:.3f} ms/step, "
              f"{1 / per_step:.0f} steps/s) over {args.rounds} rounds")
    ratio = statistics.median(times["memory"]) / statistics.median(times["stream"])
    print(f"steps/s stream/memory: {ratio:.3f}  (target >= 0.9)")

    # the iterator state in a checkpoint: bytes on disk and save time, same state without it
    import jax

    from trials import digits_mlp  # noqa: F401 (the state's shapes: the same MLP)
    from trials.digits_mlp import model

    params = model({"hidden": args.hidden, "depth": args.depth}).init(jax.random.PRNGKey(0), np.zeros((1, 64)))
    base = {"params": jax.tree.map(np.asarray, params), "step": np.int32(0)}
    with_state = {**base, stream.DATA_STATE_KEY: stream.encode_state({"next_index": 123456})}
    sizes, saves = {}, {"with": [], "without": []}
    for name, state in (("without", base), ("with", with_state)):
        folder = tmp / f"ckpt_{name}"
        ckpt = TrialCheckpoints(folder, "val_loss", "minimize", keep_last=100, keep_best=0)
        for step in range(1, 2 * args.rounds + 2):
            t0 = time.perf_counter()
            ckpt.save((step, state, {"val_loss": 1.0}))
            ckpt.wait()
            if step > 1:
                saves[name].append(time.perf_counter() - t0)
        ckpt.close()
        sizes[name] = sum(p.stat().st_size for p in (folder / "2").rglob("*") if p.is_file())
    print(f"checkpoint of step 2: {sizes['with']} bytes with the iterator state, {sizes['without']} without: "
          f"+{sizes['with'] - sizes['without']} bytes (the state array is {stream.STATE_BYTES} bytes before "
          "compression)")
    print(f"save (written, fsynced): median {statistics.median(saves['with']) * 1e3:.1f} ms with, "
          f"{statistics.median(saves['without']) * 1e3:.1f} ms without, over {len(saves['with'])} saves each")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
