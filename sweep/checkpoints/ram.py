"""The RAM tier: frequent saves to a fast local folder (`checkpoint.ram`, /dev/shm by default) in
front of the workdir.

A step in RAM costs a copy to host memory and a write to tmpfs (no disk, no fsync), so it can come
far more often than a disk save of a multi-GB state; it survives a killed process, not a reboot.
Every trial keeps its newest RAM step and its best state not yet on disk (a trial folder of its
own, Orbax's retention: keep_last 1, keep_best 1); the disk cadence goes on as before, and the
disk (and from it the bucket) stays where every finished state lands.

A resume (the same command after a kill) first copies the RAM steps newer than the workdir's
newest into the trial's workdir folder, committed as a save commits (checksum first, then the step
by rename: `integrity.install_step`), and then restores as ever from the workdir: the newest
intact step of either tier wins, verified by its checksum, and everything that reads the workdir
(status, export, the best-state rule of the resume) sees one folder. After a reboot the RAM folder
is gone and the resume reads the workdir's newest step. A trial that completes, prunes or pauses
has its last step on disk, and its RAM folder is removed.

Orbax has no notion of a second, faster folder for the same steps (its emergency checkpointing is
for multi-host JAX jobs, a replicator between hosts' local disks), so this module is sweep's.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.checkpoints import integrity
from sweep.checkpoints.steps import kept_steps
from sweep.study.config import Config

if TYPE_CHECKING:  # the store's session module loads optuna: its callers have it loaded already
    from sweep.store.session import Session

log = logging.getLogger("sweep")


def root_of(config: Config, study_root: str) -> Path | None:
    """The study's folder in the RAM tier (None without checkpoint.ram): per user, then by the
    study's identity (`remote_root`), so that a study made again under the same name never finds
    the old one's steps."""
    ram = config.study.checkpoint.ram
    if ram is None:
        return None
    return Path(ram.path) / f"sweep-{os.getuid()}" / study_root


def trial_dir(session: Session, number: int) -> Path | None:
    """Trial `number`'s folder in the RAM tier of `session`'s study (None without checkpoint.ram)."""
    from sweep.store.session import REMOTE_ROOT_ATTR  # here: the session module is the store's, loaded by callers

    config = session.config
    if config.study.checkpoint.ram is None:
        return None
    root = root_of(config, session.study_attrs().get(REMOTE_ROOT_ATTR, config.name))
    assert root is not None
    return root / config.checkpoint_dir(number).name


def promote(ram_dir: Path, disk_dir: Path, label: str) -> list[int]:
    """Copy the committed RAM steps newer than the workdir folder's newest into it (each checked
    to have its checksum, committed there as a save commits); the steps copied, ascending.

    Only steps newer than the disk's newest are needed: a best state the RAM tier holds at or
    below it was written to disk by the save that made the disk's newest (it was pending then)."""
    on_disk = kept_steps(disk_dir)
    newest = on_disk[-1] if on_disk else -1
    copied = []
    for step in kept_steps(ram_dir):
        digest = integrity.read_checksum(ram_dir, step)
        if step <= newest or digest is None:
            continue
        disk_dir.mkdir(parents=True, exist_ok=True)
        integrity.write_checksum(disk_dir, step, digest)
        integrity.install_step(disk_dir, step, lambda tmp, s=step: shutil.copytree(ram_dir / str(s), tmp), "from-ram")
        copied.append(step)
    if copied:
        log.info("%s: step %s from the RAM tier (%s) copied to %s", label, ", ".join(map(str, copied)), ram_dir,
                 disk_dir)
    return copied


def clear(ram_dir: Path) -> None:
    """Remove a trial's RAM folder with its checksums and quarantine."""
    for path in (ram_dir, integrity.sums_dir(ram_dir), integrity.quarantine_dir(ram_dir)):
        shutil.rmtree(path, ignore_errors=True)
