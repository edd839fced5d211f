"""The study file's `checkpoint` section: cadence, retention, budgets, the grace period and the tiers.

Rules across keys live in sweep/study/checks.py (cadence, ram_tier); like config.py, this module
imports neither optuna nor jax.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ByteSize, Field, model_validator

from sweep.study.params import StrictModel
from sweep.study.scheduler_keys import MAX_STEP

DEFAULT_WRITE_SHARE = 0.03


class RamTier(StrictModel):
    """checkpoint.ram: frequent saves to a fast local folder (tmpfs) in front of the workdir
    (sweep/checkpoints/ram.py): they survive a killed process, not a reboot."""

    every_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    every_seconds: Annotated[float, Field(gt=0)] | None = None
    path: Annotated[str, Field(min_length=1)] = "/dev/shm"

    @model_validator(mode="after")
    def _check(self) -> RamTier:
        if self.every_steps is None and self.every_seconds is None:
            raise ValueError("ram: needs every_steps or every_seconds (how often a step goes to the RAM tier), "
                             "got neither")
        return self


class Checkpoint(StrictModel):
    every_steps: Annotated[int, Field(ge=1, le=MAX_STEP)] | None = None
    every_seconds: Annotated[float, Field(gt=0)] | None = 300.0
    every: Literal["auto"] | None = None  # Young-Daly's interval, mtbi_seconds its prior (sweep/train/young_daly.py)
    mtbi_seconds: Annotated[float, Field(gt=0)] | None = None  # rules across keys: sweep/study/checks.py (cadence)
    keep_last: Annotated[int, Field(ge=1)] = 2
    keep_best: Annotated[int, Field(ge=1)] = 1  # the best state is always kept (docs/reference.md)
    # SIGTERM/SIGINT: exit after this at the latest; null: $SWEEP_GRACE_SECONDS, else 30 (sweep/host/signals.py)
    grace_seconds: Annotated[float, Field(gt=0)] | None = None
    # The write budget (sweep/train/cadence.py): given, caps any cadence (null: none). See write_share.
    max_write_share: Annotated[float, Field(gt=0, le=1)] | None = None
    # The disk budget (sweep/checkpoints/retention.py): only the K best COMPLETE trials keep checkpoints; a byte cap.
    keep_trials: Annotated[int, Field(ge=1)] | None = None
    max_disk: Annotated[ByteSize, Field(gt=0)] | None = None
    # A remote tier (sweep/checkpoints/remote.py) every committed step is uploaded to: s3:// built in,
    # other URL schemes by `tiers`, scheme -> "module:Class" (sweep/checkpoints/tiers.py).
    remote: str | None = None
    tiers: dict[str, str] = {}
    ram: RamTier | None = None  # a RAM tier in front of the workdir (sweep/checkpoints/ram.py)

    @property
    def explicit_cadence(self) -> bool:  # the file gives every_steps or every_seconds: honoured exactly
        return self.every is None and bool({"every_steps", "every_seconds"} & self.model_fields_set)

    @property
    def write_share(self) -> float | None:
        """The write budget in force: max_write_share where the file gives it (null: none), else
        none for an explicit cadence and DEFAULT_WRITE_SHARE for the default one."""
        if "max_write_share" in self.model_fields_set:
            return self.max_write_share
        return None if self.explicit_cadence else DEFAULT_WRITE_SHARE

    @model_validator(mode="after")
    def _check_remote(self) -> Checkpoint:
        for scheme, path in self.tiers.items():
            if scheme == "s3" or not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
                raise ValueError(f"tiers: must name URL schemes (lowercase letters, digits, +.-) other than "
                                 f"the built-in s3, got {scheme!r}")
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", path):
                raise ValueError(f"tiers.{scheme}: must be a tier class's import path, module:Class, got {path!r}")
        if self.remote is None or self.remote.partition("://")[0] in self.tiers and "://" in self.remote:
            return self
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?", self.remote):
            other = f" or a URL of a scheme named in checkpoint.tiers ({', '.join(self.tiers)})" if self.tiers else ""
            raise ValueError(f"remote: must be s3://bucket/prefix (a bucket name of 3-63 lowercase letters, digits, "
                             f"dots and hyphens){other}, got {self.remote!r}")
        return self
