#!/usr/bin/env bash
# Runs the main example under valgrind's memcheck: any invalid access, use of uninitialised memory, or definite or
# indirect leak fails (exit 1). Memory "possibly lost" in libgomp's or OpenBLAS's thread pools does not fail, and
# scripts/valgrind.supp hides what those pools leave behind at exit.
#
#   scripts/check_valgrind.sh [program [args...]]     (default: hello_deft of the CUDA-off build)
#
# It uses the CUDA-off build (BUILD_DIR=build-nocuda, configured and built here when absent): the CUDA runtime
# and driver make memcheck report thousands of false errors and run very slowly.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build-nocuda}

if ! command -v valgrind >/dev/null 2>&1; then
    echo "check_valgrind: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
fi

if [ $# -eq 0 ]; then
    if [ ! -x "$BUILD_DIR/hello_deft" ]; then
        gen=()
        if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
            gen=(-G Ninja)
        fi
        echo "== check_valgrind: building $BUILD_DIR/hello_deft (DEFT_CUDA=OFF)"
        cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DDEFT_CUDA=OFF
        cmake --build "$BUILD_DIR" --target hello_deft
    fi
    set -- "$BUILD_DIR/hello_deft"
fi
prog=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift

# One OpenMP and one OpenBLAS thread: fewer pool threads, less noise, and a deterministic run.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
supp="$PWD/scripts/valgrind.supp"
log=$(mktemp /tmp/deft-valgrind.XXXXXX)

echo "== check_valgrind: valgrind $prog $*"
status=0
# Run where the program sits, so the files it writes (hello_deft.dot) land in the build directory.
(cd "$(dirname "$prog")" &&
 valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \
          --errors-for-leak-kinds=definite,indirect --error-exitcode=1 --track-origins=yes \
          --suppressions="$supp" --num-callers=30 --log-file="$log" "$prog" "$@") || status=$?
cat "$log"
rm -f "$log"
if [ "$status" -ne 0 ]; then
    echo "check_valgrind: FAILED (exit $status): see the errors or leaks above" >&2
    exit 1
fi
echo "== check_valgrind: passed, no memory errors and no definite or indirect leaks"
