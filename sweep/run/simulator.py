"""The scheduler simulator: a study's real decisions made on tabulated learning curves, in
simulated time, with W workers and no training.

A benchmark of schedulers needs thousands of studies, so it cannot train them. Syne Tune's
simulator back-end replays tabulated curves instead; this one does so through sweep's own
decision code, unchanged, so that what it measures is what a `sweep run` would decide:

- each free worker decides with the run loop's own `worker.decide` (the scheduler's
  `promote_next`, the study file's `enqueue`, Optuna's `ask` with the study's own sampler made
  restart-proof as in a run, the end of the paused trials), on a Session whose storage is Optuna's
  InMemoryStorage (`SimulatedSession`);
- a trial "trains" from where it stands to the step the scheduler's `pause_at` gives (or the end),
  reporting the table's value at each evaluation step (`train.eval_every`) to Optuna at the moment
  it would be reached, so that a pruner's `should_prune` sees the other trials' reports made
  before it, as it would; it pauses with the scheduler's `pause`, is pruned where the pruner says
  so, or completes with its best value, as the run loop does (sweep/run/worker.py, sweep/train/loop.py);
- time is simulated: a trial's step takes the table's `seconds_per_step`; events happen in time
  order, ties in worker order; a worker with nothing to do while others run waits for the next
  event (the run loop polls), and stops where nothing runs (the run loop ends).

What the simulation leaves out: checkpoints, restarts and faults (the run's resume is
bit-identical, so they change no decision), and the time a decision or a process start takes.
Everything is a function of the study file, the table and the seed: two simulations give the same
decisions, reports and times. Where the sampler or the scheduler reads the wall clock or the
process, the simulation is no better than the run's own determinism (tests/run/test_simulator.py).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Callable, Mapping, Protocol, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.errors import ConfigError
from sweep.run.worker import decide
from sweep.schedulers import base as scheduler
from sweep.store.record import PAUSED_AT, best_of_reports
from sweep.store.samplers import build_pruner, restart_proof, suggest_all
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.words import count


@dataclasses.dataclass(frozen=True)
class Curve:
    """One configuration's learning curve: the metric at each evaluation step, and how long a
    training step takes (seconds; the simulated clock's only cost)."""
    values: Mapping[int, float]
    seconds_per_step: float = 1.0


class Table(Protocol):
    """Where the curves come from: trial `number` with sampled `params` trains along this curve
    (a table looked up by params, a surrogate model, or a recorded study's trials by number)."""

    def __call__(self, number: int, params: Mapping[str, Any]) -> Curve: ...


class Recorded:
    """The table of a recorded study: trial N follows the reports trial N made (its
    intermediate values), which hold the steps it reached. `same_params`: refuse a trial whose
    sampled params differ from the recording's (a replay must draw the same ones)."""

    def __init__(self, trials: Sequence[FrozenTrial], same_params: bool = True) -> None:
        self.trials, self.same_params = {t.number: t for t in trials}, same_params

    def __call__(self, number: int, params: Mapping[str, Any]) -> Curve:
        recorded = self.trials.get(number)
        if recorded is None:
            raise KeyError(f"trial {number} is not in the recording ({count(len(self.trials), 'trial')})")
        if self.same_params and dict(params) != recorded.params:
            raise ValueError(f"trial {number}: the sampler drew {dict(params)}, the recording has {recorded.params}")
        return Curve(dict(recorded.intermediate_values))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What happened to a trial, when: `kind` is start, promote (from `step` to `to`), pause,
    prune, complete or end (a paused trial ended PRUNED by `finish_paused`)."""
    time: float
    kind: str
    number: int
    step: int
    to: int | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """A reported evaluation: at simulated `time`, after `used` training steps of all trials."""
    time: float
    used: int
    number: int
    step: int
    value: float


@dataclasses.dataclass
class Simulation:
    decisions: list[Decision]
    reports: list[Report]
    trials: list[FrozenTrial]  # the study's trials at the end, by number
    time: float  # simulated seconds at the end
    used: int  # training steps of all trials


class SimulatedSession(Session):
    """A Session over Optuna's InMemoryStorage: the study file's sampler (restart-proof, as a run
    makes it) and pruner; no claims, files or checkpoints. Every method the decisions use is
    Session's own, but `trial_states` (a storage query of the RDB backend)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        storage = optuna.storages.InMemoryStorage()
        sampler = restart_proof(config)
        study = optuna.create_study(storage=storage, study_name=config.name, sampler=sampler,
                                    pruner=build_pruner(config), direction=config.study.objective.direction)
        self._storage, self._study = storage, study
        self._study_id = storage.get_study_id_from_name(config.name)

    def trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        """Session.trials less its filter and sort, which cost a decision O(trials) each: an in-memory
        study holds its trials in number order, and no warm start (refused by `check`)."""
        return self.storage.get_all_trials(self.study_id, deepcopy=False,
                                           states=tuple(states) if states is not None else None)

    def trial_states(self) -> dict[int, TrialState]:
        return {t.number: t.state for t in self.trials()}


@dataclasses.dataclass
class _Run:
    """A trial training on a worker: from `step` (its last evaluation) to `stop`."""
    trial: optuna.Trial
    curve: Curve
    step: int
    stop: int | None  # the scheduler's pause step; None: the end


def check(config: Config) -> None:
    """What the simulator cannot simulate, refused with the key and the rule.

    Raises:
        ConfigError: several objectives, a warm start (another study's trials), or a scheduler
            whose trials take over other trials' states (pbt's exploits: `follows_curves` false).
    """
    if config.study.multi_objective:
        raise ConfigError(str(config.path), "objectives", "the simulator ranks one objective", "several")
    if config.study.warm_start is not None:
        raise ConfigError(str(config.path), "warm_start", "the simulator starts from an empty study",
                          config.study.warm_start.study)
    s = config.study.scheduler
    if s is not None and not getattr(s, "follows_curves", True):
        raise ConfigError(str(config.path), "scheduler.type", "the simulator replays each trial's own curve, which "
                          "this scheduler's trials leave (they take over other trials' states)", s.type)


def simulate(config: Config, table: Table, workers: int = 1, max_steps: int | None = None,
             on_decision: Callable[[Decision], None] | None = None) -> Simulation:
    """Run the study `config` describes on `table`'s curves with `workers` workers, until its
    n_trials are finished (as `sweep run` does) or `max_steps` training steps have been used (at
    the evaluation that used them up, mid-trial as it may be).

    Raises:
        ConfigError: see `check`.
        KeyError: the table has no value at an evaluation step a trial reached.
    """
    check(config)
    session = SimulatedSession(config)
    steps, eval_every = config.study.train.steps, config.study.train.eval_every
    sign = config.study.objective.sign
    decisions: list[Decision] = []
    reports: list[Report] = []
    events: list[tuple[float, int, int]] = []  # (time, worker, number): a run's next evaluation
    runs: dict[int, _Run] = {}  # worker -> its run
    idle: list[int] = []  # workers waiting for an event
    now, used = 0.0, 0

    def record(kind: str, number: int, step: int, to: int | None = None) -> None:
        d = Decision(now, kind, number, step, to)
        decisions.append(d)
        if on_decision is not None:
            on_decision(d)

    def next_eval(step: int, stop: int | None) -> int:
        return min((step // eval_every + 1) * eval_every, stop if stop is not None else steps, steps)

    curves: dict[int, Curve] = {}  # trial number -> its curve (looked up once)
    pruned: set[int] = set()  # the trials told PRUNED

    def start(worker: int) -> bool:
        claimed = decide(session)
        if claimed is None:
            for t in session.trials((TrialState.PRUNED,)):  # paused trials the decision ended (finish_paused)
                if t.number not in pruned and PAUSED_AT in t.user_attrs:
                    pruned.add(t.number)
                    record("end", t.number, int(t.user_attrs[PAUSED_AT][-1]))
            return False
        frozen = session.trial(claimed.number)
        step = int(frozen.user_attrs[PAUSED_AT][-1]) if claimed.promoted else 0
        stop = scheduler.pause_at(config, frozen)
        if claimed.asked is not None:
            params = suggest_all(config, claimed.asked)
            curves[claimed.number] = table(claimed.number, params)
            trial = claimed.asked
            record("start", claimed.number, 0)
        else:
            trial = session.handle(claimed.number)
            record("promote", claimed.number, step, stop if stop is not None else steps)
        run = _Run(trial, curves[claimed.number], step, stop)
        runs[worker] = run
        heapq.heappush(events, (now + (next_eval(step, stop) - step) * run.curve.seconds_per_step,
                                worker, claimed.number))
        return True

    def finish(run: _Run, state: str) -> None:
        number = run.trial.number
        if state == "pause":
            scheduler.pause(session, number, run.step)
        elif state == "prune":
            session.tell(run.trial, state=TrialState.PRUNED)
            pruned.add(number)
        else:
            reported = session.trial(number).intermediate_values
            best = best_of_reports(reported, sign)
            assert best is not None
            session.tell(run.trial, best[1])
        record(state, number, run.step)

    for w in range(workers):
        if not start(w):
            break
    while events:
        now, worker, number = heapq.heappop(events)
        run = runs[worker]
        step = next_eval(run.step, run.stop)
        used += step - run.step
        run.step = step
        # Every step past the run's start is new: a promoted trial starts at its rung, reported before.
        value = float(run.curve.values[step])
        run.trial.report(value, step)
        reports.append(Report(now, used, number, step, value))
        if max_steps is not None and used >= max_steps:
            break  # the budget is spent: the study stops here, mid-trial as it may be
        ended = ("pause" if step == run.stop else
                 "prune" if step < steps and run.trial.should_prune() else
                 "complete" if step == steps else None)
        if ended is None:
            heapq.heappush(events, (now + (next_eval(step, run.stop) - step) * run.curve.seconds_per_step,
                                    worker, number))
            continue
        finish(run, ended)
        del runs[worker]
        # The worker whose trial ended decides first (the others poll), then the waiting ones.
        for w in [worker, *idle]:
            if w in idle:
                idle.remove(w)
            if not start(w):
                if runs:
                    idle.append(w)
    return Simulation(decisions, reports, session.trials(), now, used)

