"""The docs work as written: study files load, commands parse (the cheap ones run), the API's signatures match."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_blocks import REPO, blocks, example, page_name, sweep_commands

import sweep
from conftest import cli
from sweep.__main__ import _parser
from sweep.store.samplers import check_config
from sweep.study import config as config_lib

REFERENCE = (REPO / "docs" / "reference.md").read_text()
EXAMPLE_STUDY = yaml.safe_load((REPO / "studies" / "digits_mlp.yaml").read_text())
YAML_BLOCKS = blocks("yaml")
COMMANDS = sweep_commands()
# The commands that train a whole study, or kill and restart one, are run by their own tests
# (test_readme.py, test_drill.py); every other documented command on the example runs below.
NOT_RUN_HERE = {"run", "drill"}


@pytest.mark.parametrize("page, line, text", YAML_BLOCKS, ids=[f"{p}:{n}" for p, n, _ in YAML_BLOCKS])
def test_docs_yaml_blocks_load_as_study_files(page, line, text, tmp_path, monkeypatch):
    """A whole study file loads as it is; a fragment (a few keys) on top of the example study."""
    raw = yaml.safe_load(text)
    assert isinstance(raw, dict), f"{page}:{line}: not a mapping of study keys"
    if not {"name", "trial"} <= set(raw):
        raw = {**EXAMPLE_STUDY, **raw}
    monkeypatch.chdir(tmp_path)
    for name in re.findall(r"\$\{(\w+)\}", text):  # a documented ${VAR}: set, as the page tells the user to
        monkeypatch.setenv(name, "docs-example-value")
    if raw["trial"] == "my_trial":  # the README's copyable trial, saved beside the study as it says
        (tmp_path / "my_trial.py").write_text(example("my_trial.py"))
    config = config_lib.from_dict(raw, origin=f"{page}:{line}")
    check_config(config)  # sampler and pruner arguments against Optuna's classes, as `run` does
    assert not list(tmp_path.glob("runs")), "loading a study file created something"


def test_docs_json_blocks_are_json():
    for page, line, text in blocks("json"):
        assert isinstance(json.loads(text), dict), f"{page}:{line}"


def test_docs_show_yaml_blocks():
    pages = {page for page, _, _ in YAML_BLOCKS}
    assert {"README.md", "docs/reference.md", "docs/many-hosts.md", "docs/study-file.md"} <= pages


@pytest.mark.parametrize("page, line, argv", COMMANDS, ids=[f"{p}:{n}" for p, n, _ in COMMANDS])
def test_docs_sweep_commands_parse(page, line, argv):
    """Every `python -m sweep ...` in a bash block is a real command line, on a study file that exists."""
    args = _parser().parse_args(argv)
    study = Path(args.study_file)
    if study.parts[0] == "studies":
        assert (REPO / study).is_file(), f"{page}:{line}: {study} does not exist"


def test_docs_commands_cover_the_readers():
    commands = {argv[0] for _, _, argv in COMMANDS}
    assert {"run", "status", "export", "plot", "plan", "continue", "drill"} <= commands, commands


@pytest.mark.slow
def test_docs_cheap_commands_run_for_real(tmp_path, monkeypatch, capsys):
    """Every documented command on the example study that does not train a study of its own, run
    as written on a small copy of it (2 trials of 300 steps) after `run`. In this process, through
    the command line's `main` (what is tested is each command as documented, not a process
    boundary: the other tests start processes, and each command's own tests run it as one)."""
    (tmp_path / "studies").mkdir()
    small = {**EXAMPLE_STUDY, "n_trials": 2, "train": {"steps": 300, "eval_every": 50, "seed": 0}}
    (tmp_path / "studies" / "digits_mlp.yaml").write_text(yaml.safe_dump(small))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "run", "studies/digits_mlp.yaml")
    assert code == 0, err
    on_example = [(page, line, argv) for page, line, argv in COMMANDS
                  if argv[1:2] == ["studies/digits_mlp.yaml"] and argv[0] not in NOT_RUN_HERE]
    # `continue` first: the readers with --continued read what it trained.
    on_example.sort(key=lambda c: "--continued" in c[2])
    assert len(on_example) >= 5
    for page, line, argv in on_example:
        code, _, err = cli(capsys, *argv)
        assert code == 0, f"{page}:{line}: {' '.join(argv)}\n{err}"
    code, out, err = cli(capsys, "status", "studies/digits_mlp.yaml", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert set(status) == _fields("The study:") - {"objectives"}  # only with several objectives
    # only with checkpoint.remote / with constraints / with several objectives / with scheduler pbt
    # or freeze_thaw
    conditional = {"remote_step", "feasible", "values", "pareto", "lineage", "params_in_force", "freeze_thaw",
                   "checkpoint_auto"}  # with checkpoint.every: auto only
    assert {key for t in status["trials"] for key in t} == _fields("Each trial:") - conditional
    assert set(status["trials"][0]["ledger"]) == _fields("### The ledger")
    index = json.loads((tmp_path / "export" / "index.json").read_text())
    meta = json.loads((tmp_path / "export" / index["trials"][0]["dir"] / "meta.json").read_text())
    assert set(index) <= {"study", "metric", "direction", "trials", "removed", "objectives"}
    assert set(meta) == set(index["trials"][0]) == _fields("| meta.json / index entry field |") - conditional


def _fields(marker: str) -> set[str]:
    """The names in the first column of the table of docs/reference.md that follows `marker`."""
    rows = REFERENCE.split(marker, 1)[1].lstrip("\n").splitlines()
    if not rows[0].startswith("|"):
        rows = rows[rows.index(next(r for r in rows if r.startswith("|"))):]
    names: set[str] = set()
    for row in rows:
        if not row.startswith("|"):
            break
        first = row.split("|")[1]
        names.update(re.findall(r"`(\w+)`", first))
    return names


def _api_block() -> list[str]:
    section = REFERENCE.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/reference.md's Python API section has no signature block"
    return [line.strip() for line in code.group(1).splitlines() if line.strip()]


def _resolve(dotted: str) -> Any:
    owner, name = dotted.split(".")
    return getattr(getattr(sweep, owner) if owner != "sweep" else sweep, name)


def _plain(fn: Any) -> str:
    """The signature as documented: no annotations, no `self`, no private (underscored) parameters."""
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()
              if p.name != "self" and not p.name.startswith("_")]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def test_reference_api_signatures_match_the_code():
    documented = _api_block()
    assert len(documented) >= 10
    for line in documented:
        m = re.fullmatch(r"((?:sweep|StudySession)\.\w+)(\(.*\))", line)
        assert m, f"docs/reference.md: not a signature: {line}"
        assert _plain(_resolve(m.group(1))) == m.group(2), f"docs/reference.md documents {line}"


def test_reference_names_everything_sweep_exports():
    for name in sweep.__all__:
        assert f"`sweep.{name}" in REFERENCE or f"sweep.{name}(" in REFERENCE or f"`{name}`" in REFERENCE, name


def _top_level_items(annotation: str) -> int:
    depth, items = 0, 1
    for ch in annotation:
        depth += ch == "["
        depth -= ch == "]"
        items += ch == "," and depth == 0
    return items


def test_reference_tuple_returns_match_the_code():
    """A row that says a function returns `(a, b)` names a function annotated to return a pair."""
    rows = re.findall(r"^\| `((?:sweep|StudySession)\.\w+)\([^`]*\)` \| `\(([\w, ]+)\)` \|", REFERENCE, re.M)
    assert ("sweep.load_variables", "variables, meta") in rows, rows
    for dotted, names in rows:
        returned = str(inspect.signature(_resolve(dotted)).return_annotation)
        assert returned.startswith("tuple[") and returned.endswith("]"), (dotted, returned)
        assert _top_level_items(returned[6:-1]) == len(names.split(",")), (dotted, returned)


def _inline_calls() -> list[tuple[str, str, str]]:
    """(page, dotted name, arguments) of every call written with its arguments in running text:
    `sweep.X(...)` anywhere, also wrapped over lines, and in the README the session's methods
    written bare (`run(n_jobs=None, ...)`, `load_best(trial=None)`)."""
    out = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for m in re.finditer(r"`((?:sweep\.)?\w+)(\([^`()]*\))`", page.read_text()):
            name, args = m.group(1), re.sub(r"\s*\n\s*", " ", m.group(2))
            if args == "(...)":
                continue  # elided on purpose: no claim
            if not name.startswith("sweep."):
                if page.name != "README.md" or not hasattr(sweep.StudySession, name):
                    continue  # a trial's function (`loss(hp, ...)`), not sweep's
                name = f"StudySession.{name}"
            out.append((page_name(page), name, args))
    return out


INLINE_CALLS = _inline_calls()


@pytest.mark.parametrize("page, name, args", INLINE_CALLS, ids=[f"{p}:{n}{a}" for p, n, a in INLINE_CALLS])
def test_docs_inline_signatures_match_the_code(page, name, args):
    """`sweep.load_variables(path)` written in running text is the function's signature too."""
    assert _plain(_resolve(name)) == args, f"{page} writes {name}{args}"


def test_the_readme_s_session_methods_and_wrapped_calls_are_checked_too():
    names = {name for page, name, _ in INLINE_CALLS if page == "README.md"}
    assert {"StudySession.run", "StudySession.export", "StudySession.load_best", "sweep.load_best"} <= names, names


RETURN_CLAIMS = [(page_name(page), m.group(1), m.group(2)) for page in [REPO / "README.md", *sorted(
    (REPO / "docs").glob("*.md"))] for m in re.finditer(r"`(sweep\.\w+)\([^`]*\)`,?\s+(?:which\s+)?returns\s+`([^`]+)`",
                                                        page.read_text())]


def test_docs_prose_return_claims_match_the_code():
    """"`sweep.load_variables(path)` returns `(variables, meta)`" in running text (line breaks
    included): a pair where the function returns a pair, of as many items, and no pair otherwise
    (docs/trials.md said it returned the variables alone)."""
    assert ("docs/export.md", "sweep.load_variables", "(variables, meta)") in RETURN_CLAIMS, RETURN_CLAIMS
    for page, name, claim in RETURN_CLAIMS:
        returned = str(inspect.signature(_resolve(name)).return_annotation)
        if returned.startswith("tuple["):
            assert claim.startswith("(") and claim.endswith(")"), f"{page}: {name} returns {returned}, not {claim}"
            assert len(claim[1:-1].split(",")) == _top_level_items(returned[6:-1]), f"{page}: {name} returns {returned}"
        else:
            assert not claim.startswith("("), f"{page}: {name} returns {returned}, not {claim}"


def test_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_docs_links_point_to_shipped_files_and_headings():
    """Every relative link of the README and docs/ names a file of the repository (and a heading of it)."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.is_file(), f"{page_name(page)} links to {target}: no such file"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page_name(page)} links to {target}: no such heading"


def test_no_document_outside_the_repository_is_cited():
    """The user-facing reference is docs/reference.md; nothing points to a document the repository lacks."""
    for file in [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "sweep").rglob("*.py")]:
        text = file.read_text()
        assert not re.search(r"\bCONTRACT\b|the contract", text, re.I), f"{file.relative_to(REPO)} cites the contract"
    parser = _parser()
    status = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["status"]
    assert "docs/reference.md" in parser.format_help()  # python -m sweep --help
    assert "docs/reference.md" in status.format_help()  # python -m sweep status --help


API_BLOCK_HEAD = "sweep.open("  # docs/reference.md's Python API block: signatures, checked above


def test_every_python_block_is_a_named_example_a_sketch_or_the_api_block():
    """A python block of the README or docs/ runs in a test (`<!-- example: NAME -->`), or says it is
    an outline of a file the tests run (`<!-- sketch: path -->`), or is the reference's signatures."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            before = text[:m.start()].rstrip("\n").splitlines()[-1]
            where = f"{page_name(page)}:{text[:m.start()].count(chr(10)) + 1}"
            if m.group(1).lstrip().startswith(API_BLOCK_HEAD):
                continue  # signatures, not a program
            ast.parse(m.group(1))  # at least it is Python
            sketch = re.fullmatch(r"<!-- sketch: (\S+) -->", before)
            if sketch:
                assert (REPO / sketch.group(1)).is_file(), f"{where}: the sketch's file {sketch.group(1)} is missing"
            else:
                assert re.fullmatch(r"<!-- example: \S+ -->", before), \
                    f"{where}: a python block that no test runs (name it <!-- example: NAME -->)"


def test_every_named_example_is_run_by_a_test():
    names = {m.group(1) for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]
             for m in re.finditer(r"^<!-- example: (\S+) -->$", page.read_text(), re.M)}
    tests = " ".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != "doc_blocks.py")
    assert names and not [n for n in names if f'"{n}"' not in tests], names


def test_enqueue_with_optuna_example_adds_a_waiting_trial(tmp_path, monkeypatch):
    import optuna

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "digits-mlp").mkdir(parents=True)
    optuna.create_study(study_name="digits-mlp", storage="sqlite:///runs/digits-mlp/study.db")
    exec(compile(example("enqueue_with_optuna.py"), "docs/search.md", "exec"), {})
    (trial,) = optuna.load_study(study_name="digits-mlp", storage="sqlite:///runs/digits-mlp/study.db").trials
    assert trial.state == optuna.trial.TrialState.WAITING
    assert trial.system_attrs["fixed_params"] == {"learning_rate": 0.02, "hidden": 32}  # Optuna's enqueue


def test_search_space_example_samples_exactly_the_active_parameters():
    import optuna

    scope: dict[str, Any] = {}
    exec(compile(example("search_space.py"), "docs/search.md", "exec"), scope)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda trial: scope["search_space"](trial) or 0.0, n_trials=12)
    seen = {frozenset(t.params) for t in study.trials}
    assert seen == {frozenset({"optimizer", "learning_rate", "momentum"}),
                    frozenset({"optimizer", "learning_rate", "b1"})}
    assert all(("momentum" in t.params) == (t.params["optimizer"] == "sgd") for t in study.trials)
