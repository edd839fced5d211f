"""A fork server for the test suite's `python -m sweep ...` processes.

Each CLI process of a test used to spend ~2 s of CPU importing JAX, Flax, Orbax, Optuna,
SQLAlchemy... before it did anything, on a 2-core machine where the suite is CPU-bound (the
measurement: benchmarks/RESULTS.md, "Where the test suite's time goes"). The server imports those
third-party libraries once per pytest process, then forks a child for each CLI process a test
starts; the child runs `python -m sweep ARGS` exactly as the interpreter's `-m` does
(runpy._run_module_as_main), in the test's folder, with the test's environment and pipes.

What the child still is: a process of its own (its own pid, real kill -9 and SIGTERM, real
children, its exit status seen by the test), that imports sweep itself and the trial module fresh,
under the test's environment (sweep reads SWEEP_HOST and others at import). What it shares with the
server: the third-party modules already imported, with the state they hold after an import, which
is the state a fresh process has after the same import. Where that could differ, the test's process
is started as before (`python -m sweep` through exec): an environment that changes what a library
reads at import (JAX_*, XLA_*, PYTHON*, ...: `_EXEC_ONLY`), SWEEP_TEST_FORKSERVER=0, or a server
that holds more than one thread after its imports (a fork would copy a thread's locks mid-use).

Why by hand: multiprocessing's forkserver start method runs Python functions in forked children,
but gives no way to hand a child the caller's stdin/stdout/stderr, environment and folder, or to
report its exit status to a process that is not its parent.

Protocol (an AF_UNIX SOCK_SEQPACKET connection per process): the client sends one JSON message
{argv, cwd, env} with three file descriptors (stdin, stdout, stderr); the server answers {pid},
then {returncode} once the child has exited. The child is reaped (its pid freed) only when the
client closes the connection, as a Popen child stays a zombie until its parent waits.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
from typing import Any

# Environment variables a library may read when it is imported (not only when it is used): a
# process whose environment differs from the server's in one of these is exec'd, not forked.
_EXEC_ONLY = re.compile(r"^(JAX_|XLA_|TF_|TPU_|CUDA_|NVIDIA_|PYTHON|LD_|OMP_|MKL_|OPENBLAS_|NUMEXPR_|"
                        r"TENSORSTORE_|GRPC_|MALLOC_|TCMALLOC_|PJRT_|ENABLE_PJRT|SQLALCHEMY_|OPTUNA_)")

# What the server imports: the modules a real `python -m sweep run` of a small digits study has
# imported when it ends (found by a helper process, in the order they were imported), less sweep's
# own modules and the trial modules, which each child imports under its own environment. Modules
# only some commands or settings import (plot's matplotlib, tracking's mlflow) are imported by the
# children that need them, as before.
_FIND_IMPORTS = """
import json, os, sys, tempfile
from pathlib import Path
import yaml
from sweep.__main__ import main
folder = Path(tempfile.mkdtemp(prefix="sweep-zygote-find-"))
study = {"name": "find", "trial": "trials.digits_mlp", "n_trials": 1, "workdir": str(folder / "runs"),
         "objective": {"metric": "val_loss", "direction": "minimize"}, "sampler": {"type": "random", "seed": 0},
         "search_space": {"learning_rate": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
         "train": {"steps": 20, "eval_every": 10, "seed": 0}}
(folder / "study.yaml").write_text(yaml.safe_dump(study))
assert main(["run", str(folder / "study.yaml"), "--quiet"]) == 0
main(["status", str(folder / "study.yaml")])
print(json.dumps(list(sys.modules)))
"""
_OWN = re.compile(r"^(sweep|trials|tests|__main__|sitecustomize|usercustomize|_virtualenv|__editable__)(\.|$)")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _openblas_threads() -> int:
    """The worker threads of the OpenBLAS that numpy loads, which are safe across a fork: OpenBLAS
    stops them before one (pthread_atfork) and starts them again at its next call."""
    from threadpoolctl import threadpool_info

    return sum(pool["num_threads"] - 1 for pool in threadpool_info() if pool["internal_api"] == "openblas")


def _preload() -> None:
    import importlib

    found = subprocess.run([sys.executable, "-c", _FIND_IMPORTS], capture_output=True, text=True, check=True)
    for name in json.loads(found.stdout.splitlines()[-1]):
        if _OWN.match(name) or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # an alias in sys.modules (six.moves...), a C submodule: imported with its parent
            pass


def serve() -> None:
    """`python -c "from tests.zygote import serve; serve()" SOCKET`: import, print `ready` (or
    `refused: why`) on stdout, then serve until stdin closes (the pytest process ended)."""
    path = sys.argv[1]
    _preload()
    import jax._src.xla_bridge as xb

    if _threads() != 1 + _openblas_threads() or xb._backends:
        print(f"refused: {_threads()} threads and JAX backends {list(xb._backends)} after the imports", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
    print("ready", flush=True)

    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin, selectors.EVENT_READ, "parent")
    running: dict[int, socket.socket] = {}  # pid -> its client's connection, until the child exits
    exited: dict[socket.socket, int] = {}  # a connection whose child exited -> pid, until the client closes
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not sys.stdin.buffer.read1(1):
                    return
            elif key.data == "accept":
                conn, _addr = listener.accept()
                msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    listener.close()
                    for other in [conn, *running.values(), *exited]:
                        other.close()
                    _child(request, fds)  # never returns
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                running[pid] = conn
            elif key.data == "child":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                for pid in list(running):
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    if info is None:
                        continue
                    code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                    conn = running.pop(pid)
                    try:
                        conn.send(json.dumps({"returncode": code}).encode())
                    except OSError:  # the client is gone
                        pass
                    exited[conn] = pid
                    sel.register(conn, selectors.EVENT_READ, "closed")
            elif key.data == "closed":
                conn = key.fileobj
                try:
                    more = conn.recv(16)
                except OSError:
                    more = b""
                if not more:
                    sel.unregister(conn)
                    os.waitpid(exited.pop(conn), 0)
                    conn.close()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become `python -m sweep ARGV` in `cwd` with `env` and the three fds; exit as it would."""
    import importlib
    import runpy
    import traceback

    code: Any = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        base = sys.path[1:]
        server_extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        # `python -m` puts the current folder first, then PYTHONPATH, then the interpreter's own
        sys.path[:] = [os.getcwd(), *extra, *[p for p in base if p not in server_extra]]
        importlib.invalidate_caches()
        main = sys.modules["__main__"].__dict__
        for name in [n for n in main if not n.startswith("__")]:
            del main[name]
        sys.argv = ["-m", *request["argv"]]
        code = 0
        runpy._run_module_as_main("sweep", alter_argv=True)  # type: ignore[attr-defined]
    except SystemExit as exit_:
        code = exit_.code
    except KeyboardInterrupt:
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as the interpreter ends on one: killed by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(code & 0xFF)


def _finish() -> None:
    """What the interpreter does when its main module ends: join the non-daemon threads, then run
    the atexit functions."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        pass
    atexit._run_exitfuncs()


class Forked:
    """The Popen-like handle of a forked `python -m sweep ...` process: pid, poll, wait, signals,
    and its stdout and stderr as pipes (text)."""

    def __init__(self, server: str, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(server)
            socket.send_fds(self._sock, [json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode()],
                            [null, out_w, err_w])
            self.pid: int = json.loads(self._sock.recv(1 << 16))["pid"]
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        self.args = argv
        self.stdout = open(out_r, encoding="utf-8", errors="replace")
        self.stderr = open(err_r, encoding="utf-8", errors="replace")
        self.returncode: int | None = None

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._sock.settimeout(timeout)
            try:
                msg = self._sock.recv(1 << 16)
            except (BlockingIOError, socket.timeout):
                return None
            self.returncode = json.loads(msg)["returncode"]
            self._sock.close()  # the server reaps the child now
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        import threading

        parts: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=n, f=f: parts.__setitem__(n, f.read()), daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr))]
        for r in readers:
            r.start()
        self.wait(timeout)
        for r in readers:
            r.join(timeout)
        self.stdout.close()
        self.stderr.close()
        return parts.get("out", ""), parts.get("err", "")


def needs_exec(env: dict[str, str], server_env: dict[str, str]) -> str | None:
    """Why a process with environment `env` cannot be forked from a server started with
    `server_env` (a variable read at import differs), or None."""
    for key in set(env) ^ set(server_env) | {k for k in env if k in server_env and env[k] != server_env[k]}:
        if _EXEC_ONLY.match(key):
            return key
    return None
