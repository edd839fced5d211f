"""export, the best-checkpoint semantics behind it, the test score at the end of run, and the Python API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import array_files, cli, cli_env, kill9, kill_mid_trial, cli_here, run_cli, Running, study_of
from sweep.checkpoints.folder import TrialCheckpoints
from sweep.commands.best import _jitted
from sweep.study import config as config_lib
from sweep.train.state import initial_state

pytestmark = pytest.mark.slow  # every test here starts real processes


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _evaluate(study: Path, params, hp) -> float:
    from sweep.trial.kinds import PlainKind

    config = config_lib.load(study)
    return float(_jitted("evaluate", config, hp, PlainKind())(params, {}, config.trial_module.data(hp))["val_loss"])


def _check_export(study: Path, out: Path) -> dict:
    index = json.loads((out / "index.json").read_text())
    trials = {t.number: t for t in study_of(study).trials}
    complete = sorted(n for n, t in trials.items() if t.state.name == "COMPLETE")
    assert sorted(e["number"] for e in index["trials"]) == complete
    values = [e["best_value"] for e in index["trials"]]
    assert values == sorted(values)  # best first
    for entry in index["trials"]:
        t = trials[entry["number"]]
        best = min(t.intermediate_values.values())
        assert entry["best_value"] == best == t.value
        assert t.intermediate_values[entry["best_step"]] == best
        assert entry["last_step"] == max(t.intermediate_values)
        meta = json.loads((out / entry["dir"] / "meta.json").read_text())
        assert meta == entry and meta["dir"] == f"trial_{t.number:04d}"
        # Loaded without sweep, evaluated with the trial's own evaluation: exactly the best value.
        from safetensors.numpy import load_file

        flat = load_file(out / entry["dir"] / "params.safetensors")
        assert "Dense_0/kernel" in flat and flat["Dense_0/kernel"].shape == (64, meta["hyperparameters"]["hidden"])
        params, _ = __import__("sweep").load_export(out / entry["dir"])
        assert _evaluate(study, params, meta["hyperparameters"]) == entry["best_value"]
    return index


def test_export_after_a_killed_and_resumed_study(write_study, tmp_path):
    study = write_study()
    kill_mid_trial(study, 1, 200)
    partial = cli_here("export", study, "--out", tmp_path / "partial")
    assert partial.returncode == 0, partial.stderr  # exports what is finished so far
    assert [e["number"] for e in json.loads((tmp_path / "partial" / "index.json").read_text())["trials"]] == \
        ([0] if study_of(study).trials[0].state.name == "COMPLETE" else [])
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    out = tmp_path / "export"
    result = run_cli("export", study, "--out", out)
    assert result.returncode == 0, result.stderr
    index = _check_export(study, out)
    assert index["study"] == "t" and index["metric"] == "val_loss" and index["direction"] == "minimize"
    first = _files(out)
    assert cli_here("export", study, "--out", out).returncode == 0
    assert _files(out) == first  # byte-identical re-export

    # The safetensors file needs neither sweep nor JAX to load.
    entry = index["trials"][0]
    code = ("import sys; from safetensors.numpy import load_file; "
            f"t = load_file({str(out / entry['dir'] / 'params.safetensors')!r}); "
            "assert 'sweep' not in sys.modules and 'jax' not in sys.modules; print(sorted(t))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0 and "Dense_0/kernel" in loaded.stdout, loaded.stderr

    # --trial N and --include-pruned
    single = tmp_path / "single"
    assert cli_here("export", study, "--out", single, "--trial", str(entry["number"])).returncode == 0
    assert [e["number"] for e in json.loads((single / "index.json").read_text())["trials"]] == [entry["number"]]
    everything = tmp_path / "all"
    assert cli_here("export", study, "--out", everything, "--include-pruned").returncode == 0
    exported = {e["number"]: e["state"] for e in json.loads((everything / "index.json").read_text())["trials"]}
    assert exported == {t.number: t.state.name for t in study_of(study).trials}


def test_exported_params_are_the_best_step_not_the_last(write_study, tmp_path):
    # Adam at a high learning rate on a wide MLP overfits the digits: validation loss rises again.
    study = write_study(n_trials=1, pruner={"type": "none"},
                        search_space={"learning_rate": {"type": "float", "low": 0.05, "high": 0.0500001}},
                        fixed={"hidden": 256, "batch_size": 32}, train={"steps": 1500, "eval_every": 50},
                        checkpoint={"every_steps": 500, "keep_last": 1, "keep_best": 1})
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    out = tmp_path / "export"
    assert cli_here("export", study, "--out", out).returncode == 0
    entry = _check_export(study, out)["trials"][0]
    assert entry["best_step"] < entry["last_step"] == 1500
    trial = study_of(study).trials[0]
    ckpt_dir = Path(trial.user_attrs["checkpoint_dir"])
    assert sorted(int(p.name) for p in ckpt_dir.iterdir()) == [entry["best_step"], 1500]
    params, meta = __import__("sweep").load_export(out / entry["dir"])
    template = initial_state(config_lib.load(study), 0, meta["hyperparameters"]).state
    ckpt = TrialCheckpoints(ckpt_dir, "val_loss", "minimize", 1, 1, read_only=True)
    last = ckpt.restore_verified(1500, template)["params"]
    ckpt.close()
    assert not np.array_equal(params["Dense_0"]["kernel"], np.asarray(last["Dense_0"]["kernel"]))
    assert _evaluate(study, last, meta["hyperparameters"]) == trial.intermediate_values[1500] > entry["best_value"]

    # A damaged best checkpoint is never exported as if it were fine.
    damaged_files = array_files(ckpt_dir / str(entry["best_step"]))
    assert damaged_files
    for path in damaged_files:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    damaged = cli_here("export", study, "--out", tmp_path / "again")
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr
    assert f"trial 0: its best checkpoint (step {entry['best_step']}) is damaged" in damaged.stderr


def test_export_errors_exit_nonzero_with_a_clear_message(write_study, tmp_path, capsys):
    # The refusals run through main() in this process (an exception would fail the test as a
    # traceback would); the usage error, which argparse ends with SystemExit, as a process.
    study = write_study(n_trials=1, train={"steps": 100000, "eval_every": 1000}, checkpoint={"every_steps": 1000})
    code, _, err = cli(capsys, "export", study, "--out", tmp_path / "x")
    assert code == 1 and "not found" in err and "Traceback" not in err
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 0: started")
    kill9(proc)
    code, _, err = cli(capsys, "export", study, "--out", tmp_path / "x")
    assert code == 1 and "has no finished trial to export yet" in err
    code, _, err = cli(capsys, "export", study, "--out", tmp_path / "x", "--trial", "5")
    assert code == 1 and "cannot export trial 5" in err
    usage = run_cli("export", study)
    assert usage.returncode == 2 and "--out" in usage.stderr
    (tmp_path / "bad.yaml").write_text("name: x\n")
    code, _, err = cli(capsys, "export", tmp_path / "bad.yaml", "--out", tmp_path / "x")
    assert code == 2 and "is required" in err
    assert not (tmp_path / "x").exists()


def test_summary_shows_test_metric_and_rerun_reads_it_back_without_checkpoints(write_study):
    study = write_study(n_trials=2)
    first = run_cli("run", study, cwd=study.parent)
    assert first.returncode == 0, first.stderr
    best = study_of(study).best_trial
    line = next(l for l in first.stdout.splitlines() if l.startswith("test ("))
    assert f"test (trial {best.number}, best checkpoint step {best.user_attrs['best_step']}): test_accuracy=" in line
    cached = study_of(study).user_attrs["best_test"]
    assert cached["trial"] == best.number and 0.5 < cached["metrics"]["test_accuracy"] <= 1.0
    # Without its checkpoints the finished study still prints the same numbers: nothing is retrained or read.
    import shutil

    shutil.rmtree(Path(best.user_attrs["checkpoint_dir"]))
    again = run_cli("run", study, cwd=study.parent)
    assert again.returncode == 0 and again.stdout == first.stdout


def test_load_best_restores_full_state_ready_to_apply(write_study):
    study = write_study(n_trials=2)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    import optax

    import sweep

    loaded = sweep.load_best(study)
    best = study_of(study).best_trial
    assert (loaded.number, loaded.step, loaded.value) == (best.number, best.user_attrs["best_step"], best.value)
    assert int(loaded.state["step"]) == loaded.step
    assert isinstance(loaded.state["opt_state"][0], optax.ScaleByAdamState)  # optax types, not dicts
    x = loaded.trial_module.data(loaded.hyperparameters)["x_test"][:5]
    assert loaded.model.apply({"params": loaded.params}, x).shape == (5, 10)
    assert _evaluate(study, loaded.params, loaded.hyperparameters) == best.value
    other = sweep.load_best(study, trial=1 - best.number)
    assert other.number == 1 - best.number
    with pytest.raises(sweep.errors.SweepError, match="has no trial 7"):
        sweep.load_best(study, trial=7)
    # From a fresh Python process (a notebook, an inference script): no library noise on stderr.
    fresh = subprocess.run([sys.executable, "-c", f"import sweep; print(sweep.load_best({str(study)!r}).number)"],
                           cwd=study.parent, env=cli_env(), capture_output=True, text=True)
    assert fresh.returncode == 0 and fresh.stdout.strip() == str(best.number), fresh.stderr
    assert fresh.stderr == "", fresh.stderr


DATA_HERE_ONLY = '''
import os
from trials import digits_mlp
from trials.digits_mlp import HYPERPARAMETERS, METRICS, init, optimizer, batch, loss, evaluate, test, model


def data(hp):
    if os.path.exists("no_training_data"):
        raise RuntimeError("the training data is not on this machine")
    return digits_mlp.data(hp)
'''


def test_export_and_load_best_need_no_training_data(write_study, tmp_path):
    study = write_study(trial="data_here_only", n_trials=2, train={"steps": 200, "eval_every": 50})
    (study.parent / "data_here_only.py").write_text(DATA_HERE_ONLY)
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    (study.parent / "no_training_data").touch()  # an inference machine: data() now raises
    result = cli_here("export", study, "--out", tmp_path / "out", cwd=study.parent)
    assert result.returncode == 0, result.stderr
    params, meta = __import__("sweep").load_export(tmp_path / "out")
    assert params["Dense_0"]["kernel"].shape[0] == 64 and meta["trial_module"] == "data_here_only"
    loaded = subprocess.run([sys.executable, "-c", "import sweep; b = sweep.load_best('study.yaml'); "
                             "print(b.number, sorted(b.variables), int(b.state['step']) == b.step)"],
                            cwd=study.parent, env=cli_env(), capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stderr == "", loaded.stderr
    assert loaded.stdout.split()[1:] == ["['params']", "True"], loaded.stdout
