"""Who runs which trial: compare-and-set rows in a small table beside Optuna's.

Optuna has no exclusive claim of a trial (WAITING trials are not claimed atomically on SQLite,
and its heartbeat retry re-creates a crashed trial under a new number), so ownership lives in
`sweep_claims`: one row per claimed trial (key "trial:<study id>:<number>") plus one short-lived row per study
(key "ask:<study id>") that serialises the decision "adopt or ask a new trial". A conditional
UPDATE/unique INSERT works the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from typing import Iterable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from sweep.errors import TakenOver
from sweep.store.outage import Outages

log = logging.getLogger("sweep")

# A worker is "host/pid/start time". SWEEP_HOST overrides the host part where hostnames are not
# unique across the machines sharing a study (and lets tests play several hosts on one machine).
HOST = os.environ.get("SWEEP_HOST") or socket.gethostname()
LEASE_GRACE_S = 60.0  # default: a claim from another host is stale when its heartbeat is older
HEARTBEAT_S = 10.0  # at most; a few beats fit in every lease grace
FENCE_REUSE_S = 5.0  # at most: how long a successful fence check is reused (see Claims.check)

_metadata = sa.MetaData()
claims_table = sa.Table(
    "sweep_claims", _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a live `pid`, so a recycled pid is not taken for the old process.

    A killed process whose parent has not reaped it yet (a zombie, common in containers) is dead.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def my_owner() -> str:
    """host/pid/start time; plus /t<thread id> off the main thread, where one process may run
    several workers (a Dask worker with several threads) that must not share claims."""
    pid = os.getpid()
    thread = "" if threading.current_thread() is threading.main_thread() else f"/t{threading.get_ident()}"
    return f"{HOST}/{pid}/{_start_time(pid)}{thread}"


def owner_alive(owner: str, heartbeat: float, now: float | None = None, grace: float = LEASE_GRACE_S) -> bool:
    """Same host: the owning process still exists. Other host: its lease is fresher than `grace`."""
    host, _, rest = owner.partition("/")
    if host == HOST:
        pid, _, start = rest.partition("/")
        return pid.isdigit() and _start_time(int(pid)) == start.partition("/")[0]
    return (now or time.time()) - heartbeat < grace


class Leases:
    """Claims of one study, held by this process: what every kind of claims shares (the fence's
    rule, liveness, the heartbeat's thread). A member keeps them somewhere (Claims: a table;
    journal_claims.JournalClaims: an operation log) through five methods: `_try_take(key)`,
    `_holder(key)`, `_release(key)`, `_held(keys)` -> [(key, owner, heartbeat)] and `_renew()`."""

    def __init__(self, study_id: int, grace: float = LEASE_GRACE_S, outages: Outages | None = None) -> None:
        self.study_id, self.owner, self.grace = study_id, my_owner(), grace
        self.outages = outages or Outages()
        self.last_beat = time.monotonic()  # when this process last renewed its claims
        self.last_gap = 0.0  # the time between its last two renewals (a freeze shows here)
        self._checked: dict[str, float] = {}  # key -> when `check` last found this process holding it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _retry(self, fn, *args):
        # The storage away for a while (a restart, a failover; SQLite's "database is locked" past its
        # busy timeout under heavy contention): wait for it, as every storage call does.
        return self.outages.call(fn, *args, what="claims")

    def _try_take(self, key: str) -> bool: raise NotImplementedError

    def _holder(self, key: str) -> str | None: raise NotImplementedError

    def _release(self, key: str) -> None: raise NotImplementedError

    def _held(self, keys: list[str]) -> list[tuple[str, str, float]]: raise NotImplementedError

    def _renew(self) -> None: raise NotImplementedError

    def try_take(self, key: str) -> bool:
        """Take `key` if it is free or its owner is dead (compare-and-set on the owner)."""
        return self._retry(self._try_take, key)

    def check(self, key: str, what: str, released_is_mine: bool = False) -> None:
        """The fence before every write for a trial (report, attribute, checkpoint, tell).

        Raises:
            TakenOver: another worker holds `key` now (this one was frozen or cut off for longer
                than the lease grace, and its claim was taken over); with `released_is_mine`
                false, also when no worker holds it.
        """
        # A check stays good for less than the time a takeover needs: the lease runs out only after
        # `grace` without a heartbeat (one every grace / 4), so a worker that held the key at its
        # last check, less than grace / 4 ago, still holds it. A freeze since then makes the
        # interval longer (monotonic time runs on), so the next write checks again.
        now = time.monotonic()
        if now - self._checked.get(key, -math.inf) < min(self.grace / 4, FENCE_REUSE_S):
            return
        holder = self._retry(self._holder, key)
        if holder == self.owner:
            self._checked[key] = now
        elif holder is None and released_is_mine:
            return  # this worker finished the trial and let go; no one else took it
        else:
            away = max(time.monotonic() - self.last_beat, self.last_gap)
            raise TakenOver(f"{what} was taken over by {holder.split('/')[0] if holder else 'no one (released)'} "
                            f"while this worker was unresponsive ({away:.0f} s since its last heartbeat); "
                            "leaving it, writing nothing more for it")

    def release(self, key: str) -> None:
        self._retry(self._release, key)

    def key(self, number: int) -> str:
        """The claim key of trial `number` of this study."""
        return trial_key(self.study_id, number)

    def live_numbers(self, numbers: Iterable[int]) -> set[int]:
        """The trial numbers among `numbers` whose claim's owner is alive."""
        keys = {self.key(n): n for n in numbers}
        return {keys[k] for k in self.live_owners(keys)}

    def ask_lock(self, poll_s: float = 0.05) -> "AskLock":
        return AskLock(self, f"ask:{self.study_id}", poll_s)

    def live_owners(self, keys: Iterable[str]) -> dict[str, str]:
        """key -> owner for the keys whose owner is alive."""
        keys = list(keys)
        if not keys:
            return {}
        rows = self._retry(self._held, keys)
        now = time.time()
        return {key: owner for key, owner, beat in rows if owner_alive(owner, beat, now, self.grace)}

    def start_heartbeat(self) -> None:
        """Renew this process's claims so workers on other hosts see them alive (again after a
        `stop_heartbeat`: a session may run several times)."""
        self.stop_heartbeat()
        stop = self._stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(HEARTBEAT_S, self.grace / 4)):
                try:
                    self._renew()
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


class Claims(Leases):
    """Claims in the `sweep_claims` table beside Optuna's (RDB storages)."""

    def __init__(self, engine: sa.Engine, study_id: int, grace: float = LEASE_GRACE_S,
                 outages: Outages | None = None) -> None:
        super().__init__(study_id, grace, outages)
        self.engine = engine

    @staticmethod
    def create_table(engine: sa.Engine) -> None:
        try:
            _metadata.create_all(engine, checkfirst=True)
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
            # Hosts starting at once on a fresh PostgreSQL database race here: `checkfirst` looks, then
            # creates, and the losers' CREATE TABLE fails (a duplicate pg_type row, or "already exists").
            # The table is there then, made by the winner; anything else is a real error.
            if not sa.inspect(engine).has_table(claims_table.name):
                raise

    def _try_take(self, key: str) -> bool:
        t = claims_table
        now = time.time()
        try:
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(t.c.owner, t.c.heartbeat).where(t.c.key == key)).first()
                if row is None:
                    conn.execute(t.insert().values(key=key, owner=self.owner, heartbeat=now))
                    return True
                if row.owner != self.owner and owner_alive(row.owner, row.heartbeat, now, self.grace):
                    return False
                done = conn.execute(t.update().where(t.c.key == key, t.c.owner == row.owner)
                                    .values(owner=self.owner, heartbeat=now))
                return done.rowcount == 1
        except IntegrityError:  # another process inserted the same key first
            return False

    def _holder(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(claims_table.c.owner).where(claims_table.c.key == key)).scalar()

    def _release(self, key: str) -> None:
        t = claims_table
        with self.engine.begin() as conn:
            conn.execute(t.delete().where(t.c.key == key, t.c.owner == self.owner))

    def _held(self, keys: list[str]) -> list[tuple[str, str, float]]:
        t = claims_table
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(t.c.key, t.c.owner, t.c.heartbeat)
                                                   .where(t.c.key.in_(keys))).all()]

    def _renew(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(claims_table.update().where(claims_table.c.owner == self.owner).values(heartbeat=time.time()))


def trial_key(study_id: int, number: int) -> str:
    # By (study id, number): both are public in Optuna's API, unlike its internal trial id.
    return f"trial:{study_id}:{number}"


class AskLock:
    def __init__(self, claims: Leases, key: str, poll_s: float) -> None:
        self.claims, self.key, self.poll_s = claims, key, poll_s

    def __enter__(self) -> None:
        while not self.claims.try_take(self.key):
            time.sleep(self.poll_s)

    def __exit__(self, *exc: object) -> None:
        self.claims.release(self.key)
