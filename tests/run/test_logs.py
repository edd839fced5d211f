"""Library warnings (Optuna's FutureWarning and ExperimentalWarning) reach stderr only with --verbose."""

from __future__ import annotations

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
