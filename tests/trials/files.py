"""Write a shared trial module of tests/trials/ into a test's folder, under the module name the
test gives it and with some of its module-level constants changed.

A trial module is imported once per process (module cache), and the compiled-program cache and
the study's code record are keyed on its name: a test that needs its own import, or a variant
(another UNROLL, another log file), writes a copy under a fresh name beside its study file, where
`sweep` finds it on the current directory as it finds a user's module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def trial_source(name: str, **constants: Any) -> str:
    """The text of tests/trials/<name>.py, with each `NAME = value` line of `constants` (a module-level
    constant, its value on one line) set to repr(value); its comment, if any, is kept.

    Raises:
        KeyError: the module has no (or more than one) such line for a name.
    """
    source = (HERE / f"{name}.py").read_text()
    for key, value in constants.items():
        source, found = re.subn(rf"^{re.escape(key)} = .*?(?=  #|$)", lambda _: f"{key} = {value!r}", source,
                                flags=re.M)
        if found != 1:
            raise KeyError(f"tests/trials/{name}.py has {found} module-level lines `{key} = ...`, not one")
    return source


def write_trial(folder: str | Path, module: str, name: str | None = None, **constants: Any) -> Path:
    """Write tests/trials/<name>.py (default: <module>.py) as <folder>/<module>.py; see trial_source."""
    path = Path(folder) / f"{module}.py"
    path.write_text(trial_source(name or module, **constants))
    return path
