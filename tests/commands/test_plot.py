"""plot: Optuna's study figures and every trial's learning curve, with checkpoint/best/resume markers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import kill_mid_trial, cli_here, run_cli, study_of
from sweep.commands.plot import markers
from sweep.study import config as config_lib

pytestmark = pytest.mark.slow  # every test here starts real processes

STUDY_FIGURES = ("optimization_history", "intermediate_values", "param_importances", "parallel_coordinate")


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000


def _resume_trace_x(html: Path) -> list[int]:
    """The x values of the 'resumed from' trace in a plotly HTML file."""
    text = html.read_text()
    m = re.search(r'"name":"resumed from","x":(\[[^\]]*\])', text)
    assert m, "no 'resumed from' trace"
    return json.loads(m.group(1))


def test_plot_writes_study_figures_and_learning_curves(write_study, tmp_path):
    study = write_study(n_trials=4)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    result = run_cli("plot", study, "--out", tmp_path / "plots", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "plots"
    for name in STUDY_FIGURES:
        assert _nonempty(out / f"{name}.png") and _nonempty(out / f"{name}.html"), name
    for t in study_of(study).trials:
        assert _nonempty(out / "curves" / f"trial_{t.number:04d}.png")
        assert _nonempty(out / "curves" / f"trial_{t.number:04d}.html")
    assert (out / "plotly.min.js").is_file()  # the HTML opens offline
    assert "optimization_history.png" in result.stdout and "curves" in result.stdout


def test_plot_marks_resume_steps_of_pruned_and_resumed_trials(write_study, tmp_path):
    study = write_study(n_trials=6)
    kept = kill_mid_trial(study, 3, 200)
    rerun = run_cli("run", study, cwd=study.parent)
    assert rerun.returncode == 0, rerun.stderr
    resumed_at = int(re.search(r"trial 3: resumed from step (\d+)", rerun.stderr).group(1))
    assert resumed_at == max(kept)
    trials = {t.number: t for t in study_of(study).trials}
    assert any(t.state.name == "PRUNED" for t in trials.values())
    assert cli_here("plot", study, "--out", tmp_path / "p", cwd=study.parent).returncode == 0
    config = config_lib.load(study)
    marks = markers(config, trials[3])
    assert marks["resumed"] == [resumed_at]
    assert marks["best"] == [trials[3].user_attrs["best_step"]]
    assert marks["checkpoint"] and all(s in trials[3].intermediate_values for s in marks["checkpoint"])
    assert _resume_trace_x(tmp_path / "p" / "curves" / "trial_0003.html") == [resumed_at]
    for t in trials.values():  # pruned ones too
        assert _nonempty(tmp_path / "p" / "curves" / f"trial_{t.number:04d}.png")
        if t.number != 3:
            assert markers(config, t)["resumed"] == []


def test_plot_of_a_missing_study_is_a_clear_error(write_study, tmp_path):
    study = write_study()
    result = cli_here("plot", study, "--out", tmp_path / "p", cwd=study.parent)
    assert result.returncode == 1
    assert "not found" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "p").exists()


def test_plot_without_out_is_a_usage_error(write_study):
    result = run_cli("plot", write_study())
    assert result.returncode == 2 and "--out" in result.stderr
