#!/usr/bin/env bash
# Data parallel training, deft beside PyTorch DDP in one run, on 1, 2 and 4 GPUs (as many as exist): the mid MLP
# (batch 256 per GPU), ResNet-18 in f32 (batch 128 per GPU) and, with BENCH_BF16=1, ResNet-18 under bf16 autocast.
# Usage: scripts/bench_ddp.sh [log-dir]
#   env: BUILD=build-gpu, PYTHON=python3, BENCH_BF16=1 (add resnet bf16), BENCH_TF32=1 (--tf32 to both sides),
#        BUDGET_S=540 (the whole script's wall-clock budget; each run is capped by `timeout` at the smaller of its own
#        cap and what is left, and a run that no longer fits is skipped and said so), PEER_CAP_S=240 (the cap of one
#        ddp.py run: all its modes, compilation and autotuning included), MODES (ddp.py --modes; default all:
#        eager, graph, compile_graph, autotune_graph; e.g. MODES=eager,graph to skip compiling)
# Runs $BUILD/bench_ddp --model M --gpus N and bench/peers/ddp.py --model M --gpus N, writes what they print to
# <log-dir>/ddp.txt and prints a table per model (mid, resnet_f32, resnet_bf16): per N, the step times, the scaling
# efficiency of each (throughput_N / (N * throughput_1)), the ratio torch/deft of the step times against PyTorch
# eager (> 1: deft is faster), and against PyTorch best (the fastest of ddp.py's modes, named in the table), also as
# `ddp.<model>.gpus<N>.<name> <value> <unit>` lines (speedup_vs_torch_ddp: eager; speedup_vs_torch_best).
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
budget=${BUDGET_S:-540}
peer_cap=${PEER_CAP_S:-240}
extra=()
[ "${BENCH_TF32:-0}" = 1 ] && extra=(--tf32)
modes=()
[ -n "${MODES:-}" ] && modes=(--modes "$MODES")
export NCCL_NVLS_ENABLE=0
mkdir -p "$log"
out="$log/ddp.txt"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "# scripts/bench_ddp.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $gpus GPU(s), budget ${budget} s ${extra[*]}" > "$out"
start=$SECONDS
rc=0

# run CAP NAME CMD...: CMD under `timeout` (CAP, or less if the budget says so), its output appended to $out.
run() {
  local cap=$1 name=$2; shift 2
  local left=$((budget - (SECONDS - start)))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 15 ]; then
    echo "# $name: skipped, ${left} s left of the ${budget} s budget" | tee -a "$out" >&2; rc=1; return
  fi
  echo "== $name (cap ${cap} s): $*" >&2
  timeout "$cap" "$@" >> "$out" 2>&1
  local s=$?
  [ "$s" -eq 124 ] && echo "# $name: timed out after ${cap} s" | tee -a "$out" >&2
  [ "$s" -ne 0 ] && { echo "$name failed (status $s)" >&2; rc=1; }
}

configs=("mlp f32 mid 29517" "resnet f32 resnet_f32 29527")
[ "${BENCH_BF16:-0}" = 1 ] && configs+=("resnet bf16 resnet_bf16 29537")
for c in "${configs[@]}"; do
  read -r model prec key port <<< "$c"
  for n in 1 2 4; do
    [ "$n" -le "$gpus" ] || continue
    run 60 "bench_ddp $key gpus $n" "$build/bench_ddp" --model "$model" --precision "$prec" --gpus "$n" "${extra[@]}"
    run "$peer_cap" "ddp.py $key gpus $n" "$python" bench/peers/ddp.py --model "$model" --precision "$prec" --gpus "$n" \
      --port $((port + n)) "${modes[@]}" "${extra[@]}"
  done
done
echo "# scripts/bench_ddp.sh: $((SECONDS - start)) s" >> "$out"

awk '
  $1 ~ /^ddp\.[a-z0-9_]+\.gpus[0-9]+\.(deft|torch|torch_best)_(step_ms|images_per_s|mode)$/ && NF == 3 {
    split($1, k, "."); n = substr(k[3], 5); m = k[2]; v[m, n, k[4]] = $2
    if (!(m in seen)) { seen[m] = 1; models[++nm] = m }
    if (!((m, n) in has)) { has[m, n] = 1; order[m, ++cnt[m]] = n } }
  END {
    for (j = 1; j <= nm; j++) {
      m = models[j]
      printf "%s%s\n", (j > 1 ? "\n" : ""), m
      printf "%-5s %12s %12s %10s %10s %12s %12s %-14s %12s\n", "gpus", "deft ms", "torch ms", "deft eff", "torch eff", \
        "torch/deft", "best ms", "torch_best", "best/deft"
      for (i = 1; i <= cnt[m]; i++) {
        n = order[m, i]; de = ""; te = ""; r = ""
        if (v[m, 1, "deft_images_per_s"] > 0 && v[m, n, "deft_images_per_s"] > 0)
          de = v[m, n, "deft_images_per_s"] / (n * v[m, 1, "deft_images_per_s"])
        if (v[m, 1, "torch_images_per_s"] > 0 && v[m, n, "torch_images_per_s"] > 0)
          te = v[m, n, "torch_images_per_s"] / (n * v[m, 1, "torch_images_per_s"])
        if (v[m, n, "deft_step_ms"] > 0 && v[m, n, "torch_step_ms"] > 0) r = v[m, n, "torch_step_ms"] / v[m, n, "deft_step_ms"]
        # PyTorch best: the fastest of its modes (ddp.py torch_best_*: eager, graph, compile_graph, autotune_graph)
        rb = ""
        if (v[m, n, "deft_step_ms"] > 0 && v[m, n, "torch_best_step_ms"] > 0)
          rb = v[m, n, "torch_best_step_ms"] / v[m, n, "deft_step_ms"]
        printf "%-5s %12s %12s %10s %10s %12s %12s %-14s %12s\n", n, v[m, n, "deft_step_ms"], v[m, n, "torch_step_ms"], \
          de, te, r, v[m, n, "torch_best_step_ms"], v[m, n, "torch_best_mode"], rb
        if (de != "") lines = lines sprintf("ddp.%s.gpus%s.deft_scaling_efficiency %.4f x\n", m, n, de)
        if (te != "") lines = lines sprintf("ddp.%s.gpus%s.torch_scaling_efficiency %.4f x\n", m, n, te)
        if (r != "") lines = lines sprintf("ddp.%s.gpus%s.speedup_vs_torch_ddp %.4f x\n", m, n, r)
        if (rb != "") lines = lines sprintf("ddp.%s.gpus%s.speedup_vs_torch_best %.4f x\n", m, n, rb)
      }
    }
    printf "%s", lines
  }' "$out" | tee -a "$out"
exit $rc
