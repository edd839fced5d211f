"""scheduler pbt: populations pause at every interval, the worst copy a better member's state and
perturb its float hyperparameters; kills (kill -9, SIGTERM) at random moments and at exploit
steps change nothing; `replay` retrains a lineage to the same weights; a damaged donor is never
copied; bad study files exit 2 naming the key."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from conftest import array_files, cache_env, gated_trial, interrupt_at_random, ran, cli_here, refused, run_cli, Running, study_in, study_of
from sweep.__main__ import main
from sweep.checkpoints import integrity

# Two populations of 3 (trials 0-2, 3-5), pausing at 50, 100 and 150 of 200 steps: at each, the
# worst member of a population copies the best (quantile 0.34 of 3: one). One sampled float.
PBT: dict[str, Any] = {
    "name": "pbt",
    "n_trials": 6,
    "sampler": {"type": "random", "seed": 3},
    "pruner": {"type": "none"},
    "scheduler": {"type": "pbt", "population": 3, "interval_steps": 50, "quantile": 0.34},
    "search_space": {"learning_rate": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
    "fixed": {"batch_size": 32, "hidden": 32},
    "train": {"steps": 200, "eval_every": 50},
    "checkpoint": {"every_steps": 50, "keep_last": 1, "keep_best": 1, "max_write_share": None},
}


def _write(folder: Path, **override: Any) -> Path:
    """The study file of PBT + `override` in `folder` (a key overridden with None is left out)."""
    return study_in(folder, PBT, **override)


_cache = cache_env  # the compilation cache the uninterrupted run filled


def _folder(path: Path, number: int) -> Path:
    return path.parent / "runs" / "checkpoints" / f"trial_{number:04d}"


def _final_sums(path: Path) -> dict[int, str]:
    """The checksum of every member's final state (its last step), as its checksum file records it."""
    out = {}
    last = yaml.safe_load(path.read_text())["train"]["steps"]
    for t in study_of(path).trials:
        out[t.number] = integrity.read_checksum(_folder(path, t.number), last)
    return out


def _history(path: Path) -> list[tuple[Any, ...]]:
    """Everything an interrupted run must reproduce: params, values, reports, pauses, exploits."""
    return [(t.number, t.state.name, t.params, t.value, dict(sorted(t.intermediate_values.items())),
             t.user_attrs.get("best_step"), t.user_attrs.get("paused_at"), t.user_attrs.get("pbt_params"),
             t.user_attrs.get("lineage"))
            for t in sorted(study_of(path).trials, key=lambda t: t.number)]


def _in_force_before(t: Any, step: int) -> dict[str, Any]:
    """The params trial `t` trained with up to `step`: its latest exploit's before it, else its own."""
    before = [e for e in t.user_attrs.get("lineage", []) if e["source"] is not None and e["step"] < step]
    return before[-1]["new_params"] if before else t.params


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ran(_write(tmp_path_factory.mktemp("pbt")))


@pytest.mark.slow
def test_pbt_exploits_copy_a_better_member_and_perturb_its_floats(uninterrupted):
    trials = sorted(study_of(uninterrupted).trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    resampled = 0
    for t in trials:
        assert t.user_attrs["paused_at"] == [50, 100, 150]  # every interval, in order
        population = [u for u in trials if u.number // 3 == t.number // 3]
        for e in t.user_attrs.get("lineage", []):
            # the worst of its population at the step copied the best one there, its value with it
            donor = trials[e["source"]]
            assert donor.number // 3 == t.number // 3 and donor.number != t.number
            assert e["source_value"] == donor.intermediate_values[e["step"]] == t.intermediate_values[e["step"]]
            rivals = [u.intermediate_values[e["step"]] for u in population if u.number != t.number]
            assert e["old_value"] >= max(rivals) and e["source_value"] == min(rivals)
            # the donor's float, perturbed by a factor or resampled, in its range
            donor_lr = _in_force_before(donor, e["step"])["learning_rate"]
            new = e["new_params"]["learning_rate"]
            perturbed = any(new == pytest.approx(min(1e-1, max(1e-3, donor_lr * f)), rel=1e-12) for f in (0.8, 1.2))
            resampled += not perturbed
            assert 1e-3 <= new <= 1e-1
        if t.user_attrs.get("lineage"):  # its value counts from its latest exploit on
            since = max(e["step"] for e in t.user_attrs["lineage"])
            assert t.user_attrs["best_step"] >= since
            assert t.user_attrs["pbt_params"] == t.user_attrs["lineage"][-1]["new_params"]
    exploits = [e for t in trials for e in t.user_attrs.get("lineage", [])]
    assert len(exploits) == 6  # one per population at each of the 3 intervals
    assert resampled < len(exploits)  # resample_probability 0.25: most are perturbed
    # status --json and export carry the lineage; the export's hyperparameters are those in force
    result = cli_here("status", uninterrupted, "--json", cwd=uninterrupted.parent)
    status = {t["number"]: t for t in json.loads(result.stdout)["trials"]}
    assert all(status[t.number]["lineage"] == t.user_attrs.get("lineage", []) for t in trials)
    assert all(status[t.number]["params_in_force"] == t.user_attrs.get("pbt_params", t.params) for t in trials)
    table = cli_here("status", uninterrupted, cwd=uninterrupted.parent).stdout
    last = trials[0].user_attrs["lineage"][-1] if trials[0].user_attrs.get("lineage") else None
    row = next(line for line in table.splitlines() if line.split()[:2] in (["0", "COMPLETE"], ["*", "0"]))
    assert "copied" in table and (f"trial {last['source']} at {last['step']}" in row if last else " - " in row), table
    out = uninterrupted.parent / "export"
    assert cli_here("export", uninterrupted, "--out", out, cwd=uninterrupted.parent).returncode == 0
    exploited = next(t for t in trials if t.user_attrs.get("lineage"))
    meta = json.loads((out / f"trial_{exploited.number:04d}" / "meta.json").read_text())
    assert meta["lineage"] == exploited.user_attrs["lineage"]
    assert meta["hyperparameters"]["learning_rate"] == exploited.user_attrs["pbt_params"]["learning_rate"]
    assert meta["best_step"] == exploited.user_attrs["best_step"]


@pytest.mark.slow
def test_pbt_replay_retrains_the_winner_s_lineage_to_the_same_weights(uninterrupted, tmp_path):
    trials = study_of(uninterrupted).trials
    # a member whose lineage crosses members: its state was trained by another trial first
    crossed = next(t.number for t in trials if t.user_attrs.get("lineage"))
    for args in ([], ["--trial", str(crossed)]):
        result = run_cli("replay", uninterrupted, *args, cwd=uninterrupted.parent, env=_cache(uninterrupted))
        assert result.returncode == 0, result.stderr
        assert "bit-identical: yes" in result.stdout
    assert f"trained as trial {trials[crossed].user_attrs['lineage'][-1]['source']}" in result.stdout
    best = trials[crossed].user_attrs["best_step"]  # what export writes: compared too where it is not the last
    assert (f"replayed best step {best}" in result.stdout) == (best != 200), result.stdout
    # A final state that is not what the lineage trains to: exit 1, "NO"
    sums = _folder(uninterrupted, crossed).with_name(f"trial_{crossed:04d}.sums") / "200.sweep.json"
    saved = sums.read_text()
    try:
        sums.write_text(json.dumps({"step": 200, "sha256": "0" * 64}))
        result = run_cli("replay", uninterrupted, "--trial", str(crossed), cwd=uninterrupted.parent,
                         env=_cache(uninterrupted))
        assert result.returncode == 1 and "bit-identical: NO" in result.stdout, result.stdout + result.stderr
    finally:
        sums.write_text(saved)


@pytest.mark.slow
@pytest.mark.parametrize("signum,journal", [(signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGKILL, True)],
                         ids=["kill9", "sigterm", "kill9-journal"])
def test_pbt_killed_at_random_moments_and_at_exploits_equals_an_uninterrupted_run(uninterrupted, tmp_path, signum,
                                                                                   journal, seed):
    """On a journal file too (issue 41): the same study as the uninterrupted one's on SQLite."""
    path = _write(tmp_path, **({"storage": f"journal://{tmp_path / 'shared' / 'pbt.log'}"} if journal else {}))
    # First right after an exploit (the copy made, the member not yet trained on), then at random.
    kills = interrupt_at_random(path, signum, r"exploit at step", seed=seed, env=_cache(uninterrupted))
    result = run_cli("run", path, cwd=tmp_path, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    assert kills >= 2
    assert _history(path) == _history(uninterrupted)
    assert _final_sums(path) == _final_sums(uninterrupted)  # every member's final state, bit for bit


@pytest.mark.slow
def test_a_damaged_donor_checkpoint_is_never_copied(tmp_path, held):
    """The study holds the ask lock (as a second host would) while the last member reaches step
    50; meanwhile the first donor of the worst member gets a damaged file; the exploit then
    quarantines that step and copies the next donor."""
    from sweep.schedulers import pbt
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    # Held at the process's 61st evaluation (trials 0-2 evaluate 20 times each to their pause at
    # 1000; this is trial 3's first) until the test holds the ask lock, however fast the machine.
    path = _write(tmp_path, trial=gated_trial(tmp_path, 61, name="gated_pbt"), n_trials=4,
                  scheduler={"type": "pbt", "population": 4, "interval_steps": 1000, "quantile": 0.5},
                  train={"steps": 2000}, checkpoint={"every_steps": 1000})
    hold = held(tmp_path / "hold")
    proc = Running("run", path, cwd=tmp_path)
    proc.wait_for(r"trial 0: started")
    # (the gated module is on the run's current directory, not this process's path)
    session = Session(config_lib.load(str(path), import_trial=False)).open(create=False)
    try:
        proc.wait_for(r"trial 3: started")
        with session.claims.ask_lock():  # the run cannot record trial 3's pause, nor decide, meanwhile
            hold.unlink()
            assert not any("trial 3: paused" in line for line in proc.lines), proc.stderr
            deadline = time.monotonic() + 120
            while not (1000 in session.trial(3).intermediate_values and (_folder(path, 3) / "1000").is_dir()):
                assert time.monotonic() < deadline and proc.proc.poll() is None, proc.stderr
                time.sleep(0.05)
            members = [session.trial(n) for n in range(4)]
            decision = pbt.decide(session.config, members, 1000)
            worst = max(decision, key=lambda k: members[int(k)].intermediate_values[1000])
            first, second = decision[worst]["donors"]
            # every array data file, bytes flipped (overwriting with zeros may change nothing: the
            # middle of a file can be zeros already)
            for victim in array_files(_folder(path, first) / "1000"):
                raw = bytearray(victim.read_bytes())
                raw[len(raw) // 2] ^= 0xFF
                victim.write_bytes(bytes(raw))
    finally:
        session.close()
    assert proc.finish() == 0, proc.stderr
    trials = {t.number: t for t in study_of(path).trials}
    (entry,) = trials[int(worst)].user_attrs["lineage"]
    assert entry["source"] == second and entry["source"] != first, entry
    assert f"trial {first}: checkpoint step 1000 is damaged" in proc.stderr
    assert any(p.name.startswith("1000-") for p in _folder(path, first).with_name(
        f"trial_{first:04d}.quarantine").iterdir())
    assert all(t.state.name == "COMPLETE" for t in trials.values())
    # the damaged donor went on from an older step (here: from scratch) and trained to the end
    assert trials[first].user_attrs["last_step"] == 2000


BAD = [
    ("no-population", {"scheduler": {"type": "pbt", "interval_steps": 50}}, "scheduler.population: is required"),
    ("population-above-n-trials", {"scheduler": {"type": "pbt", "population": 7, "interval_steps": 50}},
     "scheduler.population: must be <= n_trials (6)"),
    ("interval-at-end", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 200}},
     "scheduler.interval_steps: must be < train.steps (200)"),
    ("interval-off-evaluation", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 60}},
     "scheduler.interval_steps: must be a multiple of train.eval_every (50)"),
    ("asha-key", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 50, "min_steps": 50}},
     "scheduler.min_steps: only with type asha, hyperband or freeze_thaw"),
    ("unknown-key", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 50, "perturb": 2}},
     "scheduler.perturb: unknown key (allowed: type, population, interval_steps"),
    ("quantile-above-half", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 50, "quantile": 0.8}},
     "scheduler.quantile: must be <= 0.5, got 0.8"),
    ("no-member-copies", {"scheduler": {"type": "pbt", "population": 3, "interval_steps": 50}},
     "scheduler.quantile: quantile * population must be >= 1"),
    ("with-warm-start", {"warm_start": {"study": "other"}}, "warm_start: not with scheduler pbt"),
    ("last-population-copies-nothing", {"n_trials": 7},
     "n_trials: leaves a last population of 1 (population 3) in which no member copies another"),
    ("with-pruner", {"pruner": {"type": "hyperband"}}, "pruner.type: must be none with scheduler pbt"),
    ("with-remote", {"checkpoint": {"remote": "s3://bucket/x"}}, "scheduler.type: pbt copies a member's checkpoint"),
]


@pytest.mark.parametrize("override,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_pbt_bad_study_file_exits_2_naming_the_key(tmp_path, monkeypatch, capsys, override, fragment):
    monkeypatch.chdir(tmp_path)
    refused(_write(tmp_path, **override), capsys, fragment)


def test_replay_of_a_study_without_pbt_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, scheduler={"type": "asha", "min_steps": 50})
    assert main(["replay", str(path)]) == 2
    assert "scheduler.type: replay retrains a PBT lineage" in capsys.readouterr().err


@pytest.mark.slow
def test_pbt_two_hosts_on_postgres_end_with_the_same_study_as_one_process(uninterrupted, tmp_path, postgres_url):
    """Each exploit waits for its whole population at its step, so which host trains which member
    when changes nothing: the same values, lineage and final states, bit for bit."""
    path = _write(tmp_path, storage=postgres_url)
    hosts = [Running("run", path, cwd=tmp_path, env={**_cache(uninterrupted), "SWEEP_HOST": f"host{i}"})
             for i in range(2)]
    assert [h.finish() for h in hosts] == [0, 0], [h.stderr[-3000:] for h in hosts]
    assert all("started with params" in h.stderr for h in hosts)  # both hosts trained members
    assert _history(path) == _history(uninterrupted)
    assert _final_sums(path) == _final_sums(uninterrupted)


@pytest.mark.slow
def test_pbt_of_a_streaming_trial_copies_the_data_position_and_replays(tmp_path, seed):
    """trials.digits_stream (a grain pipeline over records on disk): an exploit copies the input
    pipeline's position with the state; killed right after one, the run ends as an uninterrupted
    one, and replay retrains the copied member to the same final state."""
    settings = dict(trial="trials.digits_stream", n_trials=3, fixed={"batch_size": 32, "data_dir": str(tmp_path / "data")},
                    scheduler={"type": "pbt", "population": 3, "interval_steps": 50, "quantile": 0.34},
                    train={"steps": 150})
    straight = _write(tmp_path / "straight", **settings)
    assert run_cli("run", straight, cwd=straight.parent).returncode == 0
    path = _write(tmp_path / "killed", **settings)
    kills = interrupt_at_random(path, signal.SIGKILL, r"exploit at step", seed=seed, rounds=2, env=_cache(straight))
    result = run_cli("run", path, cwd=path.parent, env=_cache(straight))
    assert result.returncode == 0, result.stderr
    assert kills >= 1
    assert _history(path) == _history(straight) and _final_sums(path) == _final_sums(straight)
    copied = [t.number for t in study_of(path).trials if t.user_attrs.get("lineage")]
    assert copied
    result = run_cli("replay", path, "--trial", str(copied[0]), cwd=path.parent, env=_cache(straight))
    assert result.returncode == 0 and "bit-identical: yes" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_continue_of_an_exploited_member_trains_its_params_in_force(uninterrupted, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(uninterrupted.parent, copy)
    path = _write(copy)
    member = next(t for t in study_of(path).trials if t.user_attrs.get("lineage"))
    result = run_cli("continue", path, "--steps", "250", "--trial", member.number, cwd=copy, env=_cache(uninterrupted))
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(path.read_text())
    (companion,) = optuna.load_study(study_name=f"{data['name']}.continued-250",
                                     storage=f"sqlite:///{data['workdir']}/study.db").trials
    assert companion.state.name == "COMPLETE" and companion.params == member.user_attrs["pbt_params"]
    since = max(e["step"] for e in member.user_attrs["lineage"])
    assert min(companion.intermediate_values) == since and max(companion.intermediate_values) == 250
    assert "resumed from step 200" in result.stderr
