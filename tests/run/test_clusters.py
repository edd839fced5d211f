"""What the cluster recipes (examples/slurm, examples/k8s) run: the same `sweep run STUDY --n-jobs auto`
on N "nodes", each with its own SWEEP_HOST and working directory (so its own local workdir), against
one PostgreSQL database and one S3 bucket on localhost; a node killed and its trial taken over from
the bucket, and a folder with no checkpoints that exports from the bucket alone."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import (gated_trial, BASE_STUDY, BUCKET, Running, cli_here, kill9, merge, run_cli, snapshot, tier_of,
                      wait_for_checkpoint)

pytestmark = pytest.mark.slow  # every test here starts real processes


def test_nodes_share_only_postgres_and_the_bucket_and_a_dead_node_s_trial_is_taken_over(
        tmp_path, postgres_url, s3_server, reference, monkeypatch, held):  # noqa: F811
    """Node 0 is killed mid-trial, right after its step reached the bucket, and its disk is wiped;
    node 1, with its own empty workdir, takes the trial over from the bucket after the lease grace;
    the study equals an uninterrupted one; a third folder exports reading only the bucket."""
    settings = dict(n_trials=3, sampler={"type": "random", "seed": 3}, pruner={"type": "none"},
                    train={"steps": 20000, "eval_every": 1000}, checkpoint={"every_steps": 4000},
                    parallel={"n_jobs": "auto", "lease_grace_seconds": 3})
    data = merge(merge(BASE_STUDY, settings), {"storage": postgres_url, "trial": "gated_digits",
                                               "checkpoint": {"remote": f"s3://{BUCKET}/clusters"}})
    data.pop("workdir", None)  # relative default: each node's workdir is under the directory it runs in
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    nodes = [tmp_path / f"node{i}" for i in range(2)]
    for node in nodes:
        node.mkdir()

    # Node 0 is held at its 9th evaluation (step 9000), after its steps 4000 and 8000 (tests/trials/
    # gated.py): it cannot finish the trial before a step is in the bucket, however slow the uploads
    # (a niced thread) on a loaded machine; node 1, started elsewhere, is never held. (Two nodes
    # starting at once each wrote a bucket folder of their own into the study, and one uploaded where
    # the study no longer pointed: an upload "never arrived", a takeover found no step. The folder is
    # written once, under the ask lock: tests/store/test_claims.py holds it.)
    gated_trial(nodes[0], 9, name="gated_digits")
    held(nodes[0] / "hold")
    gated_trial(nodes[1], 9, name="gated_digits")  # the same code on every node

    def node_run(i: int) -> Running:
        return Running("run", study, "--n-jobs", "auto", cwd=nodes[i], env={"SWEEP_HOST": f"node-{i}"})

    first, second = node_run(0), node_run(1)  # both nodes train at once, each a trial of its own
    number = int(first.wait_for(r"trial (\d+): started").group(1))
    other = int(second.wait_for(r"trial (\d+): started").group(1))
    assert other != number
    wait_for_checkpoint(nodes[0] / "runs" / "t" / "checkpoints" / f"trial_{number:04d}", 4000, proc=first)
    deadline = time.monotonic() + 300
    tier = None
    while time.monotonic() < deadline:  # until a step of the trial is in the bucket (uploads run beside training)
        try:
            tier = tier or tier_of(f"s3://{BUCKET}/clusters", postgres_url, "t")
            if tier.steps(f"trial_{number:04d}"):
                break
        except Exception:  # noqa: BLE001 - the study attribute not there yet
            pass
        time.sleep(0.1)
    else:
        raise AssertionError(f"no step of trial {number} in the bucket: {first.stderr}")
    kill9(first)
    assert f"trial {number}: complete" not in first.stderr, first.stderr
    shutil.rmtree(nodes[0])  # the node is gone with its disk
    assert second.finish() == 0, second.stderr
    assert f"trial {number}: resumed from step" in second.stderr  # after node 0's lease, from the bucket
    assert f"trial {number}: fetched step" in second.stderr
    assert "study t: 3/3 trials finished (3 complete" in second.stdout
    assert snapshot(study) == reference(**{k: v for k, v in settings.items() if k != "parallel"})
    assert not Path(nodes[0]).exists() and (nodes[1] / "runs" / "t" / "checkpoints").is_dir()

    # A third folder with no checkpoints reads only the bucket: export equals node 1's, byte for
    # byte; status says each trial's newest step there; plot marks the steps the bucket keeps.
    third = tmp_path / "node2"
    third.mkdir()
    gated_trial(third, 9, name="gated_digits")
    exported = cli_here("export", study, "--out", third / "export", cwd=third)
    assert exported.returncode == 0, exported.stderr
    assert not (third / "runs" / "t" / "checkpoints").exists()  # nothing local: the bucket only
    index = json.loads((third / "export" / "index.json").read_text())
    assert sorted(e["number"] for e in index["trials"]) == [0, 1, 2]
    assert run_cli("export", study, "--out", nodes[1] / "export", cwd=nodes[1]).returncode == 0  # another process
    for n in range(3):
        name = f"trial_{n:04d}/params.safetensors"
        assert (third / "export" / name).read_bytes() == (nodes[1] / "export" / name).read_bytes()
    shown = json.loads(cli_here("status", study, "--json", cwd=third).stdout)
    assert [t["remote_step"] for t in shown["trials"]] == [20000, 20000, 20000]
    from sweep.checkpoints import remote as remote_lib
    from sweep.commands.plot import markers
    from sweep.store.session import Session
    from sweep.study import config as config_lib

    monkeypatch.chdir(third)  # the study's relative workdir: this folder's
    session = Session(config_lib.load(study))
    try:
        session.open(create=False)
        remote = remote_lib.remote_steps(session, [number])
        marks = markers(session.config, session.trial(number), remote[number])
    finally:
        session.close()
    assert marks["checkpoint"] == remote[number] and 20000 in marks["checkpoint"]


def test_the_recipes_run_the_command_this_module_tests():
    """examples/slurm/sweep.sbatch (and its shared-filesystem variant) is valid bash whose node command is `python -m sweep run STUDY
    --n-jobs auto` (exec'd, so SLURM's SIGTERM reaches sweep); examples/k8s/job.yaml is an Indexed
    Job whose container runs the same command, and both parse with sweep's own command line."""
    import subprocess

    from conftest import REPO

    for name in ("sweep.sbatch", "sweep-shared-fs.sbatch"):  # PostgreSQL and a bucket; a journal file (issue 41)
        sbatch = REPO / "examples" / "slurm" / name
        assert subprocess.run(["bash", "-n", str(sbatch)], capture_output=True).returncode == 0
        node = [line for line in sbatch.read_text().splitlines() if line.startswith("exec ")]
        assert node == ['exec python -m sweep run "$STUDY" --n-jobs auto'], (name, node)
    job = yaml.safe_load((REPO / "examples" / "k8s" / "job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:4] == ["python", "-m", "sweep", "run"] and command[5:] == ["--n-jobs", "auto"], command
    from sweep.__main__ import _parser as parser

    for args in (["run", "study.yaml", "--n-jobs", "auto"], command[3:]):
        parsed = parser().parse_args(args)
        assert parsed.n_jobs == "auto"
