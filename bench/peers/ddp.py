"""PyTorch DDP peer of bench/bench_ddp.c: the same training steps over N GPUs, one process per GPU spawned here with
torch.multiprocessing (no torchrun), the NCCL backend with NVLink multicast off (NCCL_NVLS_ENABLE=0), in each of
PyTorch's modes.

  --model mlp     the mid MLP (Linear(1024,1024)+ReLU x7, Linear(1024,10)), batch 256 per GPU, cross-entropy, SGD lr
                  0.01 momentum 0.9; its weights from bench_util.h's hash, as bench_ddp's
  --model resnet  torchvision's resnet18(num_classes=10) (resnet.py's make_model), batch 128 per GPU of 32x32 images,
                  cross-entropy, SGD lr 0.01 momentum 0.9 weight decay 5e-4, cudnn.benchmark on; --precision bf16 is
                  channels_last with torch.autocast(bfloat16), as resnet.py; its weights are torch's own draws
  --model gpt2    GPT-2 124M, nanoGPT's model from bench/peers/gpt2.py (make_model: tied head, SDPA attention),
                  --batch B sequences per GPU (16) of --seq T tokens (1024), --layers L (12); AdamW(fused=True) lr
                  6e-4 betas 0.9 and 0.95 eps 1e-8, weight decay 0.1 on the 2-D parameters only (nanoGPT's groups),
                  clip_grad_norm_(1.0), torch.autocast(bfloat16) (--precision f32: none); rank k's tokens
                  x[i] = hash32(1, k B T + i) mod V, y[i] = hash32(2, k B T + i) mod V, as bench_ddp's; torch's
                  own weights
The mlp and resnet models take SGD(fused=True) and DDP's defaults (25 MB buckets, buffers broadcast from rank 0 every
forward). GPT-2's DDP has bucket_cap_mb=25, gradient_as_bucket_view=True and, in the modes that do not compile,
static_graph=True (compiled DDP splits the graph at the buckets itself). With --zero GPT-2's optimizer is
torch.distributed.optim.ZeroRedundancyOptimizer(AdamW, fused=True) around DDP (the optimizer's state sharded, the
updated parameters broadcast from their owners); with --fsdp the model is FSDP(SHARD_GRAD_OP) (each block its own
unit, use_orig_params=True), gradients reduce-scattered and clipped by FSDP's clip_grad_norm_. With --bf16-hook GPT-2's
DDP averages its gradient buckets in bf16 through DDP's bf16_compress_hook (bench_ddp's --reduce-bf16: the same work),
and --bucket-mb M sets DDP's bucket_cap_mb (25). TF32 is off for
matmuls and cuDNN unless --tf32 (bench_ddp's --tf32 is the same). Each rank's rows of the batch come from
bench_util.h's hash, offset by the rank, as in bench_ddp.

The modes (--modes picks them and their order), each in processes and a process group of its own:
  eager           the DDP module's forward, loss, backward (DDP's bucketed all-reduces), the optimizer's step.
  graph           the whole step, all-reduces included, captured in one CUDA Graph, as PyTorch's CUDA Graphs notes
                  allow for DDP with NCCL >= 2.9.6 ("Usage with DistributedDataParallel"): NCCL's async error handling
                  off before the process group starts, DDP constructed on the side stream, and 11 DDP iterations on
                  that stream before the capture; then a step is one replay.
  compile_graph   torch.compile(ddp_model) (PyTorch's documented way: compile the DDP module; its DDPOptimizer splits
                  the graph at the buckets), mode "default", then the step captured as in graph.
  autotune_graph  the same with mode="max-autotune-no-cudagraphs".
  compile         (only when named) torch.compile(ddp_model), mode "default", the step not captured: how ZeRO and
                  FSDP run when their steps do not capture.
A mode that fails says why in a `# ...` line and the next one runs.

Timing as bench_ddp: 10 warm-up steps (12 for the graph modes: 11 before the capture and one replay), steps
calibrated to about 100 ms (200 ms for resnet, 500 ms for gpt2), 5 repeats of a host clock around them and a read of
the loss on every rank (a barrier), the median. Rank 0 prints, with <key> = mid, resnet_<precision> or
gpt2_<model>_b<B>_<precision> (bench_ddp's keys), ddp.<key>.gpus<N>.<tag>_step_ms, ..._step_ms_min,
..._images_per_s (gpt2: ..._tokens_per_s), ..._loss_step1, ..._loss_step<warm-up steps> and ..._compile_s (the first
step's wall time, compilation included, not counted in the step times), <tag> being torch for mlp and resnet in eager
(the names this peer always printed) and torch_<mode> for the others; gpt2 adds ..._peak_bytes (the largest over the
ranks of torch.cuda.max_memory_allocated, from after the first step to the end) and ..._optimizer_state_bytes (the
largest over the ranks of the bytes of the optimizer's state tensors: with --zero the shard a rank holds), and its tag
is torch_<mode>, torch_zero_<mode> with --zero, torch_fsdp_<mode> with --fsdp, torch_bf16hook_<mode> with --bf16-hook. Then ddp.<key>.gpus<N>.<best>_mode
(the mode with the least step time), <best>_step_ms and <best>_images_per_s (gpt2: _tokens_per_s and _peak_bytes),
<best> being torch_best, torch_zero_best, torch_fsdp_best or torch_bf16hook_best.

    python3 bench/peers/ddp.py [--model mlp|resnet|gpt2] [--precision f32|bf16] [--gpus N] [--port P] [--tf32]
                               [--modes eager,graph,compile_graph,autotune_graph,compile]
                               [--batch B] [--seq T] [--layers L] [--zero | --fsdp | --bf16-hook]
                               [--bucket-mb M]

Mode i uses ports P + 100 i. torch is imported inside the functions, so the file compiles and parses its arguments
without it.
"""
import argparse
import contextlib
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402
from peer_common import Stepper, compile_for, hash32  # noqa: E402

LAYERS, WIDTH, CLASSES, MLP_BATCH, RESNET_BATCH, IMAGE, WARMUP, REPEATS = 8, 1024, 10, 256, 128, 32, 10, 5
DDP_GRAPH_WARMUP = 11   # DDP iterations before a capture, as PyTorch's CUDA Graphs notes ask
GPT2_VOCAB, GPT2_WIDTH, GPT2_HEADS, GPT2_SEQ = 50304, 768, 12, 1024


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


def gpt2_config(a):
    """What bench/peers/gpt2.py's make_model reads: GPT-2 124M with --layers and --seq, no checkpointing."""
    return argparse.Namespace(width=GPT2_WIDTH, heads=GPT2_HEADS, layers=a.layers, vocab=GPT2_VOCAB, seq=a.seq,
                              checkpoint="none")


def gpt2_setup(torch, rank, dev, a):
    """The model (the same draws on every rank; DDP broadcasts rank 0's anyway), rank k's tokens, and the names of
    the parameters AdamW decays (two or more dims, taken before any wrapper flattens them)."""
    import gpt2
    torch.manual_seed(0)
    net = gpt2.make_model(torch, gpt2_config(a), dev)
    n = a.batch * a.seq
    idx = torch.arange(rank * n, (rank + 1) * n, dtype=torch.int64, device=dev)
    x, y = ((hash32(s, idx) % GPT2_VOCAB).view(a.batch, a.seq) for s in (1, 2))
    decay = {name for name, p in net.named_parameters() if p.dim() >= 2}
    return net, x, y, decay


def plain_name(name):
    """A parameter's name without the prefixes DDP and FSDP add."""
    for prefix in ("_fsdp_wrapped_module.", "module."):
        name = name.replace(prefix, "")
    return name


def gpt2_optimizer(torch, model, decay, a, graphed):
    """nanoGPT's AdamW groups over the wrapped model's parameters; fused (and capturable for a capture); under --zero
    inside ZeroRedundancyOptimizer, without fused if the installed torch refuses it there."""
    named = [(plain_name(n), p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": 0.1},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    kw = {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "fused": True, "capturable": graphed}
    if not a.zero:
        return torch.optim.AdamW(groups, **kw)
    from torch.distributed.optim import ZeroRedundancyOptimizer
    try:
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)
    except (TypeError, ValueError, RuntimeError) as e:
        print(f"# ddp.py: ZeroRedundancyOptimizer(AdamW, fused=True) refused ({type(e).__name__}: {e}): not fused")
        kw.pop("fused")
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)


def state_bytes(torch, opt):
    """Bytes of the optimizer's state tensors on this rank (ZeroRedundancyOptimizer: its local optimizer's shard)."""
    inner = getattr(opt, "optim", opt)
    return sum(t.numel() * t.element_size() for st in inner.state.values() for t in st.values()
               if torch.is_tensor(t))


def wrap(torch, net, rank, a, mode):
    """The data-parallel module: DDP as before for mlp and resnet; for gpt2 DDP with 25 MB buckets and the gradients
    as views of them (static_graph where nothing compiles it), or FSDP(SHARD_GRAD_OP) with --fsdp."""
    if a.model != "gpt2":
        return torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    if a.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={type(net.h[0])})
        return FSDP(net, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, auto_wrap_policy=policy,
                    device_id=rank, use_orig_params=True)
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank], bucket_cap_mb=a.bucket_mb,
                                                    gradient_as_bucket_view=True,
                                                    static_graph=mode not in peer_common.COMPILE_MODES)
    if a.bf16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return ddp


def worker(rank, world, a, mode, port, results):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    graphed = peer_common.captures(mode)
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
    decay = None
    if a.model == "gpt2":
        net, x, y, decay = gpt2_setup(torch, rank, dev, a)
    elif a.model == "resnet":
        net, x, y, opt_extra = resnet_setup(torch, rank, dev, bf16)
    else:
        net, x, y, opt_extra = mlp_setup(torch, rank, dev)
    # The same notes: for a capture, DDP is constructed on the side stream the warm-up and capture then use.
    side = torch.cuda.Stream() if graphed else None
    with torch.cuda.stream(side) if graphed else contextlib.nullcontext():
        model = wrap(torch, net, rank, a, mode)
    # torch.compile of the DDP module, as PyTorch's DDP + compile docs do (its DDPOptimizer splits the compiled
    # graph at the bucket boundaries so that the all-reduces overlap the backward pass); the loss stays outside
    # (GPT-2's model computes its own loss, as gpt2.py's does)
    fwd = compile_for(torch, model, mode)
    if a.model == "gpt2":
        opt = gpt2_optimizer(torch, model, decay, a, graphed)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True, **opt_extra)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def body():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = fwd(x, y) if a.model == "gpt2" else loss_fn(fwd(x), y)
        loss.backward()
        if a.model == "gpt2":
            if a.fsdp:
                model.clip_grad_norm_(1.0)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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

    def largest(v):
        t = torch.tensor([v], dtype=torch.int64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    # The notes ask for at least 11 DDP iterations before a capture (DDP_GRAPH_WARMUP, on the side stream): the graph
    # modes warm up for those, the capture and one replay (12 steps), eager and compile for WARMUP as before.
    warmup = DDP_GRAPH_WARMUP + 1 if graphed else WARMUP
    compile_s, first = step.warm_up(mode, warmup, dev, read_loss=mean_loss, side_warmup=DDP_GRAPH_WARMUP, side=side)
    warm = mean_loss()
    t = time.perf_counter()
    steps(10)
    est = (time.perf_counter() - t) / 10
    n = max(5, int({"resnet": 0.2, "gpt2": 0.5}.get(a.model, 0.1) / max(est, 1e-6)))
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        steps(n)
        times.append((time.perf_counter() - t) / n)
    times.sort()
    peak = state = 0
    if a.model == "gpt2":   # collectives: every rank takes part
        peak, state = largest(torch.cuda.max_memory_allocated(dev)), largest(state_bytes(torch, opt))
    if rank == 0:
        med, p = times[REPEATS // 2], f"ddp.{key(a)}.gpus{world}.{tag(a, mode)}"
        print(f"{p}_compile_s {compile_s:.3f} s")
        print(f"{p}_loss_step1 {first:.6f} loss")
        print(f"{p}_loss_step{warmup} {warm:.6f} loss")
        print(f"{p}_step_ms {med * 1e3:.4f} ms")
        print(f"{p}_step_ms_min {times[0] * 1e3:.4f} ms")
        print(f"{p}_{unit(a)}_per_s {world * batch_of(a) / med:.1f} {unit(a)}/s")
        if a.model == "gpt2":
            print(f"{p}_peak_bytes {peak} bytes")
            print(f"{p}_optimizer_state_bytes {state} bytes")
        sys.stdout.flush()
        results.put((med, peak))
    # Destroying the process group after a captured GPT-2 step hung at exit on two H100s (the figures were out, the
    # run timed out): wait for the GPU, then end the process without tearing the communicator down.
    torch.cuda.synchronize(dev)
    sys.stdout.flush()
    os._exit(0)


def variant(a):
    """The figures' prefix after torch_: "" for DDP, "zero_" for ZeroRedundancyOptimizer, "fsdp_" for FSDP,
    "bf16hook_" for DDP averaging in bf16."""
    return "zero_" if a.zero else "fsdp_" if a.fsdp else "bf16hook_" if a.bf16_hook else ""


def tag(a, mode):
    """mlp and resnet in eager keep the names this peer always printed (torch_step_ms, ...); the others are
    torch_<mode>_, and for gpt2 torch_zero_<mode>_ or torch_fsdp_<mode>_ under --zero or --fsdp."""
    if a.model != "gpt2" and mode == "eager":
        return "torch"
    return f"torch_{variant(a)}{mode}"


def run_mode(a, mode, port):
    """One mode in processes of its own (a clean slate: a new process group, model and compiler): rank 0's step time
    in seconds and peak bytes, as the dict run_modes wants; raises when a rank failed or printed nothing."""
    import torch.multiprocessing as mp
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(a.gpus, a, mode, port, results), nprocs=a.gpus, join=True)
    if results.empty():
        raise RuntimeError("rank 0 reported no step time")
    med, peak = results.get()
    return {"time": med, "peak": peak}


def key(a):
    """bench_ddp's key for the same run."""
    if a.model == "mlp":
        return "mid"
    if a.model == "resnet":
        return f"resnet_{a.precision}"
    model = "124m" if (a.layers, a.seq) == (12, GPT2_SEQ) else f"l{a.layers}_t{a.seq}"
    return f"gpt2_{model}_b{a.batch}_{a.precision}"


def batch_of(a):
    """Images per GPU a step, or for gpt2 tokens."""
    return {"resnet": RESNET_BATCH, "mlp": MLP_BATCH}.get(a.model, a.batch * a.seq)


def unit(a):
    return "tokens" if a.model == "gpt2" else "images"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("mlp", "resnet", "gpt2"), default="mlp")
    ap.add_argument("--precision", choices=("f32", "bf16"), default=None,
                    help="bf16: resnet or gpt2 (default: f32; gpt2: bf16)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--tf32", action="store_true", help="let f32 matmuls and convolutions use TF32")
    ap.add_argument("--modes", default=",".join(peer_common.MODES), help=peer_common.MODES_HELP)
    ap.add_argument("--batch", type=int, default=None, help="gpt2: sequences per GPU (default: 16)")
    ap.add_argument("--seq", type=int, default=None, help=f"gpt2: sequence length, 1 to {GPT2_SEQ} (default: 1024)")
    ap.add_argument("--layers", type=int, default=None, help="gpt2: blocks (default: 12)")
    shard = ap.add_mutually_exclusive_group()
    shard.add_argument("--zero", action="store_true", help="gpt2: ZeroRedundancyOptimizer(AdamW) around DDP")
    shard.add_argument("--fsdp", action="store_true", help="gpt2: FSDP(SHARD_GRAD_OP) instead of DDP")
    shard.add_argument("--bf16-hook", action="store_true",
                       help="gpt2: DDP's bf16_compress_hook (the gradients averaged in bf16)")
    ap.add_argument("--bucket-mb", type=int, default=None, help="gpt2: DDP's bucket_cap_mb (default: 25)")
    a = ap.parse_args(argv)
    a.modes = peer_common.parse_modes(ap, a.modes)
    gpt2_only = [o for o, v in (("--batch", a.batch), ("--seq", a.seq), ("--layers", a.layers), ("--zero", a.zero),
                                ("--fsdp", a.fsdp), ("--bf16-hook", a.bf16_hook), ("--bucket-mb", a.bucket_mb))
                 if v]
    if a.model != "gpt2" and gpt2_only:
        ap.error(f"{', '.join(gpt2_only)}: for --model gpt2")
    a.precision = a.precision or ("bf16" if a.model == "gpt2" else "f32")
    a.batch, a.seq, a.layers = a.batch or 16, a.seq or GPT2_SEQ, a.layers or 12
    if a.bucket_mb is not None and (a.bucket_mb < 1 or a.fsdp):
        ap.error("--bucket-mb: DDP's bucket size in MB, at least 1 (not with --fsdp)")
    if a.bf16_hook and a.precision != "bf16":
        ap.error("--bf16-hook averages bf16 gradients: with --precision bf16")
    a.bucket_mb = a.bucket_mb or 25
    if a.precision == "bf16" and a.model == "mlp":
        ap.error("--precision bf16 is for --model resnet or gpt2")
    if a.gpus < 1:
        ap.error("--gpus must be at least 1")
    if a.batch < 1 or not 1 <= a.seq <= GPT2_SEQ or not 1 <= a.layers <= 64:
        ap.error(f"--batch >= 1, --seq in 1..{GPT2_SEQ}, --layers in 1..64")
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
    how = (" (ZeroRedundancyOptimizer)" if a.zero else " (FSDP SHARD_GRAD_OP)" if a.fsdp
           else " (DDP, bf16_compress_hook)" if a.bf16_hook else "")
    how += f", buckets of {a.bucket_mb} MB" if a.model == "gpt2" and not a.fsdp else ""
    print(f"# ddp.py: torch {torch.__version__}, {label}{how}: modes {', '.join(a.modes)}", flush=True)
    # each mode on ports of its own (a.port + 100 i), so that one never waits for the last one's to be released
    ports = {mode: a.port + 100 * i for i, mode in enumerate(a.modes)}
    best = peer_common.run_modes(label, a.modes, lambda mode: run_mode(a, mode, ports[mode]))
    if best is None:
        return 1
    mode, fig = best
    b = f"{label}.torch_{variant(a)}best"
    print(f"{b}_mode {mode} mode")
    print(f"{b}_step_ms {fig['time'] * 1e3:.4f} ms")
    print(f"{b}_{unit(a)}_per_s {a.gpus * batch_of(a) / fig['time']:.1f} {unit(a)}/s")
    if a.model == "gpt2":
        print(f"{b}_peak_bytes {fig['peak']} bytes")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
