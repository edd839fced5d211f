"""`continue`: finished trials trained further in a companion study (in-process; the CLI with a
real kill is in test_resume.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Killed, make_study, run, run_killed, snapshot, trials
from sweep import api
from sweep.checkpoints import integrity
from sweep.commands import continuation
from sweep.errors import StudyNotFound, UsageError
from sweep.host.signals import StopSignal
from sweep.run import worker
from sweep.study import config as config_lib


def continued(study: dict[str, Any], steps: int, top: int | None = None, numbers: list[int] | None = None,
              kill_at: int | None = None) -> None:
    """`continue` of the study in this process; killed (as kill -9 would) at step `kill_at`."""
    session = continuation.start(config_lib.from_dict(study), steps, top, numbers)
    if kill_at is not None:
        def on_step(number: int, step: int) -> None:
            if step >= kill_at:
                raise Killed
        session.watch_steps(on_step)
    try:
        api.StudySession(session)._check_before_run()  # what run() checks first
        if kill_at is None:
            worker.run(session, StopSignal())
        else:
            with pytest.raises(Killed):
                worker.run(session, StopSignal())
    finally:
        session.close()


def companion(study: dict[str, Any], steps: int) -> dict[str, Any]:
    """The companion study, as `trials` and `snapshot` read it (they find the storage by workdir)."""
    return {**study, "name": f"{study['name']}.continued-{steps}"}


def test_continued_trial_is_bit_identical_to_one_trained_that_long_and_survives_a_kill(here):
    # Trial 1 of a 40-step study, continued to 80 steps (killed at step 70 on the way, then the
    # same command again), equals trial 1 of the same study trained 80 steps from the start: its
    # keys and data order are trial 1's, though it is trial 0 of the companion study.
    ref = make_study(here / "ref", n_trials=2, train={"steps": 80, "eval_every": 10, "seed": 0})
    run(ref)
    study = make_study(here, n_trials=2)
    run(study)
    continued(study, 80, numbers=[1], kill_at=70)
    continued(study, 80, numbers=[1])
    (got,) = snapshot(companion(study, 80))
    want = snapshot(ref)[1]
    assert got[1:] == want[1:]  # state, params, value, every report, best and last step, metrics
    (t,) = trials(companion(study, 80))
    assert t.user_attrs["continued_from"] == {"study": "sched", "number": 1, "last_step": 40}
    assert t.user_attrs["resumed_from"] == [40, 60]  # carried over at 40, resumed at 60 after the kill
    assert t.user_attrs["ledger"]["interruptions"] == 1 and t.user_attrs["ledger"]["lost_steps"] == 0
    # The whole training state at step 80 (params, optimizer state, key, ...), by its checksum.
    got_sum = integrity.read_checksum(here / "runs" / "continued-80" / "checkpoints" / "trial_0000", 80)
    assert got_sum == integrity.read_checksum(here / "ref" / "runs" / "checkpoints" / "trial_0001", 80)
    assert got_sum is not None
    # The same command once more trains nothing; the study itself is untouched.
    before = snapshot(companion(study, 80))
    continued(study, 80, numbers=[1])
    assert snapshot(companion(study, 80)) == before
    assert [t.user_attrs["last_step"] for t in trials(study)] == [40, 40]


def test_continue_top_k_takes_the_best_complete_trials(here):
    study = make_study(here, n_trials=3)
    run(study)
    continued(study, 60, top=2)
    best = sorted(trials(study), key=lambda t: (t.value, t.number))[:2]
    got = trials(companion(study, 60))
    assert [t.user_attrs["continued_from"]["number"] for t in got] == sorted(t.number for t in best)
    assert all(t.state.name == "COMPLETE" and t.user_attrs["last_step"] == 60 for t in got)


@pytest.mark.parametrize("case", ["steps-not-more", "not-complete", "unknown", "last-step-removed", "no-study"])
def test_continue_refuses_clearly_and_creates_nothing(here, case):
    study = make_study(here, n_trials=2, checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": 1})
    if case == "not-complete":
        run_killed(study, 1, 20)  # trial 1 stays RUNNING
    elif case != "no-study":
        run(study)
    worst = max(trials(study), key=lambda t: t.value or 0).number if case != "no-study" else 0
    args, message = {
        "steps-not-more": ((40, None, [0]), "cannot continue trial 0 to 40 steps: it has trained 40 already"),
        "not-complete": ((80, None, [1]), "cannot continue trial 1 of study 'sched': it is RUNNING, neither COMPLETE nor PRUNED"),
        "unknown": ((80, None, [7]), "cannot continue trial 7 of study 'sched': it does not exist"),
        "last-step-removed": ((80, None, [worst]), f"cannot continue trial {worst}: its last step 40 was not kept "
                                                   "(its checkpoints were removed (keep_trials 1:"),
        "no-study": ((80, 1, None), "study 'sched' not found"),
    }[case]
    error = StudyNotFound if case == "no-study" else UsageError
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        continued(study, *args)
    assert not (Path(study["workdir"]) / f"continued-{args[0]}").exists()
    with pytest.raises(StudyNotFound, match="has no trials continued to"):
        continuation.open_companion(config_lib.from_dict(study), args[0])


@pytest.mark.slow
def test_cli_continue_killed_and_rerun_equals_a_longer_study(write_study, reference, tmp_path):
    import json

    import yaml

    from conftest import Running, kill9, cli_here, run_cli, study_of, wait_for_checkpoint
    from conftest import snapshot as cli_snapshot

    study = write_study(n_trials=2, pruner={"type": "none"})
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    workdir = Path(yaml.safe_load(study.read_text())["workdir"])
    folder = workdir / "continued-2400" / "checkpoints" / "trial_0000"
    proc = Running("continue", study, "--trial", "1", "--steps", "2400", cwd=study.parent)
    wait_for_checkpoint(folder, 1200)
    kill9(proc)
    storage = f"sqlite:///{workdir}/study.db"
    import optuna

    (killed,) = optuna.load_study(study_name="t.continued-2400", storage=storage).trials
    reached = max(killed.intermediate_values)
    resumes_at = max(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    again = run_cli("continue", study, "--trial", "1", "--steps", "2400", cwd=study.parent)
    assert again.returncode == 0, again.stderr
    assert f"trial 0: interrupted, will resume from its newest checkpoint, step {resumes_at}" in again.stderr
    (t,) = optuna.load_study(study_name="t.continued-2400", storage=storage).trials
    want = reference(n_trials=2, pruner={"type": "none"}, train={"steps": 2400})[1]
    got = (t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
           t.user_attrs.get("best_step"), t.user_attrs.get("best_value"), t.user_attrs.get("last_step"),
           t.user_attrs.get("metrics"))
    assert got[1:] == want[1:]  # as snapshot() has them: metrics too
    assert t.user_attrs["ledger"]["interruptions"] == 1  # the kill (carrying trial 1 over is not one)
    assert t.user_attrs["ledger"]["lost_steps"] == reached - resumes_at
    assert [tr.user_attrs["last_step"] for tr in study_of(study).trials] == [600, 600]  # the study is untouched
    assert cli_snapshot(study)[1][4] == dict(sorted(study_of(study).trials[1].intermediate_values.items()))

    shown = json.loads(cli_here("status", study, "--continued", "2400", "--json", cwd=study.parent).stdout)
    assert [(e["number"], e["state"], e["last_step"]) for e in shown["trials"]] == [(0, "COMPLETE", 2400)]
    assert "continued to 2400 steps: study t.continued-2400" in cli_here("status", study, cwd=study.parent).stdout
    out = tmp_path / "out"
    exported = cli_here("export", study, "--continued", "2400", "--out", str(out), cwd=study.parent)
    assert exported.returncode == 0, exported.stderr
    assert json.loads((out / "index.json").read_text())["trials"][0]["last_step"] == 2400
    refused = cli_here("status", study, "--continued", "999", cwd=study.parent)
    assert refused.returncode == 1 and "has no trials continued to 999 steps" in refused.stderr


def test_status_and_export_of_the_companion_study_name_the_trial_each_continues(here, tmp_path):
    import json

    from sweep.commands import status

    study = make_study(here, n_trials=2)
    run(study)
    continued(study, 60, numbers=[1])
    link = {"study": "sched", "number": 1, "last_step": 40}
    with api.open(study).continued(60) as session:  # the public way to read a companion study
        report = session.status()
        index = session.export(tmp_path / "out")
    (entry,) = report["trials"]
    assert entry["number"] == 0 and entry["continued_from"] == link
    table = status.table(report).splitlines()
    assert "continued_from" in table[1].split()
    assert "trial 1 of sched at step 40" in table[2]
    assert index["trials"][0]["continued_from"] == link
    meta = json.loads((tmp_path / "out" / "trial_0000" / "meta.json").read_text())
    assert meta["continued_from"] == link
    # The study's own trials continue nothing: no such column, null in JSON, absent from meta.
    session = continuation.Session(config_lib.from_dict(study))
    try:
        own = status.collect(session)
    finally:
        session.close()
    assert [t["continued_from"] for t in own["trials"]] == [None, None]
    assert "continued_from" not in status.table(own)


def pruned_study(root: Path) -> dict[str, Any]:
    """A study whose trial 1 (learning rate 0.001, far worse than trial 0's 0.2) is pruned by
    the median pruner at its first evaluation after step 10."""
    return make_study(root, n_trials=2, sampler={"type": "grid", "seed": 0},
                      search_space={"learning_rate": {"type": "categorical", "choices": [0.001, 0.2]}},
                      pruner={"type": "median", "n_startup_trials": 1, "n_warmup_steps": 10},
                      checkpoint={"every_steps": 10, "keep_last": 2})


def test_continue_accepts_a_pruned_trial_whose_checkpoint_is_kept(here):
    study = pruned_study(here)
    run(study)
    t0, t1 = trials(study)
    assert (t0.state.name, t1.state.name) == ("COMPLETE", "PRUNED"), (t0.params, t1.params)
    continued(study, 40, numbers=[1])
    (t,) = trials(companion(study, 40))
    assert t.state.name == "COMPLETE" and t.user_attrs["last_step"] == 40
    assert t.user_attrs["continued_from"]["number"] == 1
    # Every step of the pruned trial's own is kept, only the new ones are trained and reported.
    assert {s: v for s, v in t.intermediate_values.items() if s in t1.intermediate_values} == t1.intermediate_values
    assert max(t.intermediate_values) == 40


def test_status_value_of_a_pruned_trial_is_its_best_evaluation():
    # Optuna gives a trial told PRUNED its last report as value (0.4 here); sweep's value of a
    # trial is its best evaluation (0.3), as the table, the log and export say.
    import optuna

    from sweep.commands import status

    study = optuna.create_study()
    trial = study.ask()
    for step, value in ((10, 0.5), (20, 0.3), (30, 0.4)):
        trial.report(value, step)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    (frozen,) = study.trials
    assert frozen.value == 0.4
    entry = status._entry(frozen, set(), "minimize", None, "val_loss", None)
    assert entry["state"] == "PRUNED" and entry["value"] == entry["best_value"] == 0.3 and entry["best_step"] == 20
    assert status.table({"study": "s", "storage": "x", "n_trials": 1, "metric": "val_loss",
                         "direction": "minimize", "trials": [entry]}).splitlines()[2].split()[2] == "0.3"
