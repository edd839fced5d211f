"""Make docs/schedulers.png from two real runs of the example trial: learning curves under
`scheduler: asha` (pauses at rungs, promotions) and under `scheduler: pbt` (exploit jumps).

    .venv/bin/python docs/make_scheduler_figure.py

Each study runs with `python -m sweep run` in a temporary workdir; the curves are read back from
Optuna's storage: a trial's intermediate values, its `paused_at` and `resumed_from` (asha), its
`lineage` (pbt: where the value at an exploit step was its own before the copy).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

REPO = Path(__file__).resolve().parents[1]
BASE: dict[str, Any] = {
    "trial": "trials.digits_mlp", "objective": {"metric": "val_loss", "direction": "minimize"},
    "sampler": {"type": "random", "seed": 1}, "pruner": {"type": "none"},
    "search_space": {"learning_rate": {"type": "float", "low": 3.0e-4, "high": 3.0e-2, "log": True}},
    "fixed": {"batch_size": 32, "hidden": 32, "optimizer": "sgd"},
    "checkpoint": {"every_steps": 100, "keep_last": 1, "keep_best": 1, "max_write_share": None},
}
STUDIES = {
    "asha": {"name": "fig-asha", "n_trials": 12, "train": {"steps": 1800, "eval_every": 50},
             "scheduler": {"type": "asha", "min_steps": 200, "reduction_factor": 3}},
    "pbt": {"name": "fig-pbt", "n_trials": 6, "train": {"steps": 1800, "eval_every": 50},
            "scheduler": {"type": "pbt", "population": 6, "interval_steps": 300, "quantile": 0.34}},
}


def run(folder: Path, study: dict[str, Any]) -> list[optuna.trial.FrozenTrial]:
    data = {**BASE, **study, "workdir": str(folder / study["name"])}
    path = folder / f"{study['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    subprocess.run([sys.executable, "-m", "sweep", "run", str(path), "--quiet"], check=True, cwd=REPO)
    storage = f"sqlite:///{folder / study['name'] / 'study.db'}"
    return optuna.load_study(study_name=study["name"], storage=storage).get_trials()


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory(prefix="sweep-fig-") as tmp:
        asha = run(Path(tmp), STUDIES["asha"])
        pbt = run(Path(tmp), STUDIES["pbt"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, t in enumerate(sorted(asha, key=lambda t: t.number)):
        c = colors[i % len(colors)]
        steps = sorted(t.intermediate_values)
        left.plot(steps, [t.intermediate_values[s] for s in steps], color=c, lw=1.2)
        resumed = set(t.user_attrs.get("resumed_from", []))
        for rung in t.user_attrs.get("paused_at", []):
            v = t.intermediate_values[rung]
            left.plot([rung], [v], marker="^" if rung in resumed else "o", color=c, ms=7,
                      mfc=c if rung in resumed else "white")
    left.set_title("scheduler: asha (rungs 200, 600; o paused, ^ promoted later)")
    for i, t in enumerate(sorted(pbt, key=lambda t: t.number)):
        c = colors[i % len(colors)]
        values = dict(t.intermediate_values)
        jumps = [e for e in t.user_attrs.get("lineage", []) if e.get("source") is not None]
        for e in jumps:  # before the copy, the value at the step was its own
            values[e["step"]] = e["old_value"]
        edges = [0, *[e["step"] for e in jumps], max(values) + 1]
        for a, b in zip(edges, edges[1:]):
            # its own value up to and at the exploit step, the donor's from there on
            seg = sorted(s for s in values if a <= s <= b)
            ys = [next(e["source_value"] for e in jumps if e["step"] == a) if s == a and a > 0 else values[s]
                  for s in seg]
            right.plot(seg, ys, color=c, lw=1.2, label=f"trial {t.number}" if a == 0 else None)
        for e in jumps:
            right.annotate("", xy=(e["step"], e["source_value"]), xytext=(e["step"], e["old_value"]),
                           arrowprops={"arrowstyle": "->", "color": c, "lw": 1.2, "ls": "--"})
    right.set_title("scheduler: pbt (population 6, every 300 steps; dashed: exploit jumps)")
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    left.set_ylabel("val_loss")
    right.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    out = REPO / "docs" / "schedulers.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
