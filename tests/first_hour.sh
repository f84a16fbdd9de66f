#!/usr/bin/env bash
# The `first_hour` test: a newcomer's first hour, followed from the README in a fresh clone in a temporary folder:
#   1. git clone, then the README's first command (./setup.sh), in its CPU-only form (DEFT_CUDA=OFF, which the
#      README gives for machines without a GPU; packages are left alone: the outer build installed them), which
#      builds and runs the main example;
#   2. the README's install, and both ways to use it (the CMake package and the README's pkg-config commands, run
#      word for word), each program loading the BLAS the build used (tests/consumer/run_consumer_test.sh);
#   3. `mnist_mlp NEWDIR --synthetic 600` into a directory that does not exist;
#   4. every example and benchmark answers --help with exit 0.
# The README's second command (ctest) is the suite this test runs in. It clones the last commit: changes not yet
# committed are not in it. Skips (77) where the source is no git checkout or git is missing.
#
# usage: first_hour.sh <deft source dir> <C compiler> [keep]   (keep: leave the temporary folder for a look)
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 <deft source dir> <C compiler> [keep]" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
cc=$2
keep=${3:-}

if ! command -v git >/dev/null 2>&1; then
    echo "first_hour: skipped: git is not installed, so there is no fresh clone to follow the README in"
    exit 77
fi
top=$(git -C "$src" rev-parse --show-toplevel 2>/dev/null || true)
if [ -z "$top" ] || [ "$(cd "$top" && pwd -P)" != "$(cd "$src" && pwd -P)" ] ||
   ! git -C "$src" rev-parse --verify -q HEAD >/dev/null; then
    echo "first_hour: skipped: $src is not the top of a git checkout with a commit, so there is nothing to clone"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/deft-first-hour.XXXXXX")
if [ "$keep" = keep ]; then
    echo "first_hour: working in $tmp (kept)"
else
    trap 'rm -rf "$tmp"' EXIT
fi
step() { printf '\n== first_hour: %s\n' "$*"; }
fail() { echo "first_hour: FAIL: $*" >&2; exit 1; }

step "git clone $src (commit $(git -C "$src" rev-parse --short HEAD))"
git clone --quiet "$src" "$tmp/deft"
cd "$tmp/deft"

# The README's first command, as its text gives it: a block whose first line is ./setup.sh.
grep -qx './setup.sh' README.md || fail "the README no longer starts with ./setup.sh: update this test with it"
step "DEFT_CUDA=OFF ./setup.sh (the README's first command, CPU-only)"
DEFT_CUDA=OFF DEFT_SKIP_PACKAGES=1 CC="$cc" ./setup.sh -DDEFT_BUILD_TESTS=OFF > "$tmp/setup.log" 2>&1 \
    || { tail -40 "$tmp/setup.log"; fail "./setup.sh failed (log above)"; }
tail -12 "$tmp/setup.log"
[ -x build/hello_deft ] || fail "setup.sh built no build/hello_deft"
grep -q "hello_deft" "$tmp/setup.log" || fail "setup.sh's log never mentions the main example"

step "install, and a program through the CMake package and through the README's pkg-config commands"
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' build/CMakeCache.txt)
bash tests/consumer/run_consumer_test.sh build tests/consumer "$generator" "$cc" > "$tmp/consumer.log" 2>&1 \
    || { tail -40 "$tmp/consumer.log"; fail "the install and its two routes failed (log above)"; }
grep -E "loads|without a CBLAS|static" "$tmp/consumer.log"

step "build/mnist_mlp NEWDIR --synthetic 600"
newdir="$tmp/first-data/mnist"
[ ! -e "$newdir" ] || fail "$newdir exists before the run"
build/mnist_mlp "$newdir" --synthetic 600 --epochs 1 > "$tmp/mnist.log" 2>&1 \
    || { tail -20 "$tmp/mnist.log"; fail "mnist_mlp into a new directory failed (log above)"; }
grep -q "test accuracy" "$tmp/mnist.log" || fail "mnist_mlp printed no test accuracy"
[ -d "$newdir" ] || fail "mnist_mlp did not create $newdir"
tail -2 "$tmp/mnist.log"

step "--help of every example and benchmark"
n=0
for c in examples/*.c bench/bench_*.c; do
    name=$(basename "$c" .c)
    [ -x "build/$name" ] || fail "build/$name was not built"
    out=$("build/$name" --help 2>&1) || fail "build/$name --help exits $?"
    case "$out" in *"$name"*) ;; *) fail "build/$name --help does not name the program: $out" ;; esac
    n=$((n + 1))
done
echo "$n programs answer --help with exit 0"

printf '\nfirst_hour: the README works from a fresh clone\n'
