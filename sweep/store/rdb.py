"""Opening a study's RDB storage: engine settings per database, the workdir lock that serialises
creating it, retries through outages, and loading (or creating) the Optuna study with sweep's
restart-proof sampler. Creation races between processes and hosts are settled here."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator, Sequence

import optuna
from optuna.trial import FrozenTrial

from sweep.errors import StudyNotFound, SweepError, one_line
from sweep.store import rdb_tables
from sweep.store.outage import Outages, retrying_storage_class
from sweep.store.samplers import build_pruner, restart_proof
from sweep.study import fingerprint
from sweep.study.config import Config
from sweep.study.credentials import mask_url

SQLITE_TIMEOUT_S = 60


def has_claims(engine: Any) -> bool:
    import sqlalchemy as sa

    return sa.inspect(engine).has_table("sweep_claims")


# --- storage -------------------------------------------------------------------------------------


def storage_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Several processes and a reader (status, optuna-dashboard) share the file: wait for locks.
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    if url.startswith("postgresql"):
        # A frozen worker (SIGSTOP, a paused VM) must not hold a transaction, and with it every row
        # lock other workers wait for, forever: the server ends such a session after a minute, and
        # a statement waiting for a lock gives up after LOCK_TIMEOUT (then it is retried like an
        # outage, see sweep/store/outage.py).
        return {"pool_pre_ping": True,
                "connect_args": {"options": f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_MS} "
                                            f"-c lock_timeout={PG_LOCK_TIMEOUT_MS}"}}
    return {"pool_pre_ping": True}


PG_IDLE_IN_TRANSACTION_MS = 60_000
PG_LOCK_TIMEOUT_MS = 30_000


@contextlib.contextmanager
def workdir_lock(config: Config, create: bool = True) -> Iterator[None]:
    """Serialise opening the study's storage. Optuna 5 races on its schema creation, and even a
    reader's RDBStorage(skip_table_creation=True) stamps Optuna's alembic_version table when it
    finds none, racing with the creator's own stamp; so creators and readers take it. A reader
    (`create` false) creates nothing: no lock file, no lock in a folder it may not write."""
    if create:
        config.workdir.mkdir(parents=True, exist_ok=True)
        fh = open(config.lock_path, "a")
    else:
        try:
            fh = open(config.lock_path, "r")
        except OSError:
            yield
            return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def reader_url(url: str) -> str:
    """The URL a reader opens: a SQLite file in a folder this process cannot write (an archived
    study, a colleague's results, a read-only mount) read-only, since SQLite in WAL mode otherwise
    fails to create its shared-memory file ("unable to open database file"). With that file present
    (a writer may be live) SQLite reads through it (mode=ro); without it the file is read as
    immutable (nothing can be writing through this folder). Any other URL is unchanged."""
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if path is None or path == ":memory:" or os.access(os.path.dirname(path) or ".", os.W_OK):
        return url
    how = "mode=ro" if os.path.exists(path + "-shm") else "immutable=1"
    return f"sqlite:///file:{urllib.parse.quote(path)}?{how}&uri=true"


def sqlite_on_network(config: Config) -> str | None:
    """The warning for an SQLite database on a network filesystem (its locks are unreliable there:
    several hosts can corrupt it), naming the journal storage as the fix; None elsewhere."""
    from sweep.host.filesystems import network_type

    url = config.storage
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return None
    path = Path(url[len("sqlite:///"):])
    kind = network_type(path.parent)
    if kind is None:
        return None
    return (f"the study's SQLite database {path} is on a network filesystem ({kind}), where SQLite's locks are "
            f"unreliable and workers on several hosts can corrupt it: use Optuna's journal storage instead, "
            f"storage: journal://{path.with_suffix('.log')} (docs/shared-filesystem.md)")


def initialised(config: Config) -> bool:
    """Whether the study's storage holds Optuna's schema, completely: a reader must not open one
    that a creator is setting up right now, since RDBStorage would create or stamp the missing
    parts itself, racing with it (PostgreSQL: a unique violation on Optuna's types for one of
    them). The schema's last steps are the version row and Alembic's stamp.

    Raises:
        SweepError: the storage cannot be reached.
    """
    import sqlalchemy as sa

    url = config.storage
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return False  # connecting would create the file
    url = reader_url(url)
    try:
        engine = sa.create_engine(url, **storage_kwargs(url))
    except Exception as exc:  # a missing driver, a malformed URL
        raise SweepError(f"cannot open storage {mask_url(config.storage)}: {one_line(exc)}") from None
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            if "version_info" not in tables or "alembic_version" not in tables:
                return False
            return conn.exec_driver_sql("SELECT COUNT(*) FROM alembic_version").scalar() > 0
    except sa.exc.SQLAlchemyError as exc:
        raise SweepError(f"cannot open storage {mask_url(config.storage)}: {one_line(exc)}") from None
    finally:
        engine.dispose()


def open_storage(config: Config, create: bool) -> optuna.storages.RDBStorage:
    """Open the study's RDB storage, creating it (once, serialised) if `create`.

    SQLite gets WAL once at creation, so readers (status, optuna-dashboard) never block writers.
    A failed open leaves no workdir behind that it created.
    """
    url = config.storage
    sqlite_path = Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None
    if sqlite_path is not None and not sqlite_path.exists() and not create:
        raise StudyNotFound(f"study {config.name!r} not found: no database at {sqlite_path}; run it first")
    had_workdir = config.workdir.exists()
    if create and had_workdir and not os.access(config.workdir, os.W_OK):
        raise SweepError(f"cannot run study {config.name!r}: its workdir {config.workdir} is read-only here (a read-only "
                         "folder or mount); status, plan and export read it as it is")
    try:
        with workdir_lock(config, create):
            if sqlite_path is not None:
                sqlite_path.parent.mkdir(parents=True, exist_ok=True)
            storage = _rdb_storage(url, config.study.storage_retry_seconds, url if create else reader_url(url))
            if sqlite_path is not None and create:
                with storage.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            return storage
    except SweepError:
        if create and not had_workdir:
            shutil.rmtree(config.workdir, ignore_errors=True)
        raise


# Another process (optuna-dashboard, `optuna.load_study`, a worker on another host) may be creating
# Optuna's schema in the same database at the same moment: its tables, types, version row and
# Alembic stamp. The loser of that race gets a unique-key error; opening again finds it complete.
_CREATION_RACE = ("UNIQUE constraint failed", "already exists", "duplicate key", "UniqueViolation",
                  "IntegrityError")
OPEN_ATTEMPTS = 8


_RetryingRDBStorage = retrying_storage_class(optuna.storages.RDBStorage)


def _rdb_storage(url: str, retry_seconds: float, connect: str | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage whose calls ride out a database outage of up to `retry_seconds`
    (connected through `connect`, `url` as a reader opens it, where given)."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            storage = _RetryingRDBStorage(connect or url, engine_kwargs=storage_kwargs(url))
            storage.outages = Outages(retry_seconds)
            return storage
        except Exception as exc:  # bad host, bad password, missing driver ... or the race above
            if attempt + 1 < OPEN_ATTEMPTS and any(m in f"{type(exc).__name__}: {exc}" for m in _CREATION_RACE):
                time.sleep(0.05 * 2 ** attempt)
                continue
            raise SweepError(f"cannot open storage {mask_url(url)}: {one_line(exc)}") from None
    raise AssertionError("unreachable")


def load_study(config: Config, storage: optuna.storages.RDBStorage, create: bool) -> optuna.Study:
    directions = [o.direction for o in config.study.all_objectives]
    sampler = restart_proof(config)
    try:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler,
                                  pruner=build_pruner(config))
    except KeyError:
        if not create:
            raise StudyNotFound(f"study {config.name!r} does not exist in {mask_url(config.storage)}; "
                                "run it first") from None
        with workdir_lock(config):
            study = optuna.create_study(study_name=config.name, storage=storage, sampler=sampler,
                                        pruner=build_pruner(config), directions=directions, load_if_exists=True)
    found = [d.name.lower() for d in study.directions]
    # A study sweep started refuses the changed objective(s) with the diff (sweep/study/fingerprint.py).
    if found != directions and fingerprint.STUDY_ATTR not in study.user_attrs:
        said = ("direction {}" if len(found) == 1 else "directions {}").format(", ".join(found))
        raise SweepError(f"study {config.name!r} in {mask_url(config.storage)} was created with {said}, but "
                         f"{config.path} says {', '.join(directions)}")
    return study


class RDB:
    """The storage interface (backend.py) for Optuna's RDBStorage: any SQLAlchemy URL. Its readers
    query Optuna's tables narrowly (rdb_tables.py)."""

    def initialised(self, config: Config) -> bool:
        return initialised(config)

    def open(self, config: Config, create: bool) -> optuna.storages.RDBStorage:
        return open_storage(config, create)

    def prepare(self, storage: Any) -> None:
        from sweep.store.claims import Claims

        Claims.create_table(storage.engine)

    def claims(self, storage: Any, study_id: int, grace: float) -> Any:
        from sweep.store.claims import Claims

        return Claims(storage.engine, study_id, grace, outages=storage.outages)

    def has_claims(self, storage: Any) -> bool:
        return has_claims(storage.engine)

    def start_warning(self, config: Config) -> str | None:
        return sqlite_on_network(config)

    def close(self, storage: Any) -> None:
        storage.engine.dispose()

    def trial_states(self, storage: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]:
        return rdb_tables.trial_states(storage.engine, study_id, warm_key)

    def count_trials(self, storage: Any, study_id: int) -> int:
        return rdb_tables.count_trials(storage.engine, study_id)

    def user_attr_values(self, storage: Any, study_id: int, keys: Sequence[str],
                         warm_key: str) -> dict[int, dict[str, Any]]:
        return rdb_tables.user_attr_values(storage.engine, study_id, keys, warm_key)

    def read_trials(self, storage: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                    record: tuple[str, ...]) -> list[FrozenTrial]:
        return rdb_tables.read_trials(storage.engine, study_id, states, prefix, record)

    def study_system_attrs(self, storage: Any, study_id: int, prefix: str) -> dict[str, Any]:
        return rdb_tables.study_system_attrs(storage.engine, study_id, prefix)

    def check_reopenable(self, storage: Any) -> None:
        pass  # the one write sweep makes to Optuna's tables itself (rdb_tables.reopen_failed)

    def reopen_failed(self, storage: Any, study_id: int, number: int, keep_through: int | None,
                      attrs: dict[str, Any]) -> bool:
        return rdb_tables.reopen_failed(storage.engine, study_id, number, keep_through, attrs)
