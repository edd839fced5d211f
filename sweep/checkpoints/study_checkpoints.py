"""A study's checkpoints in one process: the maker of its trials' checkpoint folders, composed
with the session by the run loop, holding what the folders share: the write budget, the disk
budget's room-making, and the remote tier with the fence of its uploads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from sweep.checkpoints import ram as ram_lib
from sweep.checkpoints import remote as remote_lib
from sweep.checkpoints import retention
from sweep.store.session import Session

if TYPE_CHECKING:  # JAX and Orbax load only where a trial's checkpoints are opened
    from sweep.checkpoints.folder import TrialCheckpoints, WriteBudget


class StudyCheckpoints:
    """Build with the opened session; `close()` after the run (it waits for nothing: the run did)."""

    def __init__(self, session: Session, optional_keys: Sequence[str] = ()) -> None:
        self.session = session
        self.optional_keys = tuple(optional_keys)  # keys a checkpoint may lack (sweep/train/state.py)
        self.write_budget: WriteBudget | None = None  # shared by this process's trials of the study
        self._remote: remote_lib.RemoteTier | None = None
        self._opened = False
        self._ram_root: Path | None = None

    @property
    def remote(self) -> remote_lib.RemoteTier | None:
        """The study's remote tier (made on first use), or None without checkpoint.remote."""
        if not self._opened:
            self._remote, self._opened = remote_lib.open_remote(self.session), True
        return self._remote

    def trial(self, number: int, directory: Path, fence: Callable[[], None] | None = None,
              on_commit: Callable[[int], None] | None = None) -> TrialCheckpoints:
        """Trial `number`'s checkpoint folder, sharing the write budget; `fence` is called before
        each write (it raises if this worker no longer holds the trial); `on_commit` with each step
        once it is durable (on the checkpoint writer's thread). With a remote tier, the steps the
        folder lacks are fetched first (a takeover on a new host) and those the tier lacks queued."""
        from sweep.checkpoints.folder import TrialCheckpoints, WriteBudget

        config = self.session.config
        if self.write_budget is None:
            self.write_budget = WriteBudget()
        remote = self.remote
        upload_fence = self.upload_fence(number) if fence is not None else None
        if remote is not None:
            remote.fetch_missing(directory, f"trial {number}")  # a new host resumes from the tier
        ram_dir = self.ram_dir(number)
        if ram_dir is not None:  # a killed process's newer steps in RAM join the workdir's (sweep/checkpoints/ram.py)
            ram_lib.promote(ram_dir, directory, f"trial {number}")

        def room(step: int, needed: int) -> None:
            retention.make_room(self.session, remote, number, step, needed, directory)

        def committed(step: int) -> None:
            if remote is not None:
                remote.upload(directory, step, upload_fence)
            if on_commit is not None:
                on_commit(step)

        ckpt = TrialCheckpoints.of_study(
            config, number, directory, budget=self.write_budget, optional_keys=self.optional_keys, fence=fence,
            room=room if config.study.checkpoint.max_disk is not None else None,
            on_commit=committed if remote is not None or on_commit is not None else None)
        if remote is not None:
            remote.upload_missing(directory, upload_fence)  # what a kill or an outage kept from the tier
        if ram_dir is not None:
            ckpt.ram = TrialCheckpoints(ram_dir, config.study.objective.metric, config.study.objective.direction,
                                        keep_last=1, keep_best=1, label=f"trial {number} (RAM tier)",
                                        budget=WriteBudget(), optional_keys=self.optional_keys, fence=fence)
        return ckpt

    def ram_dir(self, number: int) -> Path | None:
        """Trial `number`'s folder in the RAM tier, or None without checkpoint.ram."""
        if self._ram_root is None:
            found = ram_lib.trial_dir(self.session, number)
            self._ram_root = found.parent if found is not None else None
        return self._ram_root / self.session.config.checkpoint_dir(number).name if self._ram_root else None

    def upload_fence(self, number: int) -> Callable[[], None]:
        """The fence of trial `number`'s uploads: an upload may outlast the trial (its claim is
        released when this process finished it), so a missing holder passes for such a trial;
        another worker's claim never does."""
        session = self.session

        def fence() -> None:
            session.claims.check(session.claims.key(number), f"trial {number}",
                                 released_is_mine=number in session.finished_here)

        return fence

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()  # after its queued uploads (a finished run waited for them)
        self._remote, self._opened = None, False
