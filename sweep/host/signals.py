"""SIGTERM/SIGINT as a flag the training loop checks, with a grace period that bounds the exit."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from sweep.errors import Interrupted, UsageError

log = logging.getLogger("sweep")

# The grace period where the study file gives none. No platform tells the process its grace in a form
# that can be read reliably (docs/faults.md): SLURM puts `--signal`'s lead time in no environment
# variable, and spot VMs say nothing. A job script that knows it says it in GRACE_ENV.
DEFAULT_GRACE_SECONDS = 30.0
GRACE_ENV = "SWEEP_GRACE_SECONDS"


def grace_seconds(given: float | None) -> float:
    """The grace period in force: `given` (checkpoint.grace_seconds), else $SWEEP_GRACE_SECONDS, else 30 s.

    Raises:
        UsageError: $SWEEP_GRACE_SECONDS is not a number of seconds > 0.
    """
    if given is not None:
        return given
    text = os.environ.get(GRACE_ENV)
    if text is None:
        return DEFAULT_GRACE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"${GRACE_ENV}: must be seconds > 0 (the grace period after SIGTERM), got {text!r}")
    return value


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks after every window; a second SIGINT exits at once.

    `install()` takes over the two signals (main thread only) and `restore()` gives the previous
    handlers back, so a study run from Python leaves the process's signal handling as it found it.

    Python runs a signal handler in the main thread between bytecodes, so not while that thread
    is inside a long C++ call such as an XLA compile (minutes for a big model): the handler would
    only run, and the grace period only start, once the compile returned. So the signal is also
    seen at once by a watcher thread, woken through `signal.set_wakeup_fd`, which logs it and
    starts the grace period. Where every trial of the process is still starting up (building its
    state, restoring, compiling: no step trained since its newest checkpoint), nothing new can be
    saved, and with `quick_exit` the process exits right away (128 + signum) instead of waiting
    for the compile; each trial resumes from its newest checkpoint.
    """

    def __init__(self, grace: float | None = None, hard_exit: bool = True, quick_exit: bool = False) -> None:
        self.signum: int | None = None
        self.grace_seconds = grace_seconds(grace)  # None: the platform's (`grace_seconds`)
        self.slow_save_said = False  # a save longer than the grace is said once per process
        # The CLI exits the process on a second Ctrl-C or past the grace period; a Python caller
        # (a notebook kernel) gets KeyboardInterrupt and an error line instead.
        self.hard_exit = hard_exit
        # Exit at once where nothing new can be saved (a one-process CLI run: no helper process
        # or thread whose trials would be cut off with it).
        self.quick_exit = quick_exit and hard_exit
        self._previous: dict[int, Any] = {}
        self._timers: list[threading.Timer] = []
        self._since: float | None = None  # monotonic time of the first signal
        self._lock = threading.RLock()  # the handler may run in the main thread while it holds it
        # Each signal reaches both the watcher (a byte on the wakeup socket) and the handler;
        # it is acted on by whichever comes first, once.
        self._seen = {"watcher": 0, "handler": 0}
        self._acted = 0
        self._second_sigint = False
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_fd: int | None = None
        # trial number -> the step it resumes from (None: its newest checkpoint) while it has
        # trained nothing new in this run; the trials that have
        self._starting: dict[int, int | None] = {}
        self._training: set[int] = set()

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._wakeup = (reader, writer)
        self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(reader,), name="sweep-signal-watch", daemon=True).start()

    def restore(self) -> None:
        """Give back the previous handlers; cancel the grace timer of a signal already handled (the
        run is over: a Python caller that catches `Interrupted` goes on living)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
            reader, writer = self._wakeup
            self._wakeup = None
            writer.close()  # the watcher reads end-of-file and returns
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    # --- what the training loop says --------------------------------------------------------

    def trial_starting(self, number: int, step: int | None = None) -> None:
        """Trial `number` is starting up in this process: nothing trained since `step` (its
        newest checkpoint; None before it was restored)."""
        with self._lock:
            self._training.discard(number)
            self._starting[number] = step

    def trial_trained(self, number: int) -> None:
        """Trial `number` trained a step in this run: a signal now saves it (never a quick exit)."""
        with self._lock:
            self._starting.pop(number, None)
            self._training.add(number)

    def trial_ended(self, number: int) -> None:
        with self._lock:
            self._starting.pop(number, None)
            self._training.discard(number)

    # --- signals -------------------------------------------------------------------------------

    def _watch(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                reader.close()
                return
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self._received(signum, "watcher")

    def _handle(self, signum: int, frame: Any) -> None:
        self._received(signum, "handler")
        if self._second_sigint and not self.hard_exit:
            self._second_sigint = False
            raise KeyboardInterrupt

    def _received(self, signum: int, by: str) -> None:
        with self._lock:
            self._seen[by] += 1
            if self._seen[by] <= self._acted:
                return  # the other path acted on this signal already
            self._acted += 1
            first = self.signum is None
            if first:
                self.signum = signum
                self._since = time.monotonic()
            starting = self._nothing_to_save()
        if not first:
            if signum == signal.SIGINT:
                # Second Ctrl-C: the user wants out now. Everything already committed stays valid.
                if self.hard_exit:
                    os._exit(130)
                self._second_sigint = True
            return
        if starting is not None and self.quick_exit:
            for number, step in sorted(starting.items()):
                where = f"step {step}" if step is not None else "its newest checkpoint"
                log.warning("trial %d: signal %d while it starts up (building its state, restoring, compiling), "
                            "before any new step: exiting now without waiting for the compile; nothing new to "
                            "save, it resumes from %s on the next run", number, signum, where)
            _flush_and_exit(128 + signum)
        log.warning("signal %d received: checkpointing running trials, then exiting (at most %g s)", signum,
                    self.grace_seconds)
        # A step or a save that hangs (a stuck filesystem) must not keep a preempted machine alive:
        # past the grace period the process exits anyway; committed checkpoints stay valid.
        timer = threading.Timer(self.grace_seconds, self._expire, args=(signum,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _nothing_to_save(self) -> dict[int, int | None] | None:
        """The starting trials, if every trial of this process is starting up; else None."""
        if not self._starting or self._training:
            return None
        return dict(self._starting)

    def _expire(self, signum: int) -> None:
        if not self.hard_exit:
            log.error("grace period of %g s is over and the final checkpoint is still not written", self.grace_seconds)
            return
        log.error("grace period of %g s is over: exiting without a final checkpoint", self.grace_seconds)
        os._exit(128 + signum)

    def check_save_time(self, number: int, seconds: float, how: str) -> None:
        """Warn once per process where a save of trial `number`'s state takes (`how`: "measured",
        "predicted") longer than the grace period: a signal's save would be cut off."""
        if self.slow_save_said or seconds <= self.grace_seconds:
            return
        self.slow_save_said = True
        log.warning("trial %d: a checkpoint save of its state takes %.3g s (%s), longer than the grace period of "
                    "%g s after SIGTERM (checkpoint.grace_seconds, $%s, else %g s): a signal's save may be cut off, "
                    "and the trial would resume from its previous save. Give more grace where the platform allows "
                    "it, save more often so that less is lost (a shorter checkpoint.every_seconds or every_steps, "
                    "or every: auto), or make the state smaller", number, seconds, how, self.grace_seconds,
                    GRACE_ENV, DEFAULT_GRACE_SECONDS)

    def grace_left(self) -> float:
        """Seconds left of the grace period since the signal (all of it before one)."""
        return self.grace_seconds - (time.monotonic() - self._since if self._since is not None else 0.0)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: exit all the same
            pass
    os._exit(code)
