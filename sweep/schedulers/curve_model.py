"""The learning-curve model of the freeze-thaw scheduler (freeze_thaw.py): an ensemble of power laws, as DPL does (Kadra et al., "Scaling Laws for Hyperparameter
Optimization", NeurIPS 2023). Each member, a small MLP, maps a configuration's encoding to the
three parameters of its curve y(t) = a + b * t**(-c) (b, c >= 0: the metric, made smaller-is-better,
falls with the step t, a fraction of train.steps); the members differ in their initialisation
only; their spread is the prediction's uncertainty.

No library fits this (Optuna's GP sampler models configurations, not curves; DPL's own code is
PyTorch, and the pretrained models of ifBO are downloaded at run time), so it is written here, in
JAX and Optax, small enough to fit at every decision: full-batch Adam on every report of every
trial, with a fixed seed. Same reports, same predictions: a decision made again after a kill is
the same one (XLA on one machine computes the same program on the same inputs alike). It runs on
the host's CPU whatever device the trials train on: a few thousand points fit in well under a
second there, it takes no accelerator memory from a trial, and a GPU's reductions need not be
deterministic (on a GPU machine this is reasoned from JAX's documentation of default_device, not
yet run). Shapes are padded to powers of two, so that a study compiles a handful of programs, not
one per decision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

MEMBERS = 5  # the ensemble (DPL: 5)
HIDDEN = 32  # units of each member's two hidden layers
FIT_STEPS = 300  # full-batch Adam steps per fit
LEARNING_RATE = 0.01


@dataclasses.dataclass(frozen=True)
class Encoding:
    """Configurations as vectors in [0, 1]: a number scaled between its bounds (log where its
    distribution is), a category one-hot; a parameter a configuration lacks (a condition) is 0."""

    distributions: tuple[tuple[str, BaseDistribution], ...]

    @classmethod
    def of(cls, spaces: Sequence[Mapping[str, BaseDistribution]]) -> Encoding:
        found: dict[str, BaseDistribution] = {}
        for space in spaces:
            found.update(space)
        return cls(tuple(sorted(found.items())))

    @property
    def width(self) -> int:
        return max(1, sum(len(d.choices) if isinstance(d, CategoricalDistribution) else 1
                          for _, d in self.distributions))

    def encode(self, params: Mapping[str, Any]) -> np.ndarray:
        out: list[float] = []
        for name, d in self.distributions:
            value = params.get(name)
            if isinstance(d, CategoricalDistribution):
                out += [float(value is not None and value == c) for c in d.choices]
            elif value is None:
                out.append(0.0)
            else:
                out.append(_scaled(float(value), d))
        return np.asarray(out or [0.0], np.float32)

    def random(self, rng: np.random.RandomState, n: int) -> np.ndarray:
        """`n` configurations drawn uniformly in the encoded space (a category: one of its choices)."""
        cols = []
        for _, d in self.distributions:
            if isinstance(d, CategoricalDistribution):
                cols.append(np.eye(len(d.choices), dtype=np.float32)[rng.randint(len(d.choices), size=n)])
            else:
                cols.append(rng.uniform(size=(n, 1)).astype(np.float32))
        return np.concatenate(cols, axis=1) if cols else np.zeros((n, 1), np.float32)


def _scaled(value: float, d: BaseDistribution) -> float:
    assert isinstance(d, (FloatDistribution, IntDistribution))
    low, high = float(d.low), float(d.high)
    if d.log:
        value, low, high = math.log(value), math.log(low), math.log(high)
    return 0.0 if high == low else (value - low) / (high - low)


@dataclasses.dataclass(frozen=True)
class Fitted:
    """A fitted ensemble: `predict(x, t)` gives each member's value at fraction `t` of the steps,
    in the study's units and direction (the sign undone)."""

    params: Any
    mean: float
    scale: float
    sign: int

    def predict(self, x: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        """(members, len(x)) values of configurations `x` (encoded) at step fraction(s) `t`."""
        n = len(x)
        padded = _pad_rows(np.asarray(x, np.float32), _bucket(n, 8))
        ts = np.broadcast_to(np.asarray(t, np.float32), (n,))
        t_padded = np.ones(len(padded), np.float32)
        t_padded[:n] = ts
        out = np.asarray(_predict(self.params, padded, t_padded))[:, :n]
        return self.sign * (out * self.scale + self.mean)


def fit(x: np.ndarray, trial_of: np.ndarray, t: np.ndarray, y: np.ndarray, sign: int, seed: int) -> Fitted:
    """Fit the ensemble to reports `y` (study units) at step fractions `t` of trials `trial_of`
    (rows of `x`, each trial's encoded configuration). `sign`: +1 where smaller is better."""
    z = sign * np.asarray(y, np.float64)
    mean, scale = float(z.mean()), float(z.std()) or 1.0
    rows, points = _bucket(len(x), 8), _bucket(len(y), 64)
    xs = _pad_rows(np.asarray(x, np.float32), rows)
    mask = np.zeros(points, np.float32)
    mask[:len(y)] = 1.0
    idx, ts, zs = (np.zeros(points, np.int32), np.ones(points, np.float32), np.zeros(points, np.float32))
    idx[:len(y)], ts[:len(y)], zs[:len(y)] = trial_of, t, (z - mean) / scale
    params = _fit(seed, xs, idx, ts, zs, mask)
    return Fitted(params, mean, scale, sign)


def _bucket(n: int, least: int) -> int:
    return max(least, 1 << max(0, n - 1).bit_length())


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, x.shape[1]), np.float32)
    out[:len(x)] = x
    return out


# --- the model, in JAX (imported on first use: a study without this scheduler never loads it) ---

def _init(key: Any, width: int) -> Any:
    import jax

    sizes = [(width, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 3)]
    keys = jax.random.split(key, len(sizes))
    f32 = jax.numpy.float32  # not the process's default: a trial module may have enabled x64
    return [(jax.random.normal(k, s, f32) * math.sqrt(1.0 / s[0]), jax.numpy.zeros(s[1], f32))
            for k, s in zip(keys, sizes)]


def _laws(member: Any, x: Any) -> Any:
    """Member's power law (a, b, c) of each configuration of x: (rows, 3)."""
    import jax

    h = x
    for w, b in member[:-1]:
        h = jax.nn.gelu(h @ w + b)
    w, b = member[-1]
    out = h @ w + b
    return jax.numpy.stack([out[:, 0], jax.nn.softplus(out[:, 1]), jax.nn.softplus(out[:, 2])], axis=1)


def _curve(member: Any, x: Any, t: Any) -> Any:
    """Member's values of configurations x at step fractions t (standardised units)."""
    law = _laws(member, x)
    return law[:, 0] + law[:, 1] * t ** (-law[:, 2])


@functools.lru_cache(maxsize=None)
def _programs() -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp
    import optax

    def loss(member: Any, xs: Any, idx: Any, ts: Any, zs: Any, mask: Any) -> Any:
        law = _laws(member, xs)[idx]  # one law per trial, then one value per report
        pred = law[:, 0] + law[:, 1] * ts ** (-law[:, 2])
        return jnp.sum(mask * (pred - zs) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)

    def fit_member(key: Any, xs: Any, idx: Any, ts: Any, zs: Any, mask: Any) -> Any:
        member = _init(key, xs.shape[1])
        opt = optax.adam(LEARNING_RATE)
        state = opt.init(member)

        def step(carry: Any, _: Any) -> Any:
            member, state = carry
            grads = jax.grad(loss)(member, xs, idx, ts, zs, mask)
            updates, state = opt.update(grads, state)
            return (optax.apply_updates(member, updates), state), None

        (member, _), _ = jax.lax.scan(step, (member, state), None, length=FIT_STEPS)
        return member

    @jax.jit
    def fit_all(seed: Any, xs: Any, idx: Any, ts: Any, zs: Any, mask: Any) -> Any:
        keys = jax.random.split(jax.random.PRNGKey(seed), MEMBERS)
        return jax.vmap(fit_member, in_axes=(0, None, None, None, None, None))(keys, xs, idx, ts, zs, mask)

    @jax.jit
    def predict_all(params: Any, xs: Any, ts: Any) -> Any:
        return jax.vmap(_curve, in_axes=(0, None, None))(params, xs, ts)

    return fit_all, predict_all


@contextlib.contextmanager
def _host() -> Any:
    """A context in which JAX computes on the host's first CPU device (module docstring), in 32
    bits whatever the process's setting (a trial module may have enabled x64, `plan` has not)."""
    import jax

    with jax.enable_x64(False), _cpu():
        yield


def _cpu() -> Any:
    import jax

    try:
        return jax.default_device(jax.devices("cpu")[0])
    except RuntimeError:  # JAX_PLATFORMS without cpu: the default device, deterministic or not
        if not _WARNED:
            _WARNED.append(True)
            logging.getLogger("sweep").warning(
                "scheduler freeze_thaw: JAX has no CPU backend here (JAX_PLATFORMS=%s), so its curve model runs on "
                "%s, where a decision made again after a kill may differ; add cpu to JAX_PLATFORMS (e.g. "
                "JAX_PLATFORMS=cuda,cpu) to keep decisions reproducible", os.environ.get("JAX_PLATFORMS", ""),
                jax.devices()[0].platform)
        return contextlib.nullcontext()


_WARNED: list[bool] = []  # the warning above, once a process


def _fit(seed: int, *arrays: np.ndarray) -> Any:
    with _host():
        return _programs()[0](np.uint32(seed % 2**32), *arrays)


def _predict(params: Any, xs: np.ndarray, ts: np.ndarray) -> Any:
    with _host():
        return _programs()[1](params, xs, ts)
