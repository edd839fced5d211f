"""The one module that touches private internals of Optuna, JAX and Orbax, each use saying why no public API does it.

Everything else in sweep uses their public APIs only (tests/test_structure.py holds this): when a
release of one of them changes what is used here, this file is the whole list of what to check.
Optuna, JAX and Orbax are imported inside the functions: readers of a study (status, plan, export)
must not import JAX or Orbax, and importing this module costs nothing. optuna-dashboard's stored
layout of notes and figures is here too.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterator, Mapping

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


def cache_trial(study: optuna.Study, frozen: Any) -> None:
    """Make the study's cached storage know unfinished trial `frozen`, which another process
    created (an interrupted trial adopted, a WAITING one popped). Its `set_trial_param` looks the
    trial up in that cache, which only trials this process created or read are in: a suggest on an
    adopted trial that had no params yet raised KeyError (its number) where the sampler reads no
    trials first (random). Optuna adds a trial this way as its own readers find it; as unfinished,
    so its next read refreshes it."""
    from optuna.storages._cached_storage import _CachedStorage, _StudyInfo

    storage = study._storage
    if not isinstance(storage, _CachedStorage):
        return
    with storage._lock:
        info = storage._studies.setdefault(study._study_id, _StudyInfo())
        storage._add_trials_to_cache(study._study_id, [frozen])
        info.unfinished_trial_ids.add(frozen._trial_id)


def trials_as_samplers_read(study: optuna.Study, use_cache: bool) -> list[FrozenTrial]:
    """Every trial of the study, not copied, as Optuna's samplers read them: they call the private
    `study._get_trials(deepcopy=False, states=..., use_cache=True)` (TPE's `_get_observation_pairs`
    and `_split_trials` among others), so a view of the study a sampler reads
    (sweep/store/samplers.py RungView) must answer that call, reading the study the same way."""
    return study._get_trials(deepcopy=False, states=None, use_cache=use_cache)


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


def study_system_attr_table() -> Any:
    """The SQLAlchemy table of Optuna's study system attributes (private models, as trial_tables):
    optuna-dashboard's notes live there, and a note's write reads only its own rows."""
    from optuna.storages._rdb import models as m

    return m.StudySystemAttributeModel.__table__


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


# --- optuna-dashboard: where it reads a note and a figure --------------------------------------

# optuna-dashboard (0.21) keeps notes and figures as study system attributes, each text cut into
# pieces of this many characters (optuna_dashboard/_note.py, _custom_plot_data.py).
DASHBOARD_PIECE = 2045


def dashboard_note_attrs(stored: Mapping[str, Any], trial_id: int | None, body: str) -> dict[str, Any]:
    """The study system attributes that make `body` the dashboard's note of a trial (its storage
    id) or of the study (None), replacing the note in `stored` (the study's system attributes
    now): its text in pieces, the old note's extra pieces emptied, its version one up (last).

    optuna_dashboard.save_note writes these, but importing optuna_dashboard costs a `run` process
    1-2 s (its server imports optuna.importance, hence scikit-learn) and save_note wants an
    `optuna.Trial`, whose constructor calls the sampler's before_trial. Its readers (get_note, the
    server) are what tests/tracking/test_dashboard.py reads the notes back with."""
    owner = "" if trial_id is None else f"{trial_id}:"
    version_key, prefix = f"dashboard:{owner}note_ver", f"dashboard:{owner}note_str:"
    return {**_pieces(stored, prefix, body), version_key: int(stored.get(version_key, 0)) + 1}


def dashboard_note(stored: Mapping[str, Any], trial_id: int | None) -> str | None:
    """The dashboard's note of a trial or of the study in `stored`, as its server reads it; None where none was written."""
    owner = "" if trial_id is None else f"{trial_id}:"
    if f"dashboard:{owner}note_ver" not in stored:
        return None
    prefix = f"dashboard:{owner}note_str:"
    return "".join(stored[f"{prefix}{i}"] for i in range(sum(1 for k in stored if k.startswith(prefix))))


def dashboard_figure_attrs(stored: Mapping[str, Any], graph_id: str, figure_json: str) -> dict[str, str]:
    """The study system attributes that make `figure_json` (a plotly figure's JSON) the dashboard's
    figure `graph_id`, replacing the one in `stored`: what optuna_dashboard.save_plotly_graph_object
    writes from a `plotly.graph_objects.Figure` (the same import cost; see dashboard_note_attrs)."""
    return _pieces(stored, f"dashboard:plot_data:{graph_id}:", figure_json)


def _pieces(stored: Mapping[str, Any], prefix: str, text: str) -> dict[str, str]:
    n = -(-len(text) // DASHBOARD_PIECE)
    old = sum(1 for k in stored if k.startswith(prefix))
    return {f"{prefix}{i}": text[i * DASHBOARD_PIECE:(i + 1) * DASHBOARD_PIECE] for i in range(max(n, old))}


# --- JAX and Orbax ---------------------------------------------------------------------------------


def jax_backends_started() -> bool:
    """Whether JAX has started a backend in this process. `jax.devices()` would start one; only
    the private xla_bridge can ask without that side effect (device slots are set before it)."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def uncompressed_standard_handler(use_ocdbt: bool, copy_host_arrays: bool) -> Any:
    """Orbax's StandardCheckpointHandler, writing arrays without zstd compression. Orbax offers
    the switch only on PyTreeCheckpointHandler, which the standard handler wraps in a private
    attribute with no argument to pass one in: replaced here. Compressed and OCDBT steps of earlier
    releases still restore (the format records its compressor, and a step whether it is OCDBT).

    How sweep/checkpoints/folder.py tunes it for states past compact.py's (benchmarks/big_state.py
    measured each):
    - no zstd compression: on a trained 100 MB state it saved 8% of the disk for 45% more save
      time and twice the restore time (on the same cores as training);
    - no OCDBT: packing (sweep/checkpoints/packing.py) already leaves Orbax a few arrays per state,
      where OCDBT's one-file-per-step costs more than it saves (its writes went ~3x slower at 1 GB);
    - no copy of host arrays: Orbax copies every numpy array it is given (a guard against the
      caller changing it mid-write: orbax#1640's 14 GB for a 4 GB array); the tree sweep hands it
      is a private host copy already, never changed after;
    - one chunk per array (Orbax's default without OCDBT): tensorstore writes it from the host
      copy's own buffer, where chunks that split an array's inner axis were copied first (peak
      memory 1.30x the state above it with 64 MiB chunks, 1.00x unchunked, at 1 GB)."""
    import numpy as np
    import orbax.checkpoint as ocp

    types = ocp.type_handlers
    registry = types.create_type_handler_registry(*[(t, types.get_type_handler(t)) for t in types.supported_types()])
    if not copy_host_arrays:
        registry.add(np.ndarray, types.NumpyHandler(deepcopy_host_arrays=False), override=True, ignore_warnings=True)
    handler = ocp.StandardCheckpointHandler(use_ocdbt=use_ocdbt)
    handler._impl = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=use_ocdbt,
                                                type_handler_registry=registry)
    return handler


_CPU_KEY = threading.local()  # set while JAX computes the cache key of a CPU program


def cache_key_without_cpu_device_assignment() -> None:
    """JAX's persistent-cache key of a CPU program without the devices it was compiled for, as JAX
    already keys GPU programs (jax/_src/cache_key.py strips the device assignment for "gpu" only).

    Workers on forced CPU devices each train on their own (cpu:0, cpu:1, ...), and the device
    assignment in the compile options made the same program 4 keys: no worker ever read another's
    executable. JAX deserializes a cached executable onto the devices of the call
    (`executable_devices`), so one compiled for cpu:0 runs on cpu:2 (checked, also for a 2-device
    program moved from (0, 1) to (2, 3)). No public option: `get` is wrapped to know the platform,
    which the compile-options hash it calls does not receive. Idempotent.
    """
    from jax._src import cache_key

    if getattr(cache_key.get, "_sweep", False):
        return
    original_get, original_hash = cache_key.get, cache_key._hash_serialized_compile_options

    def get(module: Any, devices: Any, compile_options: Any, backend: Any, *args: Any, **kwargs: Any) -> str:
        _CPU_KEY.on = backend.platform == "cpu"
        try:
            return original_get(module, devices, compile_options, backend, *args, **kwargs)
        finally:
            _CPU_KEY.on = False

    def hash_options(hash_obj: Any, compile_options: Any, strip_device_assignment: bool = False) -> Any:
        strip = strip_device_assignment or getattr(_CPU_KEY, "on", False)
        return original_hash(hash_obj, compile_options, strip_device_assignment=strip)

    get._sweep = True  # type: ignore[attr-defined]
    cache_key.get = get
    cache_key._hash_serialized_compile_options = hash_options
