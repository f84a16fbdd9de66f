#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_matmul.c: one square matrix product C[S, S] = A B with torch.matmul, S = 8192 and
10000, in fp32 (torch.backends.cuda.matmul.allow_tf32 = False), tf32 (allow_tf32 = True), bf16 and fp16, printing one
figure per line as `<name> <value> <unit>` with "torch" where the C bench prints "deft":

    python3 bench/peers/matmul.py [--size S] [--precision fp32|tf32|bf16|fp16] [--device cuda:N]

Inputs: uniform in [-1, 1) (torch.rand, seeded), made once on the device; the output is preallocated and written
with torch.matmul(a, b, out=c), so no allocation is timed. Timing: 2 warm-up calls, 3 to choose N so that N calls
take about 200 ms, then 7 repeats of N calls between two torch.cuda.Event records; the figure is the median of
(time / N), with the fastest and slowest repeat, and TFLOP/s = 2 S^3 / time. fp16 and bf16 products keep
torch's default reduced-precision reductions setting (allow_fp16/bf16_reduced_precision_reduction), which does not
matter at these shapes (no split-K).

torch is imported inside main(), so the file compiles and imports without it; without torch or a GPU it says so
and exits 0.
"""
import argparse
import sys

REPEATS = 7
TARGET_REPEAT_S = 0.2
SIZES = (8192, 10000)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def time_calls(torch, f):
    """Median, fastest and slowest seconds per call over REPEATS repeats of N calls, timed with CUDA events."""
    for _ in range(2):
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        f()
    end.record()
    end.synchronize()
    per = start.elapsed_time(end) / 1e3 / 3
    n = max(1, min(1000, int(TARGET_REPEAT_S / per))) if per > 0 else 1000
    times = []
    for _ in range(REPEATS):
        start.record()
        for _ in range(n):
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n)
    times.sort()
    return times[REPEATS // 2], times[0], times[-1]


def bench_one(torch, size, precision, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    gen = torch.Generator(device=device)
    gen.manual_seed(size * 10 + PRECISIONS.index(precision))
    a = (torch.rand(size, size, device=device, generator=gen) * 2 - 1).to(dtype)
    b = (torch.rand(size, size, device=device, generator=gen) * 2 - 1).to(dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    med, lo, hi = time_calls(torch, lambda: torch.matmul(a, b, out=c))
    key = f"matmul.{size}.{precision}"
    print(f"{key}.gflop {2.0 * size ** 3 / 1e9:.3f} GFLOP")
    print(f"{key}.torch_ms {med * 1e3:.4f} ms")
    print(f"{key}.torch_ms_min {lo * 1e3:.4f} ms")
    print(f"{key}.torch_ms_max {hi * 1e3:.4f} ms")
    print(f"{key}.torch_tflops {2.0 * size ** 3 / med / 1e12:.2f} TFLOP/s")
    sys.stdout.flush()
    del a, b, c
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--precision", choices=PRECISIONS)
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("# matmul.py: PyTorch is not installed: skipped")
        return 0
    if not torch.cuda.is_available():
        print("# matmul.py: no usable GPU: skipped")
        return 0
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    print(f"# matmul.py: torch {torch.__version__} on {torch.cuda.get_device_name(device)}")
    sizes = (args.size,) if args.size > 0 else SIZES
    precisions = (args.precision,) if args.precision else PRECISIONS
    for size in sizes:
        for precision in precisions:
            bench_one(torch, size, precision, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
