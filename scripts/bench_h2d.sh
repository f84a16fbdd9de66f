#!/usr/bin/env bash
# Host-to-device copies and a training loop fed from host memory, deft beside PyTorch on the same GPU in one run.
# Run from the repository root after the build (BUILD, default build-gpu). Usage: scripts/bench_h2d.sh [log-dir]
# (env: BUILD=build-gpu, PYTHON=python3, CONFIG=mid)
#
# Runs $BUILD/bench_h2d and bench/peers/h2d.py (copy bandwidth, 1 to 256 MiB, pageable and pinned), then
# $BUILD/bench_mlp_train --config $CONFIG with --feed device, host and prefetch, writes everything to
# <log-dir>/h2d.txt and prints, appended to the same file:
#   h2d.<S>MiB.deft_async_vs_torch_pinned <r> x      deft_feed_async_gbs / torch_pinned_gbs
#   h2d.<S>MiB.deft_pageable_vs_torch_pageable <r> x deft_feed_pageable_gbs / torch_pageable_gbs
#   mlp_train.<cfg>.feed_prefetch_vs_device <r> x    step time fed by the loader / step time on device data
#   mlp_train.<cfg>.feed_host_vs_device <r> x        step time fed synchronously / step time on device data
# The targets: feed_prefetch_vs_device <= 1.03, and h2d.*.deft_feed_async_vs_pinned >= 0.90 for the large sizes.
set -uo pipefail
log=${1:-gpu-logs}
build=${BUILD:-build-gpu}
python=${PYTHON:-python3}
cfg=${CONFIG:-mid}
mkdir -p "$log"
out="$log/h2d.txt"
rc=0

{
  echo "# scripts/bench_h2d.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
} > "$out"

echo "== deft: $build/bench_h2d" >&2
"$build/bench_h2d" >> "$out" 2>&1 || { echo "bench_h2d failed" >&2; rc=1; }
echo "== torch: $python bench/peers/h2d.py" >&2
"$python" bench/peers/h2d.py >> "$out" 2>&1 || { echo "h2d.py failed" >&2; rc=1; }
for feed in device host prefetch; do
  echo "== deft: $build/bench_mlp_train --config $cfg --feed $feed" >&2
  "$build/bench_mlp_train" --config "$cfg" --feed "$feed" >> "$out" 2>&1 \
    || { echo "bench_mlp_train --feed $feed failed" >&2; rc=1; }
done

grep -v '^h2d\.\|^mlp_train\.' "$out" | grep -v '^# gpu' >&2

awk -v cfg="$cfg" '
  $1 ~ /^(h2d|mlp_train)\./ { v[$1] = $2 }
  function get(k) { return (k in v) ? v[k] : "" }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : a / b }
  END {
    printf "%-7s %10s %10s %10s %10s %10s %10s %8s\n", "size", "raw_page", "raw_pin", "feed_page", "feed_pin", \
      "feed_async", "torch_pin", "async/pk"
    n = split("1 4 16 64 256", sz, " ")
    for (i = 1; i <= n; i++) {
      p = "h2d." sz[i] "MiB."
      printf "%-7s %10s %10s %10s %10s %10s %10s %8s\n", sz[i] "MiB", get(p "cuda_memcpy_pageable_gbs"), \
        get(p "cuda_memcpy_pinned_gbs"), get(p "deft_feed_pageable_gbs"), get(p "deft_feed_pinned_gbs"), \
        get(p "deft_feed_async_gbs"), get(p "torch_pinned_gbs"), get(p "deft_feed_async_vs_pinned")
      r = ratio(get(p "deft_feed_async_gbs"), get(p "torch_pinned_gbs"))
      if (r != "") lines = lines sprintf("%sdeft_async_vs_torch_pinned %.3f x\n", p, r)
      r = ratio(get(p "deft_feed_pageable_gbs"), get(p "torch_pageable_gbs"))
      if (r != "") lines = lines sprintf("%sdeft_pageable_vs_torch_pageable %.3f x\n", p, r)
    }
    m = "mlp_train." cfg "."
    d = get(m "deft_step_us"); h = get(m "deft_feed_host_step_us"); f = get(m "deft_feed_prefetch_step_us")
    printf "\n%s step (us): device %s, host (sync feed) %s, prefetch (loader) %s\n", cfg, d, h, f
    r = ratio(f, d); if (r != "") lines = lines sprintf("%sfeed_prefetch_vs_device %.4f x\n", m, r)
    r = ratio(h, d); if (r != "") lines = lines sprintf("%sfeed_host_vs_device %.4f x\n", m, r)
    printf "%s", lines
  }' "$out" | tee "$log/h2d_table.txt"
grep '^\(h2d\|mlp_train\)\.' "$log/h2d_table.txt" >> "$out"
echo "(figures: $out)"
exit $rc
