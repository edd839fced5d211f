"""Training batches from a host-side input pipeline (grain), whose position is part of the checkpoint.

A trial whose data does not fit in memory provides `train_batches(hp, seed)`: a grain dataset
(`grain.MapDataset` / `IterDataset`, or a `grain.DataLoader`) yielding one batch per training
step. Its iterator's `get_state()` is saved in every checkpoint (key "data_state") and given back
with `set_state()` on resume, so a resumed trial reads exactly the batches (order, shuffle,
augmentation randomness) an uninterrupted one would. Optionally `val_batches(hp)`: a finite,
deterministic iterable of validation batches; each evaluation streams it and combines the
per-batch metrics weighted by the batch's number of examples.

What is written here by hand, and why: grain prefetches and transforms elements on its own
threads, but the compiled training window needs many steps' batches at once, as one device array
(a window is one `fori_loop`; a batch per Python call would reintroduce the per-step dispatch the
windows exist to avoid), and the iterator state of every step that may be saved. `Batches`
stacks a fixed number of consecutive batches into a chunk on a background thread, puts it on the
device and records the iterator's state before each batch, while the device trains on the
previous chunk.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import queue
import threading
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np

DATA_STATE_KEY = "data_state"
# The iterator state is stored as a fixed-size byte array so that the restore template of every
# step is known without opening the pipeline: 4 bytes of length, a kind byte, the state.
STATE_BYTES = 16384
# A chunk's steps are fixed per batch shape (one compiled window serves every chunk). Small enough
# that training starts after a few batches were read and the pipeline runs alongside; large
# enough that a fast step's window is not mostly dispatch.
CHUNK_BYTES = 2 << 20  # host and device bytes of one chunk of stacked batches, about
MIN_CHUNK, MAX_CHUNK = 4, 256
PREFETCH_CHUNKS = 2


def streaming(module: Any) -> bool:
    """The trial reads its training batches from a pipeline (`train_batches`)."""
    return callable(getattr(module, "train_batches", None))


def validation_streamed(module: Any) -> bool:
    return callable(getattr(module, "val_batches", None))


def encode_state(state: Any) -> np.ndarray:
    """An iterator state (a JSON-able dict, or bytes as grain's DataLoader gives) as STATE_BYTES uint8."""
    raw = b"B" + bytes(state) if isinstance(state, (bytes, bytearray)) else b"J" + json.dumps(
        state, sort_keys=True).encode()
    if len(raw) > STATE_BYTES - 4:
        raise ValueError(f"the data iterator's state takes {len(raw)} bytes; sweep stores at most "
                         f"{STATE_BYTES - 4} (a pipeline that keeps data in its state?)")
    out = np.zeros(STATE_BYTES, np.uint8)
    out[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
    out[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_state(array: Any) -> Any:
    """The iterator state of `encode_state`. Raises ValueError if the bytes are not one."""
    a = np.asarray(array, np.uint8)
    if a.shape != (STATE_BYTES,):
        raise ValueError(f"a data state has shape ({STATE_BYTES},), got {a.shape}")
    n = int(np.frombuffer(a[:4].tobytes(), np.uint32)[0])
    if not 1 <= n <= STATE_BYTES - 4:
        raise ValueError(f"a data state of {n} bytes")
    raw = a[4:4 + n].tobytes()
    if raw[:1] == b"B":
        return raw[1:]
    if raw[:1] == b"J":
        return json.loads(raw[1:])
    raise ValueError("a data state of an unknown kind")


def _checkpointable(module: Any, source: Any) -> Any:
    it = iter(source)
    if not (callable(getattr(it, "get_state", None)) and callable(getattr(it, "set_state", None))):
        raise TypeError(f"{module.__name__}.train_batches must return a grain dataset or DataLoader (an iterable "
                        f"whose iterator has get_state() and set_state()), got {type(source).__name__}")
    return it


def open_iterator(module: Any, hp: Mapping[str, Any], seed: int, state: Any = None) -> Any:
    """An iterator over the trial's training batches, at `state` (encoded) if given.

    Raises:
        TypeError: `train_batches` did not return a checkpointable iterable.
    """
    source = module.train_batches(hp, seed)
    it = _checkpointable(module, source)
    if state is not None:
        it.set_state(decode_state(state))
    return it


def first_batch(module: Any, hp: Mapping[str, Any], seed: int) -> Any:
    """The first training batch, for checks: by index where the dataset allows it (iterating a
    grain MapDataset starts its reader threads and prefetch), else from a fresh iterator.

    Raises:
        TypeError: as `open_iterator`.
    """
    source = module.train_batches(hp, seed)
    it = _checkpointable(module, source)  # grain starts reading at the first next(), not here
    state = it.get_state()
    try:
        same = decode_state(encode_state(state)) == state
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{module.__name__}.train_batches: its iterator's state cannot be stored in a checkpoint "
                        f"({exc})") from None
    if not same:
        raise TypeError(f"{module.__name__}.train_batches: its iterator's state does not survive JSON "
                        f"(a checkpoint stores it as JSON or bytes), got {state!r}")
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return source[0]
    return next(it)


def chunk_steps(batch: Any) -> int:
    """Steps per chunk for batches like `batch`: CHUNK_BYTES of them, within [MIN_CHUNK, MAX_CHUNK]."""
    size = sum(np.asarray(x).nbytes for x in jax.tree.leaves(batch))
    return int(min(MAX_CHUNK, max(MIN_CHUNK, CHUNK_BYTES // max(size, 1))))


def abstract_chunk(batch: Any) -> tuple[Any, Any]:
    """The window's data argument for batches like `batch`, as shapes (for `jax.eval_shape`)."""
    k = chunk_steps(batch)
    stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((k, *np.shape(x)), np.asarray(x).dtype), batch)
    return stacked, jax.ShapeDtypeStruct((), np.int32)


@dataclasses.dataclass
class _Chunk:
    start: int  # the step of the first batch
    n: int  # batches in it (the buffer holds `chunk_steps`, the rest zeros)
    buffer: Any  # the stacked batches, on the device
    states: list[Any]  # iterator state before batch start + i, for i in 0..n


class Batches:
    """The training batches of steps [first, total), stacked in chunks and prefetched on a thread.

    The window's data argument is `(buffer, chunk start)`: the compiled loop takes step s's batch
    from row s - start, so any split of the steps into windows reads the same batches.
    """

    def __init__(self, iterator: Any, first: int, total: int, place: Any) -> None:
        self._it, self.total, self.place = iterator, total, place
        first_state = copy.deepcopy(iterator.get_state())
        self._states: dict[int, Any] = {first: first_state}  # the training thread's: step -> state
        self._queue: queue.Queue[_Chunk | BaseException] = queue.Queue(maxsize=PREFETCH_CHUNKS)
        self._stop = threading.Event()
        self._current: _Chunk | None = None
        self._thread: threading.Thread | None = None
        self.steps = MIN_CHUNK
        if first < total:  # (a trial restored at its last step reads nothing)
            head = self._pull(first)  # the first batch tells the chunk's shape
            self.steps = chunk_steps(head)
            self._thread = threading.Thread(target=self._fill, args=(first, head, first_state),
                                            name="sweep-data", daemon=True)
            self._thread.start()

    def _pull(self, step: int) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            raise RuntimeError(f"the trial's train_batches ran out at step {step} of {self.total}: "
                               "repeat the dataset (grain: .repeat())") from None
        return jax.tree.map(np.asarray, batch)

    def _state(self) -> Any:
        # A copy: the protocol does not promise that get_state() returns a fresh object (grain's
        # iterators do), and a state changed in place later would save a later position.
        return copy.deepcopy(self._it.get_state())

    def _fill(self, step: int, head: Any, head_state: Any) -> None:
        try:
            while step < self.total and not self._stop.is_set():
                n = min(self.steps, self.total - step)
                states, batches = [], []
                for i in range(n):
                    if head is not None:
                        states.append(head_state)
                        batches.append(head)
                        head = None
                    else:
                        states.append(self._state())
                        batches.append(self._pull(step + i))
                states.append(self._state())
                pad = [jax.tree.map(np.zeros_like, batches[0])] * (self.steps - n)
                stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches, *pad)
                chunk = _Chunk(step, n, jax.device_put(stacked, self.place), states)
                step += n
                while not self._stop.is_set():
                    try:
                        self._queue.put(chunk, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, which raises it
            self._queue.put(exc)

    def _chunk_for(self, step: int) -> _Chunk:
        while self._current is None or step >= self._current.start + self._current.n:
            got = self._queue.get()
            if isinstance(got, BaseException):
                raise got
            if self._current is not None:  # states before the new chunk are no longer needed
                self._states = {s: v for s, v in self._states.items() if s >= got.start}
            self._current = got
            self._states.update({got.start + i: s for i, s in enumerate(got.states)})
        return self._current

    def window(self, step: int, end: int) -> tuple[tuple[Any, np.int32], int]:
        """(data argument, end) of a window from `step`: `end` cut at the end of step's chunk."""
        chunk = self._chunk_for(step)
        return (chunk.buffer, np.int32(chunk.start)), min(end, chunk.start + chunk.n)

    def state_at(self, step: int) -> np.ndarray:
        """The encoded iterator state after the batches of steps before `step` (a checkpoint's)."""
        return encode_state(self._states[step])

    def close(self) -> None:
        self._stop.set()
        if self._thread is None:
            return
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread.join()
        close = getattr(self._it, "close", None)  # grain's reader threads and prefetch buffer, now
        if callable(close):
            close()


def evaluate_batches(evaluate: Callable[[Any], Mapping[str, Any]], batches: Iterable[Any],
                     names: Iterable[str]) -> dict[str, float]:
    """The metrics `names` over every batch: each batch's value weighted by its examples (the
    leading axis of its first array), summed in float64 in the batches' order (deterministic).

    `evaluate(batch)` is dispatched for every batch before any value is read, so the device works
    while the host reads the next batch.
    """
    names = tuple(names)
    outs, weights = [], []
    if hasattr(batches, "__len__") and hasattr(batches, "__getitem__"):
        # A grain MapDataset is read by index on this thread: iterating it starts a pool of reader
        # threads at every evaluation (0.2 s here, more than evaluating a small validation set).
        indexed = batches
        batches = (indexed[i] for i in range(len(indexed)))
    for batch in batches:
        leaves = jax.tree.leaves(batch)
        if not leaves:
            raise ValueError("a validation batch holds no arrays")
        weights.append(int(np.shape(leaves[0])[0]) if np.ndim(leaves[0]) else 1)
        outs.append(evaluate(jax.tree.map(np.asarray, batch)))
    if not outs:
        raise ValueError("val_batches yielded no batch")
    total = float(sum(weights))
    result: dict[str, float] = {}
    for name in names:
        if any(name not in out for out in outs):
            return outs[0]  # the caller reports the missing metric, as for in-memory evaluation
        result[name] = float(sum(np.float64(w) * np.float64(out[name]) for w, out in zip(weights, outs)) / total)
    return result
