#!/usr/bin/env bash
# Issue 26's GPU check: on a host with G GPUs, in at most ~8 minutes:
#   1. a digits study with n_jobs G (one trial per GPU): trials that ran at the same time were on
#      distinct GPUs (their `devices` in status --json, and nvidia-smi's compute processes);
#   2. trials/hour of that run against n_jobs 1 on the same trials;
#   3. packing small trials: trials/hour of 4G trials with parallel.trials_per_device M = 1, 2, 4 (n_jobs M x G,
#      each worker limited to ~0.9/M of its GPU's memory);
#   4. save blocking of a ~100 MB state on the GPU: sweep's host copy at a save (device -> private
#      numpy, what a save blocks the training thread on) against a plain host copy of 100 MB.
# Five runs of `sweep run` (80 s at most each) and a copy benchmark: under 8 minutes.
# UNVERIFIED: written without a GPU (bash -n checked only). Run from the repository root:
#   bash benchmarks/gpu_check.sh            # PYTHON=.venv/bin/python to pick the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WORK=$(mktemp -d /tmp/sweep-gpu-check.XXXXXX)
trap 'kill "${SMI_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

G=$(XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -c "import jax; print(len(jax.devices('gpu')))")
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "host: $G x $GPU_NAME"
N_TRIALS=$((2 * G))  # n_jobs 1 and n_jobs G: the same trials
N_PACK=$((4 * G))  # packing: enough for every worker of M = 4 to train one

# One shape (only the learning rate is sampled): each worker process compiles once, and a worker
# sees its GPU as its device 0, so the workers share the study's compilation cache.
study() {  # study NAME N_JOBS [M [N]] -> a study file: the digits trial, random sampler, the same trials
  "$PY" - "$WORK/$1.yaml" "$WORK/$1" "$1" "$2" "${4:-$N_TRIALS}" "${3:-1}" <<'EOF'
import sys, yaml
path, workdir, name, n_jobs, n_trials, per_device = sys.argv[1:]
raw = yaml.safe_load(open("studies/digits_mlp.yaml"))
raw.update(name=name, workdir=workdir, n_trials=int(n_trials), sampler={"type": "random", "seed": 0},
           search_space={"learning_rate": raw["search_space"]["learning_rate"]},
           fixed={"batch_size": 64, "hidden": 128, "optimizer": "adam"},
           pruner={"type": "none"}, train={"steps": 3000, "eval_every": 500, "seed": 0},
           checkpoint={"every_steps": 1000},
           parallel={"n_jobs": int(n_jobs), "trials_per_device": int(per_device)})
yaml.safe_dump(raw, open(path, "w"), sort_keys=False)
EOF
}

timed_run() {  # timed_run STUDY_FILE -> seconds of `sweep run`
  local t0 t1
  t0=$(date +%s.%N)
  timeout 80 "$PY" -m sweep run "$1" --quiet > "$1.out" 2> "$1.err" || { cat "$1.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  "$PY" -c "print(f'{$t1 - $t0:.1f}')"
}

# 1 + 2: n_jobs G, sampling which GPUs hold a python compute process meanwhile.
study many "$G"; study one 1
(while true; do nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader; sleep 1; done) \
  > "$WORK/smi.txt" 2>/dev/null &
SMI_PID=$!
T_MANY=$(timed_run "$WORK/many.yaml")
kill "$SMI_PID" 2>/dev/null || true
T_ONE=$(timed_run "$WORK/one.yaml")
study pack1 "$G" 1 "$N_PACK"; study pack2 $((2 * G)) 2 "$N_PACK"; study pack4 $((4 * G)) 4 "$N_PACK"
T_PACK1=$(timed_run "$WORK/pack1.yaml")
T_PACK2=$(timed_run "$WORK/pack2.yaml")
T_PACK4=$(timed_run "$WORK/pack4.yaml")
"$PY" -c "n = $N_PACK; print(f'packing, {n} trials, trials/hour: ' + ', '.join(f'M = {m}: {n / t * 3600:.0f} ({t:.1f} s)' for m, t in ((1, $T_PACK1), (2, $T_PACK2), (4, $T_PACK4))))"
"$PY" -m sweep status "$WORK/many.yaml" --json > "$WORK/status.json"

"$PY" - "$WORK/status.json" "$WORK/smi.txt" "$G" "$N_TRIALS" "$T_MANY" "$T_ONE" "$WORK/many.yaml" <<'EOF'
import json, sys
import optuna, yaml
status_file, smi_file, g, n, t_many, t_one, study_file = sys.argv[1:]
g, n, t_many, t_one = int(g), int(n), float(t_many), float(t_one)
trials = json.load(open(status_file))["trials"]
devices = {t["number"]: set(t["devices"]) for t in trials}
raw = yaml.safe_load(open(study_file))
frozen = {t.number: t for t in optuna.load_study(study_name=raw["name"],
                                                 storage=f"sqlite:///{raw['workdir']}/study.db").trials}
clash = [(a, b) for a in frozen for b in frozen if a < b
         and frozen[a].datetime_start < frozen[b].datetime_complete
         and frozen[b].datetime_start < frozen[a].datetime_complete and devices[a] & devices[b]]
used = set().union(*devices.values())
smi = {line.split(",")[0].strip() for line in open(smi_file) if line.strip()}
print(f"trials on distinct GPUs: devices used {sorted(used)} ({len(used)} of {g}); concurrent trials sharing a "
      f"GPU: {clash or 'none'}; nvidia-smi saw compute processes on {len(smi)} GPU(s)")
print(f"trials/hour: n_jobs {g} {n / t_many * 3600:.0f} ({t_many:.1f} s), n_jobs 1 {n / t_one * 3600:.0f} "
      f"({t_one:.1f} s), ratio {t_one / t_many:.2f} (ideal {g})")
ok = len(used) == g and not clash
print("distinct GPUs: OK" if ok else "distinct GPUs: FAILED")
sys.exit(0 if ok else 1)
EOF

# 4: save blocking of a ~100 MB state on the GPU vs a plain host copy.
"$PY" - <<'EOF'
import statistics, time
import jax, jax.numpy as jnp, numpy as np
from sweep.checkpoints.folder import host_copy
state = {f"w{i}": jnp.ones((1024, 6400), jnp.float32) * i for i in range(4)}  # 4 x 26.2 MB
jax.block_until_ready(state)
host = {k: np.asarray(v) for k, v in state.items()}
size = sum(v.nbytes for v in host.values())
def median(fn, reps=10):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times)
save = median(lambda: host_copy(state))
plain = median(lambda: {k: v.copy() for k, v in host.items()})
print(f"save blocking ({size / 1e6:.0f} MB on {jax.devices()[0].device_kind}): host_copy {save * 1e3:.1f} ms, "
      f"plain host copy {plain * 1e3:.1f} ms, ratio {save / plain:.2f}")
EOF
