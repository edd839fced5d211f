"""The Optuna side: storage, sampler and pruner factories, restart-proof sampling."""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import inspect
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.samplers._lazy_random_state import LazyRandomState
from optuna.trial import FrozenTrial, TrialState

from sweep.config import CategoricalParam, Config, FloatParam, IntParam
from sweep.errors import ConfigError, SweepError

SAMPLER_CLASSES = {
    "tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler",
    "cmaes": "CmaEsSampler", "qmc": "QMCSampler", "gp": "GPSampler",
}
PRUNER_CLASSES = {
    "none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
    "successive_halving": "SuccessiveHalvingPruner", "hyperband": "HyperbandPruner",
}
SQLITE_TIMEOUT_S = 60


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
    s = config.study.sampler
    internal: dict[str, Any] = {"seed": s.seed}
    if s.type == "grid":
        internal["search_space"] = _grid(config)
    inner = _construct("sampler", SAMPLER_CLASSES, s.type, s.kwargs, str(config.path), **internal)
    return RestartProofSampler(inner, s.seed)


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


def _derived_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


class RestartProofSampler(BaseSampler):
    """Delegates to an Optuna sampler, reseeding it from (seed, trial number, param) before each draw.

    Optuna samplers keep one RNG per process, so a trial's params would depend on how many draws this
    process made before (restarts, adoption of a trial killed between two suggests). Optuna has no
    per-trial seeding API, so we reseed every RandomState the sampler holds.
    """

    def __init__(self, inner: BaseSampler, seed: int) -> None:
        self.inner, self.seed = inner, seed
        self._states = list(_random_states(inner))

    def _reseed(self, number: int, name: str) -> None:
        for i, state in enumerate(self._states):
            state.seed(_derived_seed(self.seed, number, name, i))

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._reseed(trial.number, "<relative>")
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        self._reseed(trial.number, param_name)
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._reseed(trial.number, "<before>")
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any, values: Sequence[float] | None) -> None:
        try:
            self.inner.after_trial(study, trial, state, values)
        except RuntimeError as exc:
            # GridSampler calls study.stop() once its grid is exhausted, which Optuna allows only
            # inside study.optimize; sweep ends the study by n_trials instead.
            if "Study.stop" not in str(exc):
                raise

    def reseed_rng(self) -> None:
        """Deliberately nothing: randomness comes from (seed, number, param) only."""


def _random_states(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[np.random.RandomState]:
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
            yield from _random_states(value, depth + 1, seen)


def storage_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Several processes and a reader (status, optuna-dashboard) share the file: wait for locks.
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    return {"pool_pre_ping": True}


@contextlib.contextmanager
def creation_lock(config: Config) -> Iterator[None]:
    """Serialise the first creation of the storage schema (Optuna 5 races on it)."""
    with workdir_lock(config.workdir):
        yield


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """`creation_lock` by workdir. Anything that opens an RDBStorage on a study that may be being
    created takes it: even a reader's RDBStorage(skip_table_creation=True) stamps Optuna's
    alembic_version table when it finds none, and races with the creator's own stamp."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".create.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def open_storage(config: Config, create: bool) -> optuna.storages.RDBStorage:
    """Open the study's RDB storage, creating it (once, serialised) if `create`.

    SQLite gets WAL once at creation, so readers (status, optuna-dashboard) never block writers.
    """
    url = config.storage
    sqlite_path = Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None
    if sqlite_path is not None and not sqlite_path.exists():
        if not create:
            raise SweepError(f"study {config.name!r} not found: no database at {sqlite_path}; run it first")
        sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    lock = creation_lock(config) if create else contextlib.nullcontext()
    with lock:
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=storage_kwargs(url))
        except Exception as exc:  # bad host, bad password, missing driver ...
            raise SweepError(f"cannot open storage {url}: {exc}") from None
        if sqlite_path is not None and create:
            with storage.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        return storage


def load_study(config: Config, storage: optuna.storages.BaseStorage, create: bool) -> optuna.Study:
    direction = config.study.objective.direction
    try:
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=build_sampler(config),
                                  pruner=build_pruner(config))
    except KeyError:
        if not create:
            raise SweepError(f"study {config.name!r} does not exist in {config.storage}; run it first") from None
        with creation_lock(config):
            study = optuna.create_study(study_name=config.name, storage=storage, sampler=build_sampler(config),
                                        pruner=build_pruner(config), direction=direction, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise SweepError(f"study {config.name!r} in {config.storage} was created with direction "
                         f"{study.direction.name.lower()}, but {config.path} says {direction}")
    return study


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # never run again


def rdb(study: optuna.Study) -> optuna.storages.RDBStorage:
    """The study's RDB storage itself. Optuna wraps it in a cache that, on its first read, loads
    every trial (params, attributes, intermediate values: ~1.9 s for 2,000 trials here) whatever
    states were asked for; the RDB storage filters states in SQL."""
    storage = getattr(study._storage, "_backend", study._storage)
    assert isinstance(storage, optuna.storages.RDBStorage), "sweep opens RDB storages only"
    return storage


def trial_states(study: optuna.Study | optuna.storages.RDBStorage, study_id: int | None = None
                 ) -> dict[int, TrialState]:
    """number -> state of every trial, in one narrow query (no params, attributes or reports)."""
    import sqlalchemy as sa
    from optuna.storages._rdb.models import TrialModel  # Optuna's versioned RDB schema

    if isinstance(study, optuna.Study):
        storage, study_id = rdb(study), study._study_id
    else:
        storage = study
    t = TrialModel.__table__
    with storage.engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.number, t.c.state).where(t.c.study_id == study_id)).all()
    return {number: state if isinstance(state, TrialState) else TrialState[state] for number, state in rows}


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best COMPLETE trial, read alone; None if there is none."""
    try:
        return rdb(study).get_best_trial(study._study_id)
    except ValueError:
        return None
