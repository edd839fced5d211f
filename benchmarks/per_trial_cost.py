"""Target 4: a sweep study of 30 one-step trials vs a hand-written Optuna ask/tell loop doing the same work.

Both sides, in this process, alternating, each round in fresh workdirs with fresh SQLite storage:
- "sweep": `worker.run` on the example trial with 30 trials of 1 step (random sampler over the
  learning rate, equal shapes), evaluation and a save at that step (keep 1).
- "hand": `study.ask()`, `suggest_float`, init, one jitted training step (compiled once, the
  learning rate traced), evaluation, `trial.report`, one Orbax `CheckpointManager` save of the
  full state, `study.tell`.
Warm-up rounds first (compilation). Target: sweep/hand <= 1.2.

    python benchmarks/per_trial_cost.py [--trials 30] [--rounds 4]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import harness
import jax
import numpy as np
import optax
import optuna
import orbax.checkpoint as ocp
import yaml

from sweep.host.signals import StopSignal
from sweep.run import worker
from sweep.store.session import Session

SPACE = {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    harness.quiet()
    root = Path(tempfile.mkdtemp(prefix="sweep-per-trial-"))
    counter = iter(range(10**6))

    def config_in(workdir: Path):
        raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
        raw.update(name="per-trial", workdir=str(workdir), n_trials=args.trials, pruner={"type": "none"},
                   sampler={"type": "random", "seed": 0}, search_space=SPACE,
                   fixed={"batch_size": 64, "hidden": 112, "optimizer": "adam"},
                   train={"steps": 1, "eval_every": 1, "seed": 0},
                   checkpoint={"every_steps": 1, "keep_last": 1, "keep_best": 1})
        workdir.mkdir(parents=True)
        (workdir / "study.yaml").write_text(yaml.safe_dump(raw))
        return harness.config_lib.load(workdir / "study.yaml")

    def sweep_side(r: int) -> float:
        config = config_in(root / f"sweep{next(counter)}")
        return harness.timed(lambda: worker.run(Session(config), StopSignal()))

    module = harness.example(root).trial_module
    hp = {**module.HYPERPARAMETERS, "batch_size": 64, "hidden": 112, "optimizer": "adam"}
    data = module.data(hp)

    @jax.jit
    def step(params, opt_state, key, lr):
        tx = optax.adam(lr)
        batch = module.batch(hp, data, key)
        grads = jax.grad(lambda p: module.loss(hp, p, batch, key))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    evaluate = jax.jit(lambda params: module.evaluate(hp, params, data))

    def hand_side(r: int) -> float:
        workdir = root / f"hand{next(counter)}"
        workdir.mkdir()

        def loop() -> None:
            study = optuna.create_study(storage=f"sqlite:///{workdir / 'study.db'}",
                                        sampler=optuna.samplers.RandomSampler(seed=0))
            for _ in range(args.trials):
                trial = study.ask()
                lr = trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)
                key = jax.random.PRNGKey(trial.number)
                params = module.init(hp, key, data)
                opt_state = optax.adam(lr).init(params)
                params, opt_state = step(params, opt_state, key, lr)
                value = float(evaluate(params)["val_loss"])
                trial.report(value, 1)
                with ocp.CheckpointManager(workdir / f"trial_{trial.number}",
                                           options=ocp.CheckpointManagerOptions(max_to_keep=1)) as mngr:
                    state = {"params": params, "opt_state": opt_state, "step": np.int32(1), "key": key}
                    mngr.save(1, args=ocp.args.StandardSave(state))
                    mngr.wait_until_finished()
                study.tell(trial, value)

        return harness.timed(loop)

    harness.alternate({"sweep": sweep_side, "hand": hand_side}, 1)  # warm-up: compilation
    times = harness.alternate({"sweep": sweep_side, "hand": hand_side}, args.rounds)
    print(f"{args.trials} one-step trials per study")
    ratio = harness.report("study wall time", "sweep", "hand", times, "<= 1.2")
    per = {k: sorted(v)[len(v) // 2] / args.trials * 1000 for k, v in times.items()}
    print(f"per trial: sweep {per['sweep']:.1f} ms, hand {per['hand']:.1f} ms (ratio {ratio:.2f})")


if __name__ == "__main__":
    main()
