"""Data-order helpers for trials: an epoch permutation that is a pure function of (key, step)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def epoch_batch(key: Any, step: Any, size: int, batch_size: int) -> Any:
    """Indices of the batch of `step`: epoch e = step // (size // batch_size) visits every example
    once, in the order of a permutation drawn from fold_in(key, e); the last incomplete batch of
    each epoch is dropped (as Flax's MNIST example does). A pure function of (key, step), so a
    resumed trial continues the epoch exactly where it was."""
    per_epoch = size // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} is larger than the {size} examples")
    epoch, index = jnp.divmod(jnp.asarray(step, jnp.int32), per_epoch)
    order = jax.random.permutation(jax.random.fold_in(key, epoch), size)
    return jax.lax.dynamic_slice(order, (index * batch_size,), (batch_size,))
