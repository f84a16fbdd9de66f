#!/usr/bin/env python3
"""Writes the GPT-2 reference that tests/test_gpt2_reference.c checks deft against (as llm.c's test_gpt2 does).

A small GPT-2 (nanoGPT's model: learned positions, pre-norm blocks, GELU with the tanh approximation, the LM head
tied to the token table) with fixed weights, one batch: its logits, loss and every gradient; then 10 AdamW steps on
that batch (weight decay on the 2-D weights only, as nanoGPT and llm.c) and their losses. Everything runs in float64
on the CPU, so the file holds the exact answer to f32 precision; deft is then checked against it with per-tensor
tolerances. Regenerate with PyTorch installed:

    python3 tests/reference/gpt2_reference.py tests/reference/gpt2_reference.bin

The file: b"DEFTREF1", an int32 entry count, then per entry an int32 name length, the name, an int32 dtype (0 f32,
1 i32), an int32 ndim, ndim int64 dims and the values (little-endian). Linear weights are stored as deft keeps
them, [in, out] (torch's transposed). Names: config (i32: vocab, seq, width, layers, heads, batch, steps),
adamw (f32: lr, beta1, beta2, eps, weight_decay), x, y, param/<name>, logits, loss, grad/<name>, losses.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

VOCAB, SEQ, WIDTH, LAYERS, HEADS, BATCH, STEPS = 100, 32, 48, 2, 4, 4, 10
LR, BETA1, BETA2, EPS, DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1
DT = torch.float64


def linear(name, n_in, n_out, std, gen):
    return {name + ".weight": torch.randn(n_out, n_in, generator=gen, dtype=DT) * std,
            name + ".bias": torch.randn(n_out, generator=gen, dtype=DT) * 0.02}


def norm(name, gen):
    # Not at 1 and 0, so that a mix-up of weight and bias shows.
    return {name + ".weight": 1 + 0.1 * torch.randn(WIDTH, generator=gen, dtype=DT),
            name + ".bias": 0.1 * torch.randn(WIDTH, generator=gen, dtype=DT)}


def init_params():
    gen = torch.Generator().manual_seed(1234)
    p = {"wte": torch.randn(VOCAB, WIDTH, generator=gen, dtype=DT) * 0.02,
         "wpe": torch.randn(SEQ, WIDTH, generator=gen, dtype=DT) * 0.02}
    proj_std = 0.02 / math.sqrt(2 * LAYERS)
    for i in range(LAYERS):
        h = "h%d." % i
        p.update(norm(h + "ln_1", gen))
        p.update(linear(h + "attn.c_attn", WIDTH, 3 * WIDTH, 0.02, gen))
        p.update(linear(h + "attn.c_proj", WIDTH, WIDTH, proj_std, gen))
        p.update(norm(h + "ln_2", gen))
        p.update(linear(h + "mlp.c_fc", WIDTH, 4 * WIDTH, 0.02, gen))
        p.update(linear(h + "mlp.c_proj", 4 * WIDTH, WIDTH, proj_std, gen))
    p.update(norm("ln_f", gen))
    return {k: v.requires_grad_() for k, v in p.items()}


def forward(p, x, y):
    b, t = x.shape
    h = p["wte"][x] + p["wpe"][torch.arange(t)]
    for i in range(LAYERS):
        pre = "h%d." % i
        a = F.layer_norm(h, (WIDTH,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5)
        qkv = F.linear(a, p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"])
        q, k, v = (z.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for z in qkv.split(WIDTH, dim=2))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = att.transpose(1, 2).reshape(b, t, WIDTH)
        h = h + F.linear(att, p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"])
        m = F.layer_norm(h, (WIDTH,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(m, p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"]), approximate="tanh")
        h = h + F.linear(m, p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"])
    h = F.layer_norm(h, (WIDTH,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = h @ p["wte"].t()
    return logits, F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))


def deft_layout(name, value):
    """deft's linear weights are [in, out]."""
    value = value.detach().clone()   # a copy: the AdamW steps below change the parameters in place
    return value.t().contiguous() if name.endswith(".weight") and value.dim() == 2 and name != "wte" and \
        name != "wpe" else value


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpt2_reference.bin"
    torch.manual_seed(0)
    p = init_params()
    gen = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    entries = [("config", torch.tensor([VOCAB, SEQ, WIDTH, LAYERS, HEADS, BATCH, STEPS], dtype=torch.int32)),
               ("adamw", torch.tensor([LR, BETA1, BETA2, EPS, DECAY], dtype=torch.float32)),
               ("x", x.to(torch.int32)), ("y", y.to(torch.int32))]
    entries += [("param/" + k, deft_layout(k, v)) for k, v in p.items()]
    logits, loss = forward(p, x, y)
    loss.backward()
    entries += [("logits", logits.detach()), ("loss", loss.detach())]
    entries += [("grad/" + k, deft_layout(k, v.grad)) for k, v in p.items()]

    # The 10 steps start from the same weights; the first step's loss is the loss above.
    for v in p.values():
        v.grad = None
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(p, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    entries.append(("losses", torch.tensor(losses, dtype=DT)))

    with open(out, "wb") as f:
        f.write(b"DEFTREF1")
        f.write(struct.pack("<i", len(entries)))
        for name, t in entries:
            is_int = t.dtype == torch.int32
            t = t.contiguous() if is_int else t.to(torch.float32).contiguous()
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)) + raw)
            f.write(struct.pack("<ii", 1 if is_int else 0, t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            values = t.flatten().tolist()
            f.write(struct.pack("<%d%s" % (len(values), "i" if is_int else "f"), *values))
    print("wrote %s: %d entries, loss %.6f, losses %s" % (out, len(entries), losses[0],
                                                           " ".join("%.4f" % v for v in losses)))


if __name__ == "__main__":
    main()
