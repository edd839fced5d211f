"""Riding out a database that is away for a while: a restart, a failover, a lock held too long.

A database outage is a fault of the machine, not of a trial: every storage call of a worker is
retried with backoff for up to `storage_retry_seconds` (the study file's key), with one warning
line while it waits and one when the database is back; past that the error propagates (exit 1,
the trial stays resumable). SQLAlchemy's pool (`pool_pre_ping`) replaces the dead connections.

Neither Optuna nor SQLAlchemy retries a failed statement (Optuna wraps the error in
StorageInternalError), hence this module. Calls are retried whole: Optuna's writes are upserts
(a report, an attribute, a param) or checked (a tell that already landed is recognised), except
`create_new_trial`, which an outage between its commit and the reply could duplicate (the
duplicate would be an orphaned RUNNING trial that the next worker adopts).
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
import time
from typing import Any, Callable, TypeVar

log = logging.getLogger("sweep")
T = TypeVar("T")

DEFAULT_RETRY_SECONDS = 300.0
# What the drivers say when the server is away, restarting or refusing connections (psycopg,
# SQLite's busy timeout past its limit, MySQL), in the messages SQLAlchemy and Optuna pass on.
_OUTAGE_MARKERS = (
    "server closed the connection", "connection refused", "could not connect", "terminating connection",
    "the database system is shutting down", "the database system is starting up", "connection is closed",
    "ssl connection has been closed", "connection timed out", "database is locked", "lost connection",
    "server has gone away", "consuming input failed", "no connection to the server",
    "lock timeout", "idle-in-transaction timeout", "the connection is lost", "connection is bad",
    "could not receive data from server", "connection reset by peer", "broken pipe",
)  # not psycopg's generic "connection failed:" prefix: a wrong password or database name is not an outage


_REDIS_OUTAGES = ("ConnectionError", "TimeoutError", "BusyLoadingError")
_FILE_OUTAGES = (errno.ENOSPC, errno.EDQUOT, errno.ESTALE)


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) says the database is unreachable rather than the call wrong."""
    from sqlalchemy import exc as sa_exc

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if type(current).__module__.startswith("redis") and type(current).__name__ in _REDIS_OUTAGES:
            return True  # a journal's Redis server away, restarting or loading its data
        if isinstance(current, OSError) and current.errno in _FILE_OUTAGES:
            return True  # a journal file's disk full or over quota, an NFS handle gone stale: waited for
        if isinstance(current, (sa_exc.OperationalError, sa_exc.InterfaceError, ConnectionError)) or \
                type(current).__name__ in ("OperationalError", "InterfaceError", "StorageInternalError"):
            if any(m in str(current).lower() for m in _OUTAGE_MARKERS):
                return True
        current = current.__cause__ or current.__context__
    return False


def storage_fault(exc: BaseException) -> bool:
    """Whether `exc` came from the study's storage (an outage past its retries, a commit that failed)
    rather than from the trial's code: such an error never fails a trial; the run stops, resumable."""
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import SQLAlchemyError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (StorageInternalError, SQLAlchemyError)) or type(current).__module__.startswith("redis"):
            return True
        current = current.__cause__ or current.__context__
    return is_outage(exc)


class Outages:
    """The retry policy of one process: how long to wait, and one warning per outage."""

    def __init__(self, seconds: float = DEFAULT_RETRY_SECONDS) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._down_since: float | None = None

    def call(self, fn: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
        deadline = time.monotonic() + self.seconds
        delay = 0.25
        attempt = 0
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:
                if attempt and _already_done(fn, exc):
                    self._came_back()
                    return True  # type: ignore[return-value]
                if not is_outage(exc) or time.monotonic() + delay > deadline:
                    raise
                self._went_down(exc, what)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                attempt += 1
                continue
            self._came_back()
            return out

    def _went_down(self, exc: BaseException, what: str) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                if "database is locked" in str(exc):
                    # SQLite has no server to end a frozen writer's transaction: say what it likely is.
                    log.warning("the study's SQLite database has been locked by another process for longer than "
                                "its busy timeout%s (a writer frozen or stuck inside a transaction?): waiting for "
                                "it, up to %g s (storage_retry_seconds); many hosts need PostgreSQL",
                                f" during {what}" if what else "", self.seconds)
                    return
                log.warning("the study's database is unreachable%s (%s): waiting for it, up to %g s "
                            "(storage_retry_seconds)", f" during {what}" if what else "", first, self.seconds)

    def _came_back(self) -> None:
        with self._lock:
            if self._down_since is not None:
                log.warning("the study's database is back after %.1f s; going on", time.monotonic() - self._down_since)
                self._down_since = None


def _already_done(fn: Callable[..., Any], exc: BaseException) -> bool:
    """A retried tell whose first attempt landed before the connection broke."""
    from optuna.exceptions import UpdateFinishedTrialError

    return isinstance(exc, UpdateFinishedTrialError) and getattr(fn, "__name__", "") == "set_trial_state_values"


# The storage's calls that sweep (directly, or through optuna.Study / optuna.Trial) makes.
RETRIED = (
    "create_new_study", "get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
    "get_study_user_attrs", "get_study_system_attrs", "set_study_user_attr", "set_study_system_attr",
    "get_all_studies", "create_new_trial", "set_trial_param", "get_trial_param", "set_trial_state_values",
    "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr", "get_trial",
    "get_all_trials", "get_n_trials", "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id",
    "get_best_trial", "get_trial_params", "get_trial_user_attrs", "get_trial_system_attrs",
)


def retrying_storage_class(base: type) -> type:
    """A subclass of Optuna's storage `base` (RDBStorage, JournalStorage) whose calls in RETRIED
    ride out outages (`outages` attribute, set after construction)."""

    def wrap(name: str) -> Callable[..., Any]:
        method = getattr(base, name)

        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            outages = getattr(self, "outages", None)
            if outages is None:
                return method(self, *args, **kwargs)
            bound = functools.partial(method, self)
            bound.__name__ = name  # type: ignore[attr-defined]
            return outages.call(bound, *args, what=name, **kwargs)

        return call

    return type(f"Retrying{base.__name__}", (base,), {name: wrap(name) for name in RETRIED if hasattr(base, name)})
