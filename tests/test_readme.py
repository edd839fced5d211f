"""The README's copyable trial and study work as written, and its commands name real things.

The docs/ pages' examples are run by test_docs.py; named examples may live on either.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_blocks import example as _example

from conftest import REPO, run_cli

README = (REPO / "README.md").read_text()


@pytest.mark.slow
def test_readme_minimal_trial_runs_as_documented(tmp_path):
    (tmp_path / "my_trial.py").write_text(_example("my_trial.py"))
    (tmp_path / "my_study.yaml").write_text(_example("my_study.yaml"))
    result = run_cli("run", "my_study.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "study my-study: 8/8 trials finished" in result.stdout
    study = study_of_default(tmp_path)
    assert len(study.trials) == 8 and all(t.state.name == "COMPLETE" for t in study.trials)
    assert all(Path(t.user_attrs["checkpoint_dir"]).is_dir() for t in study.trials)
    assert min(t.value for t in study.trials) < 0.05  # it actually learns


def study_of_default(cwd: Path):
    import optuna

    return optuna.load_study(study_name="my-study", storage=f"sqlite:///{cwd}/runs/my-study/study.db")


def test_readme_commands_are_the_ci_commands():
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = 'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest'
    assert test_cmd in README
    assert test_cmd in ci
    assert "python -m sweep run studies/digits_mlp.yaml" in README
    assert (REPO / "studies" / "digits_mlp.yaml").is_file()


@pytest.mark.slow
def test_readme_export_and_load_example_runs(tmp_path):
    import yaml

    (tmp_path / "studies").mkdir()
    study = yaml.safe_load((REPO / "studies" / "digits_mlp.yaml").read_text())
    study.update(n_trials=2, train={"steps": 300, "eval_every": 50, "seed": 0})
    (tmp_path / "studies" / "digits_mlp.yaml").write_text(yaml.safe_dump(study))
    assert run_cli("run", "studies/digits_mlp.yaml", cwd=tmp_path).returncode == 0
    command = re.search(r"```bash\n\.venv/bin/python -m sweep (export [^\n]*)\n```", README).group(1)
    assert run_cli(*command.split(), cwd=tmp_path).returncode == 0
    (tmp_path / "predict.py").write_text(_example("predict.py"))
    import subprocess
    import sys

    from conftest import cli_env

    result = subprocess.run([sys.executable, "predict.py"], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    predicted, true = re.search(r"predicted (\[.*?\]) true (\[.*?\])", result.stdout).groups()
    assert sum(a == b for a, b in zip(eval(predicted), eval(true))) >= 7  # it really predicts digits
    assert "ScaleByAdamState" in result.stdout or "TraceState" in result.stdout
    (tmp_path / "load_variables.py").write_text(_example("load_variables.py"))  # docs/export.md
    result = subprocess.run([sys.executable, "load_variables.py"], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['params'] (10, 10)"


@pytest.mark.slow
def test_readme_python_api_example_runs_as_documented(tmp_path):
    import subprocess
    import sys

    from conftest import cli_env

    (tmp_path / "from_python.py").write_text(_example("from_python.py"))
    result = subprocess.run([sys.executable, "from_python.py"], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert re.search(r"\[\(0, 'COMPLETE', [\d.]+\), \(1, 'COMPLETE', [\d.]+\), \(2, 'COMPLETE', [\d.]+\)\]",
                     result.stdout), result.stdout
    best = re.search(r"best trial (\d+) step (\d+) exported first: (\d+)", result.stdout)
    assert best and best.group(1) == best.group(3), result.stdout  # load_best and export agree on the best
    assert (tmp_path / "export-py" / "index.json").is_file()


def test_readme_names_every_key_that_may_change_under_a_started_study():
    """The README's list is the refusal's (sweep/study/fingerprint.py STEERING: a new user of issue 43
    found `logging` missing from it)."""
    from sweep.study.fingerprint import STEERING

    text = " ".join((REPO / "README.md").read_text().split())
    listed = re.search(r"keys that only steer the run \(([^)]*)\) may change", text)
    assert listed, "the README no longer says which keys may change"
    assert re.findall(r"`([a-z_]+)`", listed.group(1)) == list(STEERING)
