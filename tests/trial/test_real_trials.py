"""Real Flax training code as trials: a linen ResNet with BatchNorm (model state, epoch order, a
schedule over train.steps) and an NNX CNN; kill -9 and resume bit-identically, export their state."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import gated_trial, kill_mid_trial, cli_here, run_cli, snapshot, study_of

RESNET = {"name": "resnet", "trial": "trials.digits_resnet", "n_trials": 2, "pruner": {"type": "none"},
          "sampler": {"type": "random", "seed": 3},
          "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 3.0e-2, "log": True}},
          "fixed": {"width": 4, "dropout": 0.1, "batch_size": 32, "warmup_steps": 20},
          "train": {"steps": 200, "eval_every": 50}, "checkpoint": {"every_steps": 50}}
NNX = {"name": "nnx", "trial": "trials.digits_nnx", "n_trials": 2, "pruner": {"type": "none"},
       "sampler": {"type": "random", "seed": 3},
       "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 3.0e-2, "log": True},
                        "dropout": {"type": "categorical", "choices": [0.1, 0.3]}},
       "fixed": {"features": 4, "hidden": 16, "batch_size": 32},
       "train": {"steps": 200, "eval_every": 50}, "checkpoint": {"every_steps": 50}}


def _history(study_file: Path) -> list:
    """Every metric of every evaluation, the best-step metrics and the checkpoint contents."""
    return [(t.number, t.user_attrs.get("metrics"),
             sorted((k, v) for k, v in t.user_attrs.items() if k.startswith("eval:")))
            for t in sorted(study_of(study_file).trials, key=lambda t: t.number)]


def _uninterrupted(write_study, overrides: dict) -> Path:
    study = write_study("reference.yaml", **{**overrides, "name": overrides["name"] + "-ref"})
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    return study


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [RESNET, NNX], ids=["resnet-batchnorm", "nnx"])
def test_kill9_mid_trial_then_rerun_is_bit_identical(write_study, tmp_path, overrides, held):
    reference = _uninterrupted(write_study, overrides)
    # Held at the process's 7th evaluation (trial 0's 4, then trial 1's at step 150, after its save
    # at 100): killed mid-trial however fast the machine (100 steps were left after the save).
    study = write_study(**{**overrides, "trial": gated_trial(tmp_path, 7, overrides["trial"])})
    kept = kill_mid_trial(study, 1, 100, held(study.parent / "hold"))
    assert kept and max(kept) < 200  # killed mid-trial, after a checkpoint with model state
    result = run_cli("run", study, cwd=study.parent)
    assert result.returncode == 0, result.stderr
    assert "trial 1: resumed from step" in result.stderr
    assert snapshot(study) == snapshot(reference)
    assert _history(study) == _history(reference)
    metrics = study_of(study).trials[1].user_attrs["metrics"]
    assert set(metrics) == {"val_loss", "val_accuracy"} and all(np.isfinite(list(metrics.values())))


def _one_trial_exported(study: Path, out: Path) -> tuple[Path, Path]:
    """The study file, run to its end, and the folder `export` wrote it to."""
    assert run_cli("run", study, cwd=study.parent).returncode == 0
    assert cli_here("export", study, "--out", out).returncode == 0
    return study, out


@pytest.mark.slow
def test_resnet_export_holds_batch_stats_and_applies_with_flax(write_study, tmp_path):
    import sweep
    from trials.digits_mlp import _splits
    from trials.digits_resnet import model

    study, out = _one_trial_exported(write_study(**{**RESNET, "n_trials": 1}), tmp_path / "export")
    entry = json.loads((out / "index.json").read_text())["trials"][0]
    meta = json.loads((out / entry["dir"] / "meta.json").read_text())
    assert meta["collections"] == ["batch_stats"]
    assert set(meta["metrics"]) == {"val_loss", "val_accuracy"} and np.isfinite(meta["train_loss"])
    variables, _ = sweep.load_variables(out / entry["dir"])
    assert set(variables) == {"params", "batch_stats"} and "BatchNorm_0" in variables["batch_stats"]
    # Flax's own apply, unchanged, on the exported variables reproduces the recorded validation accuracy.
    splits = _splits()
    x_val = splits["x_val"].reshape(-1, 8, 8, 1)
    logits = model(meta["hyperparameters"]).apply(variables, x_val, train=False)
    accuracy = float((np.asarray(logits).argmax(-1) == splits["y_val"]).mean())
    assert accuracy == pytest.approx(meta["metrics"]["val_accuracy"], abs=1e-6)
    # load_best gives the same model and state: the same predictions as the export.
    loaded = sweep.load_best(study)
    assert loaded.step == meta["best_step"] and loaded.metrics == meta["metrics"]
    again = loaded.model.apply(loaded.variables, x_val, train=False)
    assert np.array_equal(np.asarray(again), np.asarray(logits))


@pytest.mark.slow
def test_nnx_export_and_load_best_give_the_module(write_study, tmp_path):
    from flax import nnx

    import sweep
    from trials import digits_nnx
    from trials.digits_mlp import _splits

    study, out = _one_trial_exported(write_study(**{**NNX, "n_trials": 1}), tmp_path / "export")
    variables, meta = sweep.load_variables(out)
    assert meta["collections"] == ["batch_stats"] and set(variables["batch_stats"]["norm"]) == {"mean", "var"}
    hp = meta["hyperparameters"]
    x_val = _splits()["x_val"].reshape(-1, 8, 8, 1)
    # A fresh module of the trial, given the exported params and batch stats, predicts as load_best's.
    module = digits_nnx.init(hp, jax.random.PRNGKey(1), None)
    params, stats = nnx.state(module, nnx.Param), nnx.state(module, nnx.BatchStat)
    nnx.replace_by_pure_dict(params, variables["params"])
    nnx.replace_by_pure_dict(stats, variables["batch_stats"])
    nnx.update(module, params, stats)
    module.eval()
    loaded = sweep.load_best(study)
    assert isinstance(loaded.model, nnx.Module)
    assert np.array_equal(np.asarray(loaded.model(x_val)), np.asarray(module(x_val)))
    accuracy = float((np.asarray(module(x_val)).argmax(-1) == _splits()["y_val"]).mean())
    assert accuracy == pytest.approx(meta["metrics"]["val_accuracy"], abs=1e-6)


def test_epoch_batch_is_a_permutation_per_epoch():
    import sweep

    key, size, bs = jax.random.PRNGKey(0), 100, 8
    per_epoch = size // bs  # 12 batches; 4 examples dropped per epoch
    epochs = []
    for epoch in range(3):
        idx = np.concatenate([np.asarray(sweep.epoch_batch(key, epoch * per_epoch + i, size, bs))
                              for i in range(per_epoch)])
        assert len(set(idx.tolist())) == len(idx) == per_epoch * bs  # no index twice in an epoch
        epochs.append(idx)
    assert not np.array_equal(epochs[0], epochs[1])  # a new order every epoch
    traced = jax.jit(lambda s: sweep.epoch_batch(key, s, size, bs))(np.int32(per_epoch + 3))
    assert np.array_equal(np.asarray(traced), epochs[1][3 * bs: 4 * bs])  # a pure function of (key, step)
    with pytest.raises(ValueError, match="larger than the 4 examples"):
        sweep.epoch_batch(key, 0, 4, 8)
