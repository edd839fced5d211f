"""A journal file on a shared filesystem, written safely: Optuna's JournalFileBackend with whole-line
appends, a torn tail cut away, reads retried, errors as storage faults (`file_backend`), and a
lock that names its holder (`HolderLock`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from optuna.exceptions import StorageInternalError
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from sweep.store.claims import HOST, owner_alive, my_owner
from sweep.store.outage import DEFAULT_RETRY_SECONDS, Outages

LOCK_GRACE_S = 30  # Optuna's: a lock whose holder cannot be checked from here is broken after this long unchanged


class HolderLock(JournalFileSymlinkLock):
    """Optuna's symlink lock (creating a symlink is atomic, over NFS too), whose link names its
    holder (`host/pid/start`) instead of pointing at the journal. A waiter on the holder's host
    breaks the lock of a holder that is gone at once: a worker killed inside its append (kill -9,
    the OOM killer) otherwise stalled every other worker, and the next run, for Optuna's 30 s
    grace. A holder on another host is judged as Optuna does: broken once the link is unchanged for
    LOCK_GRACE_S. Optuna's own links (pointing at the journal) are judged by the grace too."""

    def __init__(self, filepath: str) -> None:
        super().__init__(filepath, grace_period=LOCK_GRACE_S)
        self.me = my_owner()

    def acquire(self) -> bool:
        sleep, seen, since = 0.001, None, time.monotonic()
        while True:
            try:
                os.symlink(self.me, self._lock_file)
                return True
            except FileExistsError:
                pass
            try:
                holder, mtime = os.readlink(self._lock_file), os.lstat(self._lock_file).st_mtime
            except FileNotFoundError:
                continue  # released meanwhile
            if (holder, mtime) != seen:
                seen, since = (holder, mtime), time.monotonic()
            here = holder.startswith(f"{HOST}/") and holder.count("/") >= 2
            if (here and not owner_alive(holder, 0.0)) or time.monotonic() - since > LOCK_GRACE_S:
                self._break(holder)
                sleep = 0.001
                continue
            time.sleep(sleep)
            sleep = min(sleep * 2, 0.25)

    def _break(self, holder: str) -> None:
        """Remove the lock of `holder` (a rename first: of several waiters breaking it, one does)."""
        aside = f"{self._lock_file}.{uuid.uuid4().hex}.broken"
        try:
            os.rename(self._lock_file, aside)
        except FileNotFoundError:
            return
        try:
            taken = os.readlink(aside)
        finally:
            os.unlink(aside)
        if taken != holder:  # a new holder's link, made after the readlink: give it back
            try:
                os.symlink(taken, self._lock_file)
            except FileExistsError:
                pass

    def release(self) -> None:
        try:
            mine = os.readlink(self._lock_file) == self.me
        except OSError:
            mine = False
        if not mine:
            raise RuntimeError("Error: did not possess lock")  # Optuna's words: broken by another host
        os.unlink(self._lock_file)


class SafeFileBackend(JournalFileBackend):
    """Optuna's JournalFileBackend, made safe where Optuna's is not (it writes and reads as ever):

    - appends are whole or nothing: Optuna writes a batch with one buffered write, and a write cut
      short (a full disk, a quota) left half a line that the next append ran on into, making the
      journal unreadable for every process (its reader stops at a line that does not parse). Here a
      failed append is cut back to the size before it (unless another host appended since: its lock
      was broken, see docs/shared-filesystem.md), and a torn last line a killed or crashed writer
      left is cut away before the next append, under the backend's lock (a reader never reads a
      line without its newline, so no process has replayed it);
    - a read that fails for an outage (ESTALE, a full disk) is retried here, not by retrying the
      storage call around it, which would append its entry twice;
    - errors reach sweep as Optuna's StorageInternalError (the cause chained): a fault of the
      storage, never of the trial that was writing.
    """

    def __init__(self, path: Path, retry_seconds: float = DEFAULT_RETRY_SECONDS) -> None:
        super().__init__(str(path), lock_obj=HolderLock(str(path)))
        self.path, self.retry_seconds = path, retry_seconds

    def _error(self, what: str, exc: BaseException) -> StorageInternalError:
        return StorageInternalError(f"cannot {what} the journal {self.path}: {type(exc).__name__}: {exc}")

    def read_logs(self, log_number_from: int) -> Any:
        outages = Outages(self.retry_seconds)
        try:
            return iter(outages.call(lambda: list(super(SafeFileBackend, self).read_logs(log_number_from)),
                                     what="reading the journal"))
        except (OSError, ValueError) as exc:
            raise self._error("read", exc) from exc

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        line = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        wrote = False
        try:
            self._lock.acquire()  # as Optuna's get_lock_file, but a release after a write that landed
            try:              # may fail (the lock was broken meanwhile): the entry is in, go on
                fd = os.open(self._file_path, os.O_RDWR | os.O_APPEND)  # unbuffered: nothing flushed later
                try:
                    _cut_torn_tail(fd)
                    size, done = os.fstat(fd).st_size, 0
                    try:
                        while done < len(line):
                            done += os.write(fd, line[done:])
                        os.fsync(fd)
                        wrote = True
                    except BaseException:
                        if os.fstat(fd).st_size <= size + done:  # no other host appended meanwhile
                            os.ftruncate(fd, size)
                        raise
                finally:
                    os.close(fd)
            finally:
                try:
                    self._lock.release()
                except RuntimeError:  # Optuna's lock, broken by another host while this one held it
                    if not wrote:
                        raise
        except (OSError, RuntimeError) as exc:
            raise self._error("append to", exc) from exc



def file_backend(path: Path, retry_seconds: float = DEFAULT_RETRY_SECONDS) -> SafeFileBackend:
    return SafeFileBackend(path, retry_seconds)


def _cut_torn_tail(fd: int) -> None:
    """Truncate the file after its last newline: a line without one was never completed."""
    end = os.fstat(fd).st_size
    if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
        return
    pos = end
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            os.ftruncate(fd, start + cut + 1)
            return
        pos = start
    os.ftruncate(fd, 0)
