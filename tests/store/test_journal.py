"""Studies on Optuna's journal storage (issue 41): a file on a shared filesystem, or Redis. Three
"hosts" (processes with distinct SWEEP_HOST, each started from a folder of its own) share the
journal and the workdir, as nodes of a cluster share a filesystem: one is killed mid-trial, one is
frozen past its lease; the study ends each trial once, bit-identical to one process."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
import yaml

from conftest import (gated_trial, BASE_STUDY, Running, checkpoint_dir, kill9, merge, run_cli, snapshot, study_of,
                      wait_for_checkpoint)

pytestmark = pytest.mark.slow  # every test here starts real processes

SETTINGS = dict(n_trials=4, sampler={"type": "random", "seed": 3}, pruner={"type": "none"},
                train={"steps": 1500, "eval_every": 100}, checkpoint={"every_steps": 200})


@pytest.fixture(params=["file", "redis"])
def journal(request, tmp_path):
    """The storage URL of a fresh journal: a file in the shared folder, or an empty Redis database."""
    shared = tmp_path / "shared"
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"journal://{shared / 'study.log'}"


def test_three_hosts_one_killed_one_frozen_past_its_lease_end_each_trial_once(tmp_path, journal, reference, held):
    grace = 3.0
    shared = tmp_path / "shared"
    data = merge(merge(BASE_STUDY, SETTINGS), {"storage": journal, "trial": "gated_digits",
                                               "workdir": str(shared / "runs"),
                                               "parallel": {"lease_grace_seconds": grace}})
    study = shared / "study.yaml"
    shared.mkdir()
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    hosts = [tmp_path / f"host{i}" for i in range(3)]
    for host in hosts:
        host.mkdir()
        # Held at the 5th evaluation (step 500), after the saves at 200 and 400 (tests/trials/gated.py):
        # hosts a and b cannot finish their trials before the test has killed and frozen them.
        gated_trial(host, 5, name="gated_digits")
    hold_a, hold_b = held(hosts[0] / "hold"), held(hosts[1] / "hold")  # host c is never held

    def run(i: int) -> Running:
        return Running("run", study, cwd=hosts[i], env={"SWEEP_HOST": f"host-{'abc'[i]}"})

    a, b = run(0), run(1)
    na = int(a.wait_for(r"trial (\d+): started").group(1))
    nb = int(b.wait_for(r"trial (\d+): started").group(1))
    assert na != nb
    wait_for_checkpoint(checkpoint_dir(study, na), 400, proc=a)
    wait_for_checkpoint(checkpoint_dir(study, nb), 400, proc=b)
    kill9(a)
    hold_a.unlink()
    os.kill(b.proc.pid, signal.SIGSTOP)  # frozen: a paused VM, a stalled NFS client
    try:
        c = run(2)
        c.wait_for(rf"trial {nb}: resumed from step \d+")  # after host-b's lease grace
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    hold_b.unlink()  # b's evaluation goes on: its next write finds the trial taken over
    assert c.finish() == 0, c.stderr
    assert b.finish() == 0, b.stderr
    assert re.search(rf"trial {nb} was taken over by host-c while this worker was unresponsive", b.stderr), b.stderr
    assert f"trial {nb}: complete" not in b.stderr and "Traceback" not in b.stderr
    # a's trial, by whichever live host found its lease gone first: from a's newest step, in the shared folder
    assert f"trial {na}: resumed from step 400" in b.stderr + c.stderr, b.stderr + c.stderr
    started = sorted(int(n) for p in (a, b, c) for n in re.findall(r"trial (\d+): started", p.stderr))
    assert started == list(range(4))  # each trial started once, by one host
    trials = study_of(study).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4 and not any("failures" in t.user_attrs for t in trials)
    assert snapshot(study) == reference(**SETTINGS)  # = one process on SQLite, bit for bit


def test_status_reads_a_journal_and_a_missing_one_is_not_found(tmp_path, journal, reference):
    study = tmp_path / "study.yaml"
    data = merge(merge(BASE_STUDY, SETTINGS), {"storage": journal, "workdir": str(tmp_path / "runs"), "n_trials": 2})
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    if journal.startswith("journal://"):
        missing = run_cli("status", study, cwd=tmp_path)
        assert missing.returncode == 1 and "no journal at" in missing.stderr, missing.stderr
        assert not (tmp_path / "shared").exists()  # a reader creates nothing
    done = run_cli("run", study, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_cli("status", study, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert [t["state"] for t in json.loads(shown.stdout)["trials"]] == ["COMPLETE", "COMPLETE"]
    assert snapshot(study) == reference(**{**SETTINGS, "n_trials": 2})


def test_an_unwritable_journal_path_is_one_line_and_nothing_is_created(tmp_path):
    blocker = tmp_path / "shared"
    blocker.write_text("a file where the journal's folder would be")  # unwritable even for root
    study = tmp_path / "study.yaml"
    data = merge(BASE_STUDY, {"storage": f"journal://{blocker / 'sweeps' / 'study.log'}",
                              "workdir": str(tmp_path / "runs")})
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_cli("run", study, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "cannot create the journal" in result.stderr and str(blocker / "sweeps" / "study.log") in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared", "study.yaml"]  # no workdir, no journal


class OwnRedis:
    """A redis-server of the test's own on a free port, its data appended to a file (fsynced on
    every write) so that it survives a restart, as a production server's does."""

    def __init__(self, folder) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.folder, self.url, self.proc = folder, f"redis://127.0.0.1:{self.port}/0", None

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(self.folder), "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:  # until it answers (the event), or a generous deadline
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def test_a_redis_restart_mid_trial_is_waited_for_and_the_study_stays_bit_identical(tmp_path, reference):
    server = OwnRedis(tmp_path)
    server.start()
    settings = dict(n_trials=2, train={"steps": 3000, "eval_every": 50}, checkpoint={"every_steps": 500},
                    sampler={"type": "random", "seed": 3}, pruner={"type": "none"})
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(merge(merge(BASE_STUDY, settings), {"storage": server.url,
                                                                        "workdir": str(tmp_path / "runs")})))
    try:
        proc = Running("run", study, cwd=tmp_path)
        proc.wait_for(r"trial 0: started")
        wait_for_checkpoint(checkpoint_dir(study, 0), 500, proc=proc)
        server.stop()
        proc.wait_for(r"the study's database is unreachable")  # it waits, the trial intact
        server.start()
        assert proc.finish() == 0, proc.stderr
        assert "the study's database is back after" in proc.stderr, proc.stderr
        trials = study_of(study).trials
        assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and not any("failures" in t.user_attrs
                                                                                    for t in trials)
        assert snapshot(study) == reference(**settings)
    finally:
        server.stop()


def test_a_redis_server_that_is_away_is_waited_for_then_exit_1(tmp_path):
    server = OwnRedis(tmp_path)  # never started: nothing listens on its port
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(merge(BASE_STUDY, {"storage": server.url, "storage_retry_seconds": 2,
                                                       "workdir": str(tmp_path / "runs")})))
    result = run_cli("run", study, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "the study's database is unreachable" in result.stderr and "waiting for it, up to 2 s" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "cannot open storage redis://127.0.0.1:" in last and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_full_disk_under_the_journal_is_waited_for_then_exit_1_and_the_journal_stays_whole(
        tmp_path, reference, small_disk):
    """The journal's filesystem fills mid-run: each append is whole or nothing (a write cut short is
    cut back), the run waits storage_retry_seconds, then exits 1 with no trial failed; once space is
    freed the same command ends the study, bit-identical (a half-written line would have made the
    journal unreadable for every process)."""
    shared = tmp_path / "shared"
    small_disk(shared, "32k")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(merge(BASE_STUDY, {"storage": f"journal://{shared / 'study.log'}",
                                                       "storage_retry_seconds": 2,
                                                       "workdir": str(tmp_path / "runs")})))
    full = run_cli("run", study, cwd=tmp_path)
    assert full.returncode == 1, full.stderr
    assert "the study's database is unreachable" in full.stderr and "No space left on device" in full.stderr
    assert "Traceback" not in full.stderr, full.stderr
    trials = study_of(study).trials  # the journal reads: no half line in it
    assert trials and not [t.number for t in trials if t.state.name == "FAIL" or "failures" in t.user_attrs]
    assert (shared / "study.log").read_bytes().endswith(b"\n")
    small_disk(shared, "16m")  # space freed
    again = run_cli("run", study, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert snapshot(study) == reference()


def test_a_torn_last_line_a_killed_writer_left_is_cut_away_before_the_next_append(tmp_path):
    """A writer killed mid-line (a line of several KiB, a crashed client) leaves half a line; Optuna's
    own append runs on into it and every reader fails from then on; sweep's cuts it away first."""
    from optuna.storages.journal import JournalFileBackend

    from sweep.store.journal_file import file_backend as _file_backend

    for name, backend in (("optuna", JournalFileBackend), ("sweep", _file_backend)):
        path = tmp_path / f"{name}.log"
        backend(str(path) if name == "optuna" else path).append_logs([{"op": 1}])
        with open(path, "ab") as f:
            f.write(b'{"op":2,"half')  # the writer killed here
        assert list(JournalFileBackend(str(path)).read_logs(0)) == [{"op": 1}]  # a reader stops before it
        for op in (3, 4):  # two more writers' entries
            backend(str(path) if name == "optuna" else path).append_logs([{"op": op}])
        if name == "optuna":  # entry 3 ran on into the half line: lost, and the log unreadable past it
            with pytest.raises(ValueError):
                list(JournalFileBackend(str(path)).read_logs(0))
        else:
            assert list(JournalFileBackend(str(path)).read_logs(0)) == [{"op": 1}, {"op": 3}, {"op": 4}]


def test_a_second_session_in_one_process_goes_on_from_the_first_replay_of_the_same_file(tmp_path):
    """`run` reads its plan then runs, `status` reads the study then the file's changes: one replay
    of a big journal, not two; a journal file replaced meanwhile (another inode) is replayed anew."""
    from sweep.store.journal import Journal
    from sweep.study import config as config_lib

    study = tmp_path / "study.yaml"
    journal = tmp_path / "shared" / "study.log"
    study.write_text(yaml.safe_dump(merge(BASE_STUDY, {"storage": f"journal://{journal}",
                                                       "workdir": str(tmp_path / "runs")})))
    config = config_lib.load(study, import_trial=False)
    first = Journal().open(config, create=True)
    first.create_new_study([], "t")
    assert Journal().open(config, create=False) is first
    journal.unlink()
    journal.write_bytes(b"")  # another file under the same name: nothing of the first one's replay holds
    again = Journal().open(config, create=True)
    assert again is not first and again.get_all_studies() == []


ENQUEUED = dict(SETTINGS, n_trials=4, enqueue=[{"learning_rate": 0.01, "hidden": 32},
                                               {"learning_rate": 0.05, "hidden": 16},
                                               {"learning_rate": 0.002, "hidden": 64}])


def test_two_hosts_on_a_journal_run_each_enqueued_entry_once_and_refuse_a_trial_defining_edit(tmp_path, reference):
    study = tmp_path / "study.yaml"
    data = merge(merge(BASE_STUDY, ENQUEUED), {"storage": f"journal://{tmp_path / 'shared' / 'study.log'}",
                                               "workdir": str(tmp_path / "runs")})
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    hosts = [Running("run", study, cwd=tmp_path, env={"SWEEP_HOST": f"host-{i}"}) for i in range(2)]
    assert [h.finish() for h in hosts] == [0, 0], [h.stderr[-2000:] for h in hosts]
    started = sorted(int(n) for h in hosts for n in re.findall(r"trial (\d+): started", h.stderr))
    assert started == [0, 1, 2, 3]
    trials = study_of(study).trials
    assert [t.user_attrs.get("enqueue_index") for t in trials] == [0, 1, 2, None]  # each entry once, in order
    assert snapshot(study) == reference(**ENQUEUED)  # = one process on SQLite
    edited = yaml.safe_load(study.read_text())
    edited["train"]["steps"] = 3000
    study.write_text(yaml.safe_dump(edited, sort_keys=False))
    refused = run_cli("run", study, cwd=tmp_path)
    assert refused.returncode == 2 and "train.steps: 1500 -> 3000" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_lock_of_a_writer_killed_inside_its_append_is_broken_at_once_on_its_host(tmp_path):
    """A worker killed while it holds the journal's lock (kill -9 inside an append): the next
    writer on its host sees the holder named by the lock is gone and takes it, where Optuna's lock
    stalled everyone for its 30 s grace; a live holder's lock is waited for."""
    import subprocess
    import sys
    import threading

    from optuna.storages.journal import JournalFileBackend

    from sweep.store.claims import HOST
    from sweep.store.journal_file import LOCK_GRACE_S, file_backend

    path = tmp_path / "study.log"
    backend = file_backend(path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.symlink(f"{HOST}/{dead.pid}/1", f"{path}.lock")  # its lock, left behind
    done = threading.Event()
    writer = threading.Thread(target=lambda: (backend.append_logs([{"op": 1}]), done.set()), daemon=True)
    writer.start()
    assert done.wait(LOCK_GRACE_S - 10), "waited as for a live holder"  # a deadline well inside the grace
    assert list(JournalFileBackend(str(path)).read_logs(0)) == [{"op": 1}] and not os.path.lexists(f"{path}.lock")

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with open(f"/proc/{alive.pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        os.symlink(f"{HOST}/{alive.pid}/{start}", f"{path}.lock")  # a live holder's
        done.clear()
        writer = threading.Thread(target=lambda: (backend.append_logs([{"op": 2}]), done.set()), daemon=True)
        writer.start()
        assert not done.wait(1.0)  # it waits (a second of it is seen, not timed)
        os.unlink(f"{path}.lock")  # the holder lets go
        assert done.wait(60)
    finally:
        alive.kill()
        alive.wait()
    assert list(JournalFileBackend(str(path)).read_logs(0)) == [{"op": 1}, {"op": 2}]
