"""Fixtures: study files in a temp dir, the real CLI in a subprocess, and study snapshots."""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
import pytest
import sqlalchemy as sa
import yaml
from optuna.trial import FrozenTrial

from sweep.__main__ import main
from sweep.api import StudySession
from sweep.checkpoints.remote import RemoteTier
from sweep.checkpoints.s3 import S3Tier
from sweep.errors import Interrupted
from sweep.host.signals import StopSignal
from sweep.run import worker
from sweep.store import claims
from sweep.store.session import Session
from sweep.study import config as config_lib
from tests.trials.files import trial_source

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


# Files of a minute or more of tests, collected first: pytest-xdist's loadfile hands files out in
# collection order, so the run ends on short files rather than one long file with a core idle (the
# chaos scenario, last in name order, ran alone for its last minute). The chaos scenario first: it
# holds PostgreSQL exclusively (restarts_postgres), and the next files on the other process use
# none (a PostgreSQL test there waits for it).
_HEAVY_FIRST = ("tests/run/test_chaos.py", "tests/host/test_devices.py", "tests/run/test_dask.py",
                "tests/run/test_resume.py", "tests/schedulers/test_pbt.py", "tests/study/test_search.py",
                "tests/store/test_postgres.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest in name order


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The seed of a test's random moments (when to kill, which step to damage): SWEEP_TEST_SEED if
    set (tests/stress.sh sets a new one each round), else a number fixed by the test's id. A failed
    test's report says it, with the command that replays it (pytest_runtest_makereport below)."""
    value = int(os.environ.get("SWEEP_TEST_SEED") or zlib.crc32(request.node.nodeid.encode()) % 1_000_000)
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    seeded = dict(item.user_properties).get("seed")
    if report.failed and seeded is not None:
        report.sections.append(("random moments", f"seeded with {seeded}: replay with "
                                                  f"SWEEP_TEST_SEED={seeded} .venv/bin/python -m pytest '{item.nodeid}'"))
    return report


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
def held() -> Iterator[Callable[..., Path]]:
    """held(path) -> path, a `hold` file of tests/trials/gated.py made now and removed at the test's
    end however it ends, so that a failed test leaves no process held."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        path.touch()
        made.append(path)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)


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


# One persistent compilation cache for the CLI processes of the whole test run (both of the suite's
# processes): a program compiles once, not again in every test's fresh workdir (BASE_STUDY's run:
# 13 s with an empty cache, 7 s with a warm one, here). Processes use it at once, as a study's
# workers do; sweep turns on JAX's file lock around its reads and writes (sweep/train/
# compile_events.py: without it a reader could meet half an entry). A test that counts compilations
# or needs a compile to take its time names its own folder in SWEEP_COMPILATION_CACHE.
_SHARED_CACHE: list[Path] = []


def _run_folder(factory: pytest.TempPathFactory) -> Path:
    """The temp folder of this whole test run, shared by the suite's processes: pytest-N, the parent
    of a pytest-xdist worker's pytest-N/popen-gwK, or the base itself without xdist (its parent,
    pytest-of-USER, holds every run's: nothing may be shared there)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _shared_compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    _SHARED_CACHE[:] = [_run_folder(tmp_path_factory) / "jax_cache"]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if _SHARED_CACHE and "SWEEP_COMPILATION_CACHE" not in env:
        env["SWEEP_COMPILATION_CACHE"] = str(_SHARED_CACHE[0])
    return env


# The CLI processes of tests are forked from a server that imported JAX, Optuna... once (tests/zygote.py:
# ~2 s of CPU less per process); SWEEP_TEST_FORKSERVER=0 starts each through exec instead.
_ZYGOTE: dict[str, Any] = {}


def _zygote() -> str | None:
    """The fork server's socket, started at the first call of this pytest process; None where it is off."""
    if os.environ.get("SWEEP_TEST_FORKSERVER", "1") == "0":
        return None
    if "socket" not in _ZYGOTE:
        folder = Path(tempfile.mkdtemp(prefix="sweep-zygote-"))
        env = cli_env()
        server = subprocess.Popen([sys.executable, "-c", "from tests.zygote import serve; serve()", str(folder / "s")],
                                  cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        answer = server.stdout.readline().strip()
        if answer != "ready":
            raise RuntimeError(f"the tests' fork server did not start ({answer or server.wait()}); "
                               "SWEEP_TEST_FORKSERVER=0 runs the suite without it")
        _ZYGOTE.update(socket=str(folder / "s"), env=env, server=server)
        atexit.register(shutil.rmtree, folder, True)  # the server ends with this process (its stdin closes)
    return _ZYGOTE["socket"]


def popen_cli(args: Any, cwd: Path | None, env: dict[str, str] | None) -> Any:
    """`python -m sweep ARGS` started with pipes for stdout and stderr (text): forked from the fork
    server where the environment allows (tests.zygote.needs_exec), else a subprocess.Popen."""
    from tests import zygote

    full = {**cli_env(), **(env or {})}
    argv = [str(a) for a in args]
    server = _zygote()
    if server is not None and zygote.needs_exec(full, _ZYGOTE["env"]) is None:
        return zygote.Forked(server, argv, str(Path(cwd or os.getcwd()).resolve()), full)
    return subprocess.Popen([sys.executable, "-m", "sweep", *argv], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m sweep ARGS`; `env`: extra environment variables."""
    proc = popen_cli(args, cwd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess([str(a) for a in args], proc.wait(), out, err)


def cli_here(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m sweep ARGS` through `main()` in this process, with `cwd` as the current directory and
    `env` set meanwhile: the exit code, stdout and stderr that `run_cli` gives, without a process
    start (~2-4 s each: imports and the trial module's). For the reading commands (status, plan,
    export, plot), and for `run` where it must refuse before anything starts (exit 2), in tests
    where no process boundary is the point; each command's own tests (tests/commands/, the
    signal and kill tests) run it as a process. Trial modules are imported once per process: only
    for studies whose trial module no other test of the run writes differently under its name."""
    import contextlib
    import io

    assert args and args[0] in ("status", "plan", "export", "plot", "run"), args
    out, err = io.StringIO(), io.StringIO()
    extra = {**({"SWEEP_COMPILATION_CACHE": str(_SHARED_CACHE[0])} if _SHARED_CACHE else {}), **(env or {})}
    saved = {k: os.environ.get(k) for k in extra}
    here = os.getcwd()
    try:
        os.environ.update(extra)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(here)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def refused(study_file: Path, capsys: Any, fragment: str) -> None:
    """`sweep run` of the study file, in-process, exits 2 with one line (no traceback) that names the file and
    holds `fragment`, and writes nothing beside it."""
    before = sorted(os.listdir(study_file.parent))
    assert main(["run", str(study_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {study_file}: ") and fragment in err and "Traceback" not in err, err
    assert sorted(os.listdir(study_file.parent)) == before  # nothing written


def ran(study_file: Path) -> Path:
    """The study file, after `python -m sweep run` of it ended with exit 0 (an uninterrupted reference run)."""
    result = run_cli("run", study_file, cwd=study_file.parent)
    assert result.returncode == 0, result.stderr
    return study_file


class Running:
    """A `python -m sweep ...` process whose stderr is collected line by line while it runs.

    `env`: extra environment variables (e.g. SWEEP_HOST to play another host). Each line is kept
    with its arrival time (`times`).
    """

    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.proc = popen_cli(args, cwd, env)
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

    def wait_for(self, pattern: str, timeout: float = 300, count: int = 1) -> re.Match[str]:
        """The first line matching `pattern`, once `count` lines match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for m in map(lambda line: re.search(pattern, line), list(self.lines)) if m]
            if len(found) >= count:
                return found[0]
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


def wait_for_checkpoint(ckpt_dir: Path, min_step: int, timeout: float = 300, proc: Running | None = None) -> int:
    """Wait until a committed step >= min_step exists in ckpt_dir; returns the newest step. With
    `proc`, fail at once if that run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.proc.poll() is None):
        steps = [int(p.name) for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
        if steps and max(steps) >= min_step:
            return max(steps)
        time.sleep(0.005)
    ended = f"; the run ended first: {proc.stderr}" if proc is not None and proc.proc.poll() is not None else ""
    raise AssertionError(f"no checkpoint >= {min_step} in {ckpt_dir}{ended}")


def wait_for_file(path: Path, timeout: float = 300, proc: Running | None = None) -> None:
    """Wait until `path` exists (a trial's marker that it got somewhere); with `proc`, fail at once
    if that run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.proc.poll() is None):
        if path.exists():
            return
        time.sleep(0.01)
    ended = f"; the run ended first: {proc.stderr}" if proc is not None and proc.proc.poll() is not None else ""
    raise AssertionError(f"no {path}{ended}")


def array_files(step_dir: Path) -> list[Path]:
    """The files that hold a committed step's array bytes: a small state's one file (`state.sweep`,
    sweep/checkpoints/compact.py), a chunk file per array (`<array>/0`, a larger state's Orbax layout) or
    the data files of OCDBT (`ocdbt.process_0/d/*`, releases before issue 42)."""
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and (
        p.name == "state.sweep" or p.parent.name == "d"
        or (p.parent.parent.name == "default" and p.name[0].isdigit())))


def checkpoint_dir(study: Path | dict[str, Any], number: int) -> Path:
    """Trial `number`'s checkpoint folder, of a study file or of an in-process study's dict."""
    workdir = study["workdir"] if isinstance(study, dict) else yaml.safe_load(study.read_text())["workdir"]
    return Path(workdir) / "checkpoints" / f"trial_{number:04d}"


def signalled_after_a_save(study_file: Path, number: int, signum: int, step: int = 100,
                           hold: Path | None = None) -> Running:
    """Run the study and send `signum` once trial `number` has a checkpoint at or past `step` (so it
    trains, not compiles); the ended run, which exited 128 + signum without a traceback. `hold`:
    the `hold` file of a gated trial (gated_trial), removed after the signal."""
    proc = Running("run", study_file, cwd=study_file.parent)
    proc.wait_for(rf"trial {number}: started")
    wait_for_checkpoint(checkpoint_dir(study_file, number), step)
    proc.signal(signum)
    if hold is not None:
        hold.unlink()
    assert proc.finish(timeout=60) == 128 + signum
    assert "Traceback" not in proc.stderr
    return proc


def kill_mid_trial(study_file: Path, number: int, min_step: int, hold: Path | None = None) -> list[int]:
    """Run the study and SIGKILL it once trial `number` has a checkpoint >= min_step; its kept steps.
    `hold`: the `hold` file of a gated trial (gated_trial), removed after the kill."""
    proc = Running("run", study_file, cwd=study_file.parent)
    proc.wait_for(rf"trial {number}: (started|resumed)")
    wait_for_checkpoint(checkpoint_dir(study_file, number), min_step)
    kill9(proc)
    if hold is not None:
        hold.unlink()
    return sorted(int(p.name) for p in checkpoint_dir(study_file, number).iterdir() if p.name.isdigit())


def gated_trial(folder: Path, at: int, base: str = "trials.digits_mlp", name: str = "gated_trial") -> str:
    """Write tests/trials/gated.py into `folder` as module `name` (the study's `trial`): `base`'s
    code, each process held at its `at`-th evaluation while folder/hold exists (the `held`
    fixture makes it). A test that waits for a step saved before that evaluation, and then kills
    or signals the process, knows the trial is mid-way: it cannot have finished meanwhile, however
    fast or loaded the machine."""
    from tests.trials.files import write_trial

    write_trial(folder, name, "gated", AT=at, BASE=base)
    return name


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
                        rounds: int = 4) -> int:
    """Run the study and send it `signum` `rounds` times, each at an event: first right after a
    line matching `first`; then right after the next line of a trial starting, going on, resuming
    or training again; then, by a seeded choice, either at such a line or once that trial's next
    save is committed (mid-training). Stops early once a run finishes by itself. The
    interruptions: at least two where the study has a trial left after `first`, on any machine,
    since each comes at a line the run writes before that trial's work, not after a time."""
    rng = random.Random(seed)
    kills = 0
    for i, pattern in enumerate([first, *[r"trial (\d+): (started|goes on|promoted|resumed|training again)"] * (rounds - 1)]):
        proc = Running("run", study_file, cwd=study_file.parent, env=env)
        try:
            match = proc.wait_for(pattern, timeout=120)
        except AssertionError:  # finished before: nothing left to interrupt
            assert proc.finish() == 0, proc.stderr
            break
        if i >= 2 and rng.random() < 0.5:  # at that trial's next committed save
            folder = checkpoint_dir(study_file, int(match.group(1)))
            committed = saved_steps(folder) if folder.exists() else []
            try:
                wait_for_checkpoint(folder, max(committed, default=-1) + 1, timeout=120, proc=proc)
            except AssertionError:  # the run ended first
                pass
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


def optuna_storage(url: str) -> Any:
    """What a user passes to optuna.load_study for a study file's `storage`: the URL itself, or
    Optuna's JournalStorage for a journal (journal://PATH, redis://...)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

    if url.startswith("journal://"):
        return JournalStorage(JournalFileBackend(url[len("journal://"):]))
    if url.startswith("redis://"):
        return JournalStorage(JournalRedisBackend(url))
    return url


def study_of(study_file: Path) -> optuna.Study:
    data = yaml.safe_load(study_file.read_text())
    storage = data.get("storage") or f"sqlite:///{data['workdir']}/study.db"
    return optuna.load_study(study_name=data["name"], storage=optuna_storage(storage))


def snapshot(study: Path | dict[str, Any]) -> list[tuple[Any, ...]]:
    """Everything that must be bit-identical between an interrupted and an uninterrupted study: of a
    study file (the CLI's) or of an in-process study's dict."""
    found = trials(study) if isinstance(study, dict) else sorted(study_of(study).trials, key=lambda t: t.number)
    return [(t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
             t.user_attrs.get("best_step"), t.user_attrs.get("best_value"), t.user_attrs.get("last_step"),
             t.user_attrs.get("metrics"))
            for t in found]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[tuple[Any, ...]]]:
    """reference(**overrides) -> snapshot of an uninterrupted run of BASE_STUDY + overrides, made once
    for the whole test run: the suite's processes (-n 2) share each snapshot through a file in the
    run's common temp folder, the first to need it making it under a file lock.
    reference.run(**overrides) -> (its study file, the run's stdout), to read, never to write."""
    cache: dict[str, tuple[list[tuple[Any, ...]], Path, str]] = {}
    shared = _run_folder(tmp_path_factory) / "references"
    shared.mkdir(exist_ok=True)

    def made(override: dict[str, Any]) -> tuple[list[tuple[Any, ...]], Path, str]:
        key = repr(sorted(override.items()))
        if key not in cache:
            stored = shared / f"{zlib.crc32(key.encode()):08x}.pickle"
            with open(stored.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if stored.exists():
                    found_key, cache[key] = pickle.loads(stored.read_bytes())
                    assert found_key == key, (found_key, key)
                else:
                    d = tmp_path_factory.mktemp("reference")
                    data = merge(BASE_STUDY, override)
                    data["workdir"] = str(d / "runs")
                    path = d / "study.yaml"
                    path.write_text(yaml.safe_dump(data, sort_keys=False))
                    result = run_cli("run", path, cwd=d)
                    assert result.returncode == 0, result.stderr
                    cache[key] = (snapshot(path), path, result.stdout)
                    stored.with_suffix(".tmp").write_bytes(pickle.dumps((key, cache[key])))
                    os.replace(stored.with_suffix(".tmp"), stored)
        return cache[key]

    def get(**override: Any) -> list[tuple[Any, ...]]:
        return made(override)[0]

    def run(**override: Any) -> tuple[Path, str]:
        """The reference's study file and the stdout of its run: for reading only (other tests share it)."""
        return made(override)[1:]

    get.run = run  # type: ignore[attr-defined]
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


@pytest.fixture
def small_disk(tmp_path):
    """mount(folder, size): a tmpfs of `size` at `folder`, unmounted after the test."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk is a real tmpfs here, and mounting one needs root and mount(8)")
    mounted: list[Path] = []

    def mount(folder: Path, size: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        options = f"size={size}" if folder not in mounted else f"remount,size={size}"
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip()}")
        mounted.append(folder)

    yield mount
    for folder in set(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


REDIS_URL = os.environ.get("SWEEP_TEST_REDIS", "redis://localhost:6379")


@pytest.fixture
def redis_url() -> Any:
    """An empty database of the local Redis server (.ci/run makes sure one runs) for one test's
    journal: 12 + the xdist worker's index (the suite runs two), flushed before and after."""
    import redis

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    url = f"{REDIS_URL}/{12 + int(worker[2:] or 0)}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


# --- The in-process tiny study: the fast tier's trial, run by `worker.run` in this process ---

# The trial module is imported once per process (module cache): a name no other test file uses.
# tests/trials/linear.py with MARKERS: marker files in the current directory steer its evaluation,
# `fault` makes the next one raise (and is removed, so a retry succeeds), `nan` makes every one
# NaN. Without markers every study computes the same, so a run with a fault compares bit for bit
# with the reference.
TRIAL = "sched_linear"
MARKED_TRIAL_SOURCE = trial_source("linear", MARKERS=True, METRICS=("val_loss",))
STEPS = 40


def make_study(root: Path, **override: Any) -> dict[str, Any]:
    """A study of 3 trials of 40 steps (evaluated every 10, saved every 20) whose workdir is under root."""
    study = {
        "name": "sched",
        "trial": TRIAL,
        "workdir": str(root / "runs"),
        "n_trials": 3,
        "objective": {"metric": "val_loss", "direction": "minimize"},
        "sampler": {"type": "tpe", "seed": 0},
        "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 0.3, "log": True}},
        "train": {"steps": STEPS, "eval_every": 10, "seed": 0},
        "checkpoint": {"every_steps": 20, "keep_last": 2},
    }
    study.update(override)
    return study


def write_trial(root: Path) -> None:
    (root / f"{TRIAL}.py").write_text(MARKED_TRIAL_SOURCE)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the current directory, with the trial module in it (found there, as from the CLI)."""
    write_trial(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def sweep_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """caplog on the "sweep" logger, even after `sweep.run.logs.setup` (another test) stopped its propagation."""
    monkeypatch.setattr(logging.getLogger("sweep"), "propagate", True)
    caplog.set_level(logging.INFO, logger="sweep")
    return caplog


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sweep"]


def watch_steps(session: Session | StudySession, watch: Callable[[int, int], None]) -> None:
    """Let `watch(number, step)` see every training window of the session's trials (a `sweep.open`
    StudySession or the internal Session, whose progress reports it watches)."""
    internal = session._session if isinstance(session, StudySession) else session
    internal.watch_steps(watch)


def run(study: dict[str, Any], stop: StopSignal | None = None,
        on_step: Callable[[int, int], None] | None = None) -> None:
    """`worker.run` of the study in this process; `on_step(number, step)` also sees every window."""
    session = Session(config_lib.from_dict(study))
    if on_step is not None:
        watch_steps(session, on_step)
    try:
        worker.run(session, stop or StopSignal())
    finally:
        session.close()


def run_interrupted(study: dict[str, Any], number: int, step: int) -> None:
    """Run the study; as trial `number` passes `step`, stop as SIGTERM would (the handler's flag)."""
    stop = StopSignal()

    def on_step(n: int, s: int) -> None:
        if n == number and s >= step:
            stop.signum = signal.SIGTERM

    with pytest.raises(Interrupted) as raised:
        run(study, stop, on_step)
    assert raised.value.signum == signal.SIGTERM


def trials(study: dict[str, Any]) -> list[FrozenTrial]:
    """The study's trials, read fresh from its storage, by number."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{study['workdir']}/study.db", skip_compatibility_check=True,
                                         skip_table_creation=True)
    try:
        found = optuna.load_study(study_name=study["name"], storage=storage).get_trials(deepcopy=True)
    finally:
        storage.engine.dispose()
    return sorted(found, key=lambda t: t.number)


def saved_steps(folder: str | Path) -> list[int]:
    return sorted(int(p.name) for p in Path(folder).iterdir() if p.name.isdigit())


def files(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file and folder under root: any write, delete or new file changes it."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def claim_rows(study: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """key -> (owner, heartbeat) of the study's trial claims."""
    engine = sa.create_engine(f"sqlite:///{study['workdir']}/study.db")
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(claims.claims_table)).all()
    finally:
        engine.dispose()
    return {r.key: (r.owner, r.heartbeat) for r in rows if r.key.startswith("trial:")}


def forge_claim(study: dict[str, Any], number: int, owner: str, heartbeat: float) -> str:
    """Make trial `number`'s claim row say that `owner` holds it, last renewed at `heartbeat`; its key."""
    session = Session(config_lib.from_dict(study)).open(create=False)
    try:
        key = session.claims.key(number)
        t = claims.claims_table
        with session.storage.engine.begin() as conn:
            conn.execute(t.delete().where(t.c.key == key))
            conn.execute(t.insert().values(key=key, owner=owner, heartbeat=heartbeat))
    finally:
        session.close()
    return key


@pytest.fixture(scope="module", autouse=True)
def _jax_cache_config_restored() -> Iterator[None]:
    """A study's run points JAX's process-wide persistent compilation cache at its workdir (with no
    size or time threshold); later tests in this process must neither write there nor hit it."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes", "jax_persistent_cache_enable_xla_caches",
             "jax_compilation_cache_max_size",
             "jax_cpu_enable_async_dispatch")  # set by test trial modules imported here (tests/trials/gated.py)
    before = {name: jax.config.values[name] for name in names}  # every flag, with or without a context manager
    yield
    compilation_cache.reset_cache()
    for name, value in before.items():
        jax.config.update(name, value)


# --- from tests/test_api.py (shared with other test files) ---

# Trial modules are imported once per process (module cache): each name here is used by no other
# test file, and the hygiene tests take fresh names so that they import (and compile) anew.
TRIAL_SOURCE = trial_source("linear")  # tests/trials/linear.py


def sigterm_at(session: Session | StudySession, number: int, step: int) -> None:
    """As trial `number` passes `step`, deliver SIGTERM to the handler `run` installed (as the
    interpreter would, in the main thread), once."""
    fired: list[int] = []

    def watch(n: int, s: int) -> None:
        if n == number and s >= step and not fired:
            fired.append(s)
            handler = signal.getsignal(signal.SIGTERM)
            assert isinstance(getattr(handler, "__self__", None), StopSignal), handler
            handler(signal.SIGTERM, None)

    watch_steps(session, watch)


# --- from tests/run/test_workers.py (shared with other test files) ---

def _loky_children(pid: int) -> list[int]:
    """Pids of the loky worker processes whose parent is `pid`."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"popen_loky_posix" in cmdline:
            found.append(int(stat.parent.name))
    return found


# --- from tests/commands/test_cli_output.py (shared with other test files) ---

def write(study: dict[str, Any], root: Path, file: str = "study.yaml") -> Path:
    path = root / file
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def cli(capsys: Any, *args: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- from tests/checkpoints/test_remote.py (shared with other test files) ---

BUCKET = "sweep-test"


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """An S3-compatible server on a free localhost port, with the standard environment pointing at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield env["AWS_ENDPOINT_URL"]
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tier_of(prefix: str, storage: str, name: str) -> RemoteTier:
    """The remote tier of study `name` in the bucket (`.tier`: its S3Tier), its folder there named by its identity."""
    import optuna

    return RemoteTier(S3Tier(prefix, optuna.load_study(study_name=name, storage=storage).user_attrs["remote_root"]))


# --- from tests/test_release_json.py (shared with other test files) ---

def _conforms(doc: dict[str, Any], typed: Any, name: str) -> None:
    """Every key of `doc` is a key of the TypedDict `typed`, and every required key of it is in `doc`."""
    assert set(doc) <= set(typed.__annotations__), f"{name}: not in {typed.__name__}: {set(doc) - set(typed.__annotations__)}"
    assert typed.__required_keys__ <= set(doc), f"{name}: {typed.__name__} requires {typed.__required_keys__ - set(doc)}"


# --- from tests/train/test_ledger.py (shared with other test files) ---

class Killed(BaseException):
    """Not an Exception: no handler of sweep's sees it as a failure of the trial."""


def run_killed(study: dict[str, Any], number: int, step: int) -> None:
    def on_step(n: int, s: int) -> None:
        if n == number and s >= step:
            raise Killed

    with pytest.raises(Killed):
        run(study, on_step=on_step)


# --- the scheduler simulator's replays (tests/run/test_simulator.py, tests/schedulers/test_asha.py) ---

_LINES = [  # the run log's line of each decision (sweep/run/worker.py, sweep/schedulers/)
    (re.compile(r"trial (\d+): started with params"), "start"),
    (re.compile(r"trial (\d+): promoted from rung (\d+) .*, trains on to step (\d+)"), "promote"),
    (re.compile(r"trial (\d+): paused at rung (\d+), "), "pause"),
    (re.compile(r"trial (\d+): paused at rung (\d+) and not promoted: pruned"), "end"),
    (re.compile(r"trial (\d+): complete, .* (\d+) steps$"), "complete"),
    (re.compile(r"trial (\d+): pruned, .* (\d+) steps$"), "prune"),
]


def logged_decisions(lines: list[str]) -> list[tuple[Any, ...]]:
    """(kind, number, step[, to]) of each decision line of a run's log, in order."""
    out: list[tuple[Any, ...]] = []
    for line in lines:
        for pattern, kind in _LINES:
            m = pattern.search(line)
            if m:
                numbers = [int(g) for g in m.groups()]
                out.append((kind, numbers[0], numbers[1] if len(numbers) > 1 else 0, *numbers[2:]))
                break
    return out


def simulated(decisions: list[Any]) -> list[tuple[Any, ...]]:
    return [(d.kind, d.number, d.step, *([d.to] if d.kind == "promote" else [])) for d in decisions]


def replay_outcome(found: list[FrozenTrial]) -> list[tuple[Any, ...]]:
    return [(t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
             t.user_attrs.get("paused_at"), t.user_attrs.get("rung_target")) for t in found]
