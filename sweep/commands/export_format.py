"""The export format on disk, and reading it back with safetensors and JSON only (no JAX, no Optuna).

DIR/index.json, DIR/trial_NNNN/meta.json, DIR/trial_NNNN/params.safetensors (keys "Dense_0/kernel"),
and for trials with model state DIR/trial_NNNN/state.safetensors (keys "batch_stats/BatchNorm_0/mean").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def flatten(params: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """{"Dense_0": {"kernel": a}} -> {"Dense_0/kernel": a}."""
    out: dict[str, np.ndarray] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
        else:
            # np.ascontiguousarray would make a 0-d array (a scalar param) 1-d
            out[name] = np.array(value, order="C", copy=True)
    return out


def _trial_folder(where: str | os.PathLike[str]) -> Path:
    path = Path(where)
    if (path / "index.json").is_file():
        index = json.loads((path / "index.json").read_text())
        if not index["trials"]:
            raise ValueError(f"{path}/index.json lists no trial")
        path = path / index["trials"][0]["dir"]
    return path


def _unflatten(file: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    tree: dict[str, Any] = {}
    for name, array in load_file(file).items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = array
    return tree


def load_export(where: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, meta) of an exported trial folder, or of the best trial of an export folder.

    Needs only safetensors and JSON: no pickle, no JAX.
    """
    path = _trial_folder(where)
    return _unflatten(path / "params.safetensors"), json.loads((path / "meta.json").read_text())


def load_variables(where: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(variables, meta): {"params": ..., "batch_stats": ...}, the form Flax's `apply` takes, with
    the model state exported beside the params (just {"params": ...} for a trial without any)."""
    path = _trial_folder(where)
    params, meta = load_export(path)
    state = _unflatten(path / "state.safetensors") if (path / "state.safetensors").is_file() else {}
    return {"params": params, **state}, meta
