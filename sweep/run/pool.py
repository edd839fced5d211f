"""Running the scheduler in this process, or in `n_jobs` worker processes through joblib."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable

from sweep.errors import Interrupted, SweepError
from sweep.words import count

if TYPE_CHECKING:  # light at import: `run` calls prestart() before it imports JAX, Orbax, Optuna
    from sweep.host.signals import StopSignal
    from sweep.host.slots import Slot
    from sweep.store.session import Session
    from sweep.study.config import Config, Source

log = logging.getLogger("sweep")

_BUSY = threading.Event()  # this worker process is running a study
_WATCHING: list[int] = []  # the parent pid the watcher thread watches (started once per process)


def _watch_parent() -> None:
    """A loky worker outlives a parent killed with SIGKILL (no atexit ran to stop it), keeps
    training, and holds the parent's stdout/stderr open. So: when the parent is gone, a busy worker
    stops as on SIGTERM (its trial checkpoints and stays resumable) and an idle one exits."""
    parent = _WATCHING[0]
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            if not _BUSY.is_set():
                os._exit(0)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def core_shares(n_jobs: int) -> list[list[int]]:
    """The CPUs of each of `n_jobs` workers: this process's CPUs dealt out round-robin."""
    cpus = sorted(os.sched_getaffinity(0))
    if n_jobs <= len(cpus):
        return [cpus[i::n_jobs] for i in range(n_jobs)]
    return [[cpus[i % len(cpus)]] for i in range(n_jobs)]


def _pin(cpus: Iterable[int]) -> None:
    """Run this process, every thread of it, on `cpus` only.

    XLA's CPU thread pools are as large as the CPUs a process may run on (sched_getaffinity) when
    JAX starts its backend, so N workers would each start a pool per core and oversubscribe the
    machine. XLA flags that limit the pools would do the same, but they are part of JAX's
    compilation-cache key, so workers would miss the executables cached by a one-process run; an
    affinity mask changes no key. A mask is per thread: threads started before (XLA's pools, if
    the backend already started: the checks before a run may start it) are pinned one by one,
    and later ones inherit it.
    """
    cpus = list(cpus)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass


def prestart(study_file: str, n_jobs: int | None) -> None:
    """Start the helper processes of `run --n-jobs N` now, importing what a worker needs (JAX, Orbax,
    Optuna, the trial module: seconds), while this process validates the study file. They start
    no XLA backend and touch no file until `run_workers` hands them the study.

    `n_jobs`: from --n-jobs, else peeked from the file's parallel section (validated later).
    """
    import yaml

    try:
        raw = yaml.safe_load(open(study_file, encoding="utf-8"))
        parallel = raw.get("parallel") or {}
        n = n_jobs if n_jobs is not None else parallel.get("n_jobs", 1)
        if n == "auto":  # counted without starting JAX; a host that needs a probe starts them later
            from sweep.host import slots

            host = slots.host_devices() if not slots.needs_probe() else None
            n = slots.resolve_n_jobs(n, int((raw.get("train") or {}).get("devices", 1)),
                                     int(parallel.get("trials_per_device", 1)), host) if host else 1
        n = int(n)
        trial = str(raw.get("trial", ""))
    except Exception:  # an unreadable file: validation reports it
        return
    if n <= 1 or parallel.get("backend", "loky") != "loky":
        return
    from joblib.externals.loky import get_reusable_executor

    executor = get_reusable_executor(max_workers=n - 1)
    for _ in range(n - 1):
        executor.submit(_preload, trial, os.getcwd())
    _PRESTARTED.append(executor)


_PRESTARTED: list[Any] = []  # the executor prestart() started, until run_workers or stop_prestarted takes it


def stop_prestarted() -> None:
    """Kill the helpers prestart() started: `run` ends before using them (a study-file error, say).
    Left alone, they would hold the caller's stderr open until their imports finish."""
    while _PRESTARTED:
        executor = _PRESTARTED.pop()
        # shutdown(kill_workers=True) leaves the killing to loky's manager thread, which an exit
        # that follows at once never lets run: the helpers are killed here, then shut down.
        for process in list(getattr(executor, "_processes", {}).values()):
            try:
                os.kill(process.pid, signal.SIGKILL)
            except (OSError, TypeError):
                pass  # gone already, or not started
        executor.shutdown(wait=True, kill_workers=True)


def _preload(trial: str, cwd: str) -> None:
    import sweep.run.worker  # noqa: F401  (JAX, Orbax, Optuna)
    from sweep.host import slots

    os.chdir(cwd)
    if slots.needs_probe():  # an accelerator host: a trial module that computes at import would
        return               # start JAX on every GPU before this worker's slot is set
    try:
        from sweep.trial.protocol import import_trial

        import_trial(trial)
    except Exception:
        pass  # the study file names no importable trial: validation in the parent says so


def _worker(source: Source, quiet: bool, verbose: bool, cpus: list[int] | None = None,
            slot: Slot | None = None) -> None:
    # Each worker is a full scheduler: claims in the database keep every trial to one worker.
    from sweep.host import slots
    from sweep.host.signals import StopSignal
    from sweep.run import logs
    from sweep.run import worker
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    slots.apply(slot)  # before anything starts JAX's backend here
    if cpus:
        _pin(cpus)
    if not _WATCHING:
        _WATCHING.append(os.getppid())
        threading.Thread(target=_watch_parent, name="sweep-parent-watch", daemon=True).start()
    logs.setup(quiet, verbose)
    if slot is not None:
        log.debug("worker process %d: devices %s", os.getpid(), ",".join(slot.names()))
    config = config_lib.from_source(source)
    stop = StopSignal(config.study.checkpoint.grace_seconds)
    stop.install()
    _BUSY.set()
    session = Session(config)
    try:
        worker.run(session, stop)
    except Interrupted as exc:
        if os.getppid() != _WATCHING[0]:  # orphaned: checkpointed; nobody to report to
            os._exit(exc.exit_code)
        raise
    finally:
        _BUSY.clear()
        session.close()


def _dask_worker(source: Source, quiet: bool, verbose: bool, stop_event: str) -> None:
    """A worker in a Dask worker's thread: no signals there (not the main thread), so the parent's
    SIGTERM/SIGINT reaches it through a distributed.Event; paths resolve as in the parent."""
    import distributed

    from sweep.host import slots
    from sweep.host.signals import StopSignal
    from sweep.run import logs
    from sweep.run import worker
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    logs.setup(quiet, verbose)
    # chdir'ed: relative workdir/storage/trial module paths mean what they meant to the parent
    config = config_lib.from_source(source)
    slots.keep_first_visible(config.study.train.devices)  # before JAX starts in this Dask worker
    stop = StopSignal(config.study.checkpoint.grace_seconds)
    event = distributed.Event(stop_event)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                if event.wait(timeout=1.0):
                    stop.signum = signal.SIGTERM  # checked after every training window
                    return
            except Exception:  # the scheduler went away: keep the trial going, it is claims-safe
                time.sleep(1.0)

    threading.Thread(target=watch, name="sweep-dask-stop", daemon=True).start()
    session = Session(config)
    try:
        worker.run(session, stop)
    except Interrupted:
        pass  # checkpointed; the parent, which forwarded the signal, exits with its code
    finally:
        done.set()
        session.close()


def dask_client(config: Config) -> Any:
    """A distributed.Client of the cluster at parallel.address; connected before anything is written."""
    import distributed

    address = config.study.parallel.address
    try:
        return distributed.Client(address, timeout="10s")
    except OSError as exc:
        raise SweepError(f"{config.path}: parallel.address: cannot reach the Dask scheduler at {address} "
                         f"({type(exc).__name__}: {exc})") from None


def _run_dask(config: Config, n_jobs: int, stop: StopSignal, quiet: bool, verbose: bool, client: Any) -> None:
    """n_jobs workers on the Dask cluster of `client`, through joblib's dask backend."""
    import uuid

    import distributed
    import joblib

    name = f"sweep-stop-{uuid.uuid4().hex}"
    finished = threading.Event()

    def forward_stop() -> None:  # the parent's signal handler only sets a flag; tell the cluster
        while not finished.wait(0.1):
            if stop.signum is not None:
                distributed.Event(name, client=client).set()
                return

    threading.Thread(target=forward_stop, name="sweep-dask-forward", daemon=True).start()
    resources = config.study.parallel.resources
    log.info("running %s on the Dask cluster at %s%s", count(n_jobs, "worker"), config.study.parallel.address,
             f", each with resources {dict(resources)}" if resources else "")
    try:
        # parallel.resources: each worker's task waits for a Dask worker with that much of each resource
        # free (resources={"device": 1}: one sweep worker per GPU worker of dask-cuda).
        with joblib.parallel_config(backend="dask", **({"resources": dict(resources)} if resources else {})):
            joblib.Parallel(n_jobs=n_jobs)(
                joblib.delayed(_dask_worker)(config.source, quiet, verbose, name) for _ in range(n_jobs))
    finally:
        finished.set()
    stop.check()  # a worker stopped by our signal returned early: report the signal


def run_workers(session: Session, n_jobs: int, stop: StopSignal, quiet: bool = False,
                verbose: bool = False, client: Any = None, slots: list[Slot] | None = None) -> None:
    """Run until the study is done; the session is open afterwards.

    `client`: a `dask_client(config)`, where parallel.backend is dask.
    `slots`: each worker's devices (sweep/host/slots.py), worker 0 (this process, already assigned) first.
    """
    from sweep.run import worker

    config = session.config
    if config.study.parallel.backend == "dask":
        _run_dask(config, n_jobs, stop, quiet, verbose, client or dask_client(config))
        session.open(create=True)
        return
    if n_jobs == 1:
        worker.run(session, stop)
        return
    # This process is worker 0 (its imports are done, a fresh process would spend seconds on them);
    # joblib's loky backend runs workers 1..n_jobs-1. Each runs on its share of the cores.
    shares = core_shares(n_jobs)
    helpers = _LokyWorkers(config, list(zip(shares[1:], (slots or [None] * n_jobs)[1:])), quiet, verbose)
    cpus = os.sched_getaffinity(0)
    _pin(shares[0])
    try:
        worker.run(session, stop)
    except BaseException:
        helpers.stop()  # a signal or an error here: the helpers checkpoint and stop too
        helpers.join()
        raise
    finally:
        _pin(cpus)  # a Python caller (a notebook) gets its cores back
    helpers.join()


MAX_WORKER_RESTARTS = 10  # a worker that keeps dying (a trial that always exhausts memory) is an error


class _LokyWorkers:
    """len(shares) worker processes through joblib's loky executor, waited for by a background thread.

    `shares`: each worker's (cores, device slot); a worker started in place of a dead one gets its
    share: its slot is reused (loky starts fresh processes after a death, so no JAX has started in
    them with another slot's devices)."""

    def __init__(self, config: Config, shares: list[tuple[list[int], Slot | None]], quiet: bool,
                 verbose: bool) -> None:
        self._error: BaseException | None = None
        self._executor: Any = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, args=(config, shares, quiet, verbose),
                                        name="sweep-loky", daemon=True)
        self._thread.start()

    def _run(self, config: Config, shares: list[tuple[list[int], Slot | None]], quiet: bool, verbose: bool) -> None:
        # joblib's loky executor itself: joblib.Parallel would run a single job in this thread.
        from joblib.externals.loky import get_reusable_executor
        from joblib.externals.loky.process_executor import BrokenProcessPool

        todo, restarts = list(shares), 0
        _PRESTARTED.clear()  # taken over here: get_reusable_executor returns the same helpers
        try:
            while todo:
                executor = self._executor = get_reusable_executor(max_workers=len(shares))
                jobs = [(share, executor.submit(_worker, config.source, quiet, verbose, *share)) for share in todo]
                todo = []
                for share, job in jobs:
                    try:
                        job.result()
                    except BrokenProcessPool as exc:  # a worker was killed (kill -9, out of memory)
                        if self._stopping or restarts >= MAX_WORKER_RESTARTS:
                            raise
                        log.warning("a worker process died (%s); starting a new one (its trial resumes "
                                    "from its newest checkpoint)", type(exc).__name__)
                        todo.append(share)
                restarts += bool(todo)
        except BaseException as exc:  # re-raised by join() in the main thread
            self._error = exc

    def stop(self) -> None:
        """SIGTERM the worker processes: each checkpoints its trial and exits."""
        import multiprocessing

        self._stopping = True
        for child in multiprocessing.active_children():  # loky's workers are our children
            if type(child).__name__ == "LokyProcess" and child.pid is not None:
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def join(self) -> None:
        """Wait for the workers' jobs; then end the (now idle) processes instead of leaving it to
        loky's exit handler, which takes ~2 s to wind down an idle worker that holds JAX."""
        self._thread.join()
        if self._executor is not None:
            self._executor.shutdown(wait=True, kill_workers=True)
        if self._error is not None and not isinstance(self._error, Interrupted):
            raise self._error
