"""Freeze-thaw (`scheduler: {type: freeze_thaw}`): asha's pauses, with a model of learning curves
choosing which paused trial a free worker continues. Every decision reads only the stored study.

Trials pause at asha's rungs (min_steps * reduction_factor**k below train.steps; asha.py). Once
`initial_trials` trials have reported, a free worker looks at the paused trials asha would
promote (those in the top 1/reduction_factor of the trials that reached their rung): where there
is one, the curve model (curve_model.py: an ensemble of power laws over (configuration, step),
fitted with a fixed seed to every report of the study) predicts each one's value at the last step,
and the one with the highest expected improvement (EI) over the best value reported so far, per
step it costs to its next rung, goes on; one whose probability of beating that best is below
`min_probability` does not. Where none goes on, the worker starts a new trial. Once n_trials
have started, any paused trial worth it (by that probability) may go on, the best EI per step
first; the rest end PRUNED (asha's ending: base.py). A continuation records why (`freeze_thaw`
attribute: the prediction), which `status` shows; `plan` says what the next decision would be.

Under `new_trials: model` the model also picks a new trial's configuration (DyHPO's and DPL's
way: one model for both decisions): of `CANDIDATES` configurations drawn at random from the
search space (seeded by the scheduler's seed and the trial's number), the one with the highest
EI at the last step over the best value reported (`propose`, which the sampler asks:
sweep/store/samplers.py). It counts the reports a sampler view counts (RungView.reports: no
running trial's), so a new trial's params stay a function of the stored study.

This is the rule chosen on development seeds in the scheduler simulator (benchmarks/RESULTS.md,
"The freeze-thaw prototype"): letting the model also continue trials outside their rung's top
(DyHPO's and DPL's rule) helped on one benchmark family and cost on two. docs/schedulers.md says
it for users.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Annotated, Any, Literal, Mapping, Sequence

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import Field

from sweep.schedulers import base
from sweep.schedulers.asha import Asha, next_promotion
from sweep.schedulers.curve_model import Encoding, fit
from sweep.store import enqueue
from sweep.store.record import paused_rung
from sweep.store.samplers import RungView, derived_seed, suggest_all
from sweep.store.session import Session
from sweep.study.config import Config

log = logging.getLogger("sweep")
WHY = "freeze_thaw"  # trial user attribute: the prediction its latest continuation was decided on
CANDIDATES = 256  # random configurations the model picks a new trial's from, under `new_trials: model`


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A paused trial's predicted value at the last step, as one decision saw it (study units)."""
    number: int
    rung: int
    to: int  # the step it would train to: its next rung or the end
    mean: float
    std: float
    ei: float  # expected improvement over `best` (in the metric's units, >= 0)
    probability: float  # of beating `best`
    best: float

    def record(self) -> dict[str, Any]:
        """The `freeze_thaw` attribute: what status shows of the decision."""
        return {"rung": self.rung, "to": self.to, "mean": self.mean, "std": self.std, "ei": self.ei,
                "probability": self.probability, "best": self.best}


class FreezeThaw(Asha):
    """asha's rungs and keys, plus the model's: `initial_trials` reported before it decides,
    `min_probability` of beating the best for a paused trial to go on, the fit's `seed`, and who
    picks a new trial's configuration (`new_trials`: the sampler, or the model)."""

    initial_trials: Annotated[int, Field(ge=2)] = 5
    min_probability: Annotated[float, Field(ge=0, lt=1)] = 0.01
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0  # the fit's PRNG key takes 32 bits
    new_trials: Literal["sampler", "model"] = "sampler"

    def meaning(self) -> dict[str, Any]:
        # new_trials only where given: fingerprints stored before it existed stay equal.
        out = super().meaning()
        if out["new_trials"] == "sampler":
            del out["new_trials"]
        return out

    def check(self, study: Any) -> None:
        if self.initial_trials > study.n_trials:
            raise ValueError(f"scheduler.initial_trials: must be <= n_trials ({study.n_trials}): the model decides "
                             f"once that many trials have reported, got {self.initial_trials}")

    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        config = session.config
        kind, chosen = self.decision(session, states, trials)
        if kind == "relaxed":  # a study needs a best trial (asha's rule)
            relaxed = next_promotion(config, trials, relaxed=True)
            # No prediction went into it: its `freeze_thaw` attribute says so, not an older decision's.
            if relaxed is not None:
                session.set_trial_attr(relaxed.number, WHY, {"rung": relaxed.rung, "to": relaxed.to, "relaxed": True})
            if relaxed is not None and base.promote(session, relaxed.number, relaxed.to):
                log.info("trial %d: continued from rung %d, no trial completed yet, trains on to step %d",
                         relaxed.number, relaxed.rung, relaxed.to)
                return relaxed.number
            return None
        if chosen is None:
            return None
        # Recorded before the promotion, so that a continuation always has its reason: a kill in
        # between leaves the trial paused, and the same command makes the same decision again.
        session.set_trial_attr(chosen.number, WHY, chosen.record())
        if not base.promote(session, chosen.number, chosen.to):
            return None
        log.info("trial %d: continued from rung %d, predicted %s=%.4g ± %.2g at step %d (EI %.3g, P(better) %.2f), "
                 "trains on to step %d", chosen.number, chosen.rung, config.study.objective.metric, chosen.mean,
                 chosen.std, config.study.train.steps, chosen.ei, chosen.probability, chosen.to)
        return chosen.number

    def decision(self, session: Session, states: Mapping[int, TrialState],
                 trials: Sequence[FrozenTrial]) -> tuple[str, Prediction | None]:
        """What a free worker does now, read only: ("continue", its prediction), ("relaxed", None)
        (nothing is worth it, nothing else can run and none completed: asha's relaxed promotion),
        ("new", None) (start a trial, or end the paused ones where none may start), with the
        reason's kind: "none" (nothing paused), "warm-up", "no top", "no worth"."""
        config, paused_now = session.config, base.paused(trials)
        if not paused_now:
            return "none", None
        can_start = enqueue.counted(states, paused_now) < config.study.n_trials
        if can_start and sum(1 for t in trials if t.intermediate_values) < self.initial_trials:
            return "warm-up", None
        chosen = self.choose(config, trials, can_start)
        if chosen is not None:
            return "continue", chosen
        if (not can_start and not session.running() and not enqueue.waiting(states, paused_now)
                and TrialState.COMPLETE not in states.values()):
            return "relaxed", None
        return ("no top" if can_start and not self._top_of_rung(trials, config.study.objective.sign)
                else "no worth"), None

    def choose(self, config: Config, trials: Sequence[FrozenTrial], can_start: bool) -> Prediction | None:
        """The paused trial to continue on the stored `trials` (module docstring), None for none."""
        steps, sign = config.study.train.steps, config.study.objective.sign
        reporting = [t for t in trials if t.intermediate_values and t.distributions]
        paused = [t for t in reporting if paused_rung(t) is not None]
        if can_start:  # only asha's promotable trials; none: no fit (most decisions)
            top_of_rung = self._top_of_rung(trials, sign)
            paused = [t for t in paused if t.number in top_of_rung]
        if not paused:
            return None
        own = [{s: sign * v for s, v in t.intermediate_values.items() if math.isfinite(v)} for t in reporting]
        encoding = Encoding.of([t.distributions for t in reporting])
        x = np.stack([encoding.encode(t.params) for t in reporting])
        model = self._fit(x, own, steps, sign)
        ladder = [*self.rungs(steps), steps]
        # Each member's curve of every reporting trial at each step of the ladder (smaller is better).
        curves = {h: sign * model.predict(x, h / steps) for h in ladder}
        means = {h: c.mean(axis=0) for h, c in curves.items()}
        where = {t.number: i for i, t in enumerate(reporting)}
        # A paused trial's value at the last step: its own value at its rung plus the change the
        # model predicts from there (the model's curve through its last report), its spread the
        # members' plus how far such predictions missed for the trials that got there. Judged
        # against the best value reported so far (DPL's EI at the maximum budget).
        best = min(v for o in own for v in o.values())
        missed: dict[int, float] = {}  # by rung: a handful of rungs, hundreds of paused trials
        worth = []
        for t in paused:
            i, r = where[t.number], int(paused_rung(t) or 0)
            change = curves[steps][:, i] - curves[r][:, i]
            if r not in missed:
                missed[r] = _missed(own, means, r, steps)
            p = _prediction(t.number, r, self.next_stop(r, steps), own[i][r] + float(change.mean()),
                            math.hypot(float(change.std()), missed[r]), best, sign)
            if p.probability >= self.min_probability:
                worth.append(p)
        # EI per step it costs, to its next rung; ties: the lower number.
        return max(worth, key=lambda p: (p.ei / (p.to - p.rung), -p.number), default=None)

    def _fit(self, x: np.ndarray, own: Sequence[Mapping[int, float]], steps: int, sign: int) -> Any:
        """The curve model fitted to every report `own` (smaller-is-better units, by step) of the
        trials whose configurations `x` encodes."""
        rows = [i for i, o in enumerate(own) for _ in o]
        ts = [step / steps for o in own for step in sorted(o)]
        ys = [sign * o[step] for o in own for step in sorted(o)]  # back in the study's units
        return fit(x, np.asarray(rows), np.asarray(ts), np.asarray(ys), sign, self.seed)

    def propose(self, config: Config, trials: Sequence[FrozenTrial], number: int) -> dict[str, Any] | None:
        """The params of new trial `number` under `new_trials: model` (module docstring), from the
        stored `trials`; None (the sampler draws them) under `sampler` or before `initial_trials`
        trials have reported."""
        if self.new_trials != "model":
            return None
        steps, sign = config.study.train.steps, config.study.objective.sign
        counted = [(t, RungView.reports(t)) for t in trials if t.distributions and t.number != number]
        counted = [(t, r) for t, r in counted if r]
        if len(counted) < self.initial_trials:
            return None
        candidates = _candidates(config, derived_seed(self.seed, number, "candidates"), CANDIDATES)
        encoding = Encoding.of([t.distributions for t, _ in counted] + [d for _, d in candidates])
        x = np.stack([encoding.encode(t.params) for t, _ in counted])
        own = [{s: sign * v for s, v in r.items()} for _, r in counted]
        model = self._fit(x, own, steps, sign)
        # The horizon: the highest step of the ladder that initial_trials of them reported (BOHB's
        # rule), where the model interpolates; at the last step, early reports leave it to
        # extrapolate, and it did, confidently, for configurations no trial carried on.
        reached = [h for h in [*self.rungs(steps), steps] if sum(1 for o in own if h in o) >= self.initial_trials]
        h = max(reached, default=min(s for o in own for s in o))
        at = [(i, o[h]) for i, o in enumerate(own) if h in o]
        fitted = (sign * model.predict(x, h / steps)).mean(axis=0)
        missed = float(np.sqrt(np.mean([(v - fitted[i]) ** 2 for i, v in at])))
        predicted = sign * model.predict(np.stack([encoding.encode(p) for p, _ in candidates]), h / steps)
        best = min(v for _, v in at)
        picks = [_prediction(i, 0, h, float(m), math.hypot(float(sd), missed), best, sign)
                 for i, (m, sd) in enumerate(zip(predicted.mean(axis=0), predicted.std(axis=0)))]
        pick = max(picks, key=lambda p: (p.ei, -p.number))  # ties: the first drawn
        log.info("trial %d: the curve model picked its configuration among %d drawn at random: predicted %s=%.4g "
                 "± %.2g at step %d (EI %.3g)", number, len(candidates), config.study.objective.metric, pick.mean,
                 pick.std, h, pick.ei)
        return candidates[pick.number][0]

    def _top_of_rung(self, trials: Sequence[FrozenTrial], sign: int) -> set[int]:
        """The paused trials that rank in the top 1/reduction_factor of the trials that reached their rung."""
        out, tops = set(), {}  # rung -> the numbers of its top, ranked as asha ranks (ties: the lower number)
        for t in trials:
            r = paused_rung(t)
            if r is None:
                continue
            if r not in tops:
                reached = sorted((u for u in trials if r in u.intermediate_values),
                                 key=lambda u: (sign * u.intermediate_values[r], u.number))
                tops[r] = {u.number for u in reached[:len(reached) // self.reduction_factor]}
            if t.number in tops[r]:
                out.add(t.number)
        return out

    def plan_note(self) -> str:
        return (f"scheduler {self.type}: each goes on when it ranks in its rung's top and the curve model predicts "
                "it improves most, else ends PRUNED once no trial is left to start"
                + (f"; the model picks each new trial's configuration among {CANDIDATES} drawn at random"
                   if self.new_trials == "model" else ""))

    def next_decision(self, session: Session, states: Mapping[int, TrialState]) -> str | None:
        trials = session.trials()
        kind, chosen = self.decision(session, states, trials)
        metric, steps = session.config.study.objective.metric, session.config.study.train.steps
        if chosen is not None:
            return (f"a free worker continues trial {chosen.number} from step {chosen.rung} to {chosen.to}: "
                    f"predicted {metric}={chosen.mean:.4g} ± {chosen.std:.2g} at step {steps} "
                    f"(EI {chosen.ei:.3g}, P(better than {chosen.best:.4g}) {chosen.probability:.2f})")
        return {"none": None,
                "warm-up": f"a free worker starts a new trial: fewer than initial_trials ({self.initial_trials}) "
                           "trials have reported",
                "no top": "a free worker starts a new trial: no paused trial ranks in its rung's top "
                          f"1/{self.reduction_factor}",
                "relaxed": "a free worker continues the best paused trial of the highest rung: no trial completed",
                "no worth": f"no paused trial is predicted to beat {metric}'s best with probability >= "
                            f"{self.min_probability}: " + ("a free worker starts a new trial" if
                                                           enqueue.counted(states, base.paused(trials))
                                                           < session.config.study.n_trials
                                                           else "they end PRUNED once none runs"),
                }[kind]

    def status_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        return {"freeze_thaw": trial.user_attrs.get(WHY)}

    def export_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        return {"freeze_thaw": trial.user_attrs.get(WHY)}


def _candidates(config: Config, seed: int, n: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`n` configurations (params, distributions) drawn at random from the study's search space,
    as a trial of a throwaway in-memory study draws them (conditions and a define-by-run
    search_space included)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory"
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    finally:
        optuna.logging.set_verbosity(verbosity)
    out = []
    for _ in range(n):
        trial = study.ask()
        suggest_all(config, trial)
        out.append((dict(trial.params), dict(trial.distributions)))
    return out


def _missed(own: list[dict[int, float]], mean: Mapping[int, np.ndarray], r: int, h: int) -> float:
    """How far the model (`mean`: the members' mean curve at each step of the ladder) missed step
    `h` for the trials that reported there, from their value at `r` plus the predicted change: the
    root mean square. Fewer than 3 such trials: the spread of the values reported at `h` (or,
    before any, at all)."""
    missed = [v[h] - (v[r] + mean[h][i] - mean[r][i]) for i, v in enumerate(own) if h in v and r in v]
    if len(missed) >= 3:
        return float(np.sqrt(np.mean(np.square(missed))))
    at = [v[h] for v in own if h in v]
    return float(np.std(at)) if len(at) >= 3 else float(np.std([x for v in own for x in v.values()]))


def _prediction(number: int, rung: int, to: int, mean: float, std: float, best: float, sign: int) -> Prediction:
    """A normal of `mean` and `std` (smaller is better): its EI over `best` and its probability of
    beating it, reported in the study's direction."""
    std = max(std, 1e-9)
    z = (best - mean) / std
    cdf, pdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return Prediction(number, rung, to, sign * mean, std, max(0.0, (best - mean) * cdf + std * pdf), cdf, sign * best)
