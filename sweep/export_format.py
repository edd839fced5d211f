"""The export format on disk, and reading it back with safetensors and JSON only (no JAX, no Optuna).

DIR/index.json, DIR/trial_NNNN/meta.json, DIR/trial_NNNN/params.safetensors (keys "Dense_0/kernel").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def flatten(params: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """{"Dense_0": {"kernel": a}} -> {"Dense_0/kernel": a}."""
    out: dict[str, np.ndarray] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = np.ascontiguousarray(value)
    return out


def load_export(where: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, meta) of an exported trial folder, or of the best trial of an export folder.

    Needs only safetensors and JSON: no pickle, no JAX.
    """
    from safetensors.numpy import load_file

    path = Path(where)
    if (path / "index.json").is_file():
        index = json.loads((path / "index.json").read_text())
        if not index["trials"]:
            raise ValueError(f"{path}/index.json lists no trial")
        path = path / index["trials"][0]["dir"]
    meta = json.loads((path / "meta.json").read_text())
    params: dict[str, Any] = {}
    for name, array in load_file(path / "params.safetensors").items():
        node = params
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = array
    return params, meta
