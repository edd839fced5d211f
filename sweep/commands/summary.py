"""The end-of-run summary printed by `run`."""

from __future__ import annotations

from typing import Any, Mapping

from optuna.trial import TrialState

from sweep.commands.best import best_test_metrics
from sweep.store.record import COMPILES_ATTR, ERROR, LEDGER, RESUMES, checkpoint_folder, params_in_force
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.train.ledger import of_trial, study_total, summary_line
from sweep.words import count


def text(session: Session) -> str:
    """The summary of an open session. Scores the best checkpoint on the test split once (cached
    on the study as a user attribute: the one write here)."""
    config = session.config
    states = list(session.trial_states().values())
    counts = {s: states.count(s) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    finished = sum(counts.values())
    lines = [f"study {config.name}: {finished}/{config.study.n_trials} "
             f"{'trial' if config.study.n_trials == 1 else 'trials'} finished "
             f"({counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
             f"{counts[TrialState.FAIL]} failed)"]
    # Three attributes of each trial, in one narrow query (not every trial's whole record).
    attrs = list(session.trial_attrs(COMPILES_ATTR, LEDGER, RESUMES).values())
    compiles = _compiles(attrs)
    if compiles:
        lines.append(compiles)
    ledger = study_total(of_trial(a) for a in attrs)
    if ledger:
        lines.append(summary_line(ledger))
    best = session.best_trial()
    if best is None:
        complete = TrialState.COMPLETE in session.trial_states().values()
        infeasible = "no feasible trial: every COMPLETE trial breaks a constraint (status: feasible)"
        lines.append(infeasible if complete else no_complete_trial(session) or "no trial completed yet")
        return "\n".join(lines)
    metric = config.study.objective.metric
    if config.study.multi_objective:
        front = session.pareto_numbers()
        names = [o.metric for o in config.study.all_objectives]
        lines.append(f"Pareto front ({', '.join(names)}): {count(len(front), 'trial')}: {', '.join(map(str, front))}")
        values = ", ".join(f"{m}={v!r}" for m, v in zip(names, best.values))
        lines.append(f"best trial by {metric} (on the front): {best.number}  {values} at step "
                     f"{best.user_attrs.get('best_step')}")
    else:
        lines.append(f"best trial: {best.number}  {metric}={best.value!r} at step {best.user_attrs.get('best_step')}")
    in_force = params_in_force(best)  # a PBT member's after its latest exploit (sweep/schedulers/pbt.py)
    lines.append(f"params: {best.params}" if in_force == best.params else
                 f"params: {in_force} (sampled: {best.params}; see its lineage in status --json)")
    lines.append(f"checkpoints: {checkpoint_folder(config, best)}")
    test = best_test_metrics(session)
    if test is not None:
        scores = ", ".join(f"{k}={v!r}" for k, v in sorted(test["metrics"].items()))
        lines.append(f"test (trial {test['trial']}, best checkpoint step {test['step']}): {scores}")
    return "\n".join(lines)


def no_complete_trial(session: Session) -> str | None:
    """"no trial completed: N failed, M pruned" and the most common failure, when the study has
    finished trials but none COMPLETE; None otherwise (there is a COMPLETE trial, or none finished)."""
    import collections

    states = collections.Counter(session.trial_states().values())
    if states[TrialState.COMPLETE] or not (states[TrialState.FAIL] or states[TrialState.PRUNED]):
        return None
    line = f"no trial completed: {states[TrialState.FAIL]} failed, {states[TrialState.PRUNED]} pruned"
    # Grouped by exception type (messages name their trial); the first trial's message shown.
    errors = [t.user_attrs[ERROR] for t in session.trials((TrialState.FAIL,)) if ERROR in t.user_attrs]
    kinds = collections.Counter(e.partition(":")[0] for e in errors)
    if kinds:
        kind, n = kinds.most_common(1)[0]
        example = next(e for e in errors if e.partition(":")[0] == kind)
        line += f"; most common failure ({n} of {states[TrialState.FAIL]}): {example}"
    return line


def _compiles(attrs: list[Mapping[str, Any]]) -> str | None:
    """What the study's trials compiled, summed over their runs (None before any was recorded);
    `attrs`: each trial's user attributes."""
    counts = [a[COMPILES_ATTR] for a in attrs if a.get(COMPILES_ATTR)]
    if not counts:
        return None
    total = {k: sum(c.get(k, 0) for c in counts) for k in ("compilations", "cache_hits", "compile_seconds")}
    return (f"compilation: {count(total['compilations'], 'XLA compilation')} in {total['compile_seconds']:.1f} s, "
            f"{count(total['cache_hits'], 'executable')} from the persistent cache, over {count(len(counts), 'trial')}")


def incomplete(config: Config) -> str | None:
    """Why the study has no COMPLETE trial (`no_complete_trial`, else "no trial completed"), or None
    when it has one: `run`'s exit 1 (docs/reference.md, exit codes). Reads through a session of its own."""
    session = Session(config).open(create=False)
    try:
        if TrialState.COMPLETE in session.trial_states().values():
            return None
        return no_complete_trial(session) or "no trial completed"
    finally:
        session.close()
