"""What a user sees in optuna-dashboard: each trial's story as its note (Markdown: state, params,
best step, rungs and promotions, PBT exploits, devices, resumes, failures, the goodput ledger),
every metric's curves as a figure on the study's page, a note for the study, and the objectives'
names.

All of it is study system attributes in optuna-dashboard's layout (sweep/internals.py), written
by the process that ends a trial's run, once per end, before the trial is told (or paused): a kill
that cuts a write short leaves the trial unfinished, and its next run writes the note whole. A
note is sweep's record, rewritten at each end (an edit made in the dashboard is replaced then).
Nothing here is read back by sweep, and a write that fails is a warning, never the trial's fault.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState

from sweep import internals
from sweep.store import record
from sweep.store.session import Session
from sweep.study.config import Config
from sweep.train import ledger as ledger_lib
from sweep.words import count, listing

log = logging.getLogger("sweep")
FIGURE_ID = "sweep-curves"  # the figure's id: each write replaces it
# A trial's end writes the figure again at most this often per process (it reads every trial's
# curves); the end of a run always writes it.
FIGURE_EVERY_S = 60.0
STUDY_FIGURE_MAX_TRIALS = 1000  # the study figure and note up to this many trials (see _write_study)
# The figure's colours, one per trial number (plotly's own qualitative palette), so that a trial
# has one colour in every metric's panel.
PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880",
           "#ff97ff", "#fecb52")


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _params(trial: FrozenTrial) -> list[str]:
    in_force = record.params_in_force(trial)
    rows = ["| param | value |", "|---|---|"]
    rows += [f"| {k} | {_num(v)} |" for k, v in sorted(in_force.items())]
    if in_force != trial.params:
        rows.append(f"\nSampled before its exploits: {', '.join(f'{k}={_num(v)}' for k, v in trial.params.items())}")
    return rows


def _best(config: Config, trial: FrozenTrial) -> list[str]:
    metric = config.study.objective.metric
    attrs = trial.user_attrs
    if record.BEST_STEP not in attrs:
        best = record.best_of_reports(record.counted_reports(trial, metric), config.study.objective.direction)
        if best is None:
            return ["No evaluation yet."]
        step, value = best
    else:
        step, value = int(attrs[record.BEST_STEP]), attrs[record.BEST_VALUE]
    lines = [f"Best **{metric}** = {_num(value)} at step **{step}** (best step)"
             + (f", last step {attrs[record.LAST_STEP]}" if record.LAST_STEP in attrs else "") + "."]
    found = record.metrics_at(trial, step, metric)
    if found and len(found) > 1:
        lines.append("At the best step: " + ", ".join(f"{k} {_num(v)}" for k, v in found.items()) + ".")
    return lines


def _rungs(config: Config, trial: FrozenTrial, state: str) -> list[str]:
    """The path of a trial that paused: each pause, each promotion, where it ended."""
    paused = [int(s) for s in trial.user_attrs.get(record.PAUSED_AT, [])]
    scheduler = config.study.scheduler
    if not paused or scheduler is None:
        return []
    word = getattr(scheduler, "pause_word", "rung")
    path = ["0"] + [f"{s} (paused)" for s in paused]
    waits = state == "PAUSED" or (state == "PRUNED" and _ended_paused(trial))
    if waits:
        end = f"promoted {count(len(paused) - 1, 'time')}; " + (
            f"waits at {word} {paused[-1]} for a promotion (it ends PRUNED there if none comes)" if state == "PAUSED"
            else f"not promoted from {word} {paused[-1]}")
    else:
        path.append(f"{trial.user_attrs.get(record.LAST_STEP, '?')} ({state})")
        end = f"promoted {count(len(paused), 'time')}"
    return [f"**Path** ({scheduler.type}, paused at {word}s {listing(paused)}): {' → '.join(path)}; {end}."]


def _ended_paused(trial: FrozenTrial) -> bool:
    """A PRUNED trial that ended at its last pause (never promoted from it)."""
    paused = trial.user_attrs.get(record.PAUSED_AT, [])
    return bool(paused) and trial.user_attrs.get(record.LAST_STEP) == paused[-1]


def _exploits(trial: FrozenTrial) -> list[str]:
    lineage = trial.user_attrs.get(record.LINEAGE, [])
    if not lineage:
        return []
    lines = ["**Exploits** (pbt):", ""]
    for e in lineage:
        if e.get("source") is None:
            lines.append(f"- step {e['step']}: every donor's checkpoint was damaged; went on with its own")
            continue
        changed = ", ".join(f"{k} {_num(e['old_params'].get(k))} → {_num(v)}" for k, v in e["new_params"].items()
                            if e["old_params"].get(k) != v)
        lines.append(f"- step {e['step']}: took trial {e['source']}'s step {e['source_step']} "
                     f"(value {_num(e.get('old_value'))} → {_num(e.get('source_value'))}); {changed or 'same params'}")
    return lines


def _runs(trial: FrozenTrial) -> list[str]:
    """Devices, resumes, failures, compiles, the ledger: where and how its runs went."""
    attrs, lines = trial.user_attrs, []
    if attrs.get(record.DEVICES):
        lines.append(f"- **Devices** (latest run): {', '.join(attrs[record.DEVICES])}.")
    if attrs.get(record.RESUMES):
        lines.append(f"- **Interruptions**: {attrs[record.RESUMES]} (runs that ended without finishing it).")
    if attrs.get(record.RESUMED_FROM):
        lines.append(f"- **Resumed** from its checkpoint at step {listing(attrs[record.RESUMED_FROM])} (after an "
                     "interruption or a retry each; promotions are in its path).")
    if attrs.get(record.FAILURES):
        lines.append(f"- **Failures**: {attrs[record.FAILURES]}; last error: `{attrs.get(record.ERROR, '')}`.")
    if attrs.get(record.CONTINUED_FROM):
        c = attrs[record.CONTINUED_FROM]
        lines.append(f"- **Continues** trial {c.get('number')} of study {c.get('study')} from step {c.get('last_step')}.")
    compiles = attrs.get(record.COMPILES_ATTR)
    if compiles:
        lines.append(f"- **Compiled**: {count(int(compiles.get('compilations', 0)), 'XLA compilation')}, "
                     f"{compiles.get('compile_seconds', 0)} s ({int(compiles.get('cache_hits', 0))} from the cache).")
    ledger = ledger_lib.of_trial(attrs)
    if ledger:
        lines.append(f"- **Ledger**: {ledger_lib.summary_line(ledger)}; {count(int(ledger.get('saves', 0)), 'save')}.")
    if attrs.get(record.CHECKPOINT_DIR):
        lines.append(f"- **Checkpoints**: `{attrs[record.CHECKPOINT_DIR]}`.")
    return lines


def heading(number: int, state: str) -> str:
    return f"## Trial {number}: {state}"


def trial_note(config: Config, trial: FrozenTrial, state: str) -> str:
    """Trial `trial`'s note: `state` is where its run ended (COMPLETE, PRUNED, FAIL or PAUSED),
    the trial's own state where it is not told yet."""
    parts = [[heading(trial.number, state)], _best(config, trial), _params(trial),
             _rungs(config, trial, state), _exploits(trial), _runs(trial),
             [f"Curves of every metric: the study's figure *{FIGURE_ID}*. Written by sweep when this trial's "
              "run ended; rewritten at its next end."]]
    return "\n\n".join("\n".join(p) for p in parts if p)


def study_note(config: Config, trials: Sequence[FrozenTrial]) -> str:
    """The study's note: its objectives, scheduler, trials by state, the best one."""
    study = config.study
    states = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    lines = [f"## {config.name}",
             "Objective: " + ", ".join(f"**{o.metric}** ({o.direction})" for o in study.all_objectives) + ".",
             f"Trials: {study.n_trials} asked for; " + (", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                                                          or "none yet") + ".",
             f"Scheduler: {study.scheduler.type if study.scheduler is not None else 'none'}; "
             f"{count(study.train.steps, 'step')} a trial, evaluated every {study.train.eval_every}."]
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    if done and not study.multi_objective:
        best = min(done, key=lambda t: (study.objective.sign * t.values[0], t.number))
        lines.append(f"Best: trial {best.number}, {study.objective.metric} = {_num(best.values[0])} "
                     f"at step {best.user_attrs.get(record.BEST_STEP)}.")
    lines.append(f"Each trial's note tells its story; the figure *{FIGURE_ID}* has every metric's curves. "
                 "Written by sweep as its runs end.")
    return "\n\n".join(lines)


def curves_figure(config: Config, trials: Sequence[FrozenTrial]) -> dict[str, Any]:
    """A plotly figure (as its JSON object) of every metric's curves: one line per trial (one colour
    per trial), one metric shown at a time, chosen by the buttons above it (the dashboard draws a
    figure in a card of fixed height: stacked panels would not fit). A trial's curve is its
    `eval:<step>` records, else its reports (the objective only). Each line's `meta` is its metric."""
    objective = config.study.objective.metric
    curves = {t.number: record.history(t) or {s: {objective: v} for s, v in t.intermediate_values.items()}
              for t in trials}
    names = {m for h in curves.values() for row in h.values() for m in row}
    metrics = sorted(names, key=lambda m: (m != objective, m == record.TRAIN_LOSS, m))
    data = []
    for metric in metrics:
        for number, h in sorted(curves.items()):
            steps = sorted(s for s, row in h.items() if metric in row)
            if steps:
                data.append({"type": "scatter", "mode": "lines+markers", "name": f"trial {number}", "meta": metric,
                             "visible": metric == metrics[0], "line": {"color": PALETTE[number % len(PALETTE)]},
                             "marker": {"size": 4}, "x": steps, "y": [h[s][metric] for s in steps],
                             "hovertemplate": f"trial {number}<br>step %{{x}}<br>{metric} %{{y}}<extra></extra>"})
    buttons = [{"label": metric, "method": "update",
                "args": [{"visible": [d["meta"] == metric for d in data]}, {"yaxis.title.text": metric}]}
               for metric in metrics]
    layout = {"xaxis": {"title": {"text": "step"}},  # no title: the buttons name the metrics
              "yaxis": {"title": {"text": metrics[0] if metrics else objective}},
              "legend": {"title": {"text": "trial"}}, "hovermode": "closest", "margin": {"t": 60},
              "updatemenus": [{"type": "buttons", "direction": "right", "buttons": buttons, "showactive": True,
                               "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}] if len(metrics) > 1 else []}
    return {"data": data, "layout": layout}


class Dashboard:
    """The dashboard's notes and figure, written by one worker: a trial's note as its run ends, the
    figure then (at most every FIGURE_EVERY_S) and as the run ends, the objectives' names once."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._figure_at = time.monotonic()  # this process's last figure (or its start)
        self._warned: set[str] = set()  # what failed here already: a storage that refuses is said once

    def _tolerant(self, kind: str, what: str, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - what the dashboard shows: never a trial's or the run's fault
            said = kind in self._warned
            self._warned.add(kind)
            (log.debug if said else log.warning)("optuna-dashboard: %s not written (%s: %s); the next ones are not "
                                                 "said", what, type(exc).__name__, exc)

    def started(self) -> None:
        """The run starts: name the objectives (Optuna's metric names, which the dashboard shows)."""
        self._tolerant("names", "the objectives' names", self._name_objectives)

    def trial_ended(self, number: int, state: str) -> None:
        """Trial `number`'s run ended `state` here; its record is written, the tell (or pause) comes next."""
        self._tolerant("note", f"trial {number}'s note", lambda: self._write_note(number, state))
        if time.monotonic() - self._figure_at >= FIGURE_EVERY_S:
            self.run_ended()

    def run_ended(self) -> None:
        """The run's trials are done: the study's figure and note from every trial now, and the
        notes that are missing or say another state than their trial's (see `_stale`)."""
        self._figure_at = time.monotonic()
        self._tolerant("study", "the study's figure and notes", self._write_study)

    def _name_objectives(self) -> None:
        study, names = self.session.study, [o.metric for o in self.session.config.study.all_objectives]
        if study.metric_names != names:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning: set_metric_names since Optuna 3.2
                study.set_metric_names(names)

    def _write_note(self, number: int, state: str) -> None:
        session = self.session
        trial = session.trial(number)
        body, trial_id = trial_note(session.config, trial, state), internals.trial_id(trial)
        # Its own rows only: Optuna's reader would load every note of the study at every trial's end.
        stored = session.study_system_attrs(f"dashboard:{trial_id}:")
        session.set_study_system_attrs(internals.dashboard_note_attrs(stored, trial_id, body))

    def _write_study(self) -> None:
        session, config = self.session, self.session.config
        if session.n_trials_all() > STUDY_FIGURE_MAX_TRIALS:
            # Every trial's record (seconds per thousand trials) and a figure of every curve, each
            # minute: a big study keeps its trials' notes, without the study's figure and note.
            log.debug("optuna-dashboard: no study figure or note for more than %d trials", STUDY_FIGURE_MAX_TRIALS)
            return
        trials = session.trials()
        figure = json.dumps(curves_figure(config, trials), separators=(",", ":"))
        stored = session.study_system_attrs()
        notes: dict[str, Any] = {}
        for trial, state in _stale(trials, stored):
            notes.update(internals.dashboard_note_attrs(stored, internals.trial_id(trial),
                                                        trial_note(config, trial, state)))
        session.set_study_system_attrs({**internals.dashboard_figure_attrs(stored, FIGURE_ID, figure), **notes,
                                        **internals.dashboard_note_attrs(stored, None, study_note(config, trials))})


def _stale(trials: Sequence[FrozenTrial], stored: Mapping[str, Any]) -> list[tuple[FrozenTrial, str]]:
    """(trial, state) of the finished or paused trials whose note is missing (a study run before
    sweep wrote them) or whose heading says another state: a paused trial that the scheduler ended
    PRUNED once nothing was left to start. A note edited in the dashboard that keeps its heading stays."""
    found = []
    for t in trials:
        state = "PAUSED" if record.paused_rung(t) is not None else t.state.name
        if t.state.is_finished() or state == "PAUSED":
            note = internals.dashboard_note(stored, internals.trial_id(t))
            if note is None or (note.startswith("## Trial ") and not note.startswith(heading(t.number, state) + "\n")):
                found.append((t, state))
    return found

