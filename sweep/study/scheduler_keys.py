"""The study file's `scheduler` section: the registry of scheduler names, the resolution of a name
or an import path to its class, and the checking of the section with that class's own keys model.

The schedulers themselves (asha, hyperband, pbt, freeze_thaw: where trials pause, which go on)
live in sweep/schedulers/, a family above this one: it is named here by import path only and imported by
`resolve`, never by an import statement. The class a name resolves to is a pydantic model of the
section (its keys and their rules) that also does what sweep/schedulers/base.py's Scheduler
declares; `config.study.scheduler` is an instance of it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from typing import Any, ClassVar

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from sweep.study.params import StrictModel
from sweep.trial.protocol import import_trial

MAX_STEP = 2 ** 31 - 1  # steps are int32 inside the compiled training window
# The built-in schedulers: the study file's name -> "module:Class". A new built-in scheduler is its
# module in sweep/schedulers/ and one entry here; a user's own is named in the study file by its
# import path instead (`scheduler: {type: "package.module:ClassName", ...}`).
REGISTRY = {"asha": "sweep.schedulers.asha:Asha", "hyperband": "sweep.schedulers.hyperband:Hyperband",
            "pbt": "sweep.schedulers.pbt:Pbt", "freeze_thaw": "sweep.schedulers.freeze_thaw:FreezeThaw"}
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
# What the run, plan, status and export ask of a scheduler beyond its keys (sweep/schedulers/base.py
# declares them, with defaults for all but the first two): a class without them is no scheduler.
BEHAVIOUR = ("pause_at", "promote_next", "pause", "finish_paused", "plan_note", "status_fields", "export_fields")


class SchedulerKeys(StrictModel):
    """The `scheduler` section as one scheduler's model checks it: `type` (its registered name or
    import path) and the keys of that type, with their rules. What the study file's rules read of
    a scheduler is here; what it does, in sweep/schedulers/base.py."""

    type: str
    # The key of the step a trial first pauses at, and what the messages call that step.
    first_key: ClassVar[str] = "min_steps"
    first_what: ClassVar[str] = "the first rung"

    @property
    def first(self) -> int:
        """The first step a trial pauses at (its rule: below train.steps, at an evaluation)."""
        return int(getattr(self, self.first_key))

    def rungs(self, steps: int) -> list[int]:
        """The steps below `steps` a trial may pause at, ascending (its last step is never one)."""
        raise NotImplementedError

    def check(self, study: Any) -> None:
        """Rules across the study file (`study`: its StudyFile, which imports this module) beyond
        this section's own keys and the first pause's: ValueError("<key>: <rule>, got <value>")."""

    def meaning(self) -> dict[str, Any]:
        """What the study's fingerprint keeps of the section (sweep/study/fingerprint.py): every key
        of its type with its default filled in, as JSON values."""
        return self.model_dump(mode="json")


def resolve(name: object) -> type[SchedulerKeys]:
    """The class the study file's `scheduler.type` names: a registered name, or an import path
    `package.module:ClassName`, found like a trial module (the current directory or PYTHONPATH).

    This is the plugin point: the one dynamic import of a scheduler, by which both the built-in
    ones (REGISTRY) and a user's own come in without this family importing the family above it.

    Raises:
        ValueError: its rule (the message of `scheduler.type`), where it names no scheduler.
    """
    names = list(REGISTRY)
    if not isinstance(name, str) or (name not in REGISTRY and ":" not in name):
        hint = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
        listed = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
        raise ValueError(f"must be one of {listed}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    path = REGISTRY.get(name, name)
    if not IMPORT_PATH.fullmatch(path):
        raise ValueError("must be a scheduler name or an import path like package.module:ClassName")
    module_name, _, class_name = path.partition(":")
    try:
        # A built-in one is sweep's own module; a user's is found as a trial module is.
        module = importlib.import_module(module_name) if name in REGISTRY else import_trial(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"cannot import module ({exc}); is it on the current directory or PYTHONPATH?") from None
    except Exception as exc:  # the user's module raised while importing
        raise ValueError(f"importing module {module_name} raised {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name} has no attribute {class_name}")
    if not (isinstance(cls, type) and issubclass(cls, SchedulerKeys)):
        why = "not a subclass of sweep.schedulers.base.Scheduler"
    elif missing := [m for m in BEHAVIOUR if not callable(getattr(cls, m, None))]:
        why = f"it lacks {', '.join(missing)}"
    elif inspect.isabstract(cls):
        why = f"it leaves {', '.join(sorted(cls.__abstractmethods__))} abstract"
    else:
        return cls
    raise ValueError(f"{path} is no scheduler ({why}; docs/development.md says what a scheduler provides)")


def allowed_keys(name: object) -> list[str]:
    """The keys a scheduler of type `name` takes (an unknown key's message lists them)."""
    try:
        return list(resolve(name).model_fields)
    except ValueError:
        return ["type"]


def section(value: Any) -> Any:
    """The study file's `scheduler` mapping -> an instance of the class its `type` names, checked
    by that class's own model (pydantic's before-validator of the key). Its errors travel as one
    `scheduler_section` error (locations inside the section, sweep/study/messages.py unwraps it)."""
    if not isinstance(value, dict):
        return value  # the key's own rule says it must be a mapping
    if "type" not in value:
        raise _section_errors([{"type": "missing", "loc": ("type",), "msg": "Field required", "input": value}])
    try:
        cls = resolve(value["type"])
    except ValueError as exc:
        raise _section_errors([{"type": "scheduler_type", "loc": ("type",), "msg": str(exc),
                                "input": value["type"]}]) from None
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        raise _section_errors([_elsewhere(cls, value, e) or e for e in exc.errors()]) from None


def _elsewhere(cls: type[SchedulerKeys], value: dict[str, Any], err: Any) -> dict[str, Any] | None:
    """An unknown key that is a key of another registered scheduler: said so (`population: only
    with type pbt (keys of type asha: ...)`); None for any other error."""
    if err["type"] != "extra_forbidden" or len(err["loc"]) != 1:
        return None
    key = err["loc"][0]
    owners = [name for name in REGISTRY if key in allowed_keys(name)]
    if not owners:
        return None
    own = ", ".join(k for k in cls.model_fields if k != "type")
    either = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} or {owners[-1]}"
    message = (f"{key}: only with type {either} (keys of type {value['type']}: {own}), "
               f"got {value[key]!r}")
    return {"type": "value_error", "loc": (), "msg": message, "input": value, "ctx": {"error": ValueError(message)}}


def _section_errors(errors: list[Any]) -> PydanticCustomError:
    return PydanticCustomError("scheduler_section", "the scheduler section breaks a rule", {"errors": errors})
