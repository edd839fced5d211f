"""Secrets: `${VAR}` in the study file from the environment, and no password in any output, file or row."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import PG_ADMIN_URL, TRIAL_SOURCE, Running, cli_here, run_cli
from sweep.errors import ConfigError
from sweep.study import config as config_lib
from sweep.study import credentials

TRIAL = "cred_linear"  # a tiny linear-regression trial (tests/test_api.py's), written beside the study


def study(root: Path, **override: Any) -> dict[str, Any]:
    (root / f"{TRIAL}.py").write_text(TRIAL_SOURCE)
    data = {"name": "cred", "trial": TRIAL, "workdir": str(root / "runs"), "n_trials": 2,
            "objective": {"metric": "val_loss"}, "sampler": {"type": "random", "seed": 0},
            "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 0.3, "log": True}},
            "train": {"steps": 20, "eval_every": 10}, "checkpoint": {"every_steps": 10}}
    data.update(override)
    return data


def write(root: Path, data: dict[str, Any]) -> Path:
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- in-process: the rules -------------------------------------------------------------------------


def test_interpolate_replaces_variables_only_in_the_keys_that_take_them():
    raw = {"storage": "postgresql://u:${PW}@${HOST}/db", "workdir": "${SCRATCH}/runs",
           "checkpoint": {"remote": "s3://${BUCKET}/x"}, "parallel": {"address": "tcp://${SCHED}:8786"},
           "fixed": {"note": "a $5, $$ b $${X}"}}
    env = {"PW": "pw", "HOST": "h", "SCRATCH": "/s", "BUCKET": "bkt", "SCHED": "sch"}
    values, used = credentials.interpolate(raw, "f.yaml", env)
    assert values == {"storage": "postgresql://u:pw@h/db", "workdir": "/s/runs",
                      "checkpoint": {"remote": "s3://bkt/x"}, "parallel": {"address": "tcp://sch:8786"},
                      "fixed": {"note": "a $5, $$ b ${X}"}}
    assert used == env
    assert raw["storage"] == "postgresql://u:${PW}@${HOST}/db"  # the file's keys are left as written


@pytest.mark.parametrize("raw, message", [
    ({"storage": "postgresql://u:${DB_PASSWORD}@h/db"},
     "f.yaml: storage: environment variable DB_PASSWORD is not set (the study file says ${DB_PASSWORD})"),
    ({"checkpoint": {"remote": "s3://${NO_BUCKET}/x"}},
     "f.yaml: checkpoint.remote: environment variable NO_BUCKET is not set"),
    ({"fixed": {"token": "${PW}"}},
     "f.yaml: fixed.token: ${PW}: environment variables are only read in storage, workdir, checkpoint.remote, "
     "parallel.address"),
    ({"search_space": {"a": {"type": "categorical", "choices": ["x", "${PW}"]}}},
     "f.yaml: search_space.a.choices.1: ${PW}: environment variables are only read in"),
    ({"storage": "postgresql://u:${DB PASSWORD}@h/db"}, "f.yaml: storage: '${' must start a variable"),
    ({"storage": "postgresql://u:${PW@h/db"}, "f.yaml: storage: '${' must start a variable"),
])
def test_interpolate_errors_name_file_key_and_variable(raw, message):
    with pytest.raises(ConfigError) as err:
        credentials.interpolate(raw, "f.yaml", {"PW": "secret-value"})
    assert str(err.value).startswith(message)
    assert "secret-value" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://postgres:S3cretPw@127.0.0.1:5432/db", "postgresql+psycopg://postgres:***@127.0.0.1:5432/db"),
    ("postgresql://u:p%40ss@h/db?sslmode=require&password=zz", "postgresql://u:***@h/db?password=***&sslmode=require"),
    ("mysql+pymysql://u:pw@h/db", "mysql+pymysql://u:***@h/db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("sqlite:////abs/study.db", "sqlite:////abs/study.db"),
    ("sqlite:////tmp/é b/x@y%z.db", "sqlite:////tmp/é b/x@y%z.db"),  # no password: never re-encoded
    ("s3://bucket/prefix", "s3://bucket/prefix"),
])
def test_mask_url_hides_the_password_with_sqlalchemys_rendering(url, shown):
    assert credentials.mask_url(url) == shown


def test_scrub_removes_remembered_passwords_and_their_encoded_variable():
    credentials.remember("postgresql://u:p%40ssw0rd-x@h/db", ["p%40ssw0rd-x", "db.example.org"])
    assert credentials.scrub("a p@ssw0rd-x b p%40ssw0rd-x c db.example.org") == "a *** b *** c db.example.org"


def test_config_reads_the_variable_and_keeps_it_out_of_its_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CRED_PW", "Pw-in-env-1")
    path = write(tmp_path, study(tmp_path, storage="postgresql+psycopg://postgres:${CRED_PW}@127.0.0.1:5432/x"))
    config = config_lib.load(path)
    assert config.storage == "postgresql+psycopg://postgres:Pw-in-env-1@127.0.0.1:5432/x"
    assert config.source.raw["storage"].endswith(":${CRED_PW}@127.0.0.1:5432/x")
    assert "Pw-in-env-1" not in repr(config.source)
    monkeypatch.delenv("CRED_PW")  # a worker gets the parent's values with the source
    assert config_lib.from_source(config.source).storage == config.storage


def test_a_bad_storage_url_is_shown_as_written_not_interpolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CRED_PW", "Pw-in-env-2")
    path = write(tmp_path, study(tmp_path, storage="not a url ${CRED_PW}"))
    with pytest.raises(ConfigError) as err:
        config_lib.load(path)
    assert "got 'not a url ${CRED_PW}'" in str(err.value) and "Pw-in-env-2" not in str(err.value)


# --- the real CLI on PostgreSQL ----------------------------------------------------------------------


@pytest.fixture
def pg_database():
    """(name, admin engine) of a fresh database on the local server, dropped after."""
    import sqlalchemy as sa

    name = f"sweep_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def dump_rows(database: str) -> str:
    """Every row of every table of `database`, as text."""
    import sqlalchemy as sa

    engine = sa.create_engine(f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{database}")
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            return "\n".join(f"{t}: {row!r}" for t in tables
                             for row in conn.exec_driver_sql(f'SELECT * FROM "{t}"').all())
    finally:
        engine.dispose()


def files_holding(root: Path, secret: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


@pytest.mark.slow
def test_a_password_from_the_environment_appears_in_no_output_file_or_row(tmp_path, pg_database):
    secret = f"S3cretPw{uuid.uuid4().hex[:8]}"
    host = PG_ADMIN_URL.rsplit("@", 1)[1].rsplit("/", 1)[0]
    url = f"postgresql+psycopg://postgres:${{DB_PASSWORD}}@{host}/{pg_database}"  # trust auth: any password
    path = write(tmp_path, study(tmp_path, storage=url))
    env = {"DB_PASSWORD": secret}
    outputs = []
    run = Running("run", path, "--verbose", cwd=tmp_path, env=env)
    assert run.finish() == 0, run.stderr
    outputs += [run.stdout, run.stderr]
    # The readers through main() in this process (what they print is the point, not a process start;
    # the run above and the refusals below are processes).
    for args in (["status"], ["status", "--json"], ["plan"], ["export", "--out", tmp_path / "export"],
                 ["plot", "--out", tmp_path / "plots"]):
        result = cli_here(*args, path, cwd=tmp_path, env=env)
        assert result.returncode == 0, (args, result.stderr)
        outputs += [result.stdout, result.stderr]
    table, as_json, plan = outputs[2], outputs[4], outputs[6]
    shown = f"postgresql+psycopg://postgres:***@{host}/{pg_database}"
    assert json.loads(as_json)["storage"] == shown
    assert f"({shown})" in table and f"({shown})" in plan
    # A storage that cannot be opened (nothing listens there): its error names the URL, masked.
    (tmp_path / "bad").mkdir()
    bad = write(tmp_path / "bad", study(tmp_path / "bad", storage="postgresql+psycopg://postgres:${DB_PASSWORD}"
                                                                  "@127.0.0.1:1/nowhere"))
    for command in ("status", "run"):
        result = run_cli(command, bad, cwd=tmp_path / "bad", env=env)
        assert result.returncode == 1 and "postgres:***@127.0.0.1:1/nowhere" in result.stderr, result.stderr
        outputs += [result.stdout, result.stderr]
    assert all(secret not in text for text in outputs), [t for t in outputs if secret in t][0]
    assert files_holding(tmp_path, secret.encode()) == []  # workdir, export, plots, the study files
    rows = dump_rows(pg_database)
    assert "trials" in rows and "cred" in rows and secret not in rows
    # Rotating the password is not an edit of the study: the next run goes on with the new one.
    result = run_cli("plan", path, cwd=tmp_path, env={"DB_PASSWORD": "rotated-pw"})
    assert result.returncode == 0 and "REFUSE" not in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_a_missing_variable_is_exit_2_naming_it_and_nothing_is_created(tmp_path, pg_database, monkeypatch):
    host = PG_ADMIN_URL.rsplit("@", 1)[1].rsplit("/", 1)[0]
    path = write(tmp_path, study(tmp_path, storage=f"postgresql+psycopg://postgres:${{DB_PASSWORD}}@{host}/"
                                                   f"{pg_database}"))
    monkeypatch.delenv("DB_PASSWORD", raising=False)
    for command in ("run", "plan", "status"):
        result = run_cli(command, path, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr == (f"error: {path}: storage: environment variable DB_PASSWORD is not set (the study "
                                 "file says ${DB_PASSWORD}); set it, or write the value\n")
    assert not (tmp_path / "runs").exists()
    assert dump_rows(pg_database) == ""
