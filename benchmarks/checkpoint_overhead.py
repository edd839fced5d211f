"""Wall time of the example study with periodic checkpoints vs the same study without them.

Whole studies (Optuna, compilation, training, evaluation, saves) run in this one process in ABBA
order (on, off, off, on, ...), each in a fresh workdir, so drift and caches hit both sides alike.
Both sides compute bit-identical trials (checked). Two comparisons:
- `--compare periodic` (issue 7, target <= 1.03): "on" saves every `--every-steps` steps (100);
  "off" has periodic saves off (the best and the final state are still saved, as they must).
- `--compare nothing` (issue 2, target <= 1.05): "on" is the study file's own settings; "off" swaps
  the trial's checkpoint folder for one whose saves and restores do nothing.

    python benchmarks/checkpoint_overhead.py [--compare periodic] [--rounds 2] [--n-trials N] [--hidden H]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from unittest import mock
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweep.checkpoints.study_checkpoints import StudyCheckpoints  # noqa: E402
from sweep.host.signals import StopSignal  # noqa: E402
from sweep.run import worker  # noqa: E402
from sweep.store.session import Session  # noqa: E402
from sweep.study import config as config_lib  # noqa: E402


class NoCheckpoints:
    """Checkpointing off: saves and restores do nothing."""

    last_saved = None
    ram = None

    def __init__(self, *args, **kwargs):
        pass

    def latest_step(self):
        return None

    def restore(self, step, template):
        return template

    def restore_verified(self, step, template):
        return template

    def restore_intact(self, template, best_before):
        return None, template

    def all_steps(self):
        return []

    def save(self, *items):
        pass

    def busy(self, share=1.0):
        return False

    def wait(self):
        pass

    def drop_ram(self):
        pass

    def close(self):
        pass


def run_study(args, side: str, tmp: Path, index: int) -> tuple[float, list]:
    config = config_lib.load(args.study)
    config.workdir = tmp / f"{side}_{index}"
    config.storage = f"sqlite:///{config.workdir / 'study.db'}"
    if args.n_trials:
        config.study = config.study.model_copy(update={"n_trials": args.n_trials})
    if args.hidden:  # the state's size: params and Adam's moments grow with hidden squared
        config.study = config.study.model_copy(update={"fixed": {**config.study.fixed, "hidden": args.hidden}})
    if args.compare == "periodic":
        every = {"every_steps": None if args.every_seconds else args.every_steps, "every_seconds": args.every_seconds,
                 "max_write_share": args.max_write_share} if side == "on" else {"every_steps": None, "every_seconds": 1e9}
        config.study = config.study.model_copy(update={"checkpoint": config.study.checkpoint.model_copy(update=every)})
    session = Session(config)
    # The "nothing" side: every trial's folder is a stand-in that saves nothing (the study's folders
    # are made by StudyCheckpoints.trial, sweep/checkpoints/study_checkpoints.py).
    no_saves = side == "off" and args.compare == "nothing"
    try:
        with mock.patch.object(StudyCheckpoints, "trial", lambda *a, **k: NoCheckpoints()) if no_saves \
                else contextlib.nullcontext():
            t0 = time.perf_counter()
            worker.run(session, StopSignal())
            elapsed = time.perf_counter() - t0
        return elapsed, [(t.params, t.value, t.intermediate_values) for t in session.trials()]
    finally:
        session.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--study", default="studies/digits_mlp.yaml")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs the study twice per side)")
    ap.add_argument("--n-trials", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None, help="override the study's fixed hidden width")
    ap.add_argument("--compare", choices=("periodic", "nothing"), default="periodic")
    ap.add_argument("--every-steps", type=int, default=100, help="the periodic cadence of --compare periodic")
    ap.add_argument("--every-seconds", type=float, default=None, help="a cadence in seconds instead of --every-steps")
    ap.add_argument("--max-write-share", type=lambda v: None if v == "none" else float(v),
                    default=config_lib.DEFAULT_WRITE_SHARE,
                    help="checkpoint.max_write_share of 'on' (default: sweep's default; none: the exact cadence)")
    args = ap.parse_args()
    logging.getLogger("sweep").setLevel(logging.WARNING)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    times: dict[str, list[float]] = {"on": [], "off": []}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        # Untimed warm-up of both sides: the first study pays XLA compilation and one-off imports.
        for side in ("on", "off"):
            print(f"warm-up {side:>3}: {run_study(args, side, Path(tmp), -1 if side == 'on' else -2)[0]:7.2f} s")
        for r in range(args.rounds):
            for i, side in enumerate(("on", "off", "off", "on")):
                elapsed, trials = run_study(args, side, Path(tmp), 4 * r + i)
                times[side].append(elapsed)
                results.setdefault(side, trials)
                assert trials == results[side], "a study differed between repetitions"
                print(f"round {r} {side:>3}: {elapsed:7.2f} s")
    assert results["on"] == results["off"], "checkpointing changed the results"
    c = config_lib.load(args.study).study
    cadence = f"every_seconds={args.every_seconds}" if args.every_seconds else f"every_steps={args.every_steps}"
    settings = (f"on: {cadence} max_write_share={args.max_write_share}, off: best and final "
                "saves only" if args.compare == "periodic"
                else f"on: every_steps={c.checkpoint.every_steps} every_seconds={c.checkpoint.every_seconds}, "
                     "off: no checkpoint code at all")
    print(f"study {args.study}: n_trials={args.n_trials or c.n_trials} steps={c.train.steps} "
          f"keep_last={c.checkpoint.keep_last} keep_best={c.checkpoint.keep_best} hidden={args.hidden or c.fixed.get('hidden')}; "
          f"{settings}")
    on, off = sum(times["on"]), sum(times["off"])
    print(f"total on {on:.2f} s, off {off:.2f} s")
    print(f"ratio on/off: {on / off:.3f}  (target <= {1.03 if args.compare == 'periodic' else 1.05})")


if __name__ == "__main__":
    main()
