"""YAHPO Gym's LCBench surrogate: learning curves of a funnel MLP on 34 OpenML tasks, 52 epochs.

    .venv/bin/python benchmarks/lcbench.py     # 200 random configs on 3 tasks: final val_cross_entropy, timing

This evaluates `benchmarks/data/lcbench/model.onnx` (YAHPO Gym's surrogate, Apache-2.0, see the
README.md there) with onnxruntime only (the `bench` extra). It does not use the yahpo-gym package,
which pins numpy<2. The inputs are built as yahpo-gym 1.0.2 builds them, in
`yahpo_gym/benchmark_set.py`, `BenchmarkSet._config_to_xs` (and `objective_function`, which stacks
the rows and makes one `session.run`), with the names from `yahpo_gym/benchmarks/lcbench.py`
(`_lcbench_dict`):

- `x_cat`: int32, shape (n, 1): the task id's code from `encoding.json` (`_integer_encode`;
  e.g. "3945" -> 34).
- `x_cont`: float32, shape (n, 8): the raw values, in `cont_names` order: epoch, batch_size,
  learning_rate, momentum, weight_decay, num_layers, max_units, max_dropout. These are the values
  of `param_set.R`'s `domain`, not its log-scale `search_space` (its `trafo` is not applied).
  No scaling happens in Python. The model does its own input scaling and the inverse transform of
  its outputs inside the graph (yahpo_train's `AbstractSurrogate`: `embds_dbl`, `inv_trafo_ys`,
  exported by `export_onnx`).
- `output`: float32, shape (n, 6), in `y_names` order: time, val_accuracy, val_cross_entropy,
  val_balanced_accuracy, test_cross_entropy, test_balanced_accuracy. This is NOT the order of
  `param_set.R`'s `codomain`, which lists time last. The model's values show it: column 0 grows
  with the epoch, column 1 is a percentage.

`time` is the cumulative training time in seconds up to the end of the epoch. It grows with the
epoch, but the surrogate's value falls a little in some steps from one epoch to the next (0.4%
of them over 300 random configurations of each task, 7% on the worst task).
`Surrogate.times` gives per-epoch seconds: the differences of the curve's running maximum, each at
least `MIN_EPOCH_SECONDS`. The first epoch's time is often longer than the later ones' (the
median over random configurations is 0.6 to 7 times the mean epoch's, by task). val_accuracy is
in percent (0-100); the balanced accuracies are in [0, 1].

Checked against yahpo-gym 1.0.2 itself (`BenchmarkSet("lcbench", instance=task).objective_function`,
onnxruntime 1.32.0, numpy 1.26, in a separate venv) on 20 random configurations (10 from its own
ConfigSpace sampler, 10 from `sample`) of tasks 3945, 168910 and 189909 at all 52 epochs: the
same values, bit for bit, for all 6 outputs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "lcbench"
MODEL = DATA / "model.onnx"
EPOCHS = 52
# The model's output columns (yahpo_gym/benchmarks/lcbench.py, y_names), not param_set.R's codomain order.
OUTPUTS = ("time", "val_accuracy", "val_cross_entropy", "val_balanced_accuracy",
           "test_cross_entropy", "test_balanced_accuracy")
# The model's x_cont columns after epoch (yahpo_gym/benchmarks/lcbench.py, cont_names).
PARAMS = ("batch_size", "learning_rate", "momentum", "weight_decay", "num_layers", "max_units", "max_dropout")
MIN_EPOCH_SECONDS = 0.01  # the floor of Surrogate.times

# The 7 hyperparameters as a study file's search_space (param_set.R's domain, config_space.json's log flags).
SPACE: dict[str, dict[str, Any]] = {
    "batch_size": {"type": "int", "low": 16, "high": 512, "log": True},
    "learning_rate": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
    "momentum": {"type": "float", "low": 0.1, "high": 0.99, "log": False},
    "weight_decay": {"type": "float", "low": 1e-5, "high": 0.1, "log": False},
    "num_layers": {"type": "int", "low": 1, "high": 5, "log": False},
    "max_units": {"type": "int", "low": 64, "high": 1024, "log": True},
    "max_dropout": {"type": "float", "low": 0.0, "high": 1.0, "log": False},
}

_ENCODING: dict[str, int] = json.loads((DATA / "encoding.json").read_text())["OpenML_task_id"]
# The 34 task ids in config_space.json's order. encoding.json also codes "167083", which the
# space leaves out, and "#na#".
TASKS: list[str] = next(hp["choices"] for hp in json.loads((DATA / "config_space.json").read_text())["hyperparameters"]
                        if hp["name"] == "OpenML_task_id")
assert len(TASKS) == 34 and all(t in _ENCODING for t in TASKS)

_SESSION: tuple[int, Any] | None = None  # (pid, onnxruntime.InferenceSession)


def session():
    """This process's onnxruntime session, made on first use. After a fork, the child makes its own."""
    global _SESSION
    if _SESSION is None or _SESSION[0] != os.getpid():
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        _SESSION = (os.getpid(), ort.InferenceSession(str(MODEL), sess_options=options,
                                                      providers=["CPUExecutionProvider"]))
    return _SESSION[1]


def sample(n: int, rng: np.random.Generator | int | None = None) -> list[dict[str, Any]]:
    """n configurations drawn uniformly from SPACE (log-uniform where log; ints rounded)."""
    rng = np.random.default_rng(rng)
    columns = {}
    for name, p in SPACE.items():
        low, high = p["low"], p["high"]
        if p["type"] == "int" and not p["log"]:
            columns[name] = [int(v) for v in rng.integers(low, high + 1, n)]
            continue
        u = np.exp(rng.uniform(np.log(low), np.log(high), n)) if p["log"] else rng.uniform(low, high, n)
        columns[name] = ([int(v) for v in np.clip(np.round(u), low, high)] if p["type"] == "int"
                         else [float(v) for v in u])
    return [{name: columns[name][i] for name in SPACE} for i in range(n)]


def _params(configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """(n, 7) float64 in PARAMS order, checked against SPACE. Other keys of a config are ignored."""
    x = np.empty((len(configs), len(PARAMS)))
    for i, config in enumerate(configs):
        for j, name in enumerate(PARAMS):
            if name not in config:
                raise KeyError(f"config {i}: missing {name!r} (needs {', '.join(PARAMS)})")
            x[i, j] = config[name]
    for j, name in enumerate(PARAMS):
        p, col = SPACE[name], x[:, j]
        bad = ~((col >= p["low"]) & (col <= p["high"]))  # NaN too
        if p["type"] == "int":
            bad |= col != np.round(col)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"config {i}: {name}={configs[i][name]!r} is not in {p}")
    return x


class Surrogate:
    """The LCBench surrogate on one task: the 52-epoch curves of a batch of configurations."""

    def __init__(self, task: str):
        task = str(task)
        if task not in TASKS:
            raise ValueError(f"task: must be one of the 34 LCBench tasks ({', '.join(TASKS)}), got {task!r}")
        self.task = task
        self.code = _ENCODING[task]

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """All outputs: float32 (n, 52, 6), epochs 1..52, columns as OUTPUTS. One session.run for all."""
        x = _params(configs)
        n = len(x)
        if n == 0:
            return np.empty((0, EPOCHS, len(OUTPUTS)), np.float32)
        x_cont = np.empty((n, EPOCHS, 1 + len(PARAMS)), np.float32)  # row i*52 + (epoch-1)
        x_cont[:, :, 0] = np.arange(1, EPOCHS + 1)
        x_cont[:, :, 1:] = x[:, None, :]  # float64 -> float32, as yahpo's astype(np.float32)
        x_cat = np.full((n * EPOCHS, 1), self.code, np.int32)
        y = session().run(["output"], {"x_cat": x_cat, "x_cont": x_cont.reshape(n * EPOCHS, -1)})[0]
        return y.reshape(n, EPOCHS, len(OUTPUTS))

    def curves(self, configs: Sequence[Mapping[str, Any]], metric: str = "val_cross_entropy") -> np.ndarray:
        """float32 (n, 52): `metric` (one of OUTPUTS) at epochs 1..52. "time" is cumulative seconds."""
        if metric not in OUTPUTS:
            raise ValueError(f"metric: must be one of {', '.join(OUTPUTS)}, got {metric!r}")
        return self.predict(configs)[:, :, OUTPUTS.index(metric)]

    def times(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """float64 (n, 52): seconds each epoch takes. These are the differences of the running
        maximum of the cumulative `time` curve, each at least MIN_EPOCH_SECONDS."""
        cumulative = np.maximum.accumulate(self.curves(configs, "time").astype(np.float64), axis=1)
        per_epoch = np.diff(cumulative, axis=1, prepend=0.0)
        return np.maximum(per_epoch, MIN_EPOCH_SECONDS)


def main() -> None:
    configs = sample(200, rng=0)
    start = time.perf_counter()
    session()
    print(f"session: {time.perf_counter() - start:.3f} s (onnxruntime, 1 thread)")
    for task in ("3945", "34539", "189909"):
        surrogate = Surrogate(task)
        start = time.perf_counter()
        final = surrogate.curves(configs)[:, -1]
        elapsed = time.perf_counter() - start
        epoch_s = surrogate.times(configs)
        print(f"task {task}: final val_cross_entropy over {len(configs)} random configs: best {final.min():.4f}, "
              f"median {statistics.median(final.tolist()):.4f}, worst {final.max():.4f}; "
              f"{len(configs)} x {EPOCHS} epochs evaluated in {elapsed * 1000:.1f} ms; "
              f"median training time {np.median(epoch_s.sum(axis=1)):.1f} s")


if __name__ == "__main__":
    main()
