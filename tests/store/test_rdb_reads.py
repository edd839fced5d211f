"""sweep's narrow reader of Optuna's tables (sweep/store/rdb_tables.py) while workers write: a trial
created between its statements is left to the next read, never a KeyError (status --json under
four workers failed so: tests/run/test_faults.py's polling reader, once under load)."""

from __future__ import annotations

import optuna
import sqlalchemy as sa

from sweep.store import rdb_tables

RECORD = ("best_step", "best_value", "last_step")


def test_a_trial_created_between_the_reader_s_statements_is_left_to_the_next_read(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/study.db")
    study = optuna.create_study(storage=storage, study_name="s")
    for _ in range(2):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        trial.report(0.5, 10)
        trial.set_user_attr("eval:10", {"loss": 0.5})
    created: list[int] = []

    @sa.event.listens_for(storage.engine, "before_cursor_execute")
    def another_worker_asks(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        # Between the reader's first statement (the trials) and its second (their params).
        if not created and "FROM trial_params" in statement:
            created.append(-1)  # once (the writes below run statements of their own)
            new = study.ask()
            new.suggest_float("x", 0.0, 1.0)
            new.report(0.25, 10)
            new.set_user_attr("eval:10", {"loss": 0.25})
            created[0] = new.number

    found = rdb_tables.read_trials(storage.engine, study._study_id, None, "eval:", RECORD)
    assert created == [2]  # the write happened mid-read
    assert [t.number for t in found] == [0, 1]
    assert all(t.params.keys() == {"x"} and t.intermediate_values == {10: 0.5} for t in found)
    sa.event.remove(storage.engine, "before_cursor_execute", another_worker_asks)
    again = rdb_tables.read_trials(storage.engine, study._study_id, None, "eval:", RECORD)
    assert [t.number for t in again] == [0, 1, 2] and again[2].intermediate_values == {10: 0.25}
