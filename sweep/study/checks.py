"""The study file's rules beyond its schema: the storage URL parses, the warm-start study is
another file, the checkpoint cadence keys agree, and the trial module imports, speaks the protocol and declares every name the file
uses (hyperparameters, metrics). Called by sweep.study.config after the schema holds; `study` is its
StudyFile (typed Any here: sweep.study.config imports this module)."""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any

from sweep.errors import ConfigError
from sweep.trial.protocol import import_trial, protocol_problems


def storage(file: str, url: str | None, text: Any) -> None:
    """`text`: the key as the file wrote it, shown in the error (`url` may hold a secret)."""
    if url is None:
        return
    if url.startswith("journal://"):  # Optuna's journal in a file: any path names one
        if url.rstrip("/") == "journal:" or url.endswith("/"):
            raise ConfigError(file, "storage", "must name a journal file, like journal:///shared/sweeps/study.log",
                              text)
        return
    if url.startswith(("redis://", "rediss://")):
        import importlib.util

        if importlib.util.find_spec("redis") is None:
            raise ConfigError(file, "storage", "needs the redis package for Optuna's journal in Redis: "
                              "pip install 'sweep[redis]'", text)
    from sqlalchemy.engine import make_url  # local: only needed when a storage is named
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError:
        raise ConfigError(file, "storage", "must be an SQLAlchemy database URL like sqlite:///path/study.db, "
                          "a journal file like journal:///shared/sweeps/study.log, or redis://host:6379/0",
                          text) from None


def warm_start(file: str, warm: Any) -> None:
    if warm is None:
        return
    if not os.path.isfile(warm.study):
        raise ConfigError(file, "warm_start.study", f"must be a study file (relative to {os.getcwd()})", warm.study)
    if os.path.exists(file) and os.path.samefile(file, warm.study):
        raise ConfigError(file, "warm_start.study", "must be another study's file, not this one", warm.study)


def cadence(file: str, checkpoint: Any) -> None:
    """`every: auto` chooses the interval itself: no every_steps or every_seconds beside it, and
    `mtbi_seconds` (its prior) only with it."""
    given = {k: getattr(checkpoint, k) for k in checkpoint.model_fields_set if getattr(checkpoint, k) is not None}
    if checkpoint.every == "auto":
        for key in ("every_steps", "every_seconds"):
            if key in given:
                raise ConfigError(file, f"checkpoint.{key}", "cannot be given with every: auto (auto chooses the "
                                  "interval from the save cost and the interruptions; remove one of them)", given[key])
    elif "mtbi_seconds" in given:
        raise ConfigError(file, "checkpoint.mtbi_seconds", "is only used with every: auto (the prior mean time "
                          "between interruptions of its interval)", given["mtbi_seconds"])


def ram_tier(file: str, checkpoint: Any) -> None:
    """checkpoint.ram.path is a folder that exists here (a fast local filesystem: /dev/shm, a local SSD)."""
    ram = checkpoint.ram
    if ram is not None and not os.path.isdir(ram.path):
        raise ConfigError(file, "checkpoint.ram.path", "must be an existing folder on a fast local filesystem "
                          "(/dev/shm, a tmpfs or a local SSD)", ram.path)


def trial_module(file: str, study: Any, cwd: str | None = None) -> Any:
    """The trial module `study` names, imported and checked. `cwd`: the directory the study was
    opened in, where a module beside the study file is found, also once the process has moved on
    (a lazily imported module, sweep.open(import_trial=False))."""
    moved = cwd is not None and os.path.abspath(cwd) != os.getcwd() and cwd not in sys.path
    if moved:
        sys.path.insert(0, cwd)
    try:
        module = import_trial(study.trial)
    except ModuleNotFoundError as exc:
        raise ConfigError(file, "trial", f"cannot import module ({exc}); is it on the current directory or PYTHONPATH?",
                          study.trial) from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(file, "trial", f"importing the module raised {type(exc).__name__}: {exc}", study.trial) from None
    finally:
        if moved and cwd in sys.path:
            sys.path.remove(cwd)
    problems = protocol_problems(module)
    if problems:
        attr, rule, value = problems[0]
        raise ConfigError(file, "trial", f"module {study.trial} does not provide the trial protocol: {attr} {rule}",
                          value)
    _names(file, study, module)
    return module


def _names(file: str, study: Any, module: Any) -> None:
    known = list(module.HYPERPARAMETERS)
    if study.search_space is None and not callable(getattr(module, "search_space", None)):
        raise ConfigError(file, "search_space", f"is required (or define search_space(trial) in {study.trial}: "
                          "Optuna's define-by-run API)")
    enqueued = {name for entry in study.enqueue for name in entry} if study.search_space is None else set()
    for section, names in (("search_space", study.search_space or {}), ("fixed", study.fixed),
                           ("enqueue", enqueued)):
        for name in names:
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else f" (it understands: {', '.join(known)})"
                raise ConfigError(file, f"{section}.{name}", f"not a hyperparameter of {study.trial}{extra}")
    for name in [*(study.search_space or {}), *enqueued]:
        if name in study.fixed:
            raise ConfigError(file, f"fixed.{name}", "is also in search_space; a name is either sampled or fixed")
    metrics = list(module.METRICS)
    for key, o in ([("objective", study.objective)] if not study.multi_objective else
                   [(f"objectives.{i}", o) for i, o in enumerate(study.all_objectives)]):
        if o.metric not in metrics:
            raise ConfigError(file, f"{key}.metric", f"must be a metric of {study.trial} (one of {', '.join(metrics)})",
                              o.metric)
    for i, c in enumerate(study.constraints):
        if c.metric not in metrics:
            raise ConfigError(file, f"constraints.{i}.metric", f"must be a metric of {study.trial} (one of "
                              f"{', '.join(metrics)})", c.metric)
