"""SIGTERM/SIGINT as a flag the training loop checks, with a grace period that bounds the exit."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from sweep.errors import Interrupted

log = logging.getLogger("sweep")


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks after every window; a second SIGINT exits at once.

    `install()` takes over the two signals (main thread only) and `restore()` gives the previous
    handlers back, so a study run from Python leaves the process's signal handling as it found it.
    """

    def __init__(self, grace_seconds: float = 20.0, hard_exit: bool = True) -> None:
        self.signum: int | None = None
        self.grace_seconds = grace_seconds
        # The CLI exits the process on a second Ctrl-C or past the grace period; a Python caller
        # (a notebook kernel) gets KeyboardInterrupt and an error line instead.
        self.hard_exit = hard_exit
        self._previous: dict[int, Any] = {}
        self._timers: list[threading.Timer] = []
        self._since: float | None = None  # monotonic time of the first signal

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Give back the previous handlers; cancel the grace timer of a signal already handled (the
        run is over: a Python caller that catches `Interrupted` goes on living)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            # Second Ctrl-C: the user wants out now. Everything already committed stays valid.
            if self.hard_exit:
                os._exit(130)
            raise KeyboardInterrupt
        self.signum = signum
        self._since = time.monotonic()
        log.warning("signal %d received: checkpointing running trials, then exiting (at most %g s)", signum,
                    self.grace_seconds)
        # A step or a save that hangs (a stuck filesystem) must not keep a preempted machine alive:
        # past the grace period the process exits anyway; committed checkpoints stay valid.
        timer = threading.Timer(self.grace_seconds, self._expire, args=(signum,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _expire(self, signum: int) -> None:
        if not self.hard_exit:
            log.error("grace period of %g s is over and the final checkpoint is still not written", self.grace_seconds)
            return
        log.error("grace period of %g s is over: exiting without a final checkpoint", self.grace_seconds)
        os._exit(128 + signum)

    def grace_left(self) -> float:
        """Seconds left of the grace period since the signal (all of it before one)."""
        return self.grace_seconds - (time.monotonic() - self._since if self._since is not None else 0.0)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)
