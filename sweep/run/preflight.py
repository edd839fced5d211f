"""Checking a trial's code before anything is created: one abstract training step and evaluation.

`run` and `plan` build the fresh state of a trial at the search space's first point (the trial's
own `data` and `init`, as every trial does), then trace one training window and `evaluate` with
`jax.eval_shape`: nothing is compiled or trained. A missing or non-scalar metric, a loss that is
not a scalar and shape errors are then errors of the study (exit 2, naming the function), not a
failure of every trial at run time.
"""

from __future__ import annotations

import traceback
from typing import Any, Mapping

import numpy as np

from sweep.errors import ConfigError
from sweep.study import space
from sweep.study.config import Config
from sweep.study.params import CategoricalParam
from sweep.train import compiled, stream
from sweep.train.state import data_seed, initial_state, run_hyperparameters
from sweep.trial.guard import DataTimeout, TrialExit, exit_message, guarded


def first_point(search_space: Mapping[str, Any]) -> dict[str, Any]:
    """Each parameter's low end (numbers) or first choice or value (categoricals, value lists),
    of the parameters active at that point (sweep/study/space.py)."""
    point = {name: p.choices[0] if isinstance(p, CategoricalParam) else p.values[0] if p.values is not None else p.low
             for name, p in search_space.items()}
    return space.active(search_space, point)


def define_by_run_point(config: Config) -> dict[str, Any]:
    """The params the trial module's search_space(trial) gives a trial of a throwaway in-memory
    study (nothing stored); each name must be a hyperparameter of the trial, and not fixed."""
    import optuna

    from sweep.store.samplers import suggest_all

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory"
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    finally:
        optuna.logging.set_verbosity(verbosity)
    with _Blame(config, "search_space", {}):
        params = suggest_all(config, study.ask())
    for name in params:
        if name not in config.sampled_names:
            rule = "is fixed in the study file" if name in config.study.fixed else "is not one of its HYPERPARAMETERS"
            raise ConfigError(str(config.path), "trial", f"{config.study.trial}.search_space suggests {name!r}, which "
                              f"{rule}")
    return params


def needed(plan: Any) -> bool:
    """Whether `run` (and `plan`) must check the trial's code before going on: not where nothing is
    left to train (every trial finished): a rerun of a finished study then starts ~0.8 s sooner
    (benchmarks/RESULTS.md). Where trials train, the check stays: its work (the trial's data, its
    keys) is mostly what the trial needs anyway, and it keeps the programs it compiles out of the
    first trial's compile counts."""
    return plan.has_work


def check(config: Config) -> None:
    """Raise ConfigError if the trial's code cannot train or evaluate (see the module docstring);
    also where it exits (sys.exit, os._exit) or its data() hangs past data_timeout_seconds.

    An OSError (a dataset file missing, a full disk) is the machine's, not the study file's: it
    propagates unchanged.
    """
    with guarded():
        _check(config)


def _check(config: Config) -> None:
    module, study = config.trial_module, config.study
    params = first_point(study.search_space) if study.search_space is not None else define_by_run_point(config)
    hp = config.hyperparameters(params)
    with _Blame(config, "init", params):
        fresh = initial_state(config, 0, hp, abstract=True)
    state, data = fresh.state, fresh.data
    run_hp = run_hyperparameters(config, hp)
    fns = compiled.Functions(module, run_hp, compiled.traced_names(config.sampled_names, hp), study.train.devices,
                             kind=fresh.kind)
    model_state = state.get("model_state", {})
    window_data, eval_data = data, data
    if stream.streaming(module):  # the window's data is a chunk of the pipeline's batches
        with _Blame(config, "train_batches", params):
            window_data = stream.abstract_chunk(stream.first_batch(module, run_hp, data_seed(config, 0)))
    if stream.validation_streamed(module):
        with _Blame(config, "val_batches", params):
            eval_data = next(iter(module.val_batches(run_hp)), None)
            if eval_data is None:
                raise ValueError("val_batches yielded no batch")
    with _Blame(config, "training step (batch, loss, optimizer)", params):
        fns.shapes("window", state["params"], state["opt_state"], model_state, state["train_loss_sum"], state["key"],
                   window_data, np.int32(0), np.int32(1))
    with _Blame(config, "evaluate", params):
        metrics = fns.shapes("evaluate", state["params"], model_state, eval_data)
    _check_metrics(config, metrics)


def _check_metrics(config: Config, metrics: Any) -> None:
    name = config.study.trial
    if not isinstance(metrics, Mapping):
        raise ConfigError(str(config.path), "trial", f"{name}.evaluate must return a mapping of metric names to "
                          "scalars", type(metrics).__name__)
    for metric in config.trial_module.METRICS:
        if metric not in metrics:
            raise ConfigError(str(config.path), "trial",
                              f"{name}.evaluate returns no {metric!r}, a metric its METRICS declares "
                              f"(it returns {', '.join(map(repr, sorted(metrics))) or 'nothing'})")
        shape = getattr(metrics[metric], "shape", ())
        if int(np.prod(shape)) != 1:
            raise ConfigError(str(config.path), "trial", f"{name}.evaluate must return a scalar for metric "
                              f"{metric!r}, got shape {tuple(shape)}")


class _Blame:
    """Turn an exception of the trial's code into a study error naming the function it came from.

    The function is the outermost frame of the trial module in the traceback; `fallback` names
    the stage when the trial's code is not in it (an error JAX raises about what `loss` returned).
    """

    def __init__(self, config: Config, fallback: str, params: Mapping[str, Any]) -> None:
        self.config, self.fallback, self.params = config, fallback, params

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, SystemExit):  # sys.exit in the trial's code: blamed like an exception
            exc = TrialExit(exit_message(exc))
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, (OSError, ConfigError)):
            return False
        if isinstance(exc, DataTimeout):  # no frame of the trial's to blame: the message names data()
            raise ConfigError(str(self.config.path), "trial", f"{exc} (checked before anything was created, at "
                              f"hyperparameters {dict(self.params)})") from None
        module = self.config.trial_module
        source = getattr(module, "__file__", None)
        frames = [f for f, _ in traceback.walk_tb(tb) if source and f.f_code.co_filename == source]
        where = f"{module.__name__}.{frames[0].f_code.co_name}" if frames else f"{module.__name__}'s {self.fallback}"
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(str(self.config.path), "trial",
                          f"{where} raised {type(exc).__name__}: {message} (checked before anything was "
                          f"created, at hyperparameters {dict(self.params)})") from None
