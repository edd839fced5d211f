"""`plot`: pictures of a study (Optuna's own plots) and of every trial's learning curve, as HTML and PNG.

The study-level figures are `optuna.visualization` (plotly, HTML) and
`optuna.visualization.matplotlib` (PNG) unchanged. The learning curve of a trial is drawn here
because no library knows where its checkpoints and resumes are: markers at the kept checkpoints
(the step folders on disk), the best step and each step a run resumed from.
"""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweep.checkpoints.remote import remote_steps
from sweep.checkpoints.steps import kept_steps
from sweep.errors import SweepError
from sweep.store.record import BEST_STEP, RESUMED_FROM, best_of_reports, checkpoint_folder, history, reports
from sweep.store.session import Session
from sweep.study.config import Config

log = logging.getLogger("sweep")


def plot(session: Session, out: Path) -> list[Path]:
    """Write the study's figures and every trial's learning curve under `out`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    config = session.open(create=False).config
    study = session.study
    trials = [_with_reports(config, t) for t in session.trials()]
    trials = [t for t in trials if t.intermediate_values or t.state == TrialState.COMPLETE]
    if not trials:
        raise SweepError(f"study {config.name!r} has no trial with a report yet; nothing to plot")
    out.mkdir(parents=True, exist_ok=True)
    written = _study_figures(study, out, config)
    remote = remote_steps(session, (t.number for t in trials)) or {}  # checkpoints kept in the bucket
    for t in sorted(trials, key=lambda t: t.number):
        if t.intermediate_values:
            written += _learning_curve(config, t, out / "curves", remote.get(t.number, []))
    return written


def _with_reports(config: Config, t: FrozenTrial) -> FrozenTrial:
    """`t`, or for a multi-objective trial (it reports nothing to Optuna) a copy whose intermediate
    values are the first objective's `eval:<step>` records: its learning curve."""
    if not config.study.multi_objective or t.intermediate_values:
        return t
    shown = copy.copy(t)  # shallow: the storage's trial itself is shared (Session.trials)
    shown.intermediate_values = reports(t, config.study.objective.metric)
    return shown


def _study_figures(study: optuna.Study, out: Path, config: Config) -> list[Path]:
    import functools

    from optuna import visualization as vis
    from optuna.visualization import matplotlib as vis_mpl

    figures: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
        ("optimization_history", vis.plot_optimization_history, vis_mpl.plot_optimization_history),
        ("intermediate_values", vis.plot_intermediate_values, vis_mpl.plot_intermediate_values),
        ("param_importances", vis.plot_param_importances, vis_mpl.plot_param_importances),
        ("parallel_coordinate", vis.plot_parallel_coordinate, vis_mpl.plot_parallel_coordinate),
    ]
    if config.study.multi_objective:
        # Several objectives: Optuna's Pareto-front figure, and the others of the first objective
        # (they take one target; nothing is reported per step, so no intermediate values).
        first = {"target": lambda t: t.values[0], "target_name": config.study.objective.metric}
        names = [o.metric for o in config.study.all_objectives]
        one_target = [(name, functools.partial(html, **first), functools.partial(png, **first))
                      for name, html, png in figures if name != "intermediate_values"]
        figures = [("pareto_front", functools.partial(vis.plot_pareto_front, target_names=names),
                    functools.partial(vis_mpl.plot_pareto_front, target_names=names)), *one_target]
    written = []
    for name, html_fn, png_fn in figures:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                # Given a target (several objectives), Optuna warns that importances are of low values.
                warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator")
                fig = html_fn(study)
                ax = png_fn(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            # Parameter importances need two complete trials with different params, for one.
            log.warning("plot: %s skipped: %s", name, exc)
            continue
        written.append(_write_html(fig, out / f"{name}.html"))
        figure = _figure_of(ax)
        if name == "parallel_coordinate":
            _readable_axes(figure)
        written.append(_save_png(figure, out / f"{name}.png"))
    return written


def _readable_axes(figure: Any) -> None:
    """Optuna's parallel-coordinates PNG puts one axis label per parameter at a fixed width: from
    about six parameters on they overlap. Widen the figure with their number, slant the labels."""
    n_axes = max((len(ax.get_xticks()) for ax in figure.axes), default=0)
    if n_axes > 5:
        width, height = figure.get_size_inches()
        figure.set_size_inches(max(width, 1.3 * n_axes), height)
        for ax in figure.axes:
            for label in ax.get_xticklabels():
                label.set_rotation(30)
                label.set_horizontalalignment("right")


def _figure_of(ax: Any) -> Any:
    first = ax.flat[0] if hasattr(ax, "flat") else ax
    return first.figure


def _write_html(fig: Any, path: Path) -> Path:
    # "directory": one plotly.min.js beside the files, so they open offline and stay small.
    fig.write_html(str(path), include_plotlyjs="directory")
    return path


def _save_png(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def markers(config: Config, t: FrozenTrial, remote: Sequence[int] = ()) -> dict[str, list[int]]:
    """Steps to mark on a trial's curve: kept checkpoints (here or in the bucket: `remote`), the best
    step, the steps runs resumed from."""
    reports = t.intermediate_values
    best = t.user_attrs.get(BEST_STEP)
    if best is None:
        best = (best_of_reports(reports, config.study.objective.direction) or (None, None))[0]
    ckpt_dir = checkpoint_folder(config, t)
    return {
        "checkpoint": sorted(s for s in {*(kept_steps(ckpt_dir) if ckpt_dir else []), *remote} if s in reports),
        "best": [best] if best is not None else [],
        # At the exact step a run resumed from, an evaluation step or not (its y is interpolated).
        "resumed": sorted({int(s) for s in t.user_attrs.get(RESUMED_FROM, [])}) if reports else [],
    }


def value_at(t: FrozenTrial, step: int) -> float:
    """The objective at `step`: the report there, else interpolated between the nearest reports."""
    import numpy as np

    if step in t.intermediate_values:
        return t.intermediate_values[step]
    steps = sorted(t.intermediate_values)
    return float(np.interp(step, steps, [t.intermediate_values[s] for s in steps]))


def _learning_curve(config: Config, t: FrozenTrial, out: Path, remote: Sequence[int]) -> list[Path]:
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    out.mkdir(parents=True, exist_ok=True)
    metric = config.study.objective.metric
    steps = sorted(t.intermediate_values)
    values = [t.intermediate_values[s] for s in steps]
    marks = markers(config, t, remote)
    title = f"trial {t.number} ({t.state.name.lower()}): {metric} per step"
    styles = {"checkpoint": ("s", "tab:green", "kept checkpoint"), "best": ("*", "tab:red", "best step"),
              "resumed": ("v", "tab:purple", "resumed from")}

    kept = history(t)  # every metric per evaluation; the training loss beside the validation curve
    train_steps = [s for s in sorted(kept) if "train_loss" in kept[s]]
    train_loss = [kept[s]["train_loss"] for s in train_steps]
    with plt.style.context("ggplot"):  # the style of Optuna's matplotlib figures beside it
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.plot(steps, values, color="tab:blue", lw=1.5, label=metric)
        if train_steps:
            ax.plot(train_steps, train_loss, color="tab:orange", lw=1.2, ls="--", label="train_loss (mean)")
        for kind, at in marks.items():
            marker, color, label = styles[kind]
            if at:
                ax.scatter(at, [value_at(t, s) for s in at], marker=marker, color=color,
                           s=90 if kind == "best" else 50, zorder=3, label=f"{label} ({', '.join(map(str, at))})")
            if kind == "resumed":
                for s in at:
                    ax.axvline(s, color=color, ls=":", lw=1)
        ax.set(title=title, xlabel="step", ylabel=metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        png = _save_png(fig, out / f"trial_{t.number:04d}.png")

    figure = go.Figure(go.Scatter(x=steps, y=values, mode="lines", name=metric))
    for name in sorted({k for m in kept.values() for k in m} - {metric}):  # every other metric, togglable
        at = [s for s in sorted(kept) if name in kept[s]]
        figure.add_trace(go.Scatter(x=at, y=[kept[s][name] for s in at], mode="lines", name=name,
                                    visible=True if name == "train_loss" else "legendonly"))
    for kind, at in marks.items():
        marker, color, label = styles[kind]
        symbol = {"s": "square", "*": "star", "v": "triangle-down"}[marker]
        figure.add_trace(go.Scatter(x=at, y=[value_at(t, s) for s in at], mode="markers", name=label,
                                    marker={"symbol": symbol, "size": 12, "color": color.removeprefix("tab:")}))
    figure.update_layout(title=title, xaxis_title="step", yaxis_title=metric)
    html = _write_html(figure, out / f"trial_{t.number:04d}.html")
    return [png, html]
