"""Issue 17: what the remote tier (checkpoint.remote) costs training, and its upload throughput.

Against $AWS_ENDPOINT_URL if set; else moto's S3 server, started here as a separate process on
localhost and pinned to the last core, with this process (training, and the upload client) on the
others, as if the server were another machine: both sides train on the same cores.
In ABBA order, `--rounds` times:

1. blocking: a trial of the large-state study (benchmarks/large_state.yaml: ~100 MB of params and
   Adam state, every_steps saves) trained by the runner, remote on vs off: the seconds the
   training thread spent in saves (the goodput ledger's `checkpoint_blocking`; target on/off
   <= 1.05), and its wall time (uploads share the cores; they are waited for outside the timing).
2. upload throughput: one committed step of that trial uploaded by the remote tier (its files,
   its checksum, the commit marker) vs boto3's own `upload_file` of the same files with the same
   client. Reported as MB/s and their ratio.

    .venv/bin/python benchmarks/remote.py [--rounds 4] [--steps 60] [--every 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

from sweep.checkpoints.remote import RemoteTier
from sweep.checkpoints.s3 import S3Tier
from sweep.host.signals import StopSignal
from sweep.train import loop as runner
from sweep.train.ledger import RunLedger
from sweep.train.state import trial_checkpoints

BUCKET = "sweep-bench"


class _Null:
    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False


def _server() -> subprocess.Popen | None:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(proc.pid, {cores[-1]})
        os.sched_setaffinity(0, set(cores[:-1]))
        print(f"server on core {cores[-1]}, training and the upload client on {cores[:-1]}")
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("moto server did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    args = ap.parse_args()
    harness.quiet()
    server = _server()
    root = Path(tempfile.mkdtemp(prefix="sweep-remote-"))
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        config = harness.example(root, "benchmarks/large_state.yaml", train={"steps": args.steps,
                                 "eval_every": args.steps}, checkpoint={"every_steps": args.every,
                                                                        "every_seconds": None, "max_write_share": None})
        tier = RemoteTier(S3Tier(f"s3://{BUCKET}/bench", config.name))
        hp = config.hyperparameters({"learning_rate": 1e-3})
        counter = iter(range(10**6))

        blocking: dict[str, list[float]] = {"remote on": [], "remote off": []}

        def trained(remote: bool) -> float:
            folder = root / f"trial_{next(counter):04d}"
            ckpt = trial_checkpoints(config, 0, folder, on_commit=(lambda s: tier.upload(folder, s)) if remote else None)
            ledger = RunLedger(None)
            try:
                t = harness.timed(lambda: runner.run_trial(config, 0, hp, _Null(), {}, ckpt, StopSignal(),
                                                           ledger=ledger))
                ckpt.wait()
            finally:
                ckpt.close()
            blocking["remote on" if remote else "remote off"].append(ledger.parts["checkpoint_blocking"])
            tier.wait()  # outside the timing: the next round starts with an idle uploader
            return t

        trained(False)  # compile
        for side in blocking.values():
            side.clear()
        times = harness.alternate({"remote on": lambda r: trained(True), "remote off": lambda r: trained(False)},
                                  args.rounds)
        ratio = harness.report(f"training thread in saves, {args.steps} steps, a save every {args.every}",
                               "remote on", "remote off", blocking, "<= 1.05")
        print(f"  {'met' if ratio <= 1.05 else 'NOT met'}")
        harness.report("training thread, wall", "remote on", "remote off", times, "none (context)")

        folder = root / "trial_0000"
        step = max(int(p.name) for p in folder.iterdir() if p.name.isdigit())
        files = [p for p in (folder / str(step)).rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        plain_counter = iter(range(10**6))

        def plain(r: int) -> float:
            prefix = f"plain/{next(plain_counter)}/"
            return harness.timed(lambda: [tier.tier.client.upload_file(str(p), BUCKET, prefix + p.name) for p in files])

        upload = harness.alternate({"sweep": lambda r: harness.timed(lambda: tier.tier.commit(folder, step)),
                                    "boto3": plain}, args.rounds)
        ratio = harness.report(f"upload of one step ({size / 1e6:.1f} MB, {len(files)} files)", "sweep", "boto3",
                               upload, "none (throughput)")
        for side in ("sweep", "boto3"):
            print(f"  {side}: {size / 1e6 / sorted(upload[side])[len(upload[side]) // 2]:.0f} MB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if server is not None:
            server.terminate()


if __name__ == "__main__":
    main()
