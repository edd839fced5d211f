"""What a trial's own code may not do to the process that runs it: exit it, write on its stdout,
hang in `data()`, or keep it alive with threads.

A trial's code runs inside sweep's process (the CLI, or a worker): `sys.exit(3)` or `os._exit(3)`
in `data()` or in `loss` while it is traced would end the run (and every trial of a worker) with
no word, a `data()` that hangs would hang it, and a `print` would land between the lines of
`status --json` or the run's summary. Inside `guarded()`, the trial's prints go to stderr and an
exit becomes `TrialExit`, a failure of that trial (retried, then FAIL) or, in the checks before a
run, an error of the study (exit 2). `call_with_timeout` bounds `data()`.

Imports neither optuna nor jax.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator

from sweep.errors import SweepError
from sweep.trial.code import is_own_code

_REAL_EXIT = os._exit
_guards = 0  # guarded() blocks open in this process (workers' threads may nest them)
_lock = threading.Lock()


class TrialExit(SweepError):
    """The trial's code called sys.exit or os._exit: a failure of the trial, not the end of the run."""


class DataTimeout(SweepError):
    """The trial's `data()` did not return within data_timeout_seconds."""


class _Stderr:
    """sys.stdout while trial code runs: whatever sys.stderr is now (the progress view swaps it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stderr, name)


def _exit(code: int) -> None:
    """os._exit while a guard is open: the trial's own code (a module of the trial, not sweep nor a
    library) gets TrialExit; everyone else (sweep's grace timer, a library) exits as asked."""
    caller = sys._getframe(1).f_code.co_filename  # noqa: SLF001 - who called is the whole question
    if is_own_code(caller):
        raise TrialExit(f"the trial's code called os._exit({code!r}) (in {os.path.basename(caller)})")
    _REAL_EXIT(code)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run trial code: its stdout goes to stderr; sys.exit and os._exit in it raise TrialExit."""
    global _guards
    with _lock:
        _guards += 1
        os._exit = _exit
    try:
        with contextlib.redirect_stdout(_Stderr()):  # type: ignore[type-var]
            yield
    except SystemExit as exc:
        raise TrialExit(exit_message(exc)) from None
    finally:
        with _lock:
            _guards -= 1
            if _guards == 0:
                os._exit = _REAL_EXIT


def exit_message(exc: SystemExit) -> str:
    return f"the trial's code called sys.exit({exc.code!r})"


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, what: str) -> Any:
    """`fn()`, or DataTimeout once it ran `timeout` seconds: it then goes on in a daemon thread that
    nobody waits for (Python cannot stop a thread), and the trial fails without it."""
    if timeout is None:
        return fn()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name=f"sweep-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise DataTimeout(f"{what} did not return within {timeout:g} s (data_timeout_seconds); it is left "
                          "running, unwaited for")
    if "error" in result:
        raise result["error"]
    return result["value"]


# How long the threads a check finds may take to end on their own before they count as left running.
# Orbax runs each of its coroutines in a fresh event loop that it closes without waiting for the loop's
# executor thread (`asyncio_0`): told to stop, that thread is still ending when a save or restore has
# returned, and on a loaded machine it may not have been scheduled yet when the check looks.
SETTLE_SECONDS = 2.0


def leftover_threads(before: set[threading.Thread] | None = None,
                     settle: float = SETTLE_SECONDS) -> list[threading.Thread]:
    """Non-daemon threads alive now (and not in `before`), the main thread aside, that do not end
    within `settle` seconds: Python waits for each at exit, so one the trial's code left running
    would keep the process alive forever. Threads already ending (a library's executor, told to
    stop) are waited for, not counted; the wait costs nothing when no thread is found."""
    main = threading.main_thread()
    found = [t for t in threading.enumerate()
             if t is not main and not t.daemon and t.is_alive() and (before is None or t not in before)]
    deadline = time.monotonic() + settle
    for thread in found:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in found if t.is_alive()]


def exit_now(code: int) -> None:
    """Exit with `code` without waiting for the threads the trial's code left running."""
    threads = leftover_threads()
    if threads:
        print(f"sweep: not waiting for {len(threads)} {'thread' if len(threads) == 1 else 'threads'} the trial's code left running "
              f"({', '.join(t.name for t in threads[:5])})", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        _REAL_EXIT(code)
    sys.exit(code)
