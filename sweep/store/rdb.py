"""Opening a study's RDB storage: engine settings per database, the workdir lock that serialises
creating it, retries through outages, and loading (or creating) the Optuna study with sweep's
restart-proof sampler. Creation races between processes and hosts are settled here."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.errors import StudyNotFound, SweepError, one_line
from sweep.store.outage import Outages, retrying_storage_class
from sweep.store.record import EVAL_ATTR_PREFIX
from sweep.store.samplers import RestartProofSampler, build_pruner, build_sampler
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
    # A study sweep started refuses the changed objective(s) with the diff (sweep/study/fingerprint.py).
    if found != directions and fingerprint.STUDY_ATTR not in study.user_attrs:
        said = ("direction {}" if len(found) == 1 else "directions {}").format(", ".join(found))
        raise SweepError(f"study {config.name!r} in {mask_url(config.storage)} was created with {said}, but "
                         f"{config.path} says {', '.join(directions)}")
    return study


# --- narrow reads of Optuna's tables -------------------------------------------------------------
# Optuna's versioned RDB schema, read with SQLAlchemy Core: get_all_trials builds every trial
# through the ORM with all of its rows (~17 s for 10,000 trials of 20 evaluations each), where
# sweep's readers need a few columns, or each trial's record without its per-step rows.


def _tables() -> tuple[Any, ...]:
    from sweep.internals import (
        trial_tables,  # Optuna's schema is private (sweep/internals.py)
    )

    return trial_tables()


def _not_warm(t: Any, attrs: Any, warm_key: str) -> Any:
    """The condition: the trial row of `t` has no user attribute `warm_key` (a warm-start observation)."""
    import sqlalchemy as sa

    return ~sa.exists(sa.select(attrs.c.trial_id).where(attrs.c.trial_id == t.c.trial_id, attrs.c.key == warm_key))


def trial_states(engine: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]:
    """(number, state) of every trial of the study but those with the user attribute `warm_key`."""
    import sqlalchemy as sa

    t, _, _, _, attrs, _ = _tables()
    with engine.connect() as conn:
        return conn.execute(sa.select(t.c.number, t.c.state).where(t.c.study_id == study_id,
                                                                   _not_warm(t, attrs, warm_key))).all()


def count_trials(engine: Any, study_id: int) -> int:
    """The study's trials, all of them (Optuna's get_n_trials loads every one to count them)."""
    import sqlalchemy as sa

    t = _tables()[0]
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(t).where(t.c.study_id == study_id)).scalar()


def user_attr_values(engine: Any, study_id: int, keys: Sequence[str], warm_key: str) -> dict[int, dict[str, Any]]:
    """number -> {key: value} of the user attributes named `keys` of every trial of the study
    (each trial, also one without any of them), but those with the user attribute `warm_key`."""
    import sqlalchemy as sa

    t, _, _, _, attrs, _ = _tables()
    with engine.connect() as conn:
        numbers = conn.execute(sa.select(t.c.trial_id, t.c.number).where(t.c.study_id == study_id,
                                                                         _not_warm(t, attrs, warm_key))).all()
        ids = sa.select(t.c.trial_id).where(t.c.study_id == study_id)
        rows = conn.execute(sa.select(attrs.c.trial_id, attrs.c.key, attrs.c.value_json).where(
            attrs.c.trial_id.in_(ids), attrs.c.key.in_(list(keys)))).all()
    by_id: dict[int, dict[str, Any]] = {tid: {} for tid, _ in numbers}
    for (tid, key, _), value in zip(rows, json.loads(f"[{','.join(row[2] for row in rows)}]")):
        if tid in by_id:
            by_id[tid][key] = value
    return {number: by_id[tid] for tid, number in sorted(numbers, key=lambda r: r[1])}


def read_trials(engine: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                record: tuple[str, ...]) -> list[FrozenTrial]:
    """The study's trials (of `states`) as Optuna's get_all_trials builds them, but narrow where a
    trial has every user attribute of `record` (sweep's best_step, best_value, last_step: it
    finished with its record): of its per-step rows, the user attributes starting with `prefix`
    (`eval:<step>`) and its intermediate values, only those at its best step (`record[0]`). A trial
    without them (running, failed, not sweep's) comes whole: its best is worked out from those rows."""
    import sqlalchemy as sa
    from optuna import distributions as dist_lib

    from sweep.internals import stored_intermediate_value, stored_value

    t, params, values, inter, attrs, sysattrs = _tables()
    where = [t.c.study_id == study_id] + ([t.c.state.in_(list(states))] if states is not None else [])
    ids = sa.select(t.c.trial_id).where(*where)
    rec, per, held = attrs.alias("rec"), attrs.alias("per"), attrs.alias("held")
    n_record = (sa.select(sa.func.count()).where(held.c.trial_id == t.c.trial_id, held.c.key.in_(record))
                .correlate(t).scalar_subquery())
    whole = sa.select(t.c.trial_id).where(*where, n_record != len(record))  # trials without their record
    # the best step of each trial with its record: its `eval:<step>` row and its report at that step
    best = sa.select(rec.c.trial_id, rec.c.value_json.label("step")).where(
        rec.c.key == record[0], rec.c.trial_id.in_(sa.select(t.c.trial_id).where(*where, n_record == len(record))))
    best = best.subquery()
    is_eval = attrs.c.key.startswith(prefix, autoescape=True)
    with engine.connect() as conn:
        found = conn.execute(sa.select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
                                       t.c.datetime_complete).where(*where).order_by(t.c.trial_id)).all()
        param_rows = conn.execute(sa.select(params.c.trial_id, params.c.param_name, params.c.param_value,
                                            params.c.distribution_json).where(params.c.trial_id.in_(ids))
                                  .order_by(params.c.param_id)).all()
        value_rows = conn.execute(sa.select(values.c.trial_id, values.c.objective, values.c.value,
                                            values.c.value_type).where(values.c.trial_id.in_(ids))).all()
        inter_cols = (inter.c.trial_id, inter.c.step, inter.c.intermediate_value, inter.c.intermediate_value_type)
        inter_rows = conn.execute(sa.select(*inter_cols).where(inter.c.trial_id.in_(whole))).all()
        inter_rows += conn.execute(sa.select(*inter_cols).join(best, sa.and_(
            best.c.trial_id == inter.c.trial_id, sa.cast(inter.c.step, sa.String) == best.c.step))).all()
        attr_rows = conn.execute(sa.select(attrs.c.trial_id, attrs.c.key, attrs.c.value_json).where(
            attrs.c.trial_id.in_(ids), sa.or_(~is_eval, attrs.c.trial_id.in_(whole)))).all()
        attr_rows += conn.execute(sa.select(per.c.trial_id, per.c.key, per.c.value_json).join(best, sa.and_(
            per.c.trial_id == best.c.trial_id, per.c.key == sa.literal(prefix) + best.c.step))).all()
        sys_rows = conn.execute(sa.select(sysattrs.c.trial_id, sysattrs.c.key, sysattrs.c.value_json).where(
            sysattrs.c.trial_id.in_(ids)).order_by(sysattrs.c.trial_system_attribute_id)).all()
    parts: dict[int, dict[str, Any]] = {row[0]: {"params": {}, "dists": {}, "values": {}, "inter": {}, "user": {},
                                                 "system": {}} for row in found}
    dists: dict[str, Any] = {}  # distribution JSON -> distribution (the same few for every trial)
    for tid, name, value, js in param_rows:
        d = dists.get(js) or dists.setdefault(js, dist_lib.json_to_distribution(js))
        parts[tid]["params"][name] = d.to_external_repr(value)
        parts[tid]["dists"][name] = d
    for tid, objective, value, kind in value_rows:
        parts[tid]["values"][objective] = stored_value(value, kind)
    for tid, s, value, kind in inter_rows:
        parts[tid]["inter"][s] = stored_intermediate_value(value, kind)
    for table, rows in (("user", attr_rows), ("system", sys_rows)):
        decoded = json.loads(f"[{','.join(row[2] for row in rows)}]")  # one call: ~3x quicker than one a row
        for (tid, key, _), value in zip(rows, decoded):
            parts[tid][table][key] = value
    out = []
    for tid, number, state, start, complete in found:
        state = state if isinstance(state, TrialState) else TrialState[state]
        p = parts[tid]
        vals = [p["values"][k] for k in sorted(p["values"])] if p["values"] else None
        out.append(FrozenTrial(number=number, state=state, value=None, values=vals, datetime_start=start,
                               datetime_complete=complete, params=p["params"], distributions=p["dists"],
                               user_attrs=p["user"], system_attrs=p["system"], intermediate_values=p["inter"],
                               trial_id=tid))
    return out


def study_system_attrs(engine: Any, study_id: int, prefix: str) -> dict[str, Any]:
    """The study's system attributes whose key starts with `prefix` (Optuna's reader loads them all:
    in a study of thousands of trials, every dashboard note's pieces)."""
    import sqlalchemy as sa

    from sweep.internals import study_system_attr_table

    a = study_system_attr_table()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(a.c.key, a.c.value_json).where(
            a.c.study_id == study_id, a.c.key.startswith(prefix, autoescape=True))).all()
    return {key: json.loads(value) for key, value in rows}


# --- the one write sweep makes to Optuna's tables itself ------------------------------------------


def reopen_failed(engine: Any, study_id: int, number: int, keep_through: int | None, attrs: dict[str, Any]) -> bool:
    """FAIL trial `number` back to RUNNING (no worker holds it: `run` resumes it as an interrupted
    trial), in one transaction with its user attributes `attrs` (its retry's record: a kill never
    leaves it reopened without them) and the removal of its reports and `eval:<step>` rows past step
    `keep_through` (all of them where None): a retry trains those steps again, maybe with fixed code,
    and Optuna keeps a step's first report. False where it is no FAIL trial (anymore: the update is
    conditional, so of two retries at once one reopens it). Optuna has no API for this: its storage
    never changes a finished trial."""
    import sqlalchemy as sa
    from optuna.trial import TrialState

    t, _, _, inter, user, _ = _tables()
    with engine.begin() as conn:
        trial_id = conn.execute(sa.select(t.c.trial_id).where(t.c.study_id == study_id, t.c.number == number)).scalar()
        if trial_id is None or conn.execute(t.update().where(t.c.trial_id == trial_id, t.c.state == TrialState.FAIL)
                                            .values(state=TrialState.RUNNING, datetime_complete=None)).rowcount != 1:
            return False
        floor = -1 if keep_through is None else keep_through
        conn.execute(inter.delete().where(inter.c.trial_id == trial_id, inter.c.step > floor))
        stale = [key for key in conn.execute(sa.select(user.c.key).where(
            user.c.trial_id == trial_id, user.c.key.like(f"{EVAL_ATTR_PREFIX}%"))).scalars()
            if int(key[len(EVAL_ATTR_PREFIX):]) > floor]
        conn.execute(user.delete().where(user.c.trial_id == trial_id, user.c.key.in_([*stale, *attrs])))
        conn.execute(user.insert(), [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                     for k, v in attrs.items()])
    return True


class RDB:
    """The storage contract (backend.py) for Optuna's RDBStorage: any SQLAlchemy URL."""

    kind = "database"

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

    def close(self, storage: Any) -> None:
        storage.engine.dispose()

    def trial_states(self, storage: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]:
        return trial_states(storage.engine, study_id, warm_key)

    def count_trials(self, storage: Any, study_id: int) -> int:
        return count_trials(storage.engine, study_id)

    def user_attr_values(self, storage: Any, study_id: int, keys: Sequence[str],
                         warm_key: str) -> dict[int, dict[str, Any]]:
        return user_attr_values(storage.engine, study_id, keys, warm_key)

    def read_trials(self, storage: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                    record: tuple[str, ...]) -> list[FrozenTrial]:
        return read_trials(storage.engine, study_id, states, prefix, record)

    def study_system_attrs(self, storage: Any, study_id: int, prefix: str) -> dict[str, Any]:
        return study_system_attrs(storage.engine, study_id, prefix)

    def reopen_failed(self, storage: Any, study_id: int, number: int, keep_through: int | None,
                      attrs: dict[str, Any]) -> bool:
        return reopen_failed(storage.engine, study_id, number, keep_through, attrs)
