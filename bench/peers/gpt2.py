#!/usr/bin/env python3
"""The PyTorch peer of bench/bench_gpt2.c: one GPT-2 training step (the model of examples/gpt2.h, nanoGPT style) timed
in each of PyTorch's fast modes, on the same random tokens, printing one figure per line as `<name> <value> <unit>`
with "torch_<mode>_" where the C bench prints "deft_", then PyTorch's best.

    python3 bench/peers/gpt2.py [--batch B] [--seq T] [--layers L] [--width C] [--heads H] [--vocab V]
        [--steps N] [--warmup W] [--repeats R] [--device cuda:N|cpu] [--autocast bf16|f32] [--peak-tflops P]
        [--modes eager,graph,compile_graph,autotune_graph] [--checkpoint none|block|budget] [--memory-budget B]
        [--profile N]

The model: nn.Embedding token and position tables, pre-norm blocks (nn.LayerNorm, causal self-attention through
F.scaled_dot_product_attention(is_causal=True), residual, nn.LayerNorm, MLP with GELU's tanh form, residual), a final
nn.LayerNorm and an LM head tied to the token table; Linear layers with biases; GPT-2's initialisation (normal 0.02,
the residual projections 0.02 / sqrt(2 L), zero biases). AdamW (fused=True; lr 6e-4, betas 0.9 and 0.95, eps 1e-8,
weight decay 0.1 on the parameters of two or more dims and none on the others, nanoGPT's groups),
clip_grad_norm_(1.0), bf16 autocast around forward and loss. The tokens: x[i] = hash32(1, k B T + i) mod V and
y[i] = hash32(2, k B T + i) mod V for batch k of FEED_BATCHES kept in pinned host memory (bench_util.h's hash, the C
bench's batches); each step copies the next one into the model's input buffers (non_blocking) and trains on it.

The modes, each in a clean slate (a new model and optimizer, the allocator's cache emptied, torch._dynamo reset
for the compiled ones; peer_common.py's Stepper, compile_for and run_modes, shared by every peer), run in the order
given and printed as each finishes, so that a run cut short still says something:
  eager           zero_grad(set_to_none=True), forward, loss, backward, clip, step: each op launched from Python.
  graph           the same step captured whole in one torch.cuda.CUDAGraph (the PyTorch docs' "whole network
                  capture": 3 warm-up steps on a side stream, static inputs, AdamW(capturable=True)); a step is the
                  batch's copy and one replay.
  compile_graph   the model under torch.compile (mode "default"), its forward and backward warmed up (compiled) on
                  the side stream, then the whole step captured as in graph.
  autotune_graph  the same with torch.compile(mode="max-autotune-no-cudagraphs").
torch_<mode>_compile_s is the wall time of the first warm-up step (compilation included; for eager and graph, that
first step's time): it is not counted in the step times.

Timing (peer_common.py's, as every peer): --warmup steps, then N steps a repeat (--steps, or CALIBRATE steps choose
N so that a repeat takes about TARGET_REPEAT_S) between two CUDA events, --repeats repeats, the median. Figures per
mode: step_ms (and its min and max), tokens_per_s = B T / step, tflops and mfu (nanoGPT's estimate_mfu:
6 N + 12 L H Q T FLOPs a token, N the parameters less the position table; --peak-tflops, default 989: the H100's
dense bf16), peak_bytes = torch.cuda.max_memory_allocated and peak_reserved_bytes = max_memory_reserved, both from
after the first warm-up step (so compilation's and autotuning's scratch is not counted) to the end, and the losses.
Then torch_best_*: the mode with the least step time, its figures, and its name in a comment line and as
`torch_best_mode <name> mode`. A mode that fails says why in a `# ...` line and the next one runs.

--profile N runs N more steps of each mode under torch.profiler after its timing (the profiler's overhead stays out of
the figures) and prints each kernel's device time a step, the largest first, as `# ...` lines, and their sum as
torch_<mode>_profile_kernel_us: what PyTorch's step consists of, beside deft's trace (scripts/trace_summary.py).

Activation checkpointing (issue 29's checkpointing item, beside bench_gpt2 --activation-fraction;
scripts/bench_gpt2_checkpoint.sh runs the curve), one point a run:
  --checkpoint none     (the default) every activation kept, the figures' key as always.
  --checkpoint block    each transformer block's forward wrapped in torch.utils.checkpoint.checkpoint(block, h,
                        use_reentrant=False, preserve_rng_state=False: nothing draws random numbers, so no RNG
                        state is saved, in a capture or out of it), in every mode: a block keeps only its input and is
                        recomputed in the backward pass. The key gets "_ckblock".
  --checkpoint budget   torch._functorch.config.activation_memory_budget = --memory-budget B (0 <= B <= 1: the
                        fraction of the activation memory the compiled graph may keep; the min-cut partitioner
                        recomputes the rest) before compiling. It only acts under torch.compile: eager and graph are
                        skipped with a `# ...` note. The key gets "_mb<B>", B to two decimals with a "p" for the
                        point (0.3: "_mb0p30", as bench_gpt2 --activation-fraction 1/3 gives "_af0p33"), and
                        gpt2.<key>.torch_activation_memory_budget B fraction is printed.

On the CPU (--device cpu) only eager runs, timed with a host clock. Without PyTorch or a usable GPU the script says it
skipped and exits 0. torch is imported inside main(), so the file compiles and imports without it.
"""
import argparse
import importlib
import math
import sys

import peer_common
from peer_common import MODES, Timer, fresh, hash32

FEED_BATCHES = 4
CALIBRATE = 5
TARGET_REPEAT_S = 1.0


def make_model(torch, a, device):
    nn, F = torch.nn, torch.nn.functional
    C, H, L = a.width, a.heads, a.layers
    checkpoint = importlib.import_module("torch.utils.checkpoint").checkpoint if a.checkpoint == "block" else None

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(a.vocab, C), nn.Embedding(a.seq, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, a.vocab, bias=False)
            self.lm_head.weight = self.wte.weight   # tied
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    proj = name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight")
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if proj else 0.02)

        def forward(self, x, y):
            pos = torch.arange(x.shape[1], device=x.device)
            h = self.wte(x) + self.wpe(pos)
            for block in self.h:
                h = checkpoint(block, h, use_reentrant=False, preserve_rng_state=False) if checkpoint else block(h)
            logits = self.lm_head(self.ln_f(h))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    return GPT().to(device)


def make_optimizer(torch, model, cuda, capturable):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True, "capturable": capturable} if cuda else {}
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **extra)


def make_batches(torch, a, cuda):
    """FEED_BATCHES batches of (x, y) int64 tokens in host memory (pinned on CUDA), bench_gpt2's values."""
    n = a.batch * a.seq
    out = []
    for k in range(FEED_BATCHES):
        idx = torch.arange(k * n, (k + 1) * n, dtype=torch.int64)
        x, y = (hash32(s, idx) % a.vocab for s in (1, 2))
        x, y = x.view(a.batch, a.seq), y.view(a.batch, a.seq)
        out.append((x.pin_memory(), y.pin_memory()) if cuda else (x, y))
    return out


def flops_per_token(a, params):
    return 6.0 * (params - a.seq * a.width) + 12.0 * a.layers * a.heads * (a.width // a.heads) * a.seq


class Run:
    """One mode's model, optimizer, static inputs and step (peer_common.Stepper: eager, or captured and replayed)."""

    def __init__(self, torch, a, mode, device, cuda):
        self.torch, self.a = torch, a
        self.model = make_model(torch, a, device)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.fwd = peer_common.compile_for(torch, self.model, mode)
        self.opt = make_optimizer(torch, self.model, cuda, capturable=peer_common.captures(mode))
        self.batches = make_batches(torch, a, cuda)
        self.x = torch.empty(a.batch, a.seq, dtype=torch.int64, device=device)
        self.y = torch.empty_like(self.x)
        self.next = 0
        dtype = torch.bfloat16 if a.autocast == "bf16" else None
        self.autocast = (lambda: torch.autocast(device_type=device.type, dtype=dtype)) if dtype else None
        self.step = peer_common.Stepper(torch, self.body, self.feed)

    def feed(self):
        x, y = self.batches[self.next % FEED_BATCHES]
        self.next += 1
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)

    def body(self):
        """Forward, loss, backward, clipping and the update (grads set to None first, as the capture needs)."""
        self.opt.zero_grad(set_to_none=True)
        if self.autocast:
            with self.autocast():
                loss = self.fwd(self.x, self.y)
        else:
            loss = self.fwd(self.x, self.y)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss


def run_mode(torch, a, mode, device, cuda, key):
    left = fresh(torch, cuda)
    r = Run(torch, a, mode, device, cuda)
    compile_s, first = r.step.warm_up(mode, a.warmup, device)
    timer = Timer(torch, cuda)
    if a.steps:
        n = a.steps
        us = sorted(timer.seconds(r.step, n) / n * 1e6 for _ in range(a.repeats))
        loss = r.step.loss.item()
    else:
        us, n, loss = peer_common.measure(timer, r.step, lambda: r.step.loss.item(), CALIBRATE, a.repeats,
                                          TARGET_REPEAT_S)
    ms = [u / 1e3 for u in us]
    med = ms[len(ms) // 2]
    tps = a.batch * a.seq / (med * 1e-3)
    fpt = flops_per_token(a, r.params)
    fig = {"time": med, "step_ms": med, "tokens_per_s": tps, "peak_bytes": None, "peak_reserved_bytes": None}
    if cuda:
        fig["peak_bytes"] = torch.cuda.max_memory_allocated(device) - left
        fig["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    tag = f"gpt2.{key}.torch_{mode}"
    print(f"{tag}_compile_s {compile_s:.3f} s")
    print(f"{tag}_step_ms {med:.3f} ms")
    print(f"{tag}_step_ms_min {ms[0]:.3f} ms")
    print(f"{tag}_step_ms_max {ms[-1]:.3f} ms")
    print(f"{tag}_steps_per_repeat {n} count")
    print(f"{tag}_tokens_per_s {tps:.1f} tokens/s")
    print(f"{tag}_tflops {fpt * tps / 1e12:.3f} TFLOP/s")
    print(f"{tag}_mfu {100.0 * fpt * tps / (a.peak_tflops * 1e12):.2f} %")
    if cuda:
        print(f"{tag}_peak_bytes {fig['peak_bytes']} bytes")
        print(f"{tag}_peak_reserved_bytes {fig['peak_reserved_bytes']} bytes")
    print(f"{tag}_loss_first {first:.6f} loss")
    print(f"{tag}_loss {loss:.6f} loss")
    if cuda and a.profile:
        profile_steps(torch, a.profile, r.step, tag)
    sys.stdout.flush()
    del r
    return fig


def profile_steps(torch, n, step, tag, top=25):
    """Where the step's device time goes: torch.profiler's CUDA activity over n more steps (a replayed graph's kernels
    included), each kernel's device time a step, the largest first as `# ...` lines, and their sum as
    <tag>_profile_kernel_us (compare with scripts/trace_summary.py over deft's trace)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            rows.append((us / n, e.count / n, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    for us, count, name in rows[:top]:
        print(f"# {tag} profile: {us:9.1f} us a step {100.0 * us / total if total else 0.0:5.1f}% {count:6.1f}x "
              f"{name[:110]}")
    print(f"{tag}_profile_kernel_us {total:.1f} us")


def key_of(a):
    model = "124m" if (a.layers, a.width, a.heads, a.seq, a.vocab) == (12, 768, 12, 1024, 50304) else \
        f"l{a.layers}_c{a.width}_h{a.heads}_t{a.seq}_v{a.vocab}"
    # B to two decimals with a "p" for the point (0.3: "_mb0p30"), as bench_gpt2's "_af0p33": a dot would split the
    # key out of gpt2.<key>.<figure>
    point = {"none": "", "block": "_ckblock",
             "budget": f"_mb{a.memory_budget or 0:.2f}".replace(".", "p")}[a.checkpoint]
    return f"{model}_b{a.batch}_{a.autocast}{point}"


def checkpoint_modes(a, modes, key):
    """The modes a checkpointing point runs in: all for none and block; for budget only the compiled ones (the
    activation memory budget is the partitioner's, which eager and graph never reach), the others said skipped.
    Sets the budget in torch._functorch.config, read when a mode compiles."""
    if a.checkpoint != "budget":
        return modes
    importlib.import_module("torch._functorch.config").activation_memory_budget = a.memory_budget
    print(f"gpt2.{key}.torch_activation_memory_budget {a.memory_budget:.6f} fraction")
    kept = [m for m in modes if m in peer_common.COMPILE_MODES]
    skipped = [m for m in modes if m not in kept]
    if skipped:
        print(f"# gpt2.{key}: {', '.join(skipped)} skipped: the activation memory budget only acts under "
              f"torch.compile")
    return kept


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16, help="sequences a step (default: 16)")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length (default: 1024)")
    ap.add_argument("--layers", type=int, default=12, help="blocks (default: 12)")
    ap.add_argument("--width", type=int, default=768, help="model width (default: 768)")
    ap.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    ap.add_argument("--vocab", type=int, default=50304, help="vocabulary (default: 50304)")
    ap.add_argument("--steps", type=int, default=0, help="timed steps a repeat (default: about 1 s of them)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first (default: 20)")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats, the median reported (default: 7)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: eager only)")
    ap.add_argument("--autocast", choices=("bf16", "f32"), default="bf16", help="mixed precision (default: bf16)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense peak for MFU (default: 989, H100 bf16)")
    ap.add_argument("--modes", default=",".join(MODES), help=peer_common.MODES_HELP)
    ap.add_argument("--checkpoint", choices=("none", "block", "budget"), default="none",
                    help="activation checkpointing: none; block (torch.utils.checkpoint around each block, every "
                         "mode); budget (torch._functorch.config.activation_memory_budget = --memory-budget, the "
                         "compile modes only) (default: none)")
    ap.add_argument("--memory-budget", type=float, default=None, metavar="B",
                    help="with --checkpoint budget: the activation memory budget, 0 <= B <= 1")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each mode's timing, N more steps under torch.profiler: each kernel's device time a "
                         "step, the largest first (default: 0, none)")
    a = ap.parse_args(argv)
    modes = peer_common.parse_modes(ap, a.modes)
    if min(a.batch, a.seq, a.layers, a.width, a.heads, a.vocab, a.warmup, a.repeats) < 1 \
            or a.steps < 0 or a.profile < 0 or a.width % a.heads or a.peak_tflops <= 0:
        ap.error("bad options (sizes >= 1; heads must divide width)")
    if (a.checkpoint == "budget") != (a.memory_budget is not None):
        ap.error("--memory-budget goes with --checkpoint budget, and --checkpoint budget needs it")
    if a.memory_budget is not None and not 0.0 <= a.memory_budget <= 1.0:
        ap.error(f"--memory-budget {a.memory_budget}: want 0 <= B <= 1")

    opened = peer_common.open_device("gpt2.py", a.device, "--device cpu runs eager on the CPU")
    if opened is None:
        return 0
    torch, device, cuda = opened
    torch.manual_seed(0)
    if not cuda:
        modes = [m for m in modes if m == "eager"]
    key = key_of(a)
    where = f"{device} ({torch.cuda.get_device_name(device)})" if cuda else "cpu"
    ckpt = ("" if a.checkpoint == "none" else "; torch.utils.checkpoint per block" if a.checkpoint == "block"
            else f"; activation memory budget {a.memory_budget:g}")
    print(f"# gpt2.py: torch {torch.__version__} on {where}: {a.layers} layers, width {a.width}, {a.heads} heads, "
          f"T {a.seq}, vocab {a.vocab}, batch {a.batch}, {a.autocast}{ckpt}; modes {', '.join(modes)}")
    modes = checkpoint_modes(a, modes, key)
    sys.stdout.flush()
    if not modes:
        print(f"# gpt2.{key}: skipped: no mode left to run (--checkpoint budget needs compile_graph or "
              f"autotune_graph, on a GPU)")
        return 0

    best = peer_common.run_modes(f"gpt2.{key}", modes, lambda mode: run_mode(torch, a, mode, device, cuda, key))
    if best is None:
        return 1
    mode, fig = best
    print(f"gpt2.{key}.torch_best_mode {mode} mode")
    print(f"gpt2.{key}.torch_best_step_ms {fig['step_ms']:.3f} ms")
    print(f"gpt2.{key}.torch_best_tokens_per_s {fig['tokens_per_s']:.1f} tokens/s")
    if cuda:
        print(f"gpt2.{key}.torch_best_peak_bytes {fig['peak_bytes']} bytes")
        print(f"gpt2.{key}.torch_best_peak_reserved_bytes {fig['peak_reserved_bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
