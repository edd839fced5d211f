"""The end-of-run summary printed by `run`."""

from __future__ import annotations

from optuna.trial import TrialState

from sweep.best import best_test_metrics, checkpoint_folder
from sweep.session import Session


def text(session: Session) -> str:
    """The summary of an open session. Scores the best checkpoint on the test split once (cached
    on the study as a user attribute: the one write here)."""
    config = session.config
    states = list(session.trial_states().values())
    counts = {s: states.count(s) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    finished = sum(counts.values())
    lines = [f"study {config.name}: {finished}/{config.study.n_trials} trials finished "
             f"({counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
             f"{counts[TrialState.FAIL]} failed)"]
    best = session.best_trial()
    if best is None:
        lines.append("no trial completed yet")
        return "\n".join(lines)
    metric = config.study.objective.metric
    lines.append(f"best trial: {best.number}  {metric}={best.value!r} at step {best.user_attrs.get('best_step')}")
    lines.append(f"params: {best.params}")
    lines.append(f"checkpoints: {checkpoint_folder(config, best)}")
    test = best_test_metrics(session)
    if test is not None:
        scores = ", ".join(f"{k}={v!r}" for k, v in sorted(test["metrics"].items()))
        lines.append(f"test (trial {test['trial']}, best checkpoint step {test['step']}): {scores}")
    return "\n".join(lines)
