"""`status`: what every trial of a study is doing or has done, as a table or JSON (docs/reference.md)."""

from __future__ import annotations

import time
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints import retention
from sweep.checkpoints.remote import remote_steps
from sweep.checkpoints.steps import newest_mtime, newest_step
from sweep.results import StudyStatus, TrialStatus
from sweep.schedulers import base as scheduler
from sweep.store.record import (BEST_STEP, BEST_VALUE, COMPILES_ATTR, CONTINUED_FROM, DEVICES, LAST_STEP,
                                METRICS, PAUSED_AT, PROMOTED_AT, best_of_reports, checkpoint_folder, companions, counted_reports,
                                metrics_at, paused_rung, rung_path, train_loss_at)
from sweep.store.session import Session
from sweep.study.config import Config, sign
from sweep.study.constraints import feasible
from sweep.study.credentials import mask_url
from sweep.train import ledger as ledger_lib
from sweep.train.cadence import effective_interval
from sweep.train.ledger import RESUMES_ATTR, study_total, summary_line


def collect(session: Session) -> StudyStatus:
    """The `status --json` object (every field: docs/reference.md). Reads only; creates nothing."""
    config = session.open(create=False).config
    # Narrow: of the `eval:<step>` rows only the one at each trial's best step, the one shown.
    trials = session.records()
    live = session.live_numbers(trials)
    direction = config.study.objective.direction
    folders = {t.number: checkpoint_folder(config, t) for t in trials}
    removed = retention.removed(session)
    entries = [_entry(t, live, direction, folders[t.number], config.study.objective.metric,
                      removed.get(t.number)) for t in trials]
    if config.study.constraints:  # whether it met them (never best when not); null before it finished
        for entry, t in zip(entries, trials):
            entry["feasible"] = feasible(t)
    if config.study.multi_objective:  # each objective's value, and whether it is on the Pareto front
        front = set(session.pareto_numbers())
        for entry, t in zip(entries, trials):
            done = t.state == TrialState.COMPLETE
            entry["values"] = dict(zip((o.metric for o in config.study.all_objectives), t.values)) if done else None
            entry["pareto"] = t.number in front
    if (sched := scheduler.of(config)) is not None:  # its own fields (pbt: its exploits, sweep/schedulers/pbt.py)
        for entry, t in zip(entries, trials):
            entry.update(sched.status_fields(t))
    if config.study.checkpoint.every == "auto":  # the interval chosen last and its inputs (young_daly.py)
        for entry, t in zip(entries, trials):
            entry["checkpoint_auto"] = ledger_lib.auto_of(t.user_attrs.get(ledger_lib.LEDGER_ATTR))
    if config.study.checkpoint.remote is not None:  # the newest step each trial has in the tier
        remote = remote_steps(session, (t.number for t in trials)) or {}
        for entry in entries:
            entry["remote_step"] = remote.get(entry["number"], [None])[-1]
    return {
        "study": config.name,
        "storage": mask_url(config.storage),  # never its password (sweep/study/credentials.py)
        "n_trials": config.study.n_trials,
        "metric": config.study.objective.metric,
        "direction": config.study.objective.direction,
        # several objectives: every one (metric and direction are the first's, which picks best steps)
        **({"objectives": [o.model_dump() for o in config.study.all_objectives]}
           if config.study.multi_objective else {}),
        "trials": entries,
        # the goodput ledger summed over the trials (sweep/train/ledger.py); null before any was recorded
        "ledger": study_total(e["ledger"] for e in entries),
        # steps -> companion study of the trials `continue` trained that far (status --continued STEPS)
        "continued": {str(k): v for k, v in sorted(companions(session.storage, config.name).items())},
    }


def _state(t: FrozenTrial, live: set[int]) -> str:
    if t.state == TrialState.RUNNING:
        return "RUNNING" if t.number in live else "INTERRUPTED"
    if paused_rung(t) is not None:  # Optuna's WAITING, at its rung (sweep/schedulers/asha.py)
        return "PAUSED"
    return t.state.name


def _entry(t: FrozenTrial, live: set[int], direction: str, folder: Any, t_metric: str,
           removed: str | None) -> TrialStatus:
    attrs = t.user_attrs
    # A trial still running (or interrupted) has no best_* attributes yet: derive them from its reports.
    best_step, best_value = best_of_reports(counted_reports(t, t_metric), direction) or (None, None)
    best_value = attrs.get(BEST_VALUE, best_value)
    return {
        "number": t.number,
        "state": _state(t, live),
        "params": t.params,
        # the trial's best evaluation, as the table and the log show it: Optuna's value of a trial
        # told PRUNED is its last report instead; none for FAIL, RUNNING, INTERRUPTED, WAITING
        "value": t.values[0] if t.state == TrialState.COMPLETE else best_value if t.state == TrialState.PRUNED else None,
        "best_step": attrs.get(BEST_STEP, best_step),
        "best_value": best_value,
        "last_step": attrs.get(LAST_STEP, max(t.intermediate_values, default=None)),
        # scheduler asha (sweep/schedulers/asha.py): the rung step a PAUSED trial waits at (else null), and the
        # rung steps it paused at so far (null for a trial that never paused)
        "rung": paused_rung(t),
        "paused_at": attrs.get(PAUSED_AT),
        "promoted_at": attrs.get(PROMOTED_AT),  # ... and those it went on from (null before any)
        "checkpoint_dir": str(folder) if folder is not None and removed is None else None,  # where it is now
        # why the study's disk budget (keep_trials, max_disk) removed its checkpoints, if it did
        "checkpoints_removed": removed,
        "resumes": int(attrs.get(RESUMES_ATTR, 0)),  # its interruptions (sweep/train/ledger.py)
        # {"study", "number", "last_step"} of the trial `continue` trained further (companion studies)
        "continued_from": attrs.get(CONTINUED_FROM),
        # the devices its latest run trained on, "<platform>:<host-wide index>" (sweep/host/slots.py)
        "devices": attrs.get(DEVICES),
        "metrics": attrs.get(METRICS) or metrics_at(t, attrs.get(BEST_STEP, best_step), t_metric),
        "train_loss": train_loss_at(t, attrs.get(BEST_STEP, best_step)),  # mean, the interval before best_step
        # XLA compilations, executables from the persistent cache and compile seconds, all its runs
        "compiles": attrs.get(COMPILES_ATTR),
        # seconds training, evaluating, compiling, restoring, checkpointing (blocking, background),
        # waiting, wall, lost to interruptions, and their number, over all its runs
        "ledger": ledger_lib.of_trial(attrs),
        # the mean steps and seconds between its saves and the saves the write budget deferred
        # (null before its first save)
        "checkpoint_interval": effective_interval(attrs.get(ledger_lib.LEDGER_ATTR)),
    }


def table(status: dict[str, Any], highlight: bool = False) -> str:
    """A fixed-width table, sorted by number, with the best trial marked by '*' (and bold if `highlight`)."""
    complete = [t for t in status["trials"] if t["state"] == "COMPLETE" and t["value"] is not None
                and t.get("feasible") is not False]  # an infeasible trial is never best
    best = min(complete, key=lambda t: sign(status["direction"]) * t["value"])["number"] if complete else None
    front = [t["number"] for t in status["trials"] if t.get("pareto")]  # several objectives: '*' marks these
    names = sorted({k for t in status["trials"] for k in t["params"]})
    # The other metrics at the best step (the objective's column is best_value).
    extra = sorted({k for t in status["trials"] for k in (t.get("metrics") or {})} - {status["metric"]})
    extra += ["train_loss"] if any(t.get("train_loss") is not None for t in status["trials"]) else []
    remote = any("remote_step" in t for t in status["trials"])
    linked = any(t.get("continued_from") for t in status["trials"])
    pbt = any("lineage" in t for t in status["trials"])  # scheduler pbt: which member it copied last, where
    # pause and promote (asha, hyperband): each trial's path through the rungs (pbt's pauses are its generations)
    rungs = not pbt and any(t.get("paused_at") for t in status["trials"])
    # A host of one device says nothing new: the column shows where trials could differ.
    devices = len({d for t in status["trials"] for d in t.get("devices") or ()}) > 1
    head = ["", "number", "state", *(["rungs"] if rungs else []), *(["continued_from"] if linked else []),
            *(["copied"] if pbt else []), *names,
            status["metric"], *extra,
            "best_step", "last_step", "resumes", "lost", "ckpt_every", "ckpt_age", *(["devices"] if devices else []),
            *(["remote"] if remote else [])]
    rows = [head]
    now = time.time()
    for t in status["trials"]:
        mtime = newest_mtime(t["checkpoint_dir"]) if t["checkpoint_dir"] else None
        metrics = {**(t.get("metrics") or {}), "train_loss": t.get("train_loss")}
        marked = t["number"] in front if "objectives" in status else t["number"] == best
        rows.append(["*" if marked else "", str(t["number"]), t["state"],
                     *(["->".join(map(str, rung_path(t, t["last_step"]))) or "-"] if rungs else []),
                     *([_link(t.get("continued_from"))] if linked else []), *([_copied(t)] if pbt else []),
                     *[_fmt(t.get("params_in_force", t["params"]).get(n)) for n in names], _fmt(t["best_value"]),
                     *[_fmt(metrics.get(m)) for m in extra], _fmt(t["best_step"]),
                     _fmt(t["last_step"]), str(t["resumes"]), _lost(t.get("ledger")),
                     _interval(t.get("checkpoint_interval")),
                     "removed" if t.get("checkpoints_removed") else _age(now - mtime) if mtime else "-",
                     *([",".join(t.get("devices") or ["-"])] if devices else []),
                     *([_remote_cell(t)] if remote else [])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if highlight and best is not None:
        i = 1 + [t["number"] for t in status["trials"]].index(best)
        lines[i] = f"\x1b[1m{lines[i]}\x1b[0m"
    n_done = sum(t["state"] in ("COMPLETE", "PRUNED", "FAIL") for t in status["trials"])
    lines.insert(0, f"study {status['study']}: {n_done}/{status['n_trials']} "
                    f"{'trial' if status['n_trials'] == 1 else 'trials'} finished ({status['storage']})")
    if "objectives" in status:
        said = ", ".join(f"{o['metric']} ({o['direction']})" for o in status["objectives"])
        lines.insert(1, f"objectives: {said}; Pareto front (*): " + (", ".join(map(str, front)) or "none yet"))
    if status.get("ledger"):
        lines.append(summary_line(status["ledger"]))
    auto = [t for t in status["trials"] if t.get("checkpoint_auto")]
    if auto:  # the newest trial's: the study's latest figures
        lines.append(_auto_line(auto[-1]["number"], auto[-1]["checkpoint_auto"]))
    for steps, name in (status.get("continued") or {}).items():
        lines.append(f"continued to {steps} steps: study {name} (status --continued {steps})")
    return "\n".join(lines)


def _link(origin: dict[str, Any] | None) -> str:
    """"trial 1 of seq2seq at step 2000": the trial a continued trial goes on from."""
    if not origin:
        return "-"
    return f"trial {origin['number']} of {origin['study']} at step {origin['last_step']}"


def _copied(t: dict[str, Any]) -> str:
    """"trial 3 at 400": the member a PBT member copied at its latest exploit ("-" for none)."""
    done = [e for e in t.get("lineage") or [] if e.get("source") is not None]
    return f"trial {done[-1]['source']} at {done[-1]['step']}" if done else "-"


def _remote_cell(t: dict[str, Any]) -> str:
    """The newest step in the bucket; "local only" where a newer one is only on this disk."""
    local = newest_step(t["checkpoint_dir"]) if t["checkpoint_dir"] else None
    remote = t.get("remote_step")
    if local is not None and (remote is None or local > remote):
        return f"{_fmt(remote)} (step {local} local only)"
    return _fmt(remote)


def _lost(ledger: dict[str, float] | None) -> str:
    """Seconds lost to interruptions and their number ("12s/2"), "-" before any was recorded."""
    if not ledger:
        return "-"
    return f"{ledger['lost']:.0f}s/{int(ledger['interruptions'])}"


def _interval(interval: dict[str, float] | None) -> str:
    """The mean steps between saves, and how many saves the write budget deferred ("200", "340 (12 deferred)")."""
    if not interval:
        return "-"
    deferred = int(interval["deferred_saves"])
    return f"{interval['steps']:.0f}" + (f" ({deferred} deferred)" if deferred else "")


def _auto_line(number: int, auto: dict[str, Any]) -> str:
    """"checkpoint every: auto: 85 s (trial 3), from a save of 1 s and 3600 s between interruptions ..."."""
    mtbi = f"{auto['mtbi_seconds']:.0f} s between interruptions"
    if auto["save_seconds"] is None:
        return f"checkpoint every: auto: {auto['every_seconds']:.3g} s (trial {number}) until a save is measured; {mtbi}"
    return (f"checkpoint every: auto: {auto['every_seconds']:.3g} s (trial {number}), from a save of "
            f"{auto['save_seconds']:.3g} s and {mtbi} (sqrt(2 x save x time between), at least the write budget's)")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def file_changes(config: Config) -> list[tuple[str, Any, Any]]:
    """How the study file's trial-defining keys differ from those the study was started with
    (what `run` would refuse; [] if none), read through a session of its own: `status` shows
    the study as it ran, with this diff as a warning."""
    session = Session(config).open(create=False)
    try:
        return session.meaning_changes()
    finally:
        session.close()
