"""Issue 29 item 7: a checkpoint step's bytes on disk vs the training state's own bytes.

The example's trial (digits MLP, Adam) and the ~100 MB large-state study are saved through
TrialCheckpoints, as a run saves them; the step folder (Orbax's files: arrays, metadata, commit
markers, metrics) plus its checksum file is summed by file size and by allocated blocks (du).
Targets: a step <= the state's bytes + 16 KB; <= 1.05x at ~100 MB.

    python benchmarks/step_bytes.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import harness
import jax
import numpy as np

from sweep.checkpoints import integrity
from sweep.checkpoints.folder import host_copy
from sweep.train.state import initial_state, trial_checkpoints


def _sizes(paths: list[Path]) -> tuple[int, int]:
    files = [p for root in paths for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(os.stat(p).st_blocks * 512 for p in files)


def main() -> None:
    harness.quiet()
    cases = [("studies/digits_mlp.yaml", {"learning_rate": 0.01, "hidden": 64, "optimizer": "adam"}),
             (str(harness.REPO / "benchmarks" / "large_state.yaml"), {"learning_rate": 0.001})]
    for study, params in cases:
        with tempfile.TemporaryDirectory() as tmp:
            config = harness.example(Path(tmp), study)
            hp = config.hyperparameters(params)
            state = host_copy(initial_state(config, 0, hp).state)
            own = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
            ckpt = trial_checkpoints(config, 0, Path(tmp) / "ckpt")
            ckpt.save((100, state, {config.study.objective.metric: 1.0}))
            ckpt.close()
            folder = Path(tmp) / "ckpt"
            size, allocated = _sizes([folder / "100", integrity.checksum_file(folder, 100)])
            print(f"{Path(study).stem}: state {own} B in {len(jax.tree.leaves(state))} arrays; step on disk "
                  f"{size} B (+{size - own} B, {size / own:.3f}x), allocated {allocated} B ({allocated / own:.3f}x)")


if __name__ == "__main__":
    main()
