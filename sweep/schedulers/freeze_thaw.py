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

This is the rule chosen on development seeds in the scheduler simulator (benchmarks/RESULTS.md,
"The freeze-thaw prototype"): letting the model also continue trials outside their rung's top
(DyHPO's and DPL's rule) helped on one benchmark family and cost on two. docs/schedulers.md says
it for users.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Annotated, Any, Mapping, Sequence

import numpy as np
from optuna.trial import FrozenTrial, TrialState
from pydantic import Field

from sweep.schedulers import base
from sweep.schedulers.asha import Asha, next_promotion
from sweep.schedulers.curve_model import Encoding, fit
from sweep.store import enqueue
from sweep.store.record import paused_rung
from sweep.store.session import Session
from sweep.study.config import Config

log = logging.getLogger("sweep")
WHY = "freeze_thaw"  # trial user attribute: the prediction its latest continuation was decided on


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
    `min_probability` of beating the best for a paused trial to go on, the fit's `seed`."""

    initial_trials: Annotated[int, Field(ge=2)] = 5
    min_probability: Annotated[float, Field(ge=0, lt=1)] = 0.01
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0  # the fit's PRNG key takes 32 bits

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
        encoding = Encoding.of([t.distributions for t in reporting])
        x = np.stack([encoding.encode(t.params) for t in reporting])
        rows, ts, ys = [], [], []
        for i, t in enumerate(reporting):
            for step, value in sorted(t.intermediate_values.items()):
                if math.isfinite(value):
                    rows.append(i)
                    ts.append(step / steps)
                    ys.append(value)
        model = fit(x, np.asarray(rows), np.asarray(ts), np.asarray(ys), sign, self.seed)
        ladder = [*self.rungs(steps), steps]
        # Each member's curve of every reporting trial at each step of the ladder (smaller is better).
        curves = {h: sign * model.predict(x, h / steps) for h in ladder}
        means = {h: c.mean(axis=0) for h, c in curves.items()}
        own = [{s: sign * v for s, v in t.intermediate_values.items() if math.isfinite(v)} for t in reporting]
        where = {t.number: i for i, t in enumerate(reporting)}
        # A paused trial's value at the last step: its own value at its rung plus the change the
        # model predicts from there (the model's curve through its last report), its spread the
        # members' plus how far such predictions missed for the trials that got there. Judged
        # against the best value reported so far (DPL's EI at the maximum budget).
        best = min(sign * y for y in ys)
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
                "it improves most, else ends PRUNED once no trial is left to start")

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
