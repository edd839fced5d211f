"""Fixtures: study files in a temp dir, the real CLI in a subprocess, and study snapshots."""

from __future__ import annotations

import fcntl
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import optuna
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# A fast digits study: ~1 s per trial on 2 cores, with evaluations, saves and a pruner to exercise.
_POSTGRES_TURNS = Path(tempfile.gettempdir()) / "sweep-tests-postgres.lock"


@pytest.fixture(autouse=True)
def _postgres_turns(request: pytest.FixtureRequest) -> Any:
    """Tests on the local PostgreSQL server share it, except one that restarts it: that one holds an
    exclusive lock, the others a shared one, across the suite's processes (-n 2 in pyproject.toml).
    A file lock because pytest-xdist's xdist_group does not group tests under pytest 9."""
    uses = "postgres_url" in request.fixturenames or hasattr(request.module, "PG_ADMIN_URL")
    if not uses:
        yield
        return
    exclusive = request.node.get_closest_marker("restarts_postgres") is not None
    with open(_POSTGRES_TURNS, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


BASE_STUDY: dict[str, Any] = {
    "name": "t",
    "trial": "trials.digits_mlp",
    "n_trials": 4,
    "objective": {"metric": "val_loss", "direction": "minimize"},
    "sampler": {"type": "tpe", "seed": 7, "n_startup_trials": 2},
    "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 300},
    "search_space": {
        "learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True},
        "hidden": {"type": "int", "low": 16, "high": 64, "step": 16},
    },
    "fixed": {"batch_size": 32},
    "train": {"steps": 600, "eval_every": 50, "seed": 0},
    # The exact cadence (no write budget): these tests kill trials between saves they wait for.
    # The budget, the default, is tested on its own (test_runner.py).
    "checkpoint": {"every_steps": 100, "keep_last": 2, "keep_best": 1, "max_write_share": None},
}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        # A mapping with its own `type` (sampler, pruner, param), a search space or fixed values
        # replace the old one whole; other mappings (train, checkpoint) are merged key by key.
        nested = (isinstance(v, dict) and isinstance(out.get(k), dict) and "type" not in v
                  and k not in ("search_space", "fixed"))
        out[k] = merge(out[k], v) if nested else v
    return out


@pytest.fixture(scope="session", autouse=True)
def _matplotlib_font_cache() -> None:
    """matplotlib builds its font cache on its first import on a machine (it runs fc-list): done
    once here, before any test, so that the first in-process test drawing a plot starts no process."""
    import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pytest -m "not slow"` is the in-process tier: a test that starts a process must be marked slow."""
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")

    import multiprocessing.process

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(os, "fork", refuse)


@pytest.fixture
def write_study(tmp_path: Path) -> Callable[..., Path]:
    """write_study(name="x", **overrides) -> path of a study file whose workdir is under tmp_path."""

    def write(file: str = "study.yaml", **override: Any) -> Path:
        data = merge(BASE_STUDY, override)
        data.setdefault("workdir", str(tmp_path / "runs" / data["name"]))
        path = tmp_path / file
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


def cli_env() -> dict[str, str]:
    # Each test's processes keep their study's own JAX compilation cache. A cache shared by the
    # whole session halved the suite's CPU time but JAX writes cache entries without a lock
    # (jax/_src/lru_cache.py, no eviction configured): tests running many processes at once
    # failed in a full run. Not again until that is solved.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m sweep ARGS`; `env`: extra environment variables."""
    return subprocess.run([sys.executable, "-m", "sweep", *map(str, args)], cwd=cwd, env={**cli_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


class Running:
    """A `python -m sweep ...` process whose stderr is collected line by line while it runs.

    `env`: extra environment variables (e.g. SWEEP_HOST to play another host). Each line is kept
    with its arrival time (`times`).
    """

    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "sweep", *map(str, args)], cwd=cwd,
                                     env={**cli_env(), **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.times: list[float] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stdout = ""

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.times.append(time.monotonic())
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.01)
        raise AssertionError(f"no line matching {pattern!r}; stderr:\n{''.join(self.lines)}")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def finish(self, timeout: float = 600) -> int:
        # stderr belongs to the reader thread; communicate() would steal some of its lines.
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


def kill9(proc: Running) -> None:
    proc.signal(signal.SIGKILL)
    proc.finish()


def wait_for_checkpoint(ckpt_dir: Path, min_step: int, timeout: float = 300) -> int:
    """Wait until a committed step >= min_step exists in ckpt_dir; returns the newest step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(p.name) for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
        if steps and max(steps) >= min_step:
            return max(steps)
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint >= {min_step} in {ckpt_dir}")


def checkpoint_dir(study_file: Path, number: int) -> Path:
    return Path(yaml.safe_load(study_file.read_text())["workdir"]) / "checkpoints" / f"trial_{number:04d}"


def kill_mid_trial(study_file: Path, number: int, min_step: int) -> list[int]:
    """Run the study and SIGKILL it once trial `number` has a checkpoint >= min_step; its kept steps."""
    proc = Running("run", study_file, cwd=study_file.parent)
    proc.wait_for(rf"trial {number}: (started|resumed)")
    wait_for_checkpoint(checkpoint_dir(study_file, number), min_step)
    kill9(proc)
    return sorted(int(p.name) for p in checkpoint_dir(study_file, number).iterdir() if p.name.isdigit())


def study_in(folder: Path, layer: dict[str, Any], **override: Any) -> Path:
    """folder/study.yaml: BASE_STUDY + `layer` + `override` (a key overridden with None is left
    out), its workdir folder/runs."""
    data = merge(merge(BASE_STUDY, layer), override)
    data = {k: v for k, v in data.items() if v is not None}
    data["workdir"] = str(folder / "runs")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cache_env(path: Path) -> dict[str, str]:
    """The environment of a later process of a test: the compilation cache the study at `path`
    filled (one test's processes run one after the other: no concurrent writers)."""
    return {"SWEEP_COMPILATION_CACHE": str(path.parent / "runs" / "jax_cache")}


def interrupt_at_random(study_file: Path, signum: int, first: str, seed: int, env: dict[str, str] | None = None,
                        rounds: int = 7) -> int:
    """Run the study and send it `signum` `rounds` times: first right after a line matching
    `first`, then at a random moment (seeded) within 0.4 s of a trial starting, going on,
    resuming or training again; stops early once a run finishes by itself. The interruptions."""
    rng = random.Random(seed)
    kills = 0
    for pattern in [first, *[r"trial \d+: (started|goes on|promoted|resumed|training again)"] * (rounds - 1)]:
        proc = Running("run", study_file, cwd=study_file.parent, env=env)
        try:
            proc.wait_for(pattern, timeout=120)
        except AssertionError:  # finished before: nothing left to interrupt
            assert proc.finish() == 0, proc.stderr
            break
        time.sleep(0 if kills == 0 else rng.uniform(0.0, 0.4))  # a short study ends within a second
        if proc.proc.poll() is not None:
            assert proc.finish() == 0, proc.stderr
            break
        proc.signal(signum)
        code = proc.finish()
        # -SIGTERM: it came before the run took the signal over (imports) or after it gave it back
        # (the summary): the default action, as good as a kill -9
        assert code in (0, -signal.SIGKILL, 128 + signal.SIGTERM, -signal.SIGTERM), (code, proc.stderr)
        kills += code != 0
    return kills


def study_of(study_file: Path) -> optuna.Study:
    data = yaml.safe_load(study_file.read_text())
    storage = data.get("storage") or f"sqlite:///{data['workdir']}/study.db"
    return optuna.load_study(study_name=data["name"], storage=storage)


def snapshot(study_file: Path) -> list[tuple[Any, ...]]:
    """Everything that must be bit-identical between an interrupted and an uninterrupted study."""
    return [
        (t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
         t.user_attrs.get("best_step"), t.user_attrs.get("best_value"), t.user_attrs.get("last_step"))
        for t in sorted(study_of(study_file).trials, key=lambda t: t.number)
    ]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[tuple[Any, ...]]]:
    """reference(**overrides) -> snapshot of an uninterrupted run of BASE_STUDY + overrides (cached)."""
    cache: dict[str, list[tuple[Any, ...]]] = {}

    def get(**override: Any) -> list[tuple[Any, ...]]:
        key = repr(sorted(override.items()))
        if key not in cache:
            d = tmp_path_factory.mktemp("reference")
            data = merge(BASE_STUDY, override)
            data["workdir"] = str(d / "runs")
            path = d / "study.yaml"
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            result = run_cli("run", path, cwd=d)
            assert result.returncode == 0, result.stderr
            cache[key] = snapshot(path)
        return cache[key]

    return get


PG_ADMIN_URL = os.environ.get("SWEEP_TEST_POSTGRES", "postgresql+psycopg://postgres@localhost/postgres")


@pytest.fixture
def postgres_url() -> Any:
    """A fresh PostgreSQL database on the local server (.ci/run makes sure one runs), dropped after."""
    import uuid

    import sqlalchemy as sa

    name = f"sweep_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # survives a restart
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

