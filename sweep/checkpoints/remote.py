"""The remote tier behind the local checkpoint folders, written once against the tier protocol
(sweep/checkpoints/tiers.py; the S3 bucket is one tier, sweep/checkpoints/s3.py):

- every step is committed locally first (training never waits for the network), then committed
  to the tier by a background thread, retried with backoff; a step counts as remote only once the
  tier committed it whole (its mark last);
- the tier follows the local folder's retention (a step Orbax removed there is removed there too);
- a resume or takeover fetches the committed steps its local folder lacks (a new host with an
  empty disk resumes from the tier), and queues the local steps the tier lacks.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from sweep.checkpoints.steps import kept_steps
from sweep.checkpoints.tiers import CheckpointTier, open_tier
from sweep.store.session import REMOTE_ROOT_ATTR, Session
from sweep.words import numbered

log = logging.getLogger("sweep")
UPLOAD_ATTEMPTS = 5  # per step, with backoff: a tier away for a while is retried, then left for the next run


def open_remote(session: Session) -> RemoteTier | None:
    """The study's remote tier, or None without checkpoint.remote.

    Its folder in the tier is named by the study's identity (`remote_root`), not by its name
    alone: a study deleted and created again under the same name must not find the old one's
    checkpoints (a fresh trial 0 would resume from them).

    Raises:
        ConfigError: the tier's class named in the study file does not import or is no tier.
    """
    if session.config.study.checkpoint.remote is None:
        return None
    root = session.study_attrs().get(REMOTE_ROOT_ATTR, session.config.name)
    tier = open_tier(session.config, root)
    return RemoteTier(tier) if tier is not None else None


def remote_steps(session: Session, numbers: Iterable[int]) -> dict[int, list[int]] | None:
    """Trial number (of `numbers`) -> its committed steps in the tier, ascending, from one listing;
    None without checkpoint.remote or where the tier cannot be read (readers then show what is local)."""
    remote = open_remote(session)
    if remote is None:
        return None
    try:
        found = remote.all_steps()
    except Exception:  # noqa: BLE001 - the network, the endpoint, credentials
        return None
    return {n: found[name] for n in numbers if (name := session.config.checkpoint_dir(n).name) in found}


class RemoteTier:
    """One study's checkpoints in a tier: commits in a background thread, fetches on demand."""

    def __init__(self, tier: CheckpointTier) -> None:
        self.tier = tier
        self.url = tier.url
        self._queue: queue.Queue[tuple[Path, int, Callable[[], None] | None] | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self.uploaded_seconds = 0.0  # the uploader's time (benchmarks/remote.py)

    # --- what is there -------------------------------------------------------------------------

    def steps(self, trial: str) -> list[int]:
        """The committed steps of `trial` in the tier, ascending."""
        return self.tier.list(trial).get(trial, [])

    def all_steps(self) -> dict[str, list[int]]:
        """trial folder name -> its committed steps, ascending, for every trial of the study (one listing)."""
        return self.tier.list()

    # --- upload --------------------------------------------------------------------------------

    def upload(self, folder: Path, step: int, fence: Callable[[], None] | None = None) -> None:
        """Queue the upload of committed step `step` of `folder`; returns at once."""
        with self._idle:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="sweep-upload", daemon=True)
                self._thread.start()
        self._queue.put((folder, step, fence))

    def _work(self) -> None:
        # Uploads must not take the cores from training (the upload client hashes and copies every
        # byte): this thread, and the transfer threads boto3 starts from it, run at a lower priority
        # (Linux: a thread's nice value; inherited by the threads it creates).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                folder, step, fence = item
                start = time.monotonic()
                self._upload_retrying(folder, step, fence)
                self.uploaded_seconds += time.monotonic() - start
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _upload_retrying(self, folder: Path, step: int, fence: Callable[[], None] | None) -> None:
        from sweep.errors import TakenOver

        if not (folder / str(step)).exists():
            return  # retention removed it locally before its turn: uploads never lag behind by more than a queue
        for attempt in range(UPLOAD_ATTEMPTS):
            try:
                self.tier.commit(folder, step, fence)
                if fence is not None:
                    fence()  # a worker that lost its trial removes nothing of the new owner's
                self.prune(folder)
                return
            except TakenOver:
                return  # the trial is another worker's now: it uploads its own steps
            except Exception as exc:  # the network, the endpoint, credentials: never the trial's fault
                if not (folder / str(step)).exists():
                    return  # retention removed it locally meanwhile
                if attempt + 1 == UPLOAD_ATTEMPTS:
                    log.warning("%s: step %d was not uploaded to %s (%s: %s); it stays local and is uploaded "
                                "when the trial runs here again", folder.name, step, self.url, type(exc).__name__, exc)
                    return
                time.sleep(min(30.0, 0.5 * 2 ** attempt))

    def prune(self, folder: Path, everything: bool = False) -> None:
        """Remove from the tier the steps of `folder`'s trial that its local folder no longer
        keeps (mark first: from then on no reader takes the step), and leftovers of commits a
        kill cut short. Steps the local folder keeps are left, committed or not, and so are steps
        newer than its newest (another host's, which this folder never saw). `everything`: the
        trial's checkpoints were removed (checkpoint.keep_trials): all of them go."""
        kept = set(kept_steps(folder))
        newest = max(kept, default=-1)
        for step in self.tier.list(folder.name, partial=True).get(folder.name, []):
            if everything or (step not in kept and step < newest):
                self.tier.remove(folder.name, step)

    def close(self) -> None:
        """Stop the uploader thread once the uploads queued so far are done."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every queued upload is done (True) or `timeout` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    # --- takeover ------------------------------------------------------------------------------

    def fetch_missing(self, folder: Path, label: str) -> list[int]:
        """Download the committed steps of `folder`'s trial that the local folder lacks; the steps
        fetched.

        Raises:
            RemoteFault: the bucket cannot be read (resuming from older local steps, or from
                scratch, would lose work the bucket holds): a fault of the machine, not the trial's.
        """
        from sweep.errors import RemoteFault

        try:
            local = set(kept_steps(folder))
            missing = [s for s in self.steps(folder.name) if s not in local]
            if missing:
                folder.mkdir(parents=True, exist_ok=True)
            for step in missing:
                self.tier.fetch(folder.name, step, folder)
            if missing:
                log.info("%s: fetched %s from %s", label, numbered("step", missing), self.url)
            return missing
        except Exception as exc:  # noqa: BLE001 - the network, the endpoint, credentials
            raise RemoteFault(f"{label}: cannot read its checkpoints in {self.url} ({type(exc).__name__}: {exc}); "
                              "its local steps are intact and it stays resumable: fix the bucket's address or "
                              "credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID ...) and run the same command") from None

    def upload_missing(self, folder: Path, fence: Callable[[], None] | None = None) -> None:
        """Queue the local committed steps the bucket lacks (an upload a kill or an outage cut short)."""
        try:
            remote = set(self.steps(folder.name))
        except Exception:  # noqa: BLE001 - uploads retry on their own
            return
        for step in kept_steps(folder):
            if step not in remote:
                self.upload(folder, step, fence)


def upload_finished(session: Session, remote: RemoteTier | None) -> int:
    """Queue the steps of this host's finished trials that the bucket lacks; how many.

    A run that ended while the bucket was away (exit 1) left its last uploads local, and a
    finished trial's checkpoint folder is never opened again to upload them (found by the chaos
    campaign: an export from the bucket missed a kept trial's best step). Only a folder holding the
    trial's final state uploads (its newest step is the trial's last step): a stale copy of a trial
    another host finished never adds back steps that host's retention dropped. One listing of the
    bucket; nothing where it is away (the next pass tries again)."""
    from optuna.trial import TrialState

    from sweep.store.record import LAST_STEP

    if remote is None:
        return 0
    done = [n for n, s in session.trial_states().items() if s in (TrialState.COMPLETE, TrialState.PRUNED)]
    folders = {n: session.config.checkpoint_dir(n) for n in done}
    local = {n: steps for n, folder in folders.items() if (steps := kept_steps(folder))}  # listed once
    if not local:
        return 0
    last = session.trial_attrs(LAST_STEP)
    try:
        in_bucket = remote.all_steps()
    except Exception:  # noqa: BLE001 - the bucket is away: the next pass tries again
        return 0
    queued = 0
    for number, steps in sorted(local.items()):
        if steps[-1] != last.get(number, {}).get(LAST_STEP):
            continue
        for step in steps:
            if step not in in_bucket.get(folders[number].name, ()):
                remote.upload(folders[number], step)
                queued += 1
    return queued


def upload_within_grace(remote: RemoteTier | None, number: int, folder: Path, seconds: float) -> None:
    """After a signal's save: give its upload to the bucket what is left of the grace period."""
    if remote is None:
        return
    if not remote.wait(max(0.0, seconds)):
        log.warning("trial %d: its newest step is only local at %s: the upload to %s did not finish within the "
                    "grace period; it is uploaded when the trial runs here again", number, folder, remote.url)
