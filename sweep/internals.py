"""The one module that touches private internals of Optuna, JAX and Orbax, each use saying why no public API does it.

Everything else in sweep uses their public APIs only (tests/test_structure.py holds this): when a
release of one of them changes what is used here, this file is the whole list of what to check.
Optuna, JAX and Orbax are imported inside the functions: readers of a study (status, plan, export)
must not import JAX or Orbax, and importing this module costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import numpy as np
    import optuna
    from optuna.trial import FrozenTrial


# --- Optuna: the study and its trials -------------------------------------------------------------


def trial_id(trial: FrozenTrial) -> int:
    """The storage's id of a frozen trial. FrozenTrial keeps it private; the storage's public
    `get_trial_id_from_study_id_trial_number` costs a query per trial where the id is at hand
    (legacy claims are keyed by it; `ask` hands it to `optuna.Trial`, as `study.ask` does)."""
    return trial._trial_id


def create_trial(study: optuna.Study) -> int:
    """A new RUNNING trial created through the study's own (cached) storage, as `study.ask` does
    past its pop of a WAITING trial: Optuna has no public call for that half of `ask`, and the
    study's readers use that storage's trial cache. Returns the trial's id."""
    return study._storage.create_new_trial(study._study_id)


def forget_cached_trials(study: optuna.Study) -> None:
    """Drop the study's per-thread cache of all trials, as `study.ask` does after asking (no
    public API resets it; a stale cache would hide the trial just asked for from the sampler)."""
    study._thread_local.cached_all_trials = None


# --- Optuna: the RDB schema -------------------------------------------------------------------


def trial_tables() -> tuple[Any, ...]:
    """The SQLAlchemy tables of Optuna's RDB schema (trials, params, values, intermediate values,
    user and system attributes). Optuna's models module is private; sweep's narrow readers
    (sweep/store/rdb.py) query its versioned schema where `get_all_trials` would build every
    trial through the ORM with all its rows."""
    from optuna.storages._rdb import models as m

    return tuple(model.__table__ for model in (m.TrialModel, m.TrialParamModel, m.TrialValueModel,
                                                m.TrialIntermediateValueModel, m.TrialUserAttributeModel,
                                                m.TrialSystemAttributeModel))


def stored_value(value: float | None, kind: Any) -> float:
    """An objective value as Optuna reads it back from its row (infinities are stored apart): the
    private models' own conversion, so that the narrow readers read what Optuna would."""
    from optuna.storages._rdb.models import TrialValueModel

    return TrialValueModel.stored_repr_to_value(value, kind)


def stored_intermediate_value(value: float | None, kind: Any) -> float:
    """An intermediate value as Optuna reads it back from its row (NaN and infinities stored apart)."""
    from optuna.storages._rdb.models import TrialIntermediateValueModel

    return TrialIntermediateValueModel.stored_repr_to_intermediate_value(value, kind)


# --- Optuna: samplers ----------------------------------------------------------------------------


def sampler_random_states(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[np.random.RandomState]:
    """Every numpy RandomState an Optuna sampler holds, in a fixed order (its attributes, sorted).

    Samplers keep them in private attributes, some wrapped in Optuna's private LazyRandomState
    (created on first use): there is no public way to reach them, and the restart-proof sampler
    (sweep/store/samplers.py) must reseed each one per trial.
    """
    import numpy as np
    from optuna.samplers import BaseSampler
    from optuna.samplers._lazy_random_state import LazyRandomState

    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    for _, value in sorted(vars(obj).items(), key=lambda kv: kv[0]) if hasattr(obj, "__dict__") else ():
        if isinstance(value, LazyRandomState):
            yield value.rng
        elif isinstance(value, np.random.RandomState):
            yield value
        elif isinstance(value, BaseSampler):
            yield from sampler_random_states(value, depth + 1, seen)


# --- JAX and Orbax ---------------------------------------------------------------------------------


def jax_backends_started() -> bool:
    """Whether JAX has started a backend in this process. `jax.devices()` would start one; only
    the private xla_bridge can ask without that side effect (device slots are set before it)."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def uncompressed_standard_handler() -> Any:
    """Orbax's StandardCheckpointHandler, writing arrays without zstd compression. Orbax offers
    the switch only on PyTreeCheckpointHandler, which the standard handler wraps in a private
    attribute with no argument to pass one in: replaced here (sweep/checkpoints/folder.py says why
    uncompressed). Compressed steps of earlier releases still restore (the format records its compressor)."""
    import orbax.checkpoint as ocp

    handler = ocp.StandardCheckpointHandler()
    handler._impl = ocp.PyTreeCheckpointHandler(use_compression=False)
    return handler
