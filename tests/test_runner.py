"""The trial loop's failure paths: a trial that raises or reports a non-finite metric fails alone."""

from __future__ import annotations

import signal
import textwrap
import time

from conftest import Running, run_cli, study_of

FLAKY_TRIAL = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, optax

    HYPERPARAMETERS = {"mode": "ok", "learning_rate": 0.05}
    METRICS = ("val_loss",)

    def data(hp):
        rng = np.random.RandomState(0)
        x = rng.normal(size=(256, 4)).astype(np.float32)
        return {"x": x, "y": x.sum(1)}

    def init(hp, key, data):
        if hp["mode"] == "raise":
            raise RuntimeError("init exploded")
        return {"w": jnp.zeros(4)}

    def optimizer(hp):
        return optax.sgd(hp["learning_rate"])

    def batch(hp, data, key):
        return data["x"], data["y"]

    def loss(hp, params, batch, key):
        x, y = batch
        return jnp.mean((x @ params["w"] - y) ** 2)

    def evaluate(hp, params, data):
        value = loss(hp, params, (data["x"], data["y"]), None)
        return {"val_loss": jnp.nan * value if hp["mode"] == "nan" else value}
''')


def test_trial_that_raises_or_reports_nan_fails_alone_and_study_goes_on(write_study):
    study = write_study(trial="flaky_trial", n_trials=3, sampler={"type": "grid", "seed": 0},
                        pruner={"type": "none"}, fixed={},
                        search_space={"mode": {"type": "categorical", "choices": ["ok", "raise", "nan"]}},
                        train={"steps": 100, "eval_every": 50})
    (study.parent / "flaky_trial.py").write_text(FLAKY_TRIAL)
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    states = {t.params["mode"]: t.state.name for t in study_of(study).trials}
    assert states == {"ok": "COMPLETE", "raise": "FAIL", "nan": "FAIL"}
    assert "failed with parameters: {'mode': 'raise'} because of the following error: RuntimeError('init exploded')" \
        in result.stderr
    assert "val_loss is nan at step 50 (non-finite)" in result.stderr
    assert "Traceback" not in result.stderr
    # FAIL is finished: a re-run skips it rather than retraining.
    again = run_cli("run", study, cwd=study.parent)
    assert again.returncode == 0 and "trials 0-2: finished, skipped" in again.stderr


def test_sigint_checkpoints_and_exits_130_resumable(write_study):
    study = write_study(n_trials=2, train={"steps": 3000})
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    proc.signal(signal.SIGINT)
    assert proc.finish(timeout=60) == 130
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr
    trial = study_of(study).trials[0]
    assert trial.state.name == "RUNNING"  # resumable: never FAIL, never COMPLETE
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "trial 0: resumed from step" in result.stderr
    assert [t.state.name for t in study_of(study).trials] in (["COMPLETE", "COMPLETE"], ["COMPLETE", "PRUNED"])


FIRST_ATTEMPT_FAILS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, optax

    HYPERPARAMETERS = {"learning_rate": 0.05}
    METRICS = ("val_loss",)
    _evaluations = [0]

    def _count(_):
        _evaluations[0] += 1
        if _evaluations[0] == 3:  # the third evaluation of this process: a transient fault
            raise RuntimeError("transient fault")

    def data(hp):
        x = np.random.RandomState(0).normal(size=(256, 4)).astype(np.float32)
        return {"x": x, "y": x.sum(1)}

    def init(hp, key, data):
        return {"w": 0.01 * jax.random.normal(key, (4,))}

    def optimizer(hp):
        return optax.sgd(hp["learning_rate"])

    def batch(hp, data, key):
        idx = jax.random.randint(key, (32,), 0, 256)
        return data["x"][idx], data["y"][idx]

    def loss(hp, params, batch, key):
        x, y = batch
        return jnp.mean((x @ params["w"] - y) ** 2)

    def evaluate(hp, params, data):
        value = loss(hp, params, (data["x"], data["y"]), None)
        jax.debug.callback(_count, value)
        return {"val_loss": value}
''')


def test_trial_that_raises_on_first_attempt_succeeds_on_retry_under_same_number(write_study):
    kwargs = dict(trial="first_attempt_fails", n_trials=1, pruner={"type": "none"}, fixed={},
                  search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                  train={"steps": 400, "eval_every": 50}, checkpoint={"every_steps": 100})
    study = write_study(**kwargs, max_retries=1)
    (study.parent / "first_attempt_fails.py").write_text(FIRST_ATTEMPT_FAILS)
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "Trial 0 failed with parameters" in result.stderr and "transient fault" in result.stderr
    assert "Retrying (1 of 1) from its newest checkpoint" in result.stderr
    assert "trial 0: resumed from step 100" in result.stderr  # eval 3 is step 150; newest save 100
    (trial,) = study_of(study).trials
    assert trial.number == 0 and trial.state.name == "COMPLETE" and trial.user_attrs["failures"] == 1
    assert sorted(trial.intermediate_values) == list(range(50, 401, 50))

    # Without retries the same fault fails the trial (and the study still ends normally).
    other = write_study(file="noretry.yaml", **{**kwargs, "name": "u"})
    result = run_cli("run", other, cwd=other.parent)
    assert result.returncode == 0 and "Retrying" not in result.stderr
    assert study_of(other).trials[0].state.name == "FAIL"


def test_sigterm_grace_period_bounds_the_exit_of_a_stuck_trial(write_study):
    study = write_study(trial="stuck_trial", n_trials=1, pruner={"type": "none"}, fixed={},
                        search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                        checkpoint={"grace_seconds": 1.5})
    (study.parent / "stuck_trial.py").write_text(
        FIRST_ATTEMPT_FAILS.replace("def data(hp):\n", "def data(hp):\n    import time; time.sleep(120)\n"))
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert proc.finish(timeout=60) == 143
    assert time.monotonic() - t0 < 30  # not the 120 s the trial would have needed
    assert "grace period of 1.5 s is over" in proc.stderr
    assert study_of(study).trials[0].state.name == "RUNNING"  # still resumable


def test_cadence_saves_every_n_steps_or_every_t_seconds_whichever_first(monkeypatch):
    from sweep import runner

    now = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])
    both = runner._Cadence(every_steps=50, every_seconds=10.0)
    assert not both.due(49) and both.due(50)
    now[0] += 10.0
    assert both.due(51)  # ten seconds passed: due off the step cadence
    both.saved()
    assert not both.due(52)
    seconds_only = runner._Cadence(every_steps=None, every_seconds=2.0)
    assert not seconds_only.due(1000)
    now[0] += 2.0
    assert seconds_only.due(1001)
    never = runner._Cadence(every_steps=None, every_seconds=None)
    now[0] += 1e6
    assert not never.due(100)


def test_every_seconds_alone_checkpoints_mid_trial(write_study):
    study = write_study(n_trials=1, pruner={"type": "none"}, train={"steps": 20000, "eval_every": 1000},
                        checkpoint={"every_steps": None, "every_seconds": 0.3, "keep_last": 50})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    from conftest import checkpoint_dir

    steps = sorted(int(p.name) for p in checkpoint_dir(study, 0).iterdir() if p.name.isdigit())
    assert len(steps) >= 3 and any(s % 1000 for s in steps)  # saved by the clock, between evaluations
