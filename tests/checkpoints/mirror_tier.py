"""A toy checkpoint tier from the test folder (issue 38): a second local folder as a mirror,
registered by a study file alone, `checkpoint: {tiers: {mirror: "tests.checkpoints.mirror_tier:MirrorTier"},
remote: "mirror:///abs/folder"}`, nothing in sweep/ touched.

Layout under the folder: `<root>/data/<trial>/<step>/...` (the step's files),
`<root>/sums/<trial>/<step>` (its checksum file) and `<root>/marks/<trial>/<step>` (the commit
mark, written last by rename: a kill mid-commit leaves data without a mark, which `list` shows
only as `partial`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from sweep.checkpoints import integrity, tiers


class MirrorTier:
    def __init__(self, url: str, root: str) -> None:
        self.url = url
        self.base = Path(url[len("mirror://"):]) / root

    def _data(self, trial: str, step: int) -> Path:
        return self.base / "data" / trial / str(step)

    def _sums(self, trial: str, step: int) -> Path:
        return self.base / "sums" / trial / str(step)

    def _mark(self, trial: str, step: int) -> Path:
        return self.base / "marks" / trial / str(step)

    @staticmethod
    def _steps(folder: Path) -> list[int]:
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []

    def list(self, trial: str | None = None, partial: bool = False) -> dict[str, list[int]]:
        marks = self.base / "marks"
        names = [trial] if trial is not None else sorted(p.name for p in marks.iterdir()) if marks.is_dir() else []
        found = {name: set(self._steps(marks / name)) for name in names}
        if partial and trial is not None:
            found[trial] |= set(self._steps(self.base / "data" / trial))
        return {name: sorted(steps) for name, steps in found.items() if steps}

    def commit(self, folder: Path, step: int, fence: Callable[[], None] | None = None) -> None:
        mark = tiers.manifest(folder, step)
        target = self._data(folder.name, step)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder / str(step), target)
        self._sums(folder.name, step).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(integrity.checksum_file(folder, step), self._sums(folder.name, step))
        if fence is not None:
            fence()
        marker = self._mark(folder.name, step)
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f".{step}.tmp")
        tmp.write_bytes(tiers.encode(mark))
        os.replace(tmp, marker)

    def _read_mark(self, trial: str, step: int) -> dict[str, Any]:
        return json.loads(self._mark(trial, step).read_text())

    def verify(self, trial: str, step: int) -> bool:
        try:
            mark = self._read_mark(trial, step)
        except (OSError, ValueError):
            return False
        data = self._data(trial, step)
        return all((data / rel).is_file() and (data / rel).stat().st_size == size
                   for rel, size in mark["files"].items())

    def fetch(self, trial: str, step: int, folder: Path) -> None:
        mark = self._read_mark(trial, step)
        integrity.sums_dir(folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._sums(trial, step), integrity.checksum_file(folder, step))

        def fill(tmp: Path) -> None:
            shutil.copytree(self._data(trial, step), tmp)
            tiers.check_fetched(tmp, folder, step, mark, self.url)

        integrity.install_step(folder, step, fill, "downloading")

    def remove(self, trial: str, step: int) -> None:
        self._mark(trial, step).unlink(missing_ok=True)
        shutil.rmtree(self._data(trial, step), ignore_errors=True)
        self._sums(trial, step).unlink(missing_ok=True)


class NotATier:
    """A class the study file may name that lacks the contract (the registry refuses it)."""

    def commit(self) -> None: ...
