"""Built-in trial: a small Flax linen ResNet with BatchNorm and dropout on the bundled 8x8 digits.

What real training code brings, in Flax's own idiom: BatchNorm statistics as model state
(`COLLECTIONS`, `mutable=["batch_stats"]`), dropout with a per-step key, an epoch-based data
order (a permutation per epoch, without replacement) and a warmup-cosine schedule whose length
is the run's `train.steps`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import sweep
from trials.digits_mlp import _splits

HYPERPARAMETERS = {
    "learning_rate": 3e-3,
    "warmup_steps": 50,
    "width": 8,
    "blocks": 1,
    "dropout": 0.1,
    "batch_size": 32,
    "weight_decay": 1e-4,
}
METRICS = ("val_loss", "val_accuracy")
COLLECTIONS = ("batch_stats",)  # model state updated by training, kept beside the params


class Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        norm = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9)  # noqa: E731
        y = nn.relu(norm()(nn.Conv(self.width, (3, 3), use_bias=False)(x)))
        y = norm()(nn.Conv(self.width, (3, 3), use_bias=False)(y))
        return nn.relu(x + y)


class ResNet(nn.Module):
    width: int
    blocks: int
    dropout: float

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(
            nn.Conv(self.width, (3, 3), use_bias=False)(x)))
        for _ in range(self.blocks):
            x = Block(self.width)(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pool
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(10)(x)


def model(hp) -> ResNet:
    return ResNet(width=int(hp["width"]), blocks=int(hp["blocks"]), dropout=hp["dropout"])


def data(hp):
    # NHWC images: (N, 8, 8, 1)
    return {k: jnp.asarray(v.reshape(-1, 8, 8, 1) if k.startswith("x") else v) for k, v in _splits().items()}


def init(hp, key, data):
    return model(hp).init(key, data["x_train"][:1], train=False)  # {"params": ..., "batch_stats": ...}


def optimizer(hp):
    # The schedule's shape times the learning rate: optax's warmup_cosine_decay_schedule compares
    # its peak value in Python, which would make every sampled learning rate its own program.
    shape = optax.warmup_cosine_decay_schedule(0.0, 1.0, int(hp["warmup_steps"]), decay_steps=hp["train.steps"])
    schedule = lambda count: hp["learning_rate"] * shape(count)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=hp["weight_decay"]))


def batch(hp, data, key, step):
    # An epoch visits every training image once; `key` is the trial's data key.
    idx = sweep.epoch_batch(key, step, data["x_train"].shape[0], int(hp["batch_size"]))
    return data["x_train"][idx], data["y_train"][idx]


def loss(hp, variables, batch, key):
    x, y = batch
    logits, updates = model(hp).apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": key})
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates


def _metrics(hp, variables, x, y, prefix):
    logits = model(hp).apply(variables, x, train=False)
    return {f"{prefix}_loss": optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(),
            f"{prefix}_accuracy": (logits.argmax(-1) == y).mean()}


def evaluate(hp, variables, data):
    return _metrics(hp, variables, data["x_val"], data["y_val"], "val")


def test(hp, variables, data):
    return _metrics(hp, variables, data["x_test"], data["y_test"], "test")
