"""PyTorch DDP peer of bench/bench_ddp.c: the mid MLP (Linear(1024,1024)+ReLU x7, Linear(1024,10)), batch 256 per GPU,
cross-entropy, SGD lr 0.01 momentum 0.9, f32 (TF32 off), over N GPUs: one process per GPU spawned here with
torch.multiprocessing (no torchrun), the NCCL backend with NVLink multicast off (NCCL_NVLS_ENABLE=0), DDP's default
25 MB buckets, eager (no CUDA Graphs). The weights and each rank's rows of the batch come from bench_util.h's hash,
as in bench_ddp. Timing as bench_ddp: 10 warm-up steps, steps calibrated to about 100 ms, 5 repeats of a host clock
around them and a read of the loss on every rank (a barrier), the median. Rank 0 prints
ddp.mid.gpus<N>.torch_step_ms and ddp.mid.gpus<N>.torch_images_per_s.

    python3 bench/peers/ddp.py [--gpus N] [--port P]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import hash32  # noqa: E402

LAYERS, WIDTH, CLASSES, BATCH, WARMUP, REPEATS = 8, 1024, 10, 256, 10, 5


def uniform(torch, stream, first, n, scale, device):
    h = hash32(stream, torch.arange(first, first + n, dtype=torch.int64, device=device))
    return (((h.to(torch.float64) / 4294967296.0) * 2.0 - 1.0) * scale).to(torch.float32)


def worker(rank, world, port):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    import torch
    import torch.distributed as dist
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
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
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = uniform(torch, 1, rank * BATCH * WIDTH, BATCH * WIDTH, 1.0, dev).view(BATCH, WIDTH)
    y = (hash32(2, torch.arange(rank * BATCH, (rank + 1) * BATCH, dtype=torch.int64, device=dev)) % CLASSES)
    loss_fn = torch.nn.CrossEntropyLoss()

    def steps(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)   # waits for every rank, as bench_ddp reads every replica's loss
        return l.item() / world

    first = steps(1)
    warm = steps(WARMUP - 1)
    t = time.perf_counter()
    steps(10)
    est = (time.perf_counter() - t) / 10
    n = max(5, int(0.1 / max(est, 1e-6)))
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        steps(n)
        times.append((time.perf_counter() - t) / n)
    times.sort()
    if rank == 0:
        med = times[REPEATS // 2]
        print(f"ddp.mid.gpus{world}.torch_loss_step1 {first:.6f} loss")
        print(f"ddp.mid.gpus{world}.torch_loss_step{WARMUP} {warm:.6f} loss")
        print(f"ddp.mid.gpus{world}.torch_step_ms {med * 1e3:.4f} ms")
        print(f"ddp.mid.gpus{world}.torch_step_ms_min {times[0] * 1e3:.4f} ms")
        print(f"ddp.mid.gpus{world}.torch_images_per_s {world * BATCH / med:.1f} images/s", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < a.gpus:
        print(f"# ddp.py: {a.gpus} GPUs asked for, {torch.cuda.device_count()} visible: skipped")
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(worker, args=(a.gpus, a.port), nprocs=a.gpus, join=True)


if __name__ == "__main__":
    main()
