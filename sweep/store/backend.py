"""The storage interface: what the study session (session.py) needs of a kind of storage, one
member per kind, so the session never asks which one it holds.

- `rdb.RDB`: Optuna's RDBStorage (SQLite, PostgreSQL, MySQL: any SQLAlchemy URL). Claims are a
  table beside Optuna's; the readers of big studies query Optuna's tables narrowly.
- `journal.Journal`: Optuna's JournalStorage on a file (`journal:///path/study.log`, for clusters
  that share only a filesystem) or in Redis (`redis://host:6379/0`). Claims are an operation log
  beside the journal (journal_claims.py); readers use Optuna's API (the journal is in memory once
  replayed).

Both give the storage an `outages` attribute (outage.py): its calls ride out an outage.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from optuna.trial import FrozenTrial

from sweep.study.config import Config


class Backend(Protocol):
    def initialised(self, config: Config) -> bool:
        """Whether the study's storage exists and is complete (a reader opens nothing else)."""

    def open(self, config: Config, create: bool) -> Any:
        """Optuna's storage of the study, created (once, serialised) if `create`; StudyNotFound where
        it does not exist and not `create`; SweepError (one line) where it cannot be opened."""

    def prepare(self, storage: Any) -> None:
        """What a creator sets up beside Optuna's storage (the claims)."""

    def claims(self, storage: Any, study_id: int, grace: float) -> Any:
        """The study's claims (the interface of claims.Claims)."""

    def has_claims(self, storage: Any) -> bool:
        """Whether sweep ever ran this storage (a study Optuna alone wrote has no claims)."""

    def start_warning(self, config: Config) -> str | None:
        """One line `run` warns with at start about where this storage is (None: nothing to say)."""

    def close(self, storage: Any) -> None: ...

    # The readers' narrow reads: of every trial but those with the user attribute `warm_key`.
    def trial_states(self, storage: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]: ...

    def count_trials(self, storage: Any, study_id: int) -> int: ...

    def user_attr_values(self, storage: Any, study_id: int, keys: Sequence[str],
                         warm_key: str) -> dict[int, dict[str, Any]]: ...

    def read_trials(self, storage: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                    record: tuple[str, ...]) -> list[FrozenTrial]: ...

    def study_system_attrs(self, storage: Any, study_id: int, prefix: str) -> dict[str, Any]: ...

    def check_reopenable(self, storage: Any) -> None:
        """Raise UsageError where the storage never changes a finished trial (`retry` is refused)."""

    def reopen_failed(self, storage: Any, study_id: int, number: int, keep_through: int | None,
                      attrs: dict[str, Any]) -> bool:
        """FAIL trial `number` back to RUNNING with its retry's record (rdb_tables.reopen_failed);
        False where it is no FAIL trial (anymore)."""


def backend_for(url: str) -> Backend:
    from sweep.store import journal, rdb

    return journal.Journal() if journal.is_journal(url) else rdb.RDB()
