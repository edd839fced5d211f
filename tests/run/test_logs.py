"""Library warnings (Optuna's FutureWarning and ExperimentalWarning) reach stderr only with --verbose."""

from __future__ import annotations

import re

import pytest

from conftest import run_cli

# consider_prior: deprecated (FutureWarning); group: experimental (ExperimentalWarning). Both are
# raised when the sampler is built, which every command that opens the study does.
NOISY_SAMPLER = {"type": "tpe", "seed": 0, "multivariate": True, "group": True, "consider_prior": True}


@pytest.mark.slow
def test_library_warnings_show_only_with_verbose(write_study):
    study = write_study(n_trials=1, sampler=NOISY_SAMPLER, train={"steps": 100, "eval_every": 50})
    for args in (("plan", study), ("run", study), ("status", study), ("plan", study),
                 ("export", study, "--out", study.parent / "out")):
        result = run_cli(*args, cwd=study.parent)
        assert result.returncode == 0, result.stderr
        for noise in ("FutureWarning", "ExperimentalWarning", "consider_prior", "optuna_warn"):
            assert noise not in result.stderr, (args, result.stderr)
    verbose = run_cli("run", study, "--verbose", cwd=study.parent)
    assert verbose.returncode == 0, verbose.stderr
    assert "FutureWarning" in verbose.stderr and "`consider_prior` has been deprecated" in verbose.stderr
    assert "ExperimentalWarning" in verbose.stderr


@pytest.mark.slow
def test_verbose_shows_the_libraries_logs_but_not_orbaxs_per_save_chatter(write_study):
    """`run --verbose` of one trial saving 6 times: Optuna's and JAX's INFO lines show, Orbax's
    (through absl, ~40 a save before) do not; sweep says each save in one line."""
    study = write_study(n_trials=1)  # 600 steps, saved every 100
    result = run_cli("run", study, "--verbose", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert [line for line in lines if "absl" in line or ("orbax" in line.lower() and "saved (" not in line)] == []
    saves = [line for line in lines if re.search(r"\] trial 0: step \d+ saved \(", line)]
    assert [int(re.search(r"step (\d+) saved", line)[1]) for line in saves] == list(range(100, 601, 100))
    assert any("A new study created in RDB" in line for line in lines)  # Optuna's INFO
    assert any(line.startswith("INFO:jax") for line in lines)  # JAX's INFO (its backends, its cache)
