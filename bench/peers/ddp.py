"""PyTorch DDP peer of bench/bench_ddp.c: the same training steps over N GPUs, one process per GPU spawned here with
torch.multiprocessing (no torchrun), the NCCL backend with NVLink multicast off (NCCL_NVLS_ENABLE=0), DDP's defaults
(25 MB buckets, buffers broadcast from rank 0 every forward), eager (no CUDA Graphs).

  --model mlp     the mid MLP (Linear(1024,1024)+ReLU x7, Linear(1024,10)), batch 256 per GPU, cross-entropy, SGD lr
                  0.01 momentum 0.9; its weights from bench_util.h's hash, as bench_ddp's
  --model resnet  torchvision's resnet18(num_classes=10) (resnet.py's make_model), batch 128 per GPU of 32x32 images,
                  cross-entropy, SGD lr 0.01 momentum 0.9 weight decay 5e-4, cudnn.benchmark on; --precision bf16 is
                  channels_last with torch.autocast(bfloat16), as resnet.py; its weights are torch's own draws
TF32 is off for matmuls and cuDNN unless --tf32 (bench_ddp's --tf32 is the same). Each rank's rows of the batch come
from bench_util.h's hash, offset by the rank, as in bench_ddp. Timing as bench_ddp: 10 warm-up steps, steps
calibrated to about 100 ms (200 ms for resnet), 5 repeats of a host clock around them and a read of the loss on every
rank (a barrier), the median. Rank 0 prints, with <key> = mid or resnet_<precision>, ddp.<key>.gpus<N>.torch_step_ms,
..._step_ms_min, ..._images_per_s, ..._loss_step1 and ..._loss_step10.

    python3 bench/peers/ddp.py [--model mlp|resnet] [--precision f32|bf16] [--gpus N] [--port P] [--tf32]

torch is imported inside the functions, so the file compiles and parses its arguments without it.
"""
import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import hash32  # noqa: E402

LAYERS, WIDTH, CLASSES, MLP_BATCH, RESNET_BATCH, IMAGE, WARMUP, REPEATS = 8, 1024, 10, 256, 128, 32, 10, 5


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


def worker(rank, world, a):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(a.port)
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
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **opt_extra)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def steps(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        l = loss.detach().float().clone()
        dist.all_reduce(l)   # waits for every rank, as bench_ddp reads every replica's loss
        return l.item() / world

    first = steps(1)
    warm = steps(WARMUP - 1)
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
        med, batch, p = times[REPEATS // 2], x.shape[0], f"ddp.{key(a)}.gpus{world}.torch"
        print(f"{p}_loss_step1 {first:.6f} loss")
        print(f"{p}_loss_step{WARMUP} {warm:.6f} loss")
        print(f"{p}_step_ms {med * 1e3:.4f} ms")
        print(f"{p}_step_ms_min {times[0] * 1e3:.4f} ms")
        print(f"{p}_images_per_s {world * batch / med:.1f} images/s", flush=True)
    dist.destroy_process_group()


def key(a):
    return "mid" if a.model == "mlp" else f"resnet_{a.precision}"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32", help="bf16: resnet only")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--tf32", action="store_true", help="let f32 matmuls and convolutions use TF32")
    a = ap.parse_args(argv)
    if a.precision == "bf16" and a.model != "resnet":
        ap.error("--precision bf16 is for --model resnet")
    if a.gpus < 1:
        ap.error("--gpus must be at least 1")
    return a


def main():
    a = parse()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"# ddp.py: ddp.{key(a)}: PyTorch is not installed ({e}): skipped")
        return
    if torch.cuda.device_count() < a.gpus:
        print(f"# ddp.py: ddp.{key(a)}: {a.gpus} GPUs asked for, {torch.cuda.device_count()} visible: skipped")
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(worker, args=(a.gpus, a), nprocs=a.gpus, join=True)


if __name__ == "__main__":
    main()
