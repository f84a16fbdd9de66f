#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_conv.c: one training step on the CPU of conv 3x3 (C -> C, padding 1, no bias)
-> BatchNorm2d (training) -> relu -> max_pool2d 2x2 -> mean, backward and an SGD step (lr 0.01, momentum 0.9), in
NCHW (contiguous) and NHWC (torch.channels_last), printing one figure per line as `<name> <value> <unit>` with
"torch" where the C bench prints "deft":

    python3 bench/peers/conv.py [--batch N] [--channels C] [--size S]

Inputs: uniform in [-1, 1), made once. Timing as bench_conv.c: 2 warm-up steps, N chosen so that N steps take about
300 ms, then 7 repeats of a host clock around N steps; the figure is the median of (time / N). torch is imported
inside main(), so the file compiles and imports without it; without torch it says so and exits 0.
"""
import argparse
import time

REPEATS = 7
TARGET_REPEAT_S = 0.3


def time_steps(step):
    step()
    step()
    t0 = time.perf_counter()
    step()
    per = time.perf_counter() - t0
    n = max(1, int(TARGET_REPEAT_S / per)) if per > 0 else 1
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        times.append((time.perf_counter() - t0) / n)
    times.sort()
    return times[REPEATS // 2], times[0], times[-1]


def bench_layout(torch, batch, channels, size, layout):
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False).to(memory_format=fmt)
    bn = torch.nn.BatchNorm2d(channels)
    params = list(conv.parameters()) + list(bn.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x = (torch.rand(batch, channels, size, size) * 2 - 1).to(memory_format=fmt)

    def step():
        opt.zero_grad(set_to_none=True)
        h = torch.nn.functional.max_pool2d(torch.relu(bn(conv(x))), 2)
        h.mean().backward()
        opt.step()

    med, lo, hi = time_steps(step)
    print(f"conv.cpu.{layout}.torch_step_ms {med * 1e3:.3f} ms")
    print(f"conv.cpu.{layout}.torch_step_ms_min {lo * 1e3:.3f} ms")
    print(f"conv.cpu.{layout}.torch_step_ms_max {hi * 1e3:.3f} ms")
    print(f"conv.cpu.{layout}.torch_images_per_s {batch / med:.1f} img/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: bench/peers/conv.py skipped")
        return 0
    for layout in ("nchw", "nhwc"):
        bench_layout(torch, a.batch, a.channels, a.size, layout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
