#!/usr/bin/env bash
# compute-sanitizer over every `cuda` test and every example test of a built tree, on a GPU host: memcheck with
# --leak-check full, racecheck, synccheck and initcheck. Fails when any run reports anything (an error, a leak, a
# hazard, whatever its severity) or does not finish; prints one `<name> <value> <unit>` line per tool and in all.
#
#   scripts/check_gpu_sanitizers.sh [BUILD_DIR] [LOG_DIR]
#   env: TOOLS="memcheck racecheck synccheck initcheck"  JOBS=4 (runs at once)  TIMEOUT=900 (seconds a run)
#   racecheck is the slow one: over the whole suite on an H100 it takes more than ten minutes with 8 runs at once.
#        ONLY=<regex> (test names)
# Each run's output is kept in LOG_DIR/<tool>.<test>.txt. The tests see DEFT_TEST_COMPUTE_SANITIZER=<tool>: the
# few checks that the tool itself defeats (it serialises a copy the test holds back; its injection ignores
# CUDA_VISIBLE_DEVICES in a child) say so and stand down. The tests and their command lines come from ctest, so a
# test with arguments (the examples) runs as ctest runs it.
set -uo pipefail
build=${1:-build-gpu}
log=${2:-gpu-logs/sanitizers}
tools=${TOOLS:-memcheck racecheck synccheck initcheck}
jobs=${JOBS:-4}
timeout_s=${TIMEOUT:-900}
only=${ONLY:-}
mkdir -p "$log"
command -v compute-sanitizer >/dev/null || { echo "check_gpu_sanitizers: compute-sanitizer not found" >&2; exit 1; }

# "name<TAB>workdir<TAB>command..." for the cuda-labelled tests and the example tests.
build_abs=$(cd "$build" && pwd)
list=$(ctest --test-dir "$build" --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    labels = props.get("LABELS", [])
    if "cuda" in labels or t["name"].startswith("example_"):
        print("\t".join([t["name"], props.get("WORKING_DIRECTORY", sys.argv[1]), *t["command"]]))
' "$build_abs")
# The main example, which runs on the default device (a GPU here); ctest runs it only through setup.sh.
[ -x "$build_abs/hello_deft" ] && list=$(printf '%s\nexample_hello_deft\t%s\t%s\n' "$list" "$build_abs" \
    "$build_abs/hello_deft")
[ -n "$only" ] && list=$(printf '%s\n' "$list" | grep -E "^($only)	" || true)
[ -n "$list" ] || { echo "check_gpu_sanitizers: no test to run in $build" >&2; exit 1; }

# memcheck leaves out errors the CUDA API returns: the tests provoke them on purpose (out of memory, a failed
# launch) and deft turns each into a status, and NCCL probes kernels for other architectures. racecheck leaves out
# the libraries' kernels (cuBLASLt's nvjet, CUTLASS, cuDNN): it reports their asynchronous shared-memory pipelines on
# Hopper as races; every kernel of deft's own is checked.
tool_args() {
    case $1 in
        memcheck) echo "--tool memcheck --leak-check full --report-api-errors no" ;;
        racecheck) echo "--tool racecheck --racecheck-report all --kernel-name-exclude kns=nvjet" \
                        "--kernel-name-exclude kns=cutlass --kernel-name-exclude kns=xmma" \
                        "--kernel-name-exclude kns=cudnn" ;;
        *) echo "--tool $1" ;;
    esac
}

# One run: exits 0 when clean. A run counts as reporting when the sanitizer's summary names any error or hazard,
# when the test itself fails (not a skip), or when it is cut off.
run_one() {
    local tool=$1 line=$2 name dir out
    IFS=$'\t' read -r -a f <<< "$line"
    name=${f[0]} dir=${f[1]}
    out="$log/$tool.$name.txt"
    # shellcheck disable=SC2046
    (cd "$dir" && DEFT_TEST_COMPUTE_SANITIZER=$tool timeout "$timeout_s" compute-sanitizer $(tool_args "$tool") --error-exitcode 99 \
        "${f[@]:2}") > "$out" 2>&1
    local rc=$?
    local errors hazards
    errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$out" | tail -1)
    hazards=$(sed -n 's/.*RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p' "$out" | tail -1)
    if [ "$rc" = 124 ]; then
        echo "$tool $name: cut off after ${timeout_s}s"
        return 1
    fi
    # A program that never touches the GPU (the CPU examples) has nothing to check.
    if grep -q "terminated before first instrumented API call" "$out"; then
        echo "$tool $name: clean (no GPU work)"
        return 0
    fi
    if [ "${errors:-0}" != 0 ] || [ "${hazards:-0}" != 0 ] || { [ "$rc" != 0 ] && [ "$rc" != 77 ]; }; then
        echo "$tool $name: rc $rc, ${errors:-?} errors, ${hazards:-0} hazards ($out)"
        return 1
    fi
    echo "$tool $name: clean"
}
export -f run_one tool_args
export log timeout_s

total_bad=0
for tool in $tools; do
    t0=$SECONDS
    results=$(printf '%s\n' "$list" | xargs -d '\n' -P "$jobs" -I{} bash -c 'run_one "$0" "$1"' "$tool" {})
    printf '%s\n' "$results" | sort
    runs=$(printf '%s\n' "$results" | grep -c . || true)
    bad=$(printf '%s\n' "$results" | grep -vcE ': clean( \(no GPU work\))?$' || true)
    echo "gpu_sanitizers.$tool.runs $runs count"
    echo "gpu_sanitizers.$tool.reporting $bad count"
    echo "gpu_sanitizers.$tool.seconds $((SECONDS - t0)) s"
    total_bad=$((total_bad + bad))
done
echo "gpu_sanitizers.reporting $total_bad count"
[ "$total_bad" = 0 ]
