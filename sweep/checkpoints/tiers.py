"""The checkpoint tier protocol and its registry: what a store behind the local checkpoint folders
does, and which class serves a `checkpoint.remote` URL.

A tier holds committed steps of one study's trials, each trial by its folder's name (`trial_0007`)
and each step whole or not at all: `commit` sends a step the local folder committed (its files,
its checksum, and last a commit mark, so that a kill mid-commit leaves nothing `list` shows);
`list` says which steps are committed, per trial; `verify` whether one is there whole; `fetch`
brings one into a local trial folder as a committed step, checked against the checksum it was
committed with; `remove` takes one away, its mark first. What is written once against this
protocol is in sweep/checkpoints/remote.py: background commits, takeover (fetching what the local
folder lacks), and the tier following retention.

The URL's scheme picks the class, built as `cls(url, root)` (`root`: the study's identity, its
folder within the URL's place): `s3` is built in (sweep/checkpoints/s3.py); a study file names
others by import path, `checkpoint: {tiers: {mirror: "pkg.module:MirrorTier"}, remote: "mirror://..."}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from sweep.checkpoints import integrity
from sweep.errors import ConfigError
from sweep.study.config import Config
from sweep.trial.protocol import import_trial

BUILT_IN = {"s3": "sweep.checkpoints.s3:S3Tier"}  # URL scheme -> the class serving it
METHODS = ("commit", "list", "verify", "fetch", "remove")


@runtime_checkable
class CheckpointTier(Protocol):
    """One study's checkpoints in a store behind the local folders. Built as `cls(url, root)`."""

    url: str

    def commit(self, folder: Path, step: int, fence: Callable[[], None] | None = None) -> None:
        """Send committed step `step` of local trial folder `folder` (`folder.name` names the trial);
        call `fence` (it raises if this worker lost the trial) right before the commit mark."""

    def list(self, trial: str | None = None, partial: bool = False) -> dict[str, list[int]]:
        """Trial name -> its committed steps, ascending (of `trial` alone where given); `partial`:
        also the steps a commit cut short left pieces of (no mark), which `remove` cleans up."""

    def verify(self, trial: str, step: int) -> bool:
        """Whether committed step `step` of `trial` is there whole (its mark and every file it names)."""

    def fetch(self, trial: str, step: int, folder: Path) -> None:
        """Bring committed step `step` of `trial` into local trial folder `folder` as a committed
        step (checksum first, then the step by rename: `integrity.install_step`), checked against
        its manifest (`check_fetched`). Raises OSError (or the store's error) where it cannot."""

    def remove(self, trial: str, step: int) -> None:
        """Remove step `step` of `trial`, its mark first, committed or a commit's leftover."""


def manifest(folder: Path, step: int) -> dict[str, Any]:
    """What a commit mark records of local committed step `step`: its files with their sizes and its checksum."""
    step_dir = folder / str(step)
    files = {p.relative_to(step_dir).as_posix(): p.stat().st_size for p in sorted(step_dir.rglob("*")) if p.is_file()}
    return {"files": files, "checksum": integrity.read_checksum(folder, step)}


def check_fetched(tmp: Path, folder: Path, step: int, mark: dict[str, Any], where: str) -> None:
    """A fetched step, before its rename into place: every file its mark names, with its size, in
    `tmp`, and the checksum fetched beside it the one it was committed with. Raises OSError."""
    for rel, size in mark["files"].items():
        found = (tmp / rel).stat().st_size if (tmp / rel).is_file() else None
        if found != size:
            raise OSError(f"{folder.name} step {step}: {rel} is {found} bytes in {where}, its manifest says {size}")
    committed = mark.get("checksum", mark.get("sha256"))  # "sha256": the key of marks before issue 42
    if committed is not None and integrity.read_checksum(folder, step) != committed:
        raise OSError(f"{folder.name} step {step}: its checksum in {where} is not the one it was committed with")


def encode(mark: dict[str, Any]) -> bytes:
    return json.dumps(mark).encode()


def tier_class(config: Config) -> type | None:
    """The class serving `checkpoint.remote` (None without one).

    Raises:
        ConfigError: the module named in `checkpoint.tiers` does not import, or the name is not a tier class.
    """
    c = config.study.checkpoint
    if c.remote is None:
        return None
    scheme = c.remote.partition("://")[0]
    key, path = (f"checkpoint.tiers.{scheme}", c.tiers[scheme]) if scheme in c.tiers else ("checkpoint.remote",
                                                                                          BUILT_IN[scheme])
    module_name, _, name = path.partition(":")
    file = str(config.path)
    try:
        module = import_trial(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(file, key, f"cannot import module ({exc}); is it on the current directory or PYTHONPATH?",
                          path) from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(file, key, f"importing the module raised {type(exc).__name__}: {exc}", path) from None
    cls = getattr(module, name, None)
    lacks = [m for m in METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or lacks:
        what = f"it lacks {', '.join(lacks)}" if isinstance(cls, type) else f"module {module_name} has no class {name}"
        raise ConfigError(file, key, f"must name a checkpoint tier class ({', '.join(METHODS)}): {what}", path)
    return cls


def open_tier(config: Config, root: str) -> CheckpointTier | None:
    """The study's tier behind its local folders (None without `checkpoint.remote`); `root`: the study's identity."""
    cls = tier_class(config)
    return cls(config.study.checkpoint.remote, root) if cls is not None else None
