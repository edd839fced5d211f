"""The trial's own code: its module and the modules it imports from outside the standard library,
site-packages and sweep, hashed; recorded per trial when it trains, compared at resume and export.

A trial module that imports its model from a `models.py` beside it trains whatever `models.py`
says: changing `Dense(500)` to `Dense(400)` there changes what a checkpoint means as much as an
edit of the trial module itself. The imports are found by reading the source (AST), not by running
anything, and resolved among the modules already imported (the trial module was, when the study
file was loaded), else by their spec.

Imports neither optuna nor jax.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import site
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

log = logging.getLogger("sweep")
TRIAL_ATTR = "trial_code"  # trial user attribute: record() of the code it trained with (last)


def modules(module: ModuleType) -> dict[str, str]:
    """Module name -> source file of `module` and of every local module it imports, transitively."""
    found: dict[str, str] = {}
    todo = [(module.__name__, _source(module))]
    while todo:
        name, path = todo.pop()
        if path is None or name in found:
            continue
        found[name] = path
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for imported in _imports(path, package):
            if imported not in found:
                source = _locate(imported)
                if is_own_code(source):
                    todo.append((imported, source))
    return dict(sorted(found.items()))


def record(module: ModuleType) -> dict[str, Any]:
    """{"sha256": one hash of all the trial's own code, "files": {module name: sha256 of its file}}."""
    files = {name: _sha256(path) for name, path in modules(module).items()}
    combined = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"sha256": combined, "files": files}


def differences(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """The modules whose code differs between two records ([] if equal, or if `old` is unknown)."""
    if not old or not old.get("sha256") or old["sha256"] == new["sha256"]:
        return []
    a, b = old.get("files", {}), new.get("files", {})
    return [name for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)] or ["(the trial's code)"]


def _source(module: ModuleType) -> str | None:
    path = getattr(module, "__file__", None)
    return path if path and path.endswith(".py") and os.path.isfile(path) else None


def _imports(path: str, package: str) -> Iterator[str]:
    """Every module name an import statement of the file at `path` may name (also in functions)."""
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                yield from (".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                    if node.level else node.module or ""
            except (ImportError, ValueError):
                continue
            if base:
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`


def _locate(name: str) -> str | None:
    """The source file of module `name`, without importing it (None: not a module, or no source)."""
    module = sys.modules.get(name)
    if module is not None:
        return _source(module)
    parent, _, last = name.rpartition(".")
    try:
        if parent:  # in the parent package's folder: importlib.util.find_spec would import the parent
            folder = _locate(parent)
            if folder is None or not folder.endswith("__init__.py"):
                return None
            spec = importlib.machinery.PathFinder.find_spec(last, [os.path.dirname(folder)])
        else:
            spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    origin = getattr(spec, "origin", None)
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


@functools.lru_cache(maxsize=1)
def _excluded_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]
    roots.append(str(Path(__file__).resolve().parents[1]))  # sweep itself: its version is recorded apart
    return tuple(os.path.realpath(r) for r in roots if r)


def is_own_code(path: str | None) -> bool:
    """Whether the file at `path` is the user's own code: not the standard library, site-packages
    or sweep."""
    if path is None:
        return False
    real = os.path.realpath(path)
    if any(part in ("site-packages", "dist-packages") for part in Path(real).parts):
        return False
    return not any(real == root or real.startswith(root + os.sep) for root in _excluded_roots())


def _sha256(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return ""


def record_on(trial: Any, frozen: Any, code: dict[str, Any]) -> None:
    """Record the code the trial trains with now; warn where it differs from the code it trained with
    before it was interrupted (its checkpoints were written by that code)."""
    stored = frozen.user_attrs.get(TRIAL_ATTR)
    changed = differences(stored, code)
    if changed:
        log.warning("trial %d: its code changed since it last trained: %s (sha256 %s -> %s); it goes on with the "
                    "new code from checkpoints the old code wrote", frozen.number, ", ".join(changed),
                    stored["sha256"][:12], code["sha256"][:12])
    if stored != code:
        trial.set_user_attr(TRIAL_ATTR, code)
