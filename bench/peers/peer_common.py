"""What the PyTorch peers share: bench/bench_util.h's hash (the same data and initial weights as the deft benches,
bit for bit), timing with device events (a host clock on the CPU), the calibrate-then-repeat measurement, a clean
slate between configurations, and PyTorch's fast modes (MODES): a step run eagerly, captured whole in a CUDA Graph,
or compiled by torch.compile and then captured; Stepper warms a step up and captures it, run_modes runs the modes one
after the other and picks the fastest. Imported by the peers beside it (they run as scripts from this folder)."""
import contextlib
import gc
import importlib
import math
import sys
import time

# PyTorch's modes, in the order they run by default. compile_graph and autotune_graph compile the forward and loss
# with torch.compile in COMPILE_MODES' mode and then capture the whole step (backward and optimizer included) as
# graph does; "max-autotune-no-cudagraphs" because the capture is ours (torch.compile's own CUDA Graphs would nest).
MODES = ("eager", "graph", "compile_graph", "autotune_graph")
# Modes taken only when asked for (--modes): compile, torch.compile (mode "default") with the step launched from
# Python, no capture: how ZeroRedundancyOptimizer and FSDP are run in practice, whose steps may not capture.
EXTRA_MODES = ("compile",)
COMPILE_MODES = {"compile_graph": "default", "autotune_graph": "max-autotune-no-cudagraphs", "compile": "default"}
MODES_HELP = ("comma-separated, run in this order (default: all): " + ", ".join(MODES) + "; also " +
              ", ".join(EXTRA_MODES) + " (torch.compile, not captured)")
GRAPH_SIDE_WARMUP = 3   # the CUDA Graphs docs' warm-up on a side stream before a capture


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
    """Frees what the previous configuration left and restarts the peak memory statistics. Returns the bytes still
    allocated after that (0 on the CPU): what earlier modes and configurations leave behind in this process (the
    cuBLAS workspaces of streams that outlive them, memory held by torch.compile's caches), which the peers subtract
    from torch.cuda.max_memory_allocated so that a mode's peak is its own whatever ran before it."""
    gc.collect()
    if not cuda:
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def parse_modes(ap, text, cuda=True):
    """The modes of --modes (comma-separated), in order; argparse's error for an unknown one or none. Without CUDA
    only eager is kept (the others capture CUDA Graphs)."""
    modes = [m for m in text.split(",") if m]
    bad = [m for m in modes if m not in MODES + EXTRA_MODES]
    if bad or not modes:
        ap.error(f"--modes: {', '.join(bad) or 'none given'}: choose from {', '.join(MODES + EXTRA_MODES)}")
    return modes if cuda else [m for m in modes if m == "eager"]


def captures(mode):
    """Whether the mode captures its step in a CUDA Graph (eager and compile launch it from Python)."""
    return mode not in ("eager", "compile")


def tag(mode):
    """A mode's prefix in the figure names: torch_<mode>_."""
    return f"torch_{mode}"


def compile_for(torch, fn, mode):
    """fn (a module or a function) under torch.compile in the mode's setting, or fn itself for eager and graph.
    torch._dynamo.reset() first: every mode and configuration compiles from a clean slate, and a new model is never
    counted against dynamo's recompilation limit (past it, dynamo runs the code eagerly with only a warning).
    Compilation itself happens in the first call, which Stepper.warm_up times apart."""
    if mode not in COMPILE_MODES:
        return fn
    importlib.import_module("torch._dynamo").reset()
    return torch.compile(fn, mode=COMPILE_MODES[mode])


class Stepper:
    """One mode's training step. body() runs one step eagerly and returns its loss; it starts with
    zero_grad(set_to_none=True), so that in a capture backward allocates the gradients from the graph's private pool
    (the "whole network capture" recipe of PyTorch's CUDA Graphs docs). feed(), if given, runs before every step and
    outside the graph (a copy into the static inputs). Calling the Stepper runs one step: body() until warm_up has
    captured it (graph modes), one replay after; .loss is the last step's loss tensor (the static one once captured)."""

    def __init__(self, torch, body, feed=None):
        self.torch, self.body, self.feed = torch, body, feed
        self.graph = None
        self.loss = None

    def __call__(self):
        if self.feed is not None:
            self.feed()
        if self.graph is None:
            self.loss = self.body()
        else:
            self.graph.replay()

    def warm_up(self, mode, steps, device, read_loss=None, side_warmup=GRAPH_SIDE_WARMUP, side=None):
        """`steps` warm-up steps for eager and compile; for the other modes, side_warmup steps on a side stream (`side`, or a new
        one), the capture (which runs nothing) and replays up to `steps` (at least one). The first step is timed alone with a host
        clock: for the compiled modes it includes the compilation (and autotuning), for all it includes first-call
        costs such as cudnn.benchmark's trials; it is returned as compile_s and never counted in the step times, and
        the peak memory statistics restart after it, so that its scratch is not counted either. Returns (compile_s,
        the first step's loss read by read_loss(), default self.loss.item())."""
        torch, cuda = self.torch, device.type == "cuda"
        read = read_loss or (lambda: self.loss.item())
        captured = captures(mode)
        if captured and not cuda:
            raise RuntimeError(f"{mode} captures a CUDA Graph and needs a CUDA device")
        if cuda:
            torch.cuda.synchronize()
        if captured:
            side = side or torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        with torch.cuda.stream(side) if captured else contextlib.nullcontext():
            self()
            first = read()   # waits for the step
            took = time.perf_counter() - t0
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range((side_warmup if captured else steps) - 1):
                self()
        if not captured:
            return took, first
        torch.cuda.current_stream().wait_stream(side)
        if self.feed is not None:
            self.feed()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.loss = self.body()
        self.graph = graph
        for _ in range(max(1, steps - side_warmup)):   # at least one replay: the static loss then holds a value
            self()
        return took, first


def run_modes(label, modes, run_one):
    """Runs run_one(mode) for each mode in order; each returns its figures, a dict whose "time" is its step time
    (less is faster). A mode that raises is said in a `# <label>: torch_<mode> failed: ...` line and the next one
    runs. Returns (the fastest mode, its figures), or None when none ran."""
    best = None
    for mode in modes:
        try:
            fig = run_one(mode)
        except Exception as e:   # a mode the installed torch cannot run (capture, compile, memory): said, not hidden
            why = str(e).splitlines()[0] if str(e) else ""
            print(f"# {label}: {tag(mode)} failed: {type(e).__name__}: {why}")
            sys.stdout.flush()
            continue
        if best is None or fig["time"] < best[1]["time"]:
            best = (mode, fig)
    if best is None:
        print(f"# {label}: no mode ran")
    else:
        print(f"# {label}: torch's best: {best[0]}")
    sys.stdout.flush()
    return best
