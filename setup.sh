#!/usr/bin/env bash
# deft's first command: installs what the build needs (Debian/Ubuntu), configures, builds, and runs the main
# example. Run it from anywhere; it works in the repository it sits in.
#
#   ./setup.sh [extra cmake arguments...]
#
# Environment:
#   BUILD_DIR=build                 where to build (default: build)
#   DEFT_CUDA=AUTO|ON|OFF           the CUDA backend (default AUTO: on when a CUDA toolkit is found; an existing
#                                   build directory keeps what it was configured with)
#   CMAKE_CUDA_ARCHITECTURES=90     GPU architectures to compile for (default 90: H100/H200)
#   CMAKE_BUILD_TYPE=RelWithDebInfo
#   DEFT_SKIP_PACKAGES=1            do not touch system packages
#
# Packages come from apt-get, as root or through sudo. Where there is no apt-get, or it fails (a machine without a
# package registry), the script says so and goes on with what is installed: without OpenBLAS the CPU matmul is a
# plain C loop, without Ninja the build uses Makefiles, without graphviz/valgrind/pkg-config only the checks that
# need them are affected.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
BUILD_DIR=${BUILD_DIR:-build}

say() { printf '\n== setup: %s\n' "$*"; }
warn() { printf 'setup: warning: %s\n' "$*" >&2; }

# ---------------------------------------------------------------- system packages
PACKAGES=(build-essential cmake ninja-build libopenblas-dev libopenblas-openmp-dev graphviz valgrind pkg-config)

install_packages() {
    if [ "${DEFT_SKIP_PACKAGES:-0}" = 1 ]; then
        say "DEFT_SKIP_PACKAGES=1: not checking system packages"
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
        warn "apt-get is not available: not installing ${PACKAGES[*]}; going on with what is installed"
        return 0
    fi
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "system packages: all present (${PACKAGES[*]})"
        return 0
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            warn "not root and no sudo: cannot install ${missing[*]}; going on with what is installed"
            return 0
        fi
    fi
    say "installing ${missing[*]}"
    # Short network timeouts: a machine without a package registry should fail fast, not hang.
    local apt_opts=(-o Acquire::Retries=1 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30)
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update; then
        warn "apt-get update failed (no package registry reachable?): not installing ${missing[*]}; going on"
        return 0
    fi
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
            --no-install-recommends "${missing[@]}"
    then
        warn "apt-get install failed: going on with what is installed (missing: ${missing[*]})"
        return 0
    fi
}

install_packages

for tool in cmake cc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "setup: error: '$tool' is not installed and could not be installed; install a C compiler and CMake >= 3.24" >&2
        exit 1
    fi
done

# ---------------------------------------------------------------- configure and build
args=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    # A fresh build directory: Ninja when it is there. An existing one keeps the generator it was made with.
    if command -v ninja >/dev/null 2>&1; then
        args+=(-G Ninja)
    else
        warn "ninja is not installed: using CMake's default generator"
    fi
fi
# DEFT_CUDA: from the environment when set; AUTO for a fresh build directory; an existing one keeps its choice.
if [ -n "${DEFT_CUDA:-}" ]; then
    args+=("-DDEFT_CUDA=${DEFT_CUDA}")
elif [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    args+=(-DDEFT_CUDA=AUTO)
fi
if [ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]; then
    args+=("-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}")
fi
if [ -n "${CMAKE_BUILD_TYPE:-}" ]; then
    args+=("-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}")
fi
# nvcc is usually not on PATH after a plain toolkit install; CMake finds it there.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
fi

say "cmake -S . -B $BUILD_DIR ${args[*]} $*"
configure_log=$(mktemp)
trap 'rm -f "$configure_log"' EXIT
cmake -S . -B "$BUILD_DIR" ${args[@]+"${args[@]}"} "$@" | tee "$configure_log"
if grep -Eq '^DEFT_CBLAS_(LIB|INCLUDE):[A-Z]+=.*NOTFOUND' "$BUILD_DIR/CMakeCache.txt"; then
    warn "no CBLAS found (libopenblas-dev): the CPU matmul falls back to plain C loops (correct, slower)"
fi

jobs=$( (command -v nproc >/dev/null && nproc) || echo 2)
say "cmake --build $BUILD_DIR --parallel $jobs"
cmake --build "$BUILD_DIR" --parallel "$jobs"

# ---------------------------------------------------------------- what was built, and what the tests will do
# The closing lines: the CUDA backend on or off and what that means, and whether the cuda-labelled tests will run
# or skip and why (tests/gpu_check.c, the ctest cuda_tests_need_a_gpu, says it).
closing() {
    local cuda_choice
    cuda_choice=$(sed -n 's/^DEFT_CUDA:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
    if grep -q 'deft: CUDA backend ON' "$configure_log"; then
        say "built: the CUDA backend is ON (DEFT_CUDA=${cuda_choice:-AUTO}, CUDA toolkit found)"
        echo "  Every deft program links the CUDA runtime and cuBLAS and needs them at run time, GPU or not."
        echo "  For a CPU-only build: DEFT_CUDA=OFF ./setup.sh   (or DEFT_CUDA=OFF BUILD_DIR=build-cpu ./setup.sh)"
    else
        say "built: CPU only, the CUDA backend is OFF (DEFT_CUDA=${cuda_choice:-AUTO}$(
            [ "$cuda_choice" = OFF ] || printf ', no CUDA toolkit found'))"
        echo "  With a CUDA toolkit and a GPU: DEFT_CUDA=ON ./setup.sh"
    fi
    if [ -x "$BUILD_DIR/gpu_check" ]; then
        local n status=0 line
        n=$(find tests -maxdepth 1 -name 'cuda_test_*.c' | wc -l | tr -d ' ')
        line=$("$BUILD_DIR/gpu_check" "$n") || status=$?
        if [ "$status" = 77 ]; then
            say "tests: $line"
            local why=cuda_tests_need_a_gpu
            grep -q 'deft: CUDA backend ON' "$configure_log" || why=cuda_tests_need_a_cuda_build
            echo "  ctest lists them as \"Skipped\", with $why, which says why; the rest run on the CPU"
        elif [ "$status" = 0 ]; then
            say "tests: $line"
        else
            warn "$BUILD_DIR/gpu_check failed (exit $status): $line"
        fi
    fi
}

# ---------------------------------------------------------------- the main example
if [ ! -x "$BUILD_DIR/hello_deft" ]; then
    warn "$BUILD_DIR/hello_deft was not built (DEFT_BUILD_EXAMPLES=OFF?): nothing to run"
    closing
    exit 0
fi
say "running $BUILD_DIR/hello_deft (in $BUILD_DIR/)"
(cd "$BUILD_DIR" && ./hello_deft)
if [ -f "$BUILD_DIR/hello_deft.dot" ]; then
    if command -v dot >/dev/null 2>&1; then
        if dot -Tsvg "$BUILD_DIR/hello_deft.dot" -o "$BUILD_DIR/hello_deft.svg"; then
            say "the graph: $BUILD_DIR/hello_deft.dot, drawn in $BUILD_DIR/hello_deft.svg"
        else
            warn "graphviz could not draw $BUILD_DIR/hello_deft.dot"
        fi
    else
        say "the graph: $BUILD_DIR/hello_deft.dot (install graphviz to draw it: dot -Tsvg)"
    fi
fi
closing
say "done. Next: ctest --test-dir $BUILD_DIR --output-on-failure"
