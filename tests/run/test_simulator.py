"""The scheduler simulator (sweep/run/simulator.py) makes a real run's decisions: a recorded asha,
hyperband or median-pruner run, replayed on its own curves, gives the same starts, pauses,
promotions, prunes and ends in the same order, the same params and the same final states and
values; bad input is refused by key.

The fast tier: the recorded run is `worker.run` of the tiny linear trial in this process (the
slow tier replays the digits MLP's real asha run of tests/schedulers/test_asha.py)."""

from __future__ import annotations

from typing import Any, Mapping

import pytest
import yaml

from conftest import logged_decisions, make_study, messages, replay_outcome, run, simulated, trials
from sweep.errors import ConfigError
from sweep.run.simulator import Curve, Recorded, simulate
from sweep.study import config as config_lib

# 10 trials of 40 steps, rungs at 10 and 20 (eta 2): TPE past its first 4 random trials, so that the
# sampler's draws depend on what the earlier decisions made of the study.
ASHA = {"n_trials": 10, "sampler": {"type": "tpe", "seed": 1, "n_startup_trials": 4},
        "scheduler": {"type": "asha", "min_steps": 10, "reduction_factor": 2},
        "checkpoint": {"every_steps": 10, "keep_last": 1}}

# The same study under hyperband (brackets of the same rungs), and under Optuna's median pruner with
# no scheduler (its decisions: prune, at a report, against the other trials' reports by then).
REPLAYED = {
    "asha": (ASHA, {"start", "pause", "promote", "end", "complete"}),
    "hyperband": ({**ASHA, "scheduler": {"type": "hyperband", "min_steps": 10, "reduction_factor": 2}},
                  {"start", "pause", "promote", "complete"}),
    "median": ({**{k: v for k, v in ASHA.items() if k != "scheduler"},
                "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 10}},
               {"start", "prune", "complete"}),
}


@pytest.mark.parametrize("kind", sorted(REPLAYED))
def test_a_recorded_run_replays_to_the_same_decisions(here, sweep_log, kind):
    override, kinds = REPLAYED[kind]
    study = make_study(here, **override)
    run(study)
    real = trials(study)
    logged = logged_decisions(messages(sweep_log))
    assert [d[0] for d in logged].count("start") == 10 and kinds <= {d[0] for d in logged}, logged

    sim = simulate(config_lib.from_dict(study), Recorded(real), workers=1)
    assert simulated(sim.decisions) == logged
    assert replay_outcome(sim.trials) == replay_outcome(real)


def test_the_replay_tells_a_changed_curve_apart(here, sweep_log):
    """The comparison can fail: the first promoted trial's curve made worse, it is not promoted."""
    study = make_study(here, **{**ASHA, "n_trials": 6, "sampler": {"type": "random", "seed": 1}})
    run(study)
    real = trials(study)
    logged = logged_decisions(messages(sweep_log))
    promoted = next(d[1] for d in logged if d[0] == "promote")
    table = Recorded(real)

    def worse(number: int, params: Mapping[str, Any]) -> Curve:
        """Its curve 100 worse; each curve flat past its last recorded step (reached now, maybe)."""
        values = table(number, params).values
        return Curve({s: values[max(k for k in values if k <= s)] + 100.0 * (number == promoted)
                      for s in range(10, 41, 10)})

    sim = simulate(config_lib.from_dict(study), worse)
    assert simulated(sim.decisions) != logged
    assert ("promote", promoted) not in [(d.kind, d.number) for d in sim.decisions]
    assert simulated(simulate(config_lib.from_dict(study), table).decisions) == logged  # unchanged, the same


def test_simulations_are_deterministic_and_keep_to_the_budget(here):
    study = {**make_study(here, **ASHA), "n_trials": 60}

    def table(number: int, params: Mapping[str, Any]) -> Curve:
        lr = params["learning_rate"]
        return Curve({s: abs(lr - 0.05) + 1.0 / (1.0 + s * lr) for s in range(10, 41, 10)}, seconds_per_step=lr)

    config = config_lib.from_dict(study)
    first, second = simulate(config, table, workers=3), simulate(config, table, workers=3)
    assert first.decisions == second.decisions and first.reports == second.reports
    assert [d.kind for d in first.decisions].count("start") == 60 and first.used > 0
    cut = simulate(config, table, workers=3, max_steps=first.used // 2)
    assert first.used // 2 <= cut.used <= first.used // 2 + 10  # stopped at the evaluation that spent it
    assert cut.decisions == first.decisions[:len(cut.decisions)]  # the same run, stopped early


@pytest.mark.parametrize("override,key", [
    ({"scheduler": {"type": "pbt", "interval_steps": 10, "population": 4}, "n_trials": 8},
     "scheduler.type"),
    ({"objectives": [{"metric": "val_loss"}, {"metric": "val_loss", "direction": "maximize"}],
      "objective": None, "scheduler": None, "sampler": {"type": "nsga2", "seed": 0}}, "objectives"),
    ({"warm_start": {"study": "other.yaml"}, "scheduler": None}, "warm_start"),
])
def test_what_the_simulator_cannot_simulate_is_refused_by_key(here, override, key):
    study = {k: v for k, v in {**make_study(here, **ASHA), **override}.items() if v is not None}
    (here / "other.yaml").write_text(yaml.safe_dump({**make_study(here), "name": "other"}))
    with pytest.raises(ConfigError) as raised:
        simulate(config_lib.from_dict(study), lambda n, p: Curve({}))
    assert raised.value.key == key, str(raised.value)


def test_a_table_without_a_reached_step_names_it(here):
    config = config_lib.from_dict(make_study(here, **ASHA))
    with pytest.raises(KeyError) as raised:
        simulate(config, lambda n, p: Curve({10: 1.0}))
    assert raised.value.args == (20,)
