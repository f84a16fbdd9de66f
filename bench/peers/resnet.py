#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_resnet.c: images per second of a ResNet-18 training step (torchvision's
resnet18(num_classes=10) on 32x32 images; forward, nn.CrossEntropyLoss, backward, SGD lr 0.01, momentum 0.9,
weight decay 5e-4, fused) in each of PyTorch's fast modes (eager, a whole-step CUDA Graph replay, and
torch.compile's two settings with the compiled step captured likewise), printing one figure per line as
`<name> <value> <unit>` with "torch_<mode>_" where the C bench prints "deft_", then "torch_best_": the fastest mode's.

    python3 bench/peers/resnet.py [--batch N] [--precision f32|bf16|f16] [--device cuda:N|cpu] [--tf32]
                                  [--no-cudnn-tf32] [--nhwc] [--modes eager,graph,compile_graph,autotune_graph]

Configurations, named "b<batch>_<precision>": batch 128 and 512 (or --batch), each in
    f32    NCHW (contiguous; channels_last with --nhwc, as bench_resnet's --nhwc), no autocast. Convolutions follow
           torch's default torch.backends.cudnn.allow_tf32 = True (--no-cudnn-tf32 turns it off); matmuls TF32 only
           with --tf32.
    bf16   the model and the batch in channels_last, forward and loss under torch.autocast(dtype=torch.bfloat16).
    f16    as bf16 with torch.float16, and a GradScaler (see Setup: SGD(fused=True) keeps it on the device).
When torchvision is not installed, the same network is built here from torch.nn (class ResNet18 below: the layout,
the parameter names and the initialisation of torchvision.models.resnet18), and the header line says so.

Data: x uniform in [-1, 1) and labels in [0, 10) from an integer hash of each element's index (hash32, as the C
bench computes it), made once on the device and reused.

Timing (as bench/peers/mlp_train.py): 20 warm-up steps (the loss of the first and of the 20th printed), 10 steps to
choose N so that N steps take about 200 ms, then 7 repeats of N steps between two torch.cuda.Event records; the
figures are the median of (time / N) and batch / that time, with the fastest and slowest repeat.
The modes (--modes picks them and their order; each in a clean slate: peer_common.py's Stepper and run_modes):
  eager           optimizer.zero_grad(set_to_none=True), forward, loss, backward, optimizer.step() per step.
  graph           the "whole network capture" recipe of the PyTorch CUDA Graphs docs: 3 warm-up steps on a side
                  stream (counted among the 20), then forward, loss, backward and optimizer.step() captured into one
                  torch.cuda.CUDAGraph; each step is one replay.
  compile_graph   forward and loss under torch.compile (mode "default"), compiled in the first warm-up step, then
                  the whole step captured as in graph.
  autotune_graph  the same with torch.compile(mode="max-autotune-no-cudagraphs").
<tag>_compile_s is the first warm-up step's wall time (compilation, autotuning and cudnn.benchmark's trials), never
counted in the step times. <tag>_peak_bytes is torch.cuda.max_memory_allocated() over the mode from after that first
step to the end (parameters, gradients, momentum, the batch, activations, cuDNN workspaces and the graph's pool; not
the first step's tuning scratch). Then torch_best_mode (the mode with the least median step time, also said in a
`# ...: torch's best: <mode>` line), torch_best_images_per_s, _step_us and _peak_bytes. A mode that fails says why
in a `# ...` line and the next one runs. With --device cpu only eager runs, batch 16, timed with a host clock.

torch is imported inside main(), so the file compiles and imports without it.
"""
import argparse
import sys

import peer_common
from peer_common import Timer, fresh, hash32

F32_CHANNELS_LAST = False   # --nhwc
WARMUP_STEPS = 20
CALIBRATE_STEPS = 10
REPEATS = 7
TARGET_REPEAT_S = 0.2
BATCHES = (128, 512)


def make_batch(torch, batch, device, channels_last):
    n = batch * 3 * 32 * 32
    h = hash32(1, torch.arange(n, dtype=torch.int64, device=device))
    x = ((h.to(torch.float64) / 4294967296.0) * 2.0 - 1.0).to(torch.float32).view(batch, 3, 32, 32)
    y = (hash32(2, torch.arange(batch, dtype=torch.int64, device=device)) % 10).to(torch.int64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


def plain_resnet18(torch, num_classes):
    """torchvision.models.resnet18(num_classes=...) written out in torch.nn, for environments without torchvision."""
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, inp, out, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out)
            self.downsample = None
            if stride != 1 or inp != out:
                self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, inp = [], 64
            for i, width in enumerate((64, 128, 256, 512)):
                stride = 1 if i == 0 else 2
                layers.append(nn.Sequential(BasicBlock(inp, width, stride), BasicBlock(width, width, 1)))
                inp = width
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18()


def make_model(torch, device, channels_last):
    try:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
    except ImportError:
        model = plain_resnet18(torch, 10)
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def measure(timer, fn, read_loss, calibrate):
    return peer_common.measure(timer, fn, read_loss, calibrate, REPEATS, TARGET_REPEAT_S)


def report(name, tag, batch, us, n, losses, steps, peak):
    first, warm, last = losses
    med = us[REPEATS // 2]
    print(f"resnet.{name}.{tag}_images_per_s {batch / (med * 1e-6):.1f} images/s")
    print(f"resnet.{name}.{tag}_step_us {med:.2f} us")
    print(f"resnet.{name}.{tag}_step_us_min {us[0]:.2f} us")
    print(f"resnet.{name}.{tag}_step_us_max {us[-1]:.2f} us")
    print(f"resnet.{name}.{tag}_steps_per_repeat {n} count")
    if peak is not None:
        print(f"resnet.{name}.{tag}_peak_bytes {peak} bytes")
    print(f"resnet.{name}.{tag}_loss_first {first:.6f} loss")
    print(f"resnet.{name}.{tag}_loss_warmup {warm:.6f} loss")
    print(f"resnet.{name}.{tag}_loss {last:.6f} loss")
    print(f"resnet.{name}.{tag}_loss_steps {steps} count")
    sys.stdout.flush()


class Setup:
    """What one configuration trains in one mode: the model, the batch, the forward and loss (under torch.compile in
    the compiled modes), the optimizer, the autocast context and, for f16, the GradScaler (GradScaler's defaults, as
    deft's). On CUDA every mode uses SGD(fused=True): PyTorch's fastest SGD, and its step takes the scale and
    found_inf on the device, so that the whole step, scaler included, can be one CUDA Graph (GradScaler.step reads
    found_inf on the host for other optimizers)."""

    def __init__(self, torch, batch, precision, device, mode):
        import contextlib
        channels_last = precision != "f32" or F32_CHANNELS_LAST
        self.model = make_model(torch, device, channels_last)
        self.x, self.y = make_batch(torch, batch, device, channels_last)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.fwd = peer_common.compile_for(torch, self.forward_loss, mode)
        extra = {"fused": True} if device.type == "cuda" else {}
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, **extra)
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(precision)
        self.autocast = (lambda: torch.autocast(device_type=device.type, dtype=dtype)) if dtype \
            else contextlib.nullcontext
        self.scaler = None
        if precision == "f16":   # torch.amp.GradScaler from torch 2.3; torch.cuda.amp's before
            grad_scaler = getattr(torch.amp, "GradScaler", None)
            self.scaler = grad_scaler(device.type) if grad_scaler else torch.cuda.amp.GradScaler()

    def backward_step(self, loss):
        if self.scaler is None:
            loss.backward()
            self.opt.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def forward_loss(self, x, y):
        return self.loss_fn(self.model(x), y)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.fwd(self.x, self.y)
        self.backward_step(loss)
        return loss


def run_mode(torch, name, batch, precision, device, cuda, mode):
    """One mode of one configuration in a clean slate: its figures printed, (step time, peak) returned."""
    left = fresh(torch, cuda)
    s = Setup(torch, batch, precision, device, mode)
    step = peer_common.Stepper(torch, s.step)
    warmup = WARMUP_STEPS if cuda else 3
    compile_s, first = step.warm_up(mode, warmup, device)
    warm = step.loss.item()
    calibrate = CALIBRATE_STEPS if cuda else 2
    us, n, loss = measure(Timer(torch, cuda), step, lambda: step.loss.item(), calibrate)
    peak = torch.cuda.max_memory_allocated(device) - left if cuda else None
    print(f"resnet.{name}.{peer_common.tag(mode)}_compile_s {compile_s:.3f} s")
    report(name, peer_common.tag(mode), batch, us, n, (first, warm, loss), warmup + calibrate + REPEATS * n, peak)
    del step, s
    return {"time": us[REPEATS // 2], "peak": peak}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, help="one batch size (default: 128 and 512; 16 on the CPU)")
    ap.add_argument("--precision", choices=("f32", "bf16", "f16"), help="one precision (default: all three)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: eager only, batch 16)")
    ap.add_argument("--tf32", action="store_true", help="let f32 matmuls use TF32")
    ap.add_argument("--no-cudnn-tf32", action="store_true", help="f32 convolutions without TF32 (torch's default: on)")
    ap.add_argument("--nhwc", action="store_true", help="the f32 model and batch in channels_last too")
    ap.add_argument("--modes", default=",".join(peer_common.MODES), help=peer_common.MODES_HELP)
    args = ap.parse_args(argv)
    peer_common.parse_modes(ap, args.modes)
    global F32_CHANNELS_LAST
    F32_CHANNELS_LAST = args.nhwc

    opened = peer_common.open_device("resnet.py", args.device, "--device cpu runs batch 16 on the CPU")
    if opened is None:
        return 0
    torch, device, cuda = opened
    modes = peer_common.parse_modes(ap, args.modes, cuda)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = not args.no_cudnn_tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    try:
        import torchvision
        source = f"torchvision {torchvision.__version__}"
    except ImportError:
        source = "torch.nn (torchvision is not installed)"
    where = f"{device} ({torch.cuda.get_device_name(device)})" if cuda else "cpu"
    print(f"# resnet.py: torch {torch.__version__} on {where}, resnet18 from {source}, cudnn.benchmark on, "
          f"matmul TF32 {'on' if args.tf32 else 'off'}, cuDNN TF32 {'off' if args.no_cudnn_tf32 else 'on'}, "
          f"f32 {'channels_last' if args.nhwc else 'NCHW'}; modes {', '.join(modes)}")
    sys.stdout.flush()

    batches = (args.batch,) if args.batch else BATCHES if cuda else (16,)
    failed = 0
    for precision in ("f32", "bf16", "f16"):
        if args.precision and precision != args.precision:
            continue
        for batch in batches:
            name = f"b{batch}_{precision}"
            best = peer_common.run_modes(f"resnet.{name}", modes,
                                         lambda mode: run_mode(torch, name, batch, precision, device, cuda, mode))
            if best is None:
                failed = 1
                continue
            mode, fig = best
            print(f"resnet.{name}.torch_best_mode {mode} mode")
            print(f"resnet.{name}.torch_best_images_per_s {batch / (fig['time'] * 1e-6):.1f} images/s")
            print(f"resnet.{name}.torch_best_step_us {fig['time']:.2f} us")
            if fig["peak"] is not None:
                print(f"resnet.{name}.torch_best_peak_bytes {fig['peak']} bytes")
            sys.stdout.flush()
    return failed


if __name__ == "__main__":
    sys.exit(main())
