"""Checkpoints on S3-compatible object storage: the remote tier behind the local checkpoint folders.

The only module that imports boto3 (any S3-compatible endpoint: boto3 reads `AWS_ENDPOINT_URL`
and the credentials from the standard environment). Orbax cannot write to `s3://` (orbax#359)
and its multi-tier checkpointing is experimental, so the tier is written here:

- every step is committed locally first (training never waits for the network), then uploaded by
  a background thread: the step's files, its checksum, and last a commit marker
  (`<root>/commits/<trial>/<step>`, a manifest of the files and their sizes). A step counts as
  remote only once its marker is there, so a kill mid-upload leaves nothing a reader takes as
  complete (ray#6226, orbax#394 shipped or lost half-copied checkpoints);
- the bucket mirrors the local layout under `s3://bucket/prefix/<study>/checkpoints/`; retention
  follows the local folder (a step Orbax removed there is removed here, marker first);
- a resume or takeover downloads the committed steps its local folder lacks (a new host with an
  empty disk resumes from the bucket), and uploads the local steps the bucket lacks.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from sweep.checkpoints import integrity
from sweep.checkpoints.steps import kept_steps
from sweep.words import numbered

log = logging.getLogger("sweep")
UPLOAD_ATTEMPTS = 5  # per step, with backoff: a bucket away for a while is retried, then left for the next run


def parse(url: str) -> tuple[str, str]:
    """(bucket, prefix) of "s3://bucket/prefix"."""
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class RemoteTier:
    """One study's checkpoints in a bucket: uploads in a background thread, downloads on demand."""

    def __init__(self, url: str, study: str) -> None:
        import boto3

        self.url = url
        self.bucket, prefix = parse(url)
        self.root = "/".join(p for p in (prefix, study) if p)
        self.client = boto3.client("s3")
        self._queue: queue.Queue[tuple[Path, int, Callable[[], None] | None] | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self.uploaded_seconds = 0.0  # the uploader's time (benchmarks/remote.py)

    # --- keys ----------------------------------------------------------------------------------

    def _data(self, trial: str, step: int) -> str:
        return f"{self.root}/checkpoints/{trial}/{step}/"

    def _sums(self, trial: str, step: int) -> str:
        return f"{self.root}/checkpoints/{trial}.sums/{step}{integrity.SIDE_SUFFIX}"

    def _marker(self, trial: str, step: int) -> str:
        return f"{self.root}/commits/{trial}/{step}"

    def _list(self, prefix: str, delimiter: str | None = None) -> list[dict[str, Any]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, **({"Delimiter": delimiter} if delimiter else {}))
        found: list[dict[str, Any]] = []
        for page in pages:
            found += page.get("Contents", []) + page.get("CommonPrefixes", [])
        return found

    # --- what is there -------------------------------------------------------------------------

    def steps(self, trial: str) -> list[int]:
        """The committed (marked) steps of `trial` in the bucket, ascending."""
        prefix = f"{self.root}/commits/{trial}/"
        return sorted(int(o["Key"][len(prefix):]) for o in self._list(prefix) if o["Key"][len(prefix):].isdigit())

    def all_steps(self) -> dict[str, list[int]]:
        """trial folder name -> its committed steps, ascending, for every trial of the study (one listing)."""
        prefix = f"{self.root}/commits/"
        found: dict[str, list[int]] = {}
        for o in self._list(prefix):
            trial, _, step = o["Key"][len(prefix):].partition("/")
            if step.isdigit():
                found.setdefault(trial, []).append(int(step))
        return {trial: sorted(steps) for trial, steps in found.items()}

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
                self._upload(folder, step, fence)
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

    def _upload(self, folder: Path, step: int, fence: Callable[[], None] | None) -> None:
        step_dir = folder / str(step)
        files = {}
        for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(step_dir).as_posix()
            files[rel] = path.stat().st_size
            self.client.upload_file(str(path), self.bucket, self._data(folder.name, step) + rel)
        self.client.upload_file(str(integrity.checksum_file(folder, step)), self.bucket, self._sums(folder.name, step))
        if fence is not None:
            fence()  # a worker that lost its trial never marks a step over the new owner's
        manifest = {"files": files, "sha256": integrity.read_checksum(folder, step)}
        self.client.put_object(Bucket=self.bucket, Key=self._marker(folder.name, step),
                               Body=json.dumps(manifest).encode())

    def prune(self, folder: Path, everything: bool = False) -> None:
        """Remove from the bucket the steps of `folder`'s trial that its local folder no longer
        keeps (marker first: from then on no reader takes the step), and leftovers of uploads a
        kill cut short. Steps the local folder keeps are left, uploaded or not, and so are steps
        newer than its newest (another host's, which this folder never saw). `everything`: the
        trial's checkpoints were removed (checkpoint.keep_trials): all of them go."""
        kept = set(kept_steps(folder))
        newest = max(kept, default=-1)

        def doomed(step: int) -> bool:
            return everything or (step not in kept and step < newest)

        trial = folder.name
        for step in self.steps(trial):
            if doomed(step):
                self.client.delete_object(Bucket=self.bucket, Key=self._marker(trial, step))
        prefix = f"{self.root}/checkpoints/{trial}/"
        marked = set(self.steps(trial))
        for entry in self._list(prefix, delimiter="/"):
            name = entry.get("Prefix", "")[len(prefix):].strip("/")
            if name.isdigit() and doomed(int(name)) and (everything or int(name) not in marked):
                self._delete_prefix(entry["Prefix"])
                self.client.delete_object(Bucket=self.bucket, Key=self._sums(trial, int(name)))

    def _delete_prefix(self, prefix: str) -> None:
        keys = [{"Key": o["Key"]} for o in self._list(prefix)]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i:i + 1000]})

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

    # --- download ------------------------------------------------------------------------------

    def download(self, trial: str, step: int, folder: Path) -> None:
        """Download committed step `step` of `trial` into `folder` as a committed local step
        (its checksum first, the step folder by rename, as a save commits)."""
        body = self.client.get_object(Bucket=self.bucket, Key=self._marker(trial, step))["Body"].read()
        manifest = json.loads(body)
        integrity.sums_dir(folder).mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._sums(trial, step), str(integrity.checksum_file(folder, step)))

        def fill(tmp: Path) -> None:
            for rel, size in manifest["files"].items():
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, self._data(trial, step) + rel, str(target))
                if target.stat().st_size != size:
                    raise OSError(f"{trial} step {step}: {rel} is {target.stat().st_size} bytes in {self.url}, "
                                  f"its manifest says {size}")

        integrity.install_step(folder, step, fill, "downloading")

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
                self.download(folder.name, step, folder)
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


def upload_finished(session: Any) -> int:
    """Queue the steps of this host's finished trials that the bucket lacks; how many.

    A run that ended while the bucket was away (exit 1) left its last uploads local, and a
    finished trial's checkpoint folder is never opened again to upload them (found by the chaos
    campaign: an export from the bucket missed a kept trial's best step). Only a folder holding the
    trial's final state uploads (its newest step is the trial's last step): a stale copy of a trial
    another host finished never adds back steps that host's retention dropped. One listing of the
    bucket; nothing where it is away (the next pass tries again)."""
    from optuna.trial import TrialState

    from sweep.store.record import LAST_STEP

    remote = session.remote
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


def upload_within_grace(session: Any, number: int, folder: Path, seconds: float) -> None:
    """After a signal's save: give its upload to the bucket what is left of the grace period."""
    remote = session.remote
    if remote is None:
        return
    if not remote.wait(max(0.0, seconds)):
        log.warning("trial %d: its newest step is only local at %s: the upload to %s did not finish within the "
                    "grace period; it is uploaded when the trial runs here again", number, folder, remote.url)
