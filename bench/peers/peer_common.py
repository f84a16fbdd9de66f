"""What the PyTorch peers share: bench/bench_util.h's hash (the same data and initial weights as the deft benches,
bit for bit), timing with device events (a host clock on the CPU), the calibrate-then-repeat measurement, and a clean
slate between configurations. Imported by the peers beside it (they run as scripts from this folder)."""
import gc
import math
import time


def hash32(stream, i):
    """Element i (an int64 tensor of indices, or an int) of stream `stream`: bench_util.h's hash32 in int64
    arithmetic that never overflows (every intermediate stays below 2^59). Streams: 1 the input, 2 the targets or
    labels, 100 + 2l the weight of layer l ([out, in], row-major), 101 + 2l its bias."""
    m = 0xFFFFFFFF
    h = (i + stream * 0x9E3779B1) & m
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & m
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & m
    return h ^ (h >> 16)


def hash_uniform(torch, stream, n, scale, device):
    """(2 h / 2^32 - 1) * scale in float64, rounded once to float32, as bench_util.h computes it."""
    h = hash32(stream, torch.arange(n, dtype=torch.int64, device=device))
    return (((h.to(torch.float64) / 4294967296.0) * 2.0 - 1.0) * scale).to(torch.float32)


class Timer:
    def __init__(self, torch, cuda):
        self.torch, self.cuda = torch, cuda

    def seconds(self, fn, n):
        """Wall time of n calls of fn: device events around them on CUDA, a host clock on the CPU."""
        torch = self.torch
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0


def measure(timer, fn, read_loss, calibrate, repeats, target_s):
    """Calibrates N so that N steps take about target_s, then `repeats` repeats of N steps: (sorted per-step
    microseconds, N, loss after the last)."""
    per = timer.seconds(fn, calibrate) / calibrate
    n = max(1, min(1000000, math.ceil(target_s / max(per, 1e-9))))
    us = sorted(timer.seconds(fn, n) / n * 1e6 for _ in range(repeats))
    return us, n, read_loss()


def open_device(prog, device_arg, no_cuda_hint):
    """torch, the device (a CUDA one with its index, made current) and whether it is CUDA; None after printing why the
    peer is skipped: torch missing, or a CUDA device asked for that cannot be used (no_cuda_hint says what to do)."""
    try:
        import torch
    except ImportError as e:
        print(f"{prog}: skipped: PyTorch is not installed ({e})")
        return None
    device = torch.device(device_arg)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"{prog}: skipped: no usable CUDA device ({no_cuda_hint})")
        return None
    if cuda:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return torch, device, cuda


def fresh(torch, cuda):
    """Frees what the previous configuration left and restarts the peak memory statistics."""
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
