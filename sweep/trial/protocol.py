"""The trial protocol: what a trial module provides, and loading one by name.

A trial module provides the model, data, loss and evaluation for given
hyperparameters, and nothing else; sweep owns the loop, Optuna and Orbax.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from types import ModuleType
from typing import Any, Mapping, Protocol, runtime_checkable

from sweep.trial.guard import guarded

Hyperparameters = Mapping[str, Any]

REQUIRED_FUNCTIONS = ("data", "init", "optimizer", "batch", "loss", "evaluate")
# A trial that streams its training batches (`train_batches`, see sweep/train/stream.py) needs no
# in-memory `data` or `batch`.
STREAMING_OPTIONAL = ("data", "batch")
# The arguments sweep passes, in order; a parameter named `step` gets the step, by keyword
# (sweep/trial/kinds.py, takes_step). Any other parameter needs a default.
ARGUMENTS = {"batch": ("hp", "data", "key"), "loss": ("hp", "params", "batch", "key")}


@runtime_checkable
class TrialModule(Protocol):
    """What `trial:` in a study file must name (see README, "Writing a trial")."""

    HYPERPARAMETERS: Mapping[str, Any]  # every name the trial understands, with its default
    METRICS: tuple[str, ...]  # names of the values `evaluate` returns

    def data(self, hp: Hyperparameters) -> Any:
        """Arrays of the train/validation(/test) splits; a pytree, deterministic."""

    def init(self, hp: Hyperparameters, key: Any, data: Any) -> Any:
        """Fresh model params from a PRNG key."""

    def optimizer(self, hp: Hyperparameters) -> Any:
        """An optax.GradientTransformation."""

    def batch(self, hp: Hyperparameters, data: Any, key: Any) -> Any:
        """The training batch for a step; a pure function of the key (sweep derives it from (seed, step)).
        With a `step` parameter: the trial's data key and the step (epochs)."""

    def loss(self, hp: Hyperparameters, params: Any, batch: Any, key: Any) -> Any:
        """Scalar training loss (key: for dropout and other per-step randomness). With a `step`
        parameter: also the step being trained, a traced integer (the one `batch` gets)."""

    def evaluate(self, hp: Hyperparameters, params: Any, data: Any) -> Mapping[str, Any]:
        """Validation metrics, a mapping with every name in METRICS."""


def protocol_problems(module: ModuleType) -> list[tuple[str, str, object]]:
    """(attribute, rule, value) for every way `module` falls short of the protocol."""
    problems: list[tuple[str, str, object]] = []
    hps = getattr(module, "HYPERPARAMETERS", None)
    if not isinstance(hps, Mapping) or not all(isinstance(k, str) for k in hps):
        problems.append(("HYPERPARAMETERS", "must be a dict of names to defaults", hps))
    metrics = getattr(module, "METRICS", None)
    if not isinstance(metrics, (tuple, list)) or not metrics or not all(isinstance(m, str) for m in metrics):
        problems.append(("METRICS", "must be a non-empty tuple of metric names", metrics))
    streams = callable(getattr(module, "train_batches", None))
    for name in REQUIRED_FUNCTIONS:
        if streams and name in STREAMING_OPTIONAL and getattr(module, name, None) is None:
            continue
        if not callable(getattr(module, name, None)):
            problems.append((name, "must be a function", getattr(module, name, None)))
        elif name in ARGUMENTS and not _takes_arguments(getattr(module, name), ARGUMENTS[name]):
            args = ", ".join(ARGUMENTS[name])
            problems.append((name, f"must take ({args}) or ({args}, step); any other parameter needs a default",
                             f"{name}{inspect.signature(getattr(module, name))}"))
    return problems


def _takes_arguments(fn: Any, names: tuple[str, ...]) -> bool:
    """Whether `fn` accepts the call sweep makes: `names` by position, plus `step=` if it declares one."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # not introspectable (a builtin): called as the protocol says
        return True
    try:
        signature.bind(*names, **({"step": 0} if "step" in signature.parameters else {}))
    except TypeError:
        return False
    return True


def trial_data(module: Any, hp: Hyperparameters, timeout: float | None = None) -> Any:
    """The trial's in-memory data: `data(hp)`, or {} for a streaming trial without one.

    Raises:
        DataTimeout: `data(hp)` ran past `timeout` seconds.
    """
    from sweep.trial.guard import call_with_timeout

    data = getattr(module, "data", None)
    return call_with_timeout(lambda: data(hp), timeout, f"{module.__name__}.data()") if callable(data) else {}


def import_trial(name: str) -> ModuleType:
    """Import a trial module by dotted name, finding user modules on the current directory.

    Raises:
        ImportError (or whatever the module raises while importing).
    """
    # A user's own trial module lives beside their study file, like `python -m` would find it.
    # The entry is taken out again afterwards: the process's import path is not ours to keep.
    added = "" not in sys.path and "." not in sys.path
    if added:
        sys.path.insert(0, "")
    # Validation must write nothing, not even a __pycache__ next to the user's module.
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        with guarded():  # its prints on stderr (status --json stays JSON); an exit is its error
            return importlib.import_module(name)
    finally:
        sys.dont_write_bytecode = old
        if added and "" in sys.path:
            sys.path.remove("")
