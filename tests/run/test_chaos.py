"""The chaos campaign's short form (benchmarks/chaos.py): three hosts on one PostgreSQL database and
one bucket, about a minute of seeded random faults of every kind, then every invariant checked."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.restarts_postgres  # its faults restart the server: no other PostgreSQL test runs meanwhile
def test_a_seeded_minute_of_faults_on_three_hosts_breaks_no_guarantee(tmp_path, postgres_url):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import chaos
    finally:
        sys.path.pop(0)
    report = chaos.campaign(tmp_path / "campaign", minutes=1.0, seed=1, workers=3, n_trials=9, steps=100000,
                            storage=postgres_url, say=lambda line: None)
    kinds = {f["kind"] for f in report["faults"]}
    assert kinds | set(report["skipped_kinds"]) == set(chaos.KINDS), report["faults"]  # every kind, or why not
    assert len(report["faults"]) >= 8, report["faults"]
    assert report["invariants"] == {name: True for name in report["invariants"]}, report["invariants"]
    assert set(report["invariants"]) == {"n_trials_finished", "no_trial_failed", "bit_identical_to_uninterrupted",
                                         "keep_trials_held", "max_disk_held", "no_temporary_folders",
                                         "export_verifies"}
