"""`continue`: train finished trials further, from their last checkpoint, in a companion study.

Optuna's finished trials are immutable (a COMPLETE trial takes no more reports), so the continued
results live in a companion study in the same storage, `<name>.continued-<steps>`: one trial per
continued trial, with its params (enqueued), the `continued_from` user attribute, its own
checkpoint folder under `<workdir>/continued-<steps>/`, and the reports and evaluations it carries
over. `status`, `export` and `plot` show it with `--continued STEPS`; optuna-dashboard lists it
beside the study. A continued trial keeps the keys and data order of the trial it continues, so
for a trial whose training does not depend on `train.steps` it is bit-identical to one trained
that long from the start. It is a sweep study of its own: a kill, then the same command, resumes it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import integrity, retention
from sweep.checkpoints.steps import kept_steps, newest_step
from sweep.errors import StudyNotFound, UsageError
from sweep.store.record import (CONTINUED_FROM, EVAL_ATTR_PREFIX, LAST_STEP, checkpoint_folder, companion_name,
                                exploited_at, params_in_force)
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.study.config import Config
from sweep.study.credentials import mask_url

log = logging.getLogger("sweep")
_READY_ATTR = "continued_ready"  # its checkpoints and reports were carried over


def companion_config(config: Config, steps: int, n_trials: int | None = None) -> Config:
    """The study file of `config`'s continuation to `steps` steps: same trial, storage and search
    space; its own name and workdir; no pruner or scheduler (the user asked for these trials to go on)."""
    raw = dict(config.source.raw)
    raw.update(name=companion_name(config.name, steps), storage=raw.get("storage") or config.storage,
               workdir=str(config.workdir / f"continued-{steps}"), n_trials=n_trials or config.study.n_trials,
               train={**raw["train"], "steps": steps}, pruner={"type": "none"}, sampler={"type": "random", "seed": 0},
               parallel={"n_jobs": 1})
    raw.pop("timeout", None)
    raw.pop("scheduler", None)  # no pause either: the chosen trials train straight on
    raw.pop("warm_start", None)  # its trials are the chosen ones, continued: no observations added
    return config_lib.from_dict(raw, origin=f"{config.path} (continued to {steps} steps)", env=config.source.env)


class ContinuingSession(Session):
    """The companion study, run: each new trial is the next chosen trial, continued."""

    def __init__(self, config: Config, source: Config, chosen: list[FrozenTrial]) -> None:
        super().__init__(config)
        self.source, self.chosen = source, chosen
        self._seed_numbers: dict[int, int] = {}

    @property
    def cache_dir(self) -> Path:
        return self.source.cache_dir  # the same programs as the study's: its compilation cache

    def ask(self) -> optuna.Trial:
        trials = self.trials()
        if not any(t.state == TrialState.WAITING for t in trials):  # else a kill came between the two
            done = {t.user_attrs[CONTINUED_FROM]["number"] for t in trials if CONTINUED_FROM in t.user_attrs}
            nxt = next(t for t in self.chosen if t.number not in done)
            # A PBT member's params in force (after its latest exploit), not those sampled.
            self.study.enqueue_trial(params_in_force(nxt), user_attrs={CONTINUED_FROM: {
                "study": self.source.name, "number": nxt.number, "last_step": nxt.user_attrs[LAST_STEP]}})
        return self.study.ask()

    def seed_number(self, number: int) -> int:
        if number not in self._seed_numbers:
            self._seed_numbers[number] = int(self.trial(number).user_attrs[CONTINUED_FROM]["number"])
        return self._seed_numbers[number]

    def prepare_trial(self, number: int, trial: optuna.Trial, folder: Path) -> bool:
        """Carry the continued trial's kept checkpoints, reports and evaluations over (once; a kill
        midway is finished by the next run). True if anything was done."""
        frozen = self.trial(number)
        if frozen.user_attrs.get(_READY_ATTR):
            return False
        origin = next(t for t in self.chosen if t.number == frozen.user_attrs[CONTINUED_FROM]["number"])
        source_folder = checkpoint_folder(self.source, origin)
        assert source_folder is not None
        with retention.reading(source_folder, origin.number):
            for step in kept_steps(source_folder):
                _copy_step(source_folder, folder, step)
        since = exploited_at(origin)  # a PBT member's lineage starts at its latest exploit
        for step, value in sorted(origin.intermediate_values.items()):
            if step not in frozen.intermediate_values and step >= since:
                trial.report(value, step)
        for key, value in origin.user_attrs.items():
            if key.startswith(EVAL_ATTR_PREFIX) and key not in frozen.user_attrs and int(key[len(EVAL_ATTR_PREFIX):]) >= since:
                trial.set_user_attr(key, value)
        trial.set_user_attr(_READY_ATTR, True)
        log.info("trial %d: continues trial %d of study %s from its last step %d, to %d steps", number,
                 origin.number, self.source.name, origin.user_attrs[LAST_STEP], self.config.study.train.steps)
        return True


def _copy_step(source: Path, target: Path, step: int) -> None:
    """Copy a committed step (hard links: its files are never changed once committed), checksum
    first and the step folder by rename, as a save commits."""
    if (target / str(step)).exists():
        return
    integrity.sums_dir(target).mkdir(parents=True, exist_ok=True)
    shutil.copy2(integrity.checksum_file(source, step), integrity.checksum_file(target, step))
    integrity.install_step(target, step, lambda tmp: shutil.copytree(source / str(step), tmp,
                                                                     copy_function=_link_or_copy), "copying")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy2(src, dst)


def choose(session: Session, steps: int, top: int | None, numbers: list[int] | None) -> list[FrozenTrial]:
    """The trials to continue, checked: fewer steps than `steps`; COMPLETE with its last step
    kept, or (named by `numbers`) PRUNED with a step kept, which it continues from (the steps
    after it are trained again, bit-identically, and not reported twice).

    Raises:
        UsageError: any chosen trial cannot be continued (nothing is created).
    """
    config = session.config
    if steps < 1:
        raise UsageError(f"--steps: must be >= 1, got {steps}")
    complete = session.trials((TrialState.COMPLETE,))
    if top is not None:
        if top < 1:
            raise UsageError(f"--top: must be >= 1, got {top}")
        chosen = sorted(complete, key=lambda t: (config.study.objective.sign * t.values[0], t.number))[:top]
        if not chosen:
            raise UsageError(f"study {config.name!r} has no COMPLETE trial to continue")
    else:
        # A pruned trial may be worth training on (Optuna's pruners end trials for good; its
        # checkpoints say otherwise); --top takes COMPLETE trials only.
        by_number = {t.number: t for t in session.trials((TrialState.COMPLETE, TrialState.PRUNED))}
        states = session.trial_states()
        for n in numbers or []:
            if n not in by_number:
                why = ("it does not exist" if n not in states
                       else f"it is {states[n].name}, neither COMPLETE nor PRUNED")
                raise UsageError(f"cannot continue trial {n} of study {config.name!r}: {why}")
        chosen = [by_number[n] for n in sorted(set(numbers or []))]
    removed = retention.removed(session)
    for t in chosen:
        last = int(t.user_attrs.get(LAST_STEP, max(t.intermediate_values, default=0)))
        folder = checkpoint_folder(config, t)
        kept = newest_step(folder) if folder is not None and t.number not in removed else None
        if steps <= last:
            raise UsageError(f"cannot continue trial {t.number} to {steps} steps: it has trained {last} already "
                             "(--steps must be more)")
        if kept != last and not (t.state == TrialState.PRUNED and kept is not None):
            where = f"its checkpoints were removed ({removed[t.number]})" if t.number in removed else (
                f"its newest kept step is {kept}" if kept is not None else f"no checkpoint of it is in {folder}")
            raise UsageError(f"cannot continue trial {t.number}: its last step {last} was not kept ({where})")
    return chosen


def open_companion(config: Config, steps: int) -> Session:
    """The companion study of `config` continued to `steps` steps, for status, export and plot.

    Raises:
        StudyNotFound: no trial of the study was continued to `steps` steps.
    """
    found = Session(companion_config(config, steps))
    if not found.open_existing():
        raise StudyNotFound(f"study {config.name!r} has no trials continued to {steps} steps "
                            f"(`python -m sweep continue {config.path} --steps {steps} ...` makes them)")
    try:  # n_trials of a companion study is the number of trials continued into it
        n_trials = max(1, len(found.trial_states()))
    finally:
        found.close()
    return Session(companion_config(config, steps, n_trials=n_trials)).open(create=False)


def start(config: Config, steps: int, top: int | None, numbers: list[int] | None) -> ContinuingSession:
    """The checked, not yet run, continuation of `config`'s chosen trials to `steps` steps.

    Raises:
        StudyNotFound: the study does not exist.
        UsageError: a chosen trial cannot be continued.
    """
    source = Session(config)
    if not source.open_existing():
        raise StudyNotFound(f"study {config.name!r} not found in {mask_url(config.storage)}: run it first")
    if _reads_total_steps(config.trial_module):
        log.warning("%s reads hp['train.steps'] (a schedule over the whole run?): trials continued to %d steps "
                    "follow it from there, so they are not what training %d steps from the start gives",
                    config.trial_module.__name__, steps, steps)
    try:
        chosen = choose(source, steps, top, numbers)
        earlier = _continued(config, steps, source)
    finally:
        source.close()
    by_number = {t.number: t for t in chosen}
    for t in earlier:  # continued by an earlier command: part of the companion study for good
        by_number.setdefault(t.number, t)
    ordered = sorted(by_number.values(), key=lambda t: (t.number not in {c.number for c in earlier}, t.number))
    return ContinuingSession(companion_config(config, steps, n_trials=len(ordered)), config, ordered)


def _reads_total_steps(module: object) -> bool:
    import inspect

    try:
        source = inspect.getsource(module)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    return "train.steps" in source


def _continued(config: Config, steps: int, source: Session) -> list[FrozenTrial]:
    """The study's trials that the companion study continues already."""
    companion = Session(companion_config(config, steps))
    if not companion.open_existing():
        return []
    try:
        numbers = [t.user_attrs[CONTINUED_FROM]["number"] for t in companion.trials() if CONTINUED_FROM in t.user_attrs]
    finally:
        companion.close()
    return [source.trial(n) for n in numbers]
