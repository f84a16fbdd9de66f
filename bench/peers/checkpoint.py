#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_checkpoint.c: one training step of the same 36-layer MLP (Linear(2048, 2048) +
ReLU x35, Linear(2048, 10); batch 4096, f32, nn.CrossEntropyLoss, SGD lr 0.01 momentum 0.9) run with
torch.utils.checkpoint.checkpoint_sequential over segment counts, printing per point its peak memory and step time
as `<name> <value> <unit>`:

    python3 bench/peers/checkpoint.py [--model mlp|resnet] [--device cuda:N] [--layers L] [--width W] [--batch B]
                                      [--segments 2,3,...] [--modes eager,graph,compile_graph,autotune_graph]

--model resnet: torchvision's resnet18(num_classes=10) as bench/peers/resnet.py builds it (its own torch.nn copy
without torchvision), channels_last, on 32x32 images, batch 256, cuDNN's TF32 on (torch's default; matmul TF32 off),
cudnn.benchmark on, SGD with weight decay 5e-4 as bench_resnet; checkpoint_sequential runs over an nn.Sequential of
its children (conv1, bn1, relu, maxpool, layer1..4, avgpool, flatten, fc) for segment counts 1, 2, 3, 4, 6 (1 is
checkpoint_sequential's own: its last segment is never checkpointed, so it keeps everything). The figures are named
checkpoint.resnet.torch.<pt>.*. The data are bench_resnet's (resnet.py's make_batch); the weights are torch's
own draws, so the losses agree with deft's only roughly. A mode that torch refuses at a point prints
"# <point>: torch_<mode> failed: ..." and the others still run.

Points: "none" (the plain model) and "s<k>" (checkpoint_sequential(model, k, x, use_reentrant=False,
preserve_rng_state=False: nothing draws random numbers): every segment but the last keeps only its input and is
recomputed in the backward pass). The model is an nn.Sequential of `layers` blocks (Linear + ReLU, the last a Linear
alone), so segments split it at layer boundaries. SGD is fused (SGD(fused=True), PyTorch's fastest).

Each point runs in each of PyTorch's modes (--modes picks them and their order; each in a clean slate:
peer_common.py's Stepper and run_modes): eager; graph (the whole step captured in one CUDA Graph after 3 warm-up steps
on a side stream); compile_graph (forward, checkpointing and loss under torch.compile, mode "default", then captured
likewise) and autotune_graph (mode "max-autotune-no-cudagraphs", captured). A mode that fails says why in a `# ...`
line and the next one runs.

Figures per point and mode, under checkpoint.torch.<pt>.* for eager (the names this peer always had) and
checkpoint.torch_<mode>.<pt>.* for the others: .peak_bytes (torch.cuda.max_memory_allocated from after the first
warm-up step to the end: parameters, gradients, momentum, the batch, activations, cuBLAS's workspace, the graph's
pool; not the first step's compilation, autotuning and cudnn.benchmark trials with their workspaces; the ResNet's
ReLUs are not in place, which checkpoint_sequential's recompute needs), .step_ms (the median over repeats, between
CUDA events; fastest and slowest beside it), .compile_s (the first warm-up step's wall time, never counted in the
step times), .loss_warmup and .loss. Then checkpoint.torch_best.<pt>.mode (the mode with the least step_ms),
.segments, .peak_bytes and .step_ms: that mode's.

Data and weights come from bench_mlp_train's index hash (hash32 in peer_common.py, the C bench's bit for bit), so the losses
after the warm-up steps agree with bench_checkpoint's to f32 rounding. TF32 is off. torch is imported inside main().
"""
import argparse
import math
import sys

import peer_common
from peer_common import Timer, fresh, hash32, hash_uniform

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


def side_of(mode):
    """The side in the figure names: "torch" for eager (the names this peer always had), torch_<mode> for the others."""
    return "torch" if mode == "eager" else peer_common.tag(mode)


def run_point(torch, name, segments, args, device, mode):
    """One point in one mode, in a clean slate: its figures printed, (step time, peak) returned."""
    from torch.utils.checkpoint import checkpoint_sequential

    left = fresh(torch, True)
    if args.model == "resnet":
        model, x, y = make_resnet(torch, args.batch, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, fused=True)
    else:
        model = make_model(torch, args.layers, args.width, device)
        x, y = make_batch(torch, args.width, args.batch, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(x, y):
        # nothing here draws random numbers, so the RNG state is not saved for the recompute (that saving also reads
        # the generator's state, which a CUDA Graph capture refuses)
        out = checkpoint_sequential(model, segments, x, use_reentrant=False, preserve_rng_state=False) \
            if segments else model(x)
        return loss_fn(out, y)

    fwd = peer_common.compile_for(torch, forward_loss, mode)

    def body():
        opt.zero_grad(set_to_none=True)
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        return loss

    # The first step is timed apart and the peak restarts after it: it holds compilation and, for the ResNet,
    # cudnn.benchmark's trials of each convolution's algorithms with their workspaces (tuning, not the step's memory).
    step = peer_common.Stepper(torch, body)
    compile_s, _ = step.warm_up(mode, WARMUP_STEPS, device)
    warm = step.loss.item()
    us, n, loss = peer_common.measure(Timer(torch, True), step, lambda: step.loss.item(), CALIBRATE_STEPS, REPEATS,
                                      TARGET_REPEAT_S)
    ms = [u / 1e3 for u in us]
    peak = torch.cuda.max_memory_allocated(device) - left
    p = f"checkpoint.{'resnet.' if args.model == 'resnet' else ''}{side_of(mode)}.{name}"
    print(f"{p}.segments {segments} count")
    print(f"{p}.compile_s {compile_s:.3f} s")
    print(f"{p}.peak_bytes {peak} bytes")
    print(f"{p}.step_ms {ms[REPEATS // 2]:.3f} ms")
    print(f"{p}.step_ms_min {ms[0]:.3f} ms")
    print(f"{p}.step_ms_max {ms[-1]:.3f} ms")
    print(f"{p}.steps_per_repeat {n} count")
    print(f"{p}.loss_warmup {warm:.6f} loss")
    print(f"{p}.loss {loss:.6f} loss")
    sys.stdout.flush()
    del step, model, opt, x, y
    return {"time": ms[REPEATS // 2], "peak": peak}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, help="default: 4096 (mlp), 256 (resnet)")
    ap.add_argument("--segments", help="segment counts, comma-separated (default: 2,3,4,6,9,12,18 for the mlp, "
                    "1,2,3,4,6 for the resnet)")
    ap.add_argument("--modes", default=",".join(peer_common.MODES), help=peer_common.MODES_HELP)
    args = ap.parse_args(argv)
    modes = peer_common.parse_modes(ap, args.modes)
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
          f"{what}, SGD; modes {', '.join(modes)}")
    sys.stdout.flush()
    # checkpoint_sequential cuts the Sequential's modules: the MLP's layers, the ResNet's 11 children
    modules = 11 if resnet else args.layers
    pre = f"checkpoint.{'resnet.' if resnet else ''}"
    failed = 0
    for name, s in [("none", 0)] + [(f"s{s}", s) for s in (int(v) for v in args.segments.split(",") if v)]:
        if s and not (resnet or s > 1) or s > modules:
            continue
        # a mode torch refuses at this point (out of memory, an in-place clash, a capture): said, not hidden
        best = peer_common.run_modes(f"{pre}{name}", modes,
                                     lambda mode: run_point(torch, name, s, args, device, mode))
        if best is None:
            failed = 1
            continue
        mode, fig = best
        print(f"{pre}torch_best.{name}.mode {mode} mode")
        print(f"{pre}torch_best.{name}.segments {s} count")
        print(f"{pre}torch_best.{name}.peak_bytes {fig['peak']} bytes")
        print(f"{pre}torch_best.{name}.step_ms {fig['time']:.3f} ms")
        sys.stdout.flush()
    return failed


if __name__ == "__main__":
    sys.exit(main())
