"""The package's shape: no import cycle among sweep's modules (lazy imports included), and the
trial record's attribute keys spelled only in sweep/store/record.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SWEEP = Path(__file__).resolve().parents[1] / "sweep"

# The families, lowest first: a module may import sweep's core (the top-level errors, words,
# results, internals) and the families below its own, never one above (docs/development.md).
FAMILIES = ["host", "trial", "study", "store", "checkpoints", "train", "schedulers", "tracking", "run", "commands"]
CORE = {"errors", "words", "results", "internals"}
TOP = {"api", "__main__", "__init__"}  # the package's surface: may import everything


def _modules() -> dict[str, Path]:
    """dotted name below sweep (e.g. "store.session", "errors") -> its file; a family's __init__ is the family."""
    out = {}
    for path in SWEEP.rglob("*.py"):
        parts = path.relative_to(SWEEP).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports() -> dict[str, set[str]]:
    """module -> the sweep modules it imports anywhere in its file (top level, in functions, under TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("sweep."):
                base = node.module[len("sweep."):] if node.module != "sweep" else ""
                for alias in node.names:
                    target = resolve(f"{base}.{alias.name}".strip("."))
                    deps |= {target} if target else set()
                if base:
                    deps |= {resolve(base)} - {None}
            elif isinstance(node, ast.Import):
                deps |= {resolve(a.name[len("sweep."):]) for a in node.names if a.name.startswith("sweep.")} - {None}
        graph[name] = deps - {name, "__init__"}
    return graph


def _family(module: str) -> str:
    return module.split(".")[0] if module.split(".")[0] in FAMILIES else module


def _rank(module: str) -> int:
    family = _family(module)
    if family in CORE:
        return -1
    return FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if _family(d) != _family(m) and _rank(d) > _rank(m))
def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_among_sweeps_modules():
    graph = _imports()
    assert "store.record" in graph["commands.status"] and "run.worker" in graph["run.pool"]  # lazy imports too
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_every_module_is_in_a_family_or_the_core():
    loose = sorted(m for m in _modules() if _family(m) not in FAMILIES and m not in CORE | TOP)
    assert not loose, f"put these in a family (or name them in CORE): {loose}"


def test_no_family_imports_a_family_above_it():
    """Lazy and TYPE_CHECKING imports included: each family's __init__ docstring says what it may import."""
    violations = set(_layer_violations(_imports())) - UPWARD_TODO
    assert not violations, sorted(violations)


# Imports upwards that the move into families found, each being removed (issue 38); must end empty.
UPWARD_TODO: set[str] = set()


def test_the_registries_name_classes_of_their_own_family_only():
    """The two registries name their classes by import path (the plugin point: the study family finds a
    scheduler without importing the family above it), which the import scan cannot see: each entry is a
    class of the family it registers, and it imports."""
    import importlib

    from sweep.checkpoints import tiers
    from sweep.study import scheduler_keys

    for registry, family in ((scheduler_keys.REGISTRY, "sweep.schedulers."), (tiers.BUILT_IN, "sweep.checkpoints.")):
        for name, path in registry.items():
            module, _, cls = path.partition(":")
            assert module.startswith(family) and isinstance(getattr(importlib.import_module(module), cls), type), name


def test_the_layering_check_finds_an_import_upwards():
    graph = {"store.session": {"checkpoints.folder", "study.config", "errors"}, "host.slots": {"words"},
             "commands.status": {"store.record"}, "run.worker": {"commands.export"}}
    assert _layer_violations(graph) == ["run.worker -> commands.export", "store.session -> checkpoints.folder"]


def test_each_family_says_its_job_and_what_it_may_import():
    for family in FAMILIES:
        doc = ast.get_docstring(ast.parse((SWEEP / family / "__init__.py").read_text())) or ""
        lower = FAMILIES[:FAMILIES.index(family)]
        assert "May import:" in doc and all(f in doc for f in lower), (family, doc)


# Each built-in scheduler's name, and the one module that may compare a value with it (issue 38: the
# run loop, plan, status, export and the fingerprint ask the scheduler object, sweep/schedulers/base.py).
SCHEDULER_MODULES = {"asha": "schedulers/asha.py", "hyperband": "schedulers/hyperband.py", "pbt": "schedulers/pbt.py",
                     "freeze_thaw": "schedulers/freeze_thaw.py"}


def _name_comparisons(source: str) -> list[tuple[str, int]]:
    """(scheduler name, line) of each comparison with it: `== "pbt"`, `in ("asha", ...)`, `case "pbt"`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        for operand in operands:
            elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(e.value, node.lineno) for e in elements
                      if isinstance(e, ast.Constant) and e.value in SCHEDULER_MODULES]
    return found


def test_scheduler_names_are_compared_only_in_their_own_modules():
    found = [f"{path.relative_to(SWEEP)}:{line}: {name!r}" for path in SWEEP.rglob("*.py")
             for name, line in _name_comparisons(path.read_text())
             if str(path.relative_to(SWEEP)) != SCHEDULER_MODULES[name]]
    assert not found, f"ask the scheduler (sweep/schedulers/base.py) instead: {found}"


def test_the_scheduler_name_check_finds_a_comparison():
    source = 'if s.type == "pbt" or kind in ("asha", "median"):\n    pass\nmatch k:\n    case "hyperband": pass\n'
    assert _name_comparisons(source) == [("pbt", 1), ("asha", 1), ("hyperband", 4)]


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_trial_attribute_keys_are_spelled_only_in_the_record_module():
    keys = ("checkpoint_dir", "best_step", "best_value", "last_step", "resumed_from", "failures", "eval:", "compiles",
            "data_shapes", "continued_from", "devices")
    pattern = re.compile(r"(user_attrs(\.get)?[\[(]|set_user_attr\()\s*\"(" + "|".join(map(re.escape, keys)) + ")")
    found = [f"{p.name}: {m.group(0)}" for p in SWEEP.rglob("*.py") if p.name != "record.py"
             for m in pattern.finditer(p.read_text())]
    assert not found, found


def test_study_session_shows_only_its_documented_methods():
    import sweep

    public = {name for name in dir(sweep.StudySession) if not name.startswith("_")}
    assert public == {"close", "config", "continue_", "continued", "drill", "export", "load_best", "plan", "plot",
                      "replay", "retry", "run", "status", "summary"}


def test_errors_users_catch_are_exported_from_the_package():
    import sweep
    from sweep import errors

    caught = {name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, Exception)}
    # The rest are raised inside a run and turned into states or exit codes before they reach a user.
    assert caught - {"NonFiniteMetric", "TakenOver", "RemoteFault"} <= set(sweep.__all__)
    assert all(getattr(sweep, name) is getattr(errors, name) for name in caught & set(sweep.__all__))


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(SWEEP)): n for p in SWEEP.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these along their jobs: {long}"


def test_every_module_says_its_one_job_in_its_docstring():
    """A module is split by job, not to meet the line cap: its docstring's first sentence names the job (and a
    test folder mirrors each family: tests/<family>/ for sweep/<family>/)."""
    silent = [str(p.relative_to(SWEEP)) for p in SWEEP.rglob("*.py")
              if len((ast.get_docstring(ast.parse(p.read_text())) or "").split()) < 5]
    assert not silent, f"say what these modules are for: {silent}"
    tests = Path(__file__).resolve().parent
    assert {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))} == set(FAMILIES)


def test_no_message_hedges_its_plural_with_s_in_parentheses():
    """What sweep prints counts in words ('1 trial', '2 trials': sweep/words.py), never 'trial(s)'."""
    hedged = []
    for path in SWEEP.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        hedged += [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                   and re.search(r"[a-z]\(s\)", n.value)]
    assert not hedged, hedged


# f-strings that put a number before a plural noun by hand, where the number can never be 1
COUNTS_NEVER_ONE = {
    "compiled.py": "train.devices: {devices} devices",  # raised only where devices > 1 must divide
    "continuation.py": "{steps} steps",  # a companion study's length: more steps than a trained trial's
    "status.py": "continued to {steps} steps",  # idem
    "progress.py": "steps/s",  # a rate
    "tiers.py": "bytes in",  # a fetched file's size in a mismatch message
    "stream.py": "bytes",  # a serialized state's size
    "slots.py": "{n_jobs} workers x",  # more workers than the host's slots: at least 2
}


def test_counts_in_messages_use_words_count():
    """'1 trial', never '1 trials' (issue 33 item 6: the summary printed "Pareto front: 1 trials" and
    the drill "work lost 1 steps"): a number formatted before a plural noun goes through
    words.count, except where it cannot be 1 (listed above, with why)."""
    nouns = "trials|steps|workers|devices|saves|evaluations|interruptions|runs|hosts|files|arrays|bytes|seconds|checkpoints"
    found = []
    for path in SWEEP.rglob("*.py"):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"\{[^{}]+\} (%s)\b" % nouns, line):
                allowed = COUNTS_NEVER_ONE.get(path.name)
                if not (allowed and allowed in line):
                    found.append(f"{path.name}:{lineno}: {m.group(0)}")
    assert not found, found


def test_test_files_hold_no_trial_of_their_own_only_tests_trials_does():
    """Every trial module the tests write lives once, in tests/trials/ (files.write_trial copies it
    under a test's own name, with constants changed). Outside it, a string literal that is a trial
    (it defines a protocol function and defines, imports or star-imports HYPERPARAMETERS) may be
    neither written from scratch (its own `HYPERPARAMETERS = ...`) nor 70% alike, line by line of
    its code, to a module of tests/trials/ or to such a literal in another test file. The one-off
    trials derived from the repository's trials (a data() that raises, noisy data, a wrong return
    type) are below 50%; the copies this replaced were 80% and above."""
    import difflib
    import textwrap

    tests = Path(__file__).resolve().parent
    # A deliberately broken or misbehaving trial that must stay beside its test: its file, and why.
    allowed: dict[str, str] = {}
    protocol = {"data", "init", "optimizer", "batch", "loss", "evaluate", "train_batches", "val_batches", "test"}

    def trial_code(text: str) -> tuple[bool, list[str]] | None:
        """(written from scratch, its code's lines without docstring or comments), or None if no trial."""
        try:
            body = ast.parse(textwrap.dedent(text)).body
        except (SyntaxError, ValueError):  # not Python, or not encodable (the config fuzzer's strings)
            return None
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        assigned = {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        imported = {a.asname or a.name for n in body if isinstance(n, ast.ImportFrom) for a in n.names}
        functions = {n.name for n in body if isinstance(n, ast.FunctionDef)}
        if not functions & protocol or not {"HYPERPARAMETERS", "*"} & (assigned | imported):
            return None
        return "HYPERPARAMETERS" in assigned, ast.unparse(ast.Module(body=body, type_ignores=[])).splitlines()

    shared = {f"trials/{p.name}": trial_code(p.read_text()) for p in sorted((tests / "trials").glob("*.py"))}
    inline: dict[str, tuple[bool, list[str]]] = {}
    for path in sorted(p for p in tests.rglob("*.py") if "trials" not in p.relative_to(tests).parts):
        if path.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (code := trial_code(node.value)):
                inline[f"{path.name}:{node.lineno}"] = code
    own = [where for where, (scratch, _) in inline.items() if scratch]
    assert not own, f"trials written in test files: move them to tests/trials/ and use files.write_trial: {own}"
    others = {where: code[1] for where, code in {**shared, **inline}.items() if code}
    alike = [(where, other, round(ratio, 2)) for where, (_, lines) in inline.items() for other, theirs in others.items()
             if other.split(":")[0] != where.split(":")[0]
             and (ratio := difflib.SequenceMatcher(None, lines, theirs).ratio()) >= 0.7]
    assert not alike, f"copies of a trial (use tests/trials/ and files.write_trial): {alike}"


@pytest.mark.slow  # a fresh interpreter
def test_readers_of_a_study_import_neither_jax_nor_orbax():
    """Listing a trial's steps needs no JAX (sweep/checkpoints/steps.py): the modules that read a study
    (status, plan, the live view, the bucket's tier, the disk budget, export) import neither JAX
    nor Orbax until a checkpoint is opened (issue 30: checkpoints.py's step listing imported both)."""
    import subprocess
    import sys

    readers = ["commands.status", "run.plan", "commands.progress", "checkpoints.remote", "checkpoints.retention",
               "commands.export", "commands.continuation", "checkpoints.steps"]
    code = ("import sys; " + "; ".join(f"import sweep.{m}" for m in readers)
            + "; print(sorted(m for m in ('jax', 'orbax', 'orbax.checkpoint') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SWEEP.parent, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# Private names of the Python runtime that sweep uses on purpose (they are documented, not internals).
RUNTIME_PRIVATE = {"os._exit", "sys._getframe"}
PRIVATE_MODULES = {"_lazy_random_state", "xla_bridge"}  # named privately elsewhere too (jax.lib.xla_bridge)
THIRD_PARTY = ("optuna", "jax", "jaxlib", "orbax")


def _private_uses(source: str) -> list[str]:
    """Where `source` touches a private internal: an import of an Optuna/JAX/jaxlib/Orbax module path
    with a `_x` part (or a known private module), an attribute `_x` read or written on anything
    but `self`/`cls` (`trial._trial_id`, `study._storage`), or `getattr(obj, "_x")`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            paths = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] if node.module else []
            found += [f"{node.lineno}: import {p}" for p in paths if p.split(".")[0] in THIRD_PARTY
                      and any(part.startswith("_") or part in PRIVATE_MODULES for part in p.split(".")[1:])]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            text = ast.unparse(node)
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and text not in RUNTIME_PRIVATE:
                found.append(f"{node.lineno}: {text}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


# getattr on private attributes outside Optuna, JAX and Orbax: module -> the attribute, with why
PRIVATE_ELSEWHERE = {"run/pool.py": "_processes"}  # concurrent.futures: a pool's processes, to end them on a kill


def test_private_internals_of_optuna_jax_and_orbax_appear_only_in_sweep_internals():
    """sweep/internals.py is the one module that touches them, each use with why (issue 38): a
    release of Optuna, JAX or Orbax that changes one breaks that module only; a private attribute
    of another of sweep's objects is not touched from outside either."""
    found = {str(p.relative_to(SWEEP)): uses for p in SWEEP.rglob("*.py") if p.name != "internals.py"
             if (uses := [u for u in _private_uses(p.read_text())
                          if PRIVATE_ELSEWHERE.get(str(p.relative_to(SWEEP)), "\0") not in u])}
    assert not found, f"move these into sweep/internals.py, with why: {found}"
    assert len(_private_uses((SWEEP / "internals.py").read_text())) >= 6  # what it holds is what the check finds


def test_the_private_internals_check_finds_one():
    source = ("from optuna.storages._rdb import models\nimport jax._src.xla_bridge\nfrom jax.lib import xla_bridge\n"
              "from optuna.samplers import _lazy_random_state\nfrom optuna.storages import RDBStorage\n"
              "def f(t, study, self):\n    self._x = t._trial_id + study._study_id\n    study._storage.go()\n"
              "    os._exit(getattr(t, '_cached', 0) + getattr(t, '__len__'))\n")
    assert _private_uses(source) == [
        "1: import optuna.storages._rdb.models", "2: import jax._src.xla_bridge", "3: import jax.lib.xla_bridge",
        "4: import optuna.samplers._lazy_random_state", "7: t._trial_id", "7: study._study_id", "8: study._storage",
        "9: getattr(t, '_cached', 0)"]


def _session_writes(source: str) -> list[str]:
    """Where `source` sets an attribute of a session from outside (`session.x = ...`, `self._session.x += ...`,
    `setattr(session, ...)`, monkeypatch's too): a session's fields are written by its own methods only."""
    def is_session(node: ast.AST) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name == "session" or name.endswith("_session")

    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, (ast.Attribute, ast.Subscript)) and isinstance(t.value, ast.AST):
                    owner = t.value if isinstance(t, ast.Attribute) else getattr(t.value, "value", None)
                    if owner is not None and is_session(owner):
                        found.append(f"{node.lineno}: {ast.unparse(t)}")
        if (isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "setattr" or getattr(node.func, "attr", None)
                                            == "setattr") and node.args and is_session(node.args[0])):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda where: int(where.split(":")[0]))


def test_no_module_sets_a_sessions_attributes_from_outside():
    """The session's fields are written by its own methods (issue 38: enqueue, the worker, the API and a
    test helper wrote them): a new owner is a method of the session (`all_enqueued`, `keep_start_plan`)
    or a watcher of its progress reports (`watch_steps`), never an assignment from outside."""
    tests = Path(__file__).resolve().parent
    files = [p for p in [*SWEEP.rglob("*.py"), *tests.rglob("*.py")] if p != SWEEP / "store" / "session.py"]
    found = {p.name: writes for p in files if (writes := _session_writes(p.read_text()))}
    assert not found, found


def test_the_session_write_check_finds_one():
    source = ("session.enqueue_done = True\nself._session.start_plan = plan\na, session.x = 1, 2\n"
              "internal_session.on_step += 1\nmonkeypatch.setattr(session, 'on_step', f)\nsession.steps[3] = 1\n"
              "self.session_count = 1\nsession.claims.x = 1\n")
    assert _session_writes(source) == ["1: session.enqueue_done", "2: self._session.start_plan", "3: session.x",
                                       "4: internal_session.on_step", "5: monkeypatch.setattr(session, 'on_step', f)",
                                       "6: session.steps[3]"]


def _any_sessions(source: str) -> list[str]:
    """Parameters that receive a session (named `session` or `..._session`) typed Any or not typed at all."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if (arg.arg == "session" or arg.arg.endswith("_session")) and \
                        (arg.annotation is None or "Any" in ast.unparse(arg.annotation)):
                    found.append(f"{node.lineno}: {node.name}({arg.arg}: {ast.unparse(arg.annotation) if arg.annotation else ''})")
    return found


def test_no_parameter_that_receives_a_session_is_typed_any():
    """A session is a `Session` (or the API's `StudySession`) to every function that takes one, so that the type
    checker sees what it is called for (issue 38: `session: Any` hid a cycle back into the session)."""
    files = [*SWEEP.rglob("*.py"), *Path(__file__).resolve().parent.rglob("*.py")]  # and the tests
    found = {str(p.relative_to(SWEEP.parent)): uses for p in files if (uses := _any_sessions(p.read_text()))}
    assert not found, found


def test_the_any_session_check_finds_one():
    source = "def f(session: Any, other_session, x: Any, session2: Session) -> None: ...\ndef g(session: Session): ...\n"
    assert _any_sessions(source) == ["1: f(session: Any)", "1: f(other_session: )"]


def _sleeps_then_asserts(source: str) -> list[int]:
    """Lines of `time.sleep(...)`/`sleep(...)` statements that an `assert` follows in the same block
    with no loop between: a test that sleeps and then asserts on state bets that the wait was long
    enough. A sleep in a polling loop (the loop goes round again) or before a wait is fine, and so is
    a random moment drawn from a seeded generator named `rng` (reported with its seed on failure)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for body in (getattr(node, field, None) for field in ("body", "orelse", "finalbody")):
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                call = stmt.value if isinstance(stmt, ast.Expr) else None
                if not (isinstance(call, ast.Call) and ast.unparse(call.func) in {"time.sleep", "sleep"}):
                    continue
                if "rng." in ast.unparse(call):
                    continue
                for after in body[i + 1:]:
                    if isinstance(after, (ast.While, ast.For, ast.With)):
                        break
                    if isinstance(after, ast.Assert):
                        found.append(stmt.lineno)
                        break
    return found


def test_no_test_sleeps_and_then_asserts_on_state():
    """Tests wait for an event they can observe (a log line, a state in the storage, a file), with
    a generous deadline; never sleep a while and then assert (issue 39: the load-dependent failures)."""
    tests = Path(__file__).resolve().parent
    found = [f"{path.relative_to(tests)}:{line}" for path in sorted(tests.rglob("*.py"))
             for line in _sleeps_then_asserts(path.read_text())]
    assert not found, f"a sleep then an assert (wait for an event instead): {found}"


def test_the_sleep_then_assert_check_finds_one():
    slept = "def test_x(proc):\n    time.sleep(0.3)\n    proc.signal(15)\n    assert proc.finish() == 143\n"
    polled = "def test_y(proc):\n    while not proc.done():\n        time.sleep(0.01)\n    assert proc.code == 0\n"
    assert _sleeps_then_asserts(slept) == [2] and _sleeps_then_asserts(polled) == []
