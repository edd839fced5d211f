"""Study files fuzzed (hypothesis): every file is either a valid study or one line of exit-2 error
naming the file; never a traceback, another exit code, or an object YAML was told to build."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import BASE_STUDY, run_cli
from sweep.errors import ConfigError
from sweep.store.samplers import check_config
from sweep.study import config as config_lib
from sweep.study import fingerprint

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])


def checked(path: Path) -> config_lib.Config | None:
    """Load `path` as `run` does before it creates anything; the config, or None after a proper error."""
    try:
        config = config_lib.load(path)
        check_config(config)  # sampler and pruner arguments against Optuna's classes
        json.dumps(fingerprint.meaning(config))  # what run stores with the study must be JSON
        return config
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{path}: "), message
        assert "\n" not in message and "\r" not in message, message
        message.encode("utf-8")  # printable on a UTF-8 stderr (no lone surrogate)
        assert len(message) < 2000, message[:200]
        return None


@pytest.fixture
def study_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "study.yaml"


# --- values: YAML's own types, edge numbers, unicode ------------------------------------------------

NUMBERS = st.one_of(st.integers(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -1, 1, 2 ** 63, 1e308]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=30),
                    st.sampled_from(["", "tpe", "grid", "float", "int", "categorical", "minimize", "val_loss",
                                     "${DB_PASSWORD}", "$${X}", "${", "sqlite:///x.db", "s3://b/x", "\u0000", "ü",
                                     "\ud83d\ude00", "\n", "50GB"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.one_of(st.text(max_size=12), SCALARS),
                                                                       inner, max_size=4)), max_leaves=12)
KEYS = [("name",), ("trial",), ("storage",), ("workdir",), ("n_trials",), ("timeout",), ("max_retries",),
        ("objective",), ("objective", "metric"), ("objective", "direction"), ("sampler",), ("sampler", "type"),
        ("sampler", "seed"), ("sampler", "n_startup_trials"), ("pruner",), ("pruner", "type"),
        ("pruner", "n_warmup_steps"), ("search_space",), ("search_space", "learning_rate"),
        ("search_space", "learning_rate", "low"), ("search_space", "learning_rate", "high"),
        ("search_space", "learning_rate", "log"), ("search_space", "learning_rate", "step"),
        ("search_space", "learning_rate", "values"), ("search_space", "hidden", "type"),
        ("search_space", "hidden", "step"), ("search_space", "hidden", "choices"), ("fixed",),
        ("fixed", "batch_size"), ("train",), ("train", "steps"), ("train", "eval_every"), ("train", "devices"),
        ("checkpoint",), ("checkpoint", "every_steps"), ("checkpoint", "every_seconds"), ("checkpoint", "keep_last"),
        ("checkpoint", "max_disk"), ("checkpoint", "remote"), ("checkpoint", "max_write_share"), ("parallel",),
        ("parallel", "n_jobs"), ("parallel", "backend"), ("parallel", "address"), ("data_timeout_seconds",),
        ("unknown_key",), ("search_space", "new_param")]


def mutated(changes: list[tuple[tuple[str, ...], Any]], removed: list[tuple[str, ...]]) -> dict[str, Any]:
    """BASE_STUDY (a valid digits study) with values replaced or added at `changes`, keys removed."""
    data = json.loads(json.dumps(BASE_STUDY))
    for key, value in changes:
        node = data
        for part in key[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[key[-1]] = value
    for key in removed:
        node = data
        for part in key[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key[-1], None)
    return data


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=3),
       removed=st.lists(st.sampled_from(KEYS), max_size=2))
# Found by CI: an int too large for a float once overflowed the range check (a traceback).
@example(changes=[(("search_space", "hidden", "step"), 10 ** 300)], removed=[])
def test_a_study_with_any_values_loads_or_is_one_line_of_error(study_path, changes, removed):
    data = mutated(changes, removed)
    study_path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    config = checked(study_path)
    if config is not None:  # valid: its numbers are numbers a run can use
        for param in config.study.search_space.values():
            for bound in (getattr(param, "low", None), getattr(param, "high", None)):
                assert bound is None or math.isfinite(bound)


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_are_a_study_or_one_line_of_error(study_path, content):
    study_path.write_bytes(content)
    checked(study_path)


@SETTINGS
@given(st.text(max_size=300))
def test_any_text_is_a_study_or_one_line_of_error(study_path, content):
    study_path.write_text(content, encoding="utf-8", errors="surrogatepass")
    checked(study_path)


BASE_TEXT = yaml.safe_dump(BASE_STUDY, sort_keys=False)
# Fragments of YAML that are not plain data, or plain data at the edges.
FRAGMENTS = [
    "!!python/object/apply:os.system ['touch PWNED']", "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!omap [a: 1]", "!!timestamp 2020-01-01", "2020-01-01", "2020-01-01 10:00:00",
    "!!float nan", ".inf", "-.inf", ".nan", "0x10", "0o17", "1_000", "1e400", "-1e400", "~", "null", "yes", "no",
    "on", "!custom 3", "&a [1, *a]", "*undefined", "&x {k: &y [*x]}", "{<<: {type: int}, low: 1}", "!!str 3",
    "!!int '3'", "[[[[[[[[[[]]]]]]]]]]", "'\\u00e9'", '"\\ud800"', '"a\\nb"', '"\\x00"', "|\n  multi\n  line",
]


@SETTINGS
@given(key=st.sampled_from(["fixed:\n  batch_size: ", "n_trials: ", "search_space:\n  hidden: ", "name: ",
                            "sampler: ", "train:\n  steps: ", "storage: ", "workdir: ", "checkpoint:\n  max_disk: ",
                            "search_space:\n  learning_rate:\n    type: float\n    low: 0.001\n    high: "]),
       fragment=st.sampled_from(FRAGMENTS))
def test_yaml_tags_anchors_and_odd_scalars_are_data_or_one_line_of_error(study_path, key, fragment):
    top = key.split(":")[0]
    kept = "".join(line + "\n" for line in _without(BASE_TEXT, top))
    study_path.write_text(kept + key + fragment + "\n", encoding="utf-8")
    checked(study_path)
    assert not (study_path.parent / "PWNED").exists()  # safe_load builds no object


@settings(SETTINGS, max_examples=15)  # PyYAML takes seconds to fail on a deep document: a few suffice
@given(depth=st.integers(min_value=1, max_value=3000), kind=st.sampled_from(["[", "{a: "]))
def test_deep_nesting_is_data_or_one_line_of_error(study_path, depth, kind):
    close = "]" if kind == "[" else "}"
    study_path.write_text(BASE_TEXT + "max_retries: " + kind * depth + "1" + close * depth + "\n")
    checked(study_path)


def test_aliases_that_would_expand_exponentially_are_refused(study_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    study_path.write_text(BASE_TEXT + "fixed:\n  batch_size: 32\n  lots: {" + ", ".join(lines) + "}\n")
    assert checked(study_path) is None


def _without(text: str, top: str) -> list[str]:
    """The lines of `text` without the top-level key `top` (and its nested lines)."""
    out, skipping = [], False
    for line in text.splitlines():
        if not line.startswith(" "):
            skipping = line.startswith(f"{top}:")
        if not skipping:
            out.append(line)
    return out


# Crashes the fuzzing found (each was a traceback, a hang or a valid-looking study that failed at run).
REGRESSIONS = [
    ("n_trials", '4\n"a\\nb": 1', "a\\nb: unknown key"),  # a newline in a key made two lines
    ("n_trials", "9" * 5000, ": invalid YAML: Exceeds the limit (4300 digits)"),  # ValueError from PyYAML
    ("name", "t\x00", ": invalid YAML: unacceptable character #x0000: special characters are not allowed in"),
    ("fixed", "&a {batch_size: 32, x: *a}", ": fixed.x: a YAML alias refers to the value that holds it"),  # hang
    ("max_retries", "[" * 3000 + "]" * 3000, ": invalid YAML: nested too deeply"),  # RecursionError
    ("max_retries", "[" * 80 + "]" * 80, ": max_retries" + ".0" * 64 + ": is nested too deeply"),
    ("fixed", "{batch_size: 2020-01-01}", ": fixed.batch_size: must be plain YAML data"),  # not JSON at run
    ("fixed", "{batch_size: 2020-13-45}", ": invalid YAML: month must be in 1..12"),  # ValueError from PyYAML
    ("fixed", "{batch_size: !!binary aGVsbG8=}", ": fixed.batch_size: must be plain YAML data"),
    ("search_space", "{hidden: {type: int, low: 1, high: 100000000000000000000}}",
     ": search_space.hidden.high: must be a finite number of magnitude at most 2**53"),  # not a float64
    ("search_space", "{learning_rate: {type: float, low: 0.1, high: .inf}}",
     ": search_space.learning_rate.high: must be a finite number"),
    ("search_space", "{learning_rate: {type: float, values: [0.1, .nan]}}",
     ": search_space.learning_rate.values: must be finite numbers"),
    ("train", "{steps: 100000000000000, eval_every: 10}", ": train.steps: must be <= 2147483647"),  # int32 window
]


@pytest.mark.parametrize("top, value, message", REGRESSIONS, ids=range(len(REGRESSIONS)))
def test_what_the_fuzzing_found_is_one_line_of_error(study_path, top, value, message):
    kept = "".join(line + "\n" for line in _without(BASE_TEXT, top))
    study_path.write_text(kept + f"{top}: {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        config_lib.load(study_path)
    assert message in str(err.value), str(err.value)[:300]
    assert checked(study_path) is None


# --- a handful through the real CLI ------------------------------------------------------------------

CLI_CASES = [
    b"",
    b"\xff\xfe\x00binary",
    b"- just\n- a list\n",
    BASE_TEXT.encode() + b"fixed: !!python/object/apply:os.system ['touch PWNED']\n",
    BASE_TEXT.replace("n_trials: 4", "n_trials: 1e400").encode(),
    BASE_TEXT.encode() + b"max_retries: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    BASE_TEXT.replace("name: t", 'name: "\\ud800"').encode(),
    BASE_TEXT.replace("n_trials: 4", 'n_trials: 4\n"bad\\nkey": 1').encode(),
]


@pytest.mark.slow
@pytest.mark.parametrize("content", CLI_CASES, ids=range(len(CLI_CASES)))
def test_plan_on_a_fuzzed_study_file_is_one_line_of_exit_2(tmp_path, content):
    path = tmp_path / "study.yaml"
    path.write_bytes(content)
    result = run_cli("plan", path, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and result.stderr.startswith(f"error: {path}: ") and result.stderr.count("\n") == 1, \
        result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing created
