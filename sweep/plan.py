"""`plan`: what `run` would do now, worked out without training or writing anything.

Also the source of `run`'s own start-up lines (which trials it skips and resumes), so the two
always agree.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from sweep import fingerprint, trial_code
from sweep.best import checkpoint_folder
from sweep.checkpoints import newest_step
from sweep.config import Config
from sweep.credentials import mask_url
from sweep.samplers import sampler_notes
from sweep.session import FINISHED, Session


@dataclasses.dataclass(frozen=True)
class Plan:
    exists: bool  # the study is in its storage already
    finished: dict[int, str]  # number -> COMPLETE / PRUNED / FAIL: skipped
    resume: dict[int, int | None]  # number -> newest checkpoint step (None: from step 0)
    live: list[int]  # RUNNING with a live worker elsewhere: left to it
    new: int  # trials `run` would ask Optuna for
    first_new: int  # the number the first new trial gets
    refused: list[tuple[str, Any, Any]]  # changed trial-defining keys: `run` exits 2
    code: dict[str, Any]  # the trial module's fingerprint now
    stored_code: dict[str, Any] | None  # ... and when the study ran last

    @property
    def code_changed(self) -> bool:
        return fingerprint.code_changed(self.stored_code, self.code)

    @property
    def has_work(self) -> bool:
        return bool(self.resume or self.new)


def make(session: Session) -> Plan:
    """The plan of `session`'s study as its storage and checkpoint folders are now. Reads only."""
    config = session.config
    code = fingerprint.code(config)
    if not session.open_existing():
        return Plan(False, {}, {}, [], config.study.n_trials, 0, [], code, None)
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
        new=max(0, config.study.n_trials - len(states)),
        first_new=max(states, default=-1) + 1,
        refused=session.meaning_changes(),
        code=code,
        stored_code=session.stored_code(),
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
    if old.get("code_sha256"):  # the trial module and the local modules it imports
        changed = trial_code.differences({"sha256": old["code_sha256"], "files": old.get("files", {})},
                                         {"sha256": new["code_sha256"], "files": new["files"]})
        changed = [new["file"] if name == new["module"] else name for name in changed]  # the module: its file
        return (f"the trial code changed since this study last ran: {', '.join(changed)} (sha256 "
                f"{old['code_sha256'][:12]} -> {new['code_sha256'][:12]}); the trials it runs now use the new code")
    return (f"the trial code changed since this study last ran: {new['file']} (sha256 {old.get('sha256', '?')[:12]} "
            f"-> {new['sha256'][:12]}); the trials it runs now use the new code")


def text(config: Config, plan: Plan) -> str:
    """The plan as `python -m sweep plan` prints it."""
    head = f"study {config.name} ({mask_url(config.storage)})"
    if not plan.exists:
        notes = "".join(f"  note:    {note}\n" for _, note in sampler_notes(config))
        return (f"{head}: new study\n"
                f"  new:     {plan.new} trial(s), numbers 0-{plan.new - 1}, sampled by {config.study.sampler.type}\n"
                f"{notes}run would create the study and train {plan.new} trial(s)")
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
    if plan.new:
        last = plan.first_new + plan.new - 1
        numbers = f"number {last}" if plan.new == 1 else f"numbers {plan.first_new}-{last}"
        lines.append(f"  new:     {plan.new} trial(s), {numbers}, sampled by {config.study.sampler.type}")
    if plan.code_changed:
        lines.append(f"  warning: {code_warning(plan)}")
    if plan.new:
        lines += [f"  note:    {note}" for _, note in sampler_notes(config)]
    lines.append(f"run would resume {len(plan.resume)} and start {plan.new} trial(s)" if plan.has_work
                 else "run would do nothing: the study is finished (raise n_trials to add trials)")
    return "\n".join(lines)


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
