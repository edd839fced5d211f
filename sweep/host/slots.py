"""Device slots: which of the host's devices each worker process trains on, chosen before JAX starts in it.

On a host whose default platform has D devices (GPUs, or CPU devices forced with
XLA_FLAGS=--xla_force_host_platform_device_count=D), `parallel.n_jobs: N` workers with
`train.devices: K` each get K devices of their own; `parallel.trials_per_device: M` lets M workers
share each group of K devices. Worker w gets group w % (D // K), so workers spread over the groups
before any two share one. A worker keeps its slot for its life (its trials, one after another) and
a worker started in place of a dead one gets the dead one's slot.

GPUs are assigned through the runtime's visible-devices variable (CUDA_VISIBLE_DEVICES,
HIP_VISIBLE_DEVICES), set in the worker before JAX starts its backend, so the worker's JAX sees,
and preallocates memory on, its own devices only. CPU devices (and a process whose JAX had already
started, e.g. a notebook) are assigned by index into `jax.devices()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import pkgutil
import re
import subprocess
import sys
from typing import Any, Iterator

from sweep.errors import ConfigError, SweepError
from sweep.words import count

log = logging.getLogger("sweep")

# The variable that restricts the devices a process's GPU runtime (and so JAX) sees, by GPU kind.
VISIBLE_VARIABLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
# JAX's GPU memory settings (jaxlib/xla_client.py reads them when its GPU backend starts).
PREALLOCATE, FRACTION, NEW_FRACTION = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                       "XLA_CLIENT_MEM_FRACTION")
# The share of a GPU's memory that M packed workers divide: the rest is left for each process's
# CUDA context and the runtime's own buffers, which the fraction does not cover.
PACKED_MEMORY = 0.9
_FORCED = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
_PROBE = ("import json, jax; d = jax.devices(); v = d[0].client.platform_version.lower(); "
          "print(json.dumps({'platform': d[0].platform, 'count': len(d), "
          "'kind': 'rocm' if 'rocm' in v else 'cuda' if 'cuda' in v else d[0].platform}))")


@dataclasses.dataclass(frozen=True)
class Host:
    """The devices of the default platform JAX would use in this process."""

    platform: str  # jax's Device.platform: "cpu", "gpu", "tpu"
    kind: str  # "cuda" or "rocm" for GPUs, else the platform
    count: int
    how: str  # how it was found: "jax" (already started here), "XLA_FLAGS", "probe"

    def host_index(self, i: int) -> int:
        """The host-wide index of the i-th device JAX sees: through a user's numeric visible-devices
        list (CUDA_VISIBLE_DEVICES=4,5 makes JAX's device 0 the host's GPU 4)."""
        entries = self.visible_entries()
        return int(entries[i]) if entries and i < len(entries) and entries[i].isdigit() else i

    def visible_entries(self) -> list[str] | None:
        variable = VISIBLE_VARIABLE.get(self.kind)
        value = os.environ.get(variable, "") if variable else ""
        return [e.strip() for e in value.split(",") if e.strip()] or None


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker's devices: positions among the devices the `run` process's JAX sees."""

    platform: str
    indices: tuple[int, ...]
    host: tuple[int, ...]  # the same devices by host-wide index (what status shows)
    env: tuple[tuple[str, str], ...] = ()  # set before JAX starts: visible devices, GPU memory

    def names(self) -> list[str]:
        return [f"{self.platform}:{h}" for h in self.host]


def forced_cpu_devices(flags: str) -> int:
    """The CPU device count XLA_FLAGS asks for (the last occurrence wins, as for any XLA flag)."""
    found = _FORCED.findall(flags)
    return int(found[-1]) if found else 1


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from sweep.internals import jax_backends_started

    return jax_backends_started()


def _accelerator_plugins() -> list[str]:
    """JAX's accelerator plugins installed here (its `jax_plugins` namespace and entry points, libtpu)."""
    found = [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        found += [m.name for m in pkgutil.iter_modules(list(spec.submodule_search_locations))]
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    return found


def host_devices() -> Host:
    """The default platform's devices, without starting JAX's backend in this process.

    A backend started there must not be: on GPUs it would fix the devices this process sees, and
    preallocate memory on all of them, before its slot is known. So: JAX already started here ->
    ask it; a CPU-only install (no accelerator plugin, or JAX_PLATFORMS=cpu) -> XLA_FLAGS says the
    count, as JAX itself reads it; else a short subprocess asks JAX (without preallocating).
    """
    if _backend_started():
        import jax

        devices = jax.devices()
        return Host(devices[0].platform, _kind(devices[0]), len(devices), "jax")
    if not needs_probe():
        return Host("cpu", "cpu", forced_cpu_devices(os.environ.get("XLA_FLAGS", "")), "XLA_FLAGS")
    env = {**os.environ, PREALLOCATE: "false"}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        raise SweepError(f"cannot tell this host's devices (a `python -c 'import jax; jax.devices()'` "
                         f"failed: {type(exc).__name__}: {exc})") from None
    return Host(found["platform"], found["kind"], int(found["count"]), "probe")


def resolve_n_jobs(n_jobs: int | str, devices: int, per_device: int, host: Host) -> int:
    """`auto`: as many workers as the host has slots (one where the host has one device)."""
    if n_jobs != "auto":
        return int(n_jobs)
    if host.count <= 1:
        return 1
    return max(1, host.count // devices) * per_device


def plan(path: str, n_jobs: int, devices: int, per_device: int, host: Host) -> list[Slot] | None:
    """Each worker's slot, worker 0 first; None where the host has one device (today's sharing).

    Raises:
        ConfigError: the workers need more devices than the host has (nothing was created).
    """
    if host.count <= 1:
        return None
    if devices > host.count:
        hint = (f" (on the CPU: XLA_FLAGS=--xla_force_host_platform_device_count={devices})"
                if host.platform == "cpu" else "")
        raise ConfigError(path, "train.devices",
                          f"must be at most the {count(host.count, host.platform + ' device')} JAX sees{hint}", devices)
    groups = host.count // devices
    if n_jobs > groups * per_device:
        share = f" / trials_per_device {per_device}" if per_device > 1 else ""
        need = -(-n_jobs * devices // per_device)  # ceil
        raise ConfigError(path, "parallel.n_jobs",
                          f"{n_jobs} workers x train.devices {devices}{share} need {count(need, host.platform + ' device')}, "
                          f"the host has {host.count}: at most {count(groups * per_device, 'worker')} (n_jobs: auto)"
                          + ("" if per_device > 1 else ", or let workers share devices (parallel.trials_per_device)"),
                          n_jobs)
    memory = memory_settings(per_device) if host.platform == "gpu" else {}
    variable, entries = VISIBLE_VARIABLE.get(host.kind), host.visible_entries()
    slots = []
    for w in range(n_jobs):
        g = w % groups
        indices = tuple(range(g * devices, (g + 1) * devices))
        env = dict(memory)
        if variable is not None:
            env[variable] = ",".join(entries[i] if entries else str(i) for i in indices)
        slots.append(Slot(host.platform, indices, tuple(host.host_index(i) for i in indices), tuple(env.items())))
    return slots


def memory_settings(per_device: int) -> dict[str, str]:
    """GPU memory variables for `per_device` workers per device; a user's own variables win (and are
    said once). One worker per device keeps JAX's defaults."""
    if per_device <= 1:
        return {}
    ours = {PREALLOCATE: "true", FRACTION: f"{PACKED_MEMORY / per_device:.3f}"}
    user = {k: os.environ[k] for k in (PREALLOCATE, FRACTION, NEW_FRACTION) if k in os.environ}
    if NEW_FRACTION in user:  # JAX refuses both names at once
        user.setdefault(FRACTION, user[NEW_FRACTION])
    if user:
        log.warning("GPU memory: your %s kept (sweep would set %s for trials_per_device %d)",
                    ", ".join(f"{k}={v}" for k, v in sorted(user.items()) if k in os.environ),
                    ", ".join(f"{k}={v}" for k, v in sorted(ours.items()) if k in user), per_device)
    return {k: v for k, v in ours.items() if k not in user}


_ASSIGNED: list[Slot] = []  # the slot this process trains on (one; empty: none, all devices)
_LOCAL: list[int] = []  # its devices' positions in this process's jax.devices()


def apply(slot: Slot | None) -> None:
    """Make `slot` this process's devices. Before JAX starts: through the visible-devices variable
    (GPUs) or by index (CPUs); after: by index, which needs this process to see the slot's devices."""
    if slot is None or (_ASSIGNED and _ASSIGNED[0] == slot):
        return
    env = dict(slot.env)
    started = _backend_started()
    if not started:
        os.environ.update(env)
    _ASSIGNED[:] = [slot]
    if not started and any(k in env for k in VISIBLE_VARIABLE.values()):
        _LOCAL[:] = range(len(slot.indices))  # JAX will see exactly the slot's devices
        return
    import jax

    have = jax.devices()
    if max(slot.indices) >= len(have):
        raise SweepError(f"this worker process's JAX sees {count(len(have), 'device')}, not the devices "
                         f"{', '.join(slot.names())} of its slot (its backend started with other visible devices)")
    if started and slot.platform != "cpu":
        log.warning("JAX started in this process before its devices were chosen: it trains on %s by index, but "
                    "holds memory on every device it sees (does the trial module compute at import?)",
                    ",".join(slot.names()))
    _LOCAL[:] = slot.indices
    jax.config.update("jax_default_device", have[slot.indices[0]])  # inits and uncommitted arrays too


def assigned_here() -> bool:
    """Whether this process trains on a slot (a host of several devices)."""
    return bool(_ASSIGNED)


def local_devices(n: int) -> list[Any]:
    """The first `n` devices of this process's slot (of all it sees without one), as JAX devices."""
    import jax

    have = jax.devices()
    return [have[i] for i in _LOCAL[:n]] if _ASSIGNED else have[:n]


def names(devices: Any) -> list[str]:
    """What `devices` records: JAX devices of this process named by host-wide index, sorted."""
    import jax

    have = jax.devices()
    positions = sorted(have.index(d) for d in devices)
    if _ASSIGNED:  # position in this process -> the slot's host index
        slot = _ASSIGNED[0]
        by_position = dict(zip(_LOCAL, slot.host))
        return [f"{slot.platform}:{by_position.get(p, p)}" for p in positions]
    host = Host(have[0].platform, _kind(have[0]), len(have), "jax")
    return [f"{host.platform}:{host.host_index(p)}" for p in positions]


def _kind(device: Any) -> str:
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version else "cuda" if "cuda" in version else device.platform


@contextlib.contextmanager
def assigned(slot: Slot | None) -> Iterator[None]:
    """`apply(slot)` in this process for a block (the `run` process is worker 0); afterwards its
    environment and default device are as before (a notebook gets them back)."""
    saved = {k: os.environ.get(k) for k, _ in (slot.env if slot else ())}
    apply(slot)
    try:
        yield
    finally:
        if slot is not None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if "jax" in sys.modules and _LOCAL != list(range(len(_LOCAL))):
                sys.modules["jax"].config.update("jax_default_device", None)
            _ASSIGNED.clear()
            _LOCAL.clear()


def for_run(config: Any, n_jobs: int | str) -> tuple[int, list[Slot] | None]:
    """(workers, each worker's slot or None) for `run` with `n_jobs` (a number or "auto").

    Raises:
        ConfigError: auto with a Dask cluster, or more workers than the host's devices allow.
    """
    parallel, path = config.study.parallel, str(config.path)
    if parallel.backend == "dask":  # the cluster's workers hold the devices (Dask resources)
        if n_jobs == "auto":
            raise ConfigError(path, "parallel.n_jobs", "auto counts this host's devices; with backend dask give "
                              "the number of workers (one per Dask worker with resources device=1)", n_jobs)
        return int(n_jobs), None
    host = host_devices()
    n = resolve_n_jobs(n_jobs, config.study.train.devices, parallel.trials_per_device, host)
    worker_slots = plan(path, n, config.study.train.devices, parallel.trials_per_device, host)
    if worker_slots is not None:
        log.info("%s on %s (%s): %s", count(n, "worker"), count(host.count, host.platform + " device"), host.how,
                 " | ".join(",".join(s.names()) for s in worker_slots))
    return n, worker_slots


def needs_probe() -> bool:
    """Whether `host_devices()` would start a subprocess (an accelerator plugin is installed)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    return not _backend_started() and platforms != "cpu" and (bool(platforms) or bool(_accelerator_plugins()))


def keep_first_visible(k: int) -> None:
    """In a Dask worker: keep only the first `k` GPUs of its visible-devices list. dask-cuda gives
    each worker a rotated list with its own GPU first ("3,0,1,2"), and JAX would start on all of
    them, preallocating memory on every GPU in every worker."""
    if _backend_started():
        return
    for variable in VISIBLE_VARIABLE.values():
        entries = [e.strip() for e in os.environ.get(variable, "").split(",") if e.strip()]
        if len(entries) > k:
            os.environ[variable] = ",".join(entries[:k])
