"""Population-based training (`scheduler: {type: pbt}`): members pause every `interval_steps`;
once every member of a population has paused at a step, the worst `quantile` copy the whole
training state of a better member at that step and perturb its float hyperparameters; then each
member goes on to the next interval. docs/schedulers.md says it for users.

Populations are consecutive blocks of `population` trial numbers (trials 0-7, 8-15, ... with 8):
a member is only ever compared with, and copies, members of its own population. Every decision
is a function of the stored study and `train.seed`, recorded before it is applied, so a kill at
any moment and the same command again make the same decisions:

1. A member reaches an interval step, its checkpoint there is on disk, it pauses (Optuna's
   WAITING with `paused_at`, as for asha: sweep/schedulers/base.py).
2. When every member of the population has paused at that step, the first free worker (under the
   ask lock) ranks them by their value there and records the decision as a study user attribute
   `pbt:<population>:<step>`: for each of the worst floor(quantile * members), the better
   members it may copy, in a seeded random order.
3. It applies the decision, each recipient once (its `lineage` entry for the step is the mark):
   the first donor whose checkpoint at the step verifies (checksum) is copied into the recipient's
   folder as that step (the recipient's own steps go: they are another lineage now), its
   evaluation there becomes the recipient's (Optuna's intermediate value and `eval:<step>`), its
   params, float ones perturbed or resampled, become the recipient's `pbt_params`. A damaged
   donor step is quarantined and never copied; the next donor is tried (none: the recipient goes
   on with its own state).
4. Then the members at the step are promoted one by one (lowest number first) to the next
   interval or the end. A member's value is its best evaluation since its latest exploit.

Only float hyperparameters change at an exploit (floats are traced: no recompilation); the
others are the donor's, which define the state's shapes. `python -m sweep replay` retrains a
member's lineage from scratch (sweep/schedulers/replay.py).
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
from typing import Annotated, Any, Mapping, Sequence

from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import Field, model_validator

from sweep.checkpoints import integrity
from sweep.checkpoints.steps import kept_steps
from sweep.schedulers import base
from sweep.store.record import (DATA_SHAPES_ATTR, LINEAGE, PAUSED_AT, PBT_PARAMS, RUNG_TARGET, eval_attr,
                                is_warm_start, params_in_force, paused_rung)
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.study.scheduler_keys import MAX_STEP

log = logging.getLogger("sweep")
# Study user attribute: {recipient: {"donors": [in the order to try], "value": its own value at the step}}.
DECISION_ATTR = "pbt:{population}:{step}"


class Pbt(base.Scheduler):
    """`scheduler: {type: pbt, population, interval_steps, ...}`: populations of `population` trials
    that pause every `interval_steps`, where the worst `quantile` copy the state of a better member
    and perturb its float hyperparameters."""

    population: Annotated[int, Field(ge=2)] | None = None
    interval_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    quantile: Annotated[float, Field(gt=0, le=0.5)] = 0.25  # the worst share copies the best share
    # An exploited float hyperparameter is multiplied by one of these (Ray Tune's PBT: 0.8, 1.2).
    perturbation_factors: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)] = [0.8, 1.2]
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25  # else perturbed

    first_key = "interval_steps"
    follows_curves = False  # an exploit copies another member's state (sweep/run/simulator.py cannot replay it)
    first_what = "the first interval"
    pause_word = "step"

    @model_validator(mode="after")
    def _required(self) -> Pbt:
        for key in ("population", "interval_steps"):  # not required fields: the message names the type
            if getattr(self, key) is None:
                raise ValueError(f"{key}: is required with type {self.type}")
        return self

    def rungs(self, steps: int) -> list[int]:
        """Every multiple of interval_steps below `steps`."""
        return list(range(self.first, steps, self.first))

    def check(self, study: Any) -> None:
        population, quantile, n_trials = int(self.population), self.quantile, study.n_trials  # type: ignore[arg-type]
        if population > n_trials:
            raise ValueError(f"scheduler.population: must be <= n_trials ({n_trials}): the first population "
                             f"is the first trials, got {population}")
        if math.floor(population * quantile + 1e-9) < 1:
            raise ValueError(f"scheduler.quantile: quantile * population must be >= 1 (one member at least copies "
                             f"another at each interval; population {population}), got {quantile}")
        last = n_trials % population
        if last and math.floor(last * quantile + 1e-9) < 1:
            raise ValueError(f"n_trials: leaves a last population of {last} (population {population}) in which no "
                             f"member copies another (quantile {quantile}); use a multiple of the population, "
                             f"got {n_trials}")
        if study.warm_start is not None:
            raise ValueError("warm_start: not with scheduler pbt (its observations take the first trial numbers, "
                             "which make up the populations), got a warm start")
        if study.checkpoint.remote is not None:
            raise ValueError("scheduler.type: pbt copies a member's checkpoint into another's folder on this "
                             "host's disk; it does not run with checkpoint.remote yet, got 'pbt'")
        if study.checkpoint.ram is not None:
            raise ValueError("scheduler.type: pbt copies a member's checkpoint folder in the workdir; it does not run "
                             "with checkpoint.ram yet (a member's RAM steps would be another lineage), got 'pbt'")

    def pause_at(self, config: Config, trial: FrozenTrial) -> int | None:
        """A new member pauses at the first interval, one that goes on at the step its promotion
        recorded (`rung_target`)."""
        steps = config.study.train.steps
        target = int(trial.user_attrs.get(RUNG_TARGET, self.first))
        return target if target < steps else None

    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        return promote_next(session, states, trials)

    def plan_note(self) -> str:
        return "scheduler pbt: each goes on once its whole population paused at its step, after the exploits there"

    def status_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        return {"lineage": trial.user_attrs.get(LINEAGE, []),
                "params_in_force": params_in_force(trial)}  # the table shows these

    def export_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        return {LINEAGE: trial.user_attrs.get(LINEAGE, [])}  # its hyperparameters are those in force


def active(config: Config) -> bool:
    """Whether the study's scheduler is pbt."""
    return isinstance(config.study.scheduler, Pbt)


def _scheduler(config: Config) -> Pbt:
    s = config.study.scheduler
    assert isinstance(s, Pbt), type(s)
    return s


def population_of(config: Config, number: int) -> int:
    return number // int(_scheduler(config).population)  # type: ignore[arg-type]


def population_size(config: Config, index: int) -> int:
    """Members of population `index`: `population`, the last one what n_trials leaves (a block
    past n_trials, after n_trials was lowered, counts as whole: it never completes, its paused
    members end PRUNED with the study)."""
    size = int(_scheduler(config).population)  # type: ignore[arg-type]
    left = config.study.n_trials - index * size
    return min(size, left) if left > 0 else size


def exploited(config: Config, members: int) -> int:
    """How many of `members` copy another at an exploit: floor(quantile * members) (float-safe)."""
    return math.floor(members * _scheduler(config).quantile + 1e-9)


def decide(config: Config, members: Sequence[FrozenTrial], step: int) -> dict[str, dict[str, Any]]:
    """{recipient: {"donors": in the order to try, "value": its own value at `step`}}: the worst
    floor(quantile * n) members by their value at `step` (ties: the higher number is worse) copy
    one of the best as many, in a seeded order. Its own value is kept here, before the copy
    replaces it, for its lineage entry (a kill mid-copy must not record the donor's as its own)."""
    sign = config.study.objective.sign
    ranked = sorted(members, key=lambda t: (sign * t.intermediate_values[step], t.number))
    k = exploited(config, len(ranked))
    if k == 0:
        return {}
    top = [t.number for t in ranked[:k]]
    seed = config.study.train.seed
    return {str(t.number): {"donors": random.Random(f"pbt:{seed}:{step}:{t.number}").sample(top, len(top)),
                            "value": t.intermediate_values[step]} for t in ranked[-k:]}


def explore(config: Config, donor: FrozenTrial, recipient: int, step: int) -> dict[str, Any]:
    """The donor's params in force with each float one (a FloatDistribution) resampled with
    `resample_probability`, else multiplied by one of `perturbation_factors`; clipped to its range
    (and its step). Seeded by (train.seed, recipient, step, donor): the same every run."""
    s = _scheduler(config)
    rng = random.Random(f"pbt-explore:{config.study.train.seed}:{recipient}:{step}:{donor.number}")
    params = params_in_force(donor)
    for name, dist in sorted(donor.distributions.items()):
        if not isinstance(dist, FloatDistribution) or name not in params:
            continue  # ints and categoricals are the donor's: they define the state's shapes
        if rng.random() < s.resample_probability:
            value = (math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))) if dist.log
                     else rng.uniform(dist.low, dist.high))
        else:
            value = float(params[name]) * rng.choice(s.perturbation_factors)
        if dist.step is not None:
            value = dist.low + round((value - dist.low) / dist.step) * dist.step
        params[name] = float(min(dist.high, max(dist.low, value)))
    return params


def promote_next(session: Session, states: Mapping[int, TrialState], trials: Sequence[FrozenTrial]) -> int | None:
    """Under the ask lock: the member to go on now, if any (see the module's docstring); its number.
    The lowest population first, in it the lowest step members wait at."""
    config = session.config
    populations: dict[int, list[FrozenTrial]] = {}
    for t in trials:  # the started members: not an enqueued trial still waiting, nor a warm-start copy
        if not is_warm_start(t) and (PAUSED_AT in t.user_attrs or t.state != TrialState.WAITING):
            populations.setdefault(population_of(config, t.number), []).append(t)
    for index in sorted(populations):
        members = [t for t in populations[index] if t.state != TrialState.FAIL]
        waiting = [t for t in members if paused_rung(t) is not None]
        if not waiting or len(populations[index]) < population_size(config, index):
            continue
        step = min(int(paused_rung(t)) for t in waiting)  # type: ignore[arg-type]
        key = DECISION_ATTR.format(population=index, step=step)
        decision = session.study_attrs().get(key)
        # Decided only once every member waits at the step: not one RUNNING there (adopted after
        # a kill between its pause's two writes, restoring the step a copy would replace).
        if decision is None and not all(paused_rung(t) == step for t in members):
            continue
        if decision is None:  # recorded before anything is applied: a kill re-applies the same
            decision = decide(config, members, step)
            session.set_study_attr(key, decision)
            decision = session.study_attrs()[key]  # a racing worker's, where it came first
        _apply(session, {t.number: t for t in members}, step, decision)
        number = min(t.number for t in waiting if paused_rung(t) == step)
        to = _scheduler(config).next_stop(step, config.study.train.steps)
        if base.promote(session, number, to):
            log.info("trial %d: goes on from step %d to step %d with params %s", number, step, to,
                     params_in_force(session.trial(number)))
            return number
    return None


def _apply(session: Session, members: Mapping[int, FrozenTrial], step: int,
           decision: Mapping[str, Mapping[str, Any]]) -> None:
    """Each recipient of `decision` without its lineage entry at `step`: copy a donor (see the
    module's docstring); the entry is written last, so a kill before it does it all again."""
    config, metric = session.config, session.config.study.objective.metric
    for key in sorted(decision, key=int):
        recipient = session.trial(int(key))
        lineage = list(recipient.user_attrs.get(LINEAGE, []))
        if any(e["step"] == step for e in lineage):
            continue
        # Its params before this step: from its lineage, not `pbt_params`, which a copy cut short
        # by a kill may have set already.
        own = next((dict(e["new_params"]) for e in reversed(lineage) if e["source"] is not None),
                   dict(recipient.params))
        entry: dict[str, Any] = {"step": step, "source": None, "source_step": None, "source_checksum": None,
                                 "source_value": None, "old_value": decision[key]["value"],
                                 "old_params": own, "new_params": own}
        for number in decision[key]["donors"]:
            if number not in members:  # it failed since the decision: not a donor any more
                continue
            donor = members[number]
            digest = _intact(config, donor, step)
            if digest is None:
                continue
            new = explore(config, donor, recipient.number, step)
            _copy(config, donor.number, recipient.number, step, digest)
            value = donor.intermediate_values[step]
            session.set_intermediate(recipient.number, step, value)
            if eval_attr(step) in donor.user_attrs:
                session.set_trial_attr(recipient.number, eval_attr(step), donor.user_attrs[eval_attr(step)])
            session.set_trial_attr(recipient.number, PBT_PARAMS, new)
            entry.update(source=number, source_step=step, source_checksum=digest, source_value=value, new_params=new)
            log.info("trial %d: exploit at step %d: copies trial %d (%s=%r, its own %r), params %s -> %s",
                     recipient.number, step, number, metric, value, entry["old_value"], own, new)
            break
        else:
            log.warning("trial %d: exploit at step %d: every donor's checkpoint there is damaged; it goes on with "
                        "its own", recipient.number, step)
        session.set_trial_attr(recipient.number, LINEAGE, [*lineage, entry])


def _intact(config: Config, donor: FrozenTrial, step: int) -> str | None:
    """The checksum of the donor's step `step` where it restores and verifies; None (the step
    quarantined where it is damaged) where it does not: damage is never cloned."""
    from sweep.checkpoints.folder import DamagedCheckpoint
    from sweep.train.state import initial_state, trial_checkpoints

    folder = config.checkpoint_dir(donor.number)
    if step not in kept_steps(folder):
        log.warning("trial %d: its checkpoint at step %d is missing: not copied", donor.number, step)
        return None
    fresh = initial_state(config, donor.number, config.hyperparameters(params_in_force(donor)), abstract=True,
                          data_shapes=donor.user_attrs.get(DATA_SHAPES_ATTR))
    ckpt = trial_checkpoints(config, donor.number, folder, read_only=True)
    try:
        ckpt.restore_verified(step, fresh.state)
    except DamagedCheckpoint as exc:
        integrity.quarantine(folder, step, str(exc), f"trial {donor.number}")
        return None
    finally:
        ckpt.close()
    return integrity.read_checksum(folder, step)


def _copy(config: Config, donor: int, recipient: int, step: int, digest: str) -> None:
    """The donor's step into the recipient's folder as its only step (its own steps removed:
    renamed to a dot-name first, so a kill leaves no half-removed step a restore would read)."""
    src, dst = config.checkpoint_dir(donor), config.checkpoint_dir(recipient)
    dst.mkdir(parents=True, exist_ok=True)
    for debris in dst.glob(".*.pbt-old"):  # a kill between a rename and its removal
        shutil.rmtree(debris, ignore_errors=True)
    for old in kept_steps(dst):
        gone = dst / f".{old}.pbt-old"
        shutil.rmtree(gone, ignore_errors=True)
        os.rename(dst / str(old), gone)
        shutil.rmtree(gone)
        integrity.checksum_file(dst, old).unlink(missing_ok=True)
    integrity.write_checksum(dst, step, digest)
    integrity.install_step(dst, step, lambda tmp: shutil.copytree(src / str(step), tmp), "pbt")


def lineage_path(trials: Mapping[int, FrozenTrial], number: int, upto: int) -> list[tuple[int, int, int, dict]]:
    """The segments that made member `number`'s state at step `upto`, oldest first: (member whose
    run trained it, from step, to step, the params it trained with); `python -m sweep replay`."""
    t = trials[number]
    exploits = [e for e in t.user_attrs.get(LINEAGE, []) if e.get("source") is not None and e["step"] <= upto]
    if not exploits:
        return [(number, 0, upto, dict(t.params))] if upto > 0 else []
    last = max(exploits, key=lambda e: e["step"])
    tail = [(number, int(last["step"]), upto, dict(last["new_params"]))] if upto > last["step"] else []
    return [*lineage_path(trials, int(last["source"]), int(last["step"])), *tail]
