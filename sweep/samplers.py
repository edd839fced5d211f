"""Optuna samplers and pruners from the study file, and drawing a trial's params in file order."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import numpy as np
import optuna
from optuna.samplers import BaseSampler

from sweep.config import PRUNER_CLASSES, SAMPLER_CLASSES, CategoricalParam, Config, FloatParam, IntParam
from sweep.errors import ConfigError


def suggest_all(config: Config, trial: optuna.Trial) -> dict[str, Any]:
    """Sample (or, for an adopted trial, read back) every param, in file order."""
    params: dict[str, Any] = {}
    for name, p in config.study.search_space.items():
        if isinstance(p, FloatParam):
            params[name] = trial.suggest_float(name, p.low, p.high, log=p.log, step=p.step)
        elif isinstance(p, IntParam):
            params[name] = trial.suggest_int(name, p.low, p.high, log=p.log, step=p.step)
        else:
            params[name] = trial.suggest_categorical(name, p.choices)
    return params


def _grid(config: Config) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for name, p in config.study.search_space.items():
        if isinstance(p, CategoricalParam):
            grid[name] = list(p.choices)
        elif isinstance(p, IntParam):
            grid[name] = list(range(p.low, p.high + 1, p.step))
        elif p.step is not None:
            grid[name] = [float(v) for v in np.arange(p.low, p.high + p.step / 2, p.step)]
        else:
            raise ConfigError(str(config.path), f"search_space.{name}", "needs a step for the grid sampler", None)
    return grid


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
    try:
        return cls(**kwargs, **internal)
    except ImportError as exc:
        raise ConfigError(file, f"{kind}.type", f"needs a package that is not installed ({exc})", type_name) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(file, kind, f"optuna.{kind}s.{cls.__name__} rejects its arguments: {exc}", kwargs) from None


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
                              f"must be at most the {len(have)} {have[0].platform} device(s) JAX sees{hint}", devices)
