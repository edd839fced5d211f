"""Target 5: training steps/s of the digits trial, compiled windows vs one Python dispatch per step.

Side "windows": the runner's compiled `fori_loop` over 100-step windows (the example's
eval_every), as `run` trains. Side "per_step": the same step body jitted alone and called once per
step (asynchronous dispatch, one sync at the end): the loop before issue 7. Both compiled before
timing; both produce the same parameters (checked). Target: windows/per_step >= 3 in steps/s.

    python benchmarks/throughput.py [--steps 2000] [--rounds 6] [--hidden 112]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import harness
import jax
import numpy as np
import optax

from sweep.train.compiled import FUNCTIONS, traced_names
from sweep.train.state import initial_state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=112)
    args = ap.parse_args()
    harness.quiet()
    with tempfile.TemporaryDirectory() as tmp:
        config = harness.example(Path(tmp))
    module = config.trial_module
    hp = config.hyperparameters({"learning_rate": 0.005, "hidden": args.hidden, "optimizer": "adam"})
    traced = traced_names(config.study.search_space, hp)
    fns = FUNCTIONS.get(module, hp, traced)
    traced_hp = {k: hp[k] for k in traced}
    state, data, _ = initial_state(config, 0, hp)
    tx = module.optimizer(hp)

    @jax.jit
    def step_fn(params, opt_state, key, step):
        batch_key, loss_key = jax.random.split(jax.random.fold_in(key, step))
        batch = module.batch(hp, data, batch_key)
        loss, grads = jax.value_and_grad(lambda p: module.loss(hp, p, batch, loss_key))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def fresh():
        return jax.tree.map(np.array, state["params"]), jax.tree.map(np.array, state["opt_state"])

    out = {}

    def windows(r: int) -> float:
        params, opt_state = fresh()

        def go():
            nonlocal params, opt_state
            loss_sum = np.zeros((), np.float32)
            for start in range(0, args.steps, args.window):
                params, opt_state, _, loss_sum, _ = fns.window(params, opt_state, {}, loss_sum, state["key"], data,
                                                                  np.int32(start), np.int32(args.window), traced_hp)
            loss_sum.block_until_ready()
        t = harness.timed(go)
        out["windows"] = params
        return t / args.steps

    def per_step(r: int) -> float:
        params, opt_state = fresh()

        def go():
            nonlocal params, opt_state
            for s in range(args.steps):
                params, opt_state, loss = step_fn(params, opt_state, state["key"], np.int32(s))
            loss.block_until_ready()
        t = harness.timed(go)
        out["per_step"] = params
        return t / args.steps

    harness.alternate({"windows": windows, "per_step": per_step}, 2)  # compile both
    times = harness.alternate({"windows": windows, "per_step": per_step}, args.rounds)
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(out["windows"]), jax.tree.leaves(out["per_step"])))
    print(f"digits MLP hidden={args.hidden}, {args.steps} steps, windows of {args.window}; "
          f"same parameters: {'yes' if same else 'NO'}")
    ratio = harness.report("seconds per step", "per_step", "windows", times, ">= 3 (steps/s windows over per_step)")
    print(f"steps/s: windows {1 / min(times['windows']):.0f} (best), per_step {1 / min(times['per_step']):.0f} "
          f"(best); speed-up {ratio:.2f}x")


if __name__ == "__main__":
    main()
