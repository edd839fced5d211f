"""What optuna-dashboard shows of a sweep study (in-process): each trial's note, the study's note,
the figure of every metric's curves and the objectives' names, read back through optuna-dashboard's
own API (`get_note`, and its server's JSON, which its pages render); a kill and a rerun leave one
note per trial, and a storage that refuses the dashboard's writes fails no trial.

The real CLI's run is tests/tracking/test_dashboard.py's (slow tier)."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import optuna_dashboard
import plotly.io
import sqlalchemy as sa

from conftest import make_study, messages, run, run_killed, trials
from sweep.store import record
from sweep.tracking.dashboard import FIGURE_ID

ASHA = {"scheduler": {"type": "asha", "min_steps": 10, "reduction_factor": 2}, "n_trials": 5}


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _served(study: dict[str, Any]) -> dict[str, Any]:
    """The study as optuna-dashboard's server hands it to its pages (GET /api/studies/<id>)."""
    url = f"sqlite:///{study['workdir']}/study.db"
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/api/studies"
        with urllib.request.urlopen(base, timeout=30) as resp:
            (summary,) = json.loads(resp.read())["study_summaries"]
        with urllib.request.urlopen(f"{base}/{summary['study_id']}", timeout=30) as resp:
            return json.loads(resp.read())
    finally:
        server.shutdown()
        server.server_close()


def _note_of(study: dict[str, Any], number: int) -> str:
    """optuna_dashboard.get_note of trial `number` (it takes an optuna.Trial: made for the read)."""
    loaded = optuna.load_study(study_name=study["name"], storage=f"sqlite:///{study['workdir']}/study.db")
    frozen = next(t for t in loaded.get_trials(deepcopy=False) if t.number == number)
    return optuna_dashboard.get_note(optuna.Trial(loaded, frozen._trial_id))


def test_each_trial_has_its_story_as_a_note_and_every_metric_a_curve_in_the_figure(here):
    study = make_study(here, **ASHA, pruner={"type": "none"})
    run(study)
    stored = {t.number: t for t in trials(study)}
    served = _served(study)

    assert served["objective_names"] == ["val_loss"]
    assert any(t.user_attrs.get(record.PAUSED_AT) for t in stored.values())  # asha paused some: a path to show
    for t in served["trials"]:
        frozen, note = stored[t["number"]], t["note"]["body"]
        assert note.startswith(f"## Trial {frozen.number}: {frozen.state.name}\n"), note
        assert note.count("## Trial ") == 1 and t["note"]["version"] >= 1
        assert f"at step **{frozen.user_attrs['best_step']}** (best step)" in note
        assert f"| learning_rate | {frozen.params['learning_rate']:.6g} |" in note
        rungs = frozen.user_attrs.get(record.PAUSED_AT, [])
        path = " → ".join(["0", *(f"{r} (paused)" for r in rungs)])
        assert (f"(asha, paused at rungs" in note and path in note) == bool(rungs), note
        if frozen.state.name == "COMPLETE":
            assert f"{path} → {frozen.user_attrs['last_step']} (COMPLETE); promoted {len(rungs)} time" in note
        assert "- **Ledger**: lost to 0 interruptions" in note and "- **Devices** (latest run): cpu:" in note
    assert _note_of(study, 0) == served["trials"][0]["note"]["body"]  # the public reader reads the same

    best = min((t for t in stored.values() if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert f"Best: trial {best.number}, val_loss = {best.value:.6g}" in served["note"]["body"]

    (graph,) = served["plotly_graph_objects"]
    assert graph["id"] == FIGURE_ID
    figure = plotly.io.from_json(graph["graph_object"])  # a valid plotly figure (plotly validates it)
    traces = {(tr.name, tr.meta): tr for tr in figure.data}  # a line per trial and metric, its metric in `meta`
    metrics = [b.label for b in figure.layout.updatemenus[0].buttons]  # the buttons that show one metric each
    assert metrics == ["val_loss", "train_loss"] and len(traces) == len(figure.data) == 2 * len(stored)
    for number, frozen in stored.items():
        rows = record.history(frozen)
        for metric in metrics:
            curve = traces[(f"trial {number}", metric)]
            assert list(curve.x) == sorted(rows) and list(curve.y) == [rows[s][metric] for s in sorted(rows)]
            assert curve.visible == (metric == "val_loss")


def test_a_killed_trial_ends_with_one_note_telling_its_interruption_and_a_rerun_keeps_an_edited_note(here):
    study = make_study(here, n_trials=2)
    run_killed(study, 0, 30)  # trial 0 RUNNING, no note: its run did not end
    assert "note" not in _served(study)["trials"][0] or not _served(study)["trials"][0]["note"]["body"]
    run(study)
    served = _served(study)
    killed = served["trials"][0]["note"]
    assert killed["body"].count("## Trial 0: COMPLETE\n") == 1 and "## Trial " not in killed["body"][3:]
    assert "- **Interruptions**: 1 (runs that ended without finishing it)." in killed["body"]
    restored = trials(study)[0].user_attrs[record.RESUMED_FROM]
    assert f"- **Resumed** from its checkpoint at step {restored[0]}" in killed["body"]

    # An edit made in the dashboard (its own PUT, with the next version) survives a rerun of the finished study.
    url = f"sqlite:///{study['workdir']}/study.db"
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        edited = killed["body"] + "\n\nlooked at this one"
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_port}/api/studies/1/{served['trials'][0]['trial_id']}/note",
            data=json.dumps({"version": killed["version"] + 1, "body": edited}).encode(), method="PUT",
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 204
    finally:
        server.shutdown()
        server.server_close()
    run(study)
    again = _served(study)
    assert again["trials"][0]["note"] == {"version": killed["version"] + 1, "body": edited}
    assert again["trials"][1]["note"] == served["trials"][1]["note"]  # up to date: not written again


def test_a_storage_that_refuses_the_dashboards_writes_fails_no_trial(here, sweep_log):
    study = make_study(here, n_trials=2)
    run_killed(study, 0, 0)  # the study exists; then its database refuses every dashboard write
    engine = sa.create_engine(f"sqlite:///{study['workdir']}/study.db")
    with engine.begin() as conn:
        # Not a RAISE(ABORT): Optuna ignores an IntegrityError on an attribute's insert (a racing one)
        conn.execute(sa.text("CREATE TRIGGER no_dashboard BEFORE INSERT ON study_system_attributes "
                             "WHEN NEW.key LIKE 'dashboard:%' BEGIN INSERT INTO dashboard_refused VALUES (1); END"))
    engine.dispose()
    run(study)
    assert [t.state.name for t in trials(study)] == ["COMPLETE", "COMPLETE"]
    logged = messages(sweep_log)
    refused = [m for m in logged if m.startswith("optuna-dashboard: ")]
    assert refused == [  # said once for the trials' notes (trial 1's is not said again), once for the study's
        "optuna-dashboard: trial 0's note not written (StorageInternalError: An exception is raised during the "
        "commit. This typically happens due to invalid data in the commit, e.g. exceeding max length. ); "
        "the next ones are not said",
        "optuna-dashboard: the study's figure and notes not written (StorageInternalError: An exception is raised "
        "during the commit. This typically happens due to invalid data in the commit, e.g. exceeding max length. )"
        "; the next ones are not said"], logged


def test_a_study_past_the_figure_bound_keeps_its_trials_notes_without_the_study_figure(here, monkeypatch):
    """Past STUDY_FIGURE_MAX_TRIALS trials (1,000; 2 here) the study's figure and note would read
    every trial at each run's end and minute: they are left out, each trial's note is still written."""
    from sweep.tracking import dashboard

    monkeypatch.setattr(dashboard, "STUDY_FIGURE_MAX_TRIALS", 2)
    study = make_study(here)  # 3 trials
    run(study)
    storage = optuna.storages.RDBStorage(f"sqlite:///{study['workdir']}/study.db")
    attrs = storage.get_study_system_attrs(storage.get_study_id_from_name(study["name"]))
    storage.engine.dispose()
    assert not any(key.startswith(f"dashboard:plot_data:{FIGURE_ID}:") for key in attrs)
    assert "dashboard:note_ver" not in attrs  # no study note
    assert all(_note_of(study, n).startswith(f"## Trial {n}: COMPLETE") for n in range(3))
