#!/usr/bin/env bash
# The `install_consumer` test: installs a built deft into a scratch prefix and uses it the two ways a user would,
#   1. a CMake project (tests/consumer/CMakeLists.txt): find_package(deft) and deft::deft;
#   2. a plain compiler line: the README's pkg-config commands, run as the README writes them (taken from
#      README.md: the ```sh block with `pkg-config --cflags --libs deft`, with /opt/deft standing for the prefix);
# checks with ldd that both programs load the BLAS library deft was built with (DEFT_CBLAS_LIB), not another
# variant of it, and runs both programs, which check their numbers.
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
# The README whose pkg-config commands are run (DEFT_CONSUMER_README: another file, to try a new text).
readme=${DEFT_CONSUMER_README:-$src/../../README.md}

work="$build/install_consumer"
prefix="$work/prefix"
rm -rf "$work"
mkdir -p "$work"

step() { printf '\n== %s\n' "$*"; }

# The BLAS library the build linked (DEFT_CBLAS_LIB in its cache), by real path; empty when it has none.
blas_lib=$(sed -n 's/^DEFT_CBLAS_LIB:[A-Z]*=//p' "$build/CMakeCache.txt")
blas_inc=$(sed -n 's/^DEFT_CBLAS_INCLUDE:[A-Z]*=//p' "$build/CMakeCache.txt")
case "$blas_lib$blas_inc" in
    ""|*NOTFOUND*) blas_lib="" ;;
    *) blas_lib=$(readlink -f "$blas_lib") ;;
esac

# check_blas <program>: the program loads the very BLAS library deft was built with (ldd, where there is one).
check_blas() {
    local exe=$1 loaded
    if [ -z "$blas_lib" ]; then
        echo "deft was built without a CBLAS: no BLAS to check in $exe"
        return 0
    fi
    case "$blas_lib" in
        *.a) echo "deft was built with the static $blas_lib: nothing to check at run time"; return 0 ;;
    esac
    if ! command -v ldd >/dev/null 2>&1; then
        echo "no ldd on this machine: which BLAS $exe loads is not checked"
        return 0
    fi
    # Of the libraries ldd resolves, the one that is the BLAS deft was built with, by real path.
    local lib
    loaded=""
    while read -r lib; do
        if [ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$blas_lib" ]; then
            loaded=$lib
        fi
    done < <(ldd "$exe" | awk '$2 == "=>" { print $3 }')
    if [ -z "$loaded" ]; then
        echo "FAIL: $exe does not load the BLAS deft was built with ($blas_lib); its BLAS, as ldd resolves it:" >&2
        ldd "$exe" | grep -i blas >&2 || echo "  (none)" >&2
        exit 1
    fi
    echo "$exe loads $loaded (= $blas_lib, the BLAS deft was built with)"
}

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

step "check the BLAS that $exe loads"
check_blas "$exe"

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
pcdir=$(dirname "$pcfile")
step "check deft.pc (in $pcdir)"
libs=$(PKG_CONFIG_PATH=$pcdir pkg-config --print-errors --libs deft)
cflags=$(PKG_CONFIG_PATH=$pcdir pkg-config --print-errors --cflags deft)
echo "version: $(PKG_CONFIG_PATH=$pcdir pkg-config --modversion deft)"
echo "cflags: $cflags"
echo "libs:   $libs"
case "$cflags" in
    *"$prefix"*) ;;
    *) echo "FAIL: pkg-config --cflags does not point into $prefix" >&2; exit 1 ;;
esac

# The README's commands, verbatim but for the prefix, in a shell of their own: app.c is main.c, `cc` the compiler
# this build uses, and PKG_CONFIG_PATH starts unset, as it does for a reader.
if [ ! -f "$readme" ]; then
    echo "FAIL: no README at $readme to take the pkg-config commands from" >&2
    exit 1
fi
commands=$(awk '/^```sh$/ { inblock = 1; block = ""; next }
                /^```/ && inblock { inblock = 0; if (block ~ /pkg-config --cflags --libs deft/) { printf "%s", block; exit } next }
                inblock { block = block $0 "\n" }' "$readme")
if [ -z "$commands" ]; then
    echo "FAIL: $readme has no \`\`\`sh block with \`pkg-config --cflags --libs deft\`" >&2
    exit 1
fi
pcwork="$work/pkgconfig_app"
mkdir -p "$pcwork/bin"
cp "$src/main.c" "$pcwork/app.c"
ln -sf "$(command -v "$cc")" "$pcwork/bin/cc"
step "the README's pkg-config commands (from $readme), with /opt/deft = $prefix"
printf '%s\n' "${commands//\/opt\/deft/$prefix}"
(cd "$pcwork" && env -u PKG_CONFIG_PATH PATH="$pcwork/bin:$PATH" bash -euo pipefail -c "${commands//\/opt\/deft/$prefix}")
if [ ! -x "$pcwork/app" ]; then
    echo "FAIL: the README's pkg-config commands did not build app (in $pcwork)" >&2
    exit 1
fi

step "check the BLAS that $pcwork/app loads"
check_blas "$pcwork/app"

step "run $pcwork/app"
"$pcwork/app"

printf '\ninstall_consumer: the CMake package and pkg-config both work\n'
