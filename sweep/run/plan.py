"""`plan`: what `run` would do now, worked out without training or writing anything.

Also the source of `run`'s own start-up lines (which trials it skips and resumes), so the two
always agree.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

from optuna.trial import TrialState

from sweep.checkpoints import retention
from sweep.checkpoints import ram as ram_lib
from sweep.checkpoints.remote import remote_steps
from sweep.checkpoints.steps import newest_step
from sweep.schedulers import base as scheduler
from sweep.store import enqueue
from sweep.store.record import checkpoint_folder, paused_rung
from sweep.store.samplers import sampler_notes
from sweep.store.session import FINISHED, Session
from sweep.study import fingerprint, space
from sweep.study.config import Config
from sweep.study.credentials import mask_url
from sweep.train.cadence import describe
from sweep.trial import code as trial_code
from sweep.words import count, listing, numbered
from sweep.words import size as size_text


@dataclasses.dataclass(frozen=True)
class Plan:
    exists: bool  # the study is in its storage already
    finished: dict[int, str]  # number -> COMPLETE / PRUNED / FAIL: skipped
    resume: dict[int, int | None]  # number -> newest checkpoint step (None: from step 0)
    live: list[int]  # RUNNING with a live worker elsewhere: left to it
    new: int  # trials `run` would ask Optuna for (sampled or from the file's enqueue)
    first_new: int  # the number the first new trial gets
    refused: list[tuple[str, Any, Any]]  # changed trial-defining keys: `run` exits 2
    code: dict[str, Any]  # the trial module's fingerprint now
    stored_code: dict[str, Any] | None  # ... and when the study ran last
    # what the disk budget (keep_trials, max_disk) removes as `run` starts (sweep/checkpoints/retention.py)
    removals: list[retention.Removal] = dataclasses.field(default_factory=list)
    waiting: list[int] = dataclasses.field(default_factory=list)  # WAITING (enqueued): run first
    entries: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # of `new`: the file's
    # `enqueue` entries still to run, in order (they go first)
    paused: dict[int, int] = dataclasses.field(default_factory=dict)  # number -> rung (sweep/schedulers/base.py)
    next_decision: str | None = None  # the scheduler's next decision on them, where it says one

    @property
    def code_changed(self) -> bool:
        return fingerprint.code_changed(self.stored_code, self.code)

    @property
    def has_work(self) -> bool:
        return bool(self.resume or self.new or self.waiting or self.paused)

    @property
    def enqueued(self) -> int:
        return len(self.entries)


def make(session: Session, decide: bool = False) -> Plan:
    """The plan of `session`'s study as its storage and checkpoint folders are now. Reads only.
    `decide`: with the scheduler's next decision on the paused trials (`plan`'s, not `run`'s start:
    freeze_thaw fits its model for it)."""
    config = session.config
    code = fingerprint.code(config)
    if not session.open_existing():
        n = config.study.n_trials
        return Plan(False, {}, {}, [], n, 0, [], code, None, entries=enqueue.pending(session)[:n])
    # States in one narrow query; whole trials (for their checkpoint folders) only of the running
    # ones: loading every trial costs seconds in a study of thousands, at every start of `run`.
    states = session.trial_states()
    paused = {t.number: rung for t in session.trials((TrialState.WAITING,)) if (rung := paused_rung(t)) is not None}
    running = session.running()
    live = session.live_numbers(running)
    orphans = [t.number for t in running if t.number not in live]
    remote = (remote_steps(session, orphans) or {}) if orphans else {}
    for number in orphans if config.study.checkpoint.ram else ():  # a killed process's newer steps in RAM
        if (step := newest_step(ram_lib.trial_dir(session, number) or "")) is not None:
            remote.setdefault(number, []).append(step)
    return Plan(
        exists=True,
        finished={number: state.name for number, state in sorted(states.items()) if state in FINISHED},
        resume={t.number: _newest(config, t, remote) for t in running if t.number not in live},
        live=sorted(live),
        # WAITING trials run first and then count: new ones fill up to n_trials after them.
        new=(new := max(0, config.study.n_trials - enqueue.counted(states, paused)
                        - len(enqueue.waiting(states, paused)))),
        # (warm-start observations take numbers too, though they are no trials of sweep's)
        first_new=max(max(states, default=-1) + 1, session.n_trials_all()),
        refused=session.meaning_changes(),
        code=code,
        stored_code=session.stored_code(),
        removals=retention.planned(session),
        waiting=enqueue.waiting(states, paused),
        entries=enqueue.pending(session)[:new],
        paused=paused,
        next_decision=_next_decision(session, states) if paused and decide else None,
    )


def _next_decision(session: Session, states: dict[int, TrialState]) -> str | None:
    s = scheduler.of(session.config)
    # A user's scheduler may extend SchedulerKeys without base.Scheduler's default of the method.
    decide = getattr(s, "next_decision", None)
    return decide(session, states) if decide is not None else None


def _newest(config: Config, trial: Any, remote: dict[int, list[int]]) -> int | None:
    """The newest step of `trial` here or in the other tiers: the bucket of checkpoint.remote and
    the RAM tier (`remote`)."""
    folder = checkpoint_folder(config, trial)
    found = [*remote.get(trial.number, []), *([newest_step(folder)] if folder is not None else [])]
    return max((s for s in found if s is not None), default=None)


def resume_text(step: int | None) -> str:
    return f"its newest checkpoint, step {step}" if step is not None else "step 0 (no checkpoint yet)"


def code_warning(plan: Plan) -> str:
    old, new = plan.stored_code or {}, plan.code
    if old.get("code_sha256"):  # the trial module and the local modules it imports
        changed = trial_code.differences({"sha256": old["code_sha256"], "files": old.get("files", {})},
                                         {"sha256": new["code_sha256"], "files": new["files"]})
        changed = [new["file"] if name == new["module"] else name for name in changed]  # the module: its file
        return (f"the trial code changed since this study last ran: {', '.join(changed)} (sha256 "
                f"{old['code_sha256'][:12]} -> {new['code_sha256'][:12]}); the trials it runs now use the new code")
    return (f"the trial code changed since this study last ran: {new['file']} (sha256 {old.get('sha256', '?')[:12]} "
            f"-> {new['sha256'][:12]}); the trials it runs now use the new code")


def text(config: Config, plan: Plan) -> str:
    """The plan as `python -m sweep plan` prints it: a line per decision, each a sentence."""
    head = f"study {config.name} ({mask_url(config.storage)})"
    notes = [f"  note:    {note}" for _, note in sampler_notes(config)] if plan.new else []
    if not plan.exists:
        return "\n".join([f"{head}: not created yet",
                          f"  new:     {numbered('trial', range(plan.new))}, {_how(config, plan)}",
                          *_space_lines(config, plan), *notes, f"  saves:   {describe(config.study.checkpoint)}",
                          f"run would create the study and train {count(plan.new, 'trial')}"])
    if plan.refused:
        return (f"{head}: run would REFUSE this study file (exit 2): keys that define what its trials mean "
                f"changed:\n{fingerprint.diff_lines(plan.refused)}")
    lines = [f"{head}: {len(plan.finished)} of {count(config.study.n_trials, 'trial')} finished"]
    if plan.finished:
        counts = collections.Counter(plan.finished.values())
        states = ", ".join(f"{n} {state}" if len(plan.finished) > 1 else state for state, n in sorted(counts.items()))
        lines.append(f"  skip:    {numbered('trial', plan.finished)}, finished ({states})")
    for number, step in sorted(plan.resume.items()):
        lines.append(f"  resume:  trial {number} from {resume_text(step)}")
    if plan.live:
        them = "it" if len(plan.live) == 1 else "them"
        lines.append(f"  running: {numbered('trial', plan.live)} (a live worker has {them}; left to it)")
    if plan.waiting:
        they = "it runs" if len(plan.waiting) == 1 else "they run"
        lines.append(f"  waiting: {numbered('trial', plan.waiting)}, enqueued: {they} first, whatever n_trials says")
    if plan.paused:
        at = ", ".join(f"trial {n} at step {rung}" for n, rung in sorted(plan.paused.items()))
        s = scheduler.of(config)  # None: a study file edited to drop the scheduler that paused them
        note = s.plan_note() if s is not None else "by a scheduler the study file no longer names"
        lines.append(f"  paused:  {at} ({note})")
        if plan.next_decision:
            lines.append(f"  next:    {plan.next_decision}")
    if plan.new:
        lines.append(f"  new:     {numbered('trial', range(plan.first_new, plan.first_new + plan.new))}, "
                     f"{_how(config, plan)}")
        lines += _space_lines(config, plan)
    lines += [f"  remove:  {removal_text(r)}" for r in plan.removals]
    if plan.code_changed:
        lines.append(f"  warning: {code_warning(plan)}")
    lines += notes
    if plan.has_work:
        lines.append(f"  saves:   {describe(config.study.checkpoint)}")
    lines.append(f"run would {_verdict(plan)}")
    return "\n".join(lines)


def removal_text(r: retention.Removal) -> str:
    """'the checkpoints of trial 3 (steps 20 and 40, 8.1 KB), by keep_trials 2: ...'."""
    steps = f"{'step' if len(r.steps) == 1 else 'steps'} {listing(r.steps)}" if r.steps else "no committed step"
    if r.kind == "trial":
        return f"the checkpoints of trial {r.number} ({steps}, {size_text(r.bytes)}), by {r.why}"
    return f"{steps} of trial {r.number} ({size_text(r.bytes)}), by {r.why}"


def _verdict(plan: Plan) -> str:
    """What `run` would do, after 'run would'."""
    work = [part for part in (f"resume {count(len(plan.resume), 'trial')}" if plan.resume else "",
                              f"start {count(plan.new + len(plan.waiting), 'new trial')}"
                              if plan.new or plan.waiting else "",
                              # the scheduler's: each goes on or ends PRUNED (`paused:` says how)
                              f"decide on {count(len(plan.paused), 'paused trial')}" if plan.paused else "")
            if part]
    removes = ""
    if plan.removals:
        whole = [r for r in plan.removals if r.kind == "trial"]
        stripped = [r for r in plan.removals if r.kind == "steps"]
        parts = [f"the checkpoints of {count(len(whole), 'trial')}" if whole else "",
                 f"{count(sum(len(r.steps) for r in stripped), 'step')} of "
                 f"{numbered('trial', [r.number for r in stripped])}" if stripped else ""]
        removes = (f"remove {' and '.join(p for p in parts if p)} "
                   f"({size_text(sum(r.bytes for r in plan.removals))})")
    if work:
        return (f"{removes} first, then " if removes else "") + " and ".join(work)
    if removes:
        return f"{removes} and train nothing: the study is finished (raise n_trials to add trials)"
    return "do nothing: the study is finished (raise n_trials to add trials)"


def _how(config: Config, plan: Plan) -> str:
    sampled = f"sampled by {config.study.sampler.type}"
    if not plan.enqueued:
        return sampled
    rest = f", the rest {sampled}" if plan.new > plan.enqueued else ""
    return f"the first {plan.enqueued} from the file's enqueue, in order{rest}"


def _space_lines(config: Config, plan: Plan) -> list[str]:
    """The file's enqueue entries still to run, and the conditional parameters (plan's lines)."""
    lines = [f"  enqueue: {json.dumps(entry)}" for entry in plan.entries]
    if config.study.warm_start is not None:
        lines.append(f"  warm:    the COMPLETE trials of {config.study.warm_start.study} are the sampler's first "
                     "observations (added once; never trained, counted or exported)")
    search_space = config.study.search_space
    if search_space is None:
        return [*lines, f"  space:   define-by-run, {config.study.trial}.search_space(trial)"]
    for name in space.order(search_space):
        if space.conditions(search_space[name]):
            when = " and ".join(f"{parent} in {json.dumps(allowed)}"
                                for parent, allowed in space.conditions(search_space[name]).items())
            lines.append(f"  when:    {name} is sampled only when {when}")
    return lines
