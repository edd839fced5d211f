"""drill: kills a short copy of the study for real, restarts it, measures, and judges bit-identity."""

from __future__ import annotations

import re
import textwrap

import pytest

from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # every test here starts real processes

NONDETERMINISTIC = textwrap.dedent('''
    import numpy as np
    from trials.digits_mlp import *  # noqa: F401,F403
    from trials import digits_mlp as _base

    def data(hp):
        # Unseeded noise: every process sees different data, so a resumed trial cannot match.
        d = _base.data(hp)
        return {**d, "x_val": d["x_val"] + np.random.normal(0, 0.05, d["x_val"].shape).astype("float32")}
''')


def test_drill_on_example_study_reports_recovery_and_bit_identity(tmp_path):
    result = run_cli("drill", REPO / "studies" / "digits_mlp.yaml", "--seed", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    killed = int(re.search(r"killed \(SIGKILL\) at step\s+(\d+)", out).group(1))
    resumed = int(re.search(r"resumed from step\s+(\d+)", out).group(1))
    lost = int(re.search(r"work lost\s+(\d+) steps, [\d.]+ s", out).group(1))
    assert 0 < killed < 2000 and 0 <= resumed <= killed and lost == killed - resumed
    if resumed == 0:  # the example's 30 s cadence outlasts its trial: said plainly, with the reason
        assert "no checkpoint had been committed at the kill: the trial reached step" in out
    assert re.search(r"restart -> new step\s+[\d.]+ s", out)
    assert re.search(r"bit-identical to uninterrupted\s+yes", out)
    assert not (tmp_path / "runs").exists()  # the drill works in a temporary workdir


def test_drill_on_a_trial_too_fast_for_its_cadence_waits_for_the_first_committed_checkpoint(write_study):
    # Seed 31 aims the kill at step 200; the first save is at step 1000. 10,000 steps: the drill's
    # kill without a checkpoint at the last evaluation (a cadence that never saves) is far off, however
    # late a loaded machine commits the save (2,000 steps: it once committed after step 1900).
    study = write_study(train={"steps": 10000, "eval_every": 100}, checkpoint={"every_steps": 1000})
    result = run_cli("drill", study, "--seed", "31", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    resumed = int(re.search(r"resumed from step\s+(\d+)", result.stdout).group(1))
    killed = int(re.search(r"killed \(SIGKILL\) at step\s+(\d+)", result.stdout).group(1))
    # the first committed checkpoint, or a later one where the kill came after a second commit
    assert resumed >= 1000 and resumed % 1000 == 0 and killed >= resumed, (resumed, killed)
    assert "(aimed at step 200; waited for the first committed checkpoint)" in result.stdout
    assert re.search(r"restart -> restored\s+[\d.]+ s", result.stdout)


def test_drill_flags_a_nondeterministic_trial_and_exits_nonzero(write_study):
    study = write_study(trial="noisy_trial", train={"steps": 1000, "eval_every": 100},
                        checkpoint={"every_steps": 200})
    (study.parent / "noisy_trial.py").write_text(NONDETERMINISTIC)
    result = run_cli("drill", study, "--seed", "2", cwd=study.parent)
    assert result.returncode == 1, result.stderr
    assert re.search(r"bit-identical to uninterrupted\s+NO", result.stdout)
    assert "differs: value" in result.stdout or "differs: intermediate_values" in result.stdout
