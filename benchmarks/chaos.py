"""Chaos campaign (issue 31): several hosts on one PostgreSQL database and one S3 bucket, faults at
seeded random moments, then the guarantees checked over the whole history.

    .venv/bin/python benchmarks/chaos.py --minutes 30 --seed 1 --report chaos-report.json

Each "host" is a `python -m sweep run study.yaml` process with its own SWEEP_HOST and its own
workdir (a tmpfs of its own where this runs as root, so its disk can fill). Every few seconds the
seeded schedule injects one fault:

  kill9      SIGKILL of a worker                 sigterm   SIGTERM of a worker (exit 143)
  freeze     SIGSTOP of a worker past the lease  pg        PostgreSQL restarted (pg_ctlcluster)
  s3         the bucket away for seconds         disk      a host's tmpfs filled, then freed
  damage     a file of a running trial's newest committed step overwritten in place

A worker that exits is started again with the same command while the campaign runs; afterwards
every fault is undone, dead hosts are restarted, and all must exit 0. Then the invariants:

  - exactly n_trials trials finished (COMPLETE or PRUNED), none FAIL, none left RUNNING/WAITING;
  - each trial is the uninterrupted run's trial of that number: the same params, and every
    evaluation it reported equal bit for bit to the reference's at that step (the reference runs
    with no pruner: which trials the median pruner cuts depends on which other trials had reported
    when it asked, with several workers; what a trial computes does not); a COMPLETE trial ends
    with the reference's value, best and last step;
  - keep_trials held: only the K best COMPLETE trials have checkpoints, on any host or in the bucket;
  - max_disk held: each host's checkpoints take at most max_disk at the end (the report also gives
    the peak sampled every second meanwhile: a takeover's fetch from the bucket is not capped);
  - no temporary folder left (Orbax's *.orbax-checkpoint-tmp*, sweep's dot-names);
  - `sweep export` from an empty folder (reading the bucket) writes every kept trial and each
    exported trial's params equal the ones exported from the hosts' checkpoints.

With --shared-fs (issue 41) the hosts share only a filesystem: the study is Optuna's journal file
there (`journal://`), the workdir (checkpoints) one folder there for every host (a tmpfs where this
runs as root: the disk fault fills it for all), and there is no bucket; the faults are kill9,
sigterm, freeze, disk and damage, and the invariants the same (keep_trials and max_disk over the
shared folder; the export from an empty folder reads the shared workdir).

The report (JSON) lists the faults injected and the invariants; the seed reproduces a schedule.
The faults that need root (disk, pg) are left out where this does not run as root.
tests/run/test_chaos.py runs its short deterministic form (`campaign(..., scenario=True)`): each
kind once, each injected when a host has committed a new step since the previous fault.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
BUCKET = "chaos"
PG_ADMIN = os.environ.get("SWEEP_TEST_POSTGRES", "postgresql+psycopg://postgres@localhost/postgres")
KINDS = ("kill9", "sigterm", "freeze", "pg", "s3", "disk", "damage")
LEASE_GRACE = 3.0
MAX_DISK = "2MB"  # per host: binds at times (a host holds ~1-1.5 MB of steps), never below what it must keep
KINDS_ROUND: list[str] = list(KINDS)  # the kinds a round of the schedule takes (campaign sets it)
SHARED: list[Path] = []  # --shared-fs: the one folder every host's workdir is in (campaign sets it)


def _ckpt_root(folder: Path, name: str) -> Path:
    """The checkpoints of the study as the host running in `folder` sees them."""
    return (SHARED[0] if SHARED else folder) / "runs" / name / "checkpoints"


class Proxy:
    """A TCP relay in front of the S3 server: stopping it is an outage that keeps the bucket's
    objects (moto's server keeps them in memory, so stopping the server itself would lose them)."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, _free_port()
        self._sock: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(100):  # the port of the stopped listener can take a moment to be free
            try:
                sock.bind(("127.0.0.1", self.port))
                break
            except OSError:
                time.sleep(0.1)
        else:
            sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept(); close alone does not
            except OSError:
                pass
            sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    @property
    def up(self) -> bool:
        return self._sock is not None

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def optuna_logging() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_cluster() -> list[str] | None:
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if os.geteuid() != 0 or not versions or shutil.which("pg_ctlcluster") is None:
        return None
    return ["pg_ctlcluster", versions[-1], "main", "restart"]


def _mount(folder: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


class Host:
    """One host: its folder, its current `sweep run` process, and every run's exit code."""

    def __init__(self, index: int, folder: Path, study: Path, env: dict[str, str]) -> None:
        self.index, self.folder, self.study, self.env = index, folder, study, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs: list[int] = []
        self.frozen = False
        self.log = open(folder.parent / f"host{index}.log", "ab")

    def start(self) -> None:
        self.log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(self.study)], cwd=self.folder,
                                     env={**self.env, "SWEEP_HOST": f"host-{self.index}"},
                                     stdout=self.log, stderr=self.log)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> int | None:
        """The exit code of a run that ended since the last call, else None."""
        if self.proc is not None and self.proc.poll() is not None:
            code, self.proc = self.proc.returncode, None
            self.runs.append(code)
            self.log.write(f"--- exit {code} {time.strftime('%H:%M:%S')}\n".encode())
            self.log.flush()
            return code
        return None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)  # type: ignore[union-attr]


def study_file(folder: Path, storage: str, n_trials: int, steps: int, pruner: bool, remote: str | None,
               name: str, workdir: Path | None = None) -> Path:
    data: dict[str, Any] = {
        "name": name, "trial": "trials.digits_mlp", "n_trials": n_trials, "storage": storage,
        "objective": {"metric": "val_loss", "direction": "minimize"},
        "sampler": {"type": "random", "seed": 11},
        "pruner": ({"type": "median", "n_startup_trials": 2, "n_warmup_steps": steps // 2} if pruner
                   else {"type": "none"}),
        "search_space": {"learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True},
                         "hidden": {"type": "int", "low": 16, "high": 64, "step": 16}},
        "fixed": {"batch_size": 32},
        "train": {"steps": steps, "eval_every": steps // 20, "seed": 0},
        "checkpoint": {"every_steps": steps // 10, "keep_last": 2, "keep_best": 1, "keep_trials": 2,
                       "max_disk": MAX_DISK},
        "parallel": {"lease_grace_seconds": LEASE_GRACE},
    }
    if remote:
        data["checkpoint"]["remote"] = remote
    if workdir is not None:
        data["workdir"] = str(workdir)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _create_database() -> tuple[str, Any]:
    import sqlalchemy as sa

    name = f"sweep_chaos_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}", drop


def _optuna_storage(url: str) -> Any:
    """What optuna.load_study takes for the study file's storage (a journal: JournalStorage)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

    if url.startswith("journal://"):
        return JournalStorage(JournalFileBackend(url[len("journal://"):]))
    return JournalStorage(JournalRedisBackend(url)) if url.startswith("redis://") else url


def _damage(hosts: list[Host], storage: str, name: str, rng: random.Random) -> str | None:
    """Overwrite the middle of one file of the newest committed step of a RUNNING trial."""
    import optuna

    try:
        running = [t.number for t in optuna.load_study(study_name=name,
                                                        storage=_optuna_storage(storage)).get_trials(deepcopy=False)
                   if t.state.name == "RUNNING"]
    except Exception:  # noqa: BLE001 - not created yet, or the database is restarting: no target now
        return None
    candidates = []
    for root in sorted({_ckpt_root(h.folder, name) for h in hosts}):
        for number in running:
            folder = root / f"trial_{number:04d}"
            steps = sorted((p for p in folder.glob("*") if p.name.isdigit()), key=lambda p: int(p.name))
            if steps:
                files = [f for f in steps[-1].rglob("*") if f.is_file() and f.stat().st_size > 16]
                candidates += files
    if not candidates:
        return None
    target = rng.choice(sorted(candidates))
    try:
        with open(target, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size // 2)
            f.write(bytes(rng.randrange(256) for _ in range(min(16, size - size // 2))))
    except OSError:
        return None
    return str(target.relative_to(target.parents[4]))


def _fill(folder: Path) -> Path:
    """Fill the tmpfs at `folder` to the last byte; the filler file is returned (removed to grow)."""
    filler = folder / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def campaign(root: Path, minutes: float, seed: int, workers: int, n_trials: int, steps: int,
             storage: str | None = None, kinds: tuple[str, ...] = KINDS, say: Any = print,
             beside: bool = False, scenario: bool = False, shared_fs: bool = False) -> dict[str, Any]:
    """Run one campaign under `root`; its report (see the module's docstring). `beside`: the
    reference trains while the campaign runs (a long campaign: its reference is as long).
    `scenario`: the short deterministic form (tests/run/test_chaos.py): each kind once, in the order
    of `kinds`, each as soon as a host has committed a step it had not before the previous fault
    (an event, not a time: the same faults land in the same phase of the study, loaded or not);
    `minutes` is then only a deadline."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the S3 server's request log
    optuna_logging()

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    drop = None
    mounted: list[Path] = []
    SHARED[:] = [root / "shared"] if shared_fs else []
    if shared_fs:
        SHARED[0].mkdir()
        if "disk" in kinds and _mount(SHARED[0], "384m"):
            mounted.append(SHARED[0])
        storage = storage or f"journal://{SHARED[0] / 'study.log'}"
    if storage is None:
        storage, drop = _create_database()
    s3_port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    server.start()
    proxy = Proxy(s3_port)
    proxy.start()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}", "AWS_ACCESS_KEY_ID": "chaos",
           "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_DEFAULT_REGION": "us-east-1"}
    report: dict[str, Any] = {"seed": seed, "minutes": minutes, "workers": workers, "n_trials": n_trials,
                              "steps": steps, "storage": storage.split(":")[0], "shared_fs": shared_fs,
                              "faults": [], "skipped_kinds": []}
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_port}", aws_access_key_id="chaos",
                     aws_secret_access_key="chaos", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        name = "chaos"
        say(f"reference: the same study uninterrupted, one process, no pruner ({n_trials} trials)"
            + (", beside the campaign" if beside else ""))
        ref_dir = root / "reference"
        ref_dir.mkdir()
        ref_study = study_file(ref_dir, f"sqlite:///{ref_dir / 'study.db'}", n_trials, steps, False, None, name)
        t0 = time.monotonic()
        ref_log = open(root / "reference.log", "wb")
        ref_proc = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(ref_study)], cwd=ref_dir, env=env,
                                    stdout=ref_log, stderr=ref_log)
        if not beside:
            assert ref_proc.wait() == 0, (root / "reference.log").read_text()[-3000:]
            report["reference_seconds"] = round(time.monotonic() - t0, 1)
        study = study_file(root, storage, n_trials, steps, True, None if shared_fs else f"s3://{BUCKET}/campaign",
                           name, SHARED[0] / "runs" / name if shared_fs else None)
        hosts = []
        for i in range(workers):
            folder = root / f"host{i}"
            folder.mkdir()
            if "disk" in kinds and not shared_fs and _mount(folder, "128m"):
                mounted.append(folder)
            hosts.append(Host(i, folder, study, env))
        active = [k for k in kinds if not ((k == "pg" and (_pg_cluster() is None or shared_fs)) or
                                           (k == "s3" and shared_fs) or (k == "disk" and not mounted))]
        report["skipped_kinds"] = sorted(set(kinds) - set(active))
        global KINDS_ROUND
        KINDS_ROUND = active
        schedule: list[str] = []
        for host in hosts:
            host.start()
            time.sleep(0.5)  # one creates the study, the others open it
        undo: list[tuple[float, str, Any]] = []  # (when, what, target)
        start = time.monotonic()
        deadline = start + minutes * 60
        next_fault = start + rng.uniform(4, 8)
        finished = False
        queue = list(active) if scenario else schedule
        seen_steps = _committed(hosts, name)
        while time.monotonic() < deadline and not finished and not (scenario and not queue and not undo):
            now = time.monotonic()
            for when, what, target in [u for u in undo if u[0] <= now]:
                undo.remove((when, what, target))
                _undo(what, target, proxy)
            for host in hosts:
                code = host.reap()
                if code == 0:
                    finished = True  # a run exits 0 once the study has n_trials finished
                elif code is not None and not host.frozen:
                    host.start()
            fault = None
            if scenario:
                steps_now = _committed(hosts, name)
                if queue and steps_now - seen_steps:  # a new committed step since the previous fault
                    fault = _inject_kind(queue[0], rng, hosts, proxy, storage, name, undo, now)
                    if fault:  # (a kind with no target now, damage before a step it can reach, waits)
                        queue.pop(0)
                        seen_steps = steps_now
            elif now >= next_fault:
                fault = _inject(rng, schedule, hosts, proxy, storage, name, undo, now)
                next_fault = now + rng.uniform(2, 6)
            if fault:
                fault["t"] = round(now - start, 1)
                report["faults"].append(fault)
                say(f"{fault['t']:7.1f}s {fault['kind']}: {fault.get('target', '')}")
            _sample_disk(hosts, name, report)
            time.sleep(0.1)
        report["fault_seconds"] = round(time.monotonic() - start, 1)
        say("faults over: everything undone, every host runs until the study is finished")
        for _, what, target in undo:
            _undo(what, target, proxy)
        finish_by = time.monotonic() + 900
        done = set()
        for host in hosts:
            if not host.alive():
                host.reap()
                host.start()
        while len(done) < len(hosts) and time.monotonic() < finish_by:
            for host in hosts:
                if host.index in done:
                    continue
                code = host.reap()
                if code == 0:
                    done.add(host.index)
                elif code is not None:
                    host.start()
            time.sleep(0.2)
        report["total_seconds"] = round(time.monotonic() - start, 1)
        if beside:
            assert ref_proc.wait() == 0, (root / "reference.log").read_text()[-3000:]
            report["reference_seconds"] = round(time.monotonic() - t0, 1)
        report["exit_codes"] = {f"host-{h.index}": h.runs for h in hosts}
        report["invariants"] = check(root, study, ref_study, hosts, storage, name, env)
        report["held"] = all(v is True for v in report["invariants"].values())
        return report
    finally:
        if "ref_proc" in locals() and ref_proc.poll() is None:
            ref_proc.kill()
            ref_proc.wait()
        proxy.stop()
        for host in hosts if "hosts" in locals() else []:
            if host.alive():
                host.signal(signal.SIGCONT)
                host.signal(signal.SIGKILL)
                host.proc.wait()  # type: ignore[union-attr]
        server.stop()
        for folder in mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        if drop is not None:
            drop()


def _inject(rng: random.Random, kinds: list[str], hosts: list[Host], proxy: Proxy, storage: str, name: str,
            undo: list[tuple[float, str, Any]], now: float) -> dict[str, Any] | None:
    """Inject the next fault of `kinds` (a seeded round: each kind once per round, in random order).
    A kind with no target now (damage before any step is committed, a bucket already away) keeps its
    place at the front and the next kind of the queue is injected in this slot instead: one fault
    per slot, no slot lost, no kind dropped (a short campaign can end before a kind's next turn)."""
    tried: list[str] = []
    for _ in range(len(KINDS_ROUND)):
        if not kinds:  # the next round, less the kinds still waiting for a target
            kinds += [k for k in rng.sample(KINDS_ROUND, len(KINDS_ROUND)) if k not in tried]
        if not kinds:
            break
        kind = kinds.pop(0)
        fault = _inject_kind(kind, rng, hosts, proxy, storage, name, undo, now)
        if fault is not None:
            kinds[:0] = tried
            return fault
        tried.append(kind)
    kinds[:0] = tried
    return None


def _inject_kind(kind: str, rng: random.Random, hosts: list[Host], proxy: Proxy, storage: str, name: str,
                 undo: list[tuple[float, str, Any]], now: float) -> dict[str, Any] | None:
    alive = [h for h in hosts if h.alive() and not h.frozen]
    if kind in ("kill9", "sigterm", "freeze"):
        if not alive:
            return None
        host = rng.choice(alive)
        if kind == "freeze":
            host.signal(signal.SIGSTOP)
            host.frozen = True
            undo.append((now + LEASE_GRACE + rng.uniform(1, 4), "thaw", host))
        else:
            host.signal(signal.SIGKILL if kind == "kill9" else signal.SIGTERM)
        return {"kind": kind, "target": f"host-{host.index}"}
    if kind == "pg":
        result = subprocess.run(_pg_cluster() or [], capture_output=True, text=True)  # blocks for seconds
        return {"kind": kind, "target": "postgresql", "ok": result.returncode == 0}
    if kind == "s3":
        if not proxy.up:
            return None
        proxy.stop()
        undo.append((now + rng.uniform(2, 8), "s3", None))
        return {"kind": kind, "target": "bucket"}
    if kind == "disk":
        if SHARED:  # the shared folder, full for every host at once
            if not SHARED[0].is_mount() or (SHARED[0] / "filler.bin").exists():
                return None
            undo.append((now + rng.uniform(3, 10), "grow", _fill(SHARED[0])))
            return {"kind": kind, "target": "shared"}
        candidates = [h for h in hosts if h.folder.is_mount() and not (h.folder / "filler.bin").exists()]
        if not candidates:
            return None
        host = rng.choice(candidates)
        filler = _fill(host.folder)
        undo.append((now + rng.uniform(3, 10), "grow", filler))
        return {"kind": kind, "target": f"host-{host.index}"}
    if kind == "damage":
        target = _damage(hosts, storage, name, rng)
        return {"kind": kind, "target": target} if target else None
    raise AssertionError(kind)


def _undo(what: str, target: Any, proxy: Proxy) -> None:
    if what == "thaw":
        target.signal(signal.SIGCONT)
        target.frozen = False
    elif what == "s3" and not proxy.up:
        proxy.start()
    elif what == "grow":
        target.unlink(missing_ok=True)


def _committed(hosts: list[Host], name: str) -> set[tuple[int, str, str]]:
    """(host, trial folder, step) of every step committed on the hosts' disks now."""
    return {(h.index, step.parent.name, step.name) for h in hosts
            for step in _ckpt_root(h.folder, name).glob("trial_*/*") if step.name.isdigit()}


_SAMPLED = [0.0]


def _sample_disk(hosts: list[Host], name: str, report: dict[str, Any]) -> None:
    """Each host's checkpoint bytes (as the budget counts them), once a second: the peak goes in the report."""
    if time.monotonic() - _SAMPLED[0] < 1.0:
        return
    _SAMPLED[0] = time.monotonic()
    from sweep.checkpoints.retention import folder_bytes

    peak = report.setdefault("peak_checkpoint_bytes", {})
    for h in hosts:
        used = folder_bytes(_ckpt_root(h.folder, name))
        peak[f"host-{h.index}"] = max(peak.get(f"host-{h.index}", 0), used)


def check(root: Path, study: Path, ref_study: Path, hosts: list[Host], storage: str, name: str,
          env: dict[str, str]) -> dict[str, Any]:
    """The invariants (module docstring): name -> True, or what broke it."""
    import optuna

    out: dict[str, Any] = {}
    trials = sorted(optuna.load_study(study_name=name, storage=_optuna_storage(storage)).get_trials(deepcopy=False),
                    key=lambda t: t.number)
    ref = {t.number: t for t in optuna.load_study(
        study_name=name, storage=f"sqlite:///{ref_study.parent / 'study.db'}").get_trials(deepcopy=False)}
    states = [t.state.name for t in trials]
    n_trials = yaml.safe_load(study.read_text())["n_trials"]
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    out["n_trials_finished"] = (True if len(finished) == n_trials and len(trials) == n_trials
                                else f"{len(finished)} finished of {len(trials)}: {states}")
    out["no_trial_failed"] = True if "FAIL" not in states else [t.number for t in trials if t.state.name == "FAIL"]
    broken = []
    for t in trials:
        r = ref.get(t.number)
        if r is None or t.params != r.params:
            broken.append(f"trial {t.number}: params")
            continue
        for step, value in t.intermediate_values.items():
            if r.intermediate_values.get(step) != value:
                broken.append(f"trial {t.number}: evaluation at step {step}")
                break
        if t.state.name == "COMPLETE" and (t.value != r.value or any(
                t.user_attrs.get(k) != r.user_attrs.get(k) for k in ("best_step", "best_value", "last_step"))):
            broken.append(f"trial {t.number}: final value or steps")
    out["bit_identical_to_uninterrupted"] = True if not broken else broken
    complete = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: (t.value, t.number))
    keep = {f"trial_{t.number:04d}" for t in complete[:2]}
    local = {p.name for h in hosts for p in _ckpt_root(h.folder, name).glob("trial_*")
             if any(s.name.isdigit() for s in p.iterdir())}
    from sweep.checkpoints.remote import RemoteTier
    from sweep.checkpoints.s3 import S3Tier

    env_saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                "AWS_DEFAULT_REGION")}
    os.environ.update({k: env[k] for k in env_saved})
    try:
        remote = set()
        if not SHARED:  # no bucket where the hosts share a filesystem
            tier = RemoteTier(S3Tier(f"s3://{BUCKET}/campaign",
                                     optuna.load_study(study_name=name, storage=storage).user_attrs["remote_root"]))
            remote = {f"trial_{t.number:04d}" for t in trials if tier.steps(f"trial_{t.number:04d}")}
    finally:
        for k, v in env_saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out["keep_trials_held"] = (True if local <= keep and remote <= keep and keep <= local | remote
                               else {"keep": sorted(keep), "local": sorted(local), "bucket": sorted(remote)})
    from pydantic import ByteSize, TypeAdapter

    from sweep.checkpoints.retention import folder_bytes

    cap = TypeAdapter(ByteSize).validate_python(MAX_DISK)
    used = {f"host-{h.index}": folder_bytes(_ckpt_root(h.folder, name)) for h in hosts}
    out["max_disk_held"] = True if all(u <= cap for u in used.values()) else {"max_disk": cap, "used": used}
    leftovers = [str(p.relative_to(root)) for h in hosts for p in _ckpt_root(h.folder, name).parent.rglob("*")
                 if ".orbax-checkpoint-tmp" in p.name or p.name.endswith(".removing") or p.name.endswith(".tmp")]
    out["no_temporary_folders"] = True if not leftovers else leftovers
    # Export from an empty folder: every kept step comes from the bucket, checksums verified.
    fresh = root / "fresh"
    fresh.mkdir()
    result = subprocess.run([sys.executable, "-m", "sweep", "export", str(study), "--out", str(fresh / "export")],
                            cwd=fresh, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        out["export_verifies"] = result.stderr[-2000:]
    else:
        index = json.loads((fresh / "export" / "index.json").read_text())
        exported = {f"trial_{t['number']:04d}" for t in index["trials"]}
        out["export_verifies"] = True if exported == keep else {"exported": sorted(exported), "keep": sorted(keep)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3, help="hosts (one sweep run each)")
    parser.add_argument("--trials", type=int, default=None, help="n_trials (default: enough for --minutes)")
    parser.add_argument("--steps", type=int, default=100000, help="training steps per trial")
    parser.add_argument("--kinds", default=",".join(KINDS), help="faults to inject (comma-separated)")
    parser.add_argument("--root", type=Path, default=None, help="folder of the campaign (default: a new temp dir)")
    parser.add_argument("--report", type=Path, default=None, help="write the report (JSON) here too")
    parser.add_argument("--shared-fs", action="store_true",
                        help="hosts share only a filesystem: the study in a journal file there, one shared workdir, no bucket")
    parser.add_argument("--reference-first", action="store_true",
                        help="train the uninterrupted reference before the campaign, not beside it")
    args = parser.parse_args(argv)
    import tempfile

    root = args.root or Path(tempfile.mkdtemp(prefix="sweep-chaos-"))
    n_trials = args.trials or max(8, int(args.minutes * 5))  # about what 3 hosts finish per minute here
    report = campaign(root / "campaign", args.minutes, args.seed, args.workers, n_trials, args.steps,
                      kinds=tuple(args.kinds.split(",")), beside=not args.reference_first, shared_fs=args.shared_fs)
    counts: dict[str, int] = {}
    for f in report["faults"]:
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    report["fault_counts"] = counts
    text = json.dumps(report, indent=1)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    print(f"faults injected: {counts}; invariants {'held' if report['held'] else 'BROKEN'} (folder {root})",
          file=sys.stderr)
    return 0 if report["held"] else 1


if __name__ == "__main__":
    sys.exit(main())
