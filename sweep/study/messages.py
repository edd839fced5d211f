"""Pydantic's validation errors of a study file, said as sweep says them: one line naming the
file, the key as the YAML writes it, the rule and the value (with a close match for a typo)."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any, Mapping

from pydantic import BaseModel

from sweep.errors import ConfigError
from sweep.study import scheduler_keys

_TYPE_RULES = {
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "too_short": "must not be empty",
    "missing": "is required",
}


def translate(file: str, err: Any, raw: Any, root: type[BaseModel], params: Mapping[str, type[BaseModel]],
              name_pattern: str) -> ConfigError:
    """One pydantic error of the study file's model `root` -> `<file>: <key>: <rule>, got <value>`;
    `params`: the search-space parameter models by their `type` tag."""
    # Discriminated unions put the tag in loc; drop it so keys read like the YAML.
    loc = _strip_tags(list(err["loc"]))
    key = ".".join(loc)
    kind, value = err["type"], err.get("input", ...)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(err["loc"]), root, params)
        if loc[:1] == ["scheduler"] and len(loc) == 2:  # the keys of its type (sweep/study/scheduler_keys.py)
            allowed = scheduler_keys.allowed_keys((_lookup(raw, loc[:1]) or {}).get("type"))
        hint = difflib.get_close_matches(loc[-1], allowed, n=1)
        rule = f"unknown key (did you mean {hint[0]!r}?)" if hint else f"unknown key (allowed: {', '.join(allowed)})"
        return ConfigError(file, key, rule)
    if kind == "missing":
        return ConfigError(file, key, "is required")
    if kind == "scheduler_type":  # a name or import path that names no scheduler (its own words)
        return ConfigError(file, key, err["msg"], value)
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return ConfigError(file, key + ".type", "must be one of float, int, categorical", _lookup(raw, loc + ["type"]))
    if kind == "literal_error":
        return ConfigError(file, key, f"must be one of {err['ctx']['expected']}", value)
    if kind == "string_pattern_mismatch":
        rule = {"name": f"must be a plain name matching {name_pattern}",
                "trial": "must be a dotted module name like trials.digits_mlp"}.get(key, "has an invalid form")
        return ConfigError(file, key, rule, value)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(err["ctx"].values()))
        return ConfigError(file, key, f"must be {op} {bound:g}" if isinstance(bound, float) else f"must be {op} {bound}",
                           value)
    if kind == "value_error":
        # Our own validators phrase the message as "<subkey>: <rule>, got <value>".
        message = str(err["ctx"]["error"])
        sub, _, rule = message.partition(": ")
        return ConfigError(file, f"{key}.{sub}" if key else sub, rule)
    return ConfigError(file, key, _TYPE_RULES.get(kind, err["msg"].lower()), value)


def unwrap(errors: list[Any]) -> list[Any]:
    """Pydantic's errors of the study file with the `scheduler` section's own (carried as one
    error, sweep/study/scheduler_keys.py) in its place, located from the file's root."""
    return [{**inner, "loc": (*err["loc"], *inner["loc"])} if err["type"] == "scheduler_section" else inner
            for err in errors for inner in (err["ctx"]["errors"] if err["type"] == "scheduler_section" else [err])]


def _strip_tags(loc: list[Any]) -> list[str]:
    # pydantic inserts the union tag after the search_space entry name: search_space.lr.float.low
    if len(loc) > 2 and loc[0] == "search_space" and loc[2] in ("float", "int", "categorical"):
        loc = loc[:2] + loc[3:]
    if loc and re.fullmatch(r"constrained-\w+|literal\[.*\]", str(loc[-1])):  # a member of `int | "auto"`
        loc = loc[:-1]
    return [str(part) for part in loc]


def _lookup(raw: Any, loc: list[str]) -> Any:
    for part in loc:
        if isinstance(raw, dict):
            raw = raw.get(part)
        elif isinstance(raw, list) and part.isdigit() and int(part) < len(raw):
            raw = raw[int(part)]
        else:
            return None
    return raw


def _allowed_keys(raw_loc: tuple[Any, ...], root: type[BaseModel], params: Mapping[str, type[BaseModel]]) -> list[str]:
    """Keys allowed in the mapping holding the unknown key at `raw_loc` (pydantic's, with union tags)."""
    if raw_loc[0] == "search_space" and len(raw_loc) == 4:
        return list(params[raw_loc[2]].model_fields)
    model: Any = root
    for part in raw_loc[:-1]:
        annotation = getattr(model.model_fields.get(str(part)), "annotation", None)
        # An optional section (`scheduler: Scheduler | None`): its model
        annotation = next((a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)),
                          annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)
