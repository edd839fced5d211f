"""Optuna's RDB tables read narrowly, and the one write sweep makes to them itself.

Optuna's versioned RDB schema, read with SQLAlchemy Core: get_all_trials builds every trial
through the ORM with all of its rows (~17 s for 10,000 trials of 20 evaluations each), where
sweep's readers need a few columns, or each trial's record without its per-step rows. Used by the
RDB member of the storage interface (rdb.RDB); a journal is read through Optuna's API.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweep.store.record import EVAL_ATTR_PREFIX


# --- narrow reads ---------------------------------------------------------------------------------


def _tables() -> tuple[Any, ...]:
    from sweep.internals import (
        trial_tables,  # Optuna's schema is private (sweep/internals.py)
    )

    return trial_tables()


def _not_warm(t: Any, attrs: Any, warm_key: str) -> Any:
    """The condition: the trial row of `t` has no user attribute `warm_key` (a warm-start observation)."""
    import sqlalchemy as sa

    return ~sa.exists(sa.select(attrs.c.trial_id).where(attrs.c.trial_id == t.c.trial_id, attrs.c.key == warm_key))


def trial_states(engine: Any, study_id: int, warm_key: str) -> list[tuple[int, Any]]:
    """(number, state) of every trial of the study but those with the user attribute `warm_key`."""
    import sqlalchemy as sa

    t, _, _, _, attrs, _ = _tables()
    with engine.connect() as conn:
        return conn.execute(sa.select(t.c.number, t.c.state).where(t.c.study_id == study_id,
                                                                   _not_warm(t, attrs, warm_key))).all()


def count_trials(engine: Any, study_id: int) -> int:
    """The study's trials, all of them (Optuna's get_n_trials loads every one to count them)."""
    import sqlalchemy as sa

    t = _tables()[0]
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(t).where(t.c.study_id == study_id)).scalar()


def user_attr_values(engine: Any, study_id: int, keys: Sequence[str], warm_key: str) -> dict[int, dict[str, Any]]:
    """number -> {key: value} of the user attributes named `keys` of every trial of the study
    (each trial, also one without any of them), but those with the user attribute `warm_key`."""
    import sqlalchemy as sa

    t, _, _, _, attrs, _ = _tables()
    with engine.connect() as conn:
        numbers = conn.execute(sa.select(t.c.trial_id, t.c.number).where(t.c.study_id == study_id,
                                                                         _not_warm(t, attrs, warm_key))).all()
        ids = sa.select(t.c.trial_id).where(t.c.study_id == study_id)
        rows = conn.execute(sa.select(attrs.c.trial_id, attrs.c.key, attrs.c.value_json).where(
            attrs.c.trial_id.in_(ids), attrs.c.key.in_(list(keys)))).all()
    by_id: dict[int, dict[str, Any]] = {tid: {} for tid, _ in numbers}
    for (tid, key, _), value in zip(rows, json.loads(f"[{','.join(row[2] for row in rows)}]")):
        if tid in by_id:
            by_id[tid][key] = value
    return {number: by_id[tid] for tid, number in sorted(numbers, key=lambda r: r[1])}


def read_trials(engine: Any, study_id: int, states: Sequence[Any] | None, prefix: str,
                record: tuple[str, ...]) -> list[FrozenTrial]:
    """The study's trials (of `states`) as Optuna's get_all_trials builds them, but narrow where a
    trial has every user attribute of `record` (sweep's best_step, best_value, last_step: it
    finished with its record): of its per-step rows, the user attributes starting with `prefix`
    (`eval:<step>`) and its intermediate values, only those at its best step (`record[0]`). A trial
    without them (running, failed, not sweep's) comes whole: its best is worked out from those rows."""
    import sqlalchemy as sa
    from optuna import distributions as dist_lib

    from sweep.internals import stored_intermediate_value, stored_value

    t, params, values, inter, attrs, sysattrs = _tables()
    where = [t.c.study_id == study_id] + ([t.c.state.in_(list(states))] if states is not None else [])
    ids = sa.select(t.c.trial_id).where(*where)
    rec, per, held = attrs.alias("rec"), attrs.alias("per"), attrs.alias("held")
    n_record = (sa.select(sa.func.count()).where(held.c.trial_id == t.c.trial_id, held.c.key.in_(record))
                .correlate(t).scalar_subquery())
    whole = sa.select(t.c.trial_id).where(*where, n_record != len(record))  # trials without their record
    # the best step of each trial with its record: its `eval:<step>` row and its report at that step
    best = sa.select(rec.c.trial_id, rec.c.value_json.label("step")).where(
        rec.c.key == record[0], rec.c.trial_id.in_(sa.select(t.c.trial_id).where(*where, n_record == len(record))))
    best = best.subquery()
    is_eval = attrs.c.key.startswith(prefix, autoescape=True)
    with engine.connect() as conn:
        found = conn.execute(sa.select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
                                       t.c.datetime_complete).where(*where).order_by(t.c.trial_id)).all()
        param_rows = conn.execute(sa.select(params.c.trial_id, params.c.param_name, params.c.param_value,
                                            params.c.distribution_json).where(params.c.trial_id.in_(ids))
                                  .order_by(params.c.param_id)).all()
        value_rows = conn.execute(sa.select(values.c.trial_id, values.c.objective, values.c.value,
                                            values.c.value_type).where(values.c.trial_id.in_(ids))).all()
        inter_cols = (inter.c.trial_id, inter.c.step, inter.c.intermediate_value, inter.c.intermediate_value_type)
        inter_rows = conn.execute(sa.select(*inter_cols).where(inter.c.trial_id.in_(whole))).all()
        inter_rows += conn.execute(sa.select(*inter_cols).join(best, sa.and_(
            best.c.trial_id == inter.c.trial_id, sa.cast(inter.c.step, sa.String) == best.c.step))).all()
        attr_rows = conn.execute(sa.select(attrs.c.trial_id, attrs.c.key, attrs.c.value_json).where(
            attrs.c.trial_id.in_(ids), sa.or_(~is_eval, attrs.c.trial_id.in_(whole)))).all()
        attr_rows += conn.execute(sa.select(per.c.trial_id, per.c.key, per.c.value_json).join(best, sa.and_(
            per.c.trial_id == best.c.trial_id, per.c.key == sa.literal(prefix) + best.c.step))).all()
        sys_rows = conn.execute(sa.select(sysattrs.c.trial_id, sysattrs.c.key, sysattrs.c.value_json).where(
            sysattrs.c.trial_id.in_(ids)).order_by(sysattrs.c.trial_system_attribute_id)).all()
    parts: dict[int, dict[str, Any]] = {row[0]: {"params": {}, "dists": {}, "values": {}, "inter": {}, "user": {},
                                                 "system": {}} for row in found}
    # Each statement reads the trials committed by its own start (SQLite outside a transaction,
    # PostgreSQL's read committed): a trial a worker created after the first one is in the later
    # ones' rows, not in `found`. It is left to the next read (status under 4 workers: KeyError).
    param_rows, value_rows, inter_rows, attr_rows, sys_rows = (
        [row for row in rows if row[0] in parts] for rows in (param_rows, value_rows, inter_rows, attr_rows, sys_rows))
    dists: dict[str, Any] = {}  # distribution JSON -> distribution (the same few for every trial)
    for tid, name, value, js in param_rows:
        d = dists.get(js) or dists.setdefault(js, dist_lib.json_to_distribution(js))
        parts[tid]["params"][name] = d.to_external_repr(value)
        parts[tid]["dists"][name] = d
    for tid, objective, value, kind in value_rows:
        parts[tid]["values"][objective] = stored_value(value, kind)
    for tid, s, value, kind in inter_rows:
        parts[tid]["inter"][s] = stored_intermediate_value(value, kind)
    for table, rows in (("user", attr_rows), ("system", sys_rows)):
        decoded = json.loads(f"[{','.join(row[2] for row in rows)}]")  # one call: ~3x quicker than one a row
        for (tid, key, _), value in zip(rows, decoded):
            parts[tid][table][key] = value
    out = []
    for tid, number, state, start, complete in found:
        state = state if isinstance(state, TrialState) else TrialState[state]
        p = parts[tid]
        vals = [p["values"][k] for k in sorted(p["values"])] if p["values"] else None
        out.append(FrozenTrial(number=number, state=state, value=None, values=vals, datetime_start=start,
                               datetime_complete=complete, params=p["params"], distributions=p["dists"],
                               user_attrs=p["user"], system_attrs=p["system"], intermediate_values=p["inter"],
                               trial_id=tid))
    return out


def study_system_attrs(engine: Any, study_id: int, prefix: str) -> dict[str, Any]:
    """The study's system attributes whose key starts with `prefix` (Optuna's reader loads them all:
    in a study of thousands of trials, every dashboard note's pieces)."""
    import sqlalchemy as sa

    from sweep.internals import study_system_attr_table

    a = study_system_attr_table()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(a.c.key, a.c.value_json).where(
            a.c.study_id == study_id, a.c.key.startswith(prefix, autoescape=True))).all()
    return {key: json.loads(value) for key, value in rows}


# --- the one write sweep makes to Optuna's tables itself ------------------------------------------


def reopen_failed(engine: Any, study_id: int, number: int, keep_through: int | None, attrs: dict[str, Any]) -> bool:
    """FAIL trial `number` back to RUNNING (no worker holds it: `run` resumes it as an interrupted
    trial), in one transaction with its user attributes `attrs` (its retry's record: a kill never
    leaves it reopened without them) and the removal of its reports and `eval:<step>` rows past step
    `keep_through` (all of them where None): a retry trains those steps again, maybe with fixed code,
    and Optuna keeps a step's first report. False where it is no FAIL trial (anymore: the update is
    conditional, so of two retries at once one reopens it). Optuna has no API for this: its storage
    never changes a finished trial."""
    import sqlalchemy as sa
    from optuna.trial import TrialState

    t, _, _, inter, user, _ = _tables()
    with engine.begin() as conn:
        trial_id = conn.execute(sa.select(t.c.trial_id).where(t.c.study_id == study_id, t.c.number == number)).scalar()
        if trial_id is None or conn.execute(t.update().where(t.c.trial_id == trial_id, t.c.state == TrialState.FAIL)
                                            .values(state=TrialState.RUNNING, datetime_complete=None)).rowcount != 1:
            return False
        floor = -1 if keep_through is None else keep_through
        conn.execute(inter.delete().where(inter.c.trial_id == trial_id, inter.c.step > floor))
        stale = [key for key in conn.execute(sa.select(user.c.key).where(
            user.c.trial_id == trial_id, user.c.key.like(f"{EVAL_ATTR_PREFIX}%"))).scalars()
            if int(key[len(EVAL_ATTR_PREFIX):]) > floor]
        conn.execute(user.delete().where(user.c.trial_id == trial_id, user.c.key.in_([*stale, *attrs])))
        conn.execute(user.insert(), [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                                     for k, v in attrs.items()])
    return True
