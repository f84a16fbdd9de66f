#!/usr/bin/env bash
# Large square matrix products, deft beside cuBLAS called directly and PyTorch, on the same GPU in one run. Run from
# the repository root after build-gpu is built. Usage: scripts/bench_matmul.sh [log-dir]
#   (env: BUILD=build-gpu, PYTHON=python3; extra arguments for both benches in BENCH_ARGS, e.g. "--size 8192")
#
# Runs build-gpu/bench_matmul (deft and cuBLAS directly) and bench/peers/matmul.py (torch.matmul), writes everything
# they print to <log-dir>/matmul.txt, and prints a table per size and precision: milliseconds and TFLOP/s of each,
# deft/cublas (the time ratio; the target is <= 1.03, deft within 3% of cuBLAS called directly) and torch/deft
# (> 1: deft is faster). The ratios are also printed as `matmul.<S>.<p>.deft_over_cublas <r> x` and
# `matmul.<S>.<p>.torch_over_deft <r> x` lines, appended to the same file.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
args=${BENCH_ARGS:-}
mkdir -p "$log"
out="$log/matmul.txt"
rc=0

{
  echo "# scripts/bench_matmul.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
} > "$out"

echo "== deft and cuBLAS: $build/bench_matmul $args" >&2
# shellcheck disable=SC2086
"$build/bench_matmul" $args > "$log/matmul_deft.txt" 2>&1 || { echo "bench_matmul failed" >&2; rc=1; }
cat "$log/matmul_deft.txt" >> "$out"

echo "== torch: $python bench/peers/matmul.py $args" >&2
# shellcheck disable=SC2086
"$python" bench/peers/matmul.py $args > "$log/matmul_torch.txt" 2>&1 || { echo "matmul.py failed" >&2; rc=1; }
cat "$log/matmul_torch.txt" >> "$out"

# Anything that is not a figure (skips, errors, the comment lines) is shown as it came.
grep -v '^matmul\.' "$out" | grep -v '^# gpu' >&2

awk '
  $1 ~ /^matmul\./ { v[$1] = $2 }
  function get(k) { return (k in v) ? v[k] : "" }
  function num(x, f) { return x == "" ? "-" : sprintf(f, x) }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : a / b }
  END {
    printf "%-6s %-5s %10s %10s %10s %9s %9s %9s %12s %11s\n", "size", "prec", "deft_ms", "cublas_ms", "torch_ms", \
      "deft_TF", "cublas_TF", "torch_TF", "deft/cublas", "torch/deft"
    ns = split("8192 10000", sizes, " "); np = split("fp32 tf32 bf16 fp16", precs, " ")
    # a size given with --size shows up too
    for (k in v) {
      if (split(k, parts, ".") < 3 || (parts[2] in seen)) continue
      seen[parts[2]] = 1
      if (parts[2] != 8192 && parts[2] != 10000) sizes[++ns] = parts[2]
    }
    for (i = 1; i <= ns; i++) for (j = 1; j <= np; j++) {
      p = "matmul." sizes[i] "." precs[j] "."
      d = get(p "deft_ms"); c = get(p "cublas_ms"); t = get(p "torch_ms")
      if (d == "" && c == "" && t == "") continue
      rc_ = ratio(d, c); rt = ratio(t, d)
      printf "%-6s %-5s %10s %10s %10s %9s %9s %9s %12s %11s\n", sizes[i], precs[j], num(d, "%.3f"), num(c, "%.3f"), \
        num(t, "%.3f"), num(get(p "deft_tflops"), "%.1f"), num(get(p "cublas_tflops"), "%.1f"), \
        num(get(p "torch_tflops"), "%.1f"), rc_ == "" ? "-" : sprintf("%.3f", rc_), rt == "" ? "-" : sprintf("%.3f", rt)
      if (rc_ != "") lines = lines sprintf("%sdeft_over_cublas %.4f x\n", p, rc_)
      if (rt != "") lines = lines sprintf("%storch_over_deft %.4f x\n", p, rt)
    }
    printf "%s", lines
  }' "$out" | tee "$log/matmul_table.txt"
grep '^matmul\.' "$log/matmul_table.txt" >> "$out"
echo "(figures: $out)"
exit $rc
