"""Readers on a study the user cannot write (an archived study, a colleague's results, a read-only
mount) and on a study whose trial module no longer imports: status, plan, export and plot read it;
run says why it cannot in one line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import TRIAL, cli_here, make_study, run_cli, write_trial

pytestmark = pytest.mark.slow  # the study runs as a process; run's refusal is a process too


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` read-only for this process and its children: a read-only bind mount of it over
    itself as root (root ignores permission bits), else its write permission bits removed."""
    if os.geteuid() == 0:
        for options in (["--bind"], ["-o", "remount,bind,ro"]):
            result = subprocess.run(["mount", *options, str(folder), str(folder)], capture_output=True, text=True)
            assert result.returncode == 0, f"mount {options}: {result.stderr}"
        try:
            yield
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)  # -l: a failed reader may hold a file open
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for p, mode in modes.items():
        p.chmod(mode & ~0o222)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_read_only_workdir_is_read_by_status_plan_export_and_plot_and_run_says_why_in_one_line(tmp_path):
    write_trial(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(make_study(tmp_path, n_trials=2, sampler={"type": "random", "seed": 0})))
    assert run_cli("run", study, cwd=tmp_path).returncode == 0
    workdir = tmp_path / "runs"
    before = cli_here("export", study, "--out", tmp_path / "before", cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    tree = _tree(workdir)
    with read_only(workdir):
        with pytest.raises(OSError):
            (workdir / "probe").write_text("")  # the mount is read-only indeed
        status = cli_here("status", study, "--json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert [t["state"] for t in json.loads(status.stdout)["trials"]] == ["COMPLETE", "COMPLETE"]
        plan = cli_here("plan", study, cwd=tmp_path)
        assert plan.returncode == 0 and "run would do nothing" in plan.stdout, plan.stdout + plan.stderr
        export = cli_here("export", study, "--out", tmp_path / "out", cwd=tmp_path)
        assert export.returncode == 0, export.stderr
        for name in ("index.json", "trial_0000/meta.json", "trial_0000/params.safetensors"):
            assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "before" / name).read_bytes(), name
        plot = cli_here("plot", study, "--out", tmp_path / "plots", cwd=tmp_path)
        assert plot.returncode == 0 and (tmp_path / "plots" / "curves").is_dir(), plot.stderr
        # More trials wanted: run must write, and says in one line that it cannot (exit 1).
        study.write_text(yaml.safe_dump(make_study(tmp_path, n_trials=3, sampler={"type": "random", "seed": 0})))
        refused = run_cli("run", study, cwd=tmp_path)
        assert refused.returncode == 1
        assert f"its workdir {workdir} is read-only here" in _one_line_error(refused)
    assert _tree(workdir) == tree  # nothing was written, not even a lock or a journal file


def test_status_of_a_study_whose_trial_module_no_longer_imports_and_run_refuses_in_one_line(tmp_path):
    write_trial(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(make_study(tmp_path, n_trials=1, sampler={"type": "random", "seed": 0})))
    assert run_cli("run", study, cwd=tmp_path).returncode == 0
    (tmp_path / f"{TRIAL}.py").write_text("def broken(:\n")  # an archived study whose code moved on
    status = run_cli("status", study, cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETE" in status.stdout and not status.stderr, status.stderr
    refused = run_cli("run", study, cwd=tmp_path)
    assert refused.returncode == 2
    assert "trial: importing the module raised SyntaxError" in _one_line_error(refused)


def test_a_storage_error_is_one_line(tmp_path, postgres_url):
    study = tmp_path / "study.yaml"
    missing = postgres_url.rsplit("/", 1)[0] + "/sweep_no_such_database"
    write_trial(tmp_path)
    study.write_text(yaml.safe_dump(make_study(tmp_path, storage=missing)))
    for command in ("status", "plan"):
        result = cli_here(command, study, cwd=tmp_path)
        assert result.returncode == 1
        line = _one_line_error(result)
        assert "cannot open storage" in line and "sweep_no_such_database" in line and "sqlalche.me" not in line
