"""`plan`: what `run` would do now, worked out without training or writing anything.

Also the source of `run`'s own start-up lines (which trials it skips and resumes), so the two
always agree.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

from sweep import enqueue, fingerprint, space
from sweep.best import checkpoint_folder
from sweep.cadence import describe
from sweep.checkpoints import newest_step
from sweep.config import Config
from sweep.samplers import sampler_notes
from sweep.session import FINISHED, Session


@dataclasses.dataclass(frozen=True)
class Plan:
    exists: bool  # the study is in its storage already
    finished: dict[int, str]  # number -> COMPLETE / PRUNED / FAIL: skipped
    resume: dict[int, int | None]  # number -> newest checkpoint step (None: from step 0)
    live: list[int]  # RUNNING with a live worker elsewhere: left to it
    new: int  # trials `run` would ask Optuna for (sampled or from the file's enqueue)
    first_new: int  # the number the first new trial gets
    refused: list[tuple[str, Any, Any]]  # changed trial-defining keys: `run` exits 2
    code: dict[str, str]  # the trial module's fingerprint now
    stored_code: dict[str, str] | None  # ... and when the study ran last
    waiting: list[int] = dataclasses.field(default_factory=list)  # WAITING (enqueued): run first
    entries: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # of `new`: the file's
    # `enqueue` entries still to run, in order (they go first)

    @property
    def code_changed(self) -> bool:
        return fingerprint.code_changed(self.stored_code, self.code)

    @property
    def has_work(self) -> bool:
        return bool(self.resume or self.new or self.waiting)

    @property
    def enqueued(self) -> int:
        return len(self.entries)


def make(session: Session) -> Plan:
    """The plan of `session`'s study as its storage and checkpoint folders are now. Reads only."""
    config = session.config
    code = fingerprint.code(config)
    if not session.open_existing():
        n = config.study.n_trials
        return Plan(False, {}, {}, [], n, 0, [], code, None, entries=enqueue.pending(session)[:n])
    # States in one narrow query; whole trials (for their checkpoint folders) only of the running
    # ones: loading every trial costs seconds in a study of thousands, at every start of `run`.
    states = session.trial_states()
    running = session.running()
    live = session.live_numbers(running)
    orphans = [t.number for t in running if t.number not in live]
    remote = (session.remote_steps(orphans) or {}) if orphans else {}
    return Plan(
        exists=True,
        finished={number: state.name for number, state in sorted(states.items()) if state in FINISHED},
        resume={t.number: _newest(config, t, remote) for t in running if t.number not in live},
        live=sorted(live),
        # WAITING trials run first and then count: new ones fill up to n_trials after them.
        new=(new := max(0, config.study.n_trials - enqueue.counted(states) - len(enqueue.waiting(states)))),
        first_new=max(states, default=-1) + 1,
        refused=session.meaning_changes(),
        code=code,
        stored_code=session.stored_code(),
        waiting=enqueue.waiting(states),
        entries=enqueue.pending(session)[:new],
    )


def _newest(config: Config, trial: Any, remote: dict[int, list[int]]) -> int | None:
    """The newest step of `trial` here or in the bucket of checkpoint.remote (`remote`)."""
    folder = checkpoint_folder(config, trial)
    found = [*remote.get(trial.number, []), *([newest_step(folder)] if folder is not None else [])]
    return max((s for s in found if s is not None), default=None)


def resume_text(step: int | None) -> str:
    return f"its newest checkpoint, step {step}" if step is not None else "step 0 (no checkpoint yet)"


def code_warning(plan: Plan) -> str:
    old, new = plan.stored_code or {}, plan.code
    return (f"the trial code changed since this study last ran: {new['file']} (sha256 {old.get('sha256', '?')[:12]} "
            f"-> {new['sha256'][:12]}); the trials it runs now use the new code")


def text(config: Config, plan: Plan) -> str:
    """The plan as `python -m sweep plan` prints it."""
    head = f"study {config.name} ({config.storage})"
    if not plan.exists:
        notes = "".join(f"  note:    {note}\n" for _, note in sampler_notes(config))
        return (f"{head}: new study\n"
                f"  new:     {plan.new} trial(s), numbers 0-{plan.new - 1}, {_how(config, plan)}\n"
                + "".join(f"{line}\n" for line in _space_lines(config, plan))
                + f"{notes}  saves:   {describe(config.study.checkpoint)}\n"
                f"run would create the study and train {plan.new} trial(s)")
    if plan.refused:
        lines = "\n".join(f"  {key}: {fingerprint.show(a)} -> {fingerprint.show(b)}" for key, a, b in plan.refused)
        return (f"{head}: run would REFUSE this study file (exit 2): keys that define what its trials mean "
                f"changed:\n{lines}")
    counts = collections.Counter(plan.finished.values())
    lines = [f"{head}: {len(plan.finished)} of {config.study.n_trials} trial(s) finished"]
    if plan.finished:
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines.append(f"  skip:    trials {ranges(list(plan.finished))} ({states})")
    for number, step in sorted(plan.resume.items()):
        lines.append(f"  resume:  trial {number} from {resume_text(step)}")
    if plan.live:
        lines.append(f"  running: trials {ranges(plan.live)} (a live worker has them; left to it)")
    if plan.waiting:
        lines.append(f"  waiting: trials {ranges(plan.waiting)} (enqueued: they run first, whatever n_trials says)")
    if plan.new:
        last = plan.first_new + plan.new - 1
        numbers = f"number {last}" if plan.new == 1 else f"numbers {plan.first_new}-{last}"
        lines.append(f"  new:     {plan.new} trial(s), {numbers}, {_how(config, plan)}")
        lines += _space_lines(config, plan)
    if plan.code_changed:
        lines.append(f"  warning: {code_warning(plan)}")
    if plan.new:
        lines += [f"  note:    {note}" for _, note in sampler_notes(config)]
    if plan.has_work:
        lines.append(f"  saves:   {describe(config.study.checkpoint)}")
    started = plan.new + len(plan.waiting)
    lines.append(f"run would resume {len(plan.resume)} and start {started} trial(s)" if plan.has_work
                 else "run would do nothing: the study is finished (raise n_trials to add trials)")
    return "\n".join(lines)


def _how(config: Config, plan: Plan) -> str:
    sampled = f"sampled by {config.study.sampler.type}"
    if not plan.enqueued:
        return sampled
    rest = f", the rest {sampled}" if plan.new > plan.enqueued else ""
    return f"the first {plan.enqueued} from the file's enqueue, in order{rest}"


def _space_lines(config: Config, plan: Plan) -> list[str]:
    """The file's enqueue entries still to run, and the conditional parameters (plan's lines)."""
    lines = [f"  enqueue: {json.dumps(entry)}" for entry in plan.entries]
    search_space = config.study.search_space
    if search_space is None:
        return [*lines, f"  space:   define-by-run, {config.study.trial}.search_space(trial)"]
    for name in space.order(search_space):
        if space.conditions(search_space[name]):
            when = " and ".join(f"{parent} in {json.dumps(allowed)}"
                                for parent, allowed in space.conditions(search_space[name]).items())
            lines.append(f"  when:    {name} is sampled only when {when}")
    return lines


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    numbers = sorted(numbers)
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)
