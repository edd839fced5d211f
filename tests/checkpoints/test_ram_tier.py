"""checkpoint.ram: frequent saves to a RAM folder in front of the workdir (sweep/checkpoints/ram.py),
through the real CLI: a kill -9 resumes from the RAM step newer than the disk's, a reboot (the RAM
folder gone) from the disk's, and a SIGTERM whose disk save would outlast the grace lands in RAM."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Iterator

import optuna
import pytest
import yaml

from conftest import (Running, checkpoint_dir, cli, kill9, make_study, run_cli, saved_steps, snapshot, study_of,
                      wait_for_checkpoint, wait_for_file, write_trial)
from sweep.checkpoints import integrity

pytestmark = pytest.mark.slow  # real CLI processes


@pytest.fixture
def ram_root() -> Iterator[Path]:
    """A folder on /dev/shm (tmpfs, as the RAM tier's default), removed after the test."""
    root = Path(tempfile.mkdtemp(prefix="sweep-test-ram-", dir="/dev/shm"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _study(folder: Path, ram: Path | None, **override: Any) -> Path:
    """Two trials of 40 steps, evaluated every 10 and saved to disk every 20; with `ram`, to the RAM
    tier every 10 as well."""
    write_trial(folder)
    checkpoint: dict[str, Any] = {"every_steps": 20, "keep_last": 2}
    if ram is not None:
        checkpoint["ram"] = {"every_steps": 10, "path": str(ram)}
    study = make_study(folder, n_trials=2, sampler={"type": "random", "seed": 0}, checkpoint=checkpoint, **override)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _reference(tmp_path: Path) -> list[tuple[Any, ...]]:
    """The same study without a RAM tier, never interrupted."""
    folder = tmp_path / "reference"
    folder.mkdir()
    path = _study(folder, None)
    assert run_cli("run", path, cwd=folder).returncode == 0
    return snapshot(path)


def _ram_dirs(ram: Path) -> list[Path]:
    """The trial folders in the RAM tier (under sweep-<uid>/<study identity>/)."""
    return sorted(p for p in ram.glob("sweep-*/*/trial_*") if p.is_dir() and not p.name.endswith((".sums", ".quarantine")))


def _held_at_last_evaluation(path: Path, folder: Path) -> tuple[Running, Path]:
    """Run the study until trial 0 waits in its evaluation at step 40 (its 4th), past its RAM save
    at 30 and its disk save at 20; the run, and trial 0's RAM folder."""
    (folder / "hold").write_text("4")
    proc = Running("run", path, cwd=folder)
    wait_for_file(folder / "held", proc=proc)
    [ram_dir] = _ram_dirs(Path(yaml.safe_load(path.read_text())["checkpoint"]["ram"]["path"]))
    assert ram_dir.name == "trial_0000"
    wait_for_checkpoint(ram_dir, 30, proc=proc)  # written in the background while the trial waits
    wait_for_checkpoint(checkpoint_dir(path, 0), 20, proc=proc)  # so is the disk's step 20 (it lagged the RAM's 30 once)
    return proc, ram_dir


@pytest.mark.parametrize("reboot", [False, True], ids=["kill9", "kill9-then-reboot"])
def test_kill9_resumes_from_the_newest_step_of_either_tier_bit_identical(tmp_path, ram_root, reboot):
    expected = _reference(tmp_path)
    path = _study(tmp_path, ram_root)
    proc, ram_dir = _held_at_last_evaluation(path, tmp_path)
    kill9(proc)
    assert saved_steps(ram_dir)[-1] == 30 and saved_steps(checkpoint_dir(path, 0))[-1] == 20
    (tmp_path / "hold").unlink()
    if reboot:  # /dev/shm does not survive a reboot
        shutil.rmtree(ram_root / ram_dir.relative_to(ram_root).parts[0])
    plan = run_cli("plan", path, cwd=tmp_path)
    assert f"its newest checkpoint, step {20 if reboot else 30}" in plan.stdout, plan.stdout
    again = run_cli("run", path, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    if reboot:
        assert "trial 0: resumed from step 20" in again.stderr and "RAM tier" not in again.stderr
    else:
        assert f"trial 0: step 30 from the RAM tier ({ram_dir}) copied to {checkpoint_dir(path, 0)}" in again.stderr
        assert "trial 0: resumed from step 30" in again.stderr, again.stderr
    assert snapshot(path) == expected
    assert study_of(path).trials[0].user_attrs["resumed_from"] == [20 if reboot else 30]
    assert _ram_dirs(ram_root) == []  # finished trials keep nothing in RAM
    ledger = study_of(path).trials[1].user_attrs["ledger"]
    assert ledger["ram_saves"] == 2 and ledger["saves"] == 2  # RAM at 10 and 30; disk at 20 and 40


def _slow_disk_saves(path: Path, seconds: float) -> None:
    """Record in trial 0's ledger (its earlier runs' account, which a run predicts its save cost
    from) one disk save that took `seconds` on the writer, as a multi-GB state's on a slow disk would."""
    data = yaml.safe_load(path.read_text())
    study = optuna.load_study(study_name=data["name"], storage=f"sqlite:///{data['workdir']}/study.db")
    trial = study.trials[0]
    ledger = {**trial.user_attrs.get("ledger", {}), "saves": 1.0, "checkpoint_background": seconds,
              "checkpoint_blocking": 0.0, "ram_blocking": 0.0}
    study._storage.set_trial_user_attr(trial._trial_id, "ledger", ledger)


def test_sigterm_whose_disk_save_outlasts_the_grace_saves_to_the_ram_tier(tmp_path, ram_root):
    expected = _reference(tmp_path)
    path = _study(tmp_path, ram_root)
    (tmp_path / "hold").write_text("3")  # trial 0 waits in its evaluation at step 30, past its disk save at 20
    proc = Running("run", path, cwd=tmp_path)
    wait_for_file(tmp_path / "held", proc=proc)
    wait_for_checkpoint(checkpoint_dir(path, 0), 20, proc=proc)
    kill9(proc)
    _slow_disk_saves(path, 120.0)  # past the grace period of 30 s (the default)
    (tmp_path / "held").unlink()
    (tmp_path / "hold").write_text("2")  # the resumed run evaluates step 20 again, then waits at 30
    proc = Running("run", path, cwd=tmp_path)
    wait_for_file(tmp_path / "held", proc=proc)
    proc.signal(signal.SIGTERM)
    (tmp_path / "hold").unlink()
    assert proc.finish(timeout=60) == 128 + signal.SIGTERM
    assert "Traceback" not in proc.stderr
    assert ("trial 0: a checkpoint save of its state takes 120 s (predicted from earlier saves), longer than the "
            "grace period of 30 s") in proc.stderr, proc.stderr
    [ram_dir] = _ram_dirs(ram_root)
    assert (f"trial 0: stopped at step 30; checkpoint saved to the RAM tier ({ram_dir}: a disk save takes 120 s"
            in proc.stderr), proc.stderr
    assert saved_steps(ram_dir)[-1] == 30 and saved_steps(checkpoint_dir(path, 0))[-1] == 20
    assert integrity.read_checksum(ram_dir, 30) is not None
    again = run_cli("run", path, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "trial 0: resumed from step 30" in again.stderr, again.stderr
    assert snapshot(path) == expected


def test_ram_tier_refusals_name_the_key_and_write_nothing(tmp_path, capsys):
    write_trial(tmp_path)
    cases = [({"ram": {"path": str(tmp_path / "missing"), "every_steps": 10}}, "checkpoint.ram.path",
              "must be an existing folder"),
             ({"ram": {"path": str(tmp_path)}}, "checkpoint.ram", "needs every_steps or every_seconds"),
             ({"ram": {"every_steps": 0}}, "checkpoint.ram.every_steps", "must be >= 1, got 0")]
    for checkpoint, key, rule in cases:
        study = make_study(tmp_path, checkpoint={"every_steps": 20, **checkpoint})
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump(study))
        code, out, err = cli(capsys, "run", path)
        assert code == 2 and key in err and rule in err and "Traceback" not in err, err
        assert not (tmp_path / "runs").exists()
    study = make_study(tmp_path, n_trials=4, checkpoint={"every_steps": 20, "ram": {"every_steps": 10}},
                       scheduler={"type": "pbt", "population": 2, "interval_steps": 10, "quantile": 0.5})
    path.write_text(yaml.safe_dump(study))
    code, out, err = cli(capsys, "run", path)
    assert code == 2 and "scheduler.type" in err and "checkpoint.ram" in err, err
    assert not (tmp_path / "runs").exists()
