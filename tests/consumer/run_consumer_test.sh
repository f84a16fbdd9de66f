#!/usr/bin/env bash
# The `install_consumer` test: installs a built deft into a scratch prefix and uses it the two ways a user would,
#   1. a CMake project (tests/consumer/CMakeLists.txt): find_package(deft) and deft::deft;
#   2. a plain compiler line: cc main.c $(pkg-config --cflags --libs deft);
# and runs both programs, which check their numbers.
#
# usage: run_consumer_test.sh <deft build dir> <consumer source dir> <cmake generator> <C compiler> [config]
set -euo pipefail

if [ $# -lt 4 ]; then
    echo "usage: $0 <deft build dir> <consumer source dir> <cmake generator> <C compiler> [config]" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
generator=$3
cc=$4
config=${5:-}

work="$build/install_consumer"
prefix="$work/prefix"
rm -rf "$work"
mkdir -p "$work"

step() { printf '\n== %s\n' "$*"; }

step "install deft into $prefix"
cmake --install "$build" --prefix "$prefix" ${config:+--config "$config"}

# deft.h includes the headers under include/deft/: they come with it. The test support (deft_testing.h and its
# library) is deft's own and never installed.
for h in core compile train memory data dist; do
    if [ -z "$(find "$prefix" -path "*/include/deft/$h.h")" ]; then
        echo "FAIL: include/deft/$h.h was not installed beside deft.h" >&2
        exit 1
    fi
done
if [ -n "$(find "$prefix" -name 'deft_testing*')" ]; then
    echo "FAIL: the test support was installed: $(find "$prefix" -name 'deft_testing*')" >&2
    exit 1
fi

# ---- 1. CMake: find_package(deft) ----
step "configure the consumer project with CMAKE_PREFIX_PATH=$prefix"
cmake -S "$src" -B "$work/cmake" -G "$generator" \
      -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_BUILD_TYPE="${config:-Release}" \
      -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
found_dir=$(sed -n 's/^deft_DIR:PATH=//p' "$work/cmake/CMakeCache.txt")
case "$found_dir" in
    "$prefix"/*) echo "find_package(deft) used $found_dir" ;;
    *) echo "FAIL: find_package(deft) found '$found_dir', not the package installed under $prefix" >&2; exit 1 ;;
esac

step "build the consumer project"
cmake --build "$work/cmake" ${config:+--config "$config"}
exe=$(find "$work/cmake" -type f -name deft_consumer -perm -u+x | head -n 1)
if [ -z "$exe" ]; then
    echo "FAIL: the consumer program was not built" >&2
    exit 1
fi

step "run $exe"
"$exe"

# ---- 2. pkg-config ----
pcfile=$(find "$prefix" -name deft.pc | head -n 1)
if [ -z "$pcfile" ]; then
    echo "FAIL: no deft.pc was installed under $prefix" >&2
    exit 1
fi
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "pkg-config is not installed: the pkg-config half of this test is skipped (deft.pc is at $pcfile)"
    exit 0
fi
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pcfile")
step "pkg-config with PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
pkg-config --print-errors --exists deft
echo "version: $(pkg-config --modversion deft)"
cflags=$(pkg-config --cflags deft)
libs=$(pkg-config --libs deft)
echo "cflags: $cflags"
echo "libs:   $libs"
case "$cflags" in
    *"$prefix"*) ;;
    *) echo "FAIL: pkg-config --cflags does not point into $prefix" >&2; exit 1 ;;
esac

step "build with: $cc main.c \$(pkg-config --cflags --libs deft)"
# shellcheck disable=SC2086  # the flags are meant to split into words
"$cc" -std=c11 -o "$work/deft_consumer_pc" "$src/main.c" $cflags $libs

step "run $work/deft_consumer_pc"
"$work/deft_consumer_pc"

printf '\ninstall_consumer: the CMake package and pkg-config both work\n'
