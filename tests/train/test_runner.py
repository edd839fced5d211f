"""The trial loop's failure paths: a trial that raises or reports a non-finite metric fails alone."""

from __future__ import annotations

import re
import signal
import time

import pytest

from conftest import Running, checkpoint_dir, kill9, run_cli, signalled_after_a_save, study_of, wait_for_checkpoint
from tests.trials.files import write_trial  # the trials here: tests/trials/


@pytest.mark.slow
def test_trial_that_raises_or_reports_nan_fails_alone_and_study_goes_on(write_study):
    study = write_study(trial="flaky_trial", n_trials=3, sampler={"type": "grid", "seed": 0},
                        pruner={"type": "none"}, fixed={},
                        search_space={"mode": {"type": "categorical", "choices": ["ok", "raise", "nan"]}},
                        train={"steps": 100, "eval_every": 50})
    write_trial(study.parent, "flaky_trial", "flaky")
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


@pytest.mark.slow
def test_study_whose_trials_all_fail_exits_1_and_says_why(write_study):
    # A diverging learning rate: the training loss is non-finite within the first window.
    study = write_study(trial="diverging_trial", n_trials=2, sampler={"type": "random", "seed": 0},
                        pruner={"type": "none"}, fixed={}, train={"steps": 100, "eval_every": 50},
                        search_space={"learning_rate": {"type": "float", "low": 0.1, "high": 1.0}})
    write_trial(study.parent, "diverging_trial", "flaky", LEARNING_RATE=1e30)
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 1, result.stderr
    assert "error: no trial completed: 2 failed, 0 pruned; most common failure (2 of 2): NonFiniteMetric" \
        in result.stderr
    assert "the training loss is" in result.stderr and "Traceback" not in result.stderr
    assert [t.state.name for t in study_of(study).trials] == ["FAIL", "FAIL"]


@pytest.mark.slow
def test_sigint_checkpoints_and_exits_130_resumable(write_study):
    study = write_study(n_trials=2, train={"steps": 3000})
    # Past its first save, so the trial trains (a signal while it compiles exits at once: test_signals).
    proc = signalled_after_a_save(study, 0, signal.SIGINT)  # exit 130
    assert "checkpointing running trials" in proc.stderr and "interrupted" in proc.stderr
    trial = study_of(study).trials[0]
    assert trial.state.name == "RUNNING"  # resumable: never FAIL, never COMPLETE
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "trial 0: resumed from step" in result.stderr
    assert [t.state.name for t in study_of(study).trials] in (["COMPLETE", "COMPLETE"], ["COMPLETE", "PRUNED"])


@pytest.mark.slow
def test_trial_that_raises_on_first_attempt_succeeds_on_retry_under_same_number(write_study):
    kwargs = dict(trial="first_attempt_fails", n_trials=1, pruner={"type": "none"}, fixed={},
                  search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                  train={"steps": 400, "eval_every": 50}, checkpoint={"every_steps": 100})
    study = write_study(**kwargs, max_retries=1)
    write_trial(study.parent, "first_attempt_fails", "third_evaluation_fails")
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
    assert result.returncode == 1 and "Retrying" not in result.stderr  # its only trial failed
    assert "error: no trial completed: 1 failed, 0 pruned" in result.stderr
    assert study_of(other).trials[0].state.name == "FAIL"


@pytest.mark.slow
def test_sigterm_grace_period_bounds_the_exit_of_a_stuck_trial(write_study):
    study = write_study(trial="stuck_trial", n_trials=1, pruner={"type": "none"}, fixed={},
                        search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
                        checkpoint={"grace_seconds": 0.5})
    stuck = study.parent / "stuck"
    # Stuck in its third evaluation (step 150, past the save at step 100): training, not starting up,
    # so the signal asks for a final checkpoint that the stuck step never lets it write.
    write_trial(study.parent, "stuck_trial", "third_evaluation_fails", HANG_MARKER=str(stuck))
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    deadline = time.monotonic() + 120
    while not stuck.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stuck.exists(), proc.stderr
    proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert proc.finish(timeout=60) == 143
    assert time.monotonic() - t0 < 30  # not the 120 s the trial would have needed
    assert "grace period of 0.5 s is over" in proc.stderr
    assert study_of(study).trials[0].state.name == "RUNNING"  # still resumable


@pytest.mark.slow
def test_every_seconds_alone_checkpoints_mid_trial(write_study):
    # One evaluation, at the end: a step saved before it was saved by the clock, at the end of a
    # training window (~1 s each, sweep/train/compiled.py), whatever the machine's speed. 150000
    # steps train for seconds here (a warm compilation cache left 20000 steps one window long).
    study = write_study(n_trials=1, pruner={"type": "none"}, train={"steps": 150000, "eval_every": 150000},
                        checkpoint={"every_steps": None, "every_seconds": 0.3, "keep_last": 50})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    from conftest import checkpoint_dir

    steps = sorted(int(p.name) for p in checkpoint_dir(study, 0).iterdir() if p.name.isdigit())
    assert steps[-1] == 150000 and steps[:-1], steps  # saved by the clock, mid-trial


class _Recorder:
    """A Reporter that keeps the reports and never prunes."""

    def __init__(self) -> None:
        self.reports: dict[int, float] = {}

    def report(self, value: float, step: int) -> None:
        self.reports[step] = value

    def should_prune(self) -> bool:
        return False


def _train(config, number, params, directory, reported=None, steps=None, budget=None, stop=None):
    """Run one trial in-process; `steps` (a dict) receives the runner's current step per trial."""
    from sweep.host.signals import StopSignal
    from sweep.train import loop as runner
    from sweep.train.state import initial_state, trial_checkpoints

    hp = config.hyperparameters(params)
    recorder, ckpt = _Recorder(), trial_checkpoints(config, number, directory, budget)
    on_step = None if steps is None else (lambda n, s: steps.__setitem__(n, s) if s >= 0 else None)
    try:
        outcome = runner.run_trial(config, number, hp, recorder, reported or {}, ckpt, stop or StopSignal(),
                                   runner.TrialEvents(on_step=on_step))
        ckpt.wait()
        state = ckpt.restore(outcome.last_step, initial_state(config, number, hp)[0])
    finally:
        ckpt.close()
    return recorder.reports, state


def test_any_split_into_windows_gives_the_same_bits(write_study, tmp_path, monkeypatch):
    import jax
    import numpy as np

    from sweep.study import config as config_lib
    from sweep.train import compiled

    config = config_lib.load(write_study(train={"steps": 300, "eval_every": 50}))
    results = []
    for seconds in (0.0, 1e9):  # one step per window (a dispatch per step) vs whole evaluation intervals
        monkeypatch.setattr(compiled, "WINDOW_SECONDS", seconds)
        results.append(_train(config, 0, {"learning_rate": 0.01, "hidden": 32}, tmp_path / str(seconds)))
    (reports_a, state_a), (reports_b, state_b) = results
    assert len(reports_a) == 6 and reports_a == reports_b
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b) and all(np.array_equal(a, b) for a, b in zip(leaves_a, leaves_b))


def test_trials_of_equal_shapes_share_compiled_code(write_study, tmp_path):
    from sweep.study import config as config_lib
    from sweep.train import compile_events

    compile_events.count_compilations()
    config = config_lib.load(write_study(train={"steps": 100, "eval_every": 50}))
    _train(config, 0, {"learning_rate": 0.01, "hidden": 48}, tmp_path / "a")  # compiles
    before = compile_events.COMPILES.copy()
    reports, _ = _train(config, 1, {"learning_rate": 0.002, "hidden": 48}, tmp_path / "b")
    assert compile_events.compilations(compile_events.COMPILES - before) == 0 and len(reports) == 2
    _train(config, 2, {"learning_rate": 0.002, "hidden": 64}, tmp_path / "c")  # a new shape does compile
    assert compile_events.compilations(compile_events.COMPILES - before) > 0


@pytest.mark.slow
def test_trial_that_branches_on_a_float_hyperparameter_still_trains(write_study):
    study = write_study(trial="branchy_trial", n_trials=2, pruner={"type": "none"},
                        train={"steps": 100, "eval_every": 50})
    write_trial(study.parent, "branchy_trial", "branchy")
    result = run_cli("run", study, "--verbose", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    # Only the hyperparameter the code branches on becomes a constant; the log names it once.
    assert result.stderr.count("training uses hyperparameter learning_rate as a Python value "
                               "(TracerBoolConversionError)") == 1, result.stderr
    assert [t.state.name for t in study_of(study).trials] == ["COMPLETE", "COMPLETE"]


@pytest.mark.slow
def test_a_resumed_trial_compiles_nothing(write_study):
    # Fresh and restored states are placed alike, so a resume after kill -9 finds the training
    # window and the evaluation in the persistent cache: zero compilations of either, by JAX's
    # own monitoring events.
    study = write_study(n_trials=1, pruner={"type": "none"}, train={"steps": 400000, "eval_every": 500},
                        checkpoint={"every_steps": 1000})
    own = {"SWEEP_COMPILATION_CACHE": str(study.parent / "own_cache")}  # not the tests' shared one
    proc = Running("run", study, "--verbose", cwd=study.parent, env=own)
    wait_for_checkpoint(checkpoint_dir(study, 0), 2000)
    kill9(proc)
    first = Running("run", study, "--verbose", cwd=study.parent, env=own)
    first.wait_for(r"trial 0: training again")
    first.signal(signal.SIGTERM)
    assert first.finish() == 143
    again = Running("run", study, "--verbose", cwd=study.parent, env=own)
    again.wait_for(r"trial 0: training again")
    again.signal(signal.SIGTERM)
    assert again.finish() == 143
    pattern = (r"trial 0: XLA compilations (\d+) \(window (\d+), evaluate (\d+); [\d.]+ s\), executables from "
               r"the persistent cache (\d+)")
    counts = [re.search(pattern, p.stderr) for p in (first, again)]
    assert all(counts), (first.stderr[-3000:], again.stderr[-3000:])
    for m in counts:
        assert (int(m.group(2)), int(m.group(3))) == (0, 0)  # neither the window nor the evaluation
        assert int(m.group(4)) > 5  # they came from the cache
    # Only the few small ops of the restore path that the killed process never ran may compile.
    assert int(counts[0].group(1)) <= 4 and int(counts[1].group(1)) == 0


def test_training_continues_while_a_save_is_written(write_study, tmp_path, monkeypatch):
    # Event order, not time: each write waits until the training loop has moved past the step it
    # writes. A save that blocked the loop would never see that (the write gives up after 30 s).
    from sweep.checkpoints import folder as checkpoints
    from sweep.study import config as config_lib

    config = config_lib.load(write_study(train={"steps": 300, "eval_every": 50}, checkpoint={"every_steps": 100}))
    seen: list[tuple[int, int]] = []
    steps: dict[int, int] = {}
    write = checkpoints.TrialCheckpoints._write

    def gated(self, items):
        step = items[-1][0]
        deadline = time.monotonic() + 30
        while step < 300 and steps.get(0, 0) <= step and time.monotonic() < deadline:
            time.sleep(0.001)
        seen.append((step, steps.get(0, 0)))
        write(self, items)

    monkeypatch.setattr(checkpoints.TrialCheckpoints, "_write", gated)
    reports, _ = _train(config, 0, {"learning_rate": 0.01, "hidden": 32}, tmp_path, steps=steps)
    assert [step for step, _ in seen] == [100, 200, 300] and len(reports) == 6
    assert all(trained > step for step, trained in seen[:2]), seen


def test_max_write_share_owes_periodic_saves_instead_of_waiting(write_study, tmp_path, monkeypatch):
    # Each write holds the writer until training has passed the *next* cadence step, or until the
    # training loop blocks waiting for this write. Exact cadence (the default) must block there;
    # with max_write_share the loop trains on, and the save owed lands later, off the cadence.
    # Event order, not time: the 30 s deadline is never reached unless the loop hangs.
    import threading

    from sweep.checkpoints import folder as checkpoints
    from sweep.study import config as config_lib

    seen: dict[str, list[tuple[int, int]]] = {}
    steps: dict[int, int] = {}
    write, wait = checkpoints.TrialCheckpoints._write, checkpoints.TrialCheckpoints.wait
    blocked = threading.Event()  # the training loop is inside wait() for the write in flight

    def waiting(self):
        if self._pending is not None and not self._pending.done():
            blocked.set()
        try:
            wait(self)
        finally:
            blocked.clear()  # before save() submits the next write

    monkeypatch.setattr(checkpoints.TrialCheckpoints, "wait", waiting)
    for share in (None, 0.5):
        config = config_lib.load(write_study(train={"steps": 600, "eval_every": 50},
                                             checkpoint={"every_steps": 100, "max_write_share": share}))
        log = seen.setdefault(str(share), [])

        def gated(self, items, log=log):
            step = items[-1][0]
            deadline = time.monotonic() + 30
            while (step < 600 and steps.get(0, 0) <= step + 100 and not blocked.is_set()
                   and time.monotonic() < deadline):
                time.sleep(0.001)
            log.append((step, steps.get(0, 0)))
            write(self, items)

        monkeypatch.setattr(checkpoints.TrialCheckpoints, "_write", gated)
        steps.clear()
        _train(config, 0, {"learning_rate": 0.01, "hidden": 32}, tmp_path / str(share), steps=steps,
               budget=checkpoints.WriteBudget())
    exact, owed = seen["None"], seen["0.5"]
    assert [s for s, _ in exact] == [100, 200, 300, 400, 500, 600]  # every cadence step, waited for
    assert all(trained <= step + 100 for step, trained in exact[:-1])  # the loop stopped at the next one
    assert any(trained > step + 100 for step, trained in owed[:-1]), owed  # trained on past it
    assert len(owed) < len(exact) and owed[-1][0] == 600


def test_fallback_makes_only_the_branched_on_hyperparameter_static(write_study, tmp_path, monkeypatch, caplog):
    import logging

    from sweep.study import config as config_lib
    from sweep.train import compile_events, compiled

    monkeypatch.chdir(tmp_path)
    write_trial(tmp_path, "dropout_trial_fb", "dropout")
    config = config_lib.load(write_study(
        trial="dropout_trial_fb", fixed={}, train={"steps": 20, "eval_every": 10},
        search_space={"learning_rate": {"type": "float", "low": 0.01, "high": 0.1},
                      "dropout": {"type": "float", "low": 0.1, "high": 0.5}}))
    compile_events.count_compilations()
    with caplog.at_level(logging.INFO, logger="sweep"):
        logging.getLogger("sweep").propagate = True
        _train(config, 0, {"learning_rate": 0.05, "dropout": 0.2}, tmp_path / "a")
    module = config.trial_module
    assert compiled.FUNCTIONS.static_names(module, "window") == {"dropout"}  # learning_rate stays traced
    # (as a set: another test's handler on the "sweep" logger may also pass records to caplog)
    assert {r.getMessage() for r in caplog.records if "as a Python value" in r.getMessage()} == {
        "dropout_trial_fb: training uses hyperparameter dropout as a Python value (TracerBoolConversionError), "
        "so each value compiles its own program; write it with jnp operations (e.g. jnp.where) to share one program"}
    before = compile_events.COMPILES.copy()
    _train(config, 1, {"learning_rate": 0.02, "dropout": 0.2}, tmp_path / "b")  # another learning rate
    assert compile_events.compilations(compile_events.COMPILES - before, "window") == 0  # shares the program


def test_write_budget_defers_periodic_saves_but_never_a_signal_save(write_study, tmp_path, monkeypatch):
    # The budget (here given explicitly, as the default cadence has it) owes the periodic save of step 200 while the write of step 100 is still
    # in flight (it is held until training passes 250, or the loop waits for it). A signal at
    # step >= 300 is then saved at the step it is seen, waiting for the writer: never owed.
    # Event order, not time: the 30 s deadline is never reached unless the loop hangs.
    from sweep.checkpoints import folder as checkpoints
    from sweep.errors import Interrupted
    from sweep.host.signals import StopSignal
    from sweep.study import config as config_lib

    path = write_study(train={"steps": 600, "eval_every": 50},
                       checkpoint={"every_steps": 100, "max_write_share": config_lib.DEFAULT_WRITE_SHARE})
    config = config_lib.load(path)
    assert config.study.checkpoint.write_share == config_lib.DEFAULT_WRITE_SHARE == 0.03
    stop = StopSignal(hard_exit=False)
    steps: dict[int, int] = {}
    written: list[tuple[int, int]] = []  # (step written, step trained when its write began)
    write, wait = checkpoints.TrialCheckpoints._write, checkpoints.TrialCheckpoints.wait
    loop_waits = []

    def waiting(self):
        if self._pending is not None and not self._pending.done():
            loop_waits.append(steps.get(0, 0))
        wait(self)

    def gated(self, items):
        step = items[-1][0]
        deadline = time.monotonic() + 30
        while step == 100 and steps.get(0, 0) <= 250 and not loop_waits and time.monotonic() < deadline:
            time.sleep(0.001)
        written.append((step, steps.get(0, 0)))
        write(self, items)

    def on_step(number, step):
        if step >= 0:
            steps[number] = step
            if step >= 300 and stop.signum is None:
                stop.signum = signal.SIGTERM  # what StopSignal's handler sets (without its grace timer)

    from sweep.train import loop as runner
    from sweep.train.state import trial_checkpoints

    monkeypatch.setattr(checkpoints.TrialCheckpoints, "wait", waiting)
    monkeypatch.setattr(checkpoints.TrialCheckpoints, "_write", gated)
    hp = config.hyperparameters({"learning_rate": 0.01, "hidden": 32})
    ckpt = trial_checkpoints(config, 0, tmp_path / "ckpt", checkpoints.WriteBudget())
    try:
        with pytest.raises(Interrupted):
            runner.run_trial(config, 0, hp, _Recorder(), {}, ckpt, stop, runner.TrialEvents(on_step=on_step))
    finally:
        ckpt.close()
    stopped_at = steps[0]
    assert stopped_at >= 300 and written[-1][0] == stopped_at, written  # the signal's save, at its step
    assert 200 not in [s for s, _ in written], written  # owed while step 100 was being written
    assert written[0][0] == 100 and loop_waits and all(w == stopped_at for w in loop_waits), (written, loop_waits)
