"""The training loop of one trial: restore-or-init, train, evaluate, report, prune, checkpoint, stop."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Mapping, Protocol

import jax
import numpy as np

from sweep.checkpoints.folder import TrialCheckpoints, host_copy
from sweep.errors import Interrupted, NonFiniteMetric
from sweep.host import slots
from sweep.host.signals import StopSignal
from sweep.study.config import Config
from sweep.train import compile_events, compiled
from sweep.train.cadence import Cadence, best_of, flush
from sweep.train.ledger import RunLedger
from sweep.train.ram_saves import RamSaves
from sweep.train.state import checked_metrics, data_seed, initial_state, run_hyperparameters, shapes_of
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


@dataclasses.dataclass(frozen=True)
class TrialEvents:
    """What `run_trial` tells its caller as the trial runs; each one optional.

    on_restore: called with the step a checkpoint was restored from, before training; True where
        the run goes on from a pause at the scheduler's decision (a promotion), not after an
        interruption.
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

    on_restore: Callable[[int], bool | None] | None = None
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
    run = _TrialRun(config, number, hp, reporter, reported, ckpt, stop, events or TrialEvents(),
                    ledger or RunLedger(None), number if seed_number is None else seed_number, pause_at)
    stop.trial_starting(number)  # until its first new step, a signal has nothing new to save
    try:
        run.restore()
        run.compile()
        while True:
            if run.evaluation_due():
                run.evaluate()
                stopped = run.pause_or_prune()
                if stopped is not None:
                    return stopped
            run.stop_before_first_new_step()
            if run.save_due():
                run.save()
                if run.step == run.total:
                    return run.outcome("COMPLETE")
                run.stop_after_save()
            elif run.ram.save_due(run.step):
                run.save_ram()
            run.train_windows()
    except Interrupted:
        ckpt.wait()
        raise
    finally:
        run.close()


@dataclasses.dataclass
class _TrialRun:
    """One run of a trial in this process: what it was given, and the training state it holds
    between the loop's steps (`run_trial` calls them in their order)."""

    config: Config
    number: int
    hp: Mapping[str, Any]
    reporter: Reporter
    reported: Mapping[int, float]
    ckpt: TrialCheckpoints
    stop: StopSignal
    events: TrialEvents
    ledger: RunLedger
    seed_number: int
    pause_at: int | None
    compiles_before: Any = dataclasses.field(default_factory=lambda: compile_events.COMPILES.copy())
    batches: Batches | None = None  # a streaming trial's training batches (sweep/train/stream.py)
    evaluated: dict[str, float] | None = None  # metrics of the current step, if it was evaluated

    def __post_init__(self) -> None:
        study = self.config.study
        self.module = self.config.trial_module
        self.metric = study.objective.metric  # the first objective: it picks the best step
        self.told = [o.metric for o in study.all_objectives]  # the metrics the trial is told with: finite
        self.total, self.eval_every = study.train.steps, study.train.eval_every
        self.announce_first_step = bool(self.reported)  # a trial that made progress before: recovery is visible

    def restore(self) -> None:
        """The trial's initial state placed on its devices, then its newest intact checkpoint over it."""
        config, study, events = self.config, self.config.study, self.events
        fresh = initial_state(config, self.seed_number, self.hp)
        state, data = fresh.state, fresh.data
        self.kind = fresh.kind
        shapes = shapes_of(data)
        if events.on_data_shapes is not None and shapes is not None:
            events.on_data_shapes(shapes)
        # Fresh and restored states reach the compiled window placed alike (committed to the same
        # device(s)): Orbax returns committed arrays, init uncommitted ones, and the lowering
        # differs, so a resume would miss the persistent cache and compile anew.
        self.place = compiled.placement(study.train.devices)
        state, self.data = jax.device_put((state, data), self.place)
        if events.on_devices is not None:  # where it trains, read from the placed state itself
            events.on_devices(slots.names(jax.tree.leaves(state)[0].sharding.device_set))
        sign = study.objective.sign
        with self.ledger.timed("restoring"):
            start, restored = self.ckpt.restore_intact(state, lambda s: best_of(self.reported, s, sign).step)
        self.start = start
        self.ledger.started_at(start or 0, max([*self.reported, start or 0]))
        self.stop.trial_starting(self.number, start or 0)
        # A step saved before an optional key existed lacks it: the fresh state's stays.
        self.state = jax.device_put({**state, **restored}, self.place)
        if start is not None:
            promoted = events.on_restore is not None and bool(events.on_restore(start))
            # A promotion is no recovery: it says so, and the first new step is not announced as one.
            log.info("trial %d: goes on from its pause at step %d" if promoted else "trial %d: resumed from step %d",
                     self.number, start)
            self.announce_first_step = self.announce_first_step and not promoted
        self.step = int(self.state["step"])
        if events.on_step is not None:
            events.on_step(self.number, self.step)  # training starts here (the first window compiles)
        self.best = best_of(self.reported, self.step, sign)

    def compile(self) -> None:
        """Open the trial's data streams and build its compiled window and evaluation (they
        compile in the first window and evaluation); take the training state into the run."""
        config, module, state = self.config, self.module, self.state
        run_hp = run_hyperparameters(config, self.hp)
        if DATA_STATE_KEY in state:  # the pipeline continues where the restored step left it
            saved = np.asarray(state.pop(DATA_STATE_KEY)) if self.start is not None else None
            self.batches = Batches(open_iterator(module, run_hp, data_seed(config, self.seed_number), saved),
                                   self.step, self.total, self.place)
        self.val = module.val_batches(run_hp) if validation_streamed(module) else None
        devices = config.study.train.devices
        self.fns = compiled.Functions(module, run_hp, compiled.traced_names(config.sampled_names, self.hp), devices,
                                      kind=self.kind)
        if devices > 1:
            leaf = jax.tree.leaves(state["params"])[0]
            log.info("trial %d: data parallel: each batch split over %d devices, params replicated on %d",
                     self.number, devices, len(leaf.sharding.device_set))
        self.params, self.opt_state, self.key = state["params"], state["opt_state"], state["key"]
        self.model_state, self.loss_sum = state.get("model_state", {}), state["train_loss_sum"]
        self.cadence = Cadence.of(config.study.checkpoint, self.step, self.ledger, self.stop, self.number)
        self.ram = RamSaves(self.ckpt, config.study.checkpoint, self.start, self.step)

    def evaluation_due(self) -> bool:
        return self.step > 0 and (self.step % self.eval_every == 0 or self.step == self.total)

    def evaluate(self) -> None:
        """Evaluate the current step, report it, tell the caller, and keep it if it is the best.

        A resumed trial evaluates its restored step again (cheap, bit-identical) so that the
        pruning decision at that step is made exactly as in an uninterrupted run."""
        step, number, metric = self.step, self.number, self.metric
        with self.ledger.timed("evaluating"):
            self.evaluated = evaluated = checked_metrics(self._evaluations(), self.module.METRICS, self.told, number, step)
        value = evaluated[metric]
        log.debug("trial %d: step %d: %s=%r (%s)", number, step, metric, value,
                  ", ".join(f"{k}={v:.6g}" for k, v in evaluated.items() if k != metric))
        if step not in self.reported:
            self.reporter.report(value, step)
        if step != self.start:  # the restored step's metrics were recorded before the interruption
            interval = step - (step - 1) // self.eval_every * self.eval_every
            evaluated["train_loss"] = float(self.loss_sum) / interval
            if self.events.on_evaluation is not None:
                self.events.on_evaluation(step, evaluated)
        self.loss_sum = jax.device_put(np.zeros((), np.float32), self.place)
        if self.best.offer(step, value) and step != self.start:
            self.best.pending = (step, self._snapshot(), evaluated)

    def pause_or_prune(self) -> Outcome | None:
        """PAUSED at the trial's rung, PRUNED where the pruner says so (both saved first), else None."""
        if self.step == self.pause_at:  # also a run restored at its rung: a kill came before the pause was recorded
            with self.ledger.timed("checkpoint_blocking"):
                flush(self.ckpt, self.best, (self.step, self._snapshot, self.evaluated))
            return self.outcome("PAUSED")
        if self.step < self.total and self.reporter.should_prune():
            with self.ledger.timed("checkpoint_blocking"):
                flush(self.ckpt, self.best, None)
            return self.outcome("PRUNED")
        return None

    def stop_before_first_new_step(self) -> None:
        """On a signal before this run trained a step: nothing new to save, the newest checkpoint stays it."""
        if self.stop.signum is not None and self.step == (self.start or 0) and self.step < self.total:
            log.warning("trial %d: stopped before its first new step: nothing new to save, it resumes from "
                        "step %d on the next run", self.number, self.step)
            self.stop.check()

    def save_due(self) -> bool:
        """The last step and a signal's save are never deferred; a periodic one may be (`Cadence`)."""
        must = self.step == self.total or self.stop.signum is not None
        return must or (self.cadence.due(self.step) and not self.cadence.defer(self.ckpt))

    def save(self) -> None:
        """Save the best state held back and the current step (in the background), and count it.
        A signal's save goes to the RAM tier where a disk save is predicted to outlast the grace left."""
        if self.stop.signum is not None and self.step < self.total and self.ram.disk_too_slow(self.cadence, self.stop):
            self.save_ram()
            return
        with self.ledger.timed("checkpoint_blocking"):
            wrote = flush(self.ckpt, self.best, (self.step, self._snapshot, self.evaluated))
        self.cadence.saved(self.step, wrote)
        self.cadence.after_save(self.number, self.ledger, self.ckpt, self.stop)

    def save_ram(self) -> None:
        self.ram.save(self.step, self._snapshot(), self.evaluated, self.best, self.cadence, self.ledger)

    def stop_after_save(self) -> None:
        """On a signal: wait for the save of this step, then stop (it resumes from it)."""
        if self.stop.signum is not None:
            with self.ledger.timed("checkpoint_blocking"):
                if not self.ram.stopped_here(self.number, self.step, self.cadence, self.stop):
                    self.ckpt.wait()
                    log.warning("trial %d: stopped at step %d; checkpoint saved, it resumes on the next run",
                                self.number, self.step)
            self.stop.check()

    def train_windows(self) -> None:
        """Train up to the next step that needs a decision (an evaluation, a save, a signal, the last step).

        Windows without bubbles: while a window's end needs no decision, the next window is
        dispatched on its outputs before waiting for it, so the device never idles between them.
        Values are read only where needed."""
        fns, key = self.fns, self.key
        fns.restart_timing()
        windows_start = time.monotonic()
        window_data, end = self._window_of(self.step)
        out = fns.dispatch(self.params, self.opt_state, self.model_state, self.loss_sum, key, window_data, self.step,
                           end - self.step)
        while not self._decision_at(end):
            window_data, after = self._window_of(end)
            ahead = fns.dispatch(*out[:4], key, window_data, end, after - end)  # donates out's state
            self._finish_window(out, end)
            out, end = ahead, after
        self._finish_window(out, end)
        self.ledger.add("training", time.monotonic() - windows_start)
        self.ledger.at_step(self.step)
        self.params, self.opt_state, self.model_state, self.loss_sum, _ = out
        self.evaluated = None
        if self.announce_first_step:
            self.announce_first_step = False
            log.info("trial %d: training again, step %d done (restart -> first new step)", self.number, self.step)

    def outcome(self, state: str) -> Outcome:
        assert self.best.step is not None, "the last step is always evaluated"
        return Outcome(state, self.best.step, self.best.value, self.step)

    def close(self) -> None:
        """The trial stops running here (done, stopped or failed): close its streams, account its compiles."""
        self.stop.trial_ended(self.number)
        if self.batches is not None:
            self.batches.close()
        if self.events.on_step is not None:
            self.events.on_step(self.number, -1)
        self._account_compiles(compile_events.COMPILES - self.compiles_before)

    def _account_compiles(self, done: Any) -> None:
        ledger, on_compiles = self.ledger, self.events.on_compiles
        # Compiles happen inside the first window and evaluation: counted as compiling, not there.
        for part, fun in (("training", "window"), ("evaluating", "evaluate")):
            ledger.add(part, -min(compile_events.spent(done, fun), ledger.parts[part]))
        ledger.add("compiling", compile_events.spent(done))  # a wait for another worker's compile too
        ledger.background = self.ckpt.written_seconds
        ledger.finish()
        if on_compiles is not None:
            on_compiles({"compilations": compile_events.compilations(done), "cache_hits": done["cache_hits"],
                         "compile_seconds": round(done["compile_seconds"], 3)})
        log.debug("trial %d: XLA compilations %d (window %d, evaluate %d; %.1f s), executables from the "
                  "persistent cache %d", self.number, compile_events.compilations(done),
                  compile_events.compilations(done, "window"), compile_events.compilations(done, "evaluate"),
                  done["compile_seconds"], done["cache_hits"])

    def _snapshot(self) -> Any:
        """A host copy of the current training state (read when a save asks for it)."""
        current = {"params": self.params, "opt_state": self.opt_state, "step": np.asarray(self.step, np.int32),
                   "key": self.key, "train_loss_sum": self.loss_sum}
        if self.model_state:
            current["model_state"] = self.model_state
        current = host_copy(current)
        if self.batches is not None:
            current[DATA_STATE_KEY] = self.batches.state_at(self.step)
        return current

    def _evaluations(self) -> Mapping[str, Any]:
        if self.val is None:
            return self.fns.evaluate(self.params, self.model_state, self.data)
        return evaluate_batches(lambda b: self.fns.evaluate(self.params, self.model_state, b), self.val,
                                self.module.METRICS)

    def _window_of(self, begin: int) -> tuple[Any, int]:
        """(data argument, end) of the window that starts at step `begin`: it ends at the next
        evaluation, periodic save or last step, `fns.cap` steps at most."""
        ends = [self.total, (begin // self.eval_every + 1) * self.eval_every, begin + self.fns.cap]
        for every_steps in (self.config.study.checkpoint.every_steps, self.ram.every_steps):
            if every_steps:
                ends.append((begin // every_steps + 1) * every_steps)
        end = min(ends)
        return (self.data, end) if self.batches is None else self.batches.window(begin, end)

    def _decision_at(self, step: int) -> bool:
        """Something at `step` needs the training state: the last step, an evaluation, a save, a signal."""
        return (step == self.total or step % self.eval_every == 0 or self.stop.signum is not None
                or self.cadence.due(step) or self.ram.due(step))

    def _finish_window(self, out: Any, end: int) -> None:
        """Wait for the window [step, end); fail the trial if its training loss is not finite, naming
        the first step whose loss was (the window's `step` i trains step i + 1)."""
        self.fns.finish(out, end - self.step)
        self.stop.trial_trained(self.number)
        loss_sum = float(out[3])
        if not math.isfinite(loss_sum):
            bad = int(out[4][0])  # -1: every step's loss was finite and their sum overflowed
            value, where = ((float(out[4][1]), f"at step {bad + 1}") if bad >= 0 else
                            (loss_sum, f"in steps {self.step + 1}-{end}"))
            raise NonFiniteMetric(f"trial {self.number}: the training loss is {value} {where} (non-finite); "
                                  "the trial failed")
        if self.events.on_step is not None:
            self.events.on_step(self.number, end)
        self.step = end
