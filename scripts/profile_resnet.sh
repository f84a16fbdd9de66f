#!/usr/bin/env bash
# GPU time per kernel of deft's ResNet-18 training step, under Nsight Compute, to compare kernels before and after a
# change (run it on both builds with the same settings). Run from the repository root after the build is built.
# Usage: scripts/profile_resnet.sh [log-dir]
#   env: BUILD=build-gpu, BATCH=128, PRECISION=f32 (or bf16), LAUNCH_SKIP=2500 (past compile, warm-up and the first
#        steps), LAUNCH_COUNT=600 (a few whole steps), STEP_KERNEL (a regular expression naming a kernel launched once
#        per step, default the optimizer step's kernels: its count is the number of steps in the window), DEFT_ARGS (more
#        arguments to bench_resnet, e.g. --tf32), PYTHON=python3
#
# Runs
#   ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --kill yes \
#       --launch-skip $LAUNCH_SKIP --launch-count $LAUNCH_COUNT $BUILD/bench_resnet --batch $BATCH \
#       --precision $PRECISION --no-graphs
# (eager, so that every kernel is its own launch), keeps the CSV in <log-dir>/profile_resnet_b<B>_<P>.csv, and
# prints per kernel name (template arguments kept, parameters dropped): total microseconds in the window, launches,
# microseconds per launch and, when the window holds whole steps of STEP_KERNEL, microseconds per step; then the
# sum. Nsight Compute serialises kernels and adds its own gaps, so the sum is kernel time, not a step's wall time.
set -euo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
batch=${BATCH:-128}
precision=${PRECISION:-f32}
skip=${LAUNCH_SKIP:-2500}
count=${LAUNCH_COUNT:-600}
python=${PYTHON:-python3}
step_kernel=${STEP_KERNEL:-deft_k_opt_(fused|update|finish)}
mkdir -p "$log"
csv="$log/profile_resnet_b${batch}_${precision}.csv"

command -v ncu > /dev/null || { echo "profile_resnet.sh: ncu (Nsight Compute) is not on PATH" >&2; exit 1; }
[ -x "$build/bench_resnet" ] || { echo "profile_resnet.sh: $build/bench_resnet is not built" >&2; exit 1; }

echo "== ncu ... $build/bench_resnet --batch $batch --precision $precision --no-graphs ${DEFT_ARGS:-}" >&2
# shellcheck disable=SC2086
ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --kill yes \
    --launch-skip "$skip" --launch-count "$count" \
    "$build/bench_resnet" --batch "$batch" --precision "$precision" --no-graphs ${DEFT_ARGS:-} > "$csv" \
  || echo "profile_resnet.sh: ncu exited with $? (with --kill yes the application is stopped; reading what it wrote)" >&2

"$python" - "$csv" "$step_kernel" << 'PY'
import csv, re, sys
from collections import defaultdict

path, step_re = sys.argv[1], re.compile(sys.argv[2], re.I)
lines = open(path, errors="replace").read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
if start is None:
    sys.exit("profile_resnet.sh: no CSV table in %s (see the file for what ncu said)" % path)
rows = list(csv.reader(lines[start:]))
head = rows[0]
name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
body = rows[1:]
scale = 1e-3   # ncu's default unit for durations is nanoseconds
if body and not body[0][0]:   # the units row
    unit = body[0][time_col].strip().lower()
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}.get(unit, 1e-3)
    body = body[1:]
total, launches = defaultdict(float), defaultdict(int)
for r in body:
    if len(r) <= max(name_col, time_col) or not r[time_col].strip():
        continue
    name = r[name_col]
    name = re.sub(r"^void\s+", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):   # drop the parameter list, keep template arguments
        if ch == "<": depth += 1
        elif ch == ">": depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut].replace(" ", "")
    total[name] += float(r[time_col].replace(",", "")) * scale
    launches[name] += 1
steps = max((launches[k] for k in launches if step_re.search(k)), default=0)
print("%-64s %12s %8s %10s %12s" % ("kernel", "total_us", "count", "us/launch", "us/step" if steps else ""))
for k in sorted(total, key=total.get, reverse=True):
    per_step = "%12.1f" % (total[k] / steps) if steps else ""
    print("%-64s %12.1f %8d %10.2f %s" % (k[:64], total[k], launches[k], total[k] / launches[k], per_step))
s = sum(total.values())
print("%-64s %12.1f %8d" % ("(all kernels)", s, sum(launches.values())))
if steps:
    print("steps in the window (launches of the step kernel): %d; kernel time per step %.1f us" % (steps, s / steps))
else:
    print("no kernel matched STEP_KERNEL: totals are over the window of launches, not per step")
PY
