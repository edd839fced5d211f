"""`export`: every finished trial's best checkpoint -> safetensors + meta.json + index.json.

Loading an export needs no pickle and none of this package: safetensors and JSON only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import retention
from sweep.checkpoints.remote import open_remote
from sweep.commands.best import best_state
from sweep.commands.export_format import flatten
from sweep.errors import CheckpointsRemoved, SweepError
from sweep.results import ExportIndex
from sweep.schedulers import base as scheduler
from sweep.store.record import CONTINUED_FROM, LAST_STEP, best_step, metrics_at, params_in_force, train_loss_at
from sweep.store.session import Session
from sweep.study.constraints import feasible
from sweep.trial import code as trial_code

log = logging.getLogger("sweep")


def _write(path: Path, data: bytes) -> None:
    """Temp file + rename: a reader never sees half a file. The file gets the permissions any new
    file gets here (0644 under umask 022), not mkstemp's private 0600."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask can only be read by setting it)
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def provenance(config: Any, trial: FrozenTrial | None = None) -> dict[str, Any]:
    """Which model definition the params belong to: the trial module, the sha256 of its source and
    of the trial's own code (the module and the local modules it imports) as `trial` trained with
    them (recorded then; as they are now for a trial trained before sweep recorded it), and the
    versions of the packages that trained them. A trial whose code differs now is warned about."""
    from importlib import metadata

    from sweep.study import fingerprint

    code = fingerprint.code(config)
    recorded = trial.user_attrs.get(trial_code.TRIAL_ATTR) if trial is not None else None
    changed = trial_code.differences(recorded, {"sha256": code["code_sha256"], "files": code["files"]})
    if changed:
        log.warning("trial %d: its params were trained with other code than the trial's modules hold now: %s; "
                    "meta.json records the code it trained with", trial.number, ", ".join(changed))
    versions = {}
    for package in ("sweep", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "optuna"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    files = (recorded or {}).get("files", code["files"])
    return {"trial_module": code["module"], "trial_source_sha256": files.get(code["module"], code["sha256"]),
            "trial_source_file": os.path.basename(code["file"]),
            "trial_code_sha256": (recorded or {}).get("sha256", code["code_sha256"]), "trial_code_files": files,
            "trial_code_recorded": recorded is not None, "versions": versions}


def _values(config: Any, t: FrozenTrial) -> dict[str, float] | None:
    """{metric: value} of each objective, as the trial was told (None for a PRUNED trial)."""
    if t.state != TrialState.COMPLETE:
        return None
    return dict(zip((o.metric for o in config.study.all_objectives), t.values))


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def export(session: Session, out: Path, trial: int | None = None, include_pruned: bool = False) -> ExportIndex:
    """Write the export of the study's finished trials (or only `trial`) into `out`; returns the index.

    Trials whose checkpoints the study's disk budget removed are left out (index.json's `removed`
    lists them, with why); asked for by `trial`, one is an error.

    Raises:
        SweepError: the study or the trial does not exist, no trial is finished yet, or `trial`'s
            checkpoints were removed.
    """
    from safetensors.numpy import save

    config = session.open(create=False).config
    removed = retention.removed(session)
    states = (TrialState.COMPLETE, TrialState.PRUNED) if include_pruned else (TrialState.COMPLETE,)
    trials = session.trials(states)
    if trial is not None:
        trials = [t for t in trials if t.number == trial]
        if not trials:
            known = list(session.trial_states())
            why = "it does not exist" if trial not in known else "it is not " + (
                "COMPLETE or PRUNED" if include_pruned else "COMPLETE (see --include-pruned)")
            raise SweepError(f"cannot export trial {trial} of study {config.name!r}: {why}")
    if trial is not None and trial in removed:
        raise CheckpointsRemoved(retention.removed_message(trial, config.checkpoint_dir(trial),
                                                                     removed[trial]))
    skipped = {t.number: removed[t.number] for t in trials if t.number in removed}
    trials = [t for t in trials if t.number not in removed]
    if not trials:
        raise SweepError(f"study {config.name!r} has no finished trial to export yet" + (
            f" (the disk budget removed the checkpoints of trials {sorted(skipped)})" if skipped else ""))
    direction, metric = config.study.objective.direction, config.study.objective.metric
    sign = config.study.objective.sign
    multi = config.study.multi_objective
    front = set(session.pareto_numbers()) if multi else set()
    # Best first; with constraints, every feasible trial before the infeasible ones; with several
    # objectives, the Pareto-optimal trials first (each group by the first objective).
    trials = sorted(trials, key=lambda t: (multi and t.number not in front, feasible(t) is False,
                                           sign * best_step(t, direction)[1], t.number))
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    remote = open_remote(session)
    sched = scheduler.of(config)
    for t in trials:
        restored = best_state(config, t, remote=remote)
        step, value = restored.step, restored.value
        variables = restored.variables()
        params = variables.pop("params")
        folder = out / f"trial_{t.number:04d}"
        folder.mkdir(exist_ok=True)
        entry = {"number": t.number, "dir": folder.name, "state": t.state.name,
                 "hyperparameters": config.hyperparameters(params_in_force(t)), "params": t.params, "metric": metric,
                 "best_step": step, "best_value": value,
                 "last_step": t.user_attrs.get(LAST_STEP, max(t.intermediate_values, default=step)),
                 "metrics": metrics_at(t, step, metric) or {metric: value},
                 **({"feasible": feasible(t)} if config.study.constraints else {}),
                 # several objectives: whether it is Pareto-optimal, and each objective's value
                 **({"pareto": t.number in front, "values": _values(config, t)} if multi else {}),
                 "train_loss": train_loss_at(t, step),  # mean training loss of the interval before best_step
                 "collections": sorted(variables),  # model state beside the params, in state.safetensors
                 # the scheduler's own (pbt: its exploits, sweep/schedulers/pbt.py)
                 **(sched.export_fields(t) if sched is not None else {}),
                 # a trial of a companion study: the trial `continue` trained further
                 **({CONTINUED_FROM: t.user_attrs[CONTINUED_FROM]} if CONTINUED_FROM in t.user_attrs else {}),
                 **provenance(config, t)}
        _write(folder / "params.safetensors", save(flatten(params)))
        if variables:  # keys like "batch_stats/BatchNorm_0/mean"
            _write(folder / "state.safetensors", save(flatten(variables)))
        _write(folder / "meta.json", _json(entry))
        entries.append(entry)
    index = {"study": config.name, "metric": metric, "direction": direction, "trials": entries}
    if multi:
        index["objectives"] = [o.model_dump() for o in config.study.all_objectives]
    if skipped:  # finished, but without checkpoints: checkpoint.keep_trials / max_disk removed them
        index["removed"] = {str(n): why for n, why in sorted(skipped.items())}
    _write(out / "index.json", _json(index))
    return index
