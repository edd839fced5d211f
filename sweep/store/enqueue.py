"""Enqueued trials run first: Optuna's own WAITING trials (`study.enqueue_trial`) and the study
file's `enqueue` entries, each exactly once, whatever kills the run in between.

A file entry becomes a trial in one storage write (Optuna's `enqueue_trial` creates the WAITING
trial with its params and its `enqueue_index` user attribute together) and is popped by the
`ask` right after, under the study's ask lock. A kill between the two leaves a WAITING trial,
which the next run pops first; an entry whose index a trial holds is never enqueued again.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import optuna
from optuna.trial import TrialState

from sweep.store.session import Session

INDEX_ATTR = "enqueue_index"  # trial user attribute: the position of its entry in the file's `enqueue`


def counted(states: Mapping[int, TrialState], paused: Collection[int] = ()) -> int:
    """Trials that count toward n_trials before new ones are asked: all but the enqueued WAITING
    ones (those run whatever n_trials says: an enqueued trial must never be left behind). The
    `paused` trials (WAITING too, sweep/schedulers/asha.py) were started: they count."""
    return sum(1 for n, s in states.items() if s != TrialState.WAITING or n in paused)


def waiting(states: Mapping[int, TrialState], paused: Collection[int] = ()) -> list[int]:
    """The enqueued WAITING trials (not the `paused` ones)."""
    return sorted(n for n, s in states.items() if s == TrialState.WAITING and n not in paused)


def ask(session: Session, states: Mapping[int, TrialState], paused: Collection[int] = ()) -> optuna.Trial | None:
    """Under the ask lock: the oldest enqueued WAITING trial (never a `paused` one), else the study
    file's next `enqueue` entry while fewer than n_trials trials count, else None (ask a sampled one)."""
    if waiting(states, paused):
        return session.ask()
    index = next_index(session)
    if index is None or counted(states, paused) >= session.config.study.n_trials:
        return None
    session.study.enqueue_trial(dict(session.config.study.enqueue[index]), user_attrs={INDEX_ATTR: index})
    return session.ask()


def next_index(session: Session) -> int | None:
    """The position of the file's first entry no trial holds yet (entries go in order), or None."""
    entries = session.config.study.enqueue
    if not entries or session.enqueue_done:
        return None
    # Every trial, read while entries remain (then remembered: entries are never enqueued again).
    taken = {t.user_attrs.get(INDEX_ATTR) for t in session.trials()}
    index = next((i for i in range(len(entries)) if i not in taken), None)
    if index is None:
        session.all_enqueued()
    return index


def pending(session: Session) -> list[dict[str, Any]]:
    """The file's entries still to be enqueued (for plan)."""
    index = next_index(session) if session.is_open else 0
    return [] if index is None else list(session.config.study.enqueue[index:])
