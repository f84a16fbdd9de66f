#!/usr/bin/env bash
# Data parallel training, deft beside PyTorch DDP in one run: the mid MLP (batch 256 per GPU) on 1, 2 and 4 GPUs (as
# many as exist). Usage: scripts/bench_ddp.sh [log-dir]   (env: BUILD=build-gpu, PYTHON=python3)
# Runs $BUILD/bench_ddp --gpus N and bench/peers/ddp.py --gpus N, writes what they print to <log-dir>/ddp.txt and
# prints, per N, the step times, the scaling efficiency of each (throughput_N / (N * throughput_1)) and the ratio
# torch/deft of the step times (> 1: deft is faster), also as `ddp.mid.gpus<N>.<name> <value> <unit>` lines.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
mkdir -p "$log"
out="$log/ddp.txt"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "# scripts/bench_ddp.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $gpus GPU(s)" > "$out"
rc=0
for n in 1 2 4; do
  [ "$n" -le "$gpus" ] || continue
  echo "== $n GPU(s): $build/bench_ddp --gpus $n; $python bench/peers/ddp.py --gpus $n" >&2
  timeout 120 "$build/bench_ddp" --gpus "$n" >> "$out" 2>&1 || { echo "bench_ddp --gpus $n failed" >&2; rc=1; }
  timeout 150 "$python" bench/peers/ddp.py --gpus "$n" --port $((29517 + n)) >> "$out" 2>&1 \
    || { echo "ddp.py --gpus $n failed" >&2; rc=1; }
done
awk '
  $1 ~ /^ddp\.mid\.gpus[0-9]+\.(deft|torch)_(step_ms|images_per_s)$/ {
    split($1, k, "."); n = substr(k[3], 5); v[n, k[4]] = $2; if (!(n in seen)) { seen[n] = 1; order[++m] = n } }
  END {
    printf "%-5s %12s %12s %10s %10s %12s\n", "gpus", "deft ms", "torch ms", "deft eff", "torch eff", "torch/deft"
    for (i = 1; i <= m; i++) {
      n = order[i]; de = ""; te = ""; r = ""
      if (v[1, "deft_images_per_s"] > 0 && v[n, "deft_images_per_s"] > 0) de = v[n, "deft_images_per_s"] / (n * v[1, "deft_images_per_s"])
      if (v[1, "torch_images_per_s"] > 0 && v[n, "torch_images_per_s"] > 0) te = v[n, "torch_images_per_s"] / (n * v[1, "torch_images_per_s"])
      if (v[n, "deft_step_ms"] > 0 && v[n, "torch_step_ms"] > 0) r = v[n, "torch_step_ms"] / v[n, "deft_step_ms"]
      printf "%-5s %12s %12s %10s %10s %12s\n", n, v[n, "deft_step_ms"], v[n, "torch_step_ms"], de, te, r
      if (de != "") lines = lines sprintf("ddp.mid.gpus%s.deft_scaling_efficiency %.4f x\n", n, de)
      if (te != "") lines = lines sprintf("ddp.mid.gpus%s.torch_scaling_efficiency %.4f x\n", n, te)
      if (r != "") lines = lines sprintf("ddp.mid.gpus%s.speedup_vs_torch_ddp %.4f x\n", n, r)
    }
    printf "%s", lines
  }' "$out" | tee -a "$out"
exit $rc
