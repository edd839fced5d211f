"""The study-wide disk budget: `checkpoint.keep_trials` and `checkpoint.max_disk`.

Per-trial retention (Orbax's, in checkpoints.py) bounds each trial; this bounds the study. Orbax
has no notion of a study, so removing other trials' folders is written here. Removal is
crash-safe and never pulls a step from under a reader:

- the intent is recorded first (a study user attribute `checkpoints_removed:<number>`), then the
  folder is renamed to a dot-name (atomic; no reader or resume lists it any more), then deleted;
  a kill at any point leaves either the whole folder or a dot-folder that the next pass deletes;
- readers (export, `load_best`, `continue`) hold a shared `flock` on the trial's folder while they
  read it; removal takes the exclusive lock without waiting and skips a folder being read (the
  next pass takes it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import compact, integrity
from sweep.errors import CheckpointsRemoved, DiskFault
from sweep.store.record import BEST_STEP, checkpoint_folder
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.study.constraints import feasible
from sweep.words import size as size_text

if TYPE_CHECKING:
    from sweep.checkpoints.remote import RemoteTier

log = logging.getLogger("sweep")
REMOVED_ATTR = "checkpoints_removed:"  # + trial number: why its checkpoints were removed (study attr)
_DOOMED = ".removing"  # suffix of a folder renamed for deletion
# A trial's first step beyond its state's bytes, as allocated on disk (4 KB blocks): Orbax's ~30 small
# files and folders, or a small state's one file (compact.py); later steps are estimated by the newest one.
FIRST_STEP_OVERHEAD_BYTES, COMPACT_OVERHEAD_BYTES = 128 << 10, 16 << 10


@contextlib.contextmanager
def reading(folder: Path, number: int, removed: str | None = None) -> Iterator[None]:
    """Hold trial `number`'s checkpoint folder against removal while reading it.

    Raises:
        CheckpointsRemoved: the folder was removed (`removed` says why, if known).
    """
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise CheckpointsRemoved(removed_message(number, folder, removed)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(folder))
        except FileNotFoundError:
            same = False
        if not same:  # renamed for removal between our open and our lock
            raise CheckpointsRemoved(removed_message(number, folder, removed))
        yield
    finally:
        os.close(fd)


def removed_message(number: int, folder: Path, removed: str | None) -> str:
    why = f"removed by the study's disk budget ({removed})" if removed else "not found"
    return (f"trial {number}: its checkpoints at {folder} were {why}; its record, curve and metrics stay "
            "(`status`), its weights are gone")


def folder_bytes(folder: Path) -> int:
    """Disk space taken under `folder`, as `du` counts it (allocated blocks of files and folders;
    0 if it does not exist): what fills a disk, not the files' lengths. The folder itself counts
    too: its removal frees it."""
    try:
        total = os.lstat(folder).st_blocks * 512
    except OSError:
        return 0
    for root, dirs, names in os.walk(folder):
        for name in (*dirs, *names):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def study_bytes(session: Session) -> int:
    """The study's checkpoint bytes: every trial folder with its checksums and quarantine."""
    root = session.config.workdir / "checkpoints"
    return folder_bytes(root)


def removed(session: Session) -> dict[int, str]:
    """number -> why its checkpoints were removed, for every trial whose were."""
    attrs = session.study_attrs()
    return {int(k[len(REMOVED_ATTR):]): v for k, v in attrs.items() if k.startswith(REMOVED_ATTR) and v}


def _remove_tree(path: Path) -> int:
    """Rename `path` to a dot-name in its folder, then delete it; its bytes, 0 if it was gone.

    The caller holds whatever lock guards `path`."""
    doomed = path.with_name(f".{path.name}{_DOOMED}")
    try:
        size = folder_bytes(path)
        os.rename(path, doomed)
    except FileNotFoundError:
        return 0
    shutil.rmtree(doomed, ignore_errors=True)
    return size


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[bool]:
    """The exclusive lock on `folder` if no reader holds it (True), without waiting (else False)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            # NFS emulates flock with POSIX locks, whose exclusive lock needs a writable file (EBADF
            # on a folder); ENOLCK where no lock manager runs. Removal goes on unlocked there.
            log.debug("no lock on %s (%s): removing without it", folder, exc)
        yield True
    finally:
        os.close(fd)


def remove_trial(session: Session, remote: RemoteTier | None, t: FrozenTrial, folder: Path, why: str) -> int:
    """Remove trial `t`'s checkpoints (the reason recorded first, under the folder's exclusive lock);
    bytes freed, 0 if a reader holds the folder (a later pass takes it)."""
    freed = 0
    if folder.exists():
        with _exclusive(folder) as mine:
            if not mine:
                log.info("trial %d: its checkpoints are being read; removed on a later pass", t.number)
                return 0
            session.set_study_attr(f"{REMOVED_ATTR}{t.number}", why)
            freed = _remove_tree(folder)
    elif remote is not None:
        # No folder here (another host trained it): the bucket's copy is the study's, and it goes
        # now, so the removal is recorded first too; the other host's local copy goes at its next
        # pass (at the latest as its run ends). Unrecorded, an export would look for the steps
        # (found by the chaos campaign: "its best step is neither in ... nor in s3://...").
        session.set_study_attr(f"{REMOVED_ATTR}{t.number}", why)
    for sibling in (integrity.sums_dir(folder), integrity.quarantine_dir(folder)):  # also after a kill
        freed += _remove_tree(sibling)
    if remote is not None:  # the tier follows the local folder (marks first)
        with contextlib.suppress(Exception):
            remote.prune(folder, everything=True)
    if freed:
        log.info("trial %d: checkpoints removed (%s), %s freed", t.number, why, size_text(freed))
    return freed


def remove_steps(remote: RemoteTier | None, t: FrozenTrial, folder: Path, keep: set[int]) -> int:
    """Remove the committed steps of finished trial `t` other than `keep`; bytes freed."""
    freed = 0
    with _exclusive(folder) as mine:
        if not mine:
            return 0
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.isdigit() and int(entry.name) not in keep:
                freed += _remove_tree(Path(entry.path))
                sums = integrity.checksum_file(folder, int(entry.name))
                with contextlib.suppress(FileNotFoundError):
                    freed += sums.stat().st_size
                    sums.unlink()
    if freed and remote is not None:
        with contextlib.suppress(Exception):
            remote.prune(folder)
    if freed:
        log.info("trial %d: steps other than %s removed (checkpoint.max_disk), %s freed", t.number,
                 sorted(keep), size_text(freed))
    return freed


def _leftovers(root: Path) -> None:
    """Delete what a kill left of a removal, a download from the bucket, a copy for `continue` or a
    PBT exploit (sweep/schedulers/pbt.py):
    dot-folders in the study's checkpoint root and in its trial folders."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.endswith(_DOOMED):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.is_dir() and not entry.name.startswith("."):
            with contextlib.suppress(OSError):
                for inner in os.scandir(entry.path):
                    if inner.name.endswith((_DOOMED, ".downloading", ".copying", ".pbt", ".pbt-old")):
                        shutil.rmtree(inner.path, ignore_errors=True)


def _ranked(session: Session, finished: list[FrozenTrial]) -> list[FrozenTrial]:
    """The COMPLETE trials, best first (ties: lower number first); with constraints, the feasible
    ones before the infeasible ones (which are never best)."""
    sign = session.config.study.objective.sign
    # values[0]: the (first) objective's value, also of a multi-objective trial (Trial.value raises)
    complete = [t for t in finished if t.state == TrialState.COMPLETE and t.values]
    return sorted(complete, key=lambda t: (feasible(t) is False, sign * t.values[0], t.number))


@dataclasses.dataclass(frozen=True)
class Removal:
    """What the disk budget removes of one finished trial: its whole folder ("trial", by
    keep_trials) or its committed steps other than the best ("steps", by max_disk)."""
    number: int
    kind: str  # "trial" | "steps"
    steps: list[int]  # the committed steps removed
    bytes: int  # as `du` counts them, checksums and quarantine included
    why: str


class _Budget:
    """The study's finished trials as the budget sees them: ranked, with their folders."""

    def __init__(self, session: Session) -> None:
        self.config = session.config.study.checkpoint
        self.finished = session.trials((TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        self.ranked = _ranked(session, self.finished)
        self.folders = {t.number: checkpoint_folder(session.config, t) for t in self.finished}
        self.gone = removed(session)

    def outside_keep(self) -> tuple[list[tuple[FrozenTrial, Path, str]], list[int]]:
        """(trial, folder, why) of the finished trials outside the `keep_trials` best, and the
        numbers whose recorded removal is void: a kill cut it short before the rename and the
        trial is back in the top K (keep_trials raised), its checkpoints whole."""
        k = self.config.keep_trials
        if k is None:
            return [], []
        kept = {t.number for t in self.ranked[:k]}
        out, void = [], []
        for t in self.finished:
            folder = self.folders[t.number]
            if folder is None:
                continue
            if t.number in kept and t.number in self.gone and folder.exists():
                void.append(t.number)
            elif t.number not in kept and (folder.exists() or t.number not in self.gone
                                           or integrity.sums_dir(folder).exists()):
                best = f"among the {k} best COMPLETE trials" if k > 1 else "the best COMPLETE trial"
                why = (f"keep_trials {k}: not {best}" if t.state == TrialState.COMPLETE
                       else f"keep_trials {k}: {t.state.name}")
                out.append((t, folder, why))
        return out, void

    def strippable(self, skip: set[int]) -> list[tuple[FrozenTrial, Path, int]]:
        """(trial, folder, best step) in the order max_disk strips them: trials without a value
        (PRUNED, FAIL) first, then COMPLETE ones from the worst; `skip`: removed whole."""
        worst_first = [t for t in self.finished if t not in self.ranked] + list(reversed(self.ranked))
        out = []
        for t in worst_first:
            folder, best = self.folders[t.number], t.user_attrs.get(BEST_STEP)
            if t.number not in skip and folder is not None and folder.exists() and best is not None:
                out.append((t, folder, int(best)))
        return out


def _trial_bytes(folder: Path) -> int:
    return sum(folder_bytes(f) for f in (folder, integrity.sums_dir(folder), integrity.quarantine_dir(folder)))


def _steps_of(folder: Path, keep: set[int]) -> tuple[list[int], int]:
    """The committed steps of `folder` other than `keep`, and their bytes with their checksums."""
    from sweep.checkpoints.steps import kept_steps

    steps = [s for s in kept_steps(folder) if s not in keep]
    total = 0
    for step in steps:
        total += folder_bytes(folder / str(step))
        with contextlib.suppress(OSError):
            total += integrity.checksum_file(folder, step).stat().st_size
    return steps, total


def planned(session: Session) -> list[Removal]:
    """What `enforce` would remove now, at the start of a run (`plan` shows it). Removes nothing.

    A removal the run makes later (a trial that finishes pushes another out of the budget) is
    not listed: it depends on results not there yet."""
    from sweep.checkpoints.steps import kept_steps

    c = session.config.study.checkpoint
    if c.keep_trials is None and c.max_disk is None:
        return []
    budget = _Budget(session)
    out = []
    for t, folder, why in budget.outside_keep()[0]:
        steps = kept_steps(folder) if folder.exists() else []
        size = _trial_bytes(folder)
        if steps or size:
            out.append(Removal(t.number, "trial", steps, size, why))
    if c.max_disk is None:
        return out
    whole = {r.number for r in out}
    used = study_bytes(session) - sum(r.bytes for r in out)
    for t, folder, best in budget.strippable(whole):
        if used <= c.max_disk:
            break
        steps, size = _steps_of(folder, {best})
        if steps:
            out.append(Removal(t.number, "steps", steps, size,
                               f"max_disk {size_text(c.max_disk)}: all but its best step {best}"))
            used -= size
    return out


def enforce(session: Session, remote: RemoteTier | None, needed: int = 0, leftovers: bool = False) -> int:
    """Apply keep_trials, then (if `max_disk` is set) make the study's checkpoints fit with
    `needed` more bytes; returns the study's checkpoint bytes after that (0 without max_disk).
    `leftovers`: first delete what removals cut short by a kill left behind.

    Order (README, "A disk budget for the study"): finished trials outside the `keep_trials` best
    lose their folders; then, over `max_disk`, finished trials from the worst lose their steps other
    than their best. Running and interrupted trials keep everything. `planned` lists the same.
    """
    config = session.config
    c = config.study.checkpoint
    if leftovers:  # at the start of a run (a scan of every trial folder)
        _leftovers(config.workdir / "checkpoints")
    if c.keep_trials is None and c.max_disk is None:
        return 0
    budget = _Budget(session)
    outside, void = budget.outside_keep()
    for number in void:
        session.set_study_attr(f"{REMOVED_ATTR}{number}", None)
    for t, folder, why in outside:
        remove_trial(session, remote, t, folder, why)
    if remote is not None and c.keep_trials is not None:
        _reconcile_tier(session.config, remote, budget)
    if c.max_disk is None:
        return 0
    used = study_bytes(session)
    for t, folder, best in budget.strippable(set()):
        if used + needed <= c.max_disk:
            break
        used -= remove_steps(remote, t, folder, {best})
    return used


def _reconcile_tier(config: Config, remote: RemoteTier, budget: _Budget) -> None:
    """The bucket keeps no more than keep_trials either: a finished trial outside the best K whose
    local folder is gone but whose steps are still in the bucket (its prune cut short by an outage,
    or an upload of another host that landed after it: found by the chaos campaign) is pruned
    again. One listing of the bucket's commit markers per pass."""
    kept = {t.number for t in budget.ranked[:budget.config.keep_trials]}
    try:
        in_bucket = remote.all_steps()
    except Exception:  # noqa: BLE001 - the bucket is away: the next pass tries again
        return
    for t in budget.finished:
        folder = config.checkpoint_dir(t.number)
        if t.number not in kept and in_bucket.get(folder.name) and not folder.exists():
            with contextlib.suppress(Exception):
                remote.prune(folder, everything=True)


def make_room(session: Session, remote: RemoteTier | None, number: int, step: int, needed: int, folder: Path) -> None:
    """Before trial `number` writes step `step` (~`needed` bytes): evict what the budget's order
    allows; raise DiskFault (exit 1, the trial resumable) if the study would still exceed max_disk."""
    from sweep.checkpoints.steps import newest_step

    cap = session.config.study.checkpoint.max_disk
    if cap is None:
        return
    newest = newest_step(folder)
    needed = folder_bytes(folder / str(newest)) if newest is not None else needed + (
        COMPACT_OVERHEAD_BYTES if needed <= compact.SMALL_STATE_BYTES else FIRST_STEP_OVERHEAD_BYTES)
    try:
        used = enforce(session, remote, needed)
    except Exception as exc:  # noqa: BLE001 - removing other trials' steps failed: not this trial's fault
        raise DiskFault(f"trial {number}: cannot make room under checkpoint.max_disk for its checkpoint of step "
                        f"{step} in {folder} ({type(exc).__name__}: {exc}); its committed steps are intact and it "
                        "stays resumable: run the same command") from None
    if used + needed > cap:
        raise DiskFault(
            f"trial {number}: cannot write its checkpoint of step {step} to {folder}: checkpoint.max_disk "
            f"{size_text(cap)} would be exceeded (the study's checkpoints take {size_text(used)}, the step needs "
            f"~{size_text(needed)}) and nothing more can be removed (running trials and the best step of every "
            "finished trial are kept); its committed steps are intact and it stays resumable: raise "
            "max_disk, or lower keep_trials or keep_last, and run the same command")
