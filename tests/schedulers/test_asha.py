"""scheduler asha: trials pause at their rungs, the top 1/eta go on from their rung checkpoints
(bit-identical to a straight run, no step trained twice), a kill -9 changes nothing, retention
keeps what a paused trial needs, and bad study files exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from conftest import (cache_env, cli_here, interrupt_at_random, kill9, logged_decisions, refused, replay_outcome, run_cli,
                      Running, simulated, study_in, study_of)
from sweep.__main__ import main
from sweep.run.simulator import Recorded, simulate
from sweep.study import config as config_lib

# Rungs at 100 and 200 of 400 steps, eta 2: with 5 trials some stay paused, some go on. One
# sampled float (traced: one compilation per process); the same initialisation and data order for
# every trial number, so that a straight run of the same params is comparable.
ASHA: dict[str, Any] = {
    "name": "asha",
    "n_trials": 5,
    "sampler": {"type": "random", "seed": 3},
    "pruner": {"type": "none"},
    "scheduler": {"type": "asha", "min_steps": 100, "reduction_factor": 2},
    "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
    "fixed": {"batch_size": 32, "hidden": 32},
    "train": {"steps": 400, "eval_every": 50, "same_seed_for_all_trials": True},
    # keep_trials 1: the disk budget runs after every COMPLETE trial and at every start, while
    # other trials are paused; keep_last 1: a trial keeps only its newest step (plus its best).
    "checkpoint": {"every_steps": 100, "keep_last": 1, "keep_best": 1, "keep_trials": 1, "max_write_share": None},
}


def _write(folder: Path, **override: Any) -> Path:
    """The study file of ASHA + `override` in `folder` (a key overridden with None is left out)."""
    return study_in(folder, ASHA, **override)


_cache = cache_env  # the compilation cache the uninterrupted run filled


def _history(path: Path) -> list[tuple[Any, ...]]:
    """Everything an interrupted run must reproduce: params, values, reports, pauses, promotions."""
    return [(t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
             t.user_attrs.get("best_step"), t.user_attrs.get("last_step"), t.user_attrs.get("paused_at"),
             t.user_attrs.get("rung_target"), t.user_attrs.get("promoted_at"), t.user_attrs.get("resumed_from"))
            for t in sorted(study_of(path).trials, key=lambda t: t.number)]


def _check_pauses(trials: list[Any]) -> None:
    """Every trial paused at its rungs in order; each promotion resumed from its rung checkpoint
    (which retention kept), no step trained twice; a trial left paused ends PRUNED at its rung."""
    for t in trials:
        rungs = t.user_attrs["paused_at"]
        assert all(r in (100, 200) for r in rungs) and rungs == sorted(set(rungs)), (t.number, rungs)
        if t.state.name == "PRUNED":  # never promoted past its last rung: its value is its rung value
            assert t.value == t.intermediate_values[rungs[-1]] and max(t.intermediate_values) == rungs[-1]
        # promotions apart from interruptions (resumed_from): these runs were not interrupted
        assert t.user_attrs.get("promoted_at", []) == (rungs if t.state.name == "COMPLETE" else rungs[:-1]), (
            t.number, rungs, t.user_attrs.get("promoted_at"))
        assert "resumed_from" not in t.user_attrs, (t.number, t.user_attrs["resumed_from"])
        assert t.user_attrs["ledger"]["lost_steps"] == 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's study file; its log (stderr) is run.log beside it."""
    study = _write(tmp_path_factory.mktemp("asha"))
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    (study.parent / "run.log").write_text(result.stderr)
    return study


@pytest.mark.slow
def test_asha_pauses_promotes_and_a_promoted_trial_equals_a_straight_run(uninterrupted, tmp_path):
    trials = sorted(study_of(uninterrupted).trials, key=lambda t: t.number)
    assert len(trials) == 5
    paused = [t for t in trials if t.user_attrs.get("paused_at")]
    assert len(paused) == 5  # every trial paused at its first rung
    promoted = [t for t in trials if t.user_attrs.get("promoted_at")]
    assert promoted and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    _check_pauses(trials)

    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert complete and all(t.user_attrs["paused_at"] == [100, 200] for t in complete)
    # status shows each trial's path through the rungs: a COMPLETE one went on from both to the end
    table = cli_here("status", uninterrupted, cwd=uninterrupted.parent).stdout.splitlines()
    assert table[1].split()[:3] == ["number", "state", "rungs"], table
    paths = {int(line.lstrip("* ").split()[0]): line.lstrip("* ").split()[2] for line in table[2:2 + len(trials)]}
    assert all(paths[t.number] == "100->200->400" for t in complete), paths
    assert all(paths[t.number] == "->".join(map(str, t.user_attrs["paused_at"])) for t in trials if t not in complete)
    # The promoted trial, bit for bit, as the same params trained straight through without a scheduler.
    best = min(complete, key=lambda t: t.value)
    straight = _write(tmp_path, name="straight", n_trials=1, scheduler=None,
                      enqueue=[{"learning_rate": best.params["learning_rate"]}])
    result = run_cli("run", straight, cwd=tmp_path, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    (ref,) = study_of(straight).trials
    assert ref.params == best.params and "paused_at" not in ref.user_attrs
    assert ref.intermediate_values == best.intermediate_values and ref.value == best.value
    assert ref.user_attrs["best_step"] == best.user_attrs["best_step"]


@pytest.mark.slow
def test_the_simulator_replays_the_real_asha_run_to_its_decisions(uninterrupted):
    """The scheduler simulator (sweep/run/simulator.py) on the real digits run's own curves makes
    its starts, pauses, promotions and ends in the same order, with the same params and results."""
    real = sorted(study_of(uninterrupted).trials, key=lambda t: t.number)
    logged = logged_decisions((uninterrupted.parent / "run.log").read_text().splitlines())
    assert {"start", "pause", "promote"} <= {d[0] for d in logged}, logged
    here = os.getcwd()
    os.chdir(uninterrupted.parent)  # the study file's relative paths, as its run read them
    try:
        sim = simulate(config_lib.load(uninterrupted, import_trial=False), Recorded(real))
    finally:
        os.chdir(here)
    assert simulated(sim.decisions) == logged
    assert replay_outcome(sim.trials) == replay_outcome(real)


@pytest.mark.slow
def test_asha_kill9_then_same_command_equals_an_uninterrupted_run(uninterrupted, tmp_path, capsys):
    """Killed as a trial is promoted, then as one pauses at the top rung: the same study."""
    path = _write(tmp_path)
    proc = Running("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    proc.wait_for(r"trial \d+: promoted from rung 100")
    kill9(proc)
    assert main(["status", str(path), "--json"]) == 0
    status = capsys.readouterr().out
    paused = [t for t in json.loads(status)["trials"] if t["state"] == "PAUSED"]
    assert paused, status
    for t in paused:  # each paused trial keeps the checkpoint of its rung
        assert t["rung"] == t["paused_at"][-1] and t["value"] is None
        assert (Path(t["checkpoint_dir"]) / str(t["rung"])).is_dir()
    assert main(["plan", str(path)]) == 0
    plan = capsys.readouterr().out
    assert f"  paused:  trial {paused[0]['number']} at step {paused[0]['rung']}" in plan, plan
    # The live view's study line counts them too (run's progress, as another host watching sees it).
    from sweep.commands import progress
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    session = Session(config_lib.load(path))
    monitor = progress.Monitor(session)
    try:
        study_line, _ = monitor.poll()
    finally:
        monitor.close()
        session.close()
    assert study_line.paused == len(paused)
    assert f"{len(paused)} paused at a rung" in progress.study_text(study_line, "val_loss")
    # Killed again, at another moment: as a trial pauses at the top rung, or just after.
    proc = Running("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    proc.wait_for(r"trial \d+: paused at rung 200")
    kill9(proc)
    again = run_cli("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    assert again.returncode == 0, again.stderr
    assert _history(path) == _history(uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("signum,journal", [(signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGKILL, True)],
                         ids=["kill9", "sigterm", "kill9-journal"])
def test_asha_killed_at_random_moments_equals_an_uninterrupted_run(uninterrupted, tmp_path, signum, journal, seed):
    """kill -9 or SIGTERM as a trial pauses at its first rung, then at random moments (pauses,
    promotions, steps, saves): the same command ends with the same study, no step trained twice.
    On a journal file too (issue 41): the same study as the uninterrupted one's on SQLite."""
    path = _write(tmp_path, **({"storage": f"journal://{tmp_path / 'shared' / 'asha.log'}"} if journal else {}))
    kills = interrupt_at_random(path, signum, r"paused at rung 100", seed=seed, env=_cache(uninterrupted))
    result = run_cli("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    assert kills >= 2
    # `resumed_from` holds the resumes after its interruptions, apart from the promotions: the rest is the same
    assert [h[:-1] for h in _history(path)] == [h[:-1] for h in _history(uninterrupted)]


@pytest.mark.slow
def test_asha_two_workers_never_take_a_paused_trial_as_new(uninterrupted, tmp_path):
    """Two workers: a trial pauses under the study's ask lock and sweep's ask never pops a paused
    trial, so no worker takes one as a WAITING trial of its own (seen once before both: the trial
    trained again from its rung). A race: this run may pass without them; it checks the rest."""
    path = _write(tmp_path, n_trials=6, parallel={"n_jobs": 2})
    result = run_cli("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    trials = sorted(study_of(path).trials, key=lambda t: t.number)
    assert len(trials) == 6 and any(t.state.name == "COMPLETE" for t in trials)
    _check_pauses(trials)
    for t in trials:
        assert result.stderr.count(f"trial {t.number}: started with params") == 1, result.stderr


@pytest.mark.slow
def test_asha_two_hosts_on_postgres_each_curve_equals_the_one_process_run(uninterrupted, tmp_path, postgres_url):
    """Two hosts on one PostgreSQL study: which paused trial goes on depends on which trials reached
    their rungs first (docs/schedulers.md), but each trial runs once, pauses and promotes by the
    rules, and its curve is bit for bit the one-process run's of the same trial."""
    path = _write(tmp_path, storage=postgres_url)
    hosts = [Running("run", path, cwd=tmp_path, env={**_cache(uninterrupted), "SWEEP_HOST": f"host{i}"})
             for i in range(2)]
    assert [h.finish() for h in hosts] == [0, 0], [h.stderr[-3000:] for h in hosts]
    trials = sorted(study_of(path).trials, key=lambda t: t.number)
    alone = {t.number: t for t in study_of(uninterrupted).trials}
    assert len(trials) == 5 and any(t.state.name == "COMPLETE" for t in trials)
    _check_pauses(trials)
    for t in trials:
        assert sum(h.stderr.count(f"trial {t.number}: started with params") for h in hosts) == 1
        assert t.params == alone[t.number].params
        common = set(t.intermediate_values) & set(alone[t.number].intermediate_values)
        assert common and all(t.intermediate_values[s] == alone[t.number].intermediate_values[s] for s in common)


@pytest.mark.slow
def test_hyperband_brackets_start_at_their_rungs_and_rank_within_themselves(uninterrupted, tmp_path):
    """Rungs 100 and 200: bracket 0 (trials 0, 3) starts at 100, bracket 1 (1, 4) at 200,
    bracket 2 (2, 5) trains straight to 400; a trial is ranked against its own bracket only."""
    path = _write(tmp_path, n_trials=6, scheduler={"type": "hyperband", "min_steps": 100, "reduction_factor": 2})
    result = run_cli("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    trials = sorted(study_of(path).trials, key=lambda t: t.number)
    straight = [t for t in trials if t.number % 3 == 2]
    assert all(t.state.name == "COMPLETE" and "paused_at" not in t.user_attrs and max(t.intermediate_values) == 400
               for t in straight)
    _check_pauses([t for t in trials if t.number % 3 != 2])
    assert all(t.user_attrs["paused_at"][0] == (100 if t.number % 3 == 0 else 200) for t in trials if t.number % 3 != 2)
    # At rung 200 three trials had reported (1 and 4 of bracket 1, 3 of bracket 0); trial 1 ranks among two.
    assert "trial 1: promoted from rung 200 (" in result.stderr and "rank 1 of 2), trains on to step 400" in result.stderr


@pytest.mark.slow
def test_asha_scheduler_edit_of_a_started_study_is_refused(uninterrupted, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(uninterrupted.parent, copy)
    path = _write(copy, scheduler={"type": "asha", "min_steps": 100, "reduction_factor": 3})
    before = (copy / "runs" / "study.db").read_bytes()
    result = cli_here("run", path, cwd=copy)
    assert result.returncode == 2, result.stderr
    assert "scheduler.reduction_factor" in result.stderr and "Traceback" not in result.stderr
    assert (copy / "runs" / "study.db").read_bytes() == before


BAD = [
    ("with-pruner", {"pruner": {"type": "median"}}, "pruner.type: must be none with scheduler asha"),
    ("min-steps-at-end", {"scheduler": {"type": "asha", "min_steps": 400}},
     "scheduler.min_steps: must be < train.steps (400)"),
    ("min-steps-off-evaluation", {"scheduler": {"type": "asha", "min_steps": 120}},
     "scheduler.min_steps: must be a multiple of train.eval_every (50)"),
    ("unknown-key", {"scheduler": {"type": "asha", "min_steps": 100, "eta": 3}},
     "scheduler.eta: unknown key (allowed: type, min_steps, reduction_factor, sampler_sees)"),
    ("unknown-type", {"scheduler": {"type": "ppo", "min_steps": 100}},
     "scheduler.type: must be one of 'asha', 'hyperband', 'pbt' or 'freeze_thaw', got 'ppo'"),
    ("a-pbt-key", {"scheduler": {"type": "asha", "min_steps": 100, "population": 4}},
     "scheduler.population: only with type pbt (keys of type asha: min_steps, reduction_factor, sampler_sees), got 4"),
    ("eta-one", {"scheduler": {"type": "asha", "min_steps": 100, "reduction_factor": 1}},
     "scheduler.reduction_factor: must be >= 2, got 1"),
    ("no-min-steps", {"scheduler": {"type": "asha"}}, "scheduler.min_steps: is required"),
    ("several-objectives", {"objective": None, "objectives": [{"metric": "val_loss"},
                                                              {"metric": "val_accuracy", "direction": "maximize"}]},
     "scheduler.type: takes one objective only"),
]


@pytest.mark.parametrize("override,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_asha_bad_study_file_exits_2_naming_the_key(tmp_path, monkeypatch, capsys, override, fragment):
    monkeypatch.chdir(tmp_path)
    refused(_write(tmp_path, **override), capsys, fragment)
