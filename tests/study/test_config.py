"""Every rule of the study file: a bad file exits 2 with a message naming key, rule and value, writing nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conftest import BASE_STUDY, merge, run_cli
from sweep.__main__ import main

DELETE = object()


def _without(data: dict, dotted: str) -> dict:
    data = merge(data, {})
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        node[p] = dict(node[p])
        node = node[p]
    del node[parts[-1]]
    return data


# (id, study-file text or override dict, expected fragments of the message)
BAD = [
    ("typo-top-level", {"n_trails": 5}, ["n_trails: unknown key (did you mean 'n_trials'?)"]),
    ("typo-nested", {"train": {"step": 5}}, ["train.step: unknown key (did you mean 'steps'?)"]),
    ("typo-param-key", {"search_space": {"hidden": {"type": "int", "low": 16, "hihg": 64}}},
     ["search_space.hidden.hihg: unknown key (did you mean 'high'?)"]),
    ("string-for-int", {"n_trials": "20"}, ["n_trials: must be an integer, got '20'"]),
    ("bool-for-int", {"train": {"steps": True}}, ["train.steps: must be an integer, got True"]),
    ("float-for-int", {"train": {"eval_every": 2.5}}, ["train.eval_every: must be an integer, got 2.5"]),
    ("zero-trials", {"n_trials": 0}, ["n_trials: must be >= 1, got 0"]),
    ("negative-timeout", {"timeout": -1}, ["timeout: must be > 0, got -1"]),
    ("inverted-float-range", {"search_space": {"learning_rate": {"type": "float", "low": 0.1, "high": 0.01}}},
     ["search_space.learning_rate.low: must be < high (0.01)", "got 0.1"]),
    ("empty-int-range", {"search_space": {"hidden": {"type": "int", "low": 32, "high": 32}}},
     ["search_space.hidden.low: must be < high (32)", "got 32"]),
    ("log-low-zero", {"search_space": {"learning_rate": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}},
     ["search_space.learning_rate.low: must be > 0 when log is true, got 0.0"]),
    ("log-low-negative", {"search_space": {"hidden": {"type": "int", "low": -4, "high": 64, "log": True}}},
     ["search_space.hidden.low: must be > 0 when log is true, got -4"]),
    ("log-with-step", {"search_space": {"learning_rate": {"type": "float", "low": 0.1, "high": 1.0, "log": True,
                                                          "step": 0.1}}},
     ["search_space.learning_rate.step: cannot be combined with log: true, got 0.1"]),
    ("zero-step", {"search_space": {"hidden": {"type": "int", "low": 16, "high": 64, "step": 0}}},
     ["search_space.hidden.step: must be >= 1, got 0"]),
    ("unknown-distribution", {"search_space": {"hidden": {"type": "integer", "low": 1, "high": 2}}},
     ["search_space.hidden.type: must be one of float, int, categorical, got 'integer'"]),
    ("empty-choices", {"search_space": {"optimizer": {"type": "categorical", "choices": []}}},
     ["search_space.optimizer.choices: must not be empty"]),
    ("repeated-choices", {"search_space": {"optimizer": {"type": "categorical", "choices": ["adam", "adam"]}}},
     ["search_space.optimizer.choices: must not repeat a value"]),
    ("search-space-not-mapping", {"search_space": ["hidden"]}, ["search_space: must be a mapping, got ['hidden']"]),
    ("unknown-sampler", {"sampler": {"type": "bayes"}}, ["sampler.type: must be one of 'tpe', 'random'", "'bayes'"]),
    ("unknown-pruner", {"pruner": {"type": "early"}}, ["pruner.type: must be one of 'none', 'median'", "'early'"]),
    ("unknown-direction", {"objective": {"metric": "val_loss", "direction": "down"}},
     ["objective.direction: must be one of 'minimize' or 'maximize', got 'down'"]),
    ("sampler-kwarg-typo", {"sampler": {"type": "tpe", "n_startup": 3}},
     ["sampler.n_startup: not an argument of optuna.samplers.TPESampler (did you mean 'n_startup_trials'?)"]),
    ("pruner-kwarg-typo", {"pruner": {"type": "median", "n_warmup": 3}},
     ["pruner.n_warmup: not an argument of optuna.pruners.MedianPruner (did you mean 'n_warmup_steps'?)"]),
    ("grid-float-without-step", {"sampler": {"type": "grid"}},
     ["search_space.learning_rate: needs a step, or a list of values, for the grid sampler"]),
    ("unsafe-name", {"name": "../evil"}, ["name: must be a plain name", "got '../evil'"]),
    ("name-with-space", {"name": "my study"}, ["name: must be a plain name", "got 'my study'"]),
    ("missing-trial-module", {"trial": "trials.no_such_trial"},
     ["trial: cannot import module", "got 'trials.no_such_trial'"]),
    ("trial-not-a-module-name", {"trial": "trials/digits_mlp.py"}, ["trial: must be a dotted module name"]),
    ("trial-without-protocol", {"trial": "json"}, ["trial: module json does not provide the trial protocol"]),
    ("trial-raises-on-import", {"trial": "broken_trial"},
     ["trial: importing the module raised RuntimeError: boom", "got 'broken_trial'"]),
    ("unknown-hyperparameter", {"search_space": {"hiden": {"type": "int", "low": 16, "high": 64}}},
     ["search_space.hiden: not a hyperparameter of trials.digits_mlp (did you mean 'hidden'?)"]),
    ("unknown-fixed", {"fixed": {"batchsize": 32}}, ["fixed.batchsize: not a hyperparameter", "'batch_size'"]),
    ("sampled-and-fixed", {"fixed": {"hidden": 32}}, ["fixed.hidden: is also in search_space"]),
    ("unknown-metric", {"objective": {"metric": "accuracy"}},
     ["objective.metric: must be a metric of trials.digits_mlp (one of val_loss, val_accuracy), got 'accuracy'"]),
    ("keep-last-zero", {"checkpoint": {"keep_last": 0}}, ["checkpoint.keep_last: must be >= 1, got 0"]),
    ("keep-best-zero", {"checkpoint": {"keep_best": 0}}, ["checkpoint.keep_best: must be >= 1, got 0"]),
    ("write-share-above-one", {"checkpoint": {"max_write_share": 1.5}},
     ["checkpoint.max_write_share: must be <= 1, got 1.5"]),
    ("keep-trials-zero", {"checkpoint": {"keep_trials": 0}}, ["checkpoint.keep_trials: must be >= 1, got 0"]),
    ("max-disk-not-a-size", {"checkpoint": {"max_disk": "50 parsecs"}},
     ["checkpoint.max_disk: ", "'50 parsecs'"]),
    ("max-disk-zero", {"checkpoint": {"max_disk": "0GB"}}, ["checkpoint.max_disk: must be > 0"]),
    ("every-seconds-zero", {"checkpoint": {"every_seconds": 0}}, ["checkpoint.every_seconds: must be > 0, got 0"]),
    ("negative-retries", {"max_retries": -1}, ["max_retries: must be >= 0, got -1"]),
    ("n-jobs-zero", {"parallel": {"n_jobs": 0}}, ["parallel.n_jobs: must be >= 1, got 0"]),
    ("lease-grace-zero", {"parallel": {"lease_grace_seconds": 0}}, ["parallel.lease_grace_seconds: must be > 0, got 0"]),
    ("backend-unknown", {"parallel": {"backend": "ray"}},
     ["parallel.backend: must be one of 'loky' or 'dask', got 'ray'"]),
    ("dask-no-address", {"parallel": {"backend": "dask"}}, ["parallel.address: is required with backend dask"]),
    ("address-without-dask", {"parallel": {"address": "tcp://h:8786"}},
     ["parallel.address: is only used with backend dask, got 'tcp://h:8786'"]),
    ("devices-zero", {"train": {"steps": 10, "eval_every": 5, "devices": 0}}, ["train.devices: must be >= 1, got 0"]),
    ("bad-storage-url", {"storage": "not a url"}, ["storage: must be an SQLAlchemy database URL", "'not a url'"]),
    ("missing-train", lambda d: _without(d, "train"), ["train: is required"]),
    ("missing-steps", lambda d: _without(d, "train.steps"), ["train.steps: is required"]),
    ("empty-file", "", ["must be a mapping of study keys, got an empty file"]),
    ("comment-only-file", "# nothing here\n", ["got an empty file"]),
    ("list-file", "- name: x\n- n_trials: 3\n", ["must be a mapping of study keys, got 'list'"]),
    ("scalar-file", "just a string\n", ["must be a mapping of study keys, got 'str'"]),
    ("yaml-syntax", "name: x\nn_trials: [1, 2\n", ["invalid YAML at line"]),
    ("yaml-bad-indent", "name: x\n  n_trials: 3\n", ["invalid YAML at line 2"]),
    ("python-tag", "name: !!python/object/apply:os.system ['touch pwned']\n",
     ["unsupported YAML tag", "python/object/apply:os.system"]),
]


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd = an empty dir holding a trial module that raises on import."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_trial.py").write_text("raise RuntimeError('boom')\n")
    return tmp_path


def _write(tmp: Path, spec) -> Path:
    path = tmp / "bad.yaml"
    if isinstance(spec, str):
        path.write_text(spec)
    else:
        data = spec(dict(BASE_STUDY)) if callable(spec) else merge(BASE_STUDY, spec)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("spec,fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_study_file_exits_2_naming_key_and_writes_nothing(isolated, capsys, spec, fragments):
    path = _write(isolated, spec)
    before = sorted(os.listdir(isolated))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: "), err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err
    assert sorted(os.listdir(isolated)) == before  # no runs/, no study.db, no __pycache__


@pytest.mark.slow
@pytest.mark.parametrize("case", ["typo-top-level", "python-tag", "trial-raises-on-import"])
def test_bad_study_file_through_real_cli_has_no_traceback(isolated, case):
    spec, fragments = next(b[1:] for b in BAD if b[0] == case)
    path = _write(isolated, spec)
    result = run_cli("run", path, cwd=isolated)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and fragments[0] in result.stderr
    assert sorted(os.listdir(isolated)) == ["bad.yaml", "broken_trial.py"]
    assert not (isolated / "pwned").exists()


def test_missing_study_file_exits_2(isolated, capsys):
    assert main(["run", "nope.yaml"]) == 2
    assert "error: nope.yaml: study file not found" in capsys.readouterr().err


def test_bad_usage_exits_2(capsys):
    assert main(["run"]) == 2
    assert main(["frobnicate", "x.yaml"]) == 2


def test_good_study_file_loads_with_defaults(isolated):
    from sweep.study import config

    path = _write(isolated, {"sampler": {"type": "random", "seed": 3}})
    cfg = config.load(path)
    assert cfg.workdir == isolated / "runs" / "t"
    assert cfg.storage == f"sqlite:///{isolated}/runs/t/study.db"
    assert cfg.study.checkpoint.keep_best == 1 and cfg.study.parallel.n_jobs == 1
    hp = cfg.hyperparameters({"hidden": 48})
    assert hp["hidden"] == 48 and hp["batch_size"] == 32 and hp["optimizer"] == "adam"
    assert not (isolated / "runs").exists()


def test_relative_sqlite_storage_resolves_against_cwd(isolated):
    from sweep.study import config

    cfg = config.load(_write(isolated, {"storage": "sqlite:///db/s.db"}))
    assert cfg.storage == f"sqlite:///{isolated}/db/s.db"
