"""Streaming trials: training batches from a grain pipeline whose position is in every checkpoint."""

from __future__ import annotations

import random
import signal
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import optuna
import pytest

import sweep
from conftest import Running, checkpoint_dir, gated_trial, kill9, kill_mid_trial, run_cli, sigterm_at, snapshot, wait_for_checkpoint
from sweep.train import stream

STREAM = dict(trial="trials.digits_stream", fixed={"batch_size": 32, "data_dir": "data"},
              sampler={"type": "random", "seed": 3}, pruner={"type": "none"}, n_trials=2,
              train={"steps": 400, "eval_every": 50, "seed": 0}, checkpoint={"every_steps": 100})


# ---- the parts, in-process ----

def test_iterator_state_round_trips_and_garbage_is_refused():
    for state in ({"next_index": 1234, "nested": [1, "a"]}, b'{"workers": [3, 4]}'):
        assert stream.decode_state(stream.encode_state(state)) == state
    with pytest.raises(ValueError, match="bytes"):
        stream.decode_state(np.zeros(stream.STATE_BYTES, np.uint8))
    bad = stream.encode_state({"next_index": 1})
    bad[4] = ord("X")
    with pytest.raises(ValueError, match="unknown kind"):
        stream.decode_state(bad)
    with pytest.raises(ValueError, match="at most"):
        stream.encode_state({"data": "x" * stream.STATE_BYTES})


def _pipeline(seed: int):
    import grain

    return grain.MapDataset.range(1000).seed(seed).shuffle().map(lambda i: {"x": np.full(3, i, np.float32)}) \
        .batch(4, drop_remainder=True).repeat()


def _read(batches: stream.Batches, first: int, ends: list[int]) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    """The batches of steps first..ends[-1] read through windows ending at `ends`, and the states."""
    rows, states, step = [], {first: batches.state_at(first)}, first
    for end in ends:
        while step < end:
            (chunk, start), stop = batches.window(step, end)
            rows += [np.asarray(chunk["x"][s - int(start)]) for s in range(step, stop)]
            step = stop
            states[step] = batches.state_at(step)
    return rows, states


def test_batches_are_the_same_however_the_steps_are_split_and_resume_at_a_saved_state():
    cpu = jax.devices()[0]
    whole = stream.Batches(iter(_pipeline(5)), 0, 300, cpu)
    try:
        reference, states = _read(whole, 0, [300])
    finally:
        whole.close()
    assert whole.steps == stream.MAX_CHUNK and len(reference) == 300
    plain = [b for _, b in zip(range(300), iter(_pipeline(5)))]
    assert all((r == p["x"]).all() for r, p in zip(reference, plain))  # the pipeline's own order
    split = stream.Batches(iter(_pipeline(5)), 0, 300, cpu)
    try:
        rows, split_states = _read(split, 0, [1, 7, 8, 150, 299, 300])
    finally:
        split.close()
    assert all((a == b).all() for a, b in zip(rows, reference)) and len(rows) == 300
    # resuming at the state saved at step 150 reads steps 150.. exactly as the uninterrupted run
    resumed = stream.Batches(stream.open_iterator(_Module, {}, 5, split_states[150]), 150, 300, cpu)
    try:
        rest, _ = _read(resumed, 150, [300])
    finally:
        resumed.close()
    assert all((a == b).all() for a, b in zip(rest, reference[150:])) and len(rest) == 150
    assert not all((a == b).all() for a, b in zip(rest, reference[:150]))  # (it did move on)


class _Module:
    __name__ = "fake_stream"

    @staticmethod
    def train_batches(hp, seed):
        return _pipeline(seed)


def test_a_pipeline_that_runs_out_is_an_error_naming_repeat():
    import grain

    short = grain.MapDataset.range(10).map(lambda i: {"x": np.zeros(2, np.float32) + i})
    batches = stream.Batches(iter(short), 0, 50, jax.devices()[0])
    try:
        with pytest.raises(RuntimeError, match=r"ran out at step 10 of 50.*repeat"):
            batches.window(0, 50)
            batches.window(10, 50)
    finally:
        batches.close()


def test_streamed_evaluation_is_the_example_weighted_mean_of_its_batches():
    x = np.random.RandomState(0).normal(size=(300,)).astype(np.float32)
    batches = [x[i:i + 128] for i in range(0, 300, 128)]  # 128, 128, 44
    out = stream.evaluate_batches(lambda b: {"mean": b.mean(), "first": b[0]}, batches, ["mean"])
    assert out["mean"] == pytest.approx(float(x.astype(np.float64).mean()), rel=1e-6)
    assert list(out) == ["mean"]
    with pytest.raises(ValueError, match="no batch"):
        stream.evaluate_batches(lambda b: {"mean": b.mean()}, [], ["mean"])


def test_a_non_checkpointable_train_batches_is_named():
    module = type(sys)("listy")
    module.train_batches = lambda hp, seed: [np.zeros(3)] * 10
    with pytest.raises(TypeError, match=r"listy.train_batches must return a grain dataset .* got list"):
        stream.open_iterator(module, {}, 0)


def _stream_study(root, **override):
    study = {"name": "s", "trial": "trials.digits_stream", "workdir": str(root / "runs"), "n_trials": 1,
             "objective": {"metric": "val_loss", "direction": "minimize"}, "sampler": {"type": "random", "seed": 1},
             "search_space": {"learning_rate": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
             "fixed": {"batch_size": 16, "data_dir": str(root / "data")},
             "train": {"steps": 240, "eval_every": 40, "seed": 0}, "checkpoint": {"every_steps": 80}}
    study.update(override)
    return study


def test_streaming_trial_stopped_in_process_resumes_to_the_same_trial_with_its_position_saved(tmp_path):
    def finished(root):
        with sweep.open(_stream_study(root)) as session:
            session.run(progress=False, quiet=True)
            best = session.load_best()
        (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{root}/runs/study.db").trials
        return trial, best

    whole, whole_best = finished(tmp_path / "a")
    with sweep.open(_stream_study(tmp_path / "b")) as session:
        sigterm_at(session, 0, 100)
        with pytest.raises(sweep.Interrupted):
            session.run(progress=False, quiet=True)
        (trial,) = session.status()["trials"]
        assert trial["state"] == "INTERRUPTED" and 100 <= trial["last_step"] < 240
    resumed, resumed_best = finished(tmp_path / "b")
    assert resumed.user_attrs["resumes"] == 1
    assert (resumed.params, resumed.value, resumed.intermediate_values) == \
        (whole.params, whole.value, whole.intermediate_values)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(resumed_best.state), jax.tree.leaves(whole_best.state)))
    # the checkpoint holds the pipeline's position: one batch per step read
    assert stream.decode_state(resumed_best.state[stream.DATA_STATE_KEY]) == {"next_index": resumed_best.step}


def test_an_iterator_state_that_a_checkpoint_cannot_store_is_named_before_training():
    class Tupled:  # a state with a tuple (JSON gives a list back) or a numpy int (JSON refuses it)
        def __init__(self, state):
            self.state = state

        def __iter__(self):
            return self

        def __next__(self):
            return np.zeros(3)

        def get_state(self):
            return self.state

        def set_state(self, state):
            self.state = state

    module = type(sys)("odd")
    for state, rule in (({"pos": (1, 2)}, "does not survive JSON"), ({"pos": np.int64(3)}, "cannot be stored")):
        module.train_batches = lambda hp, seed, state=state: Tupled(state)
        with pytest.raises(TypeError, match=f"odd.train_batches: its iterator's state {rule}"):
            stream.first_batch(module, {}, 0)
    module.train_batches = lambda hp, seed: Tupled({"pos": [1, 2]})
    assert (stream.first_batch(module, {}, 0) == 0).all()


# ---- the real CLI ----

def _damage_iterator_state(step_dir: Path) -> None:
    """Change the pipeline position stored in a committed step (its JSON bytes in an array file)."""
    marker = b'{"next_index": '
    hits = [p for p in step_dir.rglob("*") if p.is_file() and marker in p.read_bytes()]
    assert hits, step_dir
    for path in hits:  # (tensorstore may keep more than one copy of a small array's bytes)
        raw = path.read_bytes()
        at = raw.index(marker) + len(marker)
        path.write_bytes(raw[:at] + (b"1" if raw[at:at + 1] != b"1" else b"2") + raw[at + 1:])


@pytest.mark.slow
def test_streaming_trial_killed_damaged_and_sigtermed_at_random_steps_equals_uninterrupted(write_study, reference,
                                                                                             seed, tmp_path, held):
    rng = random.Random(seed)
    kill_at, term_at = rng.choice([200, 300]), rng.choice([100, 200])
    print(f"kill -9 in trial 0 at step >= {kill_at}, SIGTERM in trial 1 at step >= {term_at}")
    # Held at the first validation batch of the evaluation at kill_at + 50 (3 batches an
    # evaluation), after the save at kill_at: the kill lands mid-trial however fast the machine.
    study = write_study(**{**STREAM, "trial": gated_trial(tmp_path, kill_at // 50 * 3 + 1,
                                                          STREAM["trial"])})
    kept = kill_mid_trial(study, 0, kill_at, held(study.parent / "hold"))
    assert len(kept) >= 2 and max(kept) >= kill_at
    # the newest step's iterator state is damaged: it is quarantined like any damaged step
    _damage_iterator_state(checkpoint_dir(study, 0) / str(max(kept)))
    proc = Running("run", study, cwd=study.parent)
    proc.wait_for(r"trial 1: started")
    assert "quarantin" in proc.stderr and f"step {max(kept)}" in proc.stderr, proc.stderr
    assert f"trial 0: resumed from step {sorted(kept)[-2]}" in proc.stderr, proc.stderr
    wait_for_checkpoint(checkpoint_dir(study, 1), term_at)
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 143, proc.stderr
    again = Running("run", study, cwd=study.parent)
    assert again.finish() == 0, again.stderr
    # (a signal that lands as trial 1 finishes its last steps finds nothing left to resume)
    assert "trial 1: resumed from step" in again.stderr or "trial 1: complete" in proc.stderr, again.stderr
    assert snapshot(study) == reference(**STREAM)  # params, values, every intermediate value


@pytest.mark.slow
def test_two_workers_stream_and_equal_one_process(write_study, reference):
    study = write_study(**STREAM)
    proc = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    proc.wait_for(r"trial 1: started")
    wait_for_checkpoint(checkpoint_dir(study, 1), 200)
    kill9(proc)
    assert "trial 0: started" in proc.stderr  # both trials were running, one per worker
    again = Running("run", study, "--n-jobs", "2", cwd=study.parent)
    assert again.finish() == 0, again.stderr
    assert snapshot(study) == reference(**STREAM)


@pytest.mark.slow
def test_streaming_over_four_devices_resumes_bit_identically(write_study, tmp_path, held):
    four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    settings = {**STREAM, "n_trials": 1, "train": {"steps": 300, "eval_every": 50, "seed": 0, "devices": 4}}
    ref = write_study("reference.yaml", name="ref", **settings)
    assert Running("run", ref, cwd=ref.parent, env=four).finish() == 0
    # Held at the first validation batch of the evaluation at step 250 (3 batches an evaluation),
    # after the save at 200: the kill lands mid-trial however fast the machine.
    study = write_study(**{**settings, "trial": gated_trial(tmp_path, 13, STREAM["trial"])})
    hold = held(study.parent / "hold")
    proc = Running("run", study, cwd=study.parent, env=four)
    proc.wait_for(r"trial 0: data parallel: each batch split over 4 devices")
    wait_for_checkpoint(checkpoint_dir(study, 0), 200, proc=proc)
    kill9(proc)
    hold.unlink()
    again = Running("run", study, cwd=study.parent, env=four)
    assert again.finish() == 0, again.stderr
    assert "trial 0: resumed from step" in again.stderr
    assert snapshot(study) == snapshot(ref)


@pytest.mark.slow
def test_train_batches_without_iterator_state_is_a_study_error_before_anything_exists(write_study, tmp_path):
    (tmp_path / "listy.py").write_text(textwrap.dedent('''
        import numpy as np
        from trials.digits_stream import HYPERPARAMETERS, METRICS, init, optimizer, loss, evaluate, val_batches

        def train_batches(hp, seed):
            return [{"x": np.zeros((32, 64), np.float32), "y": np.zeros(32, np.int32)}] * 1000
    '''))
    study = write_study(**{**STREAM, "trial": "listy"})
    result = run_cli("run", study, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "listy.train_batches must return a grain dataset or DataLoader" in result.stderr
    assert "got list" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()
