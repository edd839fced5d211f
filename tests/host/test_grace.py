"""The grace period after SIGTERM: the study file's `checkpoint.grace_seconds`, else
$SWEEP_GRACE_SECONDS (what a job script knows of its platform), else 30 s."""

from __future__ import annotations

import pytest

from sweep.errors import UsageError
from sweep.host.signals import DEFAULT_GRACE_SECONDS, GRACE_ENV, StopSignal, grace_seconds


def test_grace_is_the_study_file_s_else_the_environment_s_else_30_seconds(monkeypatch):
    monkeypatch.delenv(GRACE_ENV, raising=False)
    assert DEFAULT_GRACE_SECONDS == 30.0
    assert grace_seconds(None) == 30.0 and StopSignal().grace_seconds == 30.0
    assert grace_seconds(12.5) == 12.5
    monkeypatch.setenv(GRACE_ENV, "110")  # e.g. a SLURM job script with --signal=TERM@120
    assert grace_seconds(None) == 110.0 and StopSignal(None).grace_seconds == 110.0
    assert grace_seconds(12.5) == 12.5  # the study file's own key wins


@pytest.mark.parametrize("value", ["", "soon", "0", "-5", "nan", "inf"])
def test_a_bad_grace_in_the_environment_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(GRACE_ENV, value)
    with pytest.raises(UsageError) as raised:
        grace_seconds(None)
    assert raised.value.exit_code == 2
    assert str(raised.value) == f"${GRACE_ENV}: must be seconds > 0 (the grace period after SIGTERM), got {value!r}"
