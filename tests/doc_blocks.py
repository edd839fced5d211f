"""The README's and docs/'s fenced blocks, named examples and `python -m sweep` commands, for the tests that run them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def page_name(page: Path) -> str:
    return str(page.relative_to(REPO))


def blocks(lang: str) -> list[tuple[str, int, str]]:
    """(page, line, text) of every ```lang block of the README and docs/."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(rf"^```{re.escape(lang)}\n(.*?)^```", text, re.S | re.M):
            found.append((page_name(page), text[:m.start()].count("\n") + 1, m.group(1)))
    return found


def example(name: str) -> str:
    """The block marked `<!-- example: NAME -->` (one per name across the README and docs/)."""
    found = [m.group(1) for page in PAGES
             for m in re.finditer(rf"<!-- example: {re.escape(name)} -->\n```\w+\n(.*?)```", page.read_text(), re.S)]
    assert len(found) == 1, f"{len(found)} examples named {name} in the README and docs/"
    return found[0]


def sweep_commands() -> list[tuple[str, int, list[str]]]:
    """(page, line, argv after `python -m sweep`) of every sweep command in a ```bash block."""
    commands = []
    for page, line, text in blocks("bash"):
        for i, row in enumerate(text.splitlines()):
            m = re.search(r"(?:^|\s|/)python -m sweep (.*)$", row)
            if m:
                commands.append((page, line + 1 + i, shlex.split(m.group(1), comments=True)))
    return commands
