"""`warm_start: {study: other.yaml}`: another study's COMPLETE trials, added once to this study as
observations for its sampler (Optuna's `study.add_trial`), never trained.

Each copy holds the other trial's params, recorded with this study's distributions, and the
values this study's objectives take from the other trial's metrics at its best step. Trials
whose params do not fit this search space, or that lack a metric of an objective, are skipped
(counted in the log line). The copies carry the `warm_start` user attribute
(sweep/store/record.py): `Session.trials` and `trial_states` leave them out, so they never count
toward n_trials and are never resumed, shown or exported. Exactly once: a copy names the trial
it copies, so a run killed while adding goes on where it stopped, and the study attribute
`sweep:warm_start` marks the warm start done.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from sweep.errors import ConfigError
from sweep.store.record import METRICS, WARM_START, WARM_STARTED, is_warm_start
from sweep.store.session import Session
from sweep.study import config as config_lib
from sweep.study import constraints as constraints_lib
from sweep.study import space
from sweep.study.config import Config
from sweep.study.params import CategoricalParam, FloatParam

log = logging.getLogger("sweep")


def check(config: Config) -> None:
    """The other study file is valid and its study exists (run's checks, before anything is created).

    Raises:
        ConfigError: the other file is not a valid study file, or its study was never run.
    """
    warm = config.study.warm_start
    if warm is None:
        return
    other = Session(config_lib.load(warm.study))
    try:
        if not other.open_existing():
            raise ConfigError(str(config.path), "warm_start.study", f"names study {other.config.name!r}, which does "
                              f"not exist in {other.config.storage}: run it first", warm.study)
    finally:
        other.close()


def apply(session: Session) -> None:
    """Add the other study's COMPLETE trials as observations, unless that was done. Call it under
    the study's ask lock, before the first ask."""
    config = session.config
    warm = config.study.warm_start
    if warm is None or WARM_STARTED in session.storage.get_study_user_attrs(session.study_id):
        return
    other = Session(config_lib.load(warm.study))
    try:
        source = other.open(create=False).trials((TrialState.COMPLETE,))  # not its own warm start
        other_config = other.config
    finally:
        other.close()
    done = {t.user_attrs[WARM_START].get("number") for t in
            session.storage.get_all_trials(session.study_id, deepcopy=False) if is_warm_start(t)}
    skipped: collections.Counter[str] = collections.Counter()
    added = 0
    for t in source:
        copy, why = _copy(config, other_config, t)
        if copy is None:
            skipped[why] += 1
        elif t.number not in done:
            session.study.add_trial(copy)
            added += 1
    total = sum(skipped.values())
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    log.info("warm start: %d trials of study %r (%s) added as observations%s", len(source) - total,
             other_config.name, warm.study, f"; {total} skipped: {reasons}" if total else "")
    session.set_study_attr(WARM_STARTED, {"study": other_config.name, "file": warm.study,
                                          "added": len(source) - total, "skipped": dict(skipped)})


def _copy(config: Config, other: Config, t: FrozenTrial) -> tuple[FrozenTrial | None, str]:
    """The observation for trial `t` of the other study, or (None, why it does not fit)."""
    distributions = _distributions(config, t)
    if distributions is None:
        return None, "outside the search space"
    metrics = dict(t.user_attrs.get(METRICS) or {})
    for o, v in zip(other.study.all_objectives, t.values or ()):
        metrics.setdefault(o.metric, v)  # a trial recorded before metrics were kept: its told values
    missing = [o.metric for o in config.study.all_objectives if metrics.get(o.metric) is None]
    if missing:
        return None, f"without {missing[0]}"
    study = config.study
    limits = dict(zip(constraints_lib.keys(study.constraints), constraints_lib.values(study.constraints, metrics)))
    try:
        return optuna.trial.create_trial(
            params=dict(t.params), distributions=distributions,
            values=[float(metrics[o.metric]) for o in study.all_objectives],
            user_attrs={WARM_START: {"study": other.name, "number": t.number}, METRICS: metrics},
            constraints=limits or None), ""
    except ValueError:  # Optuna's own check: a value outside this study's distribution
        return None, "outside the search space"


def _distributions(config: Config, t: FrozenTrial) -> dict[str, BaseDistribution] | None:
    """This study's distribution of each of `t`'s params; None where `t`'s params are not exactly
    the parameters this space samples for them (define-by-run: the trial's own distributions)."""
    names = config.sampled_names
    if any(name not in names for name in t.params):
        return None
    search = config.study.search_space
    if search is None:
        return dict(t.distributions)
    if set(space.active(search, t.params)) != set(t.params):
        return None
    needed = {name for name in space.order(search) if space.is_active(search, name, t.params)}
    if needed != set(t.params):
        return None
    return {name: distribution(search[name]) for name in t.params}


def distribution(p: Any) -> BaseDistribution:
    """The Optuna distribution a search-space parameter is suggested from (sweep.store.samplers.suggest_all)."""
    if isinstance(p, CategoricalParam) or p.values is not None:
        return CategoricalDistribution(p.choices if isinstance(p, CategoricalParam) else p.values)
    if isinstance(p, FloatParam):
        return FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return IntDistribution(p.low, p.high, log=p.log, step=p.step)
