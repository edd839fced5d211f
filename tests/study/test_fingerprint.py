"""The study fingerprint's rules: which keys define a study's trials, and what counts as a change."""

from __future__ import annotations

import pytest

from conftest import BASE_STUDY, merge
from sweep.study import config as config_lib
from sweep.study import fingerprint


def meaning(**override):
    return fingerprint.meaning(config_lib.from_dict(merge(BASE_STUDY, override)))


def test_defaults_are_part_of_the_meaning_and_steering_keys_are_not():
    base = meaning()
    assert base["train.seed"] == 0 and base["train.same_seed_for_all_trials"] is False
    assert base["search_space.hidden"] == {"type": "int", "low": 16, "high": 64, "log": False, "step": 16}
    assert base["sampler.n_startup_trials"] == 2 and base["trial"] == "trials.digits_mlp"
    steering = meaning(n_trials=9, timeout=5.0, max_retries=2, parallel={"n_jobs": 2},
                       checkpoint={"every_steps": 7, "keep_last": 5}, pruner={"type": "none"})
    assert fingerprint.changes(base, steering) == []
    assert not any(key.split(".")[0] in fingerprint.STEERING for key in base)


@pytest.mark.parametrize("override, expected", [
    ({"train": {"steps": 601}}, [("train.steps", "600", "601")]),
    ({"train": {"same_seed_for_all_trials": True}}, [("train.same_seed_for_all_trials", "false", "true")]),
    ({"fixed": {"batch_size": 16}}, [("fixed.batch_size", "32", "16")]),
    ({"objective": {"metric": "val_accuracy", "direction": "maximize"}},
     [("objective.direction", '"minimize"', '"maximize"'), ("objective.metric", '"val_loss"', '"val_accuracy"')]),
    ({"sampler": {"type": "tpe", "seed": 8, "n_startup_trials": 2}}, [("sampler.seed", "7", "8")]),
    ({"search_space": {"hidden": {"type": "int", "low": 16, "high": 64, "step": 16},
                       "depth": {"type": "int", "low": 1, "high": 2}}},
     [("search_space.learning_rate", '{"type": "float", "low": 0.001, "high": 0.1, "log": true, "step": null}',
       "(absent)"),
      ("search_space.depth", "(absent)", '{"type": "int", "low": 1, "high": 2, "log": false, "step": 1}')]),
    ({"search_space": {**BASE_STUDY["search_space"], "hidden": {"type": "int", "low": 16, "high": 64, "step": 8}}},
     [("search_space.hidden.step", "16", "8")]),
])
def test_changes_name_each_key_with_old_and_new_value(override, expected):
    found = fingerprint.changes(meaning(), meaning(**override))
    assert sorted((k, fingerprint.show(a), fingerprint.show(b)) for k, a, b in found) == sorted(expected)


def test_equal_as_yaml_values():
    same = {"search_space.x": {"type": "float", "low": 1, "high": 2.0}, "fixed.n": 3, "fixed.flag": True}
    assert fingerprint.changes(same, {**same, "search_space.x": {"type": "float", "low": 1.0, "high": 2}}) == []
    assert fingerprint.changes(same, {**same, "fixed.n": 3.0}) == []
    assert fingerprint.changes(same, {**same, "fixed.flag": 1}) == [("fixed.flag", True, 1)]


def test_sampler_sees_is_part_of_the_meaning_only_where_given():
    """A scheduler's `sampler_sees` (added in a later release) keeps the fingerprints of studies
    stored before it equal where it is the default, and is a change where it is not."""
    asha = {"type": "asha", "min_steps": 100}
    before = meaning(pruner={"type": "none"}, scheduler=asha)
    assert "scheduler.sampler_sees" not in before
    assert fingerprint.changes(before, meaning(pruner={"type": "none"}, scheduler={**asha, "sampler_sees": "finished"})) == []
    assert fingerprint.changes(before, meaning(pruner={"type": "none"}, scheduler={**asha, "sampler_sees": "rung"})) == [
        ("scheduler.sampler_sees", fingerprint.ABSENT, "rung")]
