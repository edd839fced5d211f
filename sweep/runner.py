"""One trial: restore-or-init, train, evaluate, report, prune, checkpoint, react to signals."""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sweep.checkpoints import TrialCheckpoints, host_copy
from sweep.config import Config
from sweep.errors import Interrupted, NonFiniteMetric

log = logging.getLogger("sweep")
# trial number -> its current step, for the progress view of this process (reports come only
# every eval_every steps; a dict write per step costs nothing next to a step).
CURRENT_STEPS: dict[int, int] = {}


class Reporter(Protocol):
    """The part of `optuna.Trial` the loop uses."""

    def report(self, value: float, step: int) -> None: ...

    def should_prune(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    state: str  # "COMPLETE" or "PRUNED"
    best_step: int
    best_value: float
    last_step: int


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks after every step; a second SIGINT exits at once."""

    def __init__(self, grace_seconds: float = 20.0) -> None:
        self.signum: int | None = None
        self.grace_seconds = grace_seconds

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            # Second Ctrl-C: the user wants out now. Everything already committed stays valid.
            os._exit(130)
        self.signum = signum
        log.warning("signal %d received: checkpointing running trials, then exiting (at most %g s)", signum,
                    self.grace_seconds)
        # A step or a save that hangs (a stuck filesystem) must not keep a preempted machine alive:
        # past the grace period the process exits anyway; committed checkpoints stay valid.
        timer = threading.Timer(self.grace_seconds, self._expire, args=(signum,))
        timer.daemon = True
        timer.start()

    def _expire(self, signum: int) -> None:
        log.error("grace period of %g s is over: exiting without a final checkpoint", self.grace_seconds)
        os._exit(128 + signum)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


@dataclasses.dataclass
class _Best:
    sign: float  # +1 minimise, -1 maximise
    step: int | None = None
    value: float = math.inf
    pending: tuple[int, Any, dict[str, float]] | None = None  # (step, host copy, metrics) not yet on disk

    def offer(self, step: int, value: float) -> bool:
        if self.step is None or self.sign * value < self.sign * self.value:
            self.step, self.value = step, value
            return True
        return False


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A trial's jitted training window and evaluation, shared by all trials of equal static hyperparameters.

    Float hyperparameters sampled from the search space are traced arguments, not constants, so a
    new learning rate does not compile anew (and JAX's persistent cache serves the next process).
    """

    window: Callable  # (params, opt_state, key, data, start, n, traced_hp) -> (params, opt_state, loss)
    evaluate: Callable  # (params, data, traced_hp) -> metrics


_COMPILED: "collections.OrderedDict[tuple[Any, ...], Compiled]" = collections.OrderedDict()
_COMPILED_MAX = 8  # bounded: a study of many shapes must not keep every executable alive


@functools.cache
def mesh(devices: int) -> Any:
    """A 1-D mesh ("data") over the first `devices` devices JAX sees."""
    return jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))


def replicated(devices: int) -> Any:
    return jax.sharding.NamedSharding(mesh(devices), jax.sharding.PartitionSpec())


def _split_batch(batch: Any, devices: int) -> Any:
    """Shard every array of a batch along its leading axis over the mesh (data parallelism).

    XLA then computes each device's part of the loss and gradient and all-reduces the gradient;
    params and optimizer state stay replicated (the window's outputs are pinned to that).
    """
    sharding = jax.sharding.NamedSharding(mesh(devices), jax.sharding.PartitionSpec("data"))

    def split(x: Any) -> Any:
        if jnp.ndim(x) == 0 or jnp.shape(x)[0] % devices:
            raise ValueError(f"train.devices: {devices} devices must divide the leading axis of every batch "
                             f"array, got shape {tuple(jnp.shape(x))}")
        return jax.lax.with_sharding_constraint(x, sharding)

    return jax.tree.map(split, batch)


def compiled(module: Any, hp: Mapping[str, Any], traced: tuple[str, ...], devices: int = 1) -> Compiled:
    """The compiled functions for `hp`, with the names in `traced` passed as arguments (cached).

    `devices` > 1: data parallel over `mesh(devices)` (batch split, params replicated).
    """
    static = {k: v for k, v in hp.items() if k not in traced}
    key = (module.__name__, id(module), repr(sorted(static.items())), traced, devices)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key]

    def window(params, opt_state, rng, data, start, n, traced_hp):
        # One compiled loop over steps [start, start + n): no Python dispatch per step. The body is
        # a function of (state, step) only, so any split of the steps into windows gives the same
        # bits (checked by the tests); windows therefore need no alignment beyond step numbers.
        full = {**static, **traced_hp}
        tx = module.optimizer(full)

        def body(step, carry):
            params, opt_state, _ = carry
            batch_key, loss_key = jax.random.split(jax.random.fold_in(rng, step))
            batch = module.batch(full, data, batch_key)
            if devices > 1:
                batch = _split_batch(batch, devices)
            loss, grads = jax.value_and_grad(lambda p: module.loss(full, p, batch, loss_key))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, jnp.asarray(loss, jnp.float32)

        return jax.lax.fori_loop(start, start + n, body, (params, opt_state, jnp.zeros((), jnp.float32)))

    def evaluate(params, data, traced_hp):
        return module.evaluate({**static, **traced_hp}, params, data)

    pinned = {"out_shardings": replicated(devices)} if devices > 1 else {}
    out = Compiled(jax.jit(window, donate_argnums=(0, 1), **pinned), jax.jit(evaluate))
    _COMPILED[key] = out
    if len(_COMPILED) > _COMPILED_MAX:
        _COMPILED.popitem(last=False)
    return out


def traced_names(config: Config, hp: Mapping[str, Any]) -> tuple[str, ...]:
    """Sampled float hyperparameters: the ones that differ between trials of equal shapes."""
    return tuple(sorted(k for k in config.study.search_space if isinstance(hp.get(k), float)))


WINDOW_SECONDS = 0.2  # a training window's target length: bounds the reaction to SIGTERM and every_seconds
# Trace errors of a trial that branches in Python on a float hyperparameter: it then gets that
# hyperparameter as a constant (a compile per value), which is slower but correct.
_TRACE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                 jax.errors.TracerArrayConversionError)
_UNTRACEABLE: set[tuple[str, str, tuple[str, ...]]] = set()


class _Functions:
    """The trial's window and evaluation, traced float hyperparameters where the trial allows it."""

    def __init__(self, module: Any, hp: Mapping[str, Any], traced: tuple[str, ...], devices: int = 1) -> None:
        self.module, self.hp, self.traced, self.devices = module, hp, traced, devices
        self.cap = 1  # steps in the next window at most; the first one includes the compilation
        self._timed = False

    def _call(self, kind: str, *args: Any) -> Any:
        traced = self.traced
        if (self.module.__name__, kind, traced) in _UNTRACEABLE:
            traced = ()
        fn = getattr(compiled(self.module, self.hp, traced, self.devices), kind)
        try:
            return fn(*args, {k: self.hp[k] for k in traced})
        except _TRACE_ERRORS as exc:
            if not traced:
                raise
            log.debug("%s: %s of a float hyperparameter needs its value; compiling it as a constant (%s)",
                      self.module.__name__, kind, type(exc).__name__)
            _UNTRACEABLE.add((self.module.__name__, kind, traced))
            return self._call(kind, *args)

    def evaluate(self, params: Any, data: Any) -> Any:
        return self._call("evaluate", params, data)

    def window(self, params: Any, opt_state: Any, key: Any, data: Any, start: int, n: int) -> Any:
        t0 = time.perf_counter()
        out = self._call("window", params, opt_state, key, data, np.int32(start), np.int32(n))
        out[2].block_until_ready()
        # Windows grow to WINDOW_SECONDS of steps, timed after the first (which compiled).
        if self._timed:
            per_step = (time.perf_counter() - t0) / n
            self.cap = max(1, min(self.cap * 8, int(WINDOW_SECONDS / max(per_step, 1e-9))))
        self._timed = True
        return out


def _window_end(step: int, total: int, eval_every: int, every_steps: int | None, cap: int) -> int:
    """The end of the next window: the next evaluation, periodic save or last step, `cap` steps at most."""
    ends = [total, (step // eval_every + 1) * eval_every, step + cap]
    if every_steps:
        ends.append((step // every_steps + 1) * every_steps)
    return min(ends)


# Executables this process needed ("requests"), and of those the ones the persistent cache served
# ("cache_hits"); XLA compiled the rest. From JAX's monitoring events; `--verbose` logs them per trial.
COMPILES: collections.Counter[str] = collections.Counter()


def compilations(counts: collections.Counter[str] | None = None) -> int:
    """XLA compilations in `counts` (default: this process so far)."""
    counts = COMPILES if counts is None else counts
    return counts["requests"] - counts["cache_hits"]


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == "/jax/core/compile/backend_compile_duration":  # also timed around a cache hit
        COMPILES["requests"] += 1


def _on_event(event: str, **kwargs: str | int) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        COMPILES["cache_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def use_compilation_cache(directory: Path) -> None:
    """JAX's persistent compilation cache in `directory`: a resumed trial, a new process or another
    worker finds the executables already compiled for these shapes (every compile is cached: ours
    take ~0.5 s, under JAX's default 1 s threshold)."""
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX otherwise puts XLA's GPU autotune-cache folder (under the cache dir) into the compile
    # options, so every key depends on the workdir's path: a copied or shared cache never hit.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")


def initial_state(config: Config, number: int, hp: Mapping[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """(fresh training state, data, optimizer) of trial `number`; also the template to restore into."""
    module = config.trial_module
    data = module.data(hp)
    tx = module.optimizer(hp)
    init_key, train_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(config.study.train.seed), number))
    params = module.init(hp, init_key, data)
    return {"params": params, "opt_state": tx.init(params), "step": np.zeros((), np.int32), "key": train_key}, data, tx


def open_checkpoints(config: Config, number: int, directory: Path) -> TrialCheckpoints:
    c, objective = config.study.checkpoint, config.study.objective
    return TrialCheckpoints(directory, objective.metric, objective.direction, c.keep_last, c.keep_best,
                            label=f"trial {number}")


def run_trial(
    config: Config,
    number: int,
    hp: Mapping[str, Any],
    reporter: Reporter,
    reported: Mapping[int, float],
    ckpt: TrialCheckpoints,
    stop: StopSignal,
    on_restore: Callable[[int], None] | None = None,
) -> Outcome:
    """Train trial `number` from its newest checkpoint (or from scratch) to the end or a prune.

    The last save may still be in flight on return: the caller records the outcome meanwhile and
    calls `ckpt.wait()` before telling Optuna the trial is finished.

    Args:
        reported: intermediate values already stored (from before an interruption); only new
            steps are reported again.
        on_restore: called with the step a checkpoint was restored from, before training.

    Raises:
        Interrupted: a signal arrived; the current step was checkpointed first.
    """
    study, module = config.study, config.trial_module
    metric, direction = study.objective.metric, study.objective.direction
    total, eval_every = study.train.steps, study.train.eval_every
    compiles_before = COMPILES.copy()
    try:
        state, data, _ = initial_state(config, number, hp)
        devices = study.train.devices
        if devices > 1:  # restored into these shardings too (the template's)
            state, data = jax.device_put((state, data), replicated(devices))
        sign = 1.0 if direction == "minimize" else -1.0
        start, state = ckpt.restore_intact(state, lambda s: _best_of(reported, s, sign).step)
        if start is not None:
            log.info("trial %d: resumed from step %d", number, start)
            if on_restore is not None:
                on_restore(start)
        step = int(state["step"])
        best = _best_of(reported, step, sign)
        fns = _Functions(module, hp, traced_names(config, hp), devices)
        if devices > 1:
            leaf = jax.tree.leaves(state["params"])[0]
            log.info("trial %d: data parallel: each batch split over %d devices, params replicated on %d",
                     number, devices, len(leaf.sharding.device_set))
        params, opt_state, key = state["params"], state["opt_state"], state["key"]
        cadence = _Cadence(study.checkpoint.every_steps, study.checkpoint.every_seconds)
        evaluated: dict[str, float] | None = None  # metrics of the current step, if it was evaluated
        announce_first_step = bool(reported)  # a trial that made progress before: recovery is visible

        def snapshot() -> Any:  # reads the loop's current params/opt_state/step when called
            return host_copy({"params": params, "opt_state": opt_state, "step": np.asarray(step, np.int32), "key": key})

        while True:
            if step > 0 and (step % eval_every == 0 or step == total):
                # A resumed trial evaluates its restored step again (cheap, bit-identical) so that the
                # pruning decision at that step is made exactly as in an uninterrupted run.
                value = _evaluate(fns.evaluate(params, data), metric, number, step)
                evaluated = {metric: value}
                log.debug("trial %d: step %d: %s=%r", number, step, metric, value)
                if step not in reported:
                    reporter.report(value, step)
                if best.offer(step, value) and step != start:
                    best.pending = (step, snapshot(), evaluated)
                if step < total and reporter.should_prune():
                    _flush(ckpt, best, None)
                    return Outcome("PRUNED", _best_step(best), best.value, step)
            must = step == total or stop.signum is not None
            if must or (cadence.due(step) and not cadence.defer(ckpt, study.checkpoint.max_write_share)):
                _flush(ckpt, best, (step, snapshot, evaluated))
                cadence.saved()
                if step == total:
                    break
                if stop.signum is not None:
                    ckpt.wait()
                    log.warning("trial %d: stopped at step %d; checkpoint saved, it resumes on the next run",
                                number, step)
                    stop.check()
            end = _window_end(step, total, eval_every, study.checkpoint.every_steps, fns.cap)
            params, opt_state, loss = fns.window(params, opt_state, key, data, step, end - step)
            step = end
            CURRENT_STEPS[number] = step
            evaluated = None
            if announce_first_step:
                announce_first_step = False
                loss.block_until_ready()
                log.info("trial %d: training again, step %d done (restart -> first new step)", number, step)
        return Outcome("COMPLETE", _best_step(best), best.value, step)
    except Interrupted:
        ckpt.wait()
        raise
    finally:
        CURRENT_STEPS.pop(number, None)
        done = COMPILES - compiles_before
        log.debug("trial %d: %d XLA compilation(s), %d executable(s) from the persistent cache", number,
                  compilations(done), done["cache_hits"])


def _best_of(reported: Mapping[int, float], step: int, sign: float) -> _Best:
    """The best of the evaluations reported up to `step`."""
    best = _Best(sign=sign)
    for s, v in sorted(reported.items()):
        if s <= step:
            best.offer(s, v)
    return best


def _best_step(best: _Best) -> int:
    assert best.step is not None, "the last step is always evaluated"
    return best.step


def _evaluate(metrics: Mapping[str, Any], metric: str, number: int, step: int) -> float:
    value = float(metrics[metric])
    if not math.isfinite(value):
        raise NonFiniteMetric(f"trial {number}: {metric} is {value} at step {step} (non-finite); the trial failed")
    return value


def _flush(ckpt: TrialCheckpoints, best: _Best, current: tuple[int, Callable[[], Any], dict | None] | None) -> None:
    """Write the best state if it is not on disk yet, then the current step (if given).

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


class _Cadence:
    """Periodic saves every N steps and/or every T seconds, whichever comes first.

    By default a due save waits for the save in flight (the cadence is exact). With
    `checkpoint.max_write_share` set, a periodic save that comes due while the writer is busy, or
    has not rested long enough for writing to stay within that share of the time, is owed instead:
    it happens at the first window end after that. Waiting would stall training whenever an Orbax
    write (~30 ms) outlasts the steps between two saves (a few ms for the digits trial); the
    newest checkpoint then lags the cadence by about one write / share (~1 s at 0.03) when steps
    are that fast, and not at all when they are not. The last step and a signal's save always
    happen, waiting for the writer.
    """

    def __init__(self, every_steps: int | None, every_seconds: float | None) -> None:
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.last_time = time.monotonic()
        self.owed = False

    def due(self, step: int) -> bool:
        if self.owed or (self.every_steps and step > 0 and step % self.every_steps == 0):
            return True
        return self.every_seconds is not None and time.monotonic() - self.last_time >= self.every_seconds

    def defer(self, ckpt: TrialCheckpoints, max_write_share: float | None) -> bool:
        """Owe the due save if `max_write_share` is set and the writer is not ready; True if owed."""
        busy = max_write_share is not None and ckpt.busy(max_write_share)
        self.owed = self.owed or busy
        return busy

    def saved(self) -> None:
        self.last_time = time.monotonic()
        self.owed = False
