"""The study session: the one object that holds a study's Optuna side, the store boundary.

A `Session` is built from a validated config. It alone opens the study's storage (rdb.py) and
holds the Optuna study, its id and the claims; every other module reads and writes trials through
its methods (a study's checkpoints are sweep/checkpoints/study_checkpoints.py's, composed with the
session by the run loop). Optuna's private internals are used in sweep/internals.py only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.errors import StudyNotFound
from sweep.internals import cache_trial, create_trial, forget_cached_trials, trial_id
from sweep.store.backend import backend_for
from sweep.store.claims import Leases
from sweep.store.rdb import load_study, workdir_lock
from sweep.store.record import (BEST_STEP, BEST_VALUE, EVAL_ATTR_PREFIX, LAST_STEP, WARM_START, is_warm_start,
                                paused_rung)
from sweep.study import fingerprint
from sweep.study.config import Config

REMOTE_ROOT_ATTR = "remote_root"  # study user attribute: the study's folder in checkpoint.remote's tier
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # never run again


class Session:
    """One study, opened: its config, storage, Optuna study, claims, checkpoints and progress.

    Build with `Session(config)`, then `open(create)`; `sweep.open(...)` is the public way in.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.backend = backend_for(config.storage)  # the kind of storage (backend.py): never asked which
        self._step_watchers: list[Callable[[int, int], None]] = []  # see watch_steps
        self._storage: optuna.storages.BaseStorage | None = None
        self._study: optuna.Study | None = None
        self._study_id: int | None = None
        self._claims: Leases | None = None
        # Trials this process told finished (claims released; an upload queued for one may find no holder).
        self.finished_here: set[int] = set()
        self.enqueue_done = False  # every entry of the file's `enqueue` has a trial (all_enqueued)
        self._start_plan: Any = None  # sweep.run.plan.Plan: see keep_start_plan

    # --- opening -------------------------------------------------------------------------------

    def open(self, create: bool) -> Session:
        """Open (or, if `create`, create) the study. Idempotent.

        Raises:
            SweepError: the storage cannot be opened, or (not `create`) the study does not exist.
        """
        if self._study is not None:
            return self
        config = self.config
        storage = self.backend.open(config, create)
        try:
            if create:
                with workdir_lock(config):
                    self.backend.prepare(storage)
            study = load_study(config, storage, create)
            study_id = storage.get_study_id_from_name(config.name)
        except BaseException:
            self.backend.close(storage)
            raise
        self._storage, self._study, self._study_id = storage, study, study_id
        self._claims = self.backend.claims(storage, self._study_id, config.study.parallel.lease_grace_seconds)
        return self

    def open_existing(self) -> bool:
        """Open the study if it exists, creating nothing; False if it does not (yet)."""
        if not self.backend.initialised(self.config):
            return False
        try:
            self.open(create=False)
        except StudyNotFound:
            return False
        return True

    def close(self) -> None:
        if self._storage is not None:
            self.backend.close(self._storage)
        self._storage = self._study = self._claims = None
        self._study_id = None

    @property
    def is_open(self) -> bool:
        return self._study is not None

    @property
    def storage(self) -> optuna.storages.BaseStorage:
        """The raw storage. optuna.Study wraps an RDB one in a cache that, on its first read, loads
        every trial (~1.9 s for 2,000 trials here) whatever states were asked for; this one filters in SQL."""
        assert self._storage is not None, "open() the session first"
        return self._storage

    @property
    def study(self) -> optuna.Study:
        assert self._study is not None, "open() the session first"
        return self._study

    @property
    def study_id(self) -> int:
        assert self._study_id is not None, "open() the session first"
        return self._study_id

    @property
    def claims(self) -> Leases:
        assert self._claims is not None, "open() the session first"
        return self._claims

    # --- trials --------------------------------------------------------------------------------

    def trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        """Frozen trials (shared, do not modify), by number."""
        found = self.storage.get_all_trials(self.study_id, deepcopy=False,
                                            states=tuple(states) if states is not None else None)
        # Warm-start observations (sweep/store/warm_start.py) are the sampler's alone: never sweep's trials.
        return sorted((t for t in found if not is_warm_start(t)), key=lambda t: t.number)

    def running(self) -> list[FrozenTrial]:
        return self.trials((TrialState.RUNNING,))

    def trial(self, number: int) -> FrozenTrial:
        """Trial `number`, read fresh from the storage."""
        return self.storage.get_trial(self._trial_id(number))

    def _trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def trial_states(self) -> dict[int, TrialState]:
        """number -> state of every trial, in one narrow query (no params, attributes or reports)."""
        rows = self.storage.outages.call(lambda: self.backend.trial_states(self.storage, self.study_id, WARM_START),
                                         what="reading trial states")
        return {number: state if isinstance(state, TrialState) else TrialState[state] for number, state in rows}

    def records(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        """Like `trials`, read narrowly: of a finished trial's `eval:<step>` attributes and reports
        only those at its best step (a trial without best_step, best_value and last_step comes whole).
        status's reader: it shows no other step."""
        found = self.storage.outages.call(lambda: self.backend.read_trials(
            self.storage, self.study_id, states, EVAL_ATTR_PREFIX, (BEST_STEP, BEST_VALUE, LAST_STEP)),
            what="reading trials")
        return sorted((t for t in found if not is_warm_start(t)), key=lambda t: t.number)

    def trial_attrs(self, *keys: str) -> dict[int, dict[str, Any]]:
        """number -> {key: value} of the user attributes `keys` of every trial, in one narrow query."""
        return self.storage.outages.call(lambda: self.backend.user_attr_values(
            self.storage, self.study_id, keys, WARM_START), what="reading trial attributes")

    def n_trials_all(self) -> int:
        """Every trial of the study, warm-start observations too (Optuna's get_n_trials loads them all)."""
        return self.storage.outages.call(lambda: self.backend.count_trials(self.storage, self.study_id),
                                         what="counting trials")

    def best_trial(self) -> FrozenTrial | None:
        """The best COMPLETE trial, read alone (with constraints: the best feasible one); None if
        there is none. With several objectives: the Pareto-optimal trial best by the first one."""
        study = self.config.study
        if study.multi_objective or study.constraints or study.warm_start is not None:
            from sweep.study.constraints import feasible

            front = set(self.pareto_numbers()) if study.multi_objective else None
            found = [t for t in self.records((TrialState.COMPLETE,)) if (t.number in front if front is not None
                                                                         else not study.constraints or feasible(t))]
            best = min(found, key=lambda t: (study.objective.sign * t.values[0], t.number), default=None)
            return self.trial(best.number) if best is not None else None  # whole, eval rows too
        try:
            return self.storage.get_best_trial(self.study_id)
        except ValueError:
            return None

    def pareto_numbers(self) -> list[int]:
        """Numbers of the COMPLETE trials on the Pareto front (a multi-objective study): those no
        other trial dominates, feasible ones only (Optuna's `study.best_trials` rule)."""
        from sweep.study.objectives import pareto

        return pareto(self.records((TrialState.COMPLETE,)), self.config.study.all_objectives)

    def live_numbers(self, trials: Sequence[FrozenTrial]) -> set[int]:
        """Numbers of the RUNNING trials among `trials` whose worker is alive (claims)."""
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if not running or not self.backend.has_claims(self.storage):  # a study not run by sweep
            return set()
        live = self.claims.live_numbers(t.number for t in running)
        # Claims of workers of the previous release were keyed by Optuna's internal trial id: a
        # worker of that release may still be training during an upgrade.
        legacy = {f"trial:{trial_id(t)}": t.number for t in running}
        return live | {legacy[k] for k in self.claims.live_owners(legacy)}

    def ask(self) -> optuna.Trial:
        """`study.ask()`: the oldest WAITING trial (enqueued), else a new one. With a scheduler,
        never a paused trial (WAITING too, sweep/schedulers/asha.py), which Optuna's `ask` would pop like any
        other: the WAITING trials are read afresh here and the paused ones left alone."""
        if self.config.study.scheduler is None:
            return self.study.ask()
        for t in self.trials((TrialState.WAITING,)):
            if paused_rung(t) is None and self.set_state(t.number, TrialState.RUNNING):
                new_id = trial_id(t)  # the id Optuna's Trial takes (study.ask pops it alike)
                cache_trial(self.study, self.trial(t.number))  # another process enqueued it
                break
        else:
            # What study.ask does past its pop: the trial through the study's cached storage,
            # whose trial cache the study's readers use.
            new_id = create_trial(self.study)
        forget_cached_trials(self.study)  # study.ask resets it too
        return optuna.Trial(self.study, new_id)

    def set_trial_attr(self, number: int, key: str, value: Any) -> None:
        """Set a user attribute of unfinished trial `number`, a WAITING one too (which has no
        `optuna.Trial` to set it through)."""
        self.storage.set_trial_user_attr(self._trial_id(number), key, value)

    def set_state(self, number: int, state: TrialState, value: float | None = None) -> bool:
        """Set trial `number`'s state (and value) in one storage write; False where Optuna refuses:
        RUNNING is only set on a WAITING trial (atomic: the row is locked), a finished trial is never
        changed. Optuna's `tell` cannot finish a WAITING trial, nor put a RUNNING one back to WAITING."""
        try:
            return self.storage.set_trial_state_values(self._trial_id(number), state,
                                                       None if value is None else [value])
        except optuna.exceptions.UpdateFinishedTrialError:
            return False

    def check_reopenable(self) -> None:
        """Raise UsageError where the storage never changes a finished trial (a journal)."""
        self.backend.check_reopenable(self.storage)

    def reopen_failed(self, number: int, keep_through: int | None, attrs: dict[str, Any]) -> bool:
        """FAIL trial `number` back to RUNNING with its retry's record `attrs`, its reports past
        step `keep_through` removed (rdb_tables.reopen_failed); False where it is no FAIL trial (anymore).

        Raises:
            UsageError: the storage never changes a finished trial (a journal).
        """
        return self.backend.reopen_failed(self.storage, self.study_id, number, keep_through, attrs)

    def seed_number(self, number: int) -> int:
        """The trial number whose keys and data order trial `number` uses (its own)."""
        return number

    def prepare_trial(self, number: int, trial: optuna.Trial, folder: Path) -> bool:
        """Before trial `number` runs (also when adopted): anything it needs first; True if it
        changed the trial's record. Nothing here (a continuation carries its history over)."""
        return False

    def handle(self, number: int) -> optuna.Trial:
        """An `optuna.Trial` for an existing RUNNING trial (to adopt it: report, suggest, tell).
        Optuna has no API to re-attach to a trial another process asked for; its constructor,
        documented as not for direct use, is what `study.ask` itself calls."""
        frozen = self.trial(number)
        cache_trial(self.study, frozen)  # its suggest writes through the study's trial cache
        return optuna.Trial(self.study, trial_id(frozen))

    # --- what the study was started with ----------------------------------------------------------

    def meaning_changes(self) -> list[tuple[str, Any, Any]]:
        """How the study file's trial-defining keys differ from the ones the study was started
        with ([] for a study started before sweep recorded them)."""
        from sweep.store.samplers import unusable_argument

        stored = self.storage.get_study_user_attrs(self.study_id).get(fingerprint.STUDY_ATTR)
        found = fingerprint.changes(stored, fingerprint.meaning(self.config)) if stored is not None else []
        # The way out of an argument that never worked (constraints_func: "mod:fn"): drop it.
        return [c for c in found if not (c[2] is fingerprint.ABSENT and unusable_argument(self.config, c[0], c[1]))]

    def check_unchanged(self) -> None:
        """Raise the exit-2 refusal if the study file changed keys that define what trials mean."""
        found = self.meaning_changes()
        if found:
            raise fingerprint.refusal(self.config, self.config.storage, found)

    def stored_code(self) -> dict[str, str] | None:
        return self.storage.get_study_user_attrs(self.study_id).get(fingerprint.CODE_ATTR)

    def record_fingerprint(self) -> None:
        """Store the study file's trial-defining keys (once) and the trial module's fingerprint
        (whenever it changed), as study user attributes; refuse a changed file."""
        self.check_unchanged()
        attrs = self.storage.get_study_user_attrs(self.study_id)
        if fingerprint.STUDY_ATTR not in attrs or REMOTE_ROOT_ATTR not in attrs:
            # Written once, by the first worker: under the ask lock, read again. Optuna's attribute
            # write is an upsert, so two workers starting at once would each write theirs, and one
            # would go on with a bucket folder the study no longer names (its steps never found by
            # a takeover: found by test_clusters on a loaded CI machine).
            with self.claims.ask_lock():
                attrs = self.storage.get_study_user_attrs(self.study_id)
                if fingerprint.STUDY_ATTR not in attrs:
                    self.set_study_attr(fingerprint.STUDY_ATTR, fingerprint.meaning(self.config))
                if REMOTE_ROOT_ATTR not in attrs:  # the study's folder in a bucket, should it ever use one
                    import uuid

                    self.set_study_attr(REMOTE_ROOT_ATTR, f"{self.config.name}-{uuid.uuid4().hex[:12]}")
            self.check_unchanged()  # another worker may have stored its file first
        code = fingerprint.code(self.config)
        if attrs.get(fingerprint.CODE_ATTR) != code:
            self.set_study_attr(fingerprint.CODE_ATTR, code)

    def study_attrs(self) -> dict[str, Any]:
        """The study's user attributes, read now from the storage."""
        return self.storage.get_study_user_attrs(self.study_id)

    def study_system_attrs(self, prefix: str | None = None) -> dict[str, Any]:
        """The study's system attributes (Optuna's and optuna-dashboard's: notes, figures), read now;
        only those whose key starts with `prefix` where given (one narrow query)."""
        if prefix is None:
            return self.storage.get_study_system_attrs(self.study_id)
        return self.storage.outages.call(lambda: self.backend.study_system_attrs(self.storage, self.study_id, prefix),
                                         what="reading study attributes")

    def set_study_system_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Set study system attributes, in order. Where two workers insert the same new key at once
        (the figure each writes as its run ends), Optuna drops the second insert (it ignores the
        unique key's error): the first one's value stands."""
        for key, value in attrs.items():
            self.storage.set_study_system_attr(self.study_id, key, value)

    def set_intermediate(self, number: int, step: int, value: float) -> None:
        """Trial `number`'s reported value at `step` (a PBT recipient's copy of its donor's value there)."""
        self.storage.set_trial_intermediate_value(self._trial_id(number), step, value)

    def tell(self, trial: optuna.Trial, values: Sequence[float] | None = None,
             state: TrialState | None = None) -> None:
        """Finish the trial (Optuna's tell) once: a trial another worker finished stays as it is."""
        self.study.tell(trial, values, state=state, skip_if_finished=True)

    def set_study_attr(self, key: str, value: Any) -> None:
        """Set a study user attribute that several workers may set at once: Optuna inserts the row
        when it finds none, so a racing worker's insert fails on the unique key; theirs stands."""
        try:
            self.storage.set_study_user_attr(self.study_id, key, value)
        except Exception:
            if key not in self.storage.get_study_user_attrs(self.study_id):
                raise

    # --- progress, compiled code ---------------------------------------------------

    @property
    def cache_dir(self) -> Path:
        """JAX's persistent compilation cache of this study's trials (sweep/train/compile_events.py)."""
        return self.config.cache_dir

    def watch_steps(self, watcher: Callable[[int, int], None]) -> Callable[[], None]:
        """Call `watcher(number, step)` with each progress report of this process's trials (`on_step`),
        after the watchers before it (the live view's meter: sweep/commands/progress.py); returns
        the call that stops it."""
        self._step_watchers.append(watcher)  # a list's append and remove are atomic: a trial's thread may report
        return lambda: self._step_watchers.remove(watcher)

    def on_step(self, number: int, step: int) -> None:
        """The runner's progress report (sweep/run/worker.py): at the start (the step it starts
        from), after every training window, and with `step` -1 when the trial stopped running
        here; passed on to each watcher."""
        for watcher in tuple(self._step_watchers):
            watcher(number, step)

    def keep_start_plan(self, plan: Any) -> None:
        """Keep the plan `run` checked just now (sweep/run/plan.py) for the run loop's start-up lines."""
        self._start_plan = plan

    def take_start_plan(self) -> Any:
        """The plan kept by `keep_start_plan`, once (a big study's plan is not read twice); else None."""
        plan, self._start_plan = self._start_plan, None
        return plan

    def all_enqueued(self) -> None:
        """Every entry of the file's `enqueue` has a trial (sweep/store/enqueue.py): never read again."""
        self.enqueue_done = True

    def finished_by_this_process(self, number: int) -> None:
        """Trial `number` was told finished here: its claim is released, and an upload queued for it
        may find no holder (sweep/checkpoints/study_checkpoints.py's upload fence)."""
        self.finished_here.add(number)
