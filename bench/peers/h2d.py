#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_h2d.c: host-to-device copy bandwidth of tensor.to("cuda") for 1 MiB to 256 MiB,
from pageable memory and from pin_memory() (non_blocking=True), printing `<name> <value> <unit>` lines:

    h2d.<S>MiB.torch_pageable_gbs   src.to("cuda")                          (src in pageable memory)
    h2d.<S>MiB.torch_pinned_gbs     src.to("cuda", non_blocking=True)       (src = pageable.pin_memory())
    h2d.torch_pinned_peak_gbs       the largest torch_pinned_gbs

    python3 bench/peers/h2d.py [--device cuda:N]

Each figure is the median of 5 trials of k copies (k so that a trial moves at least 512 MiB), after 2 untimed
copies, timed with a host clock around the copies and one torch.cuda.synchronize(); GB/s is 1e9 bytes a second.
torch is imported inside main(), so the file compiles and imports without it.
"""
import argparse
import statistics
import sys
import time

SIZES_MIB = [1, 4, 16, 64, 256]
TRIALS = 5
MIB = 1 << 20


def bandwidth(torch, src, device):
    nbytes = src.numel() * src.element_size()
    k = max(1, -(-512 * MIB // nbytes))
    nb = src.is_pinned()
    for _ in range(2):
        src.to(device, non_blocking=nb)
    torch.cuda.synchronize(device)
    gbs = []
    for _ in range(TRIALS):
        t0 = time.perf_counter()
        for _ in range(k):
            src.to(device, non_blocking=nb)
        torch.cuda.synchronize(device)
        gbs.append(nbytes * k / (time.perf_counter() - t0) / 1e9)
    return statistics.median(gbs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("h2d.py: skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("h2d.py: skipped: no usable CUDA device")
        return 0
    device = torch.device(args.device)
    print(f"# h2d.py: torch {torch.__version__} on {device} ({torch.cuda.get_device_name(device)})")
    peak = 0.0
    for s in SIZES_MIB:
        pageable = torch.ones(s * MIB // 4, dtype=torch.float32)
        pinned = pageable.pin_memory()
        for name, src in (("pageable", pageable), ("pinned", pinned)):
            v = bandwidth(torch, src, device)
            print(f"h2d.{s}MiB.torch_{name}_gbs {v:.2f} GB/s", flush=True)
            if name == "pinned":
                peak = max(peak, v)
        del pageable, pinned
    print(f"h2d.torch_pinned_peak_gbs {peak:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
