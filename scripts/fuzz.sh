#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.c) with clang, ASan and UBSan in build-fuzz/ (CPU only), writes each
# target's seed corpus with the library's own writers, and runs every target for a fixed time. Any crash, sanitizer
# report, leak, timeout or broken property fails the script; the input that caused it is kept in
# build-fuzz/crashes/<target>/ (reproduce: build-fuzz/<target> build-fuzz/crashes/<target>/crash-...).
#
#   scripts/fuzz.sh [seconds-per-target [target...]]     (default: 60 s, every target)
#
# Environment:
#   BUILD_DIR=build-fuzz     where to build; the corpora grow in BUILD_DIR/corpus/<target> from run to run
#   FUZZ_JOBS=1              targets run at once (each on one core: the library's threads are set to one)
#   FUZZ_TIMEOUT=60          seconds one input may take before it counts as a hang
#   CC=clang                 the compiler for a fresh build directory
# Prints, per target: fuzz.<target>.runs <n> count, fuzz.<target>.crashes <n> count and fuzz.<target>.seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${1:-60}
shift $(( $# > 0 ? 1 : 0 ))
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_JOBS=${FUZZ_JOBS:-1}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-60}
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

cc=${CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "fuzz: $cc is not installed (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
fi

gen=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    gen=(-G Ninja)
fi
jobs=$( (command -v nproc >/dev/null && nproc) || echo 2)
echo "== fuzz: configure $BUILD_DIR ($cc, libFuzzer + ASan + UBSan, CPU only)"
CC=$cc cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DDEFT_FUZZ=ON -DDEFT_CUDA=OFF -DDEFT_BUILD_TESTS=OFF \
      -DDEFT_BUILD_BENCH=OFF -DDEFT_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
echo "== fuzz: build"
cmake --build "$BUILD_DIR" --parallel "$jobs" --target "${targets[@]}"

# One target: fresh seeds, the kept corpus, a log; the result as three lines in BUILD_DIR/results/<target>.
fuzz_one() {
    local t=$1 bin=$BUILD_DIR/$1 seeds=$BUILD_DIR/seeds/$1 corpus=$BUILD_DIR/corpus/$1
    local crashes=$BUILD_DIR/crashes/$1 log=$BUILD_DIR/logs/$1.log
    rm -rf "$seeds" "$BUILD_DIR/results/$t"
    mkdir -p "$seeds" "$corpus" "$crashes" "$BUILD_DIR/logs" "$BUILD_DIR/results"
    "$bin" --write-seeds "$seeds" >"$log" 2>&1 || { echo "fuzz: $t --write-seeds failed" >>"$log"; return 1; }
    local before after status=0 start=$SECONDS
    # A slow unit (one input past libFuzzer's report_slow_units, under the timeout) is written beside the crashes but
    # is none: an input may ask for a large product on the CPU. Only -timeout makes slowness a failure.
    before=$(find "$crashes" -type f ! -name 'slow-unit-*' | wc -l)
    "$bin" -max_total_time="$seconds" -timeout="$FUZZ_TIMEOUT" -print_final_stats=1 \
           -artifact_prefix="$crashes/" "$corpus" "$seeds" >>"$log" 2>&1 || status=$?
    after=$(find "$crashes" -type f ! -name 'slow-unit-*' | wc -l)
    local runs
    runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
    local found=$((after - before))
    if [ "$status" -ne 0 ] && [ "$found" -eq 0 ]; then found=1; fi
    printf 'fuzz.%s.runs %s count\nfuzz.%s.crashes %s count\nfuzz.%s.seconds %s s\n' \
        "$t" "${runs:-0}" "$t" "$found" "$t" "$((SECONDS - start))" > "$BUILD_DIR/results/$t"
}

echo "== fuzz: ${targets[*]}, ${seconds} s each, $FUZZ_JOBS at a time"
running=0
for t in "${targets[@]}"; do
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$FUZZ_JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait || true

failed=0
for t in "${targets[@]}"; do
    if [ ! -f "$BUILD_DIR/results/$t" ]; then
        printf 'fuzz.%s.runs 0 count\nfuzz.%s.crashes 1 count\n' "$t" "$t" > "$BUILD_DIR/results/$t"
    fi
    cat "$BUILD_DIR/results/$t"
    if ! grep -q "^fuzz\.$t\.crashes 0 count" "$BUILD_DIR/results/$t"; then
        failed=1
        echo "fuzz: $t FAILED; the end of $BUILD_DIR/logs/$t.log:" >&2
        tail -40 "$BUILD_DIR/logs/$t.log" >&2
        echo "fuzz: reproduce with: $BUILD_DIR/$t <file>, for each file in $BUILD_DIR/crashes/$t/" >&2
    fi
done
if [ "$failed" -ne 0 ]; then
    echo "fuzz: FAILED" >&2
    exit 1
fi
echo "== fuzz: passed, no crash"
