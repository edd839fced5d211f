"""The scheduler contract (sweep/schedulers/base.py) from outside sweep/: a toy scheduler of the
test folder, named in the study file by its import path only, pauses, promotes and finishes
trials through the real CLI, and a kill -9 mid-promotion then the same command ends bit for bit
as an uninterrupted run; a scheduler.type that names no scheduler, or the toy's own bad keys,
exit 2 with one line naming the file, the key, the rule and the value."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import Running, cache_env, checkpoint_dir, cli_here, gated_trial, kill9, run_cli, snapshot, study_in, study_of, \
    wait_for_checkpoint
from sweep.__main__ import main

TOY_TYPE = "tests.schedulers.toy_scheduler:PromoteInOrder"
# Three digits trials of 300 steps pausing at 100 and 200: every trial reaches 100, then each
# paused one goes on in number order (0 to 200, 0 to the end, 1 to 200, ...).
TOY: dict[str, Any] = {
    "name": "toy",
    "n_trials": 3,
    "sampler": {"type": "random", "seed": 3},
    "pruner": {"type": "none"},
    "scheduler": {"type": TOY_TYPE, "stops": [100, 200]},
    "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
    "fixed": {"batch_size": 32, "hidden": 32},
    "train": {"steps": 300, "eval_every": 50},
    "checkpoint": {"every_steps": 50, "keep_last": 2, "keep_best": 1, "max_write_share": None},
}
PROMOTED = r"trial (\d+): promoted in number order from step (\d+) to step (\d+)"


def _write(folder: Path, **override: Any) -> Path:
    return study_in(folder, TOY, **override)


def _record(path: Path) -> list[tuple[Any, ...]]:
    """The pause and promotion record of every trial: where it paused, where its last run trained to, where it went on."""
    return [(t.number, t.user_attrs.get("paused_at"), t.user_attrs.get("rung_target"), t.user_attrs.get("promoted_at"))
            for t in sorted(study_of(path).trials, key=lambda t: t.number)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = _write(tmp_path_factory.mktemp("toy"))
    result = run_cli("run", path, cwd=path.parent)
    assert result.returncode == 0, result.stderr
    return path, result.stderr


@pytest.mark.slow
def test_a_scheduler_of_the_test_folder_pauses_promotes_and_finishes_trials(uninterrupted):
    path, stderr = uninterrupted
    trials = sorted(study_of(path).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    assert all(t.user_attrs["paused_at"] == [100, 200] and max(t.intermediate_values) == 300 for t in trials)
    # went on from each stop's checkpoint: promotions, not interruptions, in the record and the log
    assert all(t.user_attrs["promoted_at"] == [100, 200] and "resumed_from" not in t.user_attrs for t in trials)
    assert "trial 0: goes on from its pause at step 100" in stderr and "training again" not in stderr
    assert [(int(n), int(a), int(b)) for n, a, b in re.findall(PROMOTED, stderr)] == [
        (0, 100, 200), (0, 200, 300), (1, 100, 200), (1, 200, 300), (2, 100, 200), (2, 200, 300)]
    # every trial reached its first stop before any went on
    assert stderr.index("trial 2: paused at rung 100") < stderr.index("trial 0: promoted in number order")


@pytest.mark.slow
def test_a_kill9_mid_promotion_then_the_same_command_equals_an_uninterrupted_run(uninterrupted, tmp_path,
                                                                                 held):
    """Killed once trial 0, promoted from its stop at 100, has committed a step past it: it is left
    RUNNING, the next run resumes it and the rest as if nothing happened."""
    reference, _ = uninterrupted
    # Held at the process's 9th evaluation (each trial's 2 to its stop at 100; then trial 0 goes on,
    # evaluating its step 100 again, then 150, then this one, at 200, after its save at 150): killed
    # mid-promotion however fast the machine.
    path = _write(tmp_path, trial=gated_trial(tmp_path, 9, name="gated_toy"))  # plan imports it in-process
    hold = held(tmp_path / "hold")
    proc = Running("run", path, cwd=tmp_path, env=cache_env(reference))
    proc.wait_for(r"trial 0: promoted in number order from step 100")
    wait_for_checkpoint(checkpoint_dir(path, 0), 150, proc=proc)
    kill9(proc)
    hold.unlink()
    states = {t.number: t.state.name for t in study_of(path).trials}
    assert states[0] == "RUNNING", states  # the kill left trial 0 mid-promotion
    plan = cli_here("plan", path, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "paused:  trial 1 at step 100, trial 2 at step 100 (toy scheduler" in plan.stdout
    again = run_cli("run", path, cwd=tmp_path, env=cache_env(reference))
    assert again.returncode == 0, again.stderr
    assert snapshot(path) == snapshot(reference)
    assert _record(path) == _record(reference)
    attrs = study_of(path).trials[0].user_attrs
    # promoted at both stops; resumed once after the kill, from its own step past the first stop
    assert attrs["promoted_at"] == [100, 200] and len(attrs["resumed_from"]) == 1 and attrs["resumed_from"][0] > 100


BAD = [
    ("unknown-name", {"type": "toy"}, "scheduler.type: must be one of 'asha', 'hyperband', 'pbt' or 'freeze_thaw', got 'toy'"),
    ("unimportable", {"type": "tests.schedulers.absent:Toy"},
     "scheduler.type: cannot import module (No module named 'tests.schedulers.absent'); is it on the current "
     "directory or PYTHONPATH?, got 'tests.schedulers.absent:Toy'"),
    ("no-such-class", {"type": "tests.schedulers.toy_scheduler:Absent"},
     "scheduler.type: module tests.schedulers.toy_scheduler has no attribute Absent, "
     "got 'tests.schedulers.toy_scheduler:Absent'"),
    ("no-scheduler", {"type": "collections:OrderedDict"},
     "scheduler.type: collections:OrderedDict is no scheduler (not a subclass of "
     "sweep.schedulers.base.Scheduler; docs/development.md says what a scheduler provides), "
     "got 'collections:OrderedDict'"),
    ("malformed-path", {"type": "tests/toy.py:Toy"},
     "scheduler.type: must be a scheduler name or an import path like package.module:ClassName, "
     "got 'tests/toy.py:Toy'"),
    ("no-stops", {"type": TOY_TYPE}, f"scheduler.stops: is required with type {TOY_TYPE}"),
    ("unknown-key", {"type": TOY_TYPE, "stops": [100], "stop": 2},
     "scheduler.stop: unknown key (did you mean 'stops'?)"),
    ("an-asha-key", {"type": TOY_TYPE, "stops": [100], "min_steps": 100},
     f"scheduler.min_steps: only with type asha, hyperband or freeze_thaw (keys of type {TOY_TYPE}: stops), got 100"),
    ("stop-at-end", {"type": TOY_TYPE, "stops": [100, 300]}, None),  # the last stop is its last step: fine
    ("first-stop-at-end", {"type": TOY_TYPE, "stops": [300]},
     "scheduler.stops: must be < train.steps (300): the first stop comes before a trial's last step, got 300"),
    ("stop-off-evaluation", {"type": TOY_TYPE, "stops": [100, 120]},
     "scheduler.stops: each must be a multiple of train.eval_every (50), got 120"),
]


@pytest.mark.parametrize("section,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_scheduler_type_naming_no_scheduler_exits_2_in_one_line(tmp_path, monkeypatch, capsys, section, message):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, scheduler=section)
    before = sorted(os.listdir(tmp_path))
    if message is None:  # valid: `plan` reads it and creates nothing
        assert main(["plan", str(path)]) == 0, capsys.readouterr().err
        return
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: {message}\n", err
    assert sorted(os.listdir(tmp_path)) == before
