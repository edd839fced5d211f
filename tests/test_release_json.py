"""`status --json`, export's index.json and meta.json are what the previous release wrote on the same
study (issue 30: the restructuring changed no field): every field it wrote is there with the same
value; fields added since (documented in docs/reference.md) may be there too.

The previous release is commit PREVIOUS (the landing before the restructuring), run from this
repository's own history in the same environment, so library versions cancel out. Where the
history is not there (an archive, a shallow clone), its output stored in tests/fixtures/
previous_release/ (written by this test's own code at that commit, `write_fixture`) stands in;
its numbers are compared only under the library versions it was written with.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, _conforms, cli_env, cli_here

pytestmark = pytest.mark.slow  # real CLI runs of two versions of sweep

PREVIOUS = "c4c1c8d"
FIXTURE = REPO / "tests" / "fixtures" / "previous_release"
# Leaves that differ between any two runs of one version: times, and where the run was.
LEDGER_SECONDS = {"training", "evaluating", "compiling", "restoring", "checkpoint_blocking", "checkpoint_background",
                  "waiting", "wall", "lost"}


def _volatile(path: str) -> bool:
    parts = re.sub(r"\[\d+\]", "", path).split(".")
    return (parts[-1] in ("storage", "checkpoint_dir") or "compiles" in parts
            or (len(parts) > 1 and parts[-2] == "ledger" and parts[-1] in LEDGER_SECONDS))


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def _outputs(folder: Path, pythonpath: str | None = None) -> dict[str, Any]:
    """Run the fixture's study in `folder` with the sweep found first on `pythonpath`; its JSON outputs."""
    shutil.copy(FIXTURE / "study.yaml", folder / "study.yaml")
    env = cli_env()
    if pythonpath:
        env["PYTHONPATH"] = pythonpath

    def cli(*args: str) -> str:
        if pythonpath is None and args[0] != "run":  # this version's readers: through main() in this process
            result = cli_here(*args, cwd=folder)
        else:
            result = subprocess.run([sys.executable, "-m", "sweep", *args], cwd=folder, env=env, capture_output=True,
                                    text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        return result.stdout
    cli("run", "study.yaml")
    out = {"status.json": json.loads(cli("status", "study.yaml", "--json"))}
    cli("export", "study.yaml", "--out", "export")
    out["index.json"] = json.loads((folder / "export" / "index.json").read_text())
    for meta in sorted((folder / "export").glob("trial_*/meta.json")):
        out[f"{meta.parent.name}_meta.json"] = json.loads(meta.read_text())
    return json.loads(json.dumps(out).replace(str(folder), "<dir>"))


def _previous_from_history(tmp: Path) -> dict[str, Any] | None:
    if not (REPO / ".git").exists():
        return None
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS, "sweep", "trials"],
                             capture_output=True)
    if archive.returncode != 0:  # a shallow clone without that commit
        return None
    code = tmp / "previous"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(code, filter="data")
    run = tmp / "run-previous"
    run.mkdir()
    return _outputs(run, pythonpath=str(code))


def write_fixture() -> None:
    """At commit PREVIOUS's code: `python -c 'import test_release_json as t; t.write_fixture()'`
    from tests/ with PYTHONPATH pointing at that code."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in _outputs(Path(tmp), os.environ.get("PYTHONPATH")).items():
            (FIXTURE / name).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _same_versions(previous: dict[str, Any], now: dict[str, Any]) -> bool:
    metas = [k for k in previous if k.endswith("_meta.json")]
    return all(previous[k].get("versions") == now.get(k, {}).get("versions") for k in metas)


def test_status_and_export_json_keep_every_field_of_the_previous_release(tmp_path):
    now_dir = tmp_path / "run-now"
    now_dir.mkdir()
    now = _outputs(now_dir)
    previous = _previous_from_history(tmp_path)
    exact = True
    if previous is None:
        previous = {p.name: json.loads(p.read_text()) for p in FIXTURE.glob("*.json")}
        exact = _same_versions(previous, now)
    assert set(previous) == set(now), (sorted(previous), sorted(now))
    for name, old in previous.items():
        new = dict(_leaves(now[name]))
        for path, value in _leaves(old):
            if _volatile(path):
                continue
            assert path in new, f"{name}: {path} (the previous release wrote it) is gone"
            if exact or not isinstance(value, float):
                assert new[path] == value, f"{name}: {path} was {value!r}, is {new[path]!r}"
    # The API's types (sweep/results.py) name exactly the keys written: none missing, none extra.
    from sweep.results import ExportEntry, ExportIndex, StudyStatus, TrialStatus

    _conforms(now["status.json"], StudyStatus, "status.json")
    for entry in now["status.json"]["trials"]:
        _conforms(entry, TrialStatus, "status.json trial")
    _conforms(now["index.json"], ExportIndex, "index.json")
    for name, doc in now.items():
        if name.endswith("_meta.json"):
            _conforms(doc, ExportEntry, name)
    for entry in now["index.json"]["trials"]:
        _conforms(entry, ExportEntry, "index.json trial")


