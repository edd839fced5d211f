"""What the cluster recipes (examples/slurm, examples/k8s) run: the same `sweep run STUDY --n-jobs auto`
on N "nodes", each with its own SWEEP_HOST and working directory (so its own local workdir), against
one PostgreSQL database and one S3 bucket on localhost; a node killed and its trial taken over."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import BASE_STUDY, BUCKET, Running, kill9, merge, snapshot, tier_of, wait_for_checkpoint

pytestmark = pytest.mark.slow  # every test here starts real processes


def test_nodes_share_only_postgres_and_the_bucket_and_a_dead_node_s_trial_is_taken_over(
        tmp_path, postgres_url, s3_server, reference):  # noqa: F811
    settings = dict(n_trials=3, sampler={"type": "random", "seed": 3}, pruner={"type": "none"},
                    train={"steps": 100000, "eval_every": 5000}, checkpoint={"every_steps": 20000},
                    parallel={"n_jobs": "auto", "lease_grace_seconds": 3})
    data = merge(merge(BASE_STUDY, settings), {"storage": postgres_url,
                                               "checkpoint": {"remote": f"s3://{BUCKET}/clusters"}})
    data.pop("workdir", None)  # relative default: each node's workdir is under the directory it runs in
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    nodes = [tmp_path / f"node{i}" for i in range(2)]
    for node in nodes:
        node.mkdir()

    def node_run(i: int) -> Running:
        return Running("run", study, "--n-jobs", "auto", cwd=nodes[i], env={"SWEEP_HOST": f"node-{i}"})

    first, second = node_run(0), node_run(1)  # both nodes train at once, each a trial of its own
    number = int(first.wait_for(r"trial (\d+): started").group(1))
    other = int(second.wait_for(r"trial (\d+): started").group(1))
    assert other != number
    wait_for_checkpoint(nodes[0] / "runs" / "t" / "checkpoints" / f"trial_{number:04d}", 20000)
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
    kill9(first)
    assert f"trial {number}: complete" not in first.stderr, "the trial ended before the kill: make it longer"
    shutil.rmtree(nodes[0])  # the node is gone with its disk
    assert second.finish() == 0, second.stderr
    assert f"trial {number}: resumed from step" in second.stderr  # after node 0's lease, from the bucket
    assert f"trial {number}: fetched step" in second.stderr
    assert "study t: 3/3 trials finished (3 complete" in second.stdout
    assert snapshot(study) == reference(**{k: v for k, v in settings.items() if k != "parallel"})
    assert not Path(nodes[0]).exists() and (nodes[1] / "runs" / "t" / "checkpoints").is_dir()


def test_the_recipes_run_the_command_this_module_tests():
    """examples/slurm/sweep.sbatch is valid bash whose node command is `python -m sweep run STUDY
    --n-jobs auto` (exec'd, so SLURM's SIGTERM reaches sweep); examples/k8s/job.yaml is an Indexed
    Job whose container runs the same command, and both parse with sweep's own command line."""
    import subprocess

    from conftest import REPO

    sbatch = REPO / "examples" / "slurm" / "sweep.sbatch"
    assert subprocess.run(["bash", "-n", str(sbatch)], capture_output=True).returncode == 0
    node = [line for line in sbatch.read_text().splitlines() if line.startswith("exec ")]
    assert node == ['exec python -m sweep run "$STUDY" --n-jobs auto'], node
    job = yaml.safe_load((REPO / "examples" / "k8s" / "job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:4] == ["python", "-m", "sweep", "run"] and command[5:] == ["--n-jobs", "auto"], command
    from sweep.__main__ import _parser as parser

    for args in (["run", "study.yaml", "--n-jobs", "auto"], command[3:]):
        parsed = parser().parse_args(args)
        assert parsed.n_jobs == "auto"
