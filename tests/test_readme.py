"""The README's copyable trial and study work as written, and its commands name real things."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO, run_cli

README = (REPO / "README.md").read_text()


def _example(name: str) -> str:
    m = re.search(rf"<!-- example: {re.escape(name)} -->\n```\w+\n(.*?)```", README, re.S)
    assert m, f"README has no example {name}"
    return m.group(1)


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
