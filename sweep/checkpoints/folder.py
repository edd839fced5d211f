"""One trial's checkpoint folder: the only module that imports orbax.

Saves copy the training state to host memory on the caller's thread and write it on a
background thread (at most one save in flight), so training continues while the bytes go to
disk: a small state as one file (compact.py), a larger one by Orbax.
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

from sweep.checkpoints import compact, direct_read, integrity, packing, steps
from sweep.checkpoints.budget import WriteBudget  # noqa: F401 (re-exported: its users import it from here)
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
    """Orbax's standard handler as sweep tunes it: no zstd, no OCDBT, no copy of host arrays, one
    chunk per array (sweep/internals.py says why; benchmarks/big_state.py measured each)."""
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
        self._keep = policies.AnyPreservationPolicy(keep)
        self._best = (best_fn, "min" if direction == "minimize" else "max")
        self.read_only = read_only
        self._lock = threading.Lock()
        self._manager: Any = None  # Orbax's, made when a step in its layout is written or read (`_orbax`)
        if not read_only:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._raise_disk_fault(exc, None)
                raise
            self._remove_partials()  # a kill -9 mid-save leaves <step>.orbax-checkpoint-tmp or .<step>.compact
        self._faulted = False  # a disk fault cut a save short: close() removes its partial step again
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweep-ckpt")
        self._pending: Future[None] | None = None
        self._writing: int | None = None  # the step the writer is on
        self.written_seconds = 0.0  # the writer thread's time on this folder's saves (the goodput ledger)
        self.last_saved: int | None = steps.newest_step(self.directory)
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

    def _orbax(self) -> Any:
        """Orbax's manager of this folder, made on first use: small states never need it (compact.py)."""
        with self._lock:
            if self._manager is None:
                # Orbax warns that a read-only manager gets save_interval_steps=0, and of compact steps'
                # missing metadata: not messages for a user.
                with _absl_quiet(True):
                    options = ocp.CheckpointManagerOptions(
                        preservation_policy=self._keep, best_fn=self._best[0], best_mode=self._best[1],
                        keep_checkpoints_without_metrics=False,
                        # Our own background thread writes host copies; Orbax's async mode would block the
                        # training thread longer (it serialises device arrays before returning).
                        enable_async_checkpointing=False,
                        cleanup_tmp_directories=False,  # the constructor removed them (`_remove_partials`)
                        create=False, read_only=self.read_only)
                    try:
                        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                                              handler_registry=_handlers())
                    except Exception as exc:
                        self._raise_disk_fault(exc, None)
                        raise
            return self._manager

    def _reload(self) -> None:
        if self._manager is not None:
            self._manager.reload()

    def latest_step(self) -> int | None:
        return steps.newest_step(self.directory)

    def _quarantine_unreadable(self) -> None:
        # Orbax's manager reads every step's metrics when it is constructed (for best_fn), so one
        # corrupt JSON file would make the constructor raise before any restore is tried.
        for entry in _step_dirs(self.directory):
            reason = integrity.readable_metadata(Path(entry.path)) or compact.unreadable(Path(entry.path))
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
                    step_dir = self.directory / str(step)
                    if packed:
                        host = packing.packed_template(tree, host=True)
                        read = compact.read(step_dir, host)
                        if read is None:
                            read = direct_read.read(step_dir / "default", host)
                        if read is None:  # a step of an earlier release: Orbax reads it
                            read = self._orbax().restore(step, args=ocp.args.StandardRestore(host))
                        return packing.unpack(read, tree), tree
                    if not compact.is_compact(step_dir):
                        return self._orbax().restore(step, args=ocp.args.StandardRestore(tree)), None
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
        for step in sorted(steps.kept_steps(self.directory), reverse=True):
            if (limit is not None and step >= limit) or step < self.restore_floor:
                continue
            state = self._verified(step, template)
            if state is None:
                self._reload()
                continue
            best = best_before(step)
            if best is not None and best != step and (best not in steps.kept_steps(self.directory)
                                                      or self._verified(best, template) is None):
                self._reload()
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
        for pattern in ("*.orbax-checkpoint-tmp*", ".*.compact", ".*.removing"):
            for partial in self.directory.glob(pattern):
                shutil.rmtree(partial, ignore_errors=True)

    def _retain(self) -> None:
        """Orbax's preservation policies (latest N, best N) over the folder's steps, after a compact
        step commits (Orbax's manager applies them to the steps it saves itself)."""
        context = policies.PreservationContext()
        compact.retain(self.directory, lambda infos: self._keep.should_preserve(infos, context=context))

    def _write_items(self, items: list[tuple[int, Any, dict[str, float] | None]]) -> None:
        for step, state, metrics in items:
            self._writing = step
            if self.fence is not None:
                self.fence()  # a worker that lost its trial never commits over the new owner's steps
            if self.room is not None:
                self.room(step, sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)))
            # The checksum is durable before the step exists, so a committed step always has one.
            integrity.write_checksum(self.directory, step, integrity.checksum(state, self.checksum_algorithm))
            packed = packing.pack(state)
            if compact.fits(packed):
                integrity.install_step(self.directory, step, lambda tmp: compact.write(tmp, packed, metrics), "compact",
                                       fence=self.fence)
                self._retain()
            else:
                manager = self._orbax()
                manager.save(step, args=ocp.args.StandardSave(packed), metrics=metrics, force=True)
                manager.wait_until_finished()
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
            if self._manager is not None:
                self._manager.close()
        except Exception as exc:
            if disk_errno(exc) is None:
                raise
        finally:
            if self._faulted:  # what writes still in flight at the fault wrote since (see _remove_partials)
                self._remove_partials()

    def all_steps(self) -> list[int]:
        return steps.kept_steps(self.directory)
