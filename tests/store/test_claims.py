"""Claims: exclusive across processes, taken over from dead owners, held while the owner lives."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from sweep.store import claims as claims_lib
from sweep.store.claims import Claims, owner_alive


def _engine(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'c.db'}", connect_args={"timeout": 60})
    Claims.create_table(engine)
    return engine


def _contend(url: str, key: str, barrier, out) -> None:
    engine = sa.create_engine(url, connect_args={"timeout": 60})
    barrier.wait()
    out.put(Claims(engine, 1).try_take(key))


@pytest.mark.slow
def test_claim_is_exclusive_across_processes(tmp_path):
    _engine(tmp_path)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(f"sqlite:///{tmp_path / 'c.db'}", "trial:7", barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(results) == [False, False, False, True]


def _contend_journal(path: str, key: str, barrier, out) -> None:
    from optuna.storages.journal import JournalFileBackend

    from sweep.store.journal_claims import JournalClaims

    claims = JournalClaims(JournalFileBackend(path), 1)
    barrier.wait()
    out.put((claims.try_take(key), claims.live_owners([key]).get(key) == claims.owner))


@pytest.mark.slow
def test_a_journal_claim_is_exclusive_across_processes_and_all_agree_who_holds_it(tmp_path):
    """Four processes take one key at once through the claims log beside a journal file: one wins,
    and each, replaying the log, sees the winner as the holder (issue 41)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_contend_journal, args=(str(tmp_path / "study.log.claims"), "trial:1:7", barrier,
                                                        out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [(False, False)] * 3 + [(True, True)]


def test_a_journal_claim_of_a_dead_owner_is_taken_over_released_and_fenced(tmp_path):
    from optuna.storages.journal import JournalFileBackend

    from sweep.errors import TakenOver
    from sweep.store.journal_claims import JournalClaims

    log = JournalFileBackend(str(tmp_path / "study.log.claims"))
    gone = JournalClaims(log, 1, grace=3.0)
    gone.owner = "otherhost/1/1"  # another host, whose last heartbeat was long ago
    log.append_logs([{"op": "take", "key": "trial:1:1", "owner": gone.owner, "prev": None, "t": 0.0, "id": "x"}])
    mine = JournalClaims(JournalFileBackend(str(tmp_path / "study.log.claims")), 1, grace=3.0)
    assert mine.live_owners(["trial:1:1"]) == {}  # its lease ran out
    assert mine.try_take("trial:1:1") and mine.live_owners(["trial:1:1"]) == {"trial:1:1": mine.owner}
    with pytest.raises(TakenOver):
        gone.check("trial:1:1", "trial 1")  # the old owner, back, is fenced
    assert not gone.try_take("trial:1:1")  # this process is alive: its claim stands
    mine.release("trial:1:1")
    assert mine.live_owners(["trial:1:1"]) == {} and gone.try_take("trial:1:1")


@pytest.mark.slow
def test_claim_of_dead_process_is_taken_over_and_live_one_is_not(tmp_path):
    engine = _engine(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dead_owner = f"{claims_lib.HOST}/{dead.pid}/123"
    with engine.begin() as conn:
        conn.execute(claims_lib.claims_table.insert().values(key="trial:1", owner=dead_owner, heartbeat=time.time()))
    mine = Claims(engine, 1)
    assert mine.live_owners(["trial:1"]) == {}
    assert mine.try_take("trial:1")
    assert mine.live_owners(["trial:1"]) == {"trial:1": mine.owner}
    other = Claims(engine, 1)
    other.owner = "otherhost/1/1"
    assert not other.try_take("trial:1")  # alive: this very process
    mine.release("trial:1")
    assert other.try_take("trial:1")


def test_claim_of_other_host_lives_until_its_lease_expires():
    now = time.time()
    assert owner_alive("elsewhere/42/99", heartbeat=now - 1, now=now)
    assert not owner_alive("elsewhere/42/99", heartbeat=now - claims_lib.LEASE_GRACE_S - 1, now=now)


def test_ask_lock_serialises_threads(tmp_path):
    import threading

    engine = _engine(tmp_path)
    inside, peak, lock = [0], [0], threading.Lock()

    entered = [0]

    def work(c: Claims) -> None:
        for _ in range(5):
            with c.ask_lock(poll_s=0.001):
                with lock:
                    inside[0] += 1
                    entered[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(0.002)
                with lock:
                    inside[0] -= 1

    workers = []
    for i in range(3):
        c = Claims(engine, 1)
        c.owner = f"{claims_lib.HOST}/{os.getpid()}/thread{i}"
        workers.append(threading.Thread(target=work, args=(c,)))
    # Same-host owners are judged by pid and start time; give each thread a live-looking owner.
    orig = claims_lib.owner_alive
    claims_lib.owner_alive = lambda *args, **kwargs: True
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        claims_lib.owner_alive = orig
    assert entered[0] == 15  # every thread got the lock 5 times (an error in a thread fails here)
    assert peak[0] == 1


def test_hosts_creating_the_claims_table_at_once_on_a_fresh_postgres_database_all_succeed(postgres_url):
    """Nodes started together on a new PostgreSQL database all create the claims table: CREATE TABLE
    after `checkfirst` races there (a duplicate pg_type row or "already exists" for the losers; the
    clean-clone run's cluster test saw a node exit on it). 8 engines released together by a barrier,
    on 5 fresh schemas of the database: without the fix, most rounds fail."""
    import threading

    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        for round_ in range(5):
            schema = f"race_{round_}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            engines = [sa.create_engine(postgres_url, connect_args={"options": f"-csearch_path={schema}"})
                       for _ in range(8)]
            barrier, errors = threading.Barrier(len(engines)), []

            def create(engine: sa.Engine) -> None:
                barrier.wait()
                try:
                    Claims.create_table(engine)
                except Exception as e:  # noqa: BLE001 - collected and shown by the assertion
                    errors.append(repr(e)[:200])

            threads = [threading.Thread(target=create, args=(e,)) for e in engines]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            try:
                assert not errors, (round_, errors)
                assert sa.inspect(engines[0]).has_table(claims_lib.claims_table.name)
            finally:
                for e in engines:
                    e.dispose()
    finally:
        admin.dispose()


def test_workers_starting_at_once_agree_on_the_study_s_bucket_folder(write_study, monkeypatch):
    """Two workers that both read the study's attributes before either wrote them: the second one
    to write keeps the first one's bucket folder (Optuna's attribute write is an upsert: without the
    ask lock it replaced it, and the first worker's steps were never found by a takeover)."""
    from sweep.store.session import REMOTE_ROOT_ATTR, Session
    from sweep.study import config as config_lib

    path = write_study()
    first, second = Session(config_lib.load(path)), Session(config_lib.load(path))
    try:
        second.open(create=True)
        first.open(create=True)
        read, check, seen, checked = second.storage.get_study_user_attrs, second.check_unchanged, [], []

        def read_then_the_other_starts(study_id: int):
            attrs = read(study_id)
            if checked and not seen:  # the first worker writes between this read and this worker's writes
                first.record_fingerprint()
                seen.append(first.study_attrs()[REMOTE_ROOT_ATTR])
            return attrs

        def checked_first() -> None:  # the race is at the read after the study file's check
            check()
            checked.append(True)

        monkeypatch.setattr(second, "check_unchanged", checked_first)
        monkeypatch.setattr(second.storage, "get_study_user_attrs", read_then_the_other_starts)
        second.record_fingerprint()
        assert second.study_attrs()[REMOTE_ROOT_ATTR] == seen[0]
        assert first.study_attrs()[REMOTE_ROOT_ATTR] == seen[0]
    finally:
        first.close()
        second.close()
