"""SQLite on a network filesystem gets one warning at start naming the journal storage (issue 41).
This machine's kernel has no NFS (no nfs in /proc/filesystems, no modules to load), so the mount
table is a real file in the kernel's format naming a test folder as an NFS mount."""

from __future__ import annotations

from pathlib import Path

from conftest import cli_here, make_study, write
from sweep.host import filesystems


def _mounts(tmp_path: Path, point: Path, kind: str) -> Path:
    table = tmp_path / "mounts"
    escaped = str(point).replace(" ", "\\040")
    table.write_text(f"/dev/vda / ext4 rw,relatime 0 0\nserver:/export {escaped} {kind} rw,vers=4.2,hard 0 0\n")
    return table


def test_the_mount_holding_a_path_is_the_longest_prefix_and_its_type_is_read(tmp_path):
    shared = tmp_path / "shared folder"  # a space: the table writes it \040
    shared.mkdir()
    table = _mounts(tmp_path, shared, "nfs4")
    assert filesystems.network_type(shared / "runs" / "study.db", str(table)) == "nfs4"  # not there yet: its folder's
    assert filesystems.network_type(tmp_path / "elsewhere", str(table)) is None  # on / (ext4)
    assert filesystems.network_type(tmp_path / "shared folder2", str(table)) is None  # a prefix of the name only
    assert filesystems.network_type(shared, str(_mounts(tmp_path, shared, "fuse.sshfs"))) == "fuse.sshfs"
    assert filesystems.type_of(tmp_path) is not None  # this machine's own table reads
    assert filesystems.network_type(tmp_path) is None  # and its temp folder is local


def test_run_on_sqlite_on_a_network_filesystem_warns_once_naming_the_journal(here, monkeypatch):
    monkeypatch.setattr(filesystems, "MOUNTS", str(_mounts(here, here, "nfs")))  # the folder is the mount
    result = cli_here("run", write(make_study(here, n_trials=1), here), cwd=here)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "network filesystem" in line]
    assert len(warned) == 1, result.stderr
    assert f"{here / 'runs' / 'study.db'} is on a network filesystem (nfs)" in warned[0]
    assert f"storage: journal://{here / 'runs' / 'study.log'}" in warned[0]


def test_run_on_a_local_disk_does_not_warn(here):
    result = cli_here("run", write(make_study(here, n_trials=1), here), cwd=here)
    assert result.returncode == 0 and "network filesystem" not in result.stderr, result.stderr
