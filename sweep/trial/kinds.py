"""Trial kinds: how a trial module's own functions map onto the loop's pure functions.

The loop trains `params` (what the optimizer updates) and carries `model_state` (everything else
the model updates while training: BatchNorm statistics, EMA weights, counters, NNX's RNG state)
as plain pytrees of arrays, so that jit, optax, Orbax and safetensors see nothing unusual.
Three kinds of trial modules, told apart without any declaration beyond what Flax users write:

- plain: `init` returns params; `loss(hp, params, batch, key)` returns a scalar.

Every kind's `loss` may also declare `step` (`loss(hp, params, batch, key, step)`, `takes_step`):
it then gets the step being trained, passed by keyword.
- Flax linen with mutable collections: the module declares `COLLECTIONS = ("batch_stats",)`;
  `init` returns the variables dict (`model.init(...)` unchanged), `loss(hp, variables, batch,
  key)` returns `(loss, updates)` (what `apply(..., mutable=[...])` returns as its second value),
  `evaluate(hp, variables, data)` gets the variables.
- Flax NNX: `init` returns an `nnx.Module`; `loss(hp, model, batch, key)` and `evaluate(hp,
  model, data)` get the module (in `train()` / `eval()` mode); sweep splits and merges it inside
  its compiled loop. Typed PRNG keys (nnx.Rngs) are carried as raw key data, since Orbax does not
  restore typed keys (orbax#2540).
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any, Hashable, Mapping

import jax


class PlainKind:
    """init -> params; no model state."""

    name = "plain"

    def start(self, initial: Any) -> tuple[Any, dict[str, Any]]:
        return initial, {}

    def loss(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, batch: Any, key: Any,
             step: Any = None) -> Any:
        """(loss, new model state); `step` (not None) reaches a `loss` that declares it."""
        return module.loss(hp, params, batch, key, **_step(step)), state

    def evaluate(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, data: Any) -> Any:
        return module.evaluate(hp, params, data)

    def call(self, fn: Any, hp: Mapping[str, Any], params: Any, state: Any, *args: Any) -> Any:
        """A trial function of the evaluate form (`test`): fn(hp, <model>, *args)."""
        return fn(hp, params, *args)

    def variables(self, params: Any, state: Any) -> dict[str, Any]:
        return {"params": params}

    def model(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any) -> Any:
        model_fn = getattr(module, "model", None)
        return model_fn(hp) if callable(model_fn) else None

    def static_key(self) -> Hashable:
        return self.name


class CollectionsKind(PlainKind):
    """Flax linen: init -> variables; `COLLECTIONS` are the model state, "params" are trained."""

    name = "collections"

    def __init__(self, collections: tuple[str, ...]) -> None:
        self.collections = collections

    def start(self, initial: Any) -> tuple[Any, dict[str, Any]]:
        if not isinstance(initial, Mapping) or "params" not in initial:
            raise TypeError("a trial with COLLECTIONS must return Flax variables from init "
                            f"({{'params': ..., {', '.join(repr(c) for c in self.collections)}: ...}}), "
                            f"got {type(initial).__name__}")
        missing = [c for c in self.collections if c not in initial]
        if missing:
            raise TypeError(f"init's variables lack the declared COLLECTIONS {missing}; it has {sorted(initial)}")
        return initial["params"], {c: initial[c] for c in self.collections}

    def loss(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, batch: Any, key: Any,
             step: Any = None) -> Any:
        out = module.loss(hp, {"params": params, **state}, batch, key, **_step(step))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("a trial with COLLECTIONS must return (loss, updates) from loss, where updates is "
                            "the mutated collections (the second value of apply(..., mutable=[...]))")
        loss, updates = out
        return loss, {c: updates.get(c, state[c]) for c in self.collections}

    def evaluate(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, data: Any) -> Any:
        return module.evaluate(hp, {"params": params, **state}, data)

    def call(self, fn: Any, hp: Mapping[str, Any], params: Any, state: Any, *args: Any) -> Any:
        return fn(hp, {"params": params, **state}, *args)

    def variables(self, params: Any, state: Any) -> dict[str, Any]:
        return {"params": params, **state}

    def static_key(self) -> Hashable:
        return (self.name, self.collections)


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _raw_keys(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


class NNXKind(PlainKind):
    """Flax NNX: init -> nnx.Module; nnx.Param are the params, every other variable the model state.

    The module's structure (its graphdef, in train and in eval mode) is static: it is part of the
    compiled functions' cache key, so a module attribute set from a hyperparameter (a dropout
    rate) gets its own program, correctly.
    """

    name = "nnx"

    def __init__(self, model: Any) -> None:
        from flax import nnx

        self._nnx = nnx
        model.train()
        self.train_def, params, rest = nnx.split(model, nnx.Param, ...)
        model.eval()
        self.eval_def, _, _ = nnx.split(model, nnx.Param, ...)
        model.train()
        self._params_template, self._rest_template = params, rest
        self._rest_pure = nnx.to_pure_dict(rest)  # typed keys where the module has them

    def start(self, initial: Any) -> tuple[Any, dict[str, Any]]:
        nnx = self._nnx
        return nnx.to_pure_dict(self._params_template), _raw_keys(self._rest_pure)

    def _merge(self, graphdef: Any, params: Any, state: Any) -> Any:
        nnx = self._nnx
        # Copies of the templates (tree.map builds new State objects): replace_by_pure_dict
        # writes in place, and the templates must never hold tracers.
        p = jax.tree.map(lambda x: x, self._params_template)
        nnx.replace_by_pure_dict(p, params)
        typed = jax.tree.map(lambda raw, t: jax.random.wrap_key_data(raw, impl=jax.random.key_impl(t))
                             if _is_key(t) else raw, state, self._rest_pure)
        r = jax.tree.map(lambda x: x, self._rest_template)
        nnx.replace_by_pure_dict(r, typed)
        return nnx.merge(graphdef, p, r)

    def _rest_of(self, model: Any) -> Any:
        nnx = self._nnx
        _, _, rest = nnx.split(model, nnx.Param, ...)
        return _raw_keys(nnx.to_pure_dict(rest))

    def loss(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, batch: Any, key: Any,
             step: Any = None) -> Any:
        model = self._merge(self.train_def, params, state)
        loss = module.loss(hp, model, batch, key, **_step(step))
        return loss, self._rest_of(model)  # BatchStat updates, RNG counts

    def evaluate(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any, data: Any) -> Any:
        return module.evaluate(hp, self._merge(self.eval_def, params, state), data)

    def call(self, fn: Any, hp: Mapping[str, Any], params: Any, state: Any, *args: Any) -> Any:
        return fn(hp, self._merge(self.eval_def, params, state), *args)

    def variables(self, params: Any, state: Any) -> dict[str, Any]:
        """{"params": ..., <collection>: ...} by NNX variable type (BatchStat -> "batch_stats");
        the RNG state (raw key data and counts) is training state, not part of the model."""
        nnx = self._nnx
        out: dict[str, Any] = {"params": params}
        for path, var in nnx.to_flat_state(self._rest_template):
            kind = type(var).__name__ if not hasattr(var, "type") else var.type.__name__
            if kind in ("RngKey", "RngCount") or "Rng" in kind:
                continue
            collection = _collection_name(kind)
            node = out.setdefault(collection, {})
            leaf: Any = state
            for part in path:
                leaf = leaf[part]
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = leaf
        return out

    def model(self, module: Any, hp: Mapping[str, Any], params: Any, state: Any) -> Any:
        model = self._merge(self.eval_def, params, state)
        return model

    def static_key(self) -> Hashable:
        return (self.name, self.train_def, self.eval_def)


def _collection_name(kind: str) -> str:
    """NNX variable type -> linen collection name: BatchStat -> batch_stats, Cache -> cache,
    Intermediate -> intermediates, EMAParam -> ema_param."""
    special = {"BatchStat": "batch_stats", "Param": "params", "Intermediate": "intermediates"}
    if kind in special:
        return special[kind]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", kind).lower()


def kind_of(module: Any, initial: Any) -> PlainKind:
    """The kind of a trial module, given what its `init` returned."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(initial, nnx.Module):
        return NNXKind(initial)
    collections = getattr(module, "COLLECTIONS", None)
    if collections:
        return CollectionsKind(tuple(collections))
    return PlainKind()


def _step(step: Any) -> dict[str, Any]:
    return {} if step is None else {"step": step}


def takes_step(fn: Any) -> bool:
    """`batch(hp, data, key, step)`, `loss(hp, params, batch, key, step)`: the trial wants the step
    (epoch-based data order; a step-dependent loss). Only a parameter named `step` says so; other
    extra parameters keep the old meaning (sweep/trial/protocol.py refuses required ones)."""
    try:
        return "step" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
