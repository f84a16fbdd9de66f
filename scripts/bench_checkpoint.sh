#!/usr/bin/env bash
# Activation checkpointing, deft beside PyTorch on the same GPU in one run: memory against step time. Run from the
# repository root after scripts/gpu_suite.sh has built build-gpu.
# Usage: scripts/bench_checkpoint.sh [log-dir]   (env: BUILD=build-gpu, PYTHON=python3, MODEL="mlp resnet" (the
# default: both; MODEL=resnet or MODEL=mlp runs one), DEFT_ARGS: more arguments for bench_checkpoint, e.g.
# --optimizer-in-backward)
#
# Per model (mlp: the 36-layer MLP; resnet: ResNet-18, batch 256, f32 channels_last with TF32, about a minute):
# runs bench/peers/checkpoint.py --model <model> first (torch.utils.checkpoint.checkpoint_sequential over segment
# counts, each point in eager, CUDA Graph, and torch.compile default and max-autotune-no-cudagraphs captured; MODES=...
# passes --modes; PyTorch best at a point is the fastest of its modes, checkpoint.py's torch_best.*), then
# $BUILD/bench_checkpoint --model <model> over its default budgets plus one budget per PyTorch best point
# (that point's peak less 64 MiB, room for cuBLAS's and cuDNN's workspaces and the allocator's rounding, which the
# budget does not count). Writes everything to <log-dir>/checkpoint.txt (the ResNet's to checkpoint_resnet.txt) and
# prints one table of every point sorted by peak memory (deft's, PyTorch eager's as side torch, PyTorch best's as
# side torch_best with its mode): peak, step time and the time added over the same side's run without checkpointing.
# Then checks the targets against PyTorch best (the ResNet's named checkpoint.resnet.target.*):
#   checkpoint.target.torch_points_met   for how many PyTorch best checkpointing points a deft point has the same or
#                                        a lower peak and at most half of PyTorch's added time (of how many)
#   checkpoint.target.lowest_peak_ratio  deft's lowest peak / PyTorch best's lowest (target: <= 0.6)
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
models=${MODEL:-mlp resnet}
deft_args=${DEFT_ARGS:-}
mkdir -p "$log"
rc=0

# One table and its targets from the figures in $1 whose names start with $2 ("checkpoint." or "checkpoint.resnet.").
table() {
  awk -v pre="$2" '
  index($1, pre) == 1 && substr($1, length(pre) + 1) ~ /^(deft|torch|torch_best)\./ {
    n = split(substr($1, length(pre) + 1), f, "."); side = f[1]; pt = f[2]; key = f[3]
    if (n == 3 && (key == "peak_bytes" || key == "step_ms" || key == "loss_warmup" || key == "budget_bytes" ||
                   key == "dropped" || key == "segments" || key == "mode")) {
      if (side == "torch_best") has_best = 1
      v[side, pt, key] = $2
      id = side SUBSEP pt
      if (!(id in seen)) { seen[id] = 1; pts[++np] = id }
    }
  }
  END {
    base["deft"] = v["deft", "none", "step_ms"]; base["torch"] = v["torch", "none", "step_ms"]
    base["torch_best"] = v["torch_best", "none", "step_ms"]
    # the targets are against PyTorch best (per point the fastest of its modes, checkpoint.py torch_best.*), or
    # against eager (torch.*) for a log from before checkpoint.py printed a best
    ts = has_best ? "torch_best" : "torch"
    # sort the points by peak (insertion sort; a few dozen points)
    for (i = 1; i <= np; i++) order[i] = pts[i]
    for (i = 2; i <= np; i++) for (j = i; j > 1 && v[order[j], "peak_bytes"] + 0 < v[order[j - 1], "peak_bytes"] + 0; j--) {
      t = order[j]; order[j] = order[j - 1]; order[j - 1] = t
    }
    printf "%-10s %-6s %10s %10s %10s %10s %12s %8s %12s\n", "side", "point", "peak_MiB", "step_ms", "added_ms", \
      "added_%", "budget_MiB", "dropped", "loss_warmup"
    for (i = 1; i <= np; i++) {
      split(order[i], k, SUBSEP); s = k[1]; p = k[2]
      if (v[s, p, "peak_bytes"] == "" || v[s, p, "step_ms"] == "") continue
      added = v[s, p, "step_ms"] - base[s]
      what = "-"
      if (s == "torch") what = "seg " v[s, p, "segments"]
      else if (s == "torch_best") what = "seg " v[s, p, "segments"] " " v[s, p, "mode"]
      else if (p == "sqrt") what = "seg sqrt"
      else if (v[s, p, "budget_bytes"] + 0 > 0) what = sprintf("%.1f", v[s, p, "budget_bytes"] / 1048576)
      dropped = (v[s, p, "dropped"] == "") ? "-" : v[s, p, "dropped"]
      pct = (base[s] > 0) ? 100 * added / base[s] : 0
      printf "%-10s %-6s %10.1f %10.2f %10.2f %9.1f%% %12s %8s %12s\n", s, p, v[s, p, "peak_bytes"] / 1048576, \
        v[s, p, "step_ms"], added, pct, what, dropped, v[s, p, "loss_warmup"]
    }
    # targets
    met = 0; total = 0; low_d = -1; low_t = -1
    for (i = 1; i <= np; i++) {
      split(pts[i], k, SUBSEP); s = k[1]; p = k[2]
      pk = v[s, p, "peak_bytes"]; if (pk == "" || v[s, p, "step_ms"] == "") continue
      if (s == "deft" && (low_d < 0 || pk + 0 < low_d)) low_d = pk + 0
      if (s == ts && (low_t < 0 || pk + 0 < low_t)) low_t = pk + 0
      if (s != ts || p == "none") continue
      total++; t_added = v[s, p, "step_ms"] - base[ts]; ok = 0
      for (j = 1; j <= np; j++) {
        split(pts[j], q, SUBSEP); if (q[1] != "deft") continue
        dp = v["deft", q[2], "peak_bytes"]; if (dp == "" || v["deft", q[2], "step_ms"] == "") continue
        d_added = v["deft", q[2], "step_ms"] - base["deft"]
        lim = (t_added > 0) ? 0.5 * t_added : 0
        if (dp + 0 <= pk + 0 && d_added <= lim) ok = 1
      }
      met += ok
      verdict = ok ? "met: a deft point has the same or a lower peak and at most half the added time" : "NOT MET"
      printf "# %s %s (peak %.1f MiB, +%.2f ms): %s\n", ts, p, pk / 1048576, t_added, verdict
    }
    printf "%starget.torch_points_met %d count\n", pre, met
    printf "%starget.torch_points %d count\n", pre, total
    if (low_d > 0 && low_t > 0) printf "%starget.lowest_peak_ratio %.3f x\n", pre, low_d / low_t
  }' "$1"
}

# bench_one <model> <file stem>: the peer, then deft with the peer's peaks as extra budgets, then the table.
bench_one() {
  local model=$1 stem=$2 pre=checkpoint.
  [ "$model" = resnet ] && pre=checkpoint.resnet.
  local out="$log/$stem.txt"
  {
    echo "# scripts/bench_checkpoint.sh --model $model, $(date -u '+%Y-%m-%d %H:%M UTC')"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
      --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
  } > "$out"

  echo "== torch: $python bench/peers/checkpoint.py --model $model ${MODES:+--modes $MODES}" >&2
  "$python" bench/peers/checkpoint.py --model "$model" ${MODES:+--modes "$MODES"} > "$log/${stem}_torch.txt" 2>&1 \
    || { echo "checkpoint.py --model $model failed" >&2; rc=1; }
  cat "$log/${stem}_torch.txt" >> "$out"

  local budgets
  # the budgets come from PyTorch best's points (torch_best.s<k>), or from eager's (torch.s<k>) if it printed none
  local side=torch
  grep -qF "${pre}torch_best.s" "$log/${stem}_torch.txt" && side=torch_best
  budgets=$(awk -v pre="$pre" -v side="$side" 'index($1, pre side ".s") == 1 && $1 ~ /\.s[0-9]+\.peak_bytes$/ {
      b = $2 - 67108864; if (b > 0) printf "%s%.0f", sep, b; sep = "," }' "$log/${stem}_torch.txt")
  echo "== deft: $build/bench_checkpoint --model $model ${budgets:+--budgets $budgets} $deft_args" >&2
  # shellcheck disable=SC2086   # DEFT_ARGS is a list of words
  "$build/bench_checkpoint" --model "$model" ${budgets:+--budgets "$budgets"} $deft_args \
    > "$log/${stem}_deft.txt" 2>&1 || { echo "bench_checkpoint --model $model failed" >&2; rc=1; }
  cat "$log/${stem}_deft.txt" >> "$out"

  grep -v '^checkpoint\.' "$out" | grep -v '^# gpu' >&2
  table "$out" "$pre" | tee "$log/${stem}_table.txt"
  grep -F "${pre}target." "$log/${stem}_table.txt" >> "$out"
  echo "(figures: $out)"
}

for model in $models; do
  case $model in
    mlp) bench_one mlp checkpoint ;;
    resnet) bench_one resnet checkpoint_resnet ;;
    *) echo "MODEL: unknown model $model (mlp or resnet)" >&2; rc=2 ;;
  esac
done
exit $rc
