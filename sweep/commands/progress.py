"""Live progress of `run`: a table redrawn on a terminal, timestamped log lines anywhere else.

Progress is read from Optuna's storage (reports, states, claims) and the checkpoint folders, not
from the training loop: one view for one process, joblib workers and other hosts alike, and
nothing for the trial code to call. Its resolution is one evaluation (`train.eval_every`), except
for trials running in this process, whose runner shares its current step and its own timing of
its windows through the session's progress reports (`Session.watch_steps`, metered by `StepMeter`):
their speed and ETA do not depend on polls, and they show "compiling" until their first window ends.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

from optuna.trial import TrialState

from sweep.checkpoints.steps import newest_mtime
from sweep.store.record import DEVICES, PAUSED_AT, best_of_reports, checkpoint_folder, counted_reports
from sweep.store.record import reports as reports_of
from sweep.store.session import FINISHED, Session

log = logging.getLogger("sweep")


class StepMeter:
    """The current step and speed of the trials training in this process, from the runner's reports
    (`Session.on_step`): at the start (the step it starts from), after every training window, and
    with step -1 when the trial stopped running here."""

    def __init__(self) -> None:
        # trial number -> current step (the view's per-step resolution; reports come every eval_every steps)
        self.steps: dict[int, int] = {}
        # trial number -> steps per second, timed from the end of its first window (which includes
        # the compilation) on; a trial in `steps` without a rate is compiling.
        self.rates: dict[int, float] = {}
        self._timed_from: dict[int, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def on_step(self, number: int, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            if step < 0:
                for table in (self.steps, self.rates, self._timed_from):
                    table.pop(number, None)
                return
            if number in self.steps and step > self.steps[number]:
                t0, s0 = self._timed_from.setdefault(number, (now, step))  # the first window ends
                if step > s0 and now > t0:
                    self.rates[number] = (step - s0) / (now - t0)
            self.steps[number] = step


@dataclasses.dataclass(frozen=True)
class TrialLine:
    number: int
    step: int  # newest reported step, or the current step of a trial running in this process
    total: int
    value: float | None  # the newest evaluation of the objective metric
    best: float | None
    steps_per_s: float | None
    ckpt_age_s: float | None
    compiling: bool = False  # running in this process, its first window (with the compile) not done
    devices: tuple[str, ...] = ()  # where it trains ("cpu:2"), from its user attributes (sweep/host/slots.py)

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.step) / self.steps_per_s if self.steps_per_s else None


@dataclasses.dataclass(frozen=True)
class StudyLine:
    finished: int
    n_trials: int
    best_value: float | None
    best_number: int | None
    paused: int = 0  # trials paused at a rung (scheduler asha/hyperband), waiting for a promotion


class Monitor:
    """Polls a study's storage; keeps what it needs to tell a trial's speed between polls.

    It reads through a session of its own (it runs in its own thread, and the study may not exist
    yet when it starts); the current steps of trials in this process come from its meter, which
    watches `session`'s progress reports until `close()`.
    """

    def __init__(self, session: Session) -> None:
        self.config = session.config
        self.meter = StepMeter()
        self._unwatch: Callable[[], None] | None = session.watch_steps(self.meter.on_step)
        self._steps, self._rates = self.meter.steps, self.meter.rates
        self._reader = Session(session.config)
        # number -> (time, step) when first seen, and when its step first changed: a step seen on a
        # report boundary (the first change) times whole steps; first sight is a rougher start.
        self._first_seen: dict[int, tuple[float, int]] = {}
        self._first_change: dict[int, tuple[float, int]] = {}
        self._study_line: tuple[frozenset[int], float, StudyLine] | None = None

    def _open(self) -> bool:
        from sweep.errors import SweepError

        try:  # the study may not exist yet: `run` or its workers create it
            self._reader.open(create=False)
        except SweepError:
            return False
        return True

    def poll(self) -> tuple[StudyLine, list[TrialLine]] | None:
        """The study line and one line per trial with a live worker; None before the study exists."""
        if not self._open():
            return None
        running = self._reader.running()
        live = self._reader.live_numbers(running)
        now = time.time()
        lines = [self._line(t, now) for t in running if t.number in live]
        return self._study(frozenset(t.number for t in running), now), lines

    def close(self) -> None:
        self.stop_watching()
        self._reader.close()

    def stop_watching(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def _study(self, running: frozenset[int], now: float) -> StudyLine:
        """Re-read when the set of running trials changed, or every 10 s for other hosts' work."""
        if self._study_line is not None:
            ids, when, line = self._study_line
            if ids == running and now - when < 10:
                return line
        states = self._reader.trial_states()
        finished = sum(state in FINISHED for state in states.values())
        paused = 0
        if self.config.study.scheduler is not None and TrialState.WAITING in states.values():
            waiting = {n for n, state in states.items() if state == TrialState.WAITING}
            paused = sum(1 for n, attrs in self._reader.trial_attrs(PAUSED_AT).items()
                         if n in waiting and attrs.get(PAUSED_AT))
        best = self._reader.best_trial()
        best_value, best_number = (best.values[0], best.number) if best is not None else (None, None)
        line = StudyLine(finished, self.config.study.n_trials, best_value, best_number, paused)
        self._study_line = (running, now, line)
        return line

    def _line(self, t: Any, now: float) -> TrialLine:
        reports = reports_of(t, self.config.study.objective.metric)  # a multi-objective trial reports none
        step = max(max(reports, default=0), self._steps.get(t.number, 0))
        seen = self._first_seen.setdefault(t.number, (now, step))
        if step != seen[1] and t.number not in self._first_change:
            self._first_change[t.number] = (now, step)
        t0, s0 = self._first_change.get(t.number, seen)
        if step == s0 and t.number in self._first_change:
            t0, s0 = seen
        rate = (step - s0) / (now - t0) if step > s0 and now > t0 else None
        here = t.number in self._steps  # running in this process: its runner times its windows
        if here:
            rate = self._rates.get(t.number)
        best = best_of_reports(counted_reports(t, self.config.study.objective.metric),  # a PBT member: since its exploit
                               self.config.study.objective.direction)
        folder = checkpoint_folder(self.config, t)
        mtime = newest_mtime(folder) if folder is not None else None
        return TrialLine(
            number=t.number, step=step, total=self.config.study.train.steps,
            value=reports[max(reports)] if reports else None,
            best=best[1] if best else None,
            steps_per_s=rate, ckpt_age_s=now - mtime if mtime else None,
            compiling=here and t.number not in self._rates,
            devices=tuple(t.user_attrs.get(DEVICES) or ()))


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def study_text(s: StudyLine, metric: str) -> str:
    best = f"best {metric}={_fmt(s.best_value, '.6g')} (trial {s.best_number})" if s.best_number is not None \
        else "no trial complete yet"
    paused = f", {s.paused} paused at a rung" if s.paused else ""
    return f"{s.finished}/{s.n_trials} {'trial' if s.n_trials == 1 else 'trials'} finished{paused}, {best}"


def trial_text(t: TrialLine, metric: str) -> str:
    """One plain log line for a running trial."""
    speed = "compiling" if t.compiling else f"{_fmt(t.steps_per_s, '.0f')} steps/s, eta {_duration(t.eta_s)}"
    return (f"trial {t.number}: step {t.step}/{t.total}, {metric}={_fmt(t.value)} (best {_fmt(t.best)}), "
            f"{speed}, checkpoint {_duration(t.ckpt_age_s)} ago")


def table(study: StudyLine, trials: list[TrialLine], metric: str) -> Any:
    """The live view: one row per running trial, the study line as its title."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    t = Table(title=study_text(study, metric), title_justify="left", expand=False, box=None, pad_edge=False)
    devices = len({d for line in trials for d in line.devices}) > 1  # trials on several devices: say which
    for name, justify in (("trial", "right"), ("", "left"), ("step", "right"), (metric, "right"),
                          ("best", "right"), ("steps/s", "right"), ("eta", "right"), ("checkpoint", "right"),
                          *([("devices", "left")] if devices else [])):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for line in trials:
        t.add_row(str(line.number), ProgressBar(total=line.total, completed=line.step, width=24),
                  f"{line.step}/{line.total}", _fmt(line.value), _fmt(line.best),
                  "compiling" if line.compiling else _fmt(line.steps_per_s, ".0f"), _duration(line.eta_s),
                  f"{_duration(line.ckpt_age_s)} ago" if line.ckpt_age_s is not None else "-",
                  *([",".join(line.devices) or "-"] if devices else []))
    return t


class Display:
    """Runs the monitor beside `run`: a rich Live table on a terminal, else a log line per trial.

    Args:
        live: redraw a table (stderr is a terminal) instead of writing log lines.
        every_s: seconds between two log lines of a trial when not `live`.
    """

    def __init__(self, session: Session, live: bool, every_s: float = 30.0, console: Any = None) -> None:
        self.monitor, self.live, self.every_s = Monitor(session), live, every_s
        self.metric = session.config.study.objective.metric
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-progress", daemon=True)
        self._console = console

    def __enter__(self) -> "Display":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.monitor.stop_watching()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.monitor.close()

    def _loop(self) -> None:
        try:
            self._live_loop() if self.live else self._log_loop()
        except Exception as exc:  # a view must never take the study down  # noqa: BLE001
            log.debug("progress view stopped: %r", exc)

    def _log_loop(self) -> None:
        while not self._stop.wait(self.every_s):
            polled = self.monitor.poll()
            if polled is None:
                continue
            study, trials = polled
            for line in trials:
                log.info("%s", trial_text(line, self.metric))
            log.info("study: %s", study_text(study, self.metric))

    def _live_loop(self) -> None:
        from rich.console import Console
        from rich.live import Live

        console = self._console or Console(stderr=True)
        with Live(console=console, refresh_per_second=2, transient=True, redirect_stderr=True,
                  redirect_stdout=False) as live:
            while not self._stop.is_set():
                polled = self.monitor.poll()
                if polled is not None:
                    live.update(table(*polled, self.metric))
                self._stop.wait(0.5)
