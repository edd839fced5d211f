"""What the sampler sees of a study where a sweep scheduler pauses trials: five benchmark-only
views (issue 40 item 4) on sweep's StudyView and RungView (sweep/store/samplers.py), not the
product's behaviour.

Optuna's TPESampler learns from COMPLETE and PRUNED trials only (optuna/samplers/_tpe/sampler.py)
and samples at random until `n_startup_trials` of them exist; a trial paused by asha or
freeze_thaw is WAITING, so under them TPE samples at random for most of a study.

- `PausedAsPruned`: each paused trial (WAITING with `paused_at` and reports) is PRUNED at its
  last report, as Optuna's own pruners leave a stopped trial (TPE ranks PRUNED trials by the step
  they reached, then by their value there).
- `RungView` (BOHB's rule, Falkner et al. 2018, section 3.2: the model is fitted on the largest
  budget with enough observations): the sampler sees, at the highest step that at least
  `MIN_TRIALS` trials have reported (paused, running, finished alike), each of those trials as
  COMPLETE with its value there, and no other finished trial. Before any step has that many, it
  sees the study as it is. sweep's `sampler_sees: rung` is the same but for a running trial's
  reports, which it does not count.
- `RungBelow`: sweep's rule with the trials that stopped below that step shown PRUNED, not hidden.
- `RungWide`: sweep's rule at the highest step 3 * MIN_TRIALS trials reported.
- `Predicted`: once MIN_TRIALS trials have counted reports (RungView's), each of them COMPLETE
  with the value freeze_thaw's curve model predicts for it at the last step (its last counted
  report plus the model's change from there to the end; a finished trial its own value), so that
  TPE ranks trials that stopped at different steps on one scale. The horizon is
  SWEEP_BENCH_STEPS (train.steps; benchmarks/freeze_thaw_real.py sets it).

`sampler_view(cls)` patches sweep's RestartProofSampler in this process so that every draw sees
the study through `cls`; sampler_view_site/sitecustomize.py does it in every process of a real
`sweep run` (its workers too) started with that folder on PYTHONPATH and SWEEP_BENCH_SAMPLER_VIEW
set to a view's name.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from typing import Any, Iterator

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from sweep.store import samplers
from sweep.store.record import PAUSED_AT

MIN_TRIALS = 10  # the runs' TPE n_startup_trials: with fewer seen, TPE samples at random anyway


class PausedAsPruned(samplers.StudyView):
    """The study as the sampler sees it: a paused trial (WAITING with `paused_at`, reports so far)
    is PRUNED at its last report."""

    def seen(self, trials: list[Any]) -> list[Any]:
        out = []
        for t in trials:
            if t.state == TrialState.WAITING and t.user_attrs.get(PAUSED_AT) and t.intermediate_values:
                t = copy.copy(t)
                t.state = TrialState.PRUNED
            out.append(t)
        return out


class RungView(samplers.RungView):
    """sweep's RungView (sweep/store/samplers.py) at MIN_TRIALS, counting every finite report of
    every trial, a running one's too (module docstring)."""

    def __init__(self, study: optuna.Study) -> None:
        super().__init__(study, least=MIN_TRIALS)

    @staticmethod
    def reports(trial: Any) -> dict[int, float]:
        return {step: v for step, v in trial.intermediate_values.items() if math.isfinite(v)}


def patch(view: type[samplers.StudyView]) -> Any:
    """Make every RestartProofSampler draw in this process see the study through `view`; returns
    what it replaced."""
    cls = samplers.RestartProofSampler
    saved = cls._view
    cls._view = lambda self, study: view(study)
    return saved


@contextlib.contextmanager
def sampler_view(view: type[samplers.StudyView]) -> Iterator[None]:
    saved = patch(view)
    try:
        yield
    finally:
        samplers.RestartProofSampler._view = saved


class RungBelow(samplers.RungView):
    """sweep's RungView (sweep/store/samplers.py) with the trials that stopped below its step shown
    PRUNED at their last counted report (ranked below every trial at the step), not hidden."""

    def __init__(self, study: optuna.Study) -> None:
        super().__init__(study, least=MIN_TRIALS)

    def below(self, trial: Any, reports: dict[int, float]) -> Any:
        if not reports:
            return super().below(trial, reports)
        trial = copy.copy(trial)
        trial.state, trial.values, trial.intermediate_values = TrialState.PRUNED, None, reports
        return trial


class RungWide(samplers.RungView):
    """sweep's RungView (sweep/store/samplers.py) at the highest step that reduction_factor (3)
    times MIN_TRIALS trials reported: there, most trials seen were not promoted past it, so TPE's
    "bad" set is not only good configurations (at MIN_TRIALS, once that many trials passed a higher
    rung, all of them were promoted ones)."""

    def __init__(self, study: optuna.Study) -> None:
        super().__init__(study, least=3 * MIN_TRIALS)


class Predicted(samplers.StudyView):
    """Each trial with counted reports (sweep's RungView.reports: never a running trial's) shown
    COMPLETE at its predicted value at the last step (module docstring), once MIN_TRIALS have them;
    before, the study as it is. A trial without counted reports is seen as it is, but a finished one
    (it has none only where all its reports were not finite), which is hidden."""

    _fits: dict[Any, dict[int, float]] = {}  # one fit per stored state: seen() runs at every draw

    def seen(self, trials: list[Any]) -> list[Any]:
        counted = [samplers.RungView.reports(t) for t in trials]
        reporting = [(t, r) for t, r in zip(trials, counted) if r and t.distributions]
        if len(reporting) < MIN_TRIALS:
            return trials
        key = tuple((t.number, t.state, tuple(sorted(r.items()))) for t, r in reporting)
        if key not in self._fits:
            self._fits.clear()
            self._fits[key] = self._predict(reporting)
        predicted = self._fits[key]
        out = []
        for t, r in zip(trials, counted):
            if t.number in predicted and t.state != TrialState.COMPLETE:
                t = copy.copy(t)
                t.state, t.values = TrialState.COMPLETE, [predicted[t.number]]
            elif t.number not in predicted and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                continue
            out.append(t)
        return out

    def _predict(self, reporting: list[tuple[Any, dict[int, float]]]) -> dict[int, float]:
        from sweep.schedulers.curve_model import Encoding, fit

        steps = int(os.environ["SWEEP_BENCH_STEPS"])
        sign = 1 if self._study.direction == StudyDirection.MINIMIZE else -1
        encoding = Encoding.of([t.distributions for t, _ in reporting])
        x = np.stack([encoding.encode(t.params) for t, _ in reporting])
        rows, ts, ys = zip(*((i, step / steps, v) for i, (_, r) in enumerate(reporting) for step, v in sorted(r.items())))
        model = fit(x, np.asarray(rows), np.asarray(ts), np.asarray(ys), sign, 0)
        last = np.array([max(r) / steps for _, r in reporting], np.float32)
        change = (model.predict(x, 1.0) - model.predict(x, last)).mean(axis=0)
        return {t.number: float(r[max(r)] + change[i]) for i, (t, r) in enumerate(reporting)}


VIEWS = {"paused-as-pruned": PausedAsPruned, "rung": RungView, "rung below": RungBelow, "rung wide": RungWide,
         "predicted": Predicted}
