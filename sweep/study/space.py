"""The search space's structure: conditional parameters (`when`), the order they are sampled in,
which are active for given params, and checking values (conditions, `enqueue`) against it.

Imports neither optuna nor jax (config validates with it). A parameter with `when: {optimizer:
sgd}` (or a list of allowed values, `when: {optimizer: [sgd, nesterov]}`; several names: all
must hold) is sampled only when its condition holds; a condition may name a conditional
parameter (nested), which then must be active too.
"""

from __future__ import annotations

from typing import Any, Mapping

from sweep.errors import ConfigError


def conditions(param: Any) -> dict[str, list[Any]]:
    """`when` with every allowed value as a list ({} for an unconditional parameter)."""
    when = getattr(param, "when", None) or {}
    return {name: list(v) if isinstance(v, list) else [v] for name, v in when.items()}


def order(space: Mapping[str, Any]) -> list[str]:
    """Names in sampling order: every parameter after those its condition names, else file order.
    (Define-by-run: the value a condition reads is suggested before the parameter it guards.)"""
    out: list[str] = []

    def visit(name: str) -> None:
        if name not in out:
            for parent in conditions(space[name]):
                visit(parent)
            out.append(name)

    for name in space:
        visit(name)
    return out


def is_active(space: Mapping[str, Any], name: str, params: Mapping[str, Any]) -> bool:
    """Whether `name` is sampled given the params sampled before it (in `order`)."""
    for parent, allowed in conditions(space[name]).items():
        if parent not in params or not any(same(params[parent], v) for v in allowed):
            return False
    return True


def active(space: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` restricted to the parameters active for them (in `order`)."""
    out: dict[str, Any] = {}
    for name in order(space):
        if name in params and is_active(space, name, out):
            out[name] = params[name]
    return out


def same(a: Any, b: Any) -> bool:
    """Equal as YAML values: 1 and 1.0 are, true and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b and (type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))))


def contains(param: Any, value: Any) -> bool:
    """Whether `value` is a point of `param` (a choice, one of its values, or in its range and on its step)."""
    listed = getattr(param, "choices", None)
    if listed is None:
        listed = getattr(param, "values", None)
    if listed is not None:
        return any(same(value, v) for v in listed)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if param.type == "int" and not isinstance(value, int):
        return False
    if not param.low <= value <= param.high:
        return False
    step = param.step
    if step is None or (param.type == "int" and step == 1):
        return True
    ratio = (value - param.low) / step
    return abs(ratio - round(ratio)) < 1e-9


def check(file: str, study: Any) -> None:
    """Every rule of conditions and `enqueue` (exit 2 naming the key).

    Raises:
        ConfigError: a condition on an unknown or continuous parameter, an impossible value, a
            cycle, conditions under the grid sampler; an enqueued name or value outside the space.
    """
    space = study.search_space or {}
    for name, param in space.items():
        for parent, allowed in conditions(param).items():
            key = f"search_space.{name}.when.{parent}"
            if parent not in space:
                raise ConfigError(file, key, f"must name a parameter of search_space (one of {', '.join(space)})",
                                  parent)
            p = space[parent]
            if p.type == "float" and p.values is None:
                raise ConfigError(file, key, "a condition needs a categorical parameter, an int, or a list of "
                                  f"values; {parent} is a continuous float range", parent)
            for value in allowed:
                if not contains(p, value):
                    raise ConfigError(file, key, f"can never hold: {value!r} is not a value of {parent}", value)
    _check_cycles(file, space)
    if study.sampler.type == "grid" and any(conditions(p) for p in space.values()):
        name = next(n for n, p in space.items() if conditions(p))
        raise ConfigError(file, f"search_space.{name}.when", "conditional parameters need a sampler that "
                          "samples per trial (tpe, random, qmc, cmaes, gp), not grid", "grid")
    for i, entry in enumerate(study.enqueue if study.search_space is not None else ()):
        _check_entry(file, space, i, entry)  # define-by-run: names checked against the trial's, values by Optuna


def _check_cycles(file: str, space: Mapping[str, Any]) -> None:
    state: dict[str, int] = {}  # 1: being visited, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise ConfigError(file, f"search_space.{cycle[0]}.when", "conditions must not form a cycle",
                              " -> ".join(cycle))
        state[name] = 1
        for parent in conditions(space[name]):
            visit(parent, path + [name])
        state[name] = 2

    for name in space:
        visit(name, [])


def _check_entry(file: str, space: Mapping[str, Any], i: int, entry: Mapping[str, Any]) -> None:
    for name, value in entry.items():
        key = f"enqueue.{i}.{name}"
        if name not in space:
            raise ConfigError(file, key, f"must name a parameter of search_space (one of {', '.join(space)})", name)
        if not contains(space[name], value):
            raise ConfigError(file, key, f"is outside the search space of {name} ({_describe(space[name])})", value)
    for name in order(space):
        given = {n: entry[n] for n in conditions(space[name]) if n in entry}
        # A condition on a parameter the entry leaves to the sampler can hold or not: only one
        # the entry decides is checked.
        if name in entry and len(given) == len(conditions(space[name])) and not is_active(space, name, entry):
            raise ConfigError(file, f"enqueue.{i}.{name}", f"is not active for this entry: its condition "
                              f"{conditions(space[name])} does not hold", entry[name])


def _describe(param: Any) -> str:
    listed = getattr(param, "choices", None) or getattr(param, "values", None)
    if listed is not None:
        return f"one of {listed}"
    step = f", step {param.step}" if param.step not in (None, 1) or param.type == "float" and param.step else ""
    return f"{param.type} in [{param.low}, {param.high}]{step}"
