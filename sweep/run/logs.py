"""What the user sees on stderr: sweep's own timestamped lines; library noise only with --verbose."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is now: the live progress view swaps it to print above itself."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _Scrubbing(logging.Formatter):
    """Never a storage password on stderr, whatever a library's message says (sweep/study/credentials.py)."""

    def format(self, record: logging.LogRecord) -> str:
        from sweep.study.credentials import scrub

        return scrub(super().format(record))


def setup(quiet: bool = False, verbose: bool = False) -> None:
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(_Scrubbing("[sweep %(asctime)s] %(message)s", "%H:%M:%S"))
    log = logging.getLogger("sweep")
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
    import optuna

    optuna.logging.set_verbosity(logging.INFO if verbose else logging.WARNING)
    # Orbax logs a failed write at ERROR, with its traceback, before raising it; sweep reports it
    # as one line (a full disk, say), so only CRITICAL gets through without --verbose.
    for name in ("absl", "jax", "orbax"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.CRITICAL)
    # Even with --verbose, Orbax's INFO lines (through absl: ~40 per save, "Initiated Pytree
    # async_save", "Finished saving checkpoint", ...) stay out: sweep says each save in one line.
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxChatter) for f in absl.filters):
        absl.addFilter(_OrbaxChatter())
    logging.getLogger("orbax").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    # After a failed Orbax restore, the exception of one of its asyncio tasks may be collected at
    # exit unretrieved, and asyncio logs it with its traceback (at ERROR): the restore error itself
    # is reported to the user, so this echo is library noise too.
    logging.getLogger("asyncio").setLevel(logging.INFO if verbose else logging.CRITICAL)
    route_warnings(verbose, handler)
    if not verbose:
        sys.unraisablehook = _quiet_closed_loop


class _OrbaxChatter(logging.Filter):
    """Drops absl records below WARNING logged from Orbax's modules, and its warning at every save
    that no OCDBT files were found to merge (sweep writes without OCDBT: sweep/checkpoints/folder.py);
    other libraries' absl logs pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        return record.levelno >= logging.WARNING and "Skipping merge of OCDBT" not in str(record.msg)


def route_warnings(verbose: bool, handler: logging.Handler | None = None) -> None:
    """Python warnings of the libraries (Optuna's FutureWarning and ExperimentalWarning, JAX's,
    Orbax's) are library noise like their logs: on stderr with --verbose, otherwise not shown.

    Called by the CLI before anything is imported or opened (a sampler warns as it is built,
    before `setup` runs), and again by `setup` in every process that runs trials (workers)."""
    if handler is None:
        handler = _StderrHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[sweep %(asctime)s] %(message)s", "%H:%M:%S"))
    logging.captureWarnings(True)
    warned = logging.getLogger("py.warnings")
    warned.handlers[:] = [handler]
    warned.propagate = False
    warned.setLevel(logging.WARNING if verbose else logging.CRITICAL)


def _quiet_closed_loop(unraisable: Any) -> None:
    """After a failed Orbax restore, tensorstore's pending callbacks reach Orbax's closed event loop
    and report "RuntimeError: Event loop is closed" as unraisable (from C, another thread). The
    restore error itself is reported to the user; this echo is library noise, shown with --verbose."""
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        logging.getLogger("sweep").debug("ignored library noise: %s", exc)
        return
    sys.__unraisablehook__(unraisable)
