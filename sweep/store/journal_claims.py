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

import threading
import time
import uuid
from typing import Any

from sweep.store.claims import LEASE_GRACE_S, Leases, owner_alive
from sweep.store.outage import Outages


class JournalClaims(Leases):
    """Claims kept as an operation log beside a journal (claims.Leases: the rest)."""

    def __init__(self, backend: Any, study_id: int, grace: float = LEASE_GRACE_S,
                 outages: Outages | None = None) -> None:
        super().__init__(study_id, grace, outages)
        self.backend = backend
        self._lock = threading.Lock()  # the replayed state: the run's thread and the heartbeat's
        self._read = 0  # operations replayed so far
        self._holders: dict[str, tuple[str, float]] = {}  # key -> (owner, heartbeat)
        self._applied: set[str] = set()  # ids of this process's takes that the replay applied

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

    def _release(self, key: str) -> None:
        with self._lock:
            self._sync()
            holder = self._holders.get(key)
            if holder is not None and holder[0] == self.owner:
                self.backend.append_logs([{"op": "release", "key": key, "owner": self.owner}])
                self._sync()

    def _held(self, keys: list[str]) -> list[tuple[str, str, float]]:
        with self._lock:
            self._sync()
            return [(k, *self._holders[k]) for k in keys if k in self._holders]

    def _renew(self) -> None:
        with self._lock:
            self._sync()
            if any(owner == self.owner for owner, _ in self._holders.values()):  # else nothing to renew
                self.backend.append_logs([{"op": "beat", "owner": self.owner, "t": time.time()}])
