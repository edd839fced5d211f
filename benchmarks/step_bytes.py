"""Issues 29 item 7 and 42 item 7: a kept checkpoint step's bytes on disk vs the training state's own.

Three states, each saved through TrialCheckpoints as a run saves them, in this release's layout
and, side by side in the same run, in Orbax's (`compact.SMALL_STATE_BYTES = 0`: how a state past
16 MiB, and every step of earlier releases, is written):

- 64 KiB: one 128x128 float32 matrix under plain SGD (issue 42's case; tests/checkpoints/test_compact.py);
- the example's trial (digits MLP, Adam);
- the ~100 MB large-state study (past 16 MiB: Orbax's layout in both columns).

A kept step is its folder plus its checksum file, counted by file size and as `du` counts it
(blocks allocated to every file and folder: st_blocks x 512). The save's wall time (writer waited
for) is the median of --rounds saves per layout, alternated. Targets: a step <= the state + 16 KiB
(issue 42: a 64 KiB state's step <= 80 KiB by du); <= 1.05x at ~100 MB.

    python benchmarks/step_bytes.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import harness
import jax
import numpy as np
import optax

from sweep.checkpoints import compact, integrity
from sweep.checkpoints.folder import TrialCheckpoints, host_copy
from sweep.train.state import initial_state, trial_checkpoints


def _du(paths: list[Path]) -> tuple[int, int]:
    """(file bytes, bytes `du` counts) of `paths`: every file and folder in them."""
    found = [q for p in paths for q in ([p, *p.rglob("*")] if p.is_dir() else [p])]
    return (sum(q.lstat().st_size for q in found if q.is_file()), sum(q.lstat().st_blocks for q in found) * 512)


def _matrix_state() -> dict[str, Any]:
    params = {"w": np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)}
    return {"params": params, "opt_state": optax.sgd(0.1).init(params), "step": np.asarray(0, np.int32),
            "key": np.asarray([0, 0], np.uint32), "train_loss_sum": np.asarray(0.5, np.float32)}


def _example_state(study: str, params: dict[str, Any]) -> Callable[[Path], tuple[Any, Callable[[Path], Any]]]:
    def make(tmp: Path):
        config = harness.example(tmp, study)
        state = host_copy(initial_state(config, 0, config.hyperparameters(params)).state)
        return state, lambda folder: trial_checkpoints(config, 0, folder)
    return make


def _plain(tmp: Path):
    return _matrix_state(), lambda folder: TrialCheckpoints(folder, "val_loss", "minimize", keep_last=1, keep_best=0)


def _layout(orbax: bool) -> None:
    compact.SMALL_STATE_BYTES = 0 if orbax else DEFAULT_SMALL


DEFAULT_SMALL = compact.SMALL_STATE_BYTES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    harness.quiet()
    cases = [("64 KiB matrix, SGD", _plain),
             ("digits MLP, Adam", _example_state("studies/digits_mlp.yaml",
                                                 {"learning_rate": 0.01, "hidden": 64, "optimizer": "adam"})),
             ("~100 MB large state", _example_state(str(harness.REPO / "benchmarks" / "large_state.yaml"),
                                                    {"learning_rate": 0.001}))]
    print("| state | arrays | state bytes | layout | step files | step by du | du - state | save (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, make in cases:
        with tempfile.TemporaryDirectory() as tmp:
            state, open_folder = make(Path(tmp))
            own = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
            folders, steps, rows = {}, {}, {}
            for name in ("this release", "Orbax's"):
                folders[name] = open_folder(Path(tmp) / name.replace("'", "").replace(" ", "_"))
                steps[name] = iter(range(100, 10**9, 100))

            def save(name: str) -> Callable[[int], float]:
                def run(_: int) -> float:
                    _layout(name == "Orbax's")
                    t0 = time.perf_counter()
                    folders[name].save((next(steps[name]), state, {"val_loss": 1.0}))
                    folders[name].wait()
                    return time.perf_counter() - t0
                return run

            times = harness.alternate({name: save(name) for name in folders}, args.rounds)
            for name, ckpt in folders.items():
                (step,) = ckpt.all_steps()[-1:]
                size, du = _du([ckpt.directory / str(step), integrity.checksum_file(ckpt.directory, step)])
                layout = "one file" if compact.is_compact(ckpt.directory / str(step)) else "Orbax"
                rows[name] = (size, du, statistics.median(times[name]))
                ckpt.close()
                print(f"| {label} | {len(jax.tree.leaves(state))} | {own:,} | {name} ({layout}) | {size:,} B | "
                      f"{du / 1024:,.0f} KiB ({du / own:.3f}x) | {(du - own) / 1024:+,.0f} KiB | "
                      f"{rows[name][2] * 1e3:.1f} ms |")
            ours, theirs = rows["this release"], rows["Orbax's"]
            print(f"|  |  |  | ratio | {ours[0] / theirs[0]:.3f}x | {ours[1] / theirs[1]:.3f}x |  | "
                  f"{ours[2] / theirs[2]:.3f}x |")
    _layout(False)


if __name__ == "__main__":
    main()
