"""What the sampler sees of a study where a sweep scheduler pauses trials: four benchmark-only
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

`sampler_view(cls)` patches sweep's RestartProofSampler in this process so that every draw sees
the study through `cls`; sampler_view_site/sitecustomize.py does it in every process of a real
`sweep run` (its workers too) started with that folder on PYTHONPATH and SWEEP_BENCH_SAMPLER_VIEW
set to a view's name.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Iterator

import optuna
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


VIEWS = {"paused-as-pruned": PausedAsPruned, "rung": RungView, "rung below": RungBelow, "rung wide": RungWide}
