#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_checkpoint.c: one training step of the same 36-layer MLP (Linear(2048, 2048) +
ReLU x35, Linear(2048, 10); batch 4096, f32, nn.CrossEntropyLoss, SGD lr 0.01 momentum 0.9) run with
torch.utils.checkpoint.checkpoint_sequential over segment counts, printing per point its peak memory and step time
as `<name> <value> <unit>`:

    python3 bench/peers/checkpoint.py [--device cuda:N] [--layers L] [--width W] [--batch B] [--segments 2,3,...]

Points: "none" (the plain model) and "s<k>" (checkpoint_sequential(model, k, x, use_reentrant=False): every segment
but the last keeps only its input and is recomputed in the backward pass). The model is an nn.Sequential of
`layers` blocks (Linear + ReLU, the last a Linear alone), so segments split it at layer boundaries.

Figures per point: checkpoint.torch.<pt>.peak_bytes (torch.cuda.max_memory_allocated over the point, reset before
its model is made: parameters, gradients, momentum, the batch, activations, cuBLAS's workspace), .step_ms (the median
over repeats, eager mode, between CUDA events; fastest and slowest beside it), .loss_warmup and .loss.

Data and weights come from bench_mlp_train's index hash (hash32 in peer_common.py, the C bench's bit for bit), so the losses
after the warm-up steps agree with bench_checkpoint's to f32 rounding. TF32 is off. torch is imported inside main().
"""
import argparse
import gc
import math
import sys

from peer_common import Timer, hash32, hash_uniform

WARMUP_STEPS = 5
CALIBRATE_STEPS = 3
REPEATS = 5
TARGET_REPEAT_S = 0.3
CLASSES = 10


def make_model(torch, layers, width, device):
    blocks = []
    for l in range(layers):
        out = CLASSES if l == layers - 1 else width
        lin = torch.nn.Linear(width, out, device=device)
        scale = 1.0 / math.sqrt(width)
        with torch.no_grad():
            lin.weight.copy_(hash_uniform(torch, 100 + 2 * l, out * width, scale, device).view(out, width))
            lin.bias.copy_(hash_uniform(torch, 101 + 2 * l, out, scale, device))
        blocks.append(lin if l == layers - 1 else torch.nn.Sequential(lin, torch.nn.ReLU()))
    return torch.nn.Sequential(*blocks)


def make_batch(torch, width, batch, device):
    x = hash_uniform(torch, 1, batch * width, 1.0, device).view(batch, width)
    y = (hash32(2, torch.arange(batch, dtype=torch.int64, device=device)) % CLASSES).to(torch.int64)
    return x, y


def run_point(torch, name, segments, args, device):
    from torch.utils.checkpoint import checkpoint_sequential

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    model = make_model(torch, args.layers, args.width, device)
    x, y = make_batch(torch, args.width, args.batch, device)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    last = [None]

    def step():
        opt.zero_grad(set_to_none=True)
        out = checkpoint_sequential(model, segments, x, use_reentrant=False) if segments else model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        last[0] = loss

    for _ in range(WARMUP_STEPS):
        step()
    warm = last[0].item()
    per = Timer(torch, True).seconds(step, CALIBRATE_STEPS) / CALIBRATE_STEPS
    n = max(1, math.ceil(TARGET_REPEAT_S / max(per, 1e-9)))
    ms = sorted(Timer(torch, True).seconds(step, n) / n * 1e3 for _ in range(REPEATS))
    loss = last[0].item()
    peak = torch.cuda.max_memory_allocated(device)
    p = f"checkpoint.torch.{name}"
    print(f"{p}.segments {segments} count")
    print(f"{p}.peak_bytes {peak} bytes")
    print(f"{p}.step_ms {ms[REPEATS // 2]:.3f} ms")
    print(f"{p}.step_ms_min {ms[0]:.3f} ms")
    print(f"{p}.step_ms_max {ms[-1]:.3f} ms")
    print(f"{p}.steps_per_repeat {n} count")
    print(f"{p}.loss_warmup {warm:.6f} loss")
    print(f"{p}.loss {loss:.6f} loss")
    sys.stdout.flush()
    del model, opt, x, y, last


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--segments", default="2,3,4,6,9,12,18", help="segment counts, comma-separated")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"checkpoint.py: skipped: PyTorch is not installed ({e})")
        return 0
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("checkpoint.py: skipped: needs a usable CUDA device")
        return 0
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"# checkpoint.py: torch {torch.__version__} on {device} ({torch.cuda.get_device_name(device)}): "
          f"{args.layers} layers of width {args.width}, batch {args.batch}, f32, SGD")
    sys.stdout.flush()
    run_point(torch, "none", 0, args, device)
    for s in (int(v) for v in args.segments.split(",") if v):
        if 1 < s <= args.layers:
            run_point(torch, f"s{s}", s, args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
