#!/usr/bin/env python3
"""Where a traced step's time goes: sums the slices of a trace written by deft_program_trace (gpt2_train --trace,
bench --trace) by op, prints one line per op (total us, share, count, the largest slice's name), the biggest first.
A fused group's slice counts under its last member's op, marked "(group of N)" (a product with its bias epilogue
shows as an add).
Usage: scripts/trace_summary.py TRACE.json [--top N] [--by op|name]"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--by", choices=("op", "name"), default="op")
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        print(f"trace_summary: cannot read {a.trace}: {e}", file=sys.stderr)
        return 1
    total = collections.Counter()
    count = collections.Counter()
    largest = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        k = args.get("op", "?") if a.by == "op" else e.get("name", "?")
        if a.by == "op" and args.get("members"):   # a fused group's slice is named by its last member
            k = f"{k} (group of {len(args['members'])})"
        if args.get("dtype"):
            k = f"{k} {args['dtype']}"
        dur = float(e.get("dur", 0))
        total[k] += dur
        count[k] += 1
        if dur > largest.get(k, (0, ""))[0]:
            largest[k] = (dur, f"{e.get('name', '?')} {args.get('shape', '')}")
    whole = sum(total.values())
    print(f"{'us':>10} {'share':>6} {'count':>6}  {a.by} (largest slice)")
    for k, us in total.most_common(a.top):
        print(f"{us:10.1f} {100 * us / whole:5.1f}% {count[k]:6d}  {k} ({largest[k][1]}: {largest[k][0]:.1f} us)")
    print(f"{whole:10.1f} 100.0% {sum(count.values()):6d}  all slices")
    return 0


if __name__ == "__main__":
    sys.exit(main())
