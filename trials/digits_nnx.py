"""Built-in trial in Flax NNX: a CNN with BatchNorm and dropout on the bundled 8x8 digits.

Written as Flax's own NNX examples are: `init` returns the `nnx.Module` (its `nnx.Rngs` drive
dropout), `loss` and `evaluate` call the module. sweep splits and merges it inside its compiled
loop, keeps `nnx.BatchStat` and the RNG state as model state, and sets `train()` / `eval()`
mode. The dropout rate is a module attribute, so each sampled rate compiles its own program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import sweep
from trials.digits_mlp import _splits

HYPERPARAMETERS = {
    "learning_rate": 3e-3,
    "features": 8,
    "hidden": 32,
    "dropout": 0.1,
    "batch_size": 32,
}
METRICS = ("val_loss", "val_accuracy")


class CNN(nnx.Module):
    def __init__(self, features: int, hidden: int, dropout: float, *, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(1, features, kernel_size=(3, 3), rngs=rngs)
        self.norm = nnx.BatchNorm(features, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(rate=dropout, rngs=rngs)
        self.hidden = nnx.Linear(features * 16, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.norm(self.conv(x)))
        x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))  # 8x8 -> 4x4
        x = x.reshape(x.shape[0], -1)
        x = self.dropout(nnx.relu(self.hidden(x)))
        return self.out(x)


def data(hp):
    return {k: jnp.asarray(v.reshape(-1, 8, 8, 1) if k.startswith("x") else v) for k, v in _splits().items()}


def init(hp, key, data):
    return CNN(int(hp["features"]), int(hp["hidden"]), float(hp["dropout"]), rngs=nnx.Rngs(key))


def optimizer(hp):
    return optax.adamw(hp["learning_rate"], weight_decay=1e-4)


def batch(hp, data, key, step):
    idx = sweep.epoch_batch(key, step, data["x_train"].shape[0], int(hp["batch_size"]))
    return data["x_train"][idx], data["y_train"][idx]


def loss(hp, model, batch, key):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def _metrics(model, x, y, prefix):
    logits = model(x)
    return {f"{prefix}_loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(),
            f"{prefix}_accuracy": (logits.argmax(-1) == y).mean()}


def evaluate(hp, model, data):
    return _metrics(model, data["x_val"], data["y_val"], "val")


def test(hp, model, data):
    return _metrics(model, data["x_test"], data["y_test"], "test")
