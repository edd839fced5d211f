"""What the commands print, in-process (`sweep.__main__.main`) on conftest's tiny study:
sentences with singular and plural right, and warnings where a command finds something off."""

from __future__ import annotations

import json

from conftest import cli, make_study, run, write


def test_status_warns_of_a_study_file_that_run_refuses_and_exits_0(here, capsys):
    study = make_study(here, n_trials=1)
    run(study)
    path = write({**study, "train": {**study["train"], "steps": 50}}, here)
    code, _, refused = cli(capsys, "run", path)
    assert code == 2 and "train.steps: 40 -> 50" in refused
    for args in (("status", path), ("status", path, "--json")):
        code, out, err = cli(capsys, *args)
        assert code == 0, err
        assert err.startswith(f"warning: {path}: this file no longer matches study 'sched'"), err
        assert "run refuses it (exit 2)" in err and "\n  train.steps: 40 -> 50\n" in err
        assert json.loads(out)["study"] == "sched" if "--json" in args else out.startswith("study sched: ")
    path = write(study, here)  # the old value put back: no warning
    code, out, err = cli(capsys, "status", path)
    assert code == 0 and err == ""


def test_run_export_and_plot_count_in_words(here, capsys):
    from sweep.commands import summary
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    study = make_study(here, n_trials=1, sampler={"type": "random", "seed": 0})
    path = write(study, here)
    code, out, err = cli(capsys, "run", path, "--quiet")
    assert code == 0, err
    assert "over 1 trial\n" in out and "(s)" not in out
    code, out, err = cli(capsys, "export", path, "--out", here / "out")
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"exported 1 trial of study sched to {here / 'out'}")
    code, out, err = cli(capsys, "plot", path, "--out", here / "plots")
    assert code == 0, err
    assert f"{here / 'plots' / 'curves'}: learning curves of 1 trial (PNG + HTML)" in out and "(s)" not in out
    session = Session(config_lib.from_dict(study)).open(create=False)
    try:
        assert "(s)" not in summary.text(session)
    finally:
        session.close()
