"""What kind of filesystem a path is on: SQLite's locks are unreliable on network filesystems
(its documentation: "How To Corrupt An SQLite Database File", 2.1), and a study's database there
is a corruption waiting for several hosts (issue 41).

Read from the kernel's mount table (/proc/self/mounts: the mount whose point is the longest
prefix of the path). Python's os.statvfs gives no filesystem type, and statfs(2)'s magic numbers
are not exposed; the mount table names the type as `mount` shows it.
"""

from __future__ import annotations

import os
from pathlib import Path

NETWORK = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "fuse", "9p", "ceph", "glusterfs", "beegfs")
MOUNTS = "/proc/self/mounts"


def _unescape(field: str) -> str:
    """The mount table's octal escapes (a space is \\040)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def type_of(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The filesystem type of the mount holding `path` (its nearest existing folder); None where
    the mount table cannot be read."""
    target = Path(path).resolve()
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        lines = Path(mounts or MOUNTS).read_text().splitlines()
    except OSError:
        return None
    best, found = -1, None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        if (str(target) == point or str(target).startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, found = len(point), fields[2]
    return found


def network_type(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The type of the network filesystem `path` is on (nfs, lustre, gpfs, cifs, fuse.sshfs ...);
    None for a local one."""
    kind = type_of(path, mounts)
    if kind is None:
        return None
    return kind if kind.split(".")[0] in NETWORK or kind in NETWORK else None
