#!/usr/bin/env python3
"""Reads a kernel trace of libdeft_kernel_trace.so (bench/kernel_trace.c) and splits the replays of its most
replayed CUDA Graph into windows, a window ending wherever other kernels ran between two replays. For each window:
the replays, the median replay's span (its first kernel's start to its last kernel's end), the sum of its kernels'
times, the time the GPU was busy with at least one of them, the gaps (span less busy), and the local memory totals
and channels its kernels saw; then the other kernels that ran before it. Where a window's span is longer than the
window before it, its nodes are listed by how much their time and their start in the replay moved.

  DEFT_KERNEL_TRACE=t.txt LD_PRELOAD=build/libdeft_kernel_trace.so build/bench_mlp_train --config mid \\
      --probe-other 262144 --probe-kind twice
  scripts/graph_gaps.py t.txt
"""
import argparse
import statistics
import sys
from collections import defaultdict

FIELDS = ("start", "end", "graph", "node", "stream", "corr", "channel", "local_per_thread", "local_total", "grid",
          "block", "shared", "shared_executed", "cache", "registers", "launch_type", "carveout")


def read(path):
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(" ", len(FIELDS) + 1)
            if not parts or parts[0] != "K":
                continue
            if len(parts) != len(FIELDS) + 2:
                sys.exit(f"{path}:{n}: want {len(FIELDS) + 2} fields, found {len(parts)}")
            try:
                r = {k: int(v) for k, v in zip(FIELDS, parts[1:-1])}
            except ValueError:
                sys.exit(f"{path}:{n}: a field that is not an integer")
            r["name"] = parts[-1]
            records.append(r)
    return sorted(records, key=lambda r: r["start"])


def busy(replay):
    spans = sorted((r["start"], r["end"]) for r in replay)
    total, (lo, hi) = 0, spans[0]
    for s, e in spans[1:]:
        if s > hi:
            total, lo, hi = total + hi - lo, s, e
        else:
            hi = max(hi, e)
    return total + hi - lo


def windows_of(records):
    counts = defaultdict(int)
    for r in records:
        if r["graph"]:
            counts[r["graph"]] += 1
    if not counts:
        sys.exit("no CUDA Graph nodes in the trace")
    graph = max(counts, key=counts.get)
    by_launch = defaultdict(list)   # a replay's nodes share the launch's correlation id
    for r in records:
        if r["graph"] == graph:
            by_launch[r["corr"]].append(r)
    replays = sorted(by_launch.values(), key=lambda rs: min(r["start"] for r in rs))
    others = [r for r in records if r["graph"] != graph]
    windows, current, before, k = [], [], [], 0
    for replay in replays:
        first = min(r["start"] for r in replay)
        moved = []
        while k < len(others) and others[k]["start"] < first:
            moved.append(others[k])
            k += 1
        if moved:   # other kernels ran since the last replay: a new window
            if current:
                windows.append((current, before))
            current, before = [], moved
        current.append(replay)
    if current:
        windows.append((current, before))
    return graph, replays, others, windows


def med(xs):
    return statistics.median(xs) / 1e3


def summary(replays):
    return (med([max(r["end"] for r in rs) - min(r["start"] for r in rs) for rs in replays]),
            med([sum(r["end"] - r["start"] for r in rs) for rs in replays]), med([busy(rs) for rs in replays]))


def nodes(replays):
    time, start = defaultdict(list), defaultdict(list)
    for rs in replays:
        first = min(r["start"] for r in rs)
        for r in rs:
            time[r["node"]].append(r["end"] - r["start"])
            start[r["node"]].append(r["start"] - first)
    return {n: med(v) for n, v in time.items()}, {n: med(v) for n, v in start.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--others", type=int, default=20, help="other kernels listed before each window (default 20)")
    ap.add_argument("--nodes", type=int, default=12, help="nodes listed for a slower window (default 12)")
    ap.add_argument("--slower", type=float, default=1.01, help="span ratio that marks a window slower (1.01)")
    a = ap.parse_args()
    graph, replays, others, windows = windows_of(read(a.trace))
    print(f"graph {graph}: {len(replays)} replays of {len(replays[0])} kernels; {len(others)} other kernels")
    spans = []
    for i, (ws, before) in enumerate(windows):
        span, kernels, busy_us = summary(ws)
        spans.append(span)
        local = sorted({r["local_total"] for rs in ws for r in rs})
        channels = sorted({r["channel"] for rs in ws for r in rs})
        print(f"window {i}: {len(ws)} replays, span {span:.2f} us, kernels {kernels:.2f} us, busy {busy_us:.2f} us, "
              f"gaps {span - busy_us:.2f} us, local memory {local}, channels {channels}; {len(before)} other "
              f"kernels before it")
        for r in before[:a.others]:
            print(f"    other graph {r['graph']} {(r['end'] - r['start']) / 1e3:.2f} us grid {r['grid']} block "
                  f"{r['block']} local {r['local_per_thread']}/{r['local_total']} shared {r['shared']} "
                  f"{r['name'][:100]}")
        if i and span > spans[i - 1] * a.slower:
            t0, s0 = nodes(windows[i - 1][0])
            t1, s1 = nodes(ws)
            names = {r["node"]: r["name"] for r in ws[0]}
            print(f"  window {i} is slower than window {i - 1}: {spans[i - 1]:.2f} -> {span:.2f} us; its nodes "
                  f"(time, start in the replay) by how far their start moved:")
            for n in sorted(t0, key=lambda n: -(s1.get(n, 0) - s0[n]))[:a.nodes]:
                print(f"    node {n}: {t0[n]:.2f} -> {t1.get(n, 0):.2f} us at {s0[n]:.2f} -> {s1.get(n, 0):.2f} us "
                      f"{names.get(n, '?')[:80]}")


if __name__ == "__main__":
    main()
