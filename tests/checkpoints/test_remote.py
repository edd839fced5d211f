"""Checkpoints on S3-compatible storage (sweep/checkpoints/s3.py, behind sweep/checkpoints/remote.py)
against a real S3 server on localhost (moto's server mode, started by the test): uploads with a
commit marker last, a kill mid-upload, resume from the bucket (the takeover by a host with an empty
disk, and export reading only the bucket: tests/run/test_clusters.py)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from conftest import BUCKET, checkpoint_dir, make_study, run, saved_steps, tier_of
from sweep.checkpoints import integrity
from sweep.checkpoints import remote as remote_lib
from sweep.store.session import Session
from sweep.study import config as config_lib


@pytest.fixture
def bucket_prefix(s3_server: str, request: pytest.FixtureRequest) -> str:
    return f"s3://{BUCKET}/{request.node.name[:40]}"




def objects(prefix: str) -> list[str]:
    import boto3

    bucket, _, key = prefix[len("s3://"):].partition("/")
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_remote_tier_mirrors_the_kept_steps_and_a_kill_mid_upload_leaves_no_step(here, bucket_prefix):
    study = make_study(here, n_trials=1, checkpoint={"every_steps": 10, "keep_last": 2, "max_write_share": None,
                                                      "remote": bucket_prefix})
    run(study)
    folder = checkpoint_dir(study, 0)
    tier = tier_of(bucket_prefix, f"sqlite:///{study['workdir']}/study.db", "sched")
    assert tier.tier.root.startswith(f"{bucket_prefix[len('s3://' + BUCKET) + 1:]}/sched-")
    assert tier.steps("trial_0000") == saved_steps(folder)  # retention on both tiers
    # A kill mid-upload: the files of a step but no marker. No reader takes it; the next prune
    # (after the next upload) removes it.
    tier.tier.client.put_object(Bucket=BUCKET, Key=f"{tier.tier.root}/checkpoints/trial_0000/25/default/x",
                                Body=b"half")
    assert 25 not in tier.steps("trial_0000")
    # A host with an empty disk gets every committed step back, checksums included.
    other = here / "elsewhere" / "trial_0000"
    other.mkdir(parents=True)
    assert tier.fetch_missing(other, "trial 0") == saved_steps(folder)
    for step in saved_steps(folder):
        assert integrity.read_checksum(other, step) == integrity.read_checksum(folder, step)
        local = sorted(p.relative_to(folder / str(step)) for p in (folder / str(step)).rglob("*") if p.is_file())
        assert sorted(p.relative_to(other / str(step)) for p in (other / str(step)).rglob("*") if p.is_file()) == local
    tier.prune(folder)
    assert not [k for k in objects(bucket_prefix) if "/trial_0000/25/" in k]


def test_a_signal_save_is_uploaded_within_the_grace_period_and_status_shows_local_only_steps(here, bucket_prefix):
    from conftest import run_interrupted
    from sweep.commands import status
    from sweep.store.session import Session

    study = make_study(here, n_trials=1, checkpoint={"every_steps": 20, "keep_last": 2, "remote": bucket_prefix})
    run_interrupted(study, 0, 30)
    tier = tier_of(bucket_prefix, f"sqlite:///{study['workdir']}/study.db", "sched")
    assert 30 in tier.steps("trial_0000")  # the signal's save, in the bucket before the exit
    # A step whose upload never finished (its marker missing) is shown as local only.
    tier.tier.client.delete_object(Bucket=BUCKET, Key=f"{tier.tier.root}/commits/trial_0000/30")
    session = Session(config_lib.from_dict(study)).open(create=False)
    try:
        report = status.collect(session)
    finally:
        session.close()
    assert report["trials"][0]["remote_step"] == 20
    assert "20 (step 30 local only)" in status.table(report)
    run(study)  # the resume uploads what the bucket lacks
    assert tier.steps("trial_0000") == saved_steps(checkpoint_dir(study, 0))


def test_remote_must_be_an_s3_url(here):
    study = make_study(here, checkpoint={"remote": "gs://bucket/x"})
    with pytest.raises(config_lib.ConfigError, match=r"checkpoint.remote: must be s3://bucket/prefix .* "
                                                     r"got 'gs://bucket/x'"):
        config_lib.from_dict(study, origin="s.yaml")


@pytest.mark.slow
def test_a_removed_trial_left_in_the_bucket_is_pruned_by_the_next_pass(here, bucket_prefix):
    """keep_trials holds in the bucket too when a trial's prune was cut short (an outage) or another
    host's upload landed after it: the chaos campaign found 23 such trials in 30 minutes."""
    from sweep.checkpoints import retention
    from sweep.store.session import Session

    study = make_study(here, n_trials=3, checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": 1,
                                                      "remote": bucket_prefix})
    run(study)
    tier = tier_of(bucket_prefix, f"sqlite:///{study['workdir']}/study.db", "sched")
    in_bucket = {n: tier.steps(f"trial_{n:04d}") for n in range(3)}
    (kept,) = [n for n, steps in in_bucket.items() if steps]
    removed = next(n for n in range(3) if n != kept)
    assert not checkpoint_dir(study, removed).exists()
    # The marker of a step of the removed trial, as an interrupted prune leaves it.
    tier.tier.client.put_object(Bucket=BUCKET, Key=f"{tier.tier.root}/commits/trial_{removed:04d}/20", Body=b"{}")
    assert tier.steps(f"trial_{removed:04d}") == [20]
    session = Session(config_lib.from_dict(study)).open(create=False)
    try:
        retention.enforce(session, remote_lib.open_remote(session))
    finally:
        session.close()
    assert tier.steps(f"trial_{removed:04d}") == [] and tier.steps(f"trial_{kept:04d}") == in_bucket[kept]


def test_a_host_s_stale_copy_of_a_trial_another_host_finished_goes_as_its_run_ends(tmp_path, monkeypatch,
                                                                                    bucket_prefix):
    """Found by the chaos campaign: host a is interrupted on trial 0 (its steps stay on its disk), host
    b takes trial 0 over, finishes the study and removes trial 0 by keep_trials from its disk and the
    bucket. The removal is recorded although host b removed only the bucket's copy of a trial host a
    trained (an export looked for its steps), and host a, whose run was waiting meanwhile, removes
    its stale copy as its run ends: no host keeps a trial outside the best K."""
    import optuna

    from conftest import run_interrupted, write_trial
    from sweep.checkpoints import retention
    from sweep.commands import export
    from sweep.run import worker
    from sweep.store.session import Session

    write_trial(tmp_path)
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def host(name: str) -> dict:
        return make_study(tmp_path / name, n_trials=2, storage=storage,
                          checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": 1, "remote": bucket_prefix})

    a, b = host("a"), host("b")
    run_interrupted(a, number=0, step=20)
    assert saved_steps(checkpoint_dir(a, 0))  # host a's copy of trial 0, interrupted

    real_next = worker._next_trial
    b_ran = []

    def next_trial(session: Session, deadline: float) -> Any:  # host b runs the study while host a's run is under way
        if not b_ran:
            b_ran.append(True)
            run(b)
        return real_next(session, deadline)

    monkeypatch.setattr(worker, "_next_trial", next_trial)
    run(a)  # its start's pass sees trial 0 RUNNING; host b finishes it meanwhile
    assert b_ran
    done = optuna.load_study(study_name="sched", storage=storage).get_trials()
    assert [t.state.name for t in done] == ["COMPLETE", "COMPLETE"]
    best = min(done, key=lambda t: t.value).number
    assert best == 1  # trial 0 is the one outside the best 1, trained first on host a
    session = Session(config_lib.from_dict(b)).open(create=False)
    try:
        assert set(retention.removed(session)) == {0}  # recorded, though host b's disk had only its own copy
    finally:
        session.close()
    tier = tier_of(bucket_prefix, storage, "sched")
    assert tier.steps("trial_0000") == [] and tier.steps("trial_0001")
    assert not checkpoint_dir(a, 0).exists()  # host a's stale copy went as its run ended
    assert not checkpoint_dir(b, 0).exists()
    out = tmp_path / "export"
    session = Session(config_lib.from_dict(host("c")))
    try:
        export.export(session, out)  # a third folder: the bucket only
    finally:
        session.close()
    index = json.loads((out / "index.json").read_text())
    assert [t["number"] for t in index["trials"]] == [1] and list(index["removed"]) == ["0"]


def test_a_host_removing_only_the_bucket_s_copy_records_the_removal(tmp_path, monkeypatch, bucket_prefix):
    """Host a trained both trials; host b (no folder of them) applies keep_trials 1 first: it removes
    trial 0's copy in the bucket, and records the removal first, so an export from a third folder
    leaves trial 0 out instead of failing on its missing steps; host a's own copy goes at its next
    pass."""
    from conftest import write_trial
    from sweep.checkpoints import retention
    from sweep.commands import export
    from sweep.store.session import Session

    write_trial(tmp_path)
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def host(name: str, keep: int) -> dict:
        return make_study(tmp_path / name, n_trials=2, storage=storage,
                          checkpoint={"every_steps": 20, "keep_last": 2, "keep_trials": keep, "remote": bucket_prefix})

    run(host("a", 2))
    tier = tier_of(bucket_prefix, storage, "sched")
    assert tier.steps("trial_0000") and tier.steps("trial_0001")

    def apply_budget(study: dict) -> dict[int, str]:
        session = Session(config_lib.from_dict(study)).open(create=False)
        try:
            retention.enforce(session, remote_lib.open_remote(session))
            return retention.removed(session)
        finally:
            session.close()

    assert set(apply_budget(host("b", 1))) == {0}  # trial 1 is the best (asserted by the steps kept)
    assert tier.steps("trial_0000") == [] and tier.steps("trial_0001")
    assert saved_steps(checkpoint_dir(host("a", 1), 0))  # host b cannot touch host a's disk
    out = tmp_path / "export"
    session = Session(config_lib.from_dict(host("c", 1)))
    try:
        index = export.export(session, out)
    finally:
        session.close()
    assert [t["number"] for t in index["trials"]] == [1] and list(index["removed"]) == ["0"]
    apply_budget(host("a", 1))
    assert not checkpoint_dir(host("a", 1), 0).exists() and saved_steps(checkpoint_dir(host("a", 1), 1))


def test_a_finished_trial_s_steps_an_outage_kept_from_the_bucket_are_uploaded_by_the_next_run(tmp_path, monkeypatch,
                                                                                              bucket_prefix):
    """Found by the chaos campaign: a run that exited while the bucket was away left a finished
    trial's last uploads local, and nothing uploaded them later (an export from the bucket missed
    the trial's best step). The next run's start queues them; a stale copy (its newest step short
    of the trial's last) uploads nothing."""
    from conftest import write_trial
    from sweep.store.session import Session

    write_trial(tmp_path)
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def host(name: str) -> dict:
        return make_study(tmp_path / name, n_trials=2, storage=storage,
                          checkpoint={"every_steps": 20, "keep_last": 2, "remote": bucket_prefix})

    a = host("a")
    run(a)
    tier = tier_of(bucket_prefix, storage, "sched")
    kept = saved_steps(checkpoint_dir(a, 1))
    assert tier.steps("trial_0001") == kept
    tier.prune(checkpoint_dir(a, 1), everything=True)  # as if its uploads never got through
    assert tier.steps("trial_0001") == []

    stale = checkpoint_dir(host("b"), 1)  # host b: a copy of trial 1 short of its last step
    shutil.copytree(checkpoint_dir(a, 1), stale)
    shutil.rmtree(stale / str(kept[-1]))
    session = Session(config_lib.from_dict(host("b"))).open(create=False)
    try:
        assert remote_lib.upload_finished(session, remote_lib.open_remote(session)) == 0
    finally:
        session.close()
    assert tier.steps("trial_0001") == []

    run(a)  # the finished study again: its start queues the missing steps, its end waits for them
    assert tier.steps("trial_0001") == kept
