"""Counts, numbers and sizes in what the commands print: singular and plural right, ranges short."""

from __future__ import annotations

from typing import Iterable


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 trial', '2 trials' (`plural` where adding an s is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def numbered(noun: str, numbers: Iterable[int]) -> str:
    """'trial 3', 'trials 0-2, 5'."""
    found = sorted(numbers)
    return f"{noun} {found[0]}" if len(found) == 1 else f"{noun}s {ranges(found)}"


def ranges(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    found = sorted(numbers)
    for i, n in enumerate(found):
        start = n if start is None else start
        if i + 1 == len(found) or found[i + 1] != n + 1:
            out.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def listing(items: Iterable[object]) -> str:
    """'20', '20 and 40', '20, 40 and 60'."""
    found = [str(i) for i in items]
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} and {found[-1]}"


def size(n: float) -> str:
    """Bytes as '512 B', '8.1 KB', '47.0 MB' (powers of 1000, as `du --si`)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
