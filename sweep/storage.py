"""Opening a study's RDB storage: engine settings per database, the workdir lock that serialises
creating it, retries through outages, and loading (or creating) the Optuna study with sweep's
restart-proof sampler. Creation races between processes and hosts are settled here."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import optuna

from sweep import fingerprint
from sweep.config import Config
from sweep.credentials import mask_url
from sweep.errors import StudyNotFound, SweepError
from sweep.outage import Outages, retrying_storage_class
from sweep.samplers import RestartProofSampler, build_pruner, build_sampler

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
        # outage, see sweep/outage.py).
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
    try:
        engine = sa.create_engine(url, **storage_kwargs(url))
    except Exception as exc:  # a missing driver, a malformed URL
        raise SweepError(f"cannot open storage {mask_url(url)}: {exc}") from None
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            if "version_info" not in tables or "alembic_version" not in tables:
                return False
            return conn.exec_driver_sql("SELECT COUNT(*) FROM alembic_version").scalar() > 0
    except sa.exc.SQLAlchemyError as exc:
        raise SweepError(f"cannot open storage {mask_url(url)}: {exc}") from None
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
    try:
        with workdir_lock(config, create):
            if sqlite_path is not None:
                sqlite_path.parent.mkdir(parents=True, exist_ok=True)
            storage = _rdb_storage(url, config.study.storage_retry_seconds)
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


def _rdb_storage(url: str, retry_seconds: float) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage whose calls ride out a database outage of up to `retry_seconds`."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            storage = _RetryingRDBStorage(url, engine_kwargs=storage_kwargs(url))
            storage.outages = Outages(retry_seconds)
            return storage
        except Exception as exc:  # bad host, bad password, missing driver ... or the race above
            if attempt + 1 < OPEN_ATTEMPTS and any(m in f"{type(exc).__name__}: {exc}" for m in _CREATION_RACE):
                time.sleep(0.05 * 2 ** attempt)
                continue
            raise SweepError(f"cannot open storage {mask_url(url)}: {exc}") from None
    raise AssertionError("unreachable")


def load_study(config: Config, storage: optuna.storages.RDBStorage, create: bool) -> optuna.Study:
    directions = [o.direction for o in config.study.all_objectives]
    sampler = RestartProofSampler(build_sampler(config), config.study.sampler.seed)
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
    # A study sweep started refuses the changed objective(s) with the diff (sweep/fingerprint.py).
    if found != directions and fingerprint.STUDY_ATTR not in study.user_attrs:
        said = ("direction {}" if len(found) == 1 else "directions {}").format(", ".join(found))
        raise SweepError(f"study {config.name!r} in {mask_url(config.storage)} was created with {said}, but "
                         f"{config.path} says {', '.join(directions)}")
    return study


# --- restart-proof sampling ----------------------------------------------------------------------
