"""Issue 29 item 6: a study of 10,000 finished trials, read by Optuna and by sweep, side by side.

One real trial is run (`digits_mlp`, 200 steps, an evaluation every 10: its whole record, 20
`eval:<step>` user attributes, 20 intermediate values, its ledger and compile counts); its rows are
then copied in bulk SQL to trials 1..N-1 (every third PRUNED, the others COMPLETE and worse than
trial 0), so the study is built in seconds and each trial carries sweep's real record. Timed, each
a fresh process, in one run: a plain `optuna.load_study(...).get_trials(deepcopy=False)`,
`python -m sweep plan`, `python -m sweep status --json` and `python -m sweep run` on the finished
study, each as a ratio to Optuna's load. Target: each <= 1.0x; `run` about `plan`'s time.

    python benchmarks/big_study.py [--trials 10000] [--rounds 1] [--keep DIR] [--json-out FILE]

--keep DIR builds the study in DIR (or reuses the one already there), so that a change can be
timed on the same study before and after; --json-out writes `status --json`'s output to FILE.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import yaml

NAME = "big"


def make_study(root: Path, n_trials: int) -> Path:
    path = root / f"{NAME}.yaml"
    db = root / NAME / "study.db"
    if path.exists() and db.exists():
        return path  # --keep: the study built before
    raw = yaml.safe_load((harness.REPO / "studies" / "digits_mlp.yaml").read_text())
    raw.update(name=NAME, workdir=str(root / NAME), n_trials=1, train={"steps": 200, "eval_every": 10, "seed": 0})
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run([sys.executable, "-m", "sweep", "run", str(path), "--quiet"], check=True, capture_output=True,
                   cwd=root)
    con = sqlite3.connect(db)
    with con:
        (tid, sid, start, end), = con.execute("SELECT trial_id, study_id, datetime_start, datetime_complete "
                                              "FROM trials WHERE number = 0")
        params = con.execute("SELECT param_name, param_value, distribution_json FROM trial_params "
                             "WHERE trial_id = ?", (tid,)).fetchall()
        (value,), = con.execute("SELECT value FROM trial_values WHERE trial_id = ?", (tid,))
        inter = con.execute("SELECT step, intermediate_value FROM trial_intermediate_values WHERE trial_id = ?",
                            (tid,)).fetchall()
        attrs = con.execute("SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ?", (tid,)).fetchall()
        sysattrs = con.execute("SELECT key, value_json FROM trial_system_attributes WHERE trial_id = ?",
                               (tid,)).fetchall()
        ckpt = str(root / NAME / "checkpoints")
        rows: dict[str, list[tuple]] = {k: [] for k in ("t", "p", "v", "i", "u", "s")}
        first = tid + 1
        for n in range(1, n_trials):
            new, worse = first + n - 1, 1.0 + n * 1e-4  # worse than trial 0: its checkpoint is the best
            state = "PRUNED" if n % 3 == 0 else "COMPLETE"
            rows["t"].append((new, n, sid, state, start, end))
            rows["p"] += [(new, name, v, d) for name, v, d in params]
            if state == "COMPLETE":
                rows["v"].append((new, 0, value + worse, "FINITE"))
            rows["i"] += [(new, step, v + worse, "FINITE") for step, v in inter]
            for key, js in attrs:
                if key == "checkpoint_dir":
                    js = f'"{ckpt}/trial_{n:04d}"'
                elif key == "best_value":
                    js = repr(value + worse)
                rows["u"].append((new, key, js))
            rows["s"] += [(new, key, js) for key, js in sysattrs]
        con.executemany("INSERT INTO trials (trial_id, number, study_id, state, datetime_start, datetime_complete) "
                        "VALUES (?, ?, ?, ?, ?, ?)", rows["t"])
        con.executemany("INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) "
                        "VALUES (?, ?, ?, ?)", rows["p"])
        con.executemany("INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, ?, ?, ?)",
                        rows["v"])
        con.executemany("INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, "
                        "intermediate_value_type) VALUES (?, ?, ?, ?)", rows["i"])
        con.executemany("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)", rows["u"])
        con.executemany("INSERT INTO trial_system_attributes (trial_id, key, value_json) VALUES (?, ?, ?)", rows["s"])
    con.close()
    raw["n_trials"] = n_trials
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="build the study here (or reuse it) and keep it")
    ap.add_argument("--json-out", type=Path, default=None, help="write status --json's output here")
    args = ap.parse_args()
    root = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="sweep-big-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t_build = harness.timed(lambda: make_study(root, args.trials))
        study = root / f"{NAME}.yaml"
        n = int(yaml.safe_load(study.read_text())["n_trials"])
        print(f"study of {n} finished trials at {root} ({t_build:.1f} s to build or find)", flush=True)
        load = ("import optuna; optuna.logging.set_verbosity(optuna.logging.WARNING); "
                f"t = optuna.load_study(study_name={NAME!r}, storage={'sqlite:///' + str(root / NAME / 'study.db')!r})"
                f".get_trials(deepcopy=False); assert len(t) == {n}")
        commands = {"optuna load": [sys.executable, "-c", load],
                    "plan": [sys.executable, "-m", "sweep", "plan", str(study)],
                    "status --json": [sys.executable, "-m", "sweep", "status", str(study), "--json"],
                    "run (finished)": [sys.executable, "-m", "sweep", "run", str(study)]}
        outputs: dict[str, str] = {}

        def side(name: str):
            def go(r: int) -> float:
                def call() -> None:
                    out = subprocess.run(commands[name], capture_output=True, text=True, cwd=root)
                    assert out.returncode == 0, (name, out.stderr[-2000:])
                    outputs[name] = out.stdout
                return harness.timed(call)
            return go

        times = harness.alternate({k: side(k) for k in commands}, args.rounds)
        assert f"{n}/{n} trials finished" in outputs["run (finished)"], outputs["run (finished)"][-2000:]
        if args.json_out:
            args.json_out.write_text(outputs["status --json"])
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    base = med["optuna load"]
    print(f"{n} finished trials, medians of {args.rounds} (each a fresh process):")
    print(f"{'':16} {'seconds':>8} {'x optuna load':>14}")
    for k, v in med.items():
        print(f"{k:16} {v:8.2f} {v / base:14.2f}")


if __name__ == "__main__":
    main()
