"""Reading a study file's YAML safely: plain data only, of bounded depth and size.

`yaml.safe_load` builds no object, but it still returns more than a study file can mean: dates,
bytes and sets (`2020-01-01`, `!!binary`, `!!set`), values that refer to themselves (`&a [*a]`) and
aliases that multiply (nine levels of ten aliases are a billion values to walk, in a few lines). A
study's values are stored with it as JSON, so anything else is an error of the file (exit 2), as
are nesting past `MAX_DEPTH` and more than `MAX_VALUES` values once aliases are expanded.

Imports neither optuna nor jax.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sweep.errors import ConfigError

MAX_DEPTH = 64  # a study file nests 4-5 deep; a fixed value may hold nested lists
MAX_VALUES = 100_000
_PLAIN = (type(None), bool, int, float, str)


def read(file: str) -> dict[str, Any]:
    """The study file's keys.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, not a mapping, or not plain data.
    """
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file, "", "study file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(file, "", f"cannot read the study file ({exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if "could not determine a constructor" in str(exc):
            problem = f"unsupported YAML tag (only plain YAML is allowed): {problem}"
        raise ConfigError(file, "", f"invalid YAML at {where}{problem}") from None
    except yaml.YAMLError as exc:  # a ReaderError (a control character) says where on a second line
        raise ConfigError(file, "", f"invalid YAML: {' '.join(str(exc).split())}") from None
    except ValueError as exc:  # a constructor's: an int past Python's 4300 digits, a date like 2020-13-45
        raise ConfigError(file, "", f"invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(file, "", f"invalid YAML: nested too deeply (at most {MAX_DEPTH} levels)") from None
    if raw is None:
        raise ConfigError(file, "", "must be a mapping of study keys, got an empty file")
    if not isinstance(raw, dict):
        raise ConfigError(file, "", "must be a mapping of study keys", type(raw).__name__)
    check_plain(file, raw)
    return raw


def check_plain(file: str, raw: dict[str, Any]) -> None:
    """Raise ConfigError unless `raw` is plain data (see the module docstring). Walked without
    recursion: the depth is what is being checked."""
    count = 0
    stack: list[tuple[Any, str, int, frozenset[int]]] = [(raw, "", 0, frozenset())]
    while stack:
        value, key, depth, above = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(file, "", f"holds more than {MAX_VALUES} values once its YAML aliases are expanded")
        if depth > MAX_DEPTH:
            raise ConfigError(file, key, f"is nested too deeply (at most {MAX_DEPTH} levels)")
        if isinstance(value, _PLAIN):
            continue
        if not isinstance(value, (list, dict)):
            raise ConfigError(file, key, "must be plain YAML data (a number, string, true/false, null, list or "
                                         "mapping)", value)
        if id(value) in above:
            raise ConfigError(file, key, "a YAML alias refers to the value that holds it (the value would be "
                                         "infinite)")
        inside = above | {id(value)}
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(value, dict) and not isinstance(k, str):
                raise ConfigError(file, f"{key}.{k}" if key else str(k), "keys must be strings", k)
            stack.append((v, f"{key}.{k}" if key else str(k), depth + 1, inside))
