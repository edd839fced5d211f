"""Issues 11 and 19: per-step cost of trials inside sweep vs the same step written by hand.

Trials: the real-code ones (linen ResNet with BatchNorm, NNX CNN), and the digits MLP at two
sizes: the example (~30 us a step) and a wide one (tens of ms a step), where window boundaries
used to leave the device idle.

Side "sweep": the runner's training loop (`runner.run_trial`) over `--steps` steps of one trial,
one evaluation at the end, periodic saves off (only the final save), warm (its compiled window
is in the in-process cache from a first, unmeasured run).
Side "hand": the same training step as a plain `jax.jit` + `lax.fori_loop` over the same steps
(the Flax idiom: `value_and_grad(has_aux=True)` with `mutable=["batch_stats"]` for linen;
`nnx.split` / `nnx.merge` for NNX), its evaluation and a host copy of the state, also warm.
Per-step cost is the slope: (time for 2N steps - time for N steps) / N on each side, so fixed
costs (init, the evaluation, the final save) cancel. Also prints each trial's checkpoint size
(the bytes of one committed step).

    .venv/bin/python benchmarks/real_trials.py [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import harness  # noqa: F401  (puts the repo on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sweep.checkpoints.folder import host_copy
from sweep.host.signals import StopSignal
from sweep.train import loop as runner
from sweep.train.state import initial_state, run_hyperparameters, trial_checkpoints
from sweep.trial.kinds import takes_step

TRIALS = {
    "digits_resnet": ("studies/digits_resnet.yaml", {"learning_rate": 0.01, "weight_decay": 1e-4, "width": 8}),
    "digits_nnx": ("studies/digits_nnx.yaml", {"learning_rate": 0.01, "dropout": 0.2, "hidden": 32}),
    "digits_mlp": ("studies/digits_mlp.yaml", {"learning_rate": 0.005, "hidden": 112, "optimizer": "adam"}),
    "digits_mlp_wide": ("studies/digits_mlp.yaml", {"learning_rate": 0.005, "hidden": 1024, "optimizer": "adam",
                                                    "depth": 2, "batch_size": 256}),
    "digits_mlp_xwide": ("studies/digits_mlp.yaml", {"learning_rate": 0.005, "hidden": 2048, "optimizer": "adam",
                                                     "depth": 2, "batch_size": 512}),
}


class _Null:
    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False


def _hand_loop(config, hp, fresh):
    """The same training step, written by hand: jit + fori_loop, no sweep in it."""
    module, kind = config.trial_module, fresh.kind
    run_hp = run_hyperparameters(config, hp)
    tx = module.optimizer(run_hp)
    data = fresh.data

    @jax.jit
    def train(params, opt_state, model_state, rng, n):
        def body(step, carry):
            params, opt_state, model_state = carry
            batch_key, loss_key = jax.random.split(jax.random.fold_in(rng, step))
            if takes_step(module.batch):
                batch = module.batch(run_hp, data, jax.random.fold_in(rng, 1), step)
            else:
                batch = module.batch(run_hp, data, batch_key)
            (loss, model_state), grads = jax.value_and_grad(
                lambda p: kind.loss(module, run_hp, p, model_state, batch, loss_key), has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, model_state
        return jax.lax.fori_loop(0, n, body, (params, opt_state, model_state))

    @jax.jit
    def evaluate(params, model_state):
        return kind.evaluate(module, run_hp, params, model_state, data)

    def go(n):
        s = fresh.state
        params, opt_state, model_state = train(jax.tree.map(jnp.array, s["params"]), s["opt_state"],
                                               s.get("model_state", {}), s["key"], n)
        metrics = evaluate(params, model_state)
        host_copy((params, opt_state, model_state))
        return float(metrics["val_loss"])

    return go


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", default=",".join(TRIALS), help="comma-separated, of: " + ", ".join(TRIALS))
    ap.add_argument("--wide-steps", type=int, default=100, help="steps of digits_mlp_wide (tens of ms each)")
    ap.add_argument("--xwide-steps", type=int, default=40, help="steps of digits_mlp_xwide (~75 ms or more each)")
    args = ap.parse_args()
    harness.quiet()
    for name in args.trials.split(","):
        study, params = TRIALS[name]
        with tempfile.TemporaryDirectory() as tmp:
            n = args.wide_steps if name == "digits_mlp_wide" else args.xwide_steps if name == "digits_mlp_xwide" \
                else args.steps
            configs = {k: harness.example(Path(tmp), study, train={"steps": k, "eval_every": k},
                                          checkpoint={"every_steps": None, "every_seconds": 1e9}) for k in (n, 2 * n)}
            hp = configs[n].hyperparameters({k: v for k, v in params.items()
                                             if k in configs[n].study.search_space})
            hp.update({k: v for k, v in params.items() if k not in configs[n].study.search_space})
            fresh = {k: initial_state(c, 0, hp) for k, c in configs.items()}
            hand = {k: _hand_loop(c, hp, fresh[k]) for k, c in configs.items()}
            counter = iter(range(10**6))

            def sweep_run(k: int) -> float:
                folder = Path(tmp) / f"ckpt{next(counter)}"
                ckpt = trial_checkpoints(configs[k], 0, folder)
                try:
                    t = harness.timed(lambda: runner.run_trial(configs[k], 0, hp, _Null(), {}, ckpt, StopSignal()))
                    ckpt.wait()
                finally:
                    ckpt.close()
                return t

            for k in (n, 2 * n):  # compile both sides first
                sweep_run(k)
                hand[k](k)
            times = harness.alternate({
                "sweep": lambda r: (sweep_run(2 * n) - sweep_run(n)) / n,
                "hand": lambda r: (harness.timed(lambda: hand[2 * n](2 * n)) - harness.timed(lambda: hand[n](n))) / n,
            }, args.rounds)
            ratio = harness.report(f"{name}: per step (slope of {n} -> {2 * n} steps)", "sweep", "hand", times,
                                   "<= 1.05")
            print(f"  {'met' if ratio <= 1.05 else 'NOT met'}")
            step_dir = max((p for p in (Path(tmp) / "ckpt0").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
            size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
            state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(fresh[n].state))
            print(f"  checkpoint: {size / 1e6:.3f} MB on disk per step (state {state_bytes / 1e6:.3f} MB in memory)")


if __name__ == "__main__":
    main()
