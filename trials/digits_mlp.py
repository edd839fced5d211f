"""Built-in trial: a Flax MLP on scikit-learn's bundled 8x8 digits (no download)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

HYPERPARAMETERS = {
    "learning_rate": 1e-3,
    "hidden": 64,
    "depth": 1,
    "optimizer": "adam",
    "batch_size": 64,
    "weight_decay": 0.0,
}
METRICS = ("val_loss", "val_accuracy")


class MLP(nn.Module):
    hidden: int
    depth: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(self.depth):
            x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(10)(x)


def model(hp) -> MLP:
    return MLP(hidden=int(hp["hidden"]), depth=int(hp["depth"]))


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, read from its data file: the arrays `load_digits` returns,
    without importing scikit-learn (2-3 s in every process that trains or exports)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations, "scikit-learn is not installed"
    raw = np.loadtxt(os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz"),
                     delimiter=",")
    return raw[:, :-1], raw[:, -1].astype(int)


@functools.cache
def _splits() -> dict[str, np.ndarray]:
    x, y = _load_digits()
    order = np.random.RandomState(0).permutation(len(x))  # fixed split, independent of any seed
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32)
    n_val = n_test = 300
    return {
        "x_train": x[: -n_val - n_test], "y_train": y[: -n_val - n_test],
        "x_val": x[-n_val - n_test: -n_test], "y_val": y[-n_val - n_test: -n_test],
        "x_test": x[-n_test:], "y_test": y[-n_test:],
    }


def data(hp):
    return {k: jnp.asarray(v) for k, v in _splits().items()}


def init(hp, key, data):
    return model(hp).init(key, data["x_train"][:1])["params"]


def optimizer(hp):
    if hp["optimizer"] == "sgd":
        tx = optax.sgd(hp["learning_rate"], momentum=0.9)
    elif hp["optimizer"] == "adam":
        tx = optax.adam(hp["learning_rate"])
    else:
        raise ValueError(f"optimizer must be adam or sgd, got {hp['optimizer']!r}")
    if hp["weight_decay"]:
        tx = optax.chain(optax.add_decayed_weights(hp["weight_decay"]), tx)
    return tx


def batch(hp, data, key):
    idx = jax.random.randint(key, (int(hp["batch_size"]),), 0, data["x_train"].shape[0])
    return data["x_train"][idx], data["y_train"][idx]


def _metrics(hp, params, x, y, prefix):
    logits = model(hp).apply({"params": params}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    accuracy = (logits.argmax(-1) == y).mean()
    return {f"{prefix}_loss": loss, f"{prefix}_accuracy": accuracy}


def loss(hp, params, batch, key):
    x, y = batch
    return _metrics(hp, params, x, y, "train")["train_loss"]


def evaluate(hp, params, data):
    return _metrics(hp, params, data["x_val"], data["y_val"], "val")


def test(hp, params, data):
    return _metrics(hp, params, data["x_test"], data["y_test"], "test")
