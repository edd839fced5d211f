"""Optuna samplers and pruners from the study file, and drawing a trial's params in file order."""

from __future__ import annotations

import collections
import copy
import difflib
import functools
import hashlib
import importlib.util
import inspect
import itertools
import logging
import math
from typing import Any, Callable, Container, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from sweep.errors import ConfigError
from sweep.internals import sampler_random_states, trials_as_samplers_read
from sweep.store.record import paused_rung
from sweep.study import space
from sweep.study.config import PRUNER_CLASSES, SAMPLER_CLASSES, Config
from sweep.study.params import CategoricalParam, FloatParam, IntParam
from sweep.words import count


def suggest_all(config: Config, trial: optuna.Trial) -> dict[str, Any]:
    """Sample (or, for an adopted trial, read back) every active param, parents before the
    parameters their conditions guard, else in file order (sweep/study/space.py)."""
    if config.study.search_space is None:  # define-by-run: the trial module's own suggests
        returned = config.trial_module.search_space(trial)
        # A returned mapping adds derived values (recomputed alike for an adopted trial).
        return {**trial.params, **(dict(returned) if isinstance(returned, Mapping) else {})}
    params: dict[str, Any] = {}
    for name in space.order(config.study.search_space):
        p = config.study.search_space[name]
        if not space.is_active(config.study.search_space, name, params):
            continue  # absent from the trial's params: the trial's default applies
        if isinstance(p, CategoricalParam) or p.values is not None:
            params[name] = trial.suggest_categorical(name, p.choices if isinstance(p, CategoricalParam) else p.values)
        elif isinstance(p, FloatParam):
            params[name] = trial.suggest_float(name, p.low, p.high, log=p.log, step=p.step)
        else:
            params[name] = trial.suggest_int(name, p.low, p.high, log=p.log, step=p.step)
    return params


def _grid(config: Config) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    if config.study.search_space is None:
        raise ConfigError(str(config.path), "sampler.type", "grid needs search_space in the study file (the grid "
                          f"of a define-by-run {config.study.trial}.search_space is not known before it runs)", "grid")
    for name, p in config.study.search_space.items():
        if isinstance(p, CategoricalParam):
            grid[name] = list(p.choices)
        elif p.values is not None:
            grid[name] = list(p.values)
        elif isinstance(p, IntParam):
            grid[name] = list(range(p.low, p.high + 1, p.step))
        elif p.step is not None:
            # low + i * step, rounded to 12 significant digits: np.arange accumulates float error
            # (0.30000000000000004), which Optuna then warns is out of the parameter's range.
            n = int(math.floor((p.high - p.low) / p.step + 1e-9)) + 1
            grid[name] = [float(f"{p.low + i * p.step:.12g}") for i in range(n)]
        else:
            raise ConfigError(str(config.path), f"search_space.{name}", "needs a step, or a list of values, for "
                              "the grid sampler (a log scale: values: [1.0e-4, 3.0e-4, 1.0e-3])", None)
    return grid


def grid_points(config: Config) -> list[dict[str, Any]]:
    """Every point of a grid study's grid ([] for other samplers)."""
    if config.study.sampler.type != "grid":
        return []
    grid = _grid(config)
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def grid_size(config: Config) -> int | None:
    """The number of points of a grid study (None for other samplers)."""
    if config.study.sampler.type != "grid":
        return None
    return math.prod(len(v) for v in _grid(config).values())


# The packages a sampler needs that sweep does not install (Optuna imports them on first use, so
# a study would fail only after its startup trials).
SAMPLER_PACKAGES = {"gp": ("torch",)}


def startup_trials(config: Config) -> int | None:
    """The sampler's n_startup_trials: the study file's, else its class's default; None for a
    sampler without one."""
    s = config.study.sampler
    default = inspect.signature(getattr(optuna.samplers, SAMPLER_CLASSES[s.type])).parameters.get("n_startup_trials")
    return None if default is None else int(s.kwargs.get("n_startup_trials", default.default))


def sampler_notes(config: Config) -> list[tuple[int, str]]:
    """(log level, line): what a sampler will do that its name does not say (a model never used,
    the share of a grid that n_trials covers)."""
    s, n_trials = config.study.sampler, config.study.n_trials
    notes = []
    startup = startup_trials(config)
    # A warm start's observations count toward n_startup_trials: the model may be used at once.
    if startup is not None and s.type in ("tpe", "gp") and config.study.warm_start is None:
        if n_trials <= startup:
            notes.append((logging.WARNING, f"sampler {s.type}: n_trials {n_trials} does not exceed its "
                          f"n_startup_trials {startup}, so every trial is sampled at random and its model is never "
                          "used; raise n_trials or lower sampler.n_startup_trials"))
    size = grid_size(config)
    if size is not None:
        notes.append((logging.INFO if n_trials >= size else logging.WARNING,
                      f"sampler grid: {count(size, 'grid point')}; n_trials {n_trials} covers "
                      f"{'all of them' if n_trials >= size else f'{n_trials} of them'}"))
    return notes


def _construct(kind: str, classes: dict[str, str], type_name: str, kwargs: dict[str, Any], file: str,
               **internal: Any) -> Any:
    """Build an Optuna sampler/pruner from the study file's keys (checked by name) plus sweep's own."""
    module = optuna.samplers if kind == "sampler" else optuna.pruners
    cls = getattr(module, classes[type_name])
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", *internal)]
    for key in kwargs:
        if key not in accepted:
            hint = difflib.get_close_matches(key, accepted, n=1)
            extra = (f" (did you mean {hint[0]!r}?)" if hint else
                     f" (accepted: {', '.join(accepted)})" if accepted else " (it takes no arguments)")
            raise ConfigError(file, f"{kind}.{key}", f"not an argument of optuna.{kind}s.{cls.__name__}{extra}")
    for key, value in kwargs.items():
        problem = _argument_problem(value, inspect.signature(cls).parameters[key].annotation)
        if problem:
            raise ConfigError(file, f"{kind}.{key}", f"optuna.{kind}s.{cls.__name__} takes {problem}", value)
    try:
        return cls(**kwargs, **internal)
    except ImportError as exc:
        raise ConfigError(file, f"{kind}.type", f"needs a package that is not installed ({exc})", type_name) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(file, kind, f"optuna.{kind}s.{cls.__name__} rejects its arguments: {exc}", kwargs) from None


# Annotation words of arguments that take Python objects (a function, a sampler, trials): a YAML
# value is never one (TPESampler(constraints_func="mod:fn") is accepted, then fails in every
# after_trial with "'str' object is not callable").
_OBJECT_WORDS = ("Callable", "Sampler", "FrozenTrial", "ndarray")
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
}


def _argument_problem(value: Any, annotation: Any) -> str | None:
    """Why `value` (from YAML) cannot be an argument annotated `annotation`; None if it can (or if
    the annotation says too little to tell: Optuna's constructor checks the rest)."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    if annotation is inspect.Parameter.empty:
        return None
    parts = [part.strip() for part in text.split("|")]
    if any(_SCALARS[part](value) for part in parts if part in _SCALARS):
        return None
    if value is not None and any(word in text for word in _OBJECT_WORDS):
        return (f"a Python object here ({text}), which a study file cannot give: a string is never called or "
                "imported; leave the key out")
    if all(part in _SCALARS for part in parts):
        return f"{' or '.join(parts)} here"
    return None


def unusable_argument(config: Config, key: str, value: Any) -> bool:
    """Whether `key` (`sampler.<arg>` / `pruner.<arg>`, as a study stored it) with `value` can never
    work for this file's sampler/pruner (a string for a function). A study that stored one may drop
    it without a refusal: the trials it defined never used it (docs/search.md)."""
    kind, _, arg = key.partition(".")
    if kind not in ("sampler", "pruner") or arg in ("type", "seed"):
        return False
    section = config.study.sampler if kind == "sampler" else config.study.pruner
    classes, module = (SAMPLER_CLASSES, optuna.samplers) if kind == "sampler" else (PRUNER_CLASSES, optuna.pruners)
    signature = inspect.signature(getattr(module, classes[section.type])).parameters
    return arg in signature and _argument_problem(value, signature[arg].annotation) is not None


def build_sampler(config: Config) -> BaseSampler:
    """The study file's Optuna sampler, as configured (the session makes it restart-proof)."""
    s = config.study.sampler
    internal: dict[str, Any] = {"seed": s.seed}
    if s.type == "grid":
        internal["search_space"] = _grid(config)
    return _construct("sampler", SAMPLER_CLASSES, s.type, s.kwargs, str(config.path), **internal)


def build_pruner(config: Config) -> optuna.pruners.BasePruner:
    p = config.study.pruner
    return _construct("pruner", PRUNER_CLASSES, p.type, p.kwargs, str(config.path))


def check_config(config: Config) -> None:
    """The study-file rules that need Optuna or JAX: sampler and pruner arguments, the device
    count. Creates nothing."""
    for package in SAMPLER_PACKAGES.get(config.study.sampler.type, ()):
        if importlib.util.find_spec(package) is None:
            sampler = config.study.sampler.type
            raise ConfigError(str(config.path), "sampler.type", f"needs the package {package}, which is not "
                              f"installed (pip install {package}), for optuna.samplers.{SAMPLER_CLASSES[sampler]}",
                              sampler)
    build_sampler(config)
    build_pruner(config)
    devices = config.study.train.devices
    if devices > 1:
        import jax

        have = jax.devices()
        if devices > len(have):
            hint = (f" (on the CPU: XLA_FLAGS=--xla_force_host_platform_device_count={devices})"
                    if have[0].platform == "cpu" else "")
            raise ConfigError(str(config.path), "train.devices",
                              f"must be at most the {count(len(have), have[0].platform + ' device')} JAX sees{hint}", devices)


def _derived_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def restart_proof(config: Config) -> RestartProofSampler:
    """The study file's sampler as a run draws with it: reseeded per trial and param, and where the
    scheduler says `sampler_sees: rung`, seeing the study through `RungView`."""
    seen = None
    if getattr(config.study.scheduler, "sampler_sees", "finished") == "rung":
        least = startup_trials(config)
        seen = functools.partial(RungView, least=max(RungView.LEAST if least is None else least, 1))
    return RestartProofSampler(build_sampler(config), config.study.sampler.seed, seen)


class StudyView:
    """The study as a sampler sees it: the study's own attributes, but for its trials, which
    `seen` chooses and may show in another state. No Optuna sampler takes a filter of the trials
    it learns from, hence this proxy; it answers the calls by which samplers read trials."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def seen(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """The trials the sampler sees of the study's `trials` (copies where one is changed)."""
        raise NotImplementedError

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        seen = self.seen(trials_as_samplers_read(self._study, use_cache))
        return [t for t in seen if states is None or t.state in states]

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


class RungView(StudyView):
    """The study as the sampler sees it under `scheduler.sampler_sees: rung` (BOHB's rule: Falkner
    et al. 2018, section 3.2, fit the model on the largest budget with enough observations).

    Optuna's samplers learn from COMPLETE and PRUNED trials only (TPE: optuna/samplers/_tpe/
    sampler.py), and a trial a scheduler pauses is WAITING, so under asha or freeze_thaw TPE
    samples at random for most of a study (benchmarks/RESULTS.md, "What TPE sees under sweep's
    schedulers"). This view shows the sampler, at the highest step that at least `least` trials
    reported (the sampler's n_startup_trials), each of those trials COMPLETE with its value there,
    and hides the other finished ones; before any step has that many, the study as it is. Once
    `least` trials have completed, that step is the last one: the completed trials at their end.
    Reports counted: a finished trial's, and a paused one's up to the step it waits at; never a
    running trial's (its reports depend on when the sampler looks), so that the view, like every
    decision, is a function of the stored study.
    """

    LEAST = 10  # for a sampler without n_startup_trials (TPE's default)

    def __init__(self, study: optuna.Study, least: int = LEAST) -> None:
        super().__init__(study)
        self._least = least

    @staticmethod
    def reports(trial: FrozenTrial) -> dict[int, float]:
        """The reports of `trial` the view counts (class docstring)."""
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            upto = None
        elif (rung := paused_rung(trial)) is not None:
            upto = rung
        else:
            return {}
        return {step: v for step, v in trial.intermediate_values.items()
                if math.isfinite(v) and (upto is None or step <= upto)}

    def seen(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        counted = [self.reports(t) for t in trials]
        reported = collections.Counter(step for r in counted for step in r)
        at = max((step for step, n in reported.items() if n >= self._least), default=None)
        if at is None:
            return trials
        out = []
        for t, r in zip(trials, counted):
            if at in r:
                t = copy.copy(t)
                t.state, t.values = TrialState.COMPLETE, [r[at]]
            elif (t := self.below(t, r)) is None:
                continue
            out.append(t)
        return out

    def below(self, trial: FrozenTrial, reports: dict[int, float]) -> FrozenTrial | None:
        """How a trial without a counted report at the view's step is seen (`reports`: its counted
        ones): a finished one not at all; a running or waiting one as it is (a constant liar counts
        it). Showing the paused and finished ones PRUNED at their last report instead (ranked below
        every trial at the step) did worse in the simulator (benchmarks/RESULTS.md, "TPE shown the
        trials at a rung")."""
        return None if trial.state in (TrialState.COMPLETE, TrialState.PRUNED) else trial


class RestartProofSampler(BaseSampler):
    """Delegates to an Optuna sampler, reseeding it from (seed, trial number, param) before each draw.

    Optuna samplers keep one RNG per process, so a trial's params would depend on how many draws this
    process made before (restarts, adoption of a trial killed between two suggests). Optuna has no
    per-trial seeding API, so we reseed every RandomState the sampler holds. `seen`: what each
    draw sees of the study (a view such as RungView), the study itself where None.
    """

    def __init__(self, inner: BaseSampler, seed: int, seen: Callable[[optuna.Study], Any] | None = None) -> None:
        self.inner, self.seed = inner, seed
        self._states = list(sampler_random_states(inner))
        self._seen = seen

    def _view(self, study: optuna.Study) -> Any:
        return study if self._seen is None else self._seen(study)

    def _reseed(self, number: int, name: str) -> None:
        for i, state in enumerate(self._states):
            state.seed(_derived_seed(self.seed, number, name, i))

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._view(study), trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._reseed(trial.number, "<relative>")
        return self.inner.sample_relative(self._view(study), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        self._reseed(trial.number, param_name)
        return self.inner.sample_independent(self._view(study), trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._reseed(trial.number, "<before>")
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any, values: Sequence[float] | None) -> None:
        try:
            self.inner.after_trial(study, trial, state, values)
        except RuntimeError as exc:
            # GridSampler calls study.stop() once its grid is exhausted, which Optuna allows only
            # inside study.optimize (no exception type of its own to catch); sweep ends the study
            # by n_trials instead.
            if "Study.stop" not in str(exc):
                raise

    def reseed_rng(self) -> None:
        """Deliberately nothing: randomness comes from (seed, number, param) only."""


