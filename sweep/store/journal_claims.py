"""Claims on a journal storage: who runs which trial, without SQL row locks (issue 41).

The same claims as sweep/store/claims.py's table (a key per claimed trial, a short-lived key per
study that serialises "adopt or ask"), kept as an append-only log of operations beside the study's
journal, written through Optuna's own journal backends: `JournalFileBackend` on `<journal>.claims`
(appends under its lock, which works over NFS: a symlink created atomically) or
`JournalRedisBackend` under its own key prefix. Every process replays the log in the same order,
so all agree on who holds what. The operations:

    take    KEY for OWNER at T, if its holder is PREV   applied iff KEY's holder is PREV when replayed
    release KEY by OWNER                                applied iff OWNER holds KEY
    beat    OWNER at T                                  every key OWNER holds gets heartbeat T

A take succeeds iff the replay applied it: two workers that both saw a key free both append a
take with PREV = none, and only the first in the log applies. That holds whatever the lock does
(Optuna's file lock is released by force after 30 s of a frozen holder: two appends may then
interleave, never merge, since each is one write of one line).

Optuna's journals have no compare-and-set of their own for this (only the WAITING -> RUNNING pop,
per worker): hence this module. The log grows by a beat per worker holding a trial every few
seconds (~100 bytes each: ~350 KB an hour for 8 workers); each process reads it from where it
stopped, and once whole at its start.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import Any, Iterable

from sweep.errors import TakenOver
from sweep.store.claims import (FENCE_REUSE_S, HEARTBEAT_S, LEASE_GRACE_S, AskLock, my_owner, owner_alive,
                                trial_key)
from sweep.store.outage import Outages

log = logging.getLogger("sweep")


class JournalClaims:
    """Claims of one study, held by this process (the interface of claims.Claims)."""

    def __init__(self, backend: Any, study_id: int, grace: float = LEASE_GRACE_S,
                 outages: Outages | None = None) -> None:
        self.backend, self.study_id, self.owner, self.grace = backend, study_id, my_owner(), grace
        self.outages = outages or Outages()
        self.last_beat = time.monotonic()
        self.last_gap = 0.0
        self._checked: dict[str, float] = {}
        self._lock = threading.Lock()  # the replayed state: the run's thread and the heartbeat's
        self._read = 0  # operations replayed so far
        self._holders: dict[str, tuple[str, float]] = {}  # key -> (owner, heartbeat)
        self._applied: set[str] = set()  # ids of this process's takes that the replay applied
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the log -----------------------------------------------------------------------------

    def _sync(self) -> None:
        """Replay the operations appended since the last call (under self._lock)."""
        for op in self.backend.read_logs(self._read):
            self._read += 1
            kind, key = op.get("op"), op.get("key")
            holder = self._holders.get(key)
            if kind == "take" and (holder[0] if holder else None) == op["prev"]:
                self._holders[key] = (op["owner"], op["t"])
                if op["owner"] == self.owner:
                    self._applied.add(op["id"])
            elif kind == "release" and holder is not None and holder[0] == op["owner"]:
                del self._holders[key]
            elif kind == "beat":
                for k, (owner, _) in list(self._holders.items()):
                    if owner == op["owner"]:
                        self._holders[k] = (owner, op["t"])

    def _call(self, fn, *args):
        return self.outages.call(fn, *args, what="claims")

    # --- the interface of claims.Claims ------------------------------------------------------

    def try_take(self, key: str) -> bool:
        """Take `key` if it is free or its owner is dead (compare-and-set on the holder, in log order)."""
        return self._call(self._try_take, key)

    def _try_take(self, key: str) -> bool:
        with self._lock:
            self._sync()
            now = time.time()
            holder = self._holders.get(key)
            if holder is not None and holder[0] != self.owner and owner_alive(holder[0], holder[1], now, self.grace):
                return False
            op_id = uuid.uuid4().hex
            self.backend.append_logs([{"op": "take", "key": key, "owner": self.owner,
                                       "prev": holder[0] if holder else None, "t": now, "id": op_id}])
            self._sync()
            return op_id in self._applied

    def _holder(self, key: str) -> str | None:
        with self._lock:
            self._sync()
            holder = self._holders.get(key)
            return holder[0] if holder else None

    def check(self, key: str, what: str, released_is_mine: bool = False) -> None:
        """The fence before every write for a trial (claims.Claims.check: the same rule).

        Raises:
            TakenOver: another worker holds `key` now; with `released_is_mine` false, also when
                no worker holds it.
        """
        now = time.monotonic()
        if now - self._checked.get(key, -math.inf) < min(self.grace / 4, FENCE_REUSE_S):
            return
        holder = self._call(self._holder, key)
        if holder == self.owner:
            self._checked[key] = now
        elif holder is None and released_is_mine:
            return
        else:
            away = max(time.monotonic() - self.last_beat, self.last_gap)
            raise TakenOver(f"{what} was taken over by {holder.split('/')[0] if holder else 'no one (released)'} "
                            f"while this worker was unresponsive ({away:.0f} s since its last heartbeat); "
                            "leaving it, writing nothing more for it")

    def release(self, key: str) -> None:
        def _release() -> None:
            with self._lock:
                self._sync()
                holder = self._holders.get(key)
                if holder is not None and holder[0] == self.owner:
                    self.backend.append_logs([{"op": "release", "key": key, "owner": self.owner}])
                    self._sync()

        self._call(_release)

    def key(self, number: int) -> str:
        return trial_key(self.study_id, number)

    def live_numbers(self, numbers: Iterable[int]) -> set[int]:
        keys = {self.key(n): n for n in numbers}
        return {keys[k] for k in self.live_owners(keys)}

    def ask_lock(self, poll_s: float = 0.05) -> AskLock:
        return AskLock(self, f"ask:{self.study_id}", poll_s)

    def live_owners(self, keys: Iterable[str]) -> dict[str, str]:
        keys = list(keys)
        if not keys:
            return {}

        def read() -> dict[str, tuple[str, float]]:
            with self._lock:
                self._sync()
                return {k: self._holders[k] for k in keys if k in self._holders}

        held = self._call(read)
        now = time.time()
        return {k: owner for k, (owner, beat) in held.items() if owner_alive(owner, beat, now, self.grace)}

    def start_heartbeat(self) -> None:
        self.stop_heartbeat()
        stop = self._stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(HEARTBEAT_S, self.grace / 4)):
                try:
                    with self._lock:
                        self._sync()
                        if any(owner == self.owner for owner, _ in self._holders.values()):  # else nothing to renew
                            self.backend.append_logs([{"op": "beat", "owner": self.owner, "t": time.time()}])
                    now = time.monotonic()
                    self.last_gap, self.last_beat = now - self.last_beat, now
                except Exception as exc:  # the storage away for a while: next beat; the grace is several beats
                    log.debug("heartbeat failed: %s", exc)

        self._thread = threading.Thread(target=beat, name="sweep-heartbeat", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
