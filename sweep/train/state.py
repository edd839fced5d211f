"""A trial's training state: the fresh one, which is also the template every restore reads into.

Loaders (export, `load_best`) build the template here without importing the training loop.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from sweep.checkpoints.folder import TrialCheckpoints, WriteBudget
from sweep.errors import NonFiniteMetric
from sweep.study.config import Config
from sweep.train import compile_events
from sweep.train.compiled import FUNCTIONS, TRACE_ERRORS
from sweep.train.stream import DATA_STATE_KEY, STATE_BYTES, streaming
from sweep.trial.kinds import PlainKind, kind_of
from sweep.trial.protocol import trial_data

# Keys a checkpoint may lack (written before they existed); restored as their fresh value.
OPTIONAL_KEYS = ("train_loss_sum",)


class Fresh(NamedTuple):
    state: dict[str, Any]  # params, opt_state, step, key, train_loss_sum[, model_state]
    data: Any
    kind: PlainKind


def run_hyperparameters(config: Config, hp: Mapping[str, Any]) -> dict[str, Any]:
    """What the trial's functions get as `hp`: its hyperparameters plus the run's settings under
    "train.*" (read-only; e.g. `hp["train.steps"]` for a schedule's length)."""
    train = config.study.train
    return {**hp, "train.steps": train.steps, "train.eval_every": train.eval_every, "train.seed": train.seed,
            "train.devices": train.devices}


def trial_keys(config: Config, number: int) -> tuple[Any, Any]:
    """(init key, train key) of trial `number`: from the seed, and from the number unless the study
    gives every trial the same initialisation and data order (`train.same_seed_for_all_trials`)."""
    train = config.study.train
    key = jax.random.PRNGKey(train.seed)
    if not train.same_seed_for_all_trials:
        key = jax.random.fold_in(key, number)
    init_key, train_key = jax.random.split(key)
    return init_key, train_key


def data_seed(config: Config, number: int) -> int:
    """The seed a streaming trial's `train_batches(hp, seed)` gets: from the train key of
    `trial_keys`, so it follows `train.seed` and `same_seed_for_all_trials` like the keys do."""
    _, train_key = trial_keys(config, number)
    return int(np.asarray(jax.random.key_data(jax.random.fold_in(train_key, DATA_SEED)))[-1])


DATA_SEED = 0x73656564  # fold_in(train key, DATA_SEED): where a streaming trial's data seed comes from


def initial_state(config: Config, number: int, hp: Mapping[str, Any], abstract: bool = False,
                  data_shapes: Mapping[str, Any] | None = None) -> Fresh:
    """The fresh training state of trial `number` (also the template to restore into), its data
    and its kind. `hp` are the trial's hyperparameters (`config.hyperparameters(params)`).

    `abstract`: the state's shapes and dtypes only (`jax.eval_shape`: nothing is computed).
    `data_shapes` (with `abstract`): the trial's data as `shapes_of` recorded it, instead of
    calling the trial's `data` (a loader needs no training data); `data` is called where the
    trial's `init` needs concrete arrays.
    """
    module = config.trial_module
    hp = run_hyperparameters(config, hp)
    if abstract and data_shapes is not None:
        try:
            return initial_state_of(config, number, hp, abstract_data(data_shapes), abstract=True)
        except Exception:  # an init that needs concrete data: the trial's own data, then
            pass
    return initial_state_of(config, number, hp, trial_data(module, hp, config.study.data_timeout_seconds), abstract)


def shapes_of(data: Any) -> dict[str, Any] | None:
    """{"x_train": [[1437, 64], "float32"], ...} of data that is a (nested) dict of arrays, else None."""
    if isinstance(data, Mapping):
        out = {}
        for key, value in data.items():
            if not isinstance(key, str):
                return None
            if isinstance(value, Mapping):
                inner = shapes_of(value)
                if inner is None:
                    return None
                out[key] = inner
            elif hasattr(value, "shape") and hasattr(value, "dtype"):
                out[key] = [list(value.shape), str(value.dtype)]
            else:
                return None
        return out
    return None


def abstract_data(shapes: Mapping[str, Any]) -> dict[str, Any]:
    """The data of `shapes_of` as jax.ShapeDtypeStruct leaves."""
    return {k: abstract_data(v) if isinstance(v, Mapping) else jax.ShapeDtypeStruct(tuple(v[0]), np.dtype(v[1]))
            for k, v in shapes.items()}


def initial_state_of(config: Config, number: int, hp: Mapping[str, Any], data: Any, abstract: bool) -> Fresh:
    """`initial_state` on given data (`hp` already with the run's settings)."""
    module = config.trial_module
    tx = module.optimizer(hp)
    init_key, train_key = trial_keys(config, number)
    initial = _init(module, hp, init_key, data, abstract)
    kind = kind_of(module, initial)
    params, model_state = kind.start(initial)
    opt_state = jax.eval_shape(tx.init, params) if abstract else tx.init(params)
    state = {"params": params, "opt_state": opt_state, "step": np.zeros((), np.int32), "key": train_key,
             "train_loss_sum": np.zeros((), np.float32)}  # the training loss summed since the last evaluation
    if model_state:  # absent for params-only trials: their checkpoints keep their old layout
        state["model_state"] = model_state
    if streaming(module):  # the input pipeline's position (sweep/train/stream.py), set at every save
        state[DATA_STATE_KEY] = np.zeros(STATE_BYTES, np.uint8)
    return Fresh(state, data, kind)


def _init(module: Any, hp: Mapping[str, Any], key: Any, data: Any, abstract: bool) -> Any:
    """`module.init(hp, key, data)`, as one compiled program where the trial allows it.

    Run eagerly, a Flax init is hundreds of small operations, each compiled on first use: seconds
    per new shape (3.5 s for the digits MLP here), in every process. As one jitted program it
    compiles once per shape, trials of equal shapes share it (float hyperparameters are traced
    arguments, as in the training window), and JAX's persistent cache serves later processes.
    The data's arrays are arguments, not constants baked into the program. An init that cannot be
    traced (it returns an NNX module, or needs concrete data) runs eagerly, remembered per module.
    """
    leaves, treedef = jax.tree.flatten(data)
    is_array = tuple(isinstance(x, (np.ndarray, jax.Array, jax.ShapeDtypeStruct)) for x in leaves)
    arrays = [x for x, a in zip(leaves, is_array) if a]
    others = [x for x, a in zip(leaves, is_array) if not a]
    floats = tuple(sorted(k for k, v in hp.items() if isinstance(v, float)))
    for traced in (floats, ()) if floats else ((),):
        if (module.__name__, id(module), traced) in _UNTRACEABLE_INIT:
            continue
        static = {k: v for k, v in hp.items() if k not in traced}
        fn = FUNCTIONS.init(module, static, traced, (treedef, is_array, repr(others)),
                            lambda: _jitted_init(module, static, treedef, is_array, others))
        try:
            args = (key, arrays, {k: hp[k] for k in traced})
            parts = (repr(sorted(static.items())), traced, repr(others))  # the init's compile lock: compile_events
            out = jax.eval_shape(fn, *args) if abstract else FUNCTIONS.call(
                fn, "init", lambda: fn(*args), lambda: compile_events.program_key(module, "init", parts, args))
            nnx = sys.modules.get("flax.nnx")
            if abstract and nnx is not None and isinstance(out, nnx.Module):
                break  # an abstract NNX module holds abstract typed keys, which NNX cannot split
            return out
        except (TypeError, *TRACE_ERRORS):
            _UNTRACEABLE_INIT.add((module.__name__, id(module), traced))
    return module.init(hp, key, data)


def _jitted_init(module: Any, static: Mapping[str, Any], treedef: Any, is_array: tuple[bool, ...],
                 others: list[Any]) -> Any:
    def init(key: Any, arrays: list[Any], traced_hp: Mapping[str, Any]) -> Any:
        a, o = iter(arrays), iter(others)
        data = jax.tree.unflatten(treedef, [next(a) if is_array_ else next(o) for is_array_ in is_array])
        return module.init({**static, **traced_hp}, key, data)

    return jax.jit(init)


_UNTRACEABLE_INIT: set[tuple[Any, ...]] = set()  # (module, traced names) whose init failed to trace


def trial_checkpoints(config: Config, number: int, directory: Path, budget: WriteBudget | None = None,
                      read_only: bool = False, fence: Callable[[], None] | None = None,
                      room: Callable[[int, int], None] | None = None,
                      on_commit: Callable[[int], None] | None = None) -> TrialCheckpoints:
    """The checkpoint folder of trial `number` with the study's retention settings."""
    return TrialCheckpoints.of_study(config, number, directory, read_only=read_only, budget=budget,
                                     optional_keys=OPTIONAL_KEYS, fence=fence, room=room, on_commit=on_commit)


def checked_metrics(metrics: Mapping[str, Any], declared: Any, told: Sequence[str], number: int,
             step: int) -> dict[str, float]:
    """Every declared metric (METRICS) as a float; the objectives' must be finite. Other values
    `evaluate` returns (a confusion matrix, say) are the trial's own business."""
    missing = [name for name in declared if name not in metrics]
    if missing:
        raise KeyError(f"trial {number}: evaluate returned no {', '.join(map(repr, missing))} of its METRICS "
                       f"(it returned {sorted(metrics)})")
    for name in declared:  # a shape that changed with the hyperparameters: say which metric, and its shape
        shape = tuple(getattr(metrics[name], "shape", ()))
        if math.prod(shape) != 1:
            raise ValueError(f"trial {number}: evaluate must return a scalar for metric {name!r}, got shape {shape} "
                             f"at step {step}")
    values = {name: float(metrics[name]) for name in declared}
    for metric in told:
        if not math.isfinite(values[metric]):
            raise NonFiniteMetric(f"trial {number}: {metric} is {values[metric]} at step {step} (non-finite); "
                                  "the trial failed")
    return values
