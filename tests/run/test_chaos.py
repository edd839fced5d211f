"""The chaos campaign's short deterministic form (benchmarks/chaos.py, `scenario=True`): three hosts
on one PostgreSQL database and one bucket, each fault kind once, each injected when a host has
committed a step it had not before the previous fault; then every invariant checked. The seeded
campaign of random moments, minutes long, is the benchmark (docs/faults.md)."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

# damage first, then the kill of a host: the damaged newest step is likely to be what a takeover restores
ORDER = ("damage", "kill9", "sigterm", "freeze", "s3", "disk", "pg")


@pytest.mark.restarts_postgres  # its faults restart the server: no other PostgreSQL test runs meanwhile
def test_each_fault_once_on_three_hosts_breaks_no_guarantee(tmp_path, postgres_url, seed):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import chaos
    finally:
        sys.path.pop(0)
    assert set(ORDER) == set(chaos.KINDS)
    report = chaos.campaign(tmp_path / "campaign", minutes=5.0, seed=seed, workers=3, n_trials=6, steps=24000,
                            storage=postgres_url, kinds=ORDER, say=lambda line: None, scenario=True)
    injected = [f["kind"] for f in report["faults"]]
    assert injected == [k for k in ORDER if k not in report["skipped_kinds"]], report["faults"]  # each once, in order
    assert not set(report["skipped_kinds"]) - {"disk", "pg"}, report  # only the root-only kinds may be left out
    assert report["invariants"] == {name: True for name in report["invariants"]}, report["invariants"]
    assert set(report["invariants"]) == {"n_trials_finished", "no_trial_failed", "bit_identical_to_uninterrupted",
                                         "keep_trials_held", "max_disk_held", "no_temporary_folders",
                                         "export_verifies"}
