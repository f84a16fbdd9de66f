#!/usr/bin/env bash
# MLP training steps, deft beside PyTorch on the same GPU in one run. Run from the repository root after
# scripts/gpu_suite.sh has built build-gpu. Usage: scripts/bench_mlp.sh [log-dir]   (env: BUILD=build-gpu, PYTHON=python3)
#
# Runs build-gpu/bench_mlp_train (deft, then deft with --no-graphs) and bench/peers/mlp_train.py (PyTorch eager and
# CUDA Graphs) on every configuration, in f32, TF32 (mid, large) and bf16 and f16 autocast (--amp; every
# configuration, with a second table of deft's planned arena beside the f32 program's and f16's loss scale and
# skipped steps, and deft's activation bytes (deft_device_footprint.activation_bytes: forward values kept for the
# backward pass) over the f32 program's, also as `mlp_train.<cfg>_<amp>.activation_over_f32 <r> x`), writes
# everything they print to <log-dir>/mlp_train.txt, and prints a table of the per-step times with the ratios torch/deft (> 1: deft is faster), also as
# `mlp_train.<cfg>.speedup_vs_torch_graphs <r> x` and `mlp_train.<cfg>.speedup_vs_torch_eager <r> x` lines (appended
# to the same file), and against PyTorch's best (the fastest of its modes: eager, graph, compile_graph,
# autotune_graph; mlp_train.py's torch_best_*, the mode named in the table) as `mlp_train.<cfg>.speedup_vs_torch_best
# <r> x`. MODES (mlp_train.py --modes; default all) picks PyTorch's modes. The loss columns are the losses at step 20 of each: the same data and initial weights go into
# both, so they should agree to a few digits. PER_CONFIG=1 runs every configuration in a process of its own on both
# sides (a process's first program can run a few percent faster than a later one of the same process).
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
mkdir -p "$log"
out="$log/mlp_train.txt"
rc=0
modes=()
[ -n "${MODES:-}" ] && modes=(--modes "$MODES")

# Runs "$@" once, or with PER_CONFIG=1 once per configuration of $configs (--config c added), one process each.
configs="tiny small mid large"
each() {
  if [ "${PER_CONFIG:-0}" != 1 ]; then "$@"; return; fi
  local c status=0
  for c in $configs; do "$@" --config "$c" || status=1; done
  return $status
}

{
  echo "# scripts/bench_mlp.sh, $(date -u '+%Y-%m-%d %H:%M UTC')$([ "${PER_CONFIG:-0}" = 1 ] && echo ', one process per configuration')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
} > "$out"

echo "== deft: $build/bench_mlp_train" >&2
each "$build/bench_mlp_train" > "$log/mlp_train_deft.txt" 2>&1 || { echo "bench_mlp_train failed" >&2; rc=1; }
cat "$log/mlp_train_deft.txt" >> "$out"

echo "== deft without CUDA Graphs: $build/bench_mlp_train --no-graphs" >&2
each "$build/bench_mlp_train" --no-graphs > "$log/mlp_train_deft_nographs.txt" 2>&1 \
  || { echo "bench_mlp_train --no-graphs failed (column left empty)" >&2; }
cat "$log/mlp_train_deft_nographs.txt" >> "$out"

echo "== deft without fusion: $build/bench_mlp_train --no-fusion" >&2
each "$build/bench_mlp_train" --no-fusion > "$log/mlp_train_deft_nofusion.txt" 2>&1 \
  || { echo "bench_mlp_train --no-fusion failed (column left empty)" >&2; }
cat "$log/mlp_train_deft_nofusion.txt" >> "$out"

echo "== torch: $python bench/peers/mlp_train.py" >&2
each "$python" bench/peers/mlp_train.py "${modes[@]}" > "$log/mlp_train_torch.txt" 2>&1 || { echo "mlp_train.py failed" >&2; rc=1; }
cat "$log/mlp_train_torch.txt" >> "$out"

# TF32 on both sides, mid and large (figures named <config>_tf32).
echo "== TF32: $build/bench_mlp_train --tf32, $python bench/peers/mlp_train.py --tf32" >&2
configs="mid large" each "$build/bench_mlp_train" --tf32 > "$log/mlp_train_deft_tf32.txt" 2>&1 || { echo "bench_mlp_train --tf32 failed" >&2; rc=1; }
cat "$log/mlp_train_deft_tf32.txt" >> "$out"
configs="mid large" each "$python" bench/peers/mlp_train.py --tf32 "${modes[@]}" > "$log/mlp_train_torch_tf32.txt" 2>&1 \
  || { echo "mlp_train.py --tf32 failed" >&2; rc=1; }
cat "$log/mlp_train_torch_tf32.txt" >> "$out"

# Mixed precision on both sides, every configuration (figures named <config>_bf16 and <config>_f16): deft's autocast
# against torch.autocast (with a GradScaler for f16), eager and CUDA Graphs.
for amp in bf16 f16; do
  echo "== autocast $amp: $build/bench_mlp_train --amp $amp, $python bench/peers/mlp_train.py --amp $amp" >&2
  each "$build/bench_mlp_train" --amp $amp > "$log/mlp_train_deft_$amp.txt" 2>&1 \
    || { echo "bench_mlp_train --amp $amp failed" >&2; rc=1; }
  cat "$log/mlp_train_deft_$amp.txt" >> "$out"
  each "$python" bench/peers/mlp_train.py --amp $amp "${modes[@]}" > "$log/mlp_train_torch_$amp.txt" 2>&1 \
    || { echo "mlp_train.py --amp $amp failed" >&2; rc=1; }
  cat "$log/mlp_train_torch_$amp.txt" >> "$out"
done

# Anything that is not a figure (skips, errors, the comment lines) is shown as it came.
grep -v '^mlp_train\.' "$out" | grep -v '^# gpu' >&2

awk '
  $1 ~ /^mlp_train\./ { v[$1] = $2 }
  function get(k) { return (k in v) ? v[k] : "" }
  function num(x) { return x == "" ? "-" : sprintf("%.1f", x) }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : a / b }
  END {
    n = split("tiny small mid large mid_tf32 large_tf32 tiny_bf16 small_bf16 mid_bf16 large_bf16 " \
              "tiny_f16 small_f16 mid_f16 large_f16", cfgs, " ")
    printf "%-10s %11s %11s %11s %11s %11s %11s %11s %10s %10s %-14s %10s   %-10s %-10s %-10s\n", "config", \
      "deft_us", "deft_nogr", "deft_nofus", "torch_eag", "torch_gr", "torch_cgr", "torch_agr", "gr/deft", "eag/deft", \
      "torch_best", "best/deft", "loss20_dft", "loss20_eag", "loss20_gr"
    for (i = 1; i <= n; i++) {
      c = cfgs[i]; p = "mlp_train." c "."
      d = get(p "deft_step_us"); dn = get(p "deft_nographs_step_us"); df = get(p "deft_nofusion_step_us")
      e = get(p "torch_eager_step_us"); g = get(p "torch_graph_step_us")
      cg = get(p "torch_compile_graph_step_us"); ag = get(p "torch_autotune_graph_step_us")
      # PyTorch best: the fastest of all its modes, as mlp_train.py names it (torch_best_*)
      b = get(p "torch_best_step_us"); bm = get(p "torch_best_mode")
      if (d == "" && e == "" && g == "" && b == "") continue
      rg = ratio(g, d); re = ratio(e, d); rb = ratio(b, d)
      printf "%-10s %11s %11s %11s %11s %11s %11s %11s %10s %10s %-14s %10s   %-10s %-10s %-10s\n", c, num(d), num(dn), \
        num(df), num(e), num(g), num(cg), num(ag), rg == "" ? "-" : sprintf("%.2fx", rg), \
        re == "" ? "-" : sprintf("%.2fx", re), bm == "" ? "-" : bm, rb == "" ? "-" : sprintf("%.2fx", rb), \
        get(p "deft_loss_warmup"), get(p "torch_eager_loss_warmup"), get(p "torch_graph_loss_warmup")
      if (rg != "") lines = lines sprintf("%sspeedup_vs_torch_graphs %.3f x\n", p, rg)
      if (re != "") lines = lines sprintf("%sspeedup_vs_torch_eager %.3f x\n", p, re)
      if (rb != "") lines = lines sprintf("%sspeedup_vs_torch_best %.3f x\n", p, rb)
      if (rb != "") notes = notes sprintf("# %s: torch_best is %s\n", c, bm)
    }
    printf "%s", notes
    printf "%s", lines
    printf "\n%-12s %14s %14s %9s %12s %8s %12s %12s %9s\n", "autocast", "deft_arena", "f32_arena", "arena/f32", \
      "loss_scale", "skipped", "deft_act", "f32_act", "act/f32"
    act_lines = ""
    for (i = 7; i <= n; i++) {
      c = cfgs[i]; p = "mlp_train." c "."
      a = get(p "deft_arena_bytes"); a32 = get(p "deft_arena_bytes_f32")
      if (a == "") continue
      base = c; sub(/_(bf16|f16)$/, "", base)
      act = get(p "deft_activation_bytes"); act32 = get("mlp_train." base ".deft_activation_bytes")
      ra = ratio(act, act32)
      printf "%-12s %14s %14s %9s %12s %8s %12s %12s %9s\n", c, a, a32, get(p "deft_arena_over_f32"), \
        get(p "deft_loss_scale") == "" ? "-" : get(p "deft_loss_scale"), \
        get(p "deft_skipped_steps") == "" ? "-" : get(p "deft_skipped_steps"), \
        act == "" ? "-" : act, act32 == "" ? "-" : act32, ra == "" ? "-" : sprintf("%.3fx", ra)
      if (ra != "") act_lines = act_lines sprintf("%sactivation_over_f32 %.3f x\n", p, ra)
    }
    printf "%s", act_lines
  }' "$out" | tee "$log/mlp_train_table.txt"
grep '^mlp_train\.' "$log/mlp_train_table.txt" >> "$out"
echo "(figures: $out)"
exit $rc
