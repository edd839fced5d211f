"""The benchmarks' stand-ins keep up with the real interfaces they replace."""

from __future__ import annotations

import importlib.util
import inspect

from conftest import REPO
from sweep.checkpoints.folder import TrialCheckpoints


def test_no_checkpoints_stand_in_has_every_public_method_of_trial_checkpoints():
    spec = importlib.util.spec_from_file_location("checkpoint_overhead", REPO / "benchmarks" / "checkpoint_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    public = {name for name, _ in inspect.getmembers(TrialCheckpoints, inspect.isfunction) if not name.startswith("_")}
    assert public <= set(dir(module.NoCheckpoints)), public - set(dir(module.NoCheckpoints))
    assert hasattr(module.NoCheckpoints, "last_saved")


def _benchmark(name: str):
    """benchmarks/<name>.py as a module (its siblings importable, as when run as a script)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scheduler_report_compares_a_method_that_ran_on_some_pairs_only_on_those():
    """benchmarks/scheduler_sim.py --report: a method with results for only some (task, seed)
    pairs is left out of the family's table and gets a table of its own over those pairs, where
    every method's mean is over the same pairs."""
    module = _benchmark("scheduler_sim")

    def row(method: str, seed: int, best: float) -> dict:
        return {"family": "f", "task": "t", "method": method, "seed": seed, "best": [best] * 4, "y_star": 0.0,
                "y_worst": 1.0}

    results = [row("a", s, 0.5) for s in range(4)] + [row("b", s, 0.1 * s) for s in range(4)] + [row("c", 0, 0.2)]
    lines: list[str] = []
    module.report(results, out=lines.append)
    titles = [x for x in lines if x.startswith("f")]
    assert titles[0].startswith("f: 4 (task, seed) pairs") and titles[1].startswith("f, the 1 pairs c ran: 1 ")
    tables = "\n".join(lines).split("\n\n")
    assert "| c |" not in tables[0] and "| b | 0.1500 [" in tables[0]
    assert "| b | 0.0000 [" in tables[1] and "| c | 0.2000 [" in tables[1]


def test_the_real_freeze_thaw_report_pairs_each_seed_and_refuses_a_seed_with_one_side():
    """benchmarks/freeze_thaw_real.py --report: means per side, freeze_thaw minus the pruner paired
    by seed with the seeds it was lower in; a seed run by one side only is named, not averaged."""
    import pytest

    module = _benchmark("freeze_thaw_real")

    def row(side: str, seed: int, half: float, budget: float) -> dict:
        return {"side": side, "seed": seed, "trials": 10, "steps": 40_000, "best_at_half": half, "best_at_budget": budget}

    rows = [row("tpe+median", 0, 0.05, 0.03), row("freeze_thaw", 0, 0.04, 0.04),
            row("tpe+median", 1, 0.06, 0.05), row("freeze_thaw", 1, 0.04, 0.03)]
    lines: list[str] = []
    module.report(rows, out=lines.append)
    assert lines[0].startswith("2 seeds (0, 1)")
    assert "| tpe+median | 0.0550 (0.0500, 0.0600) |" in lines[3]
    assert "| freeze_thaw | 0.0400 (0.0400, 0.0400) |" in lines[4] and "(0.0400, 0.0300)" in lines[4]
    assert lines[5].startswith("within 15,000 steps, freeze_thaw minus tpe+median: -0.0150 [")
    assert lines[5].endswith("lower in 2, equal in 0, higher in 0 of 2 seeds")
    assert lines[6].startswith("within 30,000 steps, freeze_thaw minus tpe+median: -0.0050 [")
    assert lines[6].endswith("lower in 1, equal in 0, higher in 1 of 2 seeds")
    with pytest.raises(SystemExit, match="no run of tpe\\+median seed 2"):
        module.report(rows + [row("freeze_thaw", 2, 0.04, 0.03)], out=lines.append)
    variant = [row("freeze_thaw+rung view", 0, 0.03, 0.02), row("freeze_thaw+rung view", 1, 0.05, 0.04)]
    lines = []
    module.report(rows + variant, out=lines.append)  # a variant run on every seed: its row and its pairs
    assert lines[5].startswith("| freeze_thaw+rung view | 0.0400 (0.0300, 0.0500) |")
    assert lines[8].startswith("within 15,000 steps, freeze_thaw+rung view minus tpe+median: -0.0150 [")
    with pytest.raises(SystemExit, match="no run of freeze_thaw\\+rung view seed 1"):
        module.report(rows + variant[:1], out=lines.append)


def test_the_sampler_sees_a_paused_trial_as_pruned_and_nothing_else_changed():
    """benchmarks/sampler_sees_paused.py: a paused trial (WAITING with paused_at and reports) is
    PRUNED in the sampler's view; an enqueued WAITING trial and the others keep their state."""
    import optuna
    from optuna.trial import TrialState

    module = _benchmark("sampler_sees_paused")
    study = optuna.create_study()
    done = study.ask()
    study.tell(done, 1.0)
    paused = study.ask()
    paused.report(0.5, 100)
    paused.set_user_attr("paused_at", [100])
    study._storage.set_trial_state_values(paused._trial_id, TrialState.WAITING)
    study.enqueue_trial({})
    view = module.PausedAsPruned(study)
    states = {t.number: t.state for t in view.get_trials(deepcopy=False)}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.PRUNED, 2: TrialState.WAITING}
    assert [t.number for t in view._get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))] == [0, 1]
    assert study.trials[1].state == TrialState.WAITING  # the storage is left as it was


def test_the_rung_view_shows_the_trials_at_the_highest_step_enough_reported_and_nothing_else():
    """benchmarks/sampler_views.py RungView (BOHB's rule): before MIN_TRIALS trials reported at
    one step the study is seen as it is; then the trials at the highest such step are COMPLETE
    with their value there, the others hidden but the unfinished ones (not learned from)."""
    import optuna
    from optuna.trial import TrialState

    module = _benchmark("sampler_views")
    study = optuna.create_study()
    done = study.ask()
    done.report(0.9, 100)
    study.tell(done, 0.8)
    view = module.RungView(study)
    assert [(t.number, t.state, t.values) for t in view.get_trials()] == [(0, TrialState.COMPLETE, [0.8])]
    paused = [study.ask() for _ in range(module.MIN_TRIALS)]  # paused at 100, the first 3 at 200
    for i, trial in enumerate(paused):
        trial.report(0.5 + i / 100, 100)
        if i < 3:
            trial.report(0.4 + i / 100, 200)
        study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
    seen = view._get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert [t.number for t in seen] == list(range(module.MIN_TRIALS + 1))  # 11 reported at 100
    assert [t.values[0] for t in seen] == [0.9] + [0.5 + i / 100 for i in range(module.MIN_TRIALS)]
    assert all(t.state == TrialState.WAITING for t in study.trials[1:])  # the storage is left as it was
    assert study.trials[0].values == [0.8]


def test_the_predicted_view_shows_reporting_trials_complete_at_the_models_end_value(monkeypatch):
    """benchmarks/sampler_views.py Predicted: before MIN_TRIALS trials have counted reports the
    study is seen as it is; then each paused trial is COMPLETE at the curve model's value at the
    last step, below its last report where curves fall, in the order of their configurations
    among the trials paused at one step (each curve is x plus one shared decay; across steps the
    model's short horizon ranks the trials paused earlier too low: RESULTS.md), and the storage is
    left as it was."""
    import optuna
    from optuna.trial import TrialState

    from sweep.store.record import PAUSED_AT

    module = _benchmark("sampler_views")
    monkeypatch.setenv("SWEEP_BENCH_STEPS", "1000")
    study = optuna.create_study()
    view = module.Predicted(study)
    xs = [0.05 * i for i in range(module.MIN_TRIALS + 2)]
    for i, x in enumerate(xs):
        stop = 100 if i % 2 else 300  # every other trial went on to step 300
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.WAITING, params={"x": x}, distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
            intermediate_values={step: x + 1 / (step / 100) ** 0.5 for step in range(100, stop + 1, 100)},
            user_attrs={PAUSED_AT: [stop]}))
        if i == module.MIN_TRIALS - 2:
            assert all(t.state == TrialState.WAITING for t in view.get_trials())  # too few: as it is
    seen = view.get_trials()
    assert [t.state for t in seen] == [TrialState.COMPLETE] * len(xs)
    values = [t.values[0] for t in seen]
    last = [t.intermediate_values[max(t.intermediate_values)] for t in study.trials]
    assert all(v < y for v, y in zip(values, last))
    for stop in (0, 1):  # x rises with the number: so do the predicted values of trials paused at one step
        assert values[stop::2] == sorted(values[stop::2])
    assert all(t.state == TrialState.WAITING and t.values is None for t in study.trials)


def test_the_real_run_report_counts_two_forms_of_a_rule_as_one_side_when_told():
    """benchmarks/freeze_thaw_real.py --report --same A=B: A's runs are reported as B's; a seed
    with two runs of one side is refused."""
    import pytest

    module = _benchmark("freeze_thaw_real")

    def row(side: str, seed: int, value: float) -> dict:
        return {"side": side, "seed": seed, "best_at_half": value, "best_at_budget": value}

    rows = [row("tpe+median", s, 0.05) for s in (0, 1)] + [row("freeze_thaw", s, 0.04) for s in (0, 1)]
    rows += [row("freeze_thaw+rung view", 0, 0.03), row("freeze_thaw+sampler_sees rung", 1, 0.02)]
    with pytest.raises(SystemExit, match="freeze_thaw\\+rung view seed 1: each seed needs every side"):
        module.report(rows, out=lambda line: None)
    lines: list[str] = []
    module.report(rows, out=lines.append, same={"freeze_thaw+rung view": "freeze_thaw+sampler_sees rung"})
    assert any(line.startswith("| freeze_thaw+sampler_sees rung | 0.0250 (0.0300, 0.0200) |") for line in lines)
    assert not any("rung view" in line for line in lines)
    with pytest.raises(SystemExit, match="two runs of freeze_thaw seed 0"):
        module.report([*rows, row("freeze_thaw", 0, 0.01)], out=lines.append)


def test_the_scheduler_report_keeps_other_worker_counts_apart_and_refuses_a_run_given_twice():
    """benchmarks/scheduler_sim.py --report: one-worker runs get their own table instead of
    replacing the 4-worker runs of the same (task, seed, method); the same run twice is refused."""
    import pytest

    module = _benchmark("scheduler_sim")

    def row(seed: int, best: float, **more: int) -> dict:
        return {"family": "f", "task": "t", "method": "a", "seed": seed, "best": [best] * 4, "y_star": 0.0,
                "y_worst": 1.0, **more}

    lines: list[str] = []
    module.report([row(0, 0.5), row(1, 0.5), row(0, 0.1, workers=1), row(1, 0.3, workers=1)], out=lines.append)
    tables = "\n".join(lines).split("\n\n")
    assert tables[0].startswith("f: 2 ") and "| a | 0.5000 [" in tables[0]
    assert tables[1].startswith("f, 1 workers: 2 ") and "| a | 0.2000 [" in tables[1]
    with pytest.raises(SystemExit, match=r"f: results repeat \(task, seed, method\) \('t', 1, 'a'\)"):
        module.report([row(0, 0.5), row(1, 0.5), row(1, 0.4)], out=lines.append)
