"""PyTorch DDP peer of bench/bench_ddp.c: the same training steps over N GPUs, one process per GPU spawned here with
torch.multiprocessing (no torchrun), the NCCL backend with NVLink multicast off (NCCL_NVLS_ENABLE=0), DDP's defaults
(25 MB buckets, buffers broadcast from rank 0 every forward), SGD(fused=True), in each of PyTorch's modes.

  --model mlp     the mid MLP (Linear(1024,1024)+ReLU x7, Linear(1024,10)), batch 256 per GPU, cross-entropy, SGD lr
                  0.01 momentum 0.9; its weights from bench_util.h's hash, as bench_ddp's
  --model resnet  torchvision's resnet18(num_classes=10) (resnet.py's make_model), batch 128 per GPU of 32x32 images,
                  cross-entropy, SGD lr 0.01 momentum 0.9 weight decay 5e-4, cudnn.benchmark on; --precision bf16 is
                  channels_last with torch.autocast(bfloat16), as resnet.py; its weights are torch's own draws
TF32 is off for matmuls and cuDNN unless --tf32 (bench_ddp's --tf32 is the same). Each rank's rows of the batch come
from bench_util.h's hash, offset by the rank, as in bench_ddp.

The modes (--modes picks them and their order), each in processes and a process group of its own:
  eager           the DDP module's forward, loss, backward (DDP's bucketed all-reduces), SGD step.
  graph           the whole step, all-reduces included, captured in one CUDA Graph, as PyTorch's CUDA Graphs notes
                  allow for DDP with NCCL >= 2.9.6 ("Usage with DistributedDataParallel"): NCCL's async error handling
                  off before the process group starts, DDP constructed on the side stream, and 11 DDP iterations on
                  that stream before the capture; then a step is one replay.
  compile_graph   torch.compile(ddp_model) (PyTorch's documented way: compile the DDP module; its DDPOptimizer splits
                  the graph at the buckets), mode "default", then the step captured as in graph.
  autotune_graph  the same with mode="max-autotune-no-cudagraphs".
A mode that fails says why in a `# ...` line and the next one runs.

Timing as bench_ddp: 10 warm-up steps (12 for the graph modes: 11 before the capture and one replay), steps
calibrated to about 100 ms (200 ms for resnet), 5 repeats of a host clock around them and a read of the loss on every
rank (a barrier), the median. Rank 0 prints, with <key> = mid or resnet_<precision>, ddp.<key>.gpus<N>.<tag>_step_ms,
..._step_ms_min, ..._images_per_s, ..._loss_step1, ..._loss_step<warm-up steps> and ..._compile_s (the first step's
wall time, compilation included, not counted in the step times), <tag> being torch for eager (the names this peer
always printed) and torch_<mode> for the others; then ddp.<key>.gpus<N>.torch_best_mode (the mode with the least
step time), torch_best_step_ms and torch_best_images_per_s.

    python3 bench/peers/ddp.py [--model mlp|resnet] [--precision f32|bf16] [--gpus N] [--port P] [--tf32]
                               [--modes eager,graph,compile_graph,autotune_graph]

Mode i uses ports P + 100 i. torch is imported inside the functions, so the file compiles and parses its arguments
without it.
"""
import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402
from peer_common import Stepper, compile_for, hash32  # noqa: E402

LAYERS, WIDTH, CLASSES, MLP_BATCH, RESNET_BATCH, IMAGE, WARMUP, REPEATS = 8, 1024, 10, 256, 128, 32, 10, 5
DDP_GRAPH_WARMUP = 11   # DDP iterations before a capture, as PyTorch's CUDA Graphs notes ask


def uniform(torch, stream, first, n, scale, device):
    h = hash32(stream, torch.arange(first, first + n, dtype=torch.int64, device=device))
    return (((h.to(torch.float64) / 4294967296.0) * 2.0 - 1.0) * scale).to(torch.float32)


def labels(torch, rank, batch, device):
    return hash32(2, torch.arange(rank * batch, (rank + 1) * batch, dtype=torch.int64, device=device)) % CLASSES


def mlp_setup(torch, rank, dev):
    layers = []
    for l in range(LAYERS):
        out = CLASSES if l == LAYERS - 1 else WIDTH
        lin = torch.nn.Linear(WIDTH, out, device=dev)
        scale = 1.0 / WIDTH ** 0.5
        with torch.no_grad():
            lin.weight.copy_(uniform(torch, 100 + 2 * l, 0, out * WIDTH, scale, dev).view(out, WIDTH))
            lin.bias.copy_(uniform(torch, 101 + 2 * l, 0, out, scale, dev))
        layers.append(lin)
        if l < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    x = uniform(torch, 1, rank * MLP_BATCH * WIDTH, MLP_BATCH * WIDTH, 1.0, dev).view(MLP_BATCH, WIDTH)
    return torch.nn.Sequential(*layers), x, labels(torch, rank, MLP_BATCH, dev), {}


def resnet_setup(torch, rank, dev, bf16):
    from resnet import make_model
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)   # the same draws on every rank (DDP broadcasts rank 0's anyway)
    model = make_model(torch, dev, bf16)
    n = RESNET_BATCH * 3 * IMAGE * IMAGE
    x = uniform(torch, 1, rank * n, n, 1.0, dev).view(RESNET_BATCH, 3, IMAGE, IMAGE)
    if bf16:
        x = x.contiguous(memory_format=torch.channels_last)
    return model, x, labels(torch, rank, RESNET_BATCH, dev), {"weight_decay": 5e-4}


def worker(rank, world, a, mode, port, results):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    graphed = mode != "eager"
    if graphed:
        # The CUDA Graphs notes' "Usage with DistributedDataParallel": NCCL's async error handling off before the
        # process group starts (its watchdog would query captured work; torch 2.2 and later handle this themselves):
        # the variable's name since 2.2 and its name before
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import torch
    import torch.distributed as dist
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    bf16 = a.precision == "bf16"
    if a.model == "resnet":
        net, x, y, opt_extra = resnet_setup(torch, rank, dev, bf16)
    else:
        net, x, y, opt_extra = mlp_setup(torch, rank, dev)
    # The same notes: for a capture, DDP is constructed on the side stream the warm-up and capture then use.
    side = torch.cuda.Stream() if graphed else None
    with torch.cuda.stream(side) if graphed else contextlib.nullcontext():
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    # torch.compile of the DDP module, as PyTorch's DDP + compile docs do (its DDPOptimizer splits the compiled
    # graph at the bucket boundaries so that the all-reduces overlap the backward pass); the loss stays outside
    fwd = compile_for(torch, model, mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True, **opt_extra)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def body():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    step = Stepper(torch, body)

    def mean_loss():
        l = step.loss.detach().float().clone()
        dist.all_reduce(l)   # waits for every rank, as bench_ddp reads every replica's loss
        return l.item() / world

    def steps(n):
        for _ in range(n):
            step()
        return mean_loss()

    # The notes ask for at least 11 DDP iterations before a capture (DDP_GRAPH_WARMUP, on the side stream): the graph
    # modes warm up for those, the capture and one replay (12 steps), eager for WARMUP as before.
    warmup = WARMUP if mode == "eager" else DDP_GRAPH_WARMUP + 1
    compile_s, first = step.warm_up(mode, warmup, dev, read_loss=mean_loss, side_warmup=DDP_GRAPH_WARMUP, side=side)
    warm = mean_loss()
    t = time.perf_counter()
    steps(10)
    est = (time.perf_counter() - t) / 10
    n = max(5, int((0.2 if a.model == "resnet" else 0.1) / max(est, 1e-6)))
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        steps(n)
        times.append((time.perf_counter() - t) / n)
    times.sort()
    if rank == 0:
        med, batch, p = times[REPEATS // 2], x.shape[0], f"ddp.{key(a)}.gpus{world}.{tag(mode)}"
        print(f"{p}_compile_s {compile_s:.3f} s")
        print(f"{p}_loss_step1 {first:.6f} loss")
        print(f"{p}_loss_step{warmup} {warm:.6f} loss")
        print(f"{p}_step_ms {med * 1e3:.4f} ms")
        print(f"{p}_step_ms_min {times[0] * 1e3:.4f} ms")
        print(f"{p}_images_per_s {world * batch / med:.1f} images/s", flush=True)
        results.put(med)
    dist.destroy_process_group()


def tag(mode):
    """eager's figures keep the names this peer always printed (torch_step_ms, ...); the others are torch_<mode>_."""
    return "torch" if mode == "eager" else peer_common.tag(mode)


def run_mode(a, mode, port):
    """One mode in processes of its own (a clean slate: a new process group, model and compiler): rank 0's step time
    in seconds, as the dict run_modes wants; raises when a rank failed or printed nothing."""
    import torch.multiprocessing as mp
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(a.gpus, a, mode, port, results), nprocs=a.gpus, join=True)
    if results.empty():
        raise RuntimeError("rank 0 reported no step time")
    return {"time": results.get()}


def key(a):
    return "mid" if a.model == "mlp" else f"resnet_{a.precision}"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32", help="bf16: resnet only")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--tf32", action="store_true", help="let f32 matmuls and convolutions use TF32")
    ap.add_argument("--modes", default=",".join(peer_common.MODES), help=peer_common.MODES_HELP)
    a = ap.parse_args(argv)
    a.modes = peer_common.parse_modes(ap, a.modes)
    if a.precision == "bf16" and a.model != "resnet":
        ap.error("--precision bf16 is for --model resnet")
    if a.gpus < 1:
        ap.error("--gpus must be at least 1")
    return a


def main():
    a = parse()
    try:
        import torch
    except ImportError as e:
        print(f"# ddp.py: ddp.{key(a)}: PyTorch is not installed ({e}): skipped")
        return 0
    if torch.cuda.device_count() < a.gpus:
        print(f"# ddp.py: ddp.{key(a)}: {a.gpus} GPUs asked for, {torch.cuda.device_count()} visible: skipped")
        return 0
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    label = f"ddp.{key(a)}.gpus{a.gpus}"
    print(f"# ddp.py: torch {torch.__version__}, {label}: modes {', '.join(a.modes)}", flush=True)
    # each mode on ports of its own (a.port + 100 i), so that one never waits for the last one's to be released
    ports = {mode: a.port + 100 * i for i, mode in enumerate(a.modes)}
    best = peer_common.run_modes(label, a.modes, lambda mode: run_mode(a, mode, ports[mode]))
    if best is None:
        return 1
    mode, fig = best
    print(f"{label}.torch_best_mode {mode} mode")
    print(f"{label}.torch_best_step_ms {fig['time'] * 1e3:.4f} ms")
    print(f"{label}.torch_best_images_per_s {a.gpus * batch_of(a) / fig['time']:.1f} images/s", flush=True)
    return 0


def batch_of(a):
    return RESNET_BATCH if a.model == "resnet" else MLP_BATCH


if __name__ == "__main__":
    sys.exit(main())
