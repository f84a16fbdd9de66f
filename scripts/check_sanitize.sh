#!/usr/bin/env bash
# Builds the tests and examples with AddressSanitizer + UndefinedBehaviorSanitizer (DEFT_SANITIZE=ON) in
# build-asan/, runs their ctest and the main example. Any sanitizer report fails (-fno-sanitize-recover=all).
#
#   scripts/check_sanitize.sh [extra cmake arguments...]      (BUILD_DIR=build-asan by default)
#
# CPU only (DEFT_CUDA=OFF), on purpose:
#  - the CUDA backend is compiled once, in the main build (build/); compiling every .cu file again for a sanitizer
#    build would double the slowest part of CI for no gain, since nvcc-compiled host code is not instrumented and
#    device code cannot be;
#  - the CUDA runtime and driver do not mix well with ASan (it maps memory where ASan keeps its shadow gap, and
#    its own allocations show up as leaks);
#  - CI has no GPU, so the CUDA paths would only skip there anyway.
# What it does check is every line of C in base/, ir/, plan/, mem/, ops/cpu, passes/, runtime/, data/ and dist/ that a CPU run reaches, which is
# where the planner's offsets, the shape code and the kernels' indexing live.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}

gen=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    gen=(-G Ninja)
fi
jobs=$( (command -v nproc >/dev/null && nproc) || echo 2)

echo "== check_sanitize: configure $BUILD_DIR (ASan + UBSan, CPU only)"
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DDEFT_SANITIZE=ON -DDEFT_CUDA=OFF -DDEFT_BUILD_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
echo "== check_sanitize: build"
cmake --build "$BUILD_DIR" --parallel "$jobs"

# The same options tests/tests.cmake gives the tests; halt on the first UBSan report too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "== check_sanitize: ctest"
ctest --test-dir "$BUILD_DIR" --output-on-failure --parallel "$jobs"

if [ -x "$BUILD_DIR/hello_deft" ]; then
    echo "== check_sanitize: hello_deft under ASan + UBSan"
    (cd "$BUILD_DIR" && ./hello_deft > hello_deft.out) || {
        echo "check_sanitize: hello_deft failed under the sanitizers (output in $BUILD_DIR/hello_deft.out)" >&2
        exit 1
    }
fi
echo "== check_sanitize: passed"
