"""The training loop of one trial: restore-or-init, train, evaluate, report, prune, checkpoint, stop."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import numpy as np

from sweep.checkpoints.folder import TrialCheckpoints, host_copy
from sweep.errors import Interrupted, NonFiniteMetric
from sweep.host import slots
from sweep.host.signals import StopSignal
from sweep.store.record import best_of_reports
from sweep.study.config import Config
from sweep.train import compile_events, compiled
from sweep.train.cadence import Cadence
from sweep.train.ledger import RunLedger
from sweep.train.state import data_seed, initial_state, run_hyperparameters, shapes_of
from sweep.train.stream import DATA_STATE_KEY, Batches, evaluate_batches, open_iterator, validation_streamed

log = logging.getLogger("sweep")


class Reporter(Protocol):
    """The part of `optuna.Trial` the loop uses."""

    def report(self, value: float, step: int) -> None: ...

    def should_prune(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    state: str  # "COMPLETE", "PRUNED" or "PAUSED" (it reached its rung: `pause_at`)
    best_step: int
    best_value: float
    last_step: int


@dataclasses.dataclass
class _Best:
    sign: int  # +1 minimise, -1 maximise
    step: int | None = None
    value: float = math.inf
    pending: tuple[int, Any, dict[str, float]] | None = None  # (step, host copy, metrics) not yet on disk

    def offer(self, step: int, value: float) -> bool:
        if self.step is None or self.sign * value < self.sign * self.value:
            self.step, self.value = step, value
            return True
        return False


def _window_end(step: int, total: int, eval_every: int, every_steps: int | None, cap: int) -> int:
    """The end of the next window: the next evaluation, periodic save or last step, `cap` steps at most."""
    ends = [total, (step // eval_every + 1) * eval_every, step + cap]
    if every_steps:
        ends.append((step // every_steps + 1) * every_steps)
    return min(ends)


@dataclasses.dataclass(frozen=True)
class TrialEvents:
    """What `run_trial` tells its caller as the trial runs; each one optional.

    on_restore: called with the step a checkpoint was restored from, before training.
    on_step: called with (number, step) at the start, after every training window, and with
        (number, -1) when the trial stops running here (the progress view's source of the
        current step and of the speed: windows timed from the end of the first one).
    on_evaluation: called with (step, metrics) for every new evaluation: every metric the trial
        declares, plus "train_loss" (the mean training loss since the last evaluation).
    on_data_shapes: called at the start with the shapes and dtypes of the trial's data
        (`state.shapes_of`; not called for data that is not a dict of arrays): loaders build their
        restore template from them without loading the data.
    on_devices: called at the start with the devices the trial trains on ("cpu:2", "gpu:5":
        host-wide indices, sweep/host/slots.py).
    on_compiles: called once the trial stops running here (also on a signal or an error) with
        what this run of it compiled: {"compilations", "cache_hits", "compile_seconds"}
        (process-wide counters: exact while the process runs one trial at a time).
    """

    on_restore: Callable[[int], None] | None = None
    on_step: Callable[[int, int], None] | None = None
    on_evaluation: Callable[[int, dict[str, float]], None] | None = None
    on_compiles: Callable[[dict[str, float]], None] | None = None
    on_data_shapes: Callable[[dict[str, Any]], None] | None = None
    on_devices: Callable[[list[str]], None] | None = None


def run_trial(
    config: Config,
    number: int,
    hp: Mapping[str, Any],
    reporter: Reporter,
    reported: Mapping[int, float],
    ckpt: TrialCheckpoints,
    stop: StopSignal,
    events: TrialEvents | None = None,
    ledger: RunLedger | None = None,
    seed_number: int | None = None,
    pause_at: int | None = None,
) -> Outcome:
    """Train trial `number` from its newest checkpoint (or from scratch) to the end or a prune,
    or to its rung `pause_at` (an evaluation step before the last, sweep/schedulers/asha.py): evaluated,
    checkpointed at exactly that step, and returned as PAUSED.

    The last save may still be in flight on return: the caller records the outcome meanwhile and
    calls `ckpt.wait()` before telling Optuna the trial is finished.

    Args:
        reported: intermediate values already stored (from before an interruption); only new
            steps are reported again.
        events: what the caller hears as the trial runs (`TrialEvents`; none by default).

    Raises:
        Interrupted: a signal arrived; the current step was checkpointed first.
    """
    study, module = config.study, config.trial_module
    metric = study.objective.metric  # the first objective: it picks the best step
    told = [o.metric for o in study.all_objectives]  # the metrics the trial is told with: finite
    total, eval_every = study.train.steps, study.train.eval_every
    compiles_before = compile_events.COMPILES.copy()
    batches: Batches | None = None  # a streaming trial's training batches (sweep/train/stream.py)
    ledger = ledger or RunLedger(None)
    seed_number = number if seed_number is None else seed_number
    stop.trial_starting(number)  # until its first new step, a signal has nothing new to save
    events = events or TrialEvents()
    on_restore, on_step, on_evaluation = events.on_restore, events.on_step, events.on_evaluation
    on_compiles, on_data_shapes, on_devices = events.on_compiles, events.on_data_shapes, events.on_devices
    try:
        fresh = initial_state(config, seed_number, hp)
        state, data = fresh.state, fresh.data
        shapes = shapes_of(data)
        if on_data_shapes is not None and shapes is not None:
            on_data_shapes(shapes)
        devices = study.train.devices
        # Fresh and restored states reach the compiled window placed alike (committed to the same
        # device(s)): Orbax returns committed arrays, init uncommitted ones, and the lowering
        # differs, so a resume would miss the persistent cache and compile anew.
        place = compiled.placement(devices)
        state, data = jax.device_put((state, data), place)
        if on_devices is not None:  # where it trains, read from the placed state itself
            on_devices(slots.names(jax.tree.leaves(state)[0].sharding.device_set))
        sign = study.objective.sign
        with ledger.timed("restoring"):
            start, restored = ckpt.restore_intact(state, lambda s: _best_of(reported, s, sign).step)
        ledger.started_at(start or 0, max([*reported, start or 0]))
        stop.trial_starting(number, start or 0)
        state = jax.device_put({**state, **restored}, place)  # a step saved before an optional key existed lacks it
        if start is not None:
            log.info("trial %d: resumed from step %d", number, start)
            if on_restore is not None:
                on_restore(start)
        step = int(state["step"])
        if on_step is not None:
            on_step(number, step)  # training starts here (the first window compiles)
        best = _best_of(reported, step, sign)
        run_hp = run_hyperparameters(config, hp)
        if DATA_STATE_KEY in state:  # the pipeline continues where the restored step left it
            saved = np.asarray(state.pop(DATA_STATE_KEY)) if start is not None else None
            batches = Batches(open_iterator(module, run_hp, data_seed(config, seed_number), saved), step, total,
                              place)
        val = module.val_batches(run_hp) if validation_streamed(module) else None
        fns = compiled.Functions(module, run_hp, compiled.traced_names(config.sampled_names, hp), devices,
                                 kind=fresh.kind)
        if devices > 1:
            leaf = jax.tree.leaves(state["params"])[0]
            log.info("trial %d: data parallel: each batch split over %d devices, params replicated on %d",
                     number, devices, len(leaf.sharding.device_set))
        params, opt_state, key = state["params"], state["opt_state"], state["key"]
        model_state, loss_sum = state.get("model_state", {}), state["train_loss_sum"]
        cadence = Cadence.of(study.checkpoint, step)
        evaluated: dict[str, float] | None = None  # metrics of the current step, if it was evaluated
        announce_first_step = bool(reported)  # a trial that made progress before: recovery is visible

        def snapshot() -> Any:  # reads the loop's current state when called
            current = {"params": params, "opt_state": opt_state, "step": np.asarray(step, np.int32), "key": key,
                       "train_loss_sum": loss_sum}
            if model_state:
                current["model_state"] = model_state
            current = host_copy(current)
            if batches is not None:
                current[DATA_STATE_KEY] = batches.state_at(step)
            return current

        def window_of(begin: int) -> tuple[Any, int]:
            """(data argument, end) of the window that starts at step `begin`."""
            end = _window_end(begin, total, eval_every, study.checkpoint.every_steps, fns.cap)
            return (data, end) if batches is None else batches.window(begin, end)

        def evaluate() -> Mapping[str, Any]:
            if val is None:
                return fns.evaluate(params, model_state, data)
            return evaluate_batches(lambda b: fns.evaluate(params, model_state, b), val, module.METRICS)

        while True:
            if step > 0 and (step % eval_every == 0 or step == total):
                # A resumed trial evaluates its restored step again (cheap, bit-identical) so that the
                # pruning decision at that step is made exactly as in an uninterrupted run.
                with ledger.timed("evaluating"):
                    evaluated = _metrics(evaluate(), module.METRICS, told, number, step)
                value = evaluated[metric]
                log.debug("trial %d: step %d: %s=%r (%s)", number, step, metric, value,
                          ", ".join(f"{k}={v:.6g}" for k, v in evaluated.items() if k != metric))
                if step not in reported:
                    reporter.report(value, step)
                if step != start:  # the restored step's metrics were recorded before the interruption
                    interval = step - (step - 1) // eval_every * eval_every
                    evaluated["train_loss"] = float(loss_sum) / interval
                    if on_evaluation is not None:
                        on_evaluation(step, evaluated)
                loss_sum = jax.device_put(np.zeros((), np.float32), place)
                if best.offer(step, value) and step != start:
                    best.pending = (step, snapshot(), evaluated)
                if step == pause_at:  # also a run restored at its rung: a kill came before the pause was recorded
                    with ledger.timed("checkpoint_blocking"):
                        _flush(ckpt, best, (step, snapshot, evaluated))
                    return Outcome("PAUSED", _best_step(best), best.value, step)
                if step < total and reporter.should_prune():
                    with ledger.timed("checkpoint_blocking"):
                        _flush(ckpt, best, None)
                    return Outcome("PRUNED", _best_step(best), best.value, step)
            if stop.signum is not None and step == (start or 0) and step < total:
                # No step trained in this run: nothing new to save, the newest checkpoint stays it.
                log.warning("trial %d: stopped before its first new step: nothing new to save, it resumes from "
                            "step %d on the next run", number, step)
                stop.check()
            must = step == total or stop.signum is not None
            if must or (cadence.due(step) and not cadence.defer(ckpt)):
                with ledger.timed("checkpoint_blocking"):
                    wrote = _flush(ckpt, best, (step, snapshot, evaluated))
                cadence.saved(step, wrote)
                ledger.saves = cadence.counts()
                cadence.check_cost(number, ledger)
                if step == total:
                    break
                if stop.signum is not None:
                    with ledger.timed("checkpoint_blocking"):
                        ckpt.wait()
                    log.warning("trial %d: stopped at step %d; checkpoint saved, it resumes on the next run",
                                number, step)
                    stop.check()
            # Windows without bubbles: while a window's end needs no decision (no evaluation, save,
            # signal or last step), the next window is dispatched on its outputs before waiting for
            # it, so the device never idles between them. Values are read only where needed.
            fns.restart_timing()
            windows_start = time.monotonic()
            window_data, end = window_of(step)
            out = fns.dispatch(params, opt_state, model_state, loss_sum, key, window_data, step, end - step)
            while not _decision_at(end, total, eval_every, cadence, stop):
                window_data, after = window_of(end)
                ahead = fns.dispatch(*out[:4], key, window_data, end, after - end)  # donates out's state
                step = _finish_window(fns, out, number, step, end, on_step, stop)
                out, end = ahead, after
            step = _finish_window(fns, out, number, step, end, on_step, stop)
            ledger.add("training", time.monotonic() - windows_start)
            ledger.at_step(step)
            params, opt_state, model_state, loss_sum, _ = out
            evaluated = None
            if announce_first_step:
                announce_first_step = False
                log.info("trial %d: training again, step %d done (restart -> first new step)", number, step)
        return Outcome("COMPLETE", _best_step(best), best.value, step)
    except Interrupted:
        ckpt.wait()
        raise
    finally:
        stop.trial_ended(number)
        if batches is not None:
            batches.close()
        if on_step is not None:
            on_step(number, -1)
        done = compile_events.COMPILES - compiles_before
        # Compiles happen inside the first window and evaluation: counted as compiling, not there.
        for part, fun in (("training", "window"), ("evaluating", "evaluate")):
            ledger.add(part, -min(done[f"seconds:{fun}"], ledger.parts[part]))
        ledger.add("compiling", done["compile_seconds"])
        ledger.background = ckpt.written_seconds
        ledger.finish()
        if on_compiles is not None:
            on_compiles({"compilations": compile_events.compilations(done), "cache_hits": done["cache_hits"],
                         "compile_seconds": round(done["compile_seconds"], 3)})
        log.debug("trial %d: XLA compilations %d (window %d, evaluate %d; %.1f s), executables from the "
                  "persistent cache %d", number, compile_events.compilations(done), compile_events.compilations(done, "window"),
                  compile_events.compilations(done, "evaluate"), done["compile_seconds"], done["cache_hits"])


def _decision_at(step: int, total: int, eval_every: int, cadence: Cadence, stop: StopSignal) -> bool:
    """Something at `step` needs the training state: the last step, an evaluation, a save, a signal."""
    return step == total or step % eval_every == 0 or stop.signum is not None or cadence.due(step)


def _finish_window(fns: compiled.Functions, out: Any, number: int, start: int, end: int,
                   on_step: Callable[[int, int], None] | None, stop: StopSignal) -> int:
    """Wait for the window [start, end); fail the trial if its training loss is not finite."""
    fns.finish(out, end - start)
    stop.trial_trained(number)
    loss_sum = float(out[3])
    if not math.isfinite(loss_sum):
        raise NonFiniteMetric(f"trial {number}: the training loss is {loss_sum} in steps {start + 1}-{end} "
                              "(non-finite); the trial failed")
    if on_step is not None:
        on_step(number, end)
    return end


def _best_of(reported: Mapping[int, float], step: int, sign: int) -> _Best:
    """The best of the evaluations reported up to `step`."""
    best = _Best(sign=sign)
    found = best_of_reports({s: v for s, v in reported.items() if s <= step}, sign)
    if found is not None:
        best.step, best.value = found
    return best


def _best_step(best: _Best) -> int:
    assert best.step is not None, "the last step is always evaluated"
    return best.step


def _metrics(metrics: Mapping[str, Any], declared: Any, told: Sequence[str], number: int,
             step: int) -> dict[str, float]:
    """Every declared metric (METRICS) as a float; the objectives' must be finite. Other values
    `evaluate` returns (a confusion matrix, say) are the trial's own business."""
    missing = [name for name in declared if name not in metrics]
    if missing:
        raise KeyError(f"trial {number}: evaluate returned no {', '.join(map(repr, missing))} of its METRICS "
                       f"(it returned {sorted(metrics)})")
    for name in declared:  # a shape that changed with the hyperparameters: say which metric, and its shape
        shape = tuple(getattr(metrics[name], "shape", ()))
        if math.prod(shape) != 1:
            raise ValueError(f"trial {number}: evaluate must return a scalar for metric {name!r}, got shape {shape} "
                             f"at step {step}")
    values = {name: float(metrics[name]) for name in declared}
    for metric in told:
        if not math.isfinite(values[metric]):
            raise NonFiniteMetric(f"trial {number}: {metric} is {values[metric]} at step {step} (non-finite); "
                                  "the trial failed")
    return values


def _flush(ckpt: TrialCheckpoints, best: _Best, current: tuple[int, Callable[[], Any], dict | None] | None) -> bool:
    """Write the best state if it is not on disk yet, then the current step (if given); False if
    there was nothing to write (the step is on disk already: a resumed run's restored step).

    The best state waits in memory for the next save: a resumed run recomputes it bit-identically,
    so writing it at once would buy nothing but I/O.
    """
    items: list[tuple[int, Any, dict[str, float] | None]] = []
    if best.pending is not None:
        items.append(best.pending)
        best.pending = None
    if current is not None and current[0] not in (i[0] for i in items) and (
            ckpt.last_saved is None or current[0] > ckpt.last_saved):
        step, snapshot, metrics = current
        items.append((step, snapshot(), metrics))
    ckpt.save(*items)
    return bool(items)
