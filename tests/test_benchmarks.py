"""The benchmarks' stand-ins keep up with the real interfaces they replace."""

from __future__ import annotations

import importlib.util
import inspect

from conftest import REPO
from sweep.checkpoints.folder import TrialCheckpoints


def test_no_checkpoints_stand_in_has_every_public_method_of_trial_checkpoints():
    spec = importlib.util.spec_from_file_location("checkpoint_overhead", REPO / "benchmarks" / "checkpoint_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    public = {name for name, _ in inspect.getmembers(TrialCheckpoints, inspect.isfunction) if not name.startswith("_")}
    assert public <= set(dir(module.NoCheckpoints)), public - set(dir(module.NoCheckpoints))
    assert hasattr(module.NoCheckpoints, "last_saved")
