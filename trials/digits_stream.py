"""Built-in streaming trial: the digits MLP reading its data from ArrayRecord files through grain.

The pattern of a dataset that does not fit in memory (README, "Data that does not fit in
memory"): `train_batches(hp, seed)` returns a grain pipeline over records on disk (shuffled
afresh every epoch, randomly augmented, batched); sweep stores its iterator's position in every
checkpoint. `val_batches(hp)` streams the validation split; each batch's metrics are means over
its examples, and sweep combines them weighted by the batch size. The records are written from
scikit-learn's bundled digits on first use (`write_records`, or `python -m trials.digits_stream DIR`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import grain
import jax.numpy as jnp
import numpy as np

from trials import digits_mlp

HYPERPARAMETERS = {**digits_mlp.HYPERPARAMETERS, "data_dir": "data/digits_records", "shift": 1,
                   "eval_batch_size": 128}
METRICS = ("val_loss", "val_accuracy")
SPLITS = ("train", "val", "test")
_X_BYTES = 64 * 4  # a record: 64 float32 pixels, then the label as int32


def write_records(directory: str | os.PathLike[str]) -> Path:
    """The digits splits as `<split>.array_record` files in `directory` (kept if already there).

    Each file is written under a temporary name and renamed: workers that start together may all
    write it, and a reader never sees half a file.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    splits = digits_mlp._splits()
    for split in SPLITS:
        path = folder / f"{split}.array_record"
        if path.exists():
            continue
        tmp = folder / f".{split}.{os.getpid()}.tmp"
        writer = ArrayRecordWriter(str(tmp), "group_size:1")
        for x, y in zip(splits[f"x_{split}"], splits[f"y_{split}"]):
            writer.write(x.astype(np.float32).tobytes() + np.int32(y).tobytes())
        writer.close()
        os.replace(tmp, path)
    return folder


def _records(hp, split: str) -> grain.sources.ArrayRecordDataSource:
    folder = write_records(hp["data_dir"])
    return grain.sources.ArrayRecordDataSource([str(folder / f"{split}.array_record")])


def _source(hp, split: str) -> grain.MapDataset:
    return grain.MapDataset.source(_records(hp, split))


def _parse(records: list[bytes]) -> dict[str, np.ndarray]:
    """A batch of records as arrays: one buffer for the batch, not a Python call per example."""
    raw = np.frombuffer(b"".join(records), np.uint8).reshape(len(records), -1)
    return {"x": raw[:, :_X_BYTES].copy().view(np.float32), "y": raw[:, _X_BYTES:].copy().view(np.int32)[:, 0]}


class Shift(grain.transforms.RandomMap):
    """Augmentation: move each 8x8 image of a batch by up to `pixels` in each direction (cyclically).
    grain seeds `rng` from the pipeline's seed and the batch's position: the same after a resume."""

    def __init__(self, pixels: int) -> None:
        self.pixels = pixels

    def random_map(self, batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        if not self.pixels:
            return batch
        n = batch["x"].shape[0]
        shift = rng.integers(-self.pixels, self.pixels + 1, size=(n, 2))
        rows = (np.arange(8)[None, :] - shift[:, :1]) % 8
        cols = (np.arange(8)[None, :] - shift[:, 1:]) % 8
        images = batch["x"].reshape(n, 8, 8)[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
        return {"x": images.reshape(n, 64), "y": batch["y"]}


def train_batches(hp, seed):
    source = _records(hp, "train")
    size, batch_size = len(source), int(hp["batch_size"])
    per_epoch = size // batch_size  # the last incomplete batch of an epoch is dropped

    def read(index: int) -> dict[str, np.ndarray]:
        # Batch `index` of the endless stream: epoch index // per_epoch, in that epoch's own
        # shuffle. One bulk read per batch: grain's per-element shuffle and batch cost ~0.1 ms
        # per example here (16 ms for 128), more than this model's step.
        epoch, position = divmod(index, per_epoch)
        order = _permutation(seed, epoch, size)[position * batch_size:(position + 1) * batch_size]
        return _parse(source.__getitems__(order.tolist()))

    return (grain.MapDataset.range(_ENDLESS).map(read).seed(seed).random_map(Shift(int(hp["shift"])))
            .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=8)))


_ENDLESS = 2**62  # batches: more than any study trains


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(size)


def val_batches(hp):
    return _source(hp, "val").batch(int(hp["eval_batch_size"]), batch_fn=list).map(_parse)  # the last one is smaller


def data(hp):
    """Only the test split in memory (for `test`, used by the summary and export)."""
    test = _parse(list(_source(hp, "test")))
    return {"x_test": jnp.asarray(test["x"]), "y_test": jnp.asarray(test["y"])}


def init(hp, key, data):
    return digits_mlp.model(hp).init(key, jnp.zeros((1, 64), jnp.float32))["params"]


optimizer = digits_mlp.optimizer


def loss(hp, params, batch, key):
    return digits_mlp._metrics(hp, params, batch["x"], batch["y"], "train")["train_loss"]


def evaluate(hp, params, batch):
    return digits_mlp._metrics(hp, params, batch["x"], batch["y"], "val")


def test(hp, params, data):
    return digits_mlp._metrics(hp, params, data["x_test"], data["y_test"], "test")


if __name__ == "__main__":
    print(write_records(sys.argv[1] if len(sys.argv) > 1 else HYPERPARAMETERS["data_dir"]))
