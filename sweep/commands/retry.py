"""`retry`: FAIL trials run again under their number and params, from their newest checkpoint or
from scratch, once the code that failed them is fixed.

A retried trial is reopened in Optuna's storage as a RUNNING trial that no worker holds, the state
a killed run leaves; `run` then resumes it as it resumes any interrupted trial, so `n_trials` stays
exact (it was counted as finished, and is again once it ends) and an interrupted retry continues
with `run`. Its earlier failures stay in its record (`retried`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import ram as ram_lib
from sweep.checkpoints.remote import remote_steps
from sweep.checkpoints.steps import newest_step
from sweep.errors import UsageError
from sweep.store.record import CHECKPOINT_DIR, ERROR, EVAL_ATTR_PREFIX, FAILURES, RETRIED
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.words import listing

log = logging.getLogger("sweep")


def reopen(session: Session, numbers: list[int] | None = None, from_scratch: bool = False) -> list[int]:
    """Reopen the FAIL trials numbered `numbers` (default: every FAIL trial) for `run` to resume;
    returns the numbers reopened. `from_scratch` removes their checkpoints first.

    Raises:
        ConfigError: the study file changed keys that define what its trials mean (nothing changed).
        UsageError: a number is no FAIL trial of the study; `from_scratch` with checkpoint.remote; a
            journal storage (Optuna's journal never changes a finished trial).
    """
    config = session.open(create=False).config
    session.check_unchanged()  # a retry trains the trial the study defined, or nothing
    states = session.trial_states()
    for n in numbers or []:
        if n not in states:
            raise UsageError(f"--trial {n}: study {config.name!r} has no trial {n}")
        if states[n] != TrialState.FAIL:
            raise UsageError(f"--trial {n}: trial {n} is {states[n].name}, not FAIL: only failed trials are retried")
    if from_scratch and config.study.checkpoint.remote is not None:
        # The bucket's steps would be fetched again: removing them is the user's call, not a retry's.
        raise UsageError("--from-scratch: not with checkpoint.remote (a retry resumes from the bucket's steps); "
                         "retry from the newest checkpoint, or remove the trial's steps from the bucket first")
    chosen = sorted(set(numbers)) if numbers else sorted(n for n, s in states.items() if s == TrialState.FAIL)
    if chosen:
        session.check_reopenable()  # before anything is removed: a journal never changes a finished trial
    remote = remote_steps(session, chosen) or {} if chosen and not from_scratch else {}
    done = []
    for n in chosen:
        trial = session.trial(n)
        attrs = trial.user_attrs
        ram_dir = ram_lib.trial_dir(session, n)
        if from_scratch:
            _remove_checkpoints(config, trial)  # a kill before the reopen leaves a FAIL trial to retry
            if ram_dir is not None:
                ram_lib.clear(ram_dir)
        # The newest step the run can resume from, wherever it is (plan's rule): the reports up to
        # it stay, since nothing trains those steps again.
        folders = [*_folders(config, trial), *([ram_dir] if ram_dir is not None else [])]
        step = max((s for s in [*remote.get(n, []), *[newest_step(f) for f in folders]] if s is not None),
                   default=None)
        entry = {"error": attrs.get(ERROR), "failures": attrs.get(FAILURES, 0),
                 "last_step": max((int(k[len(EVAL_ATTR_PREFIX):]) for k in attrs if k.startswith(EVAL_ATTR_PREFIX)),
                                  default=None),
                 "from_step": step or 0}
        # max_retries applies to the retry afresh; the record and the state change in one transaction
        if not session.reopen_failed(n, step, {RETRIED: [*attrs.get(RETRIED, []), entry], FAILURES: 0}):
            continue  # another process retried it meanwhile
        error = (str(attrs.get(ERROR) or "an error").splitlines() or [""])[0]
        log.info("trial %d: retried from %s (it failed with %s)", n,
                 f"its newest checkpoint, step {step}" if step is not None else "step 0",
                 error if len(error) <= 160 else error[:160] + "...")
        done.append(n)
    if not done:
        log.info("no FAIL trial to retry in study %r", config.name)
    else:
        log.info("retrying trials %s: run resumes them", listing(done))
    return done


def _folders(config: Config, trial: FrozenTrial) -> list[Path]:
    """Where a run finds the trial's steps: its folder under the workdir, and where it ran last
    (the `checkpoint_dir` it recorded, which a run resumes from when the workdir's has none)."""
    recorded = trial.user_attrs.get(CHECKPOINT_DIR)
    return [config.checkpoint_dir(trial.number), *([Path(recorded)] if recorded else [])]


def _remove_checkpoints(config: Config, trial: FrozenTrial) -> None:
    """--from-scratch: the trial's folder under the workdir goes; one elsewhere (where it ran last)
    is the user's to remove, so that case is refused."""
    own, *other = _folders(config, trial)
    if other and other[0] != own and newest_step(other[0]) is not None:
        raise UsageError(f"--from-scratch: trial {trial.number}'s checkpoints are in {other[0]}, outside this "
                         f"workdir; remove them to retry it from scratch")
    shutil.rmtree(own, ignore_errors=True)
