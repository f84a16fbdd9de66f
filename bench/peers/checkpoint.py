#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_checkpoint.c: one training step of the same 36-layer MLP (Linear(2048, 2048) +
ReLU x35, Linear(2048, 10); batch 4096, f32, nn.CrossEntropyLoss, SGD lr 0.01 momentum 0.9) run with
torch.utils.checkpoint.checkpoint_sequential over segment counts, printing per point its peak memory and step time
as `<name> <value> <unit>`:

    python3 bench/peers/checkpoint.py [--model mlp|resnet] [--device cuda:N] [--layers L] [--width W] [--batch B]
                                      [--segments 2,3,...]

--model resnet: torchvision's resnet18(num_classes=10) as bench/peers/resnet.py builds it (its own torch.nn copy
without torchvision), channels_last, on 32x32 images, batch 256, cuDNN's TF32 on (torch's default; matmul TF32 off),
cudnn.benchmark on, SGD with weight decay 5e-4 as bench_resnet; checkpoint_sequential runs over an nn.Sequential of
its children (conv1, bn1, relu, maxpool, layer1..4, avgpool, flatten, fc) for segment counts 1, 2, 3, 4, 6 (1 is
checkpoint_sequential's own: its last segment is never checkpointed, so it keeps everything). The figures are named
checkpoint.resnet.torch.<pt>.*. The data are bench_resnet's (resnet.py's make_batch); the weights are torch's
own draws, so the losses agree with deft's only roughly. A point that torch refuses prints "# <point>: failed: ..."
and the others still run.

Points: "none" (the plain model) and "s<k>" (checkpoint_sequential(model, k, x, use_reentrant=False): every segment
but the last keeps only its input and is recomputed in the backward pass). The model is an nn.Sequential of
`layers` blocks (Linear + ReLU, the last a Linear alone), so segments split it at layer boundaries.

Figures per point: checkpoint.torch.<pt>.peak_bytes (torch.cuda.max_memory_allocated over the point, reset before
its model is made: parameters, gradients, momentum, the batch, activations, cuBLAS's workspace; for the ResNet reset
again after the first step, whose cudnn.benchmark trials allocate large workspaces; its ReLUs are not in place, which
checkpoint_sequential's recompute needs), .step_ms (the median
over repeats, eager mode, between CUDA events; fastest and slowest beside it), .loss_warmup and .loss.

Data and weights come from bench_mlp_train's index hash (hash32 in peer_common.py, the C bench's bit for bit), so the losses
after the warm-up steps agree with bench_checkpoint's to f32 rounding. TF32 is off. torch is imported inside main().
"""
import argparse
import gc
import math
import sys

import peer_common
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


def make_resnet(torch, batch, device):
    """resnet.py's ResNet-18 and batch in channels_last, the model flattened into an nn.Sequential of its children
    (the parameters are the same objects), so checkpoint_sequential can cut it at their boundaries."""
    import resnet
    net = resnet.make_model(torch, device, True)
    for m in net.modules():   # an in-place ReLU at a segment's start breaks checkpoint_sequential's recompute
        if isinstance(m, torch.nn.ReLU):
            m.inplace = False
    model = torch.nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3,
                                net.layer4, net.avgpool, torch.nn.Flatten(1), net.fc)
    x, y = resnet.make_batch(torch, batch, device, True)
    return model, x, y


def run_point(torch, name, segments, args, device):
    from torch.utils.checkpoint import checkpoint_sequential

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    if args.model == "resnet":
        model, x, y = make_resnet(torch, args.batch, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    else:
        model = make_model(torch, args.layers, args.width, device)
        x, y = make_batch(torch, args.width, args.batch, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    last = [None]

    def step():
        opt.zero_grad(set_to_none=True)
        out = checkpoint_sequential(model, segments, x, use_reentrant=False) if segments else model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        last[0] = loss

    step()
    if args.model == "resnet":
        # cudnn.benchmark tries each convolution's algorithms, with their workspaces, in the first step: that is
        # tuning, not the step's memory, so the peak is taken from the second step on
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(WARMUP_STEPS - 1):
        step()
    warm = last[0].item()
    per = Timer(torch, True).seconds(step, CALIBRATE_STEPS) / CALIBRATE_STEPS
    n = max(1, math.ceil(TARGET_REPEAT_S / max(per, 1e-9)))
    ms = sorted(Timer(torch, True).seconds(step, n) / n * 1e3 for _ in range(REPEATS))
    loss = last[0].item()
    peak = torch.cuda.max_memory_allocated(device)
    p = f"checkpoint.{'resnet.' if args.model == 'resnet' else ''}torch.{name}"
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
    ap.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, help="default: 4096 (mlp), 256 (resnet)")
    ap.add_argument("--segments", help="segment counts, comma-separated (default: 2,3,4,6,9,12,18 for the mlp, "
                    "1,2,3,4,6 for the resnet)")
    args = ap.parse_args(argv)
    resnet = args.model == "resnet"
    if args.batch is None:
        args.batch = 256 if resnet else 4096
    if args.segments is None:
        args.segments = "1,2,3,4,6" if resnet else "2,3,4,6,9,12,18"
    opened = peer_common.open_device("checkpoint.py", args.device, "it runs on a GPU only")
    if opened is None:
        return 0
    torch, device, cuda = opened
    if not cuda:
        print("checkpoint.py: skipped: needs a CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = resnet   # torch's default for convolutions, as resnet.py runs them
    torch.backends.cudnn.benchmark = resnet
    torch.manual_seed(0)
    what = (f"resnet18 (32x32, 10 classes), batch {args.batch}, f32 channels_last, cuDNN TF32 on" if resnet
            else f"{args.layers} layers of width {args.width}, batch {args.batch}, f32")
    print(f"# checkpoint.py: torch {torch.__version__} on {device} ({torch.cuda.get_device_name(device)}): "
          f"{what}, SGD")
    sys.stdout.flush()
    # checkpoint_sequential cuts the Sequential's modules: the MLP's layers, the ResNet's 11 children
    modules = 11 if resnet else args.layers
    failed = 0
    for name, s in [("none", 0)] + [(f"s{s}", s) for s in (int(v) for v in args.segments.split(",") if v)]:
        if s and not (resnet or s > 1) or s > modules:
            continue
        try:
            run_point(torch, name, s, args, device)
        except RuntimeError as e:   # a point torch refuses (out of memory, an in-place clash): said, not hidden
            print(f"# checkpoint.py: {args.model} {name}: failed: {e}")
            sys.stdout.flush()
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
