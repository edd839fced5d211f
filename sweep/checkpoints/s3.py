"""The built-in checkpoint tier on S3-compatible object storage (`checkpoint.remote: s3://bucket/prefix`).

The only module that imports boto3 (any S3-compatible endpoint: boto3 reads `AWS_ENDPOINT_URL`
and the credentials from the standard environment). Orbax cannot write to `s3://` (orbax#359)
and its multi-tier checkpointing is experimental, so the tier is written here, to the protocol
of sweep/checkpoints/tiers.py: the bucket mirrors the local layout under
`s3://bucket/prefix/<study>/checkpoints/`, and a step counts as committed only once its commit
marker `<study>/commits/<trial>/<step>` (a manifest of its files, their sizes and its checksum) is
there, so a kill mid-upload leaves nothing a reader takes as complete (ray#6226, orbax#394
shipped or lost half-copied checkpoints).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from sweep.checkpoints import integrity, tiers


def parse(url: str) -> tuple[str, str]:
    """(bucket, prefix) of "s3://bucket/prefix"."""
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class S3Tier:
    """One study's checkpoints in a bucket (a `CheckpointTier`)."""

    def __init__(self, url: str, root: str) -> None:
        import boto3

        self.url = url
        self.bucket, prefix = parse(url)
        self.root = "/".join(p for p in (prefix, root) if p)
        self.client = boto3.client("s3")

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

    # --- the protocol --------------------------------------------------------------------------

    def list(self, trial: str | None = None, partial: bool = False) -> dict[str, list[int]]:
        prefix = f"{self.root}/commits/{trial + '/' if trial is not None else ''}"
        found: dict[str, set[int]] = {}
        for o in self._list(prefix):
            name, _, step = o["Key"][len(f"{self.root}/commits/"):].partition("/")
            if step.isdigit():
                found.setdefault(name, set()).add(int(step))
        if partial and trial is not None:  # the step folders of uploads a kill cut short (no marker)
            data = f"{self.root}/checkpoints/{trial}/"
            for entry in self._list(data, delimiter="/"):
                step = entry.get("Prefix", "")[len(data):].strip("/")
                if step.isdigit():
                    found.setdefault(trial, set()).add(int(step))
        return {name: sorted(steps) for name, steps in found.items()}

    def commit(self, folder: Path, step: int, fence: Callable[[], None] | None = None) -> None:
        mark = tiers.manifest(folder, step)
        for rel in mark["files"]:
            self.client.upload_file(str(folder / str(step) / rel), self.bucket, self._data(folder.name, step) + rel)
        self.client.upload_file(str(integrity.checksum_file(folder, step)), self.bucket, self._sums(folder.name, step))
        if fence is not None:
            fence()  # a worker that lost its trial never marks a step over the new owner's
        self.client.put_object(Bucket=self.bucket, Key=self._marker(folder.name, step), Body=tiers.encode(mark))

    def _mark(self, trial: str, step: int) -> dict[str, Any]:
        return json.loads(self.client.get_object(Bucket=self.bucket, Key=self._marker(trial, step))["Body"].read())

    def verify(self, trial: str, step: int) -> bool:
        try:
            mark = self._mark(trial, step)
        except Exception:  # noqa: BLE001 - no marker (or an unreadable one): not committed
            return False
        sizes = {o["Key"]: o.get("Size") for o in self._list(self._data(trial, step))}
        return all(sizes.get(self._data(trial, step) + rel) == size for rel, size in mark["files"].items())

    def fetch(self, trial: str, step: int, folder: Path) -> None:
        mark = self._mark(trial, step)
        integrity.sums_dir(folder).mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._sums(trial, step), str(integrity.checksum_file(folder, step)))

        def fill(tmp: Path) -> None:
            for rel in mark["files"]:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, self._data(trial, step) + rel, str(target))
            tiers.check_fetched(tmp, folder, step, mark, self.url)

        integrity.install_step(folder, step, fill, "downloading")

    def remove(self, trial: str, step: int) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._marker(trial, step))  # first: no reader takes it
        keys = [{"Key": o["Key"]} for o in self._list(self._data(trial, step))]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i:i + 1000]})
        self.client.delete_object(Bucket=self.bucket, Key=self._sums(trial, step))
