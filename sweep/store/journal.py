"""The storage interface (backend.py) for Optuna's JournalStorage: a study as an append-only log
on a shared filesystem (`journal:///shared/sweeps/digits.log`) or in Redis (`redis://host:6379/0`).

What each guarantee rests on here (docs/shared-filesystem.md says it for users):

- creating, asking, telling, attributes: Optuna's journal. Appends to a file are serialised by
  journal_file.HolderLock (Optuna's symlink lock: a symlink created atomically works over NFS,
  where SQLite's locks do not); in Redis by a Lua script that numbers each entry. Every process replays the same log.
- each enqueued or paused trial runs once: Optuna's WAITING -> RUNNING pop, applied in log order
  (the first pop wins, the others are ignored on replay and told so).
- leases, fencing, the ask lock: journal_claims.py, an operation log beside the journal.
- a finished trial is never changed: Optuna's replay ignores updates of finished trials, so
  `sweep retry` (which reopens a FAIL trial) is refused on a journal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial

from sweep.errors import StudyNotFound, SweepError, UsageError, one_line
from sweep.store.journal_file import file_backend
from sweep.store.outage import Outages, retrying_storage_class
from sweep.study.config import Config
from sweep.study.credentials import mask_url

FILE_SCHEME = "journal://"
REDIS_SCHEMES = ("redis://", "rediss://")
CLAIMS_SUFFIX = ".claims"  # the claims' log beside a journal file
CLAIMS_PREFIX = "sweep-claims"  # ... and in Redis, under its own keys
REDIS_LOG_NUMBER = ":log_number"  # the key of Optuna's JournalRedisBackend (prefix "") that counts its entries

_RetryingJournalStorage = retrying_storage_class(optuna.storages.JournalStorage)


# Journal files replayed by this process, by path: a second session of the same study in one
# process (`run` reads its plan, then runs; `status` reads the study, then the file's changes) goes
# on from the first one's replay (Optuna's JournalStorage reads only what was appended since), not
# from the start (~1 s for 10,000 trials). Only while it is the same file (_same_file).
_OPENED: dict[str, tuple[tuple[int, int, int], Any]] = {}


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size


def _same_file(before: tuple[int, int, int], now: tuple[int, int, int]) -> bool:
    """The same journal: its device and inode, and no shorter (a journal only grows; an inode freed
    and given to a new file under the same name starts empty)."""
    return before[:2] == now[:2] and now[2] >= before[2]


def is_journal(url: str) -> bool:
    return url.startswith((FILE_SCHEME, *REDIS_SCHEMES))


def journal_path(url: str) -> Path | None:
    """The journal file of a `journal://PATH` URL (absolute, or relative to the current folder);
    None for Redis."""
    return Path(url[len(FILE_SCHEME):]) if url.startswith(FILE_SCHEME) else None


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


class _EmptyLog:
    """The claims of a journal no sweep run ever wrote, read where nothing may be created."""

    def read_logs(self, log_number_from: int) -> Any:
        return iter(())

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise SweepError("cannot claim a trial in a journal opened read-only")


class Journal:
    def initialised(self, config: Config) -> bool:
        path = journal_path(config.storage)
        if path is not None:
            return path.is_file() and path.stat().st_size > 0
        try:  # a server away is an outage: waited for, as every storage call
            outages = Outages(config.study.storage_retry_seconds)
            return bool(outages.call(lambda: _redis(config.storage).exists(REDIS_LOG_NUMBER), what="opening the journal"))
        except Exception as exc:  # noqa: BLE001 - away past storage_retry_seconds, a bad address
            raise SweepError(f"cannot open storage {mask_url(config.storage)}: {one_line(exc)}") from None

    def open(self, config: Config, create: bool) -> Any:
        from optuna.storages.journal import JournalRedisBackend

        url, path = config.storage, journal_path(config.storage)
        if path is not None:
            if not path.exists() and not create:
                raise StudyNotFound(f"study {config.name!r} not found: no journal at {path}; run it first")
            if create and not path.exists():
                try:  # the file and its folder, or nothing (a folder it may not write)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.open("ab").close()
                except OSError as exc:
                    raise SweepError(f"cannot create the journal {path} (storage {url}): "
                                     f"{exc.strerror or one_line(exc)}") from None
            identity = _identity(path)
            opened = _OPENED.get(str(path))
            if opened is not None and _same_file(opened[0], identity):  # replayed here before: go on from there
                opened[1].outages = Outages(config.study.storage_retry_seconds)
                _OPENED[str(path)] = (identity, opened[1])
                return opened[1]
            backend: Any = file_backend(path, config.study.storage_retry_seconds)
        else:
            backend = JournalRedisBackend(url)
        outages = Outages(config.study.storage_retry_seconds)
        try:  # the journal is replayed here: Redis may be away
            storage = outages.call(lambda: _RetryingJournalStorage(backend), what="opening the journal")
        except Exception as exc:  # noqa: BLE001 - past the retries, or a journal that does not parse
            raise SweepError(f"cannot open storage {mask_url(url)}: {one_line(exc)}") from None
        storage.outages = outages
        storage.sweep_url = url
        if path is not None:
            _OPENED[str(path)] = (identity, storage)
        return storage

    def _claims_log(self, storage: Any, create: bool) -> Any:
        from optuna.storages.journal import JournalRedisBackend

        path = journal_path(storage.sweep_url)
        if path is None:
            return JournalRedisBackend(storage.sweep_url, prefix=CLAIMS_PREFIX)
        claims = Path(str(path) + CLAIMS_SUFFIX)
        if not claims.exists() and not create:  # a reader creates nothing (the file's owner would be its user)
            return _EmptyLog()
        return file_backend(claims, storage.outages.seconds)

    def prepare(self, storage: Any) -> None:
        self._claims_log(storage, create=True)

    def claims(self, storage: Any, study_id: int, grace: float) -> Any:
        from sweep.store.journal_claims import JournalClaims

        return JournalClaims(self._claims_log(storage, create=False), study_id, grace, outages=storage.outages)

    def has_claims(self, storage: Any) -> bool:
        return True  # a journal's claims log is empty where no sweep run wrote it: no live claim

    def start_warning(self, config: Config) -> str | None:
        return None

    def close(self, storage: Any) -> None:
        pass  # a file is opened per read; Redis's connections close with the process

    # --- readers: Optuna's API (the journal is in memory once replayed) -------------------------

    @staticmethod
    def _trials(storage: Any, study_id: int, warm_key: str, states: Sequence[Any] | None = None) -> list[FrozenTrial]:
        found = storage.get_all_trials(study_id, deepcopy=False, states=tuple(states) if states is not None else None)
        return [t for t in found if warm_key not in t.user_attrs]

    def trial_states(self, storage: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]:
        return [(t.number, t.state) for t in self._trials(storage, study_id, warm_key)]

    def count_trials(self, storage: Any, study_id: int) -> int:
        return len(storage.get_all_trials(study_id, deepcopy=False))

    def user_attr_values(self, storage: Any, study_id: int, keys: Sequence[str],
                         warm_key: str) -> dict[int, dict[str, Any]]:
        return {t.number: {k: t.user_attrs[k] for k in keys if k in t.user_attrs}
                for t in sorted(self._trials(storage, study_id, warm_key), key=lambda t: t.number)}

    def read_trials(self, storage: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                    record: tuple[str, ...]) -> list[FrozenTrial]:
        return list(storage.get_all_trials(study_id, deepcopy=False,
                                           states=tuple(states) if states is not None else None))

    def study_system_attrs(self, storage: Any, study_id: int, prefix: str) -> dict[str, Any]:
        return {k: v for k, v in storage.get_study_system_attrs(study_id).items() if k.startswith(prefix)}

    def check_reopenable(self, storage: Any) -> None:
        raise UsageError(f"retry: not on a journal storage ({mask_url(storage.sweep_url)}): Optuna's journal never "
                         "changes a finished trial, so a FAIL trial cannot run again under its number; a study "
                         "that needs `retry` runs on SQLite or PostgreSQL")


    def reopen_failed(self, storage: Any, study_id: int, number: int, keep_through: int | None,
                      attrs: dict[str, Any]) -> bool:
        self.check_reopenable(storage)
        return False
