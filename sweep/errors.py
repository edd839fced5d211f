"""Exceptions that the CLI maps to exit codes and one-line messages, and `disk_errno`: which errors are the disk's."""

from __future__ import annotations

import errno
import re


class SweepError(Exception):
    """An error the user can act on; the CLI prints it without a traceback (exit 1)."""

    exit_code = 1


class StudyNotFound(SweepError):
    """A reader asked for a study that does not exist (yet)."""


class ConfigError(SweepError, ValueError):
    """A study file breaks one of its rules (docs/reference.md, "The study file"): exit 2, nothing written."""

    exit_code = 2

    def __init__(self, file: str, key: str, rule: str, value: object = ...) -> None:
        self.file, self.key, self.rule, self.value = file, key, rule, value
        where = f"{file}: {_printable(key)}: " if key else f"{file}: "
        got = "" if value is ... else f", got {_shown(value)}"
        super().__init__(f"{where}{rule}{got}")


def one_line(exc: BaseException) -> str:
    """`exc` as one line: a database driver's own message where SQLAlchemy wrapped one (its text adds
    "[SQL: ...]" and "(Background on this error at: ...)" lines), else the message's first line."""
    orig = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError: the driver's exception
    text = str(orig if isinstance(orig, BaseException) else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _printable(text: str) -> str:
    """`text` on one printable line: a key may hold a newline or a lone surrogate (YAML "\ud800")."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _shown(value: object, limit: int = 200) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit limit for str()
        return f"<{type(value).__name__}>"
    return _printable(text if len(text) <= limit else text[:limit] + "...")


class UsageError(SweepError):
    """Bad command-line usage (exit 2)."""

    exit_code = 2


class Interrupted(SweepError):
    """SIGTERM/SIGINT arrived: running trials were checkpointed and left resumable."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}; run the same command to resume")

    def __reduce__(self) -> tuple[type, tuple[int]]:  # raised in a worker process, re-raised here
        return (Interrupted, (self.signum,))


class NonFiniteMetric(SweepError):
    """A trial reported NaN/inf: deterministic, so it fails at once (no retry)."""


class DiskFault(SweepError):
    """The checkpoint disk failed (full, read-only, quota, I/O error): the machine's fault, not the
    trial's. The run stops (exit 1); the trial stays resumable, its committed steps intact."""


class TakenOver(SweepError):
    """This worker lost its trial: it was unresponsive (frozen, cut off) past the lease grace and
    another worker took the trial over. The worker leaves it alone, writing nothing more for it."""


class RemoteFault(DiskFault):
    """The remote tier (checkpoint.remote) cannot be read: exit 1, the trial stays resumable."""


class CheckpointsRemoved(SweepError):
    """The trial's checkpoints were removed by the study's disk budget (`checkpoint.keep_trials`,
    `checkpoint.max_disk`): its record stays, its weights are gone. Exit 1 on the command line."""


# Errors of the disk, not of the trial: they stop the run and leave the trial resumable.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # how tensorstore (Orbax's array writer) says it


def disk_errno(exc: BaseException) -> int | None:
    """The errno of a disk fault in `exc` or its causes (OSError, or tensorstore's message)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return exc.errno
        code = _OS_ERROR_CODE.search(str(exc))
        if code and int(code.group(1)) in DISK_ERRNOS:
            return int(code.group(1))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None
