#!/usr/bin/env bash
# scripts/graph_gaps.py on a made-up kernel trace: a graph of three 10 us kernels replayed five times with 1 us
# between its kernels, two other kernels, five more replays with 3 us between them. The windows' spans, busy times
# and gaps, the slower window and how far its last node's start moved are checked, then a truncated line's refusal.
# Skips without python3. Usage: graph_gaps_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found: the summary cannot run; skipped"
    exit 77
fi
rm -rf "$work"
mkdir -p "$work"
trace=$work/trace.txt
# K start end graph node stream corr channel lpt ltot grid block shared shmx cache regs type carve name
t=1000000
replays() {   # $1 gap (ns) between the kernels, $2 first correlation id
    for r in 0 1 2 3 4; do
        s=$t
        for n in 1 2 3; do
            echo "K $s $((s + 10000)) 7 $n 13 $(($2 + r)) 1 0 155713536 128 256 0 0 0 32 0 0 k$n"
            s=$((s + 10000 + $1))
        done
        t=$((t + 100000))
    done
}
{
    replays 1000 100
    echo "K $t $((t + 5000)) 0 0 14 200 1 0 359006208 1 6 0 0 0 16 0 0 other_a"
    t=$((t + 10000))
    echo "K $t $((t + 5000)) 0 0 14 201 1 0 155713536 4096 256 0 0 0 16 0 0 other_b"
    t=$((t + 10000))
    replays 3000 300
} >"$trace"
out=$(python3 "$src/scripts/graph_gaps.py" "$trace")
echo "$out"
want() {
    if ! grep -qF -- "$1" <<<"$out"; then
        echo "FAILED: the summary lacks: $1"
        exit 1
    fi
}
want "graph 7: 10 replays of 3 kernels; 2 other kernels"
want "window 0: 5 replays, span 32.00 us, kernels 30.00 us, busy 30.00 us, gaps 2.00 us, local memory [155713536], channels [1]; 0 other kernels before it"
want "window 1: 5 replays, span 36.00 us, kernels 30.00 us, busy 30.00 us, gaps 6.00 us"
want "2 other kernels before it"
want "other graph 0 5.00 us grid 1 block 6 local 0/359006208 shared 0 other_a"
want "window 1 is slower than window 0: 32.00 -> 36.00 us"
want "node 3: 10.00 -> 10.00 us at 22.00 -> 26.00 us k3"
# A truncated line is refused with its place, not read as zeros.
head -c 40 "$trace" >"$work/truncated.txt"
echo >>"$work/truncated.txt"
if msg=$(python3 "$src/scripts/graph_gaps.py" "$work/truncated.txt" 2>&1); then
    echo "FAILED: a truncated trace was accepted: $msg"
    exit 1
fi
grep -qF "truncated.txt:1: want 19 fields, found" <<<"$msg" || { echo "FAILED: the refusal says: $msg"; exit 1; }
echo "graph_gaps: all checks passed"
