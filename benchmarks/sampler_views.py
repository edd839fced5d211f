"""What the sampler sees of a study where a sweep scheduler pauses trials: two benchmark-only
views (issue 40 item 4), not the product's behaviour.

Optuna's TPESampler learns from COMPLETE and PRUNED trials only (optuna/samplers/_tpe/sampler.py)
and samples at random until `n_startup_trials` of them exist; a trial paused by asha or
freeze_thaw is WAITING, so under them TPE samples at random for most of a study.

- `PausedAsPruned`: each paused trial (WAITING with `paused_at` and reports) is PRUNED at its
  last report, as Optuna's own pruners leave a stopped trial (TPE ranks PRUNED trials by the step
  they reached, then by their value there).
- `RungView` (BOHB's rule, Falkner et al. 2018, section 3.2: the model is fitted on the largest
  budget with enough observations): the sampler sees, at the highest step that at least
  `MIN_TRIALS` trials have reported (paused, running, finished alike), each of those trials as
  COMPLETE with its value there, and no other trial. Before any step has that many, it sees the
  study as it is. Once `MIN_TRIALS` trials have finished, that step is the last one and the view
  is the study's COMPLETE trials.

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


class _View:
    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def seen(self, trials: list[Any]) -> list[Any]:
        raise NotImplementedError

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[Any]:
        seen = self.seen(self._study._get_trials(deepcopy=False, states=None, use_cache=use_cache))
        return [t for t in seen if states is None or t.state in states]

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        return self._get_trials(deepcopy, states)


class PausedAsPruned(_View):
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


class RungView(_View):
    """The trials that reported at the highest step at least MIN_TRIALS reported, COMPLETE with
    their value there (module docstring); the study as it is before any step has that many."""

    def seen(self, trials: list[Any]) -> list[Any]:
        reported: dict[int, int] = {}
        for t in trials:
            for step, value in t.intermediate_values.items():
                if math.isfinite(value):
                    reported[step] = reported.get(step, 0) + 1
        enough = [step for step, n in reported.items() if n >= MIN_TRIALS]
        if not enough:
            return trials
        at = max(enough)
        out = []
        for t in trials:
            value = t.intermediate_values.get(at)
            if value is not None and math.isfinite(value):
                t = copy.copy(t)
                t.state, t.values = TrialState.COMPLETE, [value]
                out.append(t)
            elif t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                out.append(t)  # running or waiting: the sampler does not learn from them
        return out


VIEWS = {"paused-as-pruned": PausedAsPruned, "rung": RungView}


def patch(view: type[_View]) -> dict[str, Any]:
    """Make every RestartProofSampler draw in this process see the study through `view`; returns
    what it replaced."""
    cls = samplers.RestartProofSampler
    saved = {n: getattr(cls, n) for n in ("infer_relative_search_space", "sample_relative", "sample_independent")}
    cls.infer_relative_search_space = lambda self, study, trial: saved["infer_relative_search_space"](
        self, view(study), trial)
    cls.sample_relative = lambda self, study, trial, space: saved["sample_relative"](self, view(study), trial, space)
    cls.sample_independent = lambda self, study, trial, name, dist: saved["sample_independent"](
        self, view(study), trial, name, dist)
    return saved


@contextlib.contextmanager
def sampler_view(view: type[_View]) -> Iterator[None]:
    saved = patch(view)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(samplers.RestartProofSampler, n, f)


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


VIEWS["rung below"] = RungBelow
