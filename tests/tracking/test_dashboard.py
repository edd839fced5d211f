"""optuna-dashboard serves a sweep study straight from its database (the README's command)."""

from __future__ import annotations

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna_dashboard
import pytest
import yaml

from conftest import run_cli

pytestmark = pytest.mark.slow  # every test here starts real processes


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_dashboard_reads_the_study_and_its_trials_over_http(write_study):
    study = write_study(n_trials=2)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    url = f"sqlite:///{yaml.safe_load(study.read_text())['workdir']}/study.db"
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_port
        studies = _get(port, "/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["t"]
        detail = _get(port, f"/api/studies/{studies[0]['study_id']}")
        trials = detail["trials"]
        assert [t["number"] for t in trials] == [0, 1]
        assert all(t["state"] in ("Complete", "Pruned") for t in trials)
        assert all(t["intermediate_values"] for t in trials)
        assert {a["key"] for a in trials[0]["user_attrs"]} >= {"checkpoint_dir", "best_step"}
        # What sweep wrote for the dashboard, through the CLI's run: a note per trial, the figure, the names
        assert detail["objective_names"] == ["val_loss"]
        assert [t["note"]["body"].split("\n")[0] for t in trials] == [
            f"## Trial {t['number']}: {t['state'].upper()}" for t in trials]
        assert [g["id"] for g in detail["plotly_graph_objects"]] == ["sweep-curves"]
        curves = json.loads(detail["plotly_graph_objects"][0]["graph_object"])["data"]
        assert {(c["name"], c["meta"]) for c in curves} == {  # a line per trial and metric
            (f"trial {n}", m) for n in (0, 1) for m in ("val_loss", "val_accuracy", "train_loss")}
    finally:
        server.shutdown()
