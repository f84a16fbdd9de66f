#!/usr/bin/env bash
# GPT-2 training steps (issue 29), deft beside PyTorch's best on the same GPU in one run. Run from the repository
# root after scripts/gpu_suite.sh has built build-gpu. Usage: scripts/bench_gpt2.sh [log-dir]
#   env: BUILD=build-gpu, PYTHON=python3, BATCHES="16 32" (the batch sizes), MODES (gpt2.py --modes; default all),
#        DEFT_ARGS / PEER_ARGS (more options for each side, e.g. "--layers 2" on both to try it small)
#
# For each batch B runs build-gpu/bench_gpt2 --batch B (GPT-2 124M, T = 1024, bf16 autocast; the first B also with
# --largest-batch) and bench/peers/gpt2.py --batch B (eager, eager in a CUDA Graph, torch.compile default and
# max-autotune-no-cudagraphs each captured in a CUDA Graph), each side in a process of its own, writes everything
# they print to <log-dir>/gpt2.txt (each run's own output also to gpt2_deft_b<B>.txt / gpt2_torch_b<B>.txt), and
# prints a table: deft's step time, tokens/s, MFU and peak bytes beside the fastest PyTorch mode's, with the ratios
# tokens/s deft / best (> 1: deft is faster) and peak bytes deft / best (< 1: deft needs less), also as
# `gpt2.<key>.tokens_per_s_vs_torch_best <r> x` and `gpt2.<key>.peak_vs_torch_best <r> x` lines appended to the file.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
batches=${BATCHES:-16 32}
mkdir -p "$log"
out="$log/gpt2.txt"
rc=0

{
  echo "# scripts/bench_gpt2.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), batches: $batches"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
} > "$out"

largest=--largest-batch
for b in $batches; do
  echo "== deft: $build/bench_gpt2 --batch $b $largest ${DEFT_ARGS:-}" >&2
  # shellcheck disable=SC2086  # the extra options are words
  "$build/bench_gpt2" --batch "$b" $largest ${DEFT_ARGS:-} > "$log/gpt2_deft_b$b.txt" 2>&1 \
    || { echo "bench_gpt2 --batch $b failed" >&2; rc=1; }
  cat "$log/gpt2_deft_b$b.txt" >> "$out"
  largest=
  echo "== torch: $python bench/peers/gpt2.py --batch $b ${MODES:+--modes $MODES} ${PEER_ARGS:-}" >&2
  # shellcheck disable=SC2086
  "$python" bench/peers/gpt2.py --batch "$b" ${MODES:+--modes "$MODES"} ${PEER_ARGS:-} > "$log/gpt2_torch_b$b.txt" 2>&1 \
    || { echo "gpt2.py --batch $b failed" >&2; rc=1; }
  cat "$log/gpt2_torch_b$b.txt" >> "$out"
done

# Anything that is not a figure (skips, errors, failed modes, the comment lines) is shown as it came.
grep -Ev '^gpt2\.[^ :]+ [^ ]+ [^ ]+$' "$out" | grep -v '^# gpu' >&2

awk '
  $1 ~ /^gpt2\.[^:]+$/ && NF == 3 { v[$1] = $2; n = split($1, part, "."); key[part[2]] = 1 }
  function get(k) { return (k in v) ? v[k] : "" }
  function num(x, f) { return x == "" ? "-" : sprintf(f, x) }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : a / b }
  function gib(x) { return x == "" ? "-" : sprintf("%.2f", x / 1073741824) }
  END {
    printf "%-26s %9s %11s %7s %8s | %-15s %9s %11s %7s %8s | %8s %8s\n", "config", "deft_ms", "deft_tok/s", \
      "mfu%", "peak_GiB", "torch_best", "torch_ms", "torch_tok/s", "mfu%", "peak_GiB", "tok/s_x", "peak_x"
    for (k in key) keys[++nk] = k
    for (i = 2; i <= nk; i++) for (j = i; j > 1 && keys[j] < keys[j - 1]; j--) { t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t }
    for (i = 1; i <= nk; i++) {
      k = keys[i]; p = "gpt2." k "."
      d = get(p "deft_tokens_per_s"); m = get(p "torch_best_mode"); t = get(p "torch_best_tokens_per_s")
      if (d == "" && t == "") continue
      dp = get(p "deft_peak_bytes"); tp = get(p "torch_best_peak_bytes")
      rt = ratio(d, t); rp = ratio(dp, tp)
      printf "%-26s %9s %11s %7s %8s | %-15s %9s %11s %7s %8s | %8s %8s\n", k, num(get(p "deft_step_ms"), "%.2f"), \
        num(d, "%.0f"), num(get(p "deft_mfu"), "%.1f"), gib(dp), m == "" ? "-" : m, \
        num(get(p "torch_best_step_ms"), "%.2f"), num(t, "%.0f"), m == "" ? "-" : num(get(p "torch_" m "_mfu"), "%.1f"), \
        gib(tp), rt == "" ? "-" : sprintf("%.2fx", rt), rp == "" ? "-" : sprintf("%.2fx", rp)
      if (rt != "") lines = lines sprintf("%stokens_per_s_vs_torch_best %.3f x\n", p, rt)
      if (rp != "") lines = lines sprintf("%speak_vs_torch_best %.3f x\n", p, rp)
      lb = get(p "deft_largest_batch")
      if (lb != "") notes = notes sprintf("# %s: deft_largest_batch %s of %s free bytes (planned %s; the next batch: %s)\n", \
        k, lb, get(p "deft_largest_batch_free_bytes"), get(p "deft_largest_batch_planned_bytes"), \
        get(p "deft_largest_batch_next_planned_bytes") == "" ? "-" : get(p "deft_largest_batch_next_planned_bytes"))
    }
    printf "%s%s", notes, lines
  }' "$out" | tee "$log/gpt2_table.txt"
grep -E '^gpt2\.[^ :]+ [^ ]+ [^ ]+$' "$log/gpt2_table.txt" >> "$out"
echo "(figures: $out)"
exit $rc
