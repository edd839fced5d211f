"""sweep/host/slots.py in-process: the slot plan, the host's device count, GPU visible devices and memory variables."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from sweep.errors import ConfigError
from sweep.host import slots

CPU4 = slots.Host("cpu", "cpu", 4, "XLA_FLAGS")
GPU8 = slots.Host("gpu", "cuda", 8, "probe")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", slots.PREALLOCATE, slots.FRACTION,
                 slots.NEW_FRACTION, "JAX_PLATFORMS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("flags, count", [("", 1), ("--xla_force_host_platform_device_count=4", 4),
                                          ("--xla_force_host_platform_device_count=2 --xla_cpu_foo=1 "
                                           "--xla_force_host_platform_device_count=8", 8)])
def test_forced_cpu_devices_reads_the_last_flag(flags, count):
    assert slots.forced_cpu_devices(flags) == count


def test_host_devices_on_a_cpu_only_install_reads_xla_flags_without_starting_jax(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    monkeypatch.setattr(slots, "_backend_started", lambda: False)
    assert not slots.needs_probe()  # no accelerator plugin in this environment
    assert slots.host_devices() == slots.Host("cpu", "cpu", 3, "XLA_FLAGS")


def test_plan_deals_groups_of_k_devices_and_spreads_workers_before_packing():
    two = slots.plan("s.yaml", 2, 2, 1, CPU4)
    assert [s.names() for s in two] == [["cpu:0", "cpu:1"], ["cpu:2", "cpu:3"]]
    assert all(s.env == () for s in two)  # CPU devices are assigned by index
    packed = slots.plan("s.yaml", 3, 1, 2, slots.Host("cpu", "cpu", 2, "XLA_FLAGS"))
    assert [s.names() for s in packed] == [["cpu:0"], ["cpu:1"], ["cpu:0"]]


def test_plan_on_one_device_is_none_today_s_sharing():
    assert slots.plan("s.yaml", 8, 1, 1, slots.Host("cpu", "cpu", 1, "XLA_FLAGS")) is None


@pytest.mark.parametrize("n, k, m, message", [
    (3, 2, 1, "parallel.n_jobs: 3 workers x train.devices 2 need 6 cpu devices, the host has 4: at most 2 workers "
              "(n_jobs: auto), or let workers share devices (parallel.trials_per_device), got 3"),
    (5, 1, 1, "parallel.n_jobs: 5 workers x train.devices 1 need 5 cpu devices, the host has 4: at most 4 workers"),
    (9, 2, 4, "parallel.n_jobs: 9 workers x train.devices 2 / trials_per_device 4 need 5 cpu devices, the host has "
              "4: at most 8 workers (n_jobs: auto), got 9"),
    (1, 5, 1, "train.devices: must be at most the 4 cpu devices JAX sees"),
])
def test_plan_more_workers_than_devices_is_a_study_file_error(n, k, m, message):
    with pytest.raises(ConfigError) as err:
        slots.plan("s.yaml", n, k, m, CPU4)
    assert message in str(err.value) and str(err.value).startswith("s.yaml: ")


def test_resolve_n_jobs_auto_is_slots_times_trials_per_device():
    assert slots.resolve_n_jobs("auto", 1, 1, GPU8) == 8
    assert slots.resolve_n_jobs("auto", 3, 2, GPU8) == 4
    assert slots.resolve_n_jobs("auto", 1, 4, slots.Host("cpu", "cpu", 1, "XLA_FLAGS")) == 1
    assert slots.resolve_n_jobs(5, 1, 1, GPU8) == 5


def test_gpu_slots_set_cuda_visible_devices_through_the_user_s_own_list(monkeypatch):
    plain = slots.plan("s.yaml", 4, 2, 1, GPU8)
    assert [dict(s.env) for s in plain] == [{"CUDA_VISIBLE_DEVICES": v} for v in ("0,1", "2,3", "4,5", "6,7")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the user gave run 4 of the host's GPUs
    mine = slots.plan("s.yaml", 2, 2, 1, slots.Host("gpu", "cuda", 4, "probe"))
    assert [dict(s.env)["CUDA_VISIBLE_DEVICES"] for s in mine] == ["4,5", "6,7"]
    assert [s.names() for s in mine] == [["gpu:4", "gpu:5"], ["gpu:6", "gpu:7"]]  # host-wide indices
    rocm = slots.plan("s.yaml", 1, 1, 1, slots.Host("gpu", "rocm", 2, "probe"))
    assert dict(rocm[0].env) == {"HIP_VISIBLE_DEVICES": "0"}


def test_packed_gpu_workers_get_a_memory_fraction_and_a_user_s_variables_win(monkeypatch, caplog):
    assert slots.memory_settings(1) == {}  # one worker per device: JAX's defaults
    assert slots.memory_settings(4) == {slots.PREALLOCATE: "true", slots.FRACTION: "0.225"}
    packed = slots.plan("s.yaml", 4, 1, 2, slots.Host("gpu", "cuda", 2, "probe"))
    assert dict(packed[3].env) == {slots.PREALLOCATE: "true", slots.FRACTION: "0.450", "CUDA_VISIBLE_DEVICES": "1"}
    monkeypatch.setenv(slots.NEW_FRACTION, "0.3")
    with caplog.at_level(logging.WARNING, logger="sweep"):
        assert slots.memory_settings(2) == {slots.PREALLOCATE: "true"}  # never both fraction names
    assert caplog.messages == ["GPU memory: your XLA_CLIENT_MEM_FRACTION=0.3 kept (sweep would set "
                               "XLA_PYTHON_CLIENT_MEM_FRACTION=0.450 for trials_per_device 2)"]
    monkeypatch.setenv(slots.PREALLOCATE, "false")
    assert slots.memory_settings(2) == {}


def test_config_takes_n_jobs_auto_and_trials_per_device(write_study):
    from sweep.study import config as config_lib

    config = config_lib.load(write_study(parallel={"n_jobs": "auto", "trials_per_device": 2}))
    assert (config.study.parallel.n_jobs, config.study.parallel.trials_per_device) == ("auto", 2)
    for bad in ({"n_jobs": "all"}, {"trials_per_device": 0}):
        with pytest.raises(ConfigError, match="parallel"):
            config_lib.load(write_study(parallel=bad))


def test_live_view_and_status_table_show_devices_where_trials_differ():
    import io

    from rich.console import Console

    from sweep.commands import progress, status

    lines = [progress.TrialLine(n, 100, 400, 0.5, 0.4, 10.0, 5.0, devices=(f"cpu:{n}",)) for n in (0, 1)]
    console = Console(file=io.StringIO(), width=200)
    console.print(progress.table(progress.StudyLine(0, 4, None, None), lines, "val_loss"))
    text = console.file.getvalue()
    assert "devices" in text and "cpu:1" in text
    one = [dataclasses.replace(line, devices=("cpu:0",)) for line in lines]
    console = Console(file=io.StringIO(), width=200)
    console.print(progress.table(progress.StudyLine(0, 4, None, None), one, "val_loss"))
    assert "devices" not in console.file.getvalue()  # one device for all: nothing to tell apart
    entry = {"number": 0, "state": "RUNNING", "params": {}, "best_value": None, "best_step": None, "last_step": None,
             "resumes": 0, "checkpoint_dir": None, "devices": ["gpu:4", "gpu:5"]}
    report = {"study": "s", "n_trials": 1, "storage": "x", "metric": "val_loss", "direction": "minimize",
              "trials": [entry]}
    rows = status.table(report).splitlines()
    assert rows[1].split()[-1] == "devices" and rows[2].split()[-1] == "gpu:4,gpu:5"


def test_parallel_resources_are_dask_worker_resources_only_with_backend_dask(write_study):
    from sweep.study import config as config_lib

    config = config_lib.load(write_study(parallel={"backend": "dask", "address": "tcp://h:8786",
                                                   "resources": {"device": 1}}))
    assert config.study.parallel.resources == {"device": 1.0}
    with pytest.raises(ConfigError, match=r"parallel.resources: are Dask worker resources, only used with backend "
                                          r"dask, got \{'device': 1.0\}"):
        config_lib.load(write_study(parallel={"resources": {"device": 1}}))


def test_a_dask_cuda_worker_keeps_only_its_own_gpus_of_its_rotated_list(monkeypatch):
    monkeypatch.setattr(slots, "_backend_started", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0,1,2")  # dask-cuda's list for the worker of GPU 3
    slots.keep_first_visible(1)
    assert slots.os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert slots.Host("gpu", "cuda", 1, "jax").host_index(0) == 3  # recorded as "gpu:3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    slots.keep_first_visible(2)
    assert slots.os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
