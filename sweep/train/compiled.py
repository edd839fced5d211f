"""A trial's compiled training window and evaluation, where they are placed, and the in-process cache of jitted
functions (`FUNCTIONS`, bounded, clearable, shared by trials of equal static hyperparameters). JAX's persistent
cache on disk, the compile counters and the compile lock of a study's workers: compile_events.py."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sweep.host import slots
from sweep.train import compile_events
from sweep.train.stream import streaming
from sweep.trial.kinds import PlainKind, takes_step

log = logging.getLogger("sweep")
# A training window's target length: bounds the reaction to SIGTERM and every_seconds (the next
# window is already dispatched, so up to two). Measured: each window call costs a fixed ~0.1-0.2 s
# for a 100 MB state on this CPU (buffers in and out of the loop), so windows of one 0.5 s step
# ran 1.4-1.7x slower per step than a plain loop; at 0.2 s, 75 ms steps got windows of 2-3 steps.
WINDOW_SECONDS = 1.0
# Trace errors of a trial that branches in Python on a float hyperparameter: it then gets that
# hyperparameter as a constant (a compile per value), which is slower but correct.
TRACE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                 jax.errors.TracerArrayConversionError)


def mesh(devices: int) -> Any:
    """A 1-D mesh ("data") over the first `devices` devices of this process's slot (sweep/host/slots.py)."""
    return jax.sharding.Mesh(np.array(slots.local_devices(devices)), ("data",))  # JAX caches equal meshes


def replicated(devices: int) -> Any:
    return jax.sharding.NamedSharding(mesh(devices), jax.sharding.PartitionSpec())


def placement(devices: int) -> Any:
    """Where a trial's state and data live: the slot's device, or replicated over its `devices`."""
    return replicated(devices) if devices > 1 else slots.local_devices(1)[0]


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


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A trial's jitted training window and evaluation, shared by all trials of equal static hyperparameters.

    Float hyperparameters sampled from the search space are traced arguments, not constants, so a
    new learning rate does not compile anew (and JAX's persistent cache serves the next process).
    """

    # (params, opt_state, model_state, loss_sum, key, data, start, n, traced_hp)
    #   -> (params, opt_state, model_state, loss_sum, (first non-finite step or -1, its loss))
    window: Callable
    evaluate: Callable  # (params, model_state, data, traced_hp) -> metrics


def _build(module: Any, kind: PlainKind, static: Mapping[str, Any], devices: int) -> Compiled:
    streams = streaming(module)  # data is (a chunk of batches, the step of its first)
    wants_step = not streams and takes_step(module.batch)
    loss_step = takes_step(module.loss)  # loss(hp, params, batch, key, step): the same traced step

    def window(params, opt_state, model_state, loss_sum, rng, data, start, n, traced_hp):
        # One compiled loop over steps [start, start + n): no Python dispatch per step. The body is
        # a function of (state, step) only, so any split of the steps into windows gives the same
        # bits (checked by the tests); windows therefore need no alignment beyond step numbers.
        # The training loss is summed in the carry, in step order, for the same reason; the first
        # non-finite loss is kept with its step, so a NaN is reported where it began, at no cost.
        full = {**static, **traced_hp}
        tx = module.optimizer(full)

        def body(step, carry):
            params, opt_state, model_state, loss_sum, (bad_step, bad_loss) = carry  # bad: first non-finite
            batch_key, loss_key = jax.random.split(jax.random.fold_in(rng, step))
            if streams:  # step's batch from the host pipeline (sweep/train/stream.py)
                chunk, first = data
                batch = jax.tree.map(lambda b: b[step - first], chunk)
            elif wants_step:  # batch(hp, data, key, step): the trial's data key, the same at every step
                batch = module.batch(full, data, jax.random.fold_in(rng, DATA_KEY), step=step)
            else:
                batch = module.batch(full, data, batch_key)
            if devices > 1:
                batch = _split_batch(batch, devices)

            def loss_fn(p):
                loss, new_state = kind.loss(module, full, p, model_state, batch, loss_key, step if loss_step else None)
                return jnp.asarray(loss, jnp.float32), new_state

            (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            fresh = (bad_step < 0) & ~jnp.isfinite(loss)
            bad = jnp.where(fresh, step, bad_step), jnp.where(fresh, loss, bad_loss)
            return optax.apply_updates(params, updates), opt_state, model_state, loss_sum + loss, bad

        none = (jnp.int32(-1), jnp.zeros((), jnp.float32))
        return jax.lax.fori_loop(start, start + n, body, (params, opt_state, model_state, loss_sum, none))

    def evaluate(params, model_state, data, traced_hp):
        return kind.evaluate(module, {**static, **traced_hp}, params, model_state, data)

    pinned = {"out_shardings": replicated(devices)} if devices > 1 else {}
    return Compiled(jax.jit(window, donate_argnums=(0, 1, 2), **pinned), jax.jit(evaluate))


DATA_KEY = 0x64617461  # fold_in(train key, DATA_KEY): the data key of `batch(hp, data, key, step)`


# The in-process cache's memory bound: executables of programs not used lately are dropped once
# the memory their compilation took (measured as the process's resident-memory growth around each
# program's first call) adds up to more than this. $SWEEP_EXECUTABLE_CACHE_MB sets it.
DEFAULT_MAX_BYTES = int(float(os.environ.get("SWEEP_EXECUTABLE_CACHE_MB", 1024)) * 2**20)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclasses.dataclass
class _Entry:
    value: Any  # Compiled, or a jitted init
    module_key: tuple[str, int]
    static: dict[str, Any]  # the hyperparameters compiled in as constants
    bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # function -> memory its first call took


class FunctionCache:
    """Jitted programs by (trial module, static hyperparameters, traced names, devices, kind): a
    trial's window and evaluation (`get`), its init (`init`). Shared by trials of equal static
    hyperparameters; bounded by count and by the memory their compilation took, least recently
    used first; `retain` drops the programs of hyperparameters a study can no longer sample.

    A study of many shapes must not keep every executable alive (RSS grew to 1.65 GB holding 8
    pairs of a small LM's programs). 16 entries: 8 shapes' training programs and their inits.
    Also remembers which (module, function, traced names) cannot be traced. Thread-safe: a
    threaded Dask worker runs several trials in one process.
    """

    def __init__(self, max_entries: int = 16, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: collections.OrderedDict[tuple[Any, ...], _Entry] = collections.OrderedDict()
        self._untraceable: set[tuple[Any, ...]] = set()
        self._lock = threading.RLock()

    @staticmethod
    def _module_key(module: Any) -> tuple[str, int]:
        return module.__name__, id(module)  # a reloaded module with the same name is another module

    def _lookup(self, key: tuple[Any, ...], module: Any, static: dict[str, Any], build: Callable[[], Any],
                fallback: int = 0) -> Any:
        try:
            hash(key)
        except TypeError:  # an NNX module with an unhashable static attribute: shared by its kind only
            key = (*key[:-1], fallback)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key].value
            self._entries[key] = _Entry(build(), self._module_key(module), static)
            self._shrink()
            return self._entries[key].value

    def _shrink(self) -> None:
        """Drop least recently used entries (never the newest) while over either bound."""
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self.bytes() > self.max_bytes):
            self._entries.popitem(last=False)

    def get(self, module: Any, hp: Mapping[str, Any], traced: tuple[str, ...], devices: int = 1,
            kind: PlainKind | None = None) -> Compiled:
        """The compiled functions for `hp`, with the names in `traced` passed as arguments.

        `devices` > 1: data parallel over `mesh(devices)` (batch split, params replicated).
        `kind`: the trial's kind (plain, linen collections, NNX); its static part is in the key.
        """
        kind = kind or PlainKind()
        static = {k: v for k, v in hp.items() if k not in traced}
        # A multi-device program pins its outputs to its mesh: keyed by the devices themselves.
        where = devices if devices == 1 else tuple(slots.local_devices(devices))
        key = ("trial", *self._module_key(module), repr(sorted(static.items())), traced, where, kind.static_key())
        return self._lookup(key, module, static, lambda: _build(module, kind, static, devices), fallback=id(kind))

    def init(self, module: Any, static: Mapping[str, Any], traced: tuple[str, ...], layout: tuple[Any, ...],
             build: Callable[[], Any]) -> Any:
        """The jitted init of `module` for `static` hyperparameters and a data `layout`."""
        key = ("init", *self._module_key(module), repr(sorted(static.items())), traced, layout)
        return self._lookup(key, module, dict(static), build)

    def call(self, value: Any, fn_name: str, call: Callable[[], Any], program: Callable[[], str] | None = None) -> Any:
        """`call()`, a call of `fn_name` of the cached `value`; its first call is measured (the resident memory
        its compilation took) for the memory bound, under the compile lock of `program()` (compile_events)."""
        with self._lock:
            entry = next((e for e in self._entries.values() if e.value is value), None)
            measure = entry is not None and fn_name not in entry.bytes
        if not measure:
            return call()
        before = resident_bytes()
        with compile_events.compiled_once(program() if program is not None else None, fn_name):
            out = call()
        after = resident_bytes()
        with self._lock:
            entry.bytes[fn_name] = max(0, after - before) if before is not None and after is not None else 0
            self._shrink()
        return out

    def bytes(self) -> int:
        """The measured memory of the cached programs."""
        with self._lock:
            return sum(sum(e.bytes.values()) for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def retain(self, module: Any, reachable: Callable[[Mapping[str, Any]], bool]) -> int:
        """Drop `module`'s programs whose static hyperparameters `reachable` rejects (a grid study's
        points that are all taken); returns how many were dropped."""
        with self._lock:
            gone = [k for k, e in self._entries.items()
                    if e.module_key == self._module_key(module) and not reachable(e.static)]
            for k in gone:
                del self._entries[k]
            return len(gone)

    def static_names(self, module: Any, fn: str) -> frozenset[str]:
        """The hyperparameters `fn` ("window"/"evaluate") of `module` needs as Python values."""
        with self._lock:
            return frozenset(name for (*m, f, name) in self._untraceable
                             if tuple(m) == self._module_key(module) and f == fn)

    def mark_static(self, module: Any, fn: str, names: frozenset[str]) -> bool:
        """Remember `names` as static for `fn`; False if they all were already (no progress)."""
        with self._lock:
            new = {(*self._module_key(module), fn, name) for name in names} - self._untraceable
            self._untraceable |= new
            return bool(new)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._untraceable.clear()


FUNCTIONS = FunctionCache()


def clear_caches() -> None:
    """Forget every jitted function of this process (JAX's own caches are `jax.clear_caches()`)."""
    FUNCTIONS.clear()


def traced_names(search_space: Mapping[str, Any], hp: Mapping[str, Any]) -> tuple[str, ...]:
    """Sampled float hyperparameters: the ones that differ between trials of equal shapes."""
    return tuple(sorted(k for k in search_space if isinstance(hp.get(k), float)))


_TRACED_ARG = re.compile(r"traced_hp\[['\"]([^'\"]+)['\"]\]")


def _culprits(exc: Exception, traced: tuple[str, ...]) -> frozenset[str]:
    """The traced hyperparameters a trace error names ("... depends on the value of the argument
    traced_hp['dropout']"); all of them when JAX's message names none."""
    named = frozenset(_TRACED_ARG.findall(str(exc))) & frozenset(traced)
    return named or frozenset(traced)


class Functions:
    """The trial's window and evaluation, traced float hyperparameters where the trial allows it.

    A hyperparameter the trial's code needs as a Python value (`if hp["dropout"] > 0:`, Flax's
    `nn.Dropout` checking `rate == 0`) cannot be traced: that one becomes a compile-time constant
    (a compile per value), the others stay traced. Logged at info level once per trial module.
    """

    def __init__(self, module: Any, hp: Mapping[str, Any], traced: tuple[str, ...], devices: int = 1,
                 cache: FunctionCache = FUNCTIONS, kind: PlainKind | None = None) -> None:
        self.module, self.hp, self.traced, self.devices, self.cache = module, hp, traced, devices, cache
        self.kind = kind or PlainKind()
        self.cap = 1  # steps in the next window at most; the first one includes the compilation
        self._since: float | None = None  # where the next window's time starts; None: first window

    def _call(self, fn_name: str, *args: Any, abstract: bool = False) -> Any:
        static = self.cache.static_names(self.module, fn_name)
        traced = tuple(name for name in self.traced if name not in static)
        functions = self.cache.get(self.module, self.hp, traced, self.devices, self.kind)
        fn = getattr(functions, fn_name)
        try:
            if abstract:
                return jax.eval_shape(fn, *args, {k: self.hp[k] for k in traced})
            return self.cache.call(functions, fn_name, lambda: fn(*args, {k: self.hp[k] for k in traced}),
                                   lambda: compile_events.functions_key(self, fn_name, traced, args))
        except TRACE_ERRORS as exc:
            culprits = _culprits(exc, traced) if _TRACED_ARG.search(str(exc)) else self._probe(fn_name, traced, args)
            if not traced or not culprits - static:
                raise
            self.cache.mark_static(self.module, fn_name, culprits)
            log.info("%s: %s uses %s %s as a Python value (%s), so each value compiles its "
                     "own program; write it with jnp operations (e.g. jnp.where) to share one program",
                     self.module.__name__, "training" if fn_name == "window" else "evaluate",
                     "hyperparameter" if len(culprits) == 1 else "hyperparameters", ", ".join(sorted(culprits)),
                     type(exc).__name__)
            return self._call(fn_name, *args, abstract=abstract)

    def shapes(self, fn_name: str, *args: Any) -> Any:
        """`jax.eval_shape` of "window" or "evaluate" on `args`: traced, never compiled or run."""
        return self._call(fn_name, *args, abstract=True)

    def _probe(self, fn_name: str, traced: tuple[str, ...], args: tuple[Any, ...]) -> frozenset[str]:
        """The traced names that fail to trace on their own (the others constants). Inside the
        training loop's `fori_loop` JAX's message names no argument, so each is tried: a trace
        (`jax.eval_shape`), no compile, per name."""
        found = set()
        for name in traced:
            static = {k: v for k, v in self.hp.items() if k != name}
            fn = getattr(_build(self.module, self.kind, static, self.devices), fn_name)
            try:
                jax.eval_shape(fn, *args, {name: self.hp[name]})
            except TRACE_ERRORS:
                found.add(name)
        return frozenset(found) or frozenset(traced)

    def evaluate(self, params: Any, model_state: Any, data: Any) -> Any:
        return self._call("evaluate", params, model_state, data)

    def dispatch(self, params: Any, opt_state: Any, model_state: Any, loss_sum: Any, key: Any, data: Any,
                 start: int, n: int) -> Any:
        """Start the window over steps [start, start + n) and return at once (JAX's asynchronous
        dispatch): (params, opt_state, model_state, loss_sum, first non-finite) as arrays still being
        computed. The caller may dispatch the next window on them before this one is done."""
        return self._call("window", params, opt_state, model_state, loss_sum, key, data, np.int32(start),
                          np.int32(n))

    def finish(self, out: Any, n: int) -> None:
        """Wait for a dispatched window of `n` steps; windows grow to WINDOW_SECONDS of steps, timed
        from the previous window's completion (the first window compiled, so it is not timed)."""
        out[3].block_until_ready()
        now = time.perf_counter()
        if self._since is not None:
            per_step = (now - self._since) / n
            self.cap = max(1, min(self.cap * 8, int(WINDOW_SECONDS / max(per_step, 1e-9))))
        self._since = now

    def restart_timing(self) -> None:
        """The device was idle (an evaluation, a save): time the next window from its dispatch."""
        if self._since is not None:
            self._since = time.perf_counter()

    def window(self, params: Any, opt_state: Any, model_state: Any, loss_sum: Any, key: Any, data: Any,
               start: int, n: int) -> Any:
        """`dispatch` then `finish`: one window, waited for."""
        self.restart_timing()
        out = self.dispatch(params, opt_state, model_state, loss_sum, key, data, start, n)
        self.finish(out, n)
        return out


def forget_taken_grid_points(module: Any, points: list[dict[str, Any]], taken: list[dict[str, Any]]) -> None:
    """A grid study samples each point once: drop this process's compiled programs of hyperparameters that
    no remaining grid point has (a shape-changing grid keeps RSS flat); `taken`: the study's trials' params."""
    from sweep.words import count

    asked = {repr(sorted(p.items())) for p in taken}
    remaining = [p for p in points if repr(sorted(p.items())) not in asked]

    def reachable(static: Mapping[str, Any]) -> bool:
        return any(all(static.get(k, v) == v for k, v in p.items()) for p in remaining)

    dropped = FUNCTIONS.retain(module, reachable)
    if dropped:
        # JAX keeps executables of its own per shape (the eager ops of optax's init, transfers): measured +5 MB
        # a trial on a grid of 100 shapes with only sweep's programs dropped. The next trial's: the persistent cache.
        jax.clear_caches()
        log.debug("dropped %s of grid points all taken", count(dropped, "compiled program"))
