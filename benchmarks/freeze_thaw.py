"""A freeze-thaw scheduler, a prototype (issue 40): a model of learning curves decides, at each
free worker, whether to continue a paused trial or to start a new one. Not a scheduler of the
product yet: a study names it by import path (`scheduler: {type: "freeze_thaw:FreezeThaw", ...}`,
benchmarks/ on the path), as benchmarks/scheduler_sim.py does; benchmarks/RESULTS.md says how it
does so far.

Trials pause at asha's rungs (min_steps * reduction_factor**k; sweep/schedulers/asha.py). Once
`initial_trials` trials have reported, every decision fits the curve model (curve_model.py: an
ensemble of power laws over (configuration, step), seeded) to every report of the study. A paused
trial's value at the last step is predicted from its own last report plus the model's predicted
change from there; its spread is the members' plus how far such predictions missed for trials
that got there; its expected improvement (EI) is over the best value reported so far. A new
trial's EI is the `new_quantile` quantile over `candidates` random configurations (the sampler
then draws the new trial's own). Each is weighed per step it costs (to the next rung; a new one:
to the first). The paused trials asha would promote are always candidates; another goes on only
where its EI per step beats a new trial's, and only with `beyond_top: true` (the default here;
`false`, the rule chosen on development seeds, continues asha's promotable trials only, in the
model's order, and fits the model only where one exists). A paused trial whose probability to beat the best is
below `min_probability` is not continued; once n_trials have started and none is worth
continuing, the paused trials end PRUNED (as asha's do). Each continuation records why
(`freeze_thaw` attribute), which `status` shows. Every decision is a function of the stored study.
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
from curve_model import Encoding, fit
from sweep.store import enqueue
from sweep.store.record import paused_rung
from sweep.store.session import Session
from sweep.study.config import Config

log = logging.getLogger("sweep")
WHY = "freeze_thaw"  # trial user attribute: the prediction its latest continuation was decided on


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A paused trial's predicted value at the last step, as one decision saw it."""
    number: int
    rung: int
    mean: float
    std: float
    ei: float  # expected improvement over `best` (in the metric's units, >= 0)
    probability: float  # of beating `best`
    best: float


@dataclasses.dataclass(frozen=True)
class Choice:
    """A decision: continue `continued` (None: start a new trial, or nothing), with every paused
    trial's prediction and the best new configuration's EI."""
    continued: Prediction | None
    predictions: list[Prediction]
    new_ei: float


class FreezeThaw(Asha):
    """asha's rungs and keys, plus the model's: `initial_trials` reported before it decides,
    `candidates` random configurations for a new trial's EI, `min_probability`, `seed`."""

    initial_trials: Annotated[int, Field(ge=2)] = 5
    candidates: Annotated[int, Field(ge=1, le=10000)] = 100
    min_probability: Annotated[float, Field(ge=0, lt=1)] = 0.01
    new_quantile: Annotated[float, Field(ge=0, le=1)] = 0.9
    beyond_top: bool = True  # may continue a paused trial outside its rung's top (False: only asha's)
    seed: int = 0

    def promote_next(self, session: Session, states: Mapping[int, TrialState],
                     trials: Sequence[FrozenTrial]) -> int | None:
        config, paused_now = session.config, base.paused(trials)
        if not paused_now:
            return None
        can_start = enqueue.counted(states, paused_now) < config.study.n_trials
        reporting = [t for t in trials if t.intermediate_values]
        if can_start and len(reporting) < self.initial_trials:
            return None
        choice = self.choose(config, trials, can_start)
        if choice.continued is None:
            if (not can_start and not session.running() and not enqueue.waiting(states, paused_now)
                    and TrialState.COMPLETE not in states.values()):
                relaxed = next_promotion(config, trials, relaxed=True)  # a study needs a best trial (asha's rule)
                if relaxed is not None and base.promote(session, relaxed.number, relaxed.to):
                    log.info("trial %d: continued from rung %d, no trial completed yet, trains on to step %d",
                             relaxed.number, relaxed.rung, relaxed.to)
                    return relaxed.number
            return None
        p = choice.continued
        to = self.next_stop(p.rung, config.study.train.steps)
        session.set_trial_attr(p.number, WHY, {"rung": p.rung, "to": to, "mean": p.mean, "std": p.std, "ei": p.ei,
                                               "probability": p.probability, "best": p.best, "new_ei": choice.new_ei})
        if not base.promote(session, p.number, to):
            return None
        log.info("trial %d: continued from rung %d, predicted %s=%.4g ± %.2g at step %d (EI %.3g, P(better) %.2f; "
                 "a new trial's EI %.3g), trains on to step %d", p.number, p.rung, config.study.objective.metric,
                 p.mean, p.std, config.study.train.steps, p.ei, p.probability, choice.new_ei, to)
        return p.number

    def choose(self, config: Config, trials: Sequence[FrozenTrial], can_start: bool) -> Choice:
        """The decision on the stored `trials` (read only): fit, predict, compare (module docstring)."""
        steps, sign = config.study.train.steps, config.study.objective.sign
        reporting = [t for t in trials if t.intermediate_values and t.distributions]
        paused = [t for t in reporting if paused_rung(t) is not None]
        if not paused:
            return Choice(None, [], 0.0)
        top_of_rung = self._top_of_rung(trials, sign)
        if can_start and not self.beyond_top and not top_of_rung:
            return Choice(None, [], 0.0)  # only asha's promotable trials may go on: none, no fit (most decisions)
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
        reports = sorted(zip(ts, (sign * v for v in ys)))  # (step fraction, value with smaller better)
        ladder = [*self.rungs(steps), steps]
        # Each member's curve of every reporting trial at each step of the ladder (smaller is better).
        curves = {h: sign * model.predict(x, h / steps) for h in ladder}
        own = [{s: sign * v for s, v in t.intermediate_values.items() if math.isfinite(v)} for t in reporting]
        where = {t.number: i for i, t in enumerate(reporting)}
        predictions = []
        # A paused trial's value at the last step: its own value at its rung plus the change the
        # model predicts from there (the model's curve through its last report), its spread the
        # members' plus how far such predictions missed for the trials that got there. Judged
        # against the best value reported so far (DPL's EI at the maximum budget).
        best = min(v for _, v in reports)
        means = {k: c.mean(axis=0) for k, c in curves.items()}
        missed: dict[int | None, float] = {}  # by rung: a handful of rungs, hundreds of paused trials
        for t in paused:
            i, r = where[t.number], int(paused_rung(t) or 0)
            change = curves[steps][:, i] - curves[r][:, i]
            mean = own[i][r] + float(change.mean())
            if r not in missed:
                missed[r] = _missed(own, means, r, steps)
            std = math.hypot(float(change.std()), missed[r])
            predictions.append(_prediction(t.number, r, mean, std, best, sign))
        new_ei = 0.0
        if can_start:  # a new trial: the model's value at the last step for a random configuration
            rng = np.random.RandomState((self.seed * 1_000_003 + len(trials)) % 2**32)
            fresh = sign * model.predict(encoding.random(rng, self.candidates), 1.0)
            spread = _missed(own, means, None, steps)
            eis = [_prediction(-1, 0, float(fresh[:, j].mean()), math.hypot(float(fresh[:, j].std()), spread),
                               best, sign).ei for j in range(fresh.shape[1])]
            new_ei = float(np.quantile(eis, self.new_quantile))  # the sampler draws better than at random
        worth = [p for p in predictions if p.probability >= self.min_probability]
        first = self.rungs(steps)[0] if self.rungs(steps) else steps
        # EI per step it costs: to the next rung for a paused trial, to the first for a new one. A
        # paused trial asha would promote (the top 1/reduction_factor at its rung) goes on before a
        # new trial starts; another one only where its EI per step beats a new trial's.
        cost = {p.number: self.next_stop(p.rung, steps) - p.rung for p in worth}
        chosen = [p for p in worth if p.number in top_of_rung or not can_start
                  or (self.beyond_top and p.ei / cost[p.number] > new_ei / first)]
        top = max(chosen, key=lambda p: (p.ei / cost[p.number], -p.number), default=None)
        if top is None:
            return Choice(None, predictions, new_ei)
        return Choice(top, predictions, new_ei)

    def _top_of_rung(self, trials: Sequence[FrozenTrial], sign: int) -> set[int]:
        """The paused trials that rank in the top 1/reduction_factor of the trials that reached their rung."""
        out, cutoff = set(), {}  # rung -> the value a trial there must reach (None: no top yet)
        for t in trials:
            r = paused_rung(t)
            if r is None:
                continue
            if r not in cutoff:
                reached = sorted(sign * u.intermediate_values[r] for u in trials if r in u.intermediate_values)
                top = len(reached) // self.reduction_factor
                cutoff[r] = reached[top - 1] if top else None
            if cutoff[r] is not None and sign * t.intermediate_values[r] <= cutoff[r]:
                out.add(t.number)
        return out

    def plan_note(self) -> str:
        return (f"scheduler {self.type}: each goes on when the curve model predicts it improves most, else ends "
                "PRUNED once no trial is left to start")

    def status_fields(self, trial: FrozenTrial) -> dict[str, Any]:
        return {"freeze_thaw": trial.user_attrs.get(WHY)}


def _best_by(reports: Sequence[tuple[float, float]], t: float) -> float:
    """The best (smallest, sign applied) value reported at a step fraction <= t; else the best of all."""
    within = [v for s, v in reports if s <= t + 1e-12]
    return min(within) if within else min(v for _, v in reports)


def _missed(own: list[dict[int, float]], mean: Mapping[int, np.ndarray], r: int | None, h: int) -> float:
    """How far the model (`mean`: the members' mean curve at each step of the ladder) missed step
    `h` for the trials that reported there: from their value at `r` plus the predicted change
    (None: the model's value alone), the root mean square. Fewer than 3 such trials: the spread of
    the values reported at `h` (or, before any, at all)."""
    missed = [v[h] - ((v[r] + mean[h][i] - mean[r][i]) if r is not None else mean[h][i])
              for i, v in enumerate(own) if h in v and (r is None or r in v)]
    if len(missed) >= 3:
        return float(np.sqrt(np.mean(np.square(missed))))
    at = [v[h] for v in own if h in v]
    return float(np.std(at)) if len(at) >= 3 else float(np.std([x for v in own for x in v.values()]))


def _prediction(number: int, rung: int, mean: float, std: float, best: float, sign: int) -> Prediction:
    """A normal of `mean` and `std` (smaller is better): its EI over `best` and its probability of
    beating it, reported in the study's direction."""
    std = max(std, 1e-9)
    z = (best - mean) / std
    cdf, pdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return Prediction(number, rung, sign * mean, std, max(0.0, (best - mean) * cdf + std * pdf), cdf, sign * best)
