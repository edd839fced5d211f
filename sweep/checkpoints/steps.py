"""A trial folder's committed steps, read from the folder's names: no JAX, no Orbax, so `status`,
`plan`, the live view and the bucket's tier list steps without importing either (seconds).

A committed step is a folder named by its number; Orbax writes into `<step>.orbax-checkpoint-tmp*`
and renames it when the step is whole.
"""

from __future__ import annotations

import os


def step_dirs(directory: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(directory) if e.is_dir() and e.name.isdigit()]
    except OSError:
        return []


def newest_mtime(directory: str | os.PathLike[str]) -> float | None:
    """mtime of the newest committed step folder (for status)."""
    return max((e.stat().st_mtime for e in step_dirs(directory)), default=None)


def kept_steps(directory: str | os.PathLike[str]) -> list[int]:
    """The committed steps on disk, ascending."""
    return sorted(int(e.name) for e in step_dirs(directory))


def newest_step(directory: str | os.PathLike[str]) -> int | None:
    """The newest committed step."""
    return max((int(e.name) for e in step_dirs(directory)), default=None)
