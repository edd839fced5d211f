"""What a study file says about the meaning of its trials, so that a started study refuses edits.

The keys that define what a trial is (its search space, trial module, fixed values, training
settings, objective and sampler) are stored with the study when it is created; every later `run`
compares the file with them before creating or asking anything. Keys that only steer the run
(`STEERING`) may change freely. The trial module's source is fingerprinted too, but a changed
module is only warned about: a fixed typo in a log line must not block a study.

Imports neither optuna nor jax (the session stores and reads these as study user attributes).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

from sweep.errors import ConfigError
from sweep.study.config import Config
from sweep.study.credentials import mask_url
from sweep.trial import code as trial_code

STUDY_ATTR = "sweep:study_file"  # study user attribute: meaning() of the file the study started from
CODE_ATTR = "sweep:trial_code"  # study user attribute: code() of the trial module it ran last
# Top-level keys that may change under a started study (docs/reference.md, "Keys that may change
# under a started study"); the pruner is one: it decides when to stop a trial, not what it computes.
STEERING = ("n_trials", "timeout", "parallel", "checkpoint", "max_retries", "pruner", "storage_retry_seconds",
            "data_timeout_seconds", "logging")
_ABSENT = ABSENT = object()  # a key one side lacks


def meaning(config: Config) -> dict[str, Any]:
    """The study file's trial-defining keys, as JSON values, with every default filled in.

    One entry per search-space parameter (a mapping of its settings) and per fixed value, one per
    key of train, objective and sampler (sampler arguments included), and the trial module.
    """
    study = config.study.model_dump(mode="json")
    out: dict[str, Any] = {"trial": study["trial"]}
    for section in ("objective", "sampler", "train"):
        out.update({f"{section}.{k}": v for k, v in study[section].items()})
    # `values` and `when` only where given: fingerprints stored before they existed stay equal.
    if study["search_space"] is None:  # define-by-run: the function's source defines the space
        out["search_space"] = define_by_run(config)
    out.update({f"search_space.{k}": {n: x for n, x in v.items() if not (n in ("values", "when") and x is None)}
                for k, v in (study["search_space"] or {}).items()})
    if config.study.scheduler is not None:  # where trials pause and which go on: what their values mean
        # The keys of its type only (its own model's): fingerprints stored before pbt's keys existed stay equal.
        out.update({f"scheduler.{k}": v for k, v in config.study.scheduler.meaning().items()})
    if study["enqueue"]:  # the first trials' params
        out["enqueue"] = study["enqueue"]
    if study["constraints"]:  # they steer the sampler and decide which trial is best
        out["constraints"] = study["constraints"]
    if study["objectives"] is not None:  # what each trial is told (objective.* is the first of them)
        out["objectives"] = study["objectives"]
    if study["warm_start"] is not None:  # the observations the sampler starts from
        out["warm_start"] = study["warm_start"]
    out.update({f"fixed.{k}": v for k, v in study["fixed"].items()})
    return out


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) of every difference; a parameter present in both files is
    compared setting by setting (`search_space.lr.high`), an added or removed one as a whole."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new), key=_order):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if key.startswith("search_space.") and isinstance(a, dict) and isinstance(b, dict):
            # A setting one side lacks is its default, None (a setting added by a later release).
            out += [(f"{key}.{k}", a.get(k), b.get(k)) for k in _union(a, b) if not _same(a.get(k), b.get(k))]
        elif not _same(a, b):
            out.append((key, a, b))
    return out


def refusal(config: Config, storage: str, found: list[tuple[str, Any, Any]]) -> ConfigError:
    """The exit-2 error for a study file whose trial-defining keys changed."""
    lines = diff_lines(found)
    rule = (f"study {config.name!r} (in {mask_url(storage)}) was started from a different study file: keys that define "
            f"what its trials mean changed; refused, nothing was created or changed:\n{lines}\n"
            f"Keys that only steer the run may change ({', '.join(STEERING)}). Put the old values back to "
            "continue this study, or give the study a new name to start another")
    return ConfigError(str(config.path), "", rule)


def mismatch_warning(config: Config, found: list[tuple[str, Any, Any]]) -> str:
    """What a reader (`status`) says of a study file that `run` would refuse: the same diff."""
    return (f"{config.path}: this file no longer matches study {config.name!r}: keys that define what its "
            f"trials mean changed, so run refuses it (exit 2); shown is the study as it ran:\n"
            f"{diff_lines(found)}")


def diff_lines(found: list[tuple[str, Any, Any]]) -> str:
    """'  key: old -> new', one line per changed key."""
    return "\n".join(f"  {key}: {show(a)} -> {show(b)}" for key, a, b in found)


def show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value)


def code(config: Config) -> dict[str, Any]:
    """The trial module's source file and the sha256 of its bytes ("" for a module without one), and
    the trial's own code (sweep.trial.code: the module and the local modules it imports): one
    `code_sha256` and the sha256 of each module's file (`files`)."""
    module = config.trial_module
    try:
        path = inspect.getsourcefile(module) or ""
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
    except (OSError, TypeError):
        path, digest = getattr(module, "__file__", "") or "", ""
    own = trial_code.record(module)
    return {"module": module.__name__, "file": path, "sha256": digest, "code_sha256": own["sha256"],
            "files": own["files"]}


def define_by_run(config: Config) -> dict[str, str]:
    """The trial module's search_space(trial): its name and the sha256 of its source."""
    fn = config.trial_module.search_space
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = repr(getattr(fn, "__code__", fn))
    return {"function": f"{config.trial_module.__name__}.search_space",
            "sha256": hashlib.sha256(source.encode()).hexdigest()}


def code_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    if old and old.get("code_sha256"):  # recorded with the modules the trial module imports
        return old["code_sha256"] != new["code_sha256"]
    return bool(old and old.get("sha256") and new["sha256"] and old["sha256"] != new["sha256"])


def _order(key: str) -> tuple[int, str]:
    sections = ("trial", "search_space", "enqueue", "fixed", "train", "objective", "objectives", "constraints",
                "warm_start", "sampler")
    return sections.index(key.split(".")[0]) if key.split(".")[0] in sections else len(sections), key


def _union(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return list(a) + [k for k in b if k not in a]


def _same(a: Any, b: Any) -> bool:
    """Equal as YAML values: 1 and 1.0 are (JSON keeps them apart), true and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b if a is _ABSENT or b is _ABSENT else a == b
