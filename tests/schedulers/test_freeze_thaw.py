"""scheduler freeze_thaw: the curve model picks which paused trial goes on (each continuation
records its prediction, which status shows), a continued trial equals a straight run, kill -9 and
SIGTERM at random moments change nothing (the model's fit is a function of the stored study),
plan says the decision the next free worker makes, two workers give each trial its one-process
curve, and bad study files exit 2 naming the key."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from conftest import (Running, cache_env, cli_here, gated_trial, interrupt_at_random, refused, run_cli, study_in,
                      study_of)

# Rungs at 100 and 200 of 400 steps, eta 2, and the model deciding from the second trial on: of 6
# trials, the model continues some before n_trials have started (the better of their rung) and
# every worthy one after; one ends PRUNED at its rung (tests/schedulers/test_asha.py's setup).
FT: dict[str, Any] = {
    "name": "ft",
    "n_trials": 6,
    "sampler": {"type": "random", "seed": 3},
    "pruner": {"type": "none"},
    "scheduler": {"type": "freeze_thaw", "min_steps": 100, "reduction_factor": 2, "initial_trials": 2},
    "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
    "fixed": {"batch_size": 32, "hidden": 32},
    "train": {"steps": 400, "eval_every": 50, "same_seed_for_all_trials": True},
    "checkpoint": {"every_steps": 100, "keep_last": 1, "keep_best": 1, "keep_trials": 1, "max_write_share": None},
}
CONTINUED = (r"trial (\d+): continued from rung (\d+), predicted val_loss=(\S+) ± (\S+) at step 400 "
             r"\(EI (\S+), P\(better\) (\S+)\), trains on to step (\d+)")


def _write(folder: Path, **override: Any) -> Path:
    return study_in(folder, FT, **override)


def _history(path: Path) -> list[tuple[Any, ...]]:
    """Everything an interrupted run must reproduce: params, values, reports, pauses, continuations
    and the prediction each was decided on."""
    return [(t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
             t.user_attrs.get("best_step"), t.user_attrs.get("paused_at"), t.user_attrs.get("rung_target"),
             t.user_attrs.get("promoted_at"), t.user_attrs.get("freeze_thaw"))
            for t in sorted(study_of(path).trials, key=lambda t: t.number)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's study file; its log (stderr) is run.log beside it."""
    study = _write(tmp_path_factory.mktemp("freeze_thaw"))
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    (study.parent / "run.log").write_text(result.stderr)
    return study


@pytest.mark.slow
def test_freeze_thaw_continues_by_the_model_and_a_continued_trial_equals_a_straight_run(uninterrupted, tmp_path):
    log = (uninterrupted.parent / "run.log").read_text()
    trials = sorted(study_of(uninterrupted).trials, key=lambda t: t.number)
    assert len(trials) == 6 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    continued = re.findall(CONTINUED, log)
    assert len(continued) >= 3, log
    # Each continuation's log line is its recorded prediction, which status --json shows; a trial
    # went on only from a rung it paused at, to its next rung or the end.
    status = {t["number"]: t for t in json.loads(cli_here("status", uninterrupted, "--json",
                                                          cwd=uninterrupted.parent).stdout)["trials"]}
    latest = 0
    for number, rung, mean, std, ei, probability, to in continued:
        t = trials[int(number)]
        why = status[int(number)]["freeze_thaw"]
        assert int(rung) in t.user_attrs["promoted_at"] and int(to) == (200 if rung == "100" else 400)
        if why["rung"] == int(rung):  # the latest continuation of the trial
            latest += 1
            assert (f"{why['mean']:.4g}", f"{why['std']:.2g}", f"{why['ei']:.3g}", f"{why['probability']:.2f}") == (
                mean, std, ei, probability)
            assert why["to"] == int(to) and 0 <= why["probability"] <= 1 and why["std"] > 0 and why["ei"] >= 0
    assert latest == len({number for number, *_ in continued})  # every continued trial's latest line was checked
    assert all(status[t.number]["freeze_thaw"] is None for t in trials if not t.user_attrs.get("promoted_at"))
    # Each went on from its rung checkpoint, which retention (keep_trials 1) kept while it was
    # paused: no step trained twice, no restore after a loss.
    assert all("resumed_from" not in t.user_attrs and t.user_attrs["ledger"]["lost_steps"] == 0 for t in trials)
    exported = cli_here("export", uninterrupted, "--out", str(tmp_path / "export"), cwd=uninterrupted.parent)
    assert exported.returncode == 0, exported.stderr
    index = json.loads((tmp_path / "export" / "index.json").read_text())["trials"]
    assert index and all(e["freeze_thaw"] == status[e["number"]]["freeze_thaw"] for e in index)
    # The first decisions were the model's, from the second trial on (initial_trials 2), before the
    # third trial started: the better trial of rung 100 goes on.
    assert log.index("trial 1: paused at rung 100") < log.index(" continued from rung 100") < log.index("trial 2: started")
    # The best COMPLETE trial, bit for bit, as the same params trained straight through without a scheduler.
    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    straight = _write(tmp_path, name="straight", n_trials=1, scheduler=None,
                      enqueue=[{"learning_rate": best.params["learning_rate"]}])
    result = run_cli("run", straight, cwd=tmp_path, env=cache_env(uninterrupted))
    assert result.returncode == 0, result.stderr
    (ref,) = study_of(straight).trials
    assert ref.intermediate_values == best.intermediate_values and ref.value == best.value


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_freeze_thaw_killed_at_random_moments_equals_an_uninterrupted_run(uninterrupted, tmp_path, signum, seed):
    """kill -9 or SIGTERM as the model continues a trial, then at random moments (decisions,
    starts, steps, saves): the same command ends with the same study, predictions included."""
    path = _write(tmp_path)
    kills = interrupt_at_random(path, signum, r"continued from rung 100", seed=seed, env=cache_env(uninterrupted))
    result = run_cli("run", path, cwd=tmp_path, env=cache_env(uninterrupted))
    assert result.returncode == 0, result.stderr
    assert kills >= 2
    assert _history(path) == _history(uninterrupted)


@pytest.mark.slow
def test_with_sampler_sees_rung_a_killed_run_equals_an_uninterrupted_one(tmp_path, seed):
    """`sampler_sees: rung`: TPE (2 start-up trials) learns from the paused trials' reports at a
    rung, which a kill -9 at random moments leaves as they were: the same command ends with the
    same study (params included) as a run never interrupted, and other params than TPE seeing
    finished trials only."""
    rung = {"sampler": {"type": "tpe", "seed": 3, "n_startup_trials": 2},
            "scheduler": {**FT["scheduler"], "sampler_sees": "rung"}}
    straight = _write(tmp_path / "straight", **rung)
    result = run_cli("run", straight, cwd=straight.parent)
    assert result.returncode == 0, result.stderr
    path = _write(tmp_path / "killed", **rung)
    kills = interrupt_at_random(path, signal.SIGKILL, r"trial 3: started", seed=seed, env=cache_env(straight))
    result = run_cli("run", path, cwd=path.parent, env=cache_env(straight))
    assert result.returncode == 0, result.stderr
    assert kills >= 2
    assert _history(path) == _history(straight)
    finished = _write(tmp_path / "finished", **{**rung, "scheduler": FT["scheduler"]})
    result = run_cli("run", finished, cwd=finished.parent, env=cache_env(straight))
    assert result.returncode == 0, result.stderr
    params = [t.params for t in sorted(study_of(straight).trials, key=lambda t: t.number)]
    assert params != [t.params for t in sorted(study_of(finished).trials, key=lambda t: t.number)]


@pytest.mark.slow
def test_plan_says_the_decision_the_next_free_worker_makes(uninterrupted, tmp_path, held):
    """One run is held mid-trial (tests/trials/gated.py) once every trial has started; plan then
    names the paused trial a free worker continues, with its prediction, and a second run on the
    same study, that free worker, continues exactly that one."""
    # The run's 25th evaluation (each trial's 50 and 100, and a continued trial's first at its
    # rung again, in the uninterrupted run's order): trial 2's at step 150, after its continuation
    # from rung 100; from that line on, nothing a decision reads changes.
    trial = gated_trial(tmp_path, at=25)
    path = _write(tmp_path, trial=trial)
    hold = held(tmp_path / "hold")
    first = Running("run", str(path), cwd=tmp_path, env=cache_env(uninterrupted))
    first.wait_for(r"trial 2: goes on from its pause at step 100")
    plan = cli_here("plan", path, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    line = next((x for x in plan.stdout.splitlines() if x.startswith("  next:")), None)
    planned = re.search(r"continues trial (\d+) from step (\d+) to (\d+): predicted val_loss=(\S+) ± (\S+) at step "
                        r"400 \(EI (\S+), P\(better than \S+\) (\S+)\)", line or "")
    assert planned, plan.stdout
    assert "  running: trial 2 (a live worker has it" in plan.stdout
    assert plan.stdout.splitlines()[-1] == "run would decide on 4 paused trials", plan.stdout
    second = Running("run", str(path), cwd=tmp_path, env=cache_env(uninterrupted))
    done = second.wait_for(CONTINUED)
    number, rung, to = planned.group(1, 2, 3)
    assert done.group(1, 2, 7) == (number, rung, to), (plan.stdout, second.stderr)
    assert done.group(3, 4, 5, 6) == planned.group(4, 5, 6, 7)
    hold.unlink()
    assert [first.finish(), second.finish()] == [0, 0], (first.stderr[-3000:], second.stderr[-3000:])
    assert len(study_of(path).trials) == 6


@pytest.mark.slow
def test_freeze_thaw_two_workers_give_each_trial_its_one_process_curve(uninterrupted, tmp_path):
    """Two workers: which paused trial goes on depends on which reached its rung first, but each
    trial runs once, pauses at its rungs, and its curve is the one-process run's, bit for bit."""
    path = _write(tmp_path, parallel={"n_jobs": 2})
    result = run_cli("run", path, cwd=tmp_path, env=cache_env(uninterrupted))
    assert result.returncode == 0, result.stderr
    trials = sorted(study_of(path).trials, key=lambda t: t.number)
    alone = {t.number: t for t in study_of(uninterrupted).trials}
    assert len(trials) == 6 and any(t.state.name == "COMPLETE" for t in trials)
    assert re.search(CONTINUED, result.stderr), result.stderr  # the model continued trials here too
    for t in trials:
        assert result.stderr.count(f"trial {t.number}: started with params") == 1, result.stderr
        assert t.params == alone[t.number].params
        assert all(r in (100, 200) for r in t.user_attrs["paused_at"]), t.user_attrs["paused_at"]
        common = set(t.intermediate_values) & set(alone[t.number].intermediate_values)
        assert common and all(t.intermediate_values[s] == alone[t.number].intermediate_values[s] for s in common)


BAD = [
    ("with-pruner", {"pruner": {"type": "median"}}, "pruner.type: must be none with scheduler freeze_thaw"),
    ("no-min-steps", {"scheduler": {"type": "freeze_thaw"}}, "scheduler.min_steps: is required"),
    ("min-steps-off-evaluation", {"scheduler": {"type": "freeze_thaw", "min_steps": 120}},
     "scheduler.min_steps: must be a multiple of train.eval_every (50)"),
    ("one-initial-trial", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "initial_trials": 1}},
     "scheduler.initial_trials: must be >= 2, got 1"),
    ("probability-one", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "min_probability": 1.0}},
     "scheduler.min_probability: must be < 1, got 1.0"),
    ("negative-seed", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "seed": -1}},
     "scheduler.seed: must be >= 0, got -1"),
    ("seed-beyond-32-bits", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "seed": 2**32}},
     "scheduler.seed: must be < 4294967296, got 4294967296"),
    ("negative-probability", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "min_probability": -0.1}},
     "scheduler.min_probability: must be >= 0, got -0.1"),
    ("initial-trials-beyond-n-trials", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "initial_trials": 7}},
     "scheduler.initial_trials: must be <= n_trials (6): the model decides once that many trials have reported, "
     "got 7"),
    ("unknown-key", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "beyond_top": True}},
     "scheduler.beyond_top: unknown key (allowed: type, min_steps, reduction_factor, sampler_sees, initial_trials, "
     "min_probability, seed)"),
    ("sampler-sees-unknown", {"scheduler": {"type": "freeze_thaw", "min_steps": 100, "sampler_sees": "best"}},
     "scheduler.sampler_sees: must be one of 'finished' or 'rung', got 'best'"),
    ("typo", {"scheduler": {"type": "freeze-thaw", "min_steps": 100}},
     "scheduler.type: must be one of 'asha', 'hyperband', 'pbt' or 'freeze_thaw' (did you mean 'freeze_thaw'?), "
     "got 'freeze-thaw'"),
]


@pytest.mark.parametrize("override,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_freeze_thaw_bad_study_file_exits_2_naming_the_key(tmp_path, monkeypatch, capsys, override, fragment):
    monkeypatch.chdir(tmp_path)
    refused(_write(tmp_path, **override), capsys, fragment)


# --- the decision itself, on studies built in the scheduler simulator (fast: no trial trains) ---

SPACE = {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
         "hidden": {"type": "int", "low": 16, "high": 256, "step": 16}}


def _curve(number: int, params: dict[str, Any]) -> Any:
    """A synthetic curve: better near learning rate 3e-3 and with wider layers."""
    import math

    from sweep.run.simulator import Curve

    q = abs(math.log10(params["learning_rate"]) + 2.5) + 16.0 / params["hidden"]
    return Curve({s: q + 1.0 / (1.0 + s * params["learning_rate"]) for s in range(100, 2001, 100)})


def _simulated(n_trials: int, max_steps: int, **scheduler: Any) -> tuple[Any, Any]:
    from sweep.run.simulator import simulate
    from sweep.study import config as config_lib

    config = config_lib.from_dict({
        "name": "ft-unit", "trial": "trials.digits_mlp", "n_trials": n_trials,
        "objective": {"metric": "val_loss", "direction": "minimize"}, "sampler": {"type": "random", "seed": 0},
        "scheduler": {"type": "freeze_thaw", "min_steps": 100, "reduction_factor": 3, **scheduler},
        "search_space": SPACE, "train": {"steps": 2000, "eval_every": 100}}, import_trial=False)
    return config, simulate(config, _curve, workers=2, max_steps=max_steps).trials


def _decisions(config: Any, trials: Any) -> list[Any]:
    """What a free worker decides while trials may start, and once n_trials have started."""
    out = []
    for can_start in (True, False):
        p = config.study.scheduler.choose(config, trials, can_start)
        out.append(p and {"number": p.number, **p.record()})
    return out


def test_a_decision_is_the_same_one_made_again_and_with_x64_enabled():
    """The model is fitted from the stored trials with a fixed seed: a decision made again (a
    rerun after a kill, `plan`, another worker) is the same one, to the last bit, even where a
    trial module enabled JAX's 64-bit mode in that process; and while trials may start, only a
    trial in its rung's top by asha's ranking is continued."""
    import jax

    from sweep.schedulers.asha import next_promotion

    config, trials = _simulated(100, 20 * 312)
    here = _decisions(config, trials)
    assert here[1] is not None and sum(1 for t in trials if t.state.name == "WAITING") >= 10
    assert _decisions(config, trials) == here
    with jax.enable_x64(True):
        assert _decisions(config, trials) == here
    if here[0] is not None:  # continued while trials may start: asha would promote it
        alone = [t for t in trials if t.number == here[0]["number"] or t.state.name != "WAITING"]
        ranked = next_promotion(config, alone)
        assert ranked is not None and ranked.number == here[0]["number"]


def test_the_top_of_a_rung_breaks_ties_by_the_lower_number_as_asha_does():
    """Four trials reached rung 100 with the same value; with reduction_factor 3 the top is one
    trial, the lowest-numbered, as in asha's ranking, not every trial tied at the cutoff."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from sweep.schedulers.freeze_thaw import FreezeThaw

    dist = {"learning_rate": FloatDistribution(1e-4, 1e-1, log=True)}
    trials = []
    for number in range(4):
        t = create_trial(state=TrialState.WAITING, params={"learning_rate": 1e-3 * (number + 1)}, distributions=dist,
                         intermediate_values={100: 0.5}, user_attrs={"paused_at": [100]})
        t.number = number
        trials.append(t)
    del optuna
    ft = FreezeThaw(type="freeze_thaw", min_steps=100, reduction_factor=3)
    assert ft._top_of_rung(trials, 1) == {0}
    assert ft._top_of_rung(trials[1:], 1) == {1}
