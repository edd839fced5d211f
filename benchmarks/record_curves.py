"""Record full-length learning curves with sweep itself, for the scheduler simulator (issue 40).

    .venv/bin/python benchmarks/record_curves.py benchmarks/curves/digits_mlp.yaml --n-jobs 2

Runs `python -m sweep run STUDY` (in --workdir; the same command again resumes an interrupted
recording, as any study does), then writes benchmarks/data/curves/<study file's stem>.json: the
study's objective, steps and search space, and for every COMPLETE trial its params, its metric at
every evaluation step and its seconds per training step (its ledger's training time over its
steps). The study file should have no pruner and no scheduler: every trial trains to the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import optuna
import yaml

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "data" / "curves"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/sweep-curves"))
    args = parser.parse_args()
    raw = yaml.safe_load(args.study.read_text())
    if raw.get("scheduler") or (raw.get("pruner") or {}).get("type", "none") != "none":
        sys.exit(f"{args.study}: a recording trains every trial to the end: no pruner, no scheduler")
    workdir = args.workdir / args.study.stem
    workdir.mkdir(parents=True, exist_ok=True)
    study_file = workdir / "study.yaml"
    study_file.write_text(yaml.safe_dump({**raw, "workdir": str(workdir / "runs")}, sort_keys=False))
    subprocess.run([sys.executable, "-m", "sweep", "run", str(study_file), "--n-jobs", str(args.n_jobs)],
                   cwd=REPO, check=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{workdir / 'runs' / 'study.db'}")
    trials = optuna.load_study(study_name=raw["name"], storage=storage).get_trials(deepcopy=False)
    steps = raw["train"]["steps"]
    configs = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        ledger = t.user_attrs.get("ledger") or {}
        configs.append({"number": t.number, "params": t.params,
                        "values": {str(s): v for s, v in sorted(t.intermediate_values.items())},
                        "seconds_per_step": ledger.get("training", 0.0) / steps})
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{args.study.stem}.json"
    out.write_text(json.dumps({"study": raw["name"], "trial": raw["trial"], "objective": raw["objective"],
                               "steps": steps, "eval_every": raw["train"]["eval_every"],
                               "search_space": raw["search_space"], "configs": configs}, indent=None))
    print(f"{out}: {len(configs)} configurations of {raw['trial']}, {steps} steps each")


if __name__ == "__main__":
    main()
