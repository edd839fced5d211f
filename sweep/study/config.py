"""Study file -> validated, frozen config; every rule of the study file lives here.

Imports neither optuna nor jax: validation must be fast and must create nothing (a `scheduler`
section imports the module of the scheduler it names, sweep/study/scheduler_keys.py, which may).
Sampler and pruner keyword arguments are checked against Optuna's classes by
`sweep.store.samplers.check_config`, which `run` calls right after `load`.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, SerializeAsAny, ValidationError, model_validator

from sweep.errors import ConfigError
from sweep.study import checks as config_checks
from sweep.study import credentials, scheduler_keys, space
from sweep.study import messages as config_errors
from sweep.study import objectives as objectives_lib
from sweep.study import yaml_file as study_yaml
from sweep.study.constraints import Constraint
from sweep.study.objectives import Objective
from sweep.study.params import PARAM_MODELS, Param, Scalar, StrictModel
from sweep.study.checkpoint_keys import DEFAULT_WRITE_SHARE, Checkpoint, RamTier  # noqa: F401 (re-exported)
from sweep.study.scheduler_keys import MAX_STEP, SchedulerKeys

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
# The study file's sampler and pruner names -> the Optuna class each builds (the one list of them).
SAMPLER_CLASSES = {
    "tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler",
    "cmaes": "CmaEsSampler", "qmc": "QMCSampler", "gp": "GPSampler", "nsga2": "NSGAIISampler",
}
sign = objectives_lib.sign  # where readers of the study file look for it
SINGLE_OBJECTIVE_SAMPLERS = ("cmaes",)  # Optuna's CmaEsSampler raises for a multi-objective study
PRUNER_CLASSES = {
    "none": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
    "successive_halving": "SuccessiveHalvingPruner", "hyperband": "HyperbandPruner",
}
SamplerName = Literal[tuple(SAMPLER_CLASSES)]  # type: ignore[valid-type]
PrunerName = Literal[tuple(PRUNER_CLASSES)]  # type: ignore[valid-type]


class Sampler(StrictModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)  # extra keys = sampler kwargs
    type: SamplerName = "tpe"
    seed: int = 0

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Pruner(StrictModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)  # extra keys = pruner kwargs
    type: PrunerName = "none"

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Train(StrictModel):
    steps: Annotated[int, Field(ge=1, le=MAX_STEP)]
    eval_every: Annotated[int, Field(ge=1, le=MAX_STEP)]
    seed: int = 0
    # Data parallel: each batch is split over this many devices, params replicated (see runner).
    devices: Annotated[int, Field(ge=1)] = 1
    # false (default): each trial number gets its own initialisation and data order, derived from
    # (seed, number); true: every trial starts from the same ones (only the hyperparameters differ).
    same_seed_for_all_trials: bool = False


# The default cadence (no cadence key) writes at most this share of the wall time. Measured on the example
# with every_steps 100 (benchmarks/RESULTS.md): 0.03 keeps a study within 1.05x of no periodic saves.
class Parallel(StrictModel):
    n_jobs: Annotated[int, Field(ge=1)] | Literal["auto"] = 1  # auto: one worker per device slot (sweep/host/slots.py)
    trials_per_device: Annotated[int, Field(ge=1)] = 1  # workers sharing each slot's devices (GPU memory / M each)
    # A worker on another host that stopped renewing its claims this long ago is taken for dead.
    lease_grace_seconds: Annotated[float, Field(gt=0)] = 60.0
    # Where the n_jobs workers run: local processes (joblib's loky) or a Dask cluster (joblib's
    # dask backend, through distributed.Client(address)).
    backend: Literal["loky", "dask"] = "loky"
    address: Annotated[str, Field(min_length=1)] | None = None  # the Dask scheduler, e.g. tcp://host:8786
    # Dask worker resources each sweep worker takes, e.g. {device: 1}: one per Dask worker started
    # with --resources device=1 (dask-cuda: one Dask worker per GPU). Only with backend dask.
    resources: dict[str, Annotated[float, Field(gt=0)]] | None = None

    @model_validator(mode="after")
    def _check(self) -> Parallel:
        if self.backend == "dask" and self.address is None:
            raise ValueError("address: is required with backend dask (the Dask scheduler, e.g. tcp://host:8786), "
                             "got None")
        if self.backend != "dask" and self.address is not None:
            raise ValueError(f"address: is only used with backend dask, got {self.address!r}")
        if self.backend != "dask" and self.resources is not None:
            raise ValueError(f"resources: are Dask worker resources, only used with backend dask, got {self.resources!r}")
        if self.backend == "dask" and importlib.util.find_spec("distributed") is None:
            raise ValueError("backend: dask needs the `distributed` package (pip install 'sweep[dask]'), got 'dask'")
        return self


class WarmStart(StrictModel):
    study: Annotated[str, Field(min_length=1)]  # another study file, relative to the current directory


class Logging(StrictModel):
    """Where training curves go besides Optuna's storage (sweep/tracking/curves.py); steers, never defines, a trial."""

    # true: <workdir>/tensorboard; a string: that folder (relative to the current directory).
    tensorboard: Any = False  # bool | str, checked below: one message for every wrong value
    mlflow: Annotated[str, Field(min_length=1)] | None = None  # an MLflow tracking URI

    @model_validator(mode="after")
    def _check(self) -> Logging:
        if not isinstance(self.tensorboard, (bool, str)) or self.tensorboard == "":
            raise ValueError(f"tensorboard: must be true, false or a folder, got {self.tensorboard!r}")
        # Optional packages: a configured writer whose package is missing is a study-file error
        # (exit 2, before anything is created), not a warning in the middle of a run.
        for key, module, extra in (("tensorboard", "tensorboardX", "tensorboard"), ("mlflow", "mlflow", "mlflow")):
            value = getattr(self, key)
            if value not in (None, False) and importlib.util.find_spec(module) is None:
                raise ValueError(f"{key}: needs the `{module}` package (pip install 'sweep[{extra}]'), got {value!r}")
        return self


class StudyFile(StrictModel):
    name: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")]
    trial: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]
    storage: str | None = None
    workdir: Annotated[str, Field(min_length=1)] | None = None
    n_trials: Annotated[int, Field(ge=1)]
    timeout: Annotated[float, Field(gt=0)] | None = None
    max_retries: Annotated[int, Field(ge=0)] = 0  # a trial that raises is retried from its newest checkpoint
    # A database away for a while (a restart, a failover) is waited for, this long per call.
    storage_retry_seconds: Annotated[float, Field(gt=0)] = 300.0
    # A trial's data() that has not returned after this long fails the trial (sweep/trial/guard.py).
    data_timeout_seconds: Annotated[float, Field(gt=0)] = 1800.0
    # One, or several (sweep/study/objectives.py; `objective` is then the first: it picks the best step).
    objective: Objective = None  # type: ignore[assignment]
    objectives: list[Objective] | None = None
    sampler: Sampler = Sampler()
    pruner: Pruner = Pruner()
    # Checked by the class its `type` names (sweep/study/scheduler_keys.py); None: every trial trains to the end.
    scheduler: Annotated[SerializeAsAny[SchedulerKeys], BeforeValidator(scheduler_keys.section)] | None = None
    # None: the trial module's search_space(trial) samples with Optuna's suggest API (docs/search.md).
    search_space: dict[str, Param] | None = None
    enqueue: list[dict[str, Scalar]] = []  # params of the first trials, in order (sweep/store/enqueue.py)
    constraints: list[Constraint] = []  # on reported metrics (sweep/study/constraints.py)
    warm_start: WarmStart | None = None  # another study's trials as observations (sweep/store/warm_start.py)
    fixed: dict[str, Any] = {}
    train: Train
    checkpoint: Checkpoint = Checkpoint()
    parallel: Parallel = Parallel()
    logging: Logging = Logging()

    @model_validator(mode="after")
    def _check_objectives(self) -> StudyFile:
        objectives_lib.check(self.objective, self.objectives, self.pruner.type)
        if self.objectives is not None:
            if self.sampler.type in SINGLE_OBJECTIVE_SAMPLERS:
                raise ValueError(f"sampler.type: takes one objective only; for several use tpe, nsga2, gp, random, "
                                 f"qmc or grid, got {self.sampler.type!r}")
            object.__setattr__(self, "objective", self.objectives[0])  # frozen: set once, here
        return self

    @model_validator(mode="after")
    def _check_scheduler(self) -> StudyFile:
        s = self.scheduler
        if s is None:
            return self
        if self.objectives is not None:
            raise ValueError(f"scheduler.type: takes one objective only (with several, trials report nothing to rank "
                             f"at a rung), got {s.type!r}")
        if self.pruner.type != "none":
            raise ValueError(f"pruner.type: must be none with scheduler {s.type} (the scheduler pauses trials and "
                             f"promotes them later; an Optuna pruner would end them for good), got {self.pruner.type!r}")
        key, what = s.first_key, s.first_what
        if s.first >= self.train.steps:
            raise ValueError(f"scheduler.{key}: must be < train.steps ({self.train.steps}): {what} comes "
                             f"before a trial's last step, got {s.first}")
        if s.first % self.train.eval_every:
            raise ValueError(f"scheduler.{key}: must be a multiple of train.eval_every ({self.train.eval_every}): "
                             f"a trial pauses at an evaluation, got {s.first}")
        s.check(self)  # its own rules across the file
        return self

    @property
    def all_objectives(self) -> list[Objective]:
        """Every objective, in order (one for a single-objective study)."""
        return list(self.objectives) if self.objectives is not None else [self.objective]

    @property
    def multi_objective(self) -> bool:
        return self.objectives is not None


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a config came from: enough to rebuild it in another process (a worker) without the file.

    `origin` names the study file (or "<dict>") in messages; `cwd` is the directory relative paths
    (workdir, storage, a user's trial module) were resolved against. `raw` is the file's text, with
    its `${VAR}`s; `env` the values they had here, so that every worker reads the same study
    (kept out of repr: they may be secrets).
    """

    raw: dict[str, Any]
    origin: str
    cwd: str
    env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)


class Config:
    """A validated study file, with its paths resolved against the current directory.

    The on-disk layout of a study lives here and nowhere else: `workdir`, `checkpoint_dir`,
    `cache_dir`, `lock_path` and the default SQLite storage.
    """

    def __init__(self, path: Path, study: StudyFile, trial_module: Any = None, source: Source | None = None) -> None:
        self.path = path
        self.study = study
        self._trial_module = trial_module  # None: imported on first use (see trial_module)
        self._import_error: ConfigError | None = None
        self.source = source or Source(study.model_dump(mode="python", exclude_unset=True), str(path), os.getcwd())
        self.workdir = Path(os.path.abspath(study.workdir or f"runs/{study.name}"))
        self.storage = _resolve_storage(study.storage, self.workdir)

    @property
    def name(self) -> str:
        return self.study.name

    @property
    def trial_module(self) -> Any:
        """The trial module, imported and checked against the file on first use (readers such as
        `status` never need it: a study whose module no longer imports stays readable). Raises
        ConfigError, every time, where it does not import or lacks the trial protocol."""
        if self._trial_module is None:
            if self._import_error is None:
                try:
                    self._trial_module = config_checks.trial_module(str(self.path), self.study, self.source.cwd)
                except ConfigError as exc:
                    self._import_error = exc
            if self._import_error is not None:
                raise self._import_error
        return self._trial_module

    @property
    def sampled_names(self) -> list[str]:
        """Names a trial's params may hold: the search space's, or (define-by-run) every
        hyperparameter of the trial that is not fixed."""
        names = self.study.search_space or self.trial_module.HYPERPARAMETERS
        return [name for name in names if name not in self.study.fixed]

    def hyperparameters(self, params: dict[str, Any]) -> dict[str, Any]:
        """What the trial sees: its defaults, overridden by fixed values and sampled params."""
        return {**self.trial_module.HYPERPARAMETERS, **self.study.fixed, **params}

    def checkpoint_dir(self, number: int) -> Path:
        return self.workdir / "checkpoints" / f"trial_{number:04d}"

    @property
    def tensorboard_dir(self) -> Path | None:
        """The TensorBoard logdir (one run per trial, `trial_NNNN`), None when not configured."""
        where = self.study.logging.tensorboard
        if where is False:
            return None
        return self.workdir / "tensorboard" if where is True else Path(os.path.abspath(where))

    @property
    def cache_dir(self) -> Path:
        """JAX's persistent compilation cache of this study's processes: `<workdir>/jax_cache`, or
        the folder in $SWEEP_COMPILATION_CACHE, shared by every study that names it (executables
        are keyed by program, device and versions, so sharing is safe)."""
        shared = os.environ.get("SWEEP_COMPILATION_CACHE")
        return Path(os.path.abspath(shared)) if shared else self.workdir / "jax_cache"

    @property
    def lock_path(self) -> Path:
        """The file lock that serialises creating (and first opening) the study's storage."""
        return self.workdir / ".create.lock"


def default_storage(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'study.db'}"


def _resolve_storage(url: str | None, workdir: Path) -> str:
    if url is None:
        return default_storage(workdir)
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix + ":memory:":
        # Relative SQLite paths are relative to the current directory, as in the study file.
        return prefix + os.path.abspath(url[len(prefix):])
    journal = "journal://"  # journal://PATH: Optuna's journal in a file (sweep/store/journal.py)
    if url.startswith(journal) and not url.startswith(journal + "/"):
        return journal + os.path.abspath(url[len(journal):])  # relative to the current directory, as SQLite's
    return url


def load(path: str | os.PathLike[str], import_trial: bool = True) -> Config:
    """Read, parse and validate a study file, importing its trial module (`import_trial` false: on
    first use, see `Config.trial_module`).

    Raises:
        ConfigError: on any broken rule; nothing has been created.
    """
    file = str(path)
    return from_dict(study_yaml.read(file), origin=file, import_trial=import_trial)


def from_dict(raw: dict[str, Any], origin: str = "<dict>", env: dict[str, str] | None = None,
              import_trial: bool = True) -> Config:
    """Validate a study given as a mapping (the study file's keys); `origin` names it in errors.

    Relative paths resolve against the current directory, as for a file. `${VAR}` in the keys that
    take it (sweep.study.credentials) is read from `env` first, then from the environment.
    `import_trial` false leaves the trial module to its first use (`Config.trial_module`).

    Raises:
        ConfigError: on any broken rule; nothing has been created.
    """
    if not isinstance(raw, dict):
        raise ConfigError(origin, "", "must be a mapping of study keys", type(raw).__name__)
    study_yaml.check_plain(origin, raw)
    values, used = credentials.interpolate(raw, origin, {**os.environ, **(env or {})})
    try:
        study = StudyFile.model_validate(values)
    except ValidationError as exc:
        # A typo'd key also makes its intended key "missing": report the typo, the root cause.
        errors = sorted(config_errors.unwrap(exc.errors()), key=lambda e: e["type"] != "extra_forbidden")
        raise config_errors.translate(origin, errors[0], raw, StudyFile, PARAM_MODELS, NAME_PATTERN) from None
    config_checks.storage(origin, study.storage, raw.get("storage"))
    config_checks.warm_start(origin, study.warm_start)
    config_checks.cadence(origin, study.checkpoint)
    config_checks.ram_tier(origin, study.checkpoint)
    space.check(origin, study)
    module = config_checks.trial_module(origin, study) if import_trial else None
    config = Config(Path(origin), study, module, Source(copy.deepcopy(raw), origin, os.getcwd(), used))
    credentials.remember(config.storage, credentials.used_in(raw.get("storage"), used))
    return config


def from_source(source: Source) -> Config:
    """Rebuild a config in another process (a worker): same keys, same values, same directory."""
    os.chdir(source.cwd)
    return from_dict(source.raw, source.origin, source.env)
