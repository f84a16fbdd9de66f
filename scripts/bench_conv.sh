#!/usr/bin/env bash
# One CPU training step of conv 3x3 -> batch norm -> relu -> max pool, deft beside PyTorch on the same machine in one
# run, NCHW and NHWC. Run from the repository root after the build is built. Usage: scripts/bench_conv.sh [log-dir]
#   (env: BUILD=build-gpu, PYTHON=python3; extra arguments for both benches in BENCH_ARGS, e.g. "--batch 32")
#
# Runs $BUILD/bench_conv and bench/peers/conv.py, writes what they print to <log-dir>/conv.txt, and prints a table per
# layout: step milliseconds of each and torch/deft (> 1: deft is faster), also appended to the file as
# `conv.cpu.<layout>.torch_over_deft <r> x`.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
args=${BENCH_ARGS:-}
mkdir -p "$log"
out="$log/conv.txt"
rc=0
echo "# scripts/bench_conv.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs" > "$out"

echo "== deft: $build/bench_conv $args" >&2
# shellcheck disable=SC2086
"$build/bench_conv" $args >> "$out" 2>&1 || { echo "bench_conv failed" >&2; rc=1; }
echo "== torch: $python bench/peers/conv.py $args" >&2
# shellcheck disable=SC2086
"$python" bench/peers/conv.py $args >> "$out" 2>&1 || { echo "conv.py failed" >&2; rc=1; }
grep -v '^conv\.' "$out" >&2

awk '
  $1 ~ /^conv\./ { v[$1] = $2 }
  END {
    printf "%-6s %10s %10s %11s\n", "layout", "deft_ms", "torch_ms", "torch/deft"
    n = split("nchw nhwc", layouts, " ")
    for (i = 1; i <= n; i++) {
      p = "conv.cpu." layouts[i] "."
      d = v[p "deft_step_ms"]; t = v[p "torch_step_ms"]
      r = (d != "" && t != "" && d + 0 > 0) ? sprintf("%.3f", t / d) : "-"
      printf "%-6s %10s %10s %11s\n", layouts[i], d == "" ? "-" : d, t == "" ? "-" : t, r
      if (r != "-") lines = lines sprintf("%storch_over_deft %s x\n", p, r)
    }
    printf "%s", lines
  }' "$out" | tee "$log/conv_table.txt"
grep '^conv\.' "$log/conv_table.txt" >> "$out"
echo "(figures: $out)"
exit $rc
