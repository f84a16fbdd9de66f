#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_mlp_train.c: one MLP training step (forward, loss, backward, SGD update) timed
in each of PyTorch's fast modes (eager, a whole-step CUDA Graph replay, and torch.compile's two settings with the
compiled step captured likewise), on the same four configurations, the same data and the same initial weights,
printing one figure per line as `<name> <value> <unit>` with "torch_<mode>_" where the C bench prints "deft_", then
"torch_best_": the fastest mode's.

    python3 bench/peers/mlp_train.py [--config tiny|small|mid|large] [--device cuda:N|cpu] [--tf32]
                                     [--amp bf16|f16] [--modes eager,graph,compile_graph,autotune_graph]

With --tf32, f32 matmuls may use TF32 (torch.backends.cuda.matmul.allow_tf32 = True), only mid and large run
unless --config says otherwise, and the figures are named after "<config>_tf32" (bench_mlp_train --tf32 does the
same with deft's compile option `tf32`).

With --amp bf16|f16, forward and loss run under torch.autocast(dtype=...) (the loss in f32, as autocast puts it),
and the figures are named after "<config>_bf16" / "<config>_f16" (bench_mlp_train --amp does the same with deft's
compile option `autocast`). f16 adds a torch.amp.GradScaler (GradScaler's defaults, as deft's): scale(loss).backward(),
scaler.step(opt), scaler.update(). On CUDA every mode and precision uses SGD(fused=True) (PyTorch's fastest SGD;
its step also takes the scale and found_inf on the device, so that the whole-step CUDA Graph holds the scaler
without a host synchronisation: GradScaler.step reads found_inf on the host for other optimizers).

Configurations (f32, TF32 off; `layers` nn.Linear layers, nn.ReLU between them, none after the last):
    tiny   Linear(10, 1), batch 32, nn.MSELoss against f32 targets [32, 1], SGD lr 0.01 (no momentum)
    small  Linear(256,256)+ReLU x3, Linear(256,10);    batch 64,   nn.CrossEntropyLoss, SGD lr 0.01 momentum 0.9
    mid    Linear(1024,1024)+ReLU x7, Linear(1024,10); batch 256,  as small
    large  Linear(4096,4096)+ReLU x7, Linear(4096,10); batch 2048, as small
The labels are int64 here (nn.CrossEntropyLoss's class indices); deft reads i32 ones of the same values.

Data and weights come from an integer hash of each element's index (hash32 in peer_common.py, the same as the C bench's), so
both programs train the same model on the same batch and their losses at a given step agree to f32 rounding.

Timing: the batch is made once on the device and reused (static inputs). 20 warm-up steps (the loss of the first
and of the 20th is printed), 10 steps to choose N so that N steps take about 100 ms, then 7 repeats of N steps
between two torch.cuda.Event records; the figure is the median of (time / N), with the fastest and slowest repeat.
The modes (--modes picks them and their order; each in a clean slate: peer_common.py's Stepper and run_modes):
  eager           optimizer.zero_grad(set_to_none=True), forward, loss, backward, optimizer.step() per step.
  graph           the "whole network capture" recipe of the PyTorch CUDA Graphs docs: 3 warm-up steps on a side
                  stream (counted among the 20), zero_grad(set_to_none=True), then forward, loss, backward and
                  optimizer.step() captured into one torch.cuda.CUDAGraph; each step is one replay.
  compile_graph   forward and loss under torch.compile (mode "default"), compiled in the first warm-up step, then
                  the whole step captured as in graph.
  autotune_graph  the same with torch.compile(mode="max-autotune-no-cudagraphs").
torch_<mode>_compile_s is the first warm-up step's wall time (compilation and autotuning included), never counted in
the step times. torch_peak_bytes is torch.cuda.max_memory_allocated() over graph mode from after that first step to
the end (parameters, gradients, momentum, the batch, activations and the graph's pool; not compilation's scratch);
torch_<mode>_peak_bytes the same over the other modes. Then torch_best_mode (the mode with the least median step
time, also said in a `# ...: torch's best: <mode>` line), torch_best_step_us, _tflops and _peak_bytes. A mode that
fails says why in a `# ...` line and the next one runs. With --device cpu only eager runs, timed with a host clock.

torch is imported inside main(), so the file compiles and imports without it.
"""
import argparse
import math
import sys

import peer_common
from peer_common import Timer, fresh, hash32, hash_uniform

WARMUP_STEPS = 20
CALIBRATE_STEPS = 10
REPEATS = 7
TARGET_REPEAT_S = 0.1

# name: (layers, in_dim, width, classes, batch, mse, lr, momentum, run by --device cpu without --config)
CONFIGS = {
    "tiny": (1, 10, 1, 1, 32, True, 0.01, 0.0, True),
    "small": (4, 256, 256, 10, 64, False, 0.01, 0.9, True),
    "mid": (8, 1024, 1024, 10, 256, False, 0.01, 0.9, False),
    "large": (8, 4096, 4096, 10, 2048, False, 0.01, 0.9, False),
}


def measure(timer, fn, read_loss):
    return peer_common.measure(timer, fn, read_loss, CALIBRATE_STEPS, REPEATS, TARGET_REPEAT_S)


def layer_dims(cfg):
    layers, in_dim, width, classes = cfg[:4]
    return [(in_dim if l == 0 else width, classes if l == layers - 1 else width) for l in range(layers)]


def make_model(torch, cfg, device):
    mods = []
    dims = layer_dims(cfg)
    for l, (fan_in, fan_out) in enumerate(dims):
        lin = torch.nn.Linear(fan_in, fan_out, device=device)
        scale = 1.0 / math.sqrt(fan_in)
        with torch.no_grad():
            lin.weight.copy_(hash_uniform(torch, 100 + 2 * l, fan_out * fan_in, scale, device).view(fan_out, fan_in))
            lin.bias.copy_(hash_uniform(torch, 101 + 2 * l, fan_out, scale, device))
        mods.append(lin)
        if l < len(dims) - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def make_batch(torch, cfg, device):
    _, in_dim, _, classes, batch, mse = cfg[:6]
    x = hash_uniform(torch, 1, batch * in_dim, 1.0, device).view(batch, in_dim)
    if mse:
        y = hash_uniform(torch, 2, batch * classes, 1.0, device).view(batch, classes)
    else:
        y = (hash32(2, torch.arange(batch, dtype=torch.int64, device=device)) % classes).to(torch.int64)
    return x, y


def step_flop(cfg):
    """Matmul work of one step: forward, weight gradients, and input gradients of every layer but the first."""
    batch = cfg[4]
    return sum((3.0 if l else 2.0) * 2.0 * batch * i * o for l, (i, o) in enumerate(layer_dims(cfg)))


class Amp:
    """What --amp changes in a step: the autocast context around forward and loss, and for f16 the GradScaler."""

    def __init__(self, torch, kind, device):
        self.torch, self.kind, self.device = torch, kind, device
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(kind)
        self.scaler = None
        if kind == "f16":   # torch.amp.GradScaler from torch 2.3; torch.cuda.amp's before
            grad_scaler = getattr(torch.amp, "GradScaler", None)
            self.scaler = grad_scaler(device.type) if grad_scaler else torch.cuda.amp.GradScaler()

    def autocast(self):
        import contextlib
        if self.dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def optimizer(self, model, cfg):
        extra = {"fused": True} if self.device.type == "cuda" else {}
        return self.torch.optim.SGD(model.parameters(), lr=cfg[6], momentum=cfg[7], **extra)

    def backward_step(self, loss, opt):
        if self.scaler is None:
            loss.backward()
            opt.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(opt)
        self.scaler.update()


def report(name, tag, cfg, us, n, losses, steps, peak):
    first, warm, last = losses
    print(f"mlp_train.{name}.{tag}_step_us {us[REPEATS // 2]:.2f} us")
    print(f"mlp_train.{name}.{tag}_step_us_min {us[0]:.2f} us")
    print(f"mlp_train.{name}.{tag}_step_us_max {us[-1]:.2f} us")
    print(f"mlp_train.{name}.{tag}_steps_per_repeat {n} count")
    print(f"mlp_train.{name}.{tag}_tflops {step_flop(cfg) / (us[REPEATS // 2] * 1e-6) / 1e12:.3f} TFLOP/s")
    if peak is not None:
        peak_name = "torch_peak_bytes" if tag == "torch_graph" else f"{tag}_peak_bytes"
        print(f"mlp_train.{name}.{peak_name} {peak} bytes")
    print(f"mlp_train.{name}.{tag}_loss_first {first:.6f} loss")
    print(f"mlp_train.{name}.{tag}_loss_warmup {warm:.6f} loss")
    print(f"mlp_train.{name}.{tag}_loss {last:.6f} loss")
    print(f"mlp_train.{name}.{tag}_loss_steps {steps} count")
    sys.stdout.flush()


def run_mode(torch, name, cfg, device, cuda, amp_kind, mode):
    """One mode of one configuration in a clean slate: its figures printed, (step time, peak) returned."""
    left = fresh(torch, cuda)
    amp = Amp(torch, amp_kind, device)
    model = make_model(torch, cfg, device)
    x, y = make_batch(torch, cfg, device)
    loss_fn = torch.nn.MSELoss() if cfg[5] else torch.nn.CrossEntropyLoss()
    opt = amp.optimizer(model, cfg)

    def forward_loss(x, y):
        return loss_fn(model(x), y)

    fwd = peer_common.compile_for(torch, forward_loss, mode)

    def body():
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = fwd(x, y)
        amp.backward_step(loss, opt)
        return loss

    step = peer_common.Stepper(torch, body)
    compile_s, first = step.warm_up(mode, WARMUP_STEPS, device)
    warm = step.loss.item()
    us, n, loss = measure(Timer(torch, cuda), step, lambda: step.loss.item())
    peak = torch.cuda.max_memory_allocated(device) - left if cuda else None
    steps = WARMUP_STEPS + CALIBRATE_STEPS + REPEATS * n
    print(f"mlp_train.{name}.{peer_common.tag(mode)}_compile_s {compile_s:.3f} s")
    report(name, peer_common.tag(mode), cfg, us, n, (first, warm, loss), steps, peak)
    del step, model, opt, x, y
    return {"time": us[REPEATS // 2], "peak": peak}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), help="run one configuration (default: all)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: eager only, tiny and small)")
    ap.add_argument("--tf32", action="store_true", help="let f32 matmuls use TF32 (mid and large by default)")
    ap.add_argument("--amp", choices=("bf16", "f16"), help="torch.autocast in bf16 or f16 (f16 with a GradScaler)")
    ap.add_argument("--modes", default=",".join(peer_common.MODES), help=peer_common.MODES_HELP)
    args = ap.parse_args(argv)
    peer_common.parse_modes(ap, args.modes)

    opened = peer_common.open_device("mlp_train.py", args.device, "--device cpu runs tiny and small on the CPU")
    if opened is None:
        return 0
    torch, device, cuda = opened
    modes = peer_common.parse_modes(ap, args.modes, cuda)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(0)
    where = f"{device} ({torch.cuda.get_device_name(device)})" if cuda else "cpu"
    amp_note = f", autocast {args.amp}" if args.amp else ""
    print(f"# mlp_train.py: torch {torch.__version__} on {where}, TF32 {'on' if args.tf32 else 'off'}{amp_note}; "
          f"modes {', '.join(modes)}")
    sys.stdout.flush()

    failed = 0
    for name, cfg in CONFIGS.items():
        if args.config and name != args.config:
            continue
        if not args.config and not cuda and not cfg[8]:
            continue
        if not args.config and args.tf32 and name not in ("mid", "large"):
            continue
        if args.tf32:
            name = name + "_tf32"
        if args.amp:
            name = name + "_" + args.amp
        print(f"mlp_train.{name}.step_gflop {step_flop(cfg) / 1e9:.6f} GFLOP")
        best = peer_common.run_modes(f"mlp_train.{name}", modes,
                                     lambda mode: run_mode(torch, name, cfg, device, cuda, args.amp, mode))
        if best is None:
            failed = 1
            continue
        mode, fig = best
        print(f"mlp_train.{name}.torch_best_mode {mode} mode")
        print(f"mlp_train.{name}.torch_best_step_us {fig['time']:.2f} us")
        print(f"mlp_train.{name}.torch_best_tflops {step_flop(cfg) / (fig['time'] * 1e-6) / 1e12:.3f} TFLOP/s")
        if fig["peak"] is not None:
            print(f"mlp_train.{name}.torch_best_peak_bytes {fig['peak']} bytes")
        sys.stdout.flush()
    return failed


if __name__ == "__main__":
    sys.exit(main())
