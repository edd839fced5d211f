"""One trial's checkpoint folder: the only module that imports orbax.

Saves copy the training state to host memory on the caller's thread and let
Orbax write it on a background thread (at most one save in flight), so
training continues while the bytes go to disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from sweep.checkpoints import direct_read, integrity, packing
from sweep.checkpoints import ram as ram_lib
from sweep.checkpoints.steps import step_dirs as _step_dirs
from sweep.errors import DiskFault, disk_errno
from sweep.host import cpu_time
from sweep.study.config import Config

log = logging.getLogger("sweep")


@contextlib.contextmanager
def _absl_quiet(quiet: bool) -> Iterator[None]:
    """absl (Orbax's logging) at ERROR and above while `quiet`."""
    absl = logging.getLogger("absl")
    level = absl.level
    if quiet and absl.getEffectiveLevel() < logging.ERROR:
        absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def _uncompressed() -> Any:
    """Orbax's standard handler as sweep tunes it (sweep/internals.py; benchmarks/big_state.py measured each):

    - no zstd compression: on a trained 100 MB state it saved 8% of the disk for 45% more save
      time and twice the restore time (on the same cores as training);
    - no OCDBT: packing (sweep/checkpoints/packing.py) already leaves Orbax a few arrays per state,
      where OCDBT's one-file-per-step costs more than it saves (its writes went ~3x slower at 1 GB);
    - no copy of host arrays: Orbax copies every numpy array it is given (a guard against the
      caller changing it mid-write: orbax#1640's 14 GB for a 4 GB array); the tree sweep hands it
      is a private host copy already, never changed after;
    - one chunk per array (Orbax's default without OCDBT): tensorstore writes it from the host
      copy's own buffer, where chunks that split an array's inner axis were copied first (peak
      memory 1.30x the state above it with 64 MiB chunks, 1.00x unchunked, at 1 GB).
    Compressed and OCDBT steps of earlier releases still restore (each step records its format).
    """
    from sweep.internals import uncompressed_standard_handler

    return uncompressed_standard_handler(use_ocdbt=False, copy_host_arrays=False)


def _handlers() -> Any:
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    handler = _uncompressed()
    registry.add(None, ocp.args.StandardSave, handler)
    registry.add(None, ocp.args.StandardRestore, handler)
    return registry


class DamagedCheckpoint(Exception):
    """A committed step that does not restore or does not match its checksum."""


def host_copy(state: Any) -> Any:
    """A private numpy copy of a pytree of arrays (donated device buffers may be reused)."""
    return jax.tree.map(lambda x: np.array(x, copy=True), state)


class WriteBudget:
    """What the newest checkpoint write cost and when it ended, for every trial of a session.

    A write costs the longer of its wall time and the CPU time its threads took (sweep/host/cpu_time.py:
    the writer's hashing and copies, tensorstore's pool, Orbax's threads compete with training for
    the cores). The share of time spent writing (see `TrialCheckpoints.busy`) is the process's,
    not a trial's: trials one after the other share one budget.
    """

    def __init__(self) -> None:
        self.last_write = (0.0, 0.0)  # (seconds charged, monotonic end)

    def record(self, seconds: float) -> None:
        self.last_write = (seconds, time.monotonic())

    def rested(self, share: float) -> bool:
        """The writer has rested long enough for writing to take at most `share` of the time."""
        took, ended = self.last_write
        return time.monotonic() - ended >= took * (1 / share - 1)


class TrialCheckpoints:
    """Save/restore of one trial's full training state with Orbax retention.

    Keeps the newest `keep_last` steps plus the best `keep_best` by `metric`.
    """

    def __init__(self, directory: Path, metric: str, direction: str, keep_last: int, keep_best: int,
                 read_only: bool = False, label: str = "trial", budget: WriteBudget | None = None,
                 optional_keys: tuple[str, ...] = (), fence: Callable[[], None] | None = None,
                 room: Callable[[int, int], None] | None = None,
                 on_commit: Callable[[int], None] | None = None) -> None:
        self.directory = Path(directory)
        self.fence = fence  # raises if this worker no longer holds the trial: called before each write
        self.room = room  # (step, bytes): makes room under the study's disk budget or raises DiskFault
        self.on_commit = on_commit  # (step): a step is durable here (the remote tier uploads it)
        self.label = label
        self.optional_keys = optional_keys
        self.budget = budget or WriteBudget()
        if not read_only:
            self._quarantine_unreadable()
        best_fn = lambda metrics: float(metrics[metric])  # noqa: E731
        # Orbax's `max_to_keep` together with `best_fn` deletes the *newest* steps when they are not
        # among the best; a preservation policy keeps latest-N and best-K side by side instead.
        keep = [policies.LatestN(n=keep_last)]
        if keep_best:
            keep.append(policies.BestN(get_metric_fn=best_fn, reverse=direction == "minimize", n=keep_best,
                                       keep_checkpoints_without_metrics=False))
        # Orbax warns that a read-only manager gets save_interval_steps=0, from the options and from
        # the manager: not a message for the user of a reader (export, load_best).
        with _absl_quiet(read_only):
            options = ocp.CheckpointManagerOptions(
                preservation_policy=policies.AnyPreservationPolicy(keep),
                best_fn=best_fn,
                best_mode="min" if direction == "minimize" else "max",
                keep_checkpoints_without_metrics=False,
                # Our own background thread writes host copies; Orbax's async mode would block the
                # training thread longer (it serialises device arrays before returning).
                enable_async_checkpointing=False,
                cleanup_tmp_directories=not read_only,  # a kill -9 mid-save leaves <step>.orbax-checkpoint-tmp
                create=not read_only,
                read_only=read_only,
            )
            try:
                self._manager = ocp.CheckpointManager(self.directory, options=options, handler_registry=_handlers())
            except Exception as exc:
                self._raise_disk_fault(exc, None)
                raise
        self._faulted = False  # a disk fault cut a save short: close() removes its partial step again
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweep-ckpt")
        self._pending: Future[None] | None = None
        self._writing: int | None = None  # the step the writer is on
        self.written_seconds = 0.0  # the writer thread's time on this folder's saves (the goodput ledger)
        self.last_saved: int | None = self._manager.latest_step()
        # A PBT member's latest exploit step (sweep/schedulers/pbt.py): its steps below it are another lineage,
        # never resumed from; with none intact at or above it the trial fails, loudly.
        self.restore_floor = 0
        self.checksum_algorithm = integrity.ALGORITHM  # what saves record (replay may match an older study's)
        self.ram: TrialCheckpoints | None = None  # the trial's folder in the RAM tier (sweep/checkpoints/ram.py)

    @classmethod
    def of_study(cls, config: Config, number: int, directory: Path, **options: Any) -> TrialCheckpoints:
        """Trial `number`'s folder with the study's retention settings; `options`: the constructor's."""
        c, objective = config.study.checkpoint, config.study.objective
        return cls(directory, objective.metric, objective.direction, c.keep_last, c.keep_best,
                   label=f"trial {number}", **options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def _quarantine_unreadable(self) -> None:
        # Orbax's manager reads every step's metrics when it is constructed (for best_fn), so one
        # corrupt JSON file would make the constructor raise before any restore is tried.
        for entry in _step_dirs(self.directory):
            reason = integrity.readable_metadata(Path(entry.path))
            if reason is None and integrity.read_checksum(self.directory, int(entry.name)) is None:
                reason = "no checksum recorded"
            if reason:
                integrity.quarantine(self.directory, int(entry.name), reason, self.label)

    def restore(self, step: int, template: Any) -> Any:
        """Restore `step` into the structure of `template` (optax states come back as their types).

        Steps in the packed layout (sweep/checkpoints/packing.py) and in the plain one of earlier releases both
        restore; a step written before one of the template's `optional_keys` existed comes back
        without it.
        """
        return packing.place(*self._restore_host(step, template))

    def _restore_host(self, step: int, template: Any) -> tuple[Any, Any]:
        """(the state with the packed layout's large arrays still in host memory, the abstract tree it
        restored): read at the disk's speed where the step is in this release's form
        (sweep/checkpoints/direct_read.py), else by Orbax into numpy arrays (~1.5x faster than its
        device-array restore); the checksum reads host memory (no device-to-host copy on a GPU)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        trees = [abstract]
        if isinstance(abstract, dict) and any(k in abstract for k in self.optional_keys):
            trees.append({k: v for k, v in abstract.items() if k not in self.optional_keys})
        first: Exception | None = None
        for tree in trees:
            for packed in (True, False):  # the layout this release writes first
                try:
                    if packed:
                        host = packing.packed_template(tree, host=True)
                        read = direct_read.read(self.directory / str(step) / "default", host)
                        if read is None:  # a step of an earlier release: Orbax reads it
                            read = self._manager.restore(step, args=ocp.args.StandardRestore(host))
                        return packing.unpack(read, tree), tree
                    return self._manager.restore(step, args=ocp.args.StandardRestore(tree)), None
                except Exception as exc:
                    first = first or exc
        assert first is not None
        raise first

    def restore_verified(self, step: int, template: Any) -> Any:
        """`restore`, checked against the step's recorded checksum; every reader of a checkpoint uses this.

        Raises:
            DamagedCheckpoint: the step does not restore, or its arrays differ from what was saved.
        """
        try:
            state, tree = self._restore_host(step, template)
        except Exception as exc:  # tensorstore/JSON errors on torn or garbage files
            raise DamagedCheckpoint(f"restore failed: {type(exc).__name__}") from exc
        if not integrity.matches(state, integrity.read_checksum(self.directory, step)):
            raise DamagedCheckpoint("checksum mismatch")
        return packing.place(state, tree)

    def _verified(self, step: int, template: Any) -> Any | None:
        """The verified state of `step`, or None after moving the damaged step to quarantine."""
        try:
            return self.restore_verified(step, template)
        except DamagedCheckpoint as exc:
            integrity.quarantine(self.directory, step, str(exc), self.label)
            return None

    def restore_intact(self, template: Any, best_before: Callable[[int], int | None]) -> tuple[int | None, Any]:
        """(step, state) of the newest intact step whose best earlier state is intact too.

        `best_before(s)` names the step of the best evaluation up to s; if that state is damaged,
        resuming from s would lose it for good, so the search goes on below it (training
        recomputes it bit-identically). Damaged steps are quarantined. (None, template) if none.
        """
        limit = None
        for step in sorted(self._manager.all_steps(), reverse=True):
            if (limit is not None and step >= limit) or step < self.restore_floor:
                continue
            state = self._verified(step, template)
            if state is None:
                self._manager.reload()
                continue
            best = best_before(step)
            if best is not None and best != step and (best not in self._manager.all_steps()
                                                      or self._verified(best, template) is None):
                self._manager.reload()
                limit = best
                continue
            return step, state
        if self.restore_floor:
            raise DamagedCheckpoint(f"{self.label}: no intact checkpoint at or after its PBT exploit at step "
                                    f"{self.restore_floor} (the copied state is damaged; an older step is another "
                                    "member's lineage)")
        return None, template

    def save(self, *items: tuple[int, Any, dict[str, float] | None]) -> None:
        """Start writing (step, host-copied state, metrics) items in order; at most one save in flight.

        Returns once the previous save is on disk; steps not newer than the last saved are skipped
        (Orbax would silently refuse them).
        """
        self.wait()
        todo = []
        for step, state, metrics in items:
            if self.last_saved is None or step > self.last_saved:
                todo.append((step, state, metrics))
                self.last_saved = step
        if todo:
            self._pending = self._executor.submit(self._write, todo)

    def _write(self, items: list[tuple[int, Any, dict[str, float] | None]]) -> None:
        start, cpu = time.monotonic(), cpu_time.Meter(threading.get_native_id())  # on the writer thread
        try:
            self._write_items(items)
        except Exception as exc:
            self._raise_disk_fault(exc, self._writing)
            raise
        finally:
            took = time.monotonic() - start
            self.budget.record(max(took, cpu.writer_seconds()))
            self.written_seconds += took

    def _raise_disk_fault(self, exc: Exception, step: int | None) -> None:
        """Raise DiskFault (one line: trial, step, folder, the errno's meaning) if `exc` is one,
        after removing the partial step so its space is free again; return if it is not."""
        code = disk_errno(exc)
        if code is None:
            return
        self._faulted = True
        self._remove_partials()
        if step is not None and not (self.directory / str(step)).exists():
            sums = integrity.sums_dir(self.directory)
            for stale in (sums / f"{step}{integrity.SIDE_SUFFIX}", sums / f".{step}.tmp"):
                stale.unlink(missing_ok=True)
        what = f"its checkpoint of step {step}" if step is not None else "its checkpoint folder"
        raise DiskFault(f"{self.label}: cannot write {what} to {self.directory}: {os.strerror(code)} "
                        f"({errno.errorcode[code]}); its committed steps are intact and it stays resumable: "
                        "free space (or fix the disk) and run the same command") from None

    def _remove_partials(self) -> None:
        """Remove the partial steps Orbax left (`<step>.orbax-checkpoint-tmp*`), so their space is free.

        After a disk fault, writes of the same save may still be in flight: Orbax gathers a step's
        tensorstore writes with `asyncio.gather`, which raises at the first failure and leaves the
        others running, and tensorstore creates a file's parent folders as it writes. So a folder
        removed here can come back; `close()` removes them again once Orbax's manager is closed.
        """
        for partial in self.directory.glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(partial, ignore_errors=True)

    def _write_items(self, items: list[tuple[int, Any, dict[str, float] | None]]) -> None:
        for step, state, metrics in items:
            self._writing = step
            if self.fence is not None:
                self.fence()  # a worker that lost its trial never commits over the new owner's steps
            if self.room is not None:
                self.room(step, sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)))
            # The checksum is durable before the step exists, so a committed step always has one.
            integrity.write_checksum(self.directory, step, integrity.checksum(state, self.checksum_algorithm))
            self._manager.save(step, args=ocp.args.StandardSave(packing.pack(state)), metrics=metrics, force=True)
            self._manager.wait_until_finished()
            integrity.make_durable(self.directory / str(step))
            log.debug("%s: step %d saved (%s)", self.label, step, self.directory / str(step))  # --verbose
        self._drop_stale_checksums()
        if self.on_commit is not None:
            for step, _, _ in items:
                if (self.directory / str(step)).exists():  # not one Orbax's retention removed at once
                    self.on_commit(step)

    def _drop_stale_checksums(self) -> None:
        kept = {e.name for e in _step_dirs(self.directory)}
        for path in integrity.sums_dir(self.directory).glob(f"*{integrity.SIDE_SUFFIX}"):
            if path.name[: -len(integrity.SIDE_SUFFIX)] not in kept:
                path.unlink(missing_ok=True)

    def busy(self, share: float = 1.0) -> bool:
        """A save is still being written, or (with `share` < 1) the writer has not rested long enough
        for writing to take at most that share of the wall time since the last write started."""
        if self._pending is not None and not self._pending.done():
            return True
        return not self.budget.rested(share)

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; re-raise its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def drop_ram(self) -> None:
        """The trial's last step is on disk (it completed, pruned or paused): its RAM folder goes."""
        ram, self.ram = self.ram, None
        if ram is not None:
            ram.close()
            ram_lib.clear(ram.directory)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            try:
                if self.ram is not None:
                    self.ram.close()
            finally:
                self._close_own()

    def _close_own(self) -> None:
        self._executor.shutdown(wait=True)
        try:
            self._manager.close()
        except Exception as exc:
            if disk_errno(exc) is None:
                raise
        finally:
            if self._faulted:  # what writes still in flight at the fault wrote since (see _remove_partials)
                self._remove_partials()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())
