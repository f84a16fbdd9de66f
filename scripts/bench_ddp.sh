#!/usr/bin/env bash
# Data parallel training, deft beside PyTorch DDP in one run, on 1, 2 and 4 GPUs (as many as exist): the mid MLP
# (batch 256 per GPU), ResNet-18 in f32 (batch 128 per GPU) and, with BENCH_BF16=1, ResNet-18 under bf16 autocast;
# with MODELS=gpt2 (or MODEL=gpt2) GPT-2 124M (bf16, batch 16 per GPU, T 1024), deft plain and ZeRO-1 beside
# PyTorch DDP and ZeroRedundancyOptimizer.
# Usage: scripts/bench_ddp.sh [log-dir]
#   env: BUILD=build-gpu, PYTHON=python3, MODELS="mlp resnet" (any of mlp, resnet, gpt2; MODEL=... is the same),
#        GPUS="1 2 4" (those above the GPUs present are left out), BENCH_BF16=1 (add resnet bf16), BENCH_TF32=1
#        (--tf32 to both sides), BUDGET_S=540 (the whole script's wall-clock budget; each run is capped by `timeout`
#        at the smaller of its own cap and what is left, and a run that no longer fits is skipped and said so),
#        PEER_CAP_S=240 (the cap of one ddp.py run: all its modes, compilation and autotuning included), DEFT_CAP_S
#        (the cap of one bench_ddp run: 60, 150 for gpt2), MODES (ddp.py --modes for mlp and resnet; default all:
#        eager, graph, compile_graph, autotune_graph; e.g. MODES=eager,graph to skip compiling),
#        APPEND=1 (add to <log-dir>/ddp.txt instead of starting it again), SUMMARY_ONLY=1 (run nothing: print the
#        tables of <log-dir>/ddp.txt, e.g. after runs with APPEND=1 in several calls).
#   gpt2 only: GPT2_ARGS (given to bench_ddp and ddp.py alike, e.g. "--layers 2 --seq 256 --batch 4" to try it
#        small), GPT2_MODES (ddp.py's DDP modes; default graph,compile_graph: torch.compile of GPT-2 takes ~30 s a
#        mode and a process, and autotune_graph minutes), ZERO_MODES (ddp.py --zero's; default eager,compile: its
#        step may not capture), FSDP=1 (also ddp.py --fsdp, FSDP SHARD_GRAD_OP, in ZERO_MODES), DEFT_ZERO=0 (leave
#        out bench_ddp --zero).
# Runs $BUILD/bench_ddp --model M --gpus N and bench/peers/ddp.py --model M --gpus N, writes what they print to
# <log-dir>/ddp.txt and prints a table per model (mid, resnet_f32, resnet_bf16): per N, the step times, the scaling
# efficiency of each (throughput_N / (N * throughput_1)), the ratio torch/deft of the step times against PyTorch
# eager (> 1: deft is faster), and against PyTorch best (the fastest of ddp.py's modes, named in the table), also as
# `ddp.<model>.gpus<N>.<name> <value> <unit>` lines (speedup_vs_torch_ddp: eager; speedup_vs_torch_best).
# GPT-2's table (key gpt2_124m_b16_bf16, or bench_ddp's key for GPT2_ARGS): per N, deft's and deft ZeRO-1's step
# times, PyTorch DDP's best and ZeroRedundancyOptimizer's best (modes named), the scaling efficiency of each (tokens/s
# on N over N times on 1), step_time_vs_torch_best = deft / PyTorch DDP best (issue 30's target: <= 0.8; also for
# deft ZeRO), the per-GPU peaks (deft's allocator, torch.cuda.max_memory_allocated) and peak_vs_torch_zero = deft
# ZeRO / PyTorch ZeRO (target: <= 1), and the optimizer state per GPU of deft ZeRO and PyTorch ZeRO.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
budget=${BUDGET_S:-540}
peer_cap=${PEER_CAP_S:-240}
models=${MODELS:-${MODEL:-mlp resnet}}
extra=()
[ "${BENCH_TF32:-0}" = 1 ] && extra=(--tf32)
modes=()
[ -n "${MODES:-}" ] && modes=(--modes "$MODES")
read -r -a gpt2_args <<< "${GPT2_ARGS:-}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$log"
out="$log/ddp.txt"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
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

# gpt2_runs N: deft plain and ZeRO-1, PyTorch DDP and ZeroRedundancyOptimizer (and FSDP) on N GPUs.
gpt2_runs() {
  local n=$1 cap=${DEFT_CAP_S:-150} port=$((29547 + 10 * $1))
  run "$cap" "bench_ddp gpt2 gpus $n" "$build/bench_ddp" --model gpt2 --gpus "$n" "${gpt2_args[@]}" "${extra[@]}"
  [ "${DEFT_ZERO:-1}" = 1 ] && run "$cap" "bench_ddp gpt2 zero gpus $n" "$build/bench_ddp" --model gpt2 --zero \
    --gpus "$n" "${gpt2_args[@]}" "${extra[@]}"
  run "$peer_cap" "ddp.py gpt2 gpus $n" "$python" bench/peers/ddp.py --model gpt2 --gpus "$n" --port "$port" \
    --modes "${GPT2_MODES:-graph,compile_graph}" "${gpt2_args[@]}" "${extra[@]}"
  run "$peer_cap" "ddp.py gpt2 zero gpus $n" "$python" bench/peers/ddp.py --model gpt2 --zero --gpus "$n" \
    --port $((port + 1000)) --modes "${ZERO_MODES:-eager,compile}" "${gpt2_args[@]}" "${extra[@]}"
  [ "${FSDP:-0}" = 1 ] && run "$peer_cap" "ddp.py gpt2 fsdp gpus $n" "$python" bench/peers/ddp.py --model gpt2 \
    --fsdp --gpus "$n" --port $((port + 2000)) --modes "${ZERO_MODES:-eager,compile}" "${gpt2_args[@]}" "${extra[@]}"
}

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
  [ "${APPEND:-0}" = 1 ] || : > "$out"
  echo "# scripts/bench_ddp.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $gpus GPU(s), budget ${budget} s, models ${models}," \
       "GPUS ${GPUS:-1 2 4} ${extra[*]}" >> "$out"
  configs=()
  for m in $models; do
    case $m in
      mlp) configs+=("mlp f32 mid 29517") ;;
      resnet) configs+=("resnet f32 resnet_f32 29527")
              [ "${BENCH_BF16:-0}" = 1 ] && configs+=("resnet bf16 resnet_bf16 29537") ;;
      gpt2) configs+=("gpt2 bf16 gpt2 0") ;;
      *) echo "bench_ddp.sh: MODELS: $m is none of mlp, resnet, gpt2" >&2; exit 2 ;;
    esac
  done
  for c in "${configs[@]}"; do
    read -r model prec key port <<< "$c"
    for n in ${GPUS:-1 2 4}; do
      [ "$n" -le "$gpus" ] || continue
      if [ "$model" = gpt2 ]; then gpt2_runs "$n"; continue; fi
      run "${DEFT_CAP_S:-60}" "bench_ddp $key gpus $n" "$build/bench_ddp" --model "$model" --precision "$prec" \
        --gpus "$n" "${extra[@]}"
      run "$peer_cap" "ddp.py $key gpus $n" "$python" bench/peers/ddp.py --model "$model" --precision "$prec" \
        --gpus "$n" --port $((port + n)) "${modes[@]}" "${extra[@]}"
    done
  done
  echo "# scripts/bench_ddp.sh: $((SECONDS - start)) s" >> "$out"
fi

# The tables read every figure line of the log; SUMMARY_ONLY prints them again without adding them to it.
table_out=$out
[ "${SUMMARY_ONLY:-0}" = 1 ] && table_out=/dev/null

# One figure line "ddp.<model>.gpus<n>.<figure> value unit" into v[model, n, figure], the models and each model's GPU
# counts kept in the order they first appear (both tables below).
keep_figure='
  function keep(    k) {
    split($1, k, "."); n = substr(k[3], 5); m = k[2]; v[m, n, k[4]] = $2
    if (!(m in seen)) { seen[m] = 1; models[++nm] = m }
    if (!((m, n) in has)) { has[m, n] = 1; order[m, ++cnt[m]] = n }
  }'

awk "$keep_figure"'
  $1 ~ /^ddp\.[a-z0-9_]+\.gpus[0-9]+\.(deft|torch|torch_best)_(step_ms|images_per_s|mode)$/ && $1 !~ /^ddp\.gpt2/ \
      && NF == 3 {
    keep() }
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
  }' "$out" | tee -a "$table_out"

# GPT-2: deft (deft_, deft_zero_) beside PyTorch DDP best (torch_best_) and ZeroRedundancyOptimizer best
# (torch_zero_best_); FSDP best (torch_fsdp_best_) in the figure lines when it ran.
awk "$keep_figure"'
  function eff(m, n, s) {   # tokens/s on n over n times on 1, "" when either is missing
    return (v[m, 1, s "_tokens_per_s"] > 0 && v[m, n, s "_tokens_per_s"] > 0) ? \
      sprintf("%.4f", v[m, n, s "_tokens_per_s"] / (n * v[m, 1, s "_tokens_per_s"])) : ""
  }
  function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.4f", a / b) : "" }
  function mib(b) { return b > 0 ? sprintf("%.0f", b / 1048576) : "" }
  $1 ~ /^ddp\.gpt2[a-z0-9_]*\.gpus[0-9]+\./ && NF == 3 {
    keep() }
  END {
    for (j = 1; j <= nm; j++) {
      m = models[j]
      printf "\n%s (ms a step; efficiency; deft / torch DDP best step time; per-GPU peak and optimizer state MiB)\n", m
      printf "%-4s %9s %9s %9s %-14s %9s %-14s %7s %7s %7s %7s %8s %8s %7s %7s %7s %8s %8s %8s %8s\n", "gpus", \
        "deft", "deft_zero", "torch", "torch mode", "torch_z", "torch_z mode", "eff", "eff_z", "t_eff", "tz_eff", \
        "vs_best", "z_vs_bst", "peak", "peak_z", "t_peak", "tz_peak", "z/tz pk", "state_z", "t_state_z"
      for (i = 1; i <= cnt[m]; i++) {
        n = order[m, i]
        d = v[m, n, "deft_step_ms"]; dz = v[m, n, "deft_zero_step_ms"]
        t = v[m, n, "torch_best_step_ms"]; tz = v[m, n, "torch_zero_best_step_ms"]
        e = eff(m, n, "deft"); ez = eff(m, n, "deft_zero"); te = eff(m, n, "torch_best"); tze = eff(m, n, "torch_zero_best")
        r = ratio(d, t); rz = ratio(dz, t); pk = ratio(v[m, n, "deft_zero_peak_bytes"], v[m, n, "torch_zero_best_peak_bytes"])
        printf "%-4s %9s %9s %9s %-14s %9s %-14s %7s %7s %7s %7s %8s %8s %7s %7s %7s %8s %8s %8s %8s\n", n, d, dz, t, \
          v[m, n, "torch_best_mode"], tz, v[m, n, "torch_zero_best_mode"], e, ez, te, tze, r, rz, \
          mib(v[m, n, "deft_peak_bytes"]), mib(v[m, n, "deft_zero_peak_bytes"]), mib(v[m, n, "torch_best_peak_bytes"]), \
          mib(v[m, n, "torch_zero_best_peak_bytes"]), pk, mib(v[m, n, "deft_zero_optimizer_state_bytes"]), \
          mib(v[m, n, "torch_zero_" v[m, n, "torch_zero_best_mode"] "_optimizer_state_bytes"])
        p = sprintf("ddp.%s.gpus%s.", m, n)
        if (e != "") lines = lines p "deft_scaling_efficiency " e " x\n"
        if (ez != "") lines = lines p "deft_zero_scaling_efficiency " ez " x\n"
        if (te != "") lines = lines p "torch_best_scaling_efficiency " te " x\n"
        if (tze != "") lines = lines p "torch_zero_best_scaling_efficiency " tze " x\n"
        if (r != "") lines = lines p "step_time_vs_torch_best " r " x\n"
        if (rz != "") lines = lines p "zero_step_time_vs_torch_best " rz " x\n"
        if (pk != "") lines = lines p "zero_peak_vs_torch_zero " pk " x\n"
        fz = v[m, n, "torch_fsdp_best_peak_bytes"]
        if (fz > 0 && v[m, n, "deft_zero_peak_bytes"] > 0)
          lines = lines p "zero_peak_vs_torch_fsdp " ratio(v[m, n, "deft_zero_peak_bytes"], fz) " x\n"
      }
    }
    printf "%s", lines
  }' "$out" | tee -a "$table_out"
exit $rc
