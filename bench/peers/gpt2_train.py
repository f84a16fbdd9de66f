#!/usr/bin/env python3
"""The peer of examples/gpt2_train in PyTorch: the same GPT-2 (the model of examples/gpt2.h), started from the
weights deft wrote (`gpt2_train --init-out FILE`), trained on the same batches in the same order (`--no-shuffle`:
window w is tokens [w T, w T + T + 1), batch i the windows [i B, (i + 1) B), epochs repeating, the windows left over
dropped), with the same AdamW (betas 0.9 and 0.95, eps 1e-8, decay on the 2-D weights only, fused), warmup and
cosine learning rate, clipping and bf16 autocast; prints the loss every --log-every steps and the validation loss
(the first --val-batches batches of the validation shards in stream order) at the end, in gpt2_train's words, so
that the two curves can be set side by side.

    python3 bench/peers/gpt2_train.py --init FILE --train SHARD --val SHARD [--layers L --width C --heads H
        --seq T --vocab V --batch B --steps N --lr LR --warmup W --min-lr-frac F --weight-decay WD --clip NORM]
"""
import argparse
import array
import math
import struct
import sys


def read_shard(path):
    """llm.c's format: 256 int32 (magic 20240520, version 1, count), then count uint16 tokens."""
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        if head[0] != 20240520 or head[1] != 1:
            sys.exit("%s: not a token shard" % path)
        tokens = array.array("H")
        tokens.frombytes(f.read(2 * head[2]))
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens


def read_init(path, torch):
    """tests/reference/gpt2_reference.py's format: b"DEFTREF1", a count, (name, dtype, dims, f32 values) each."""
    params = {}
    with open(path, "rb") as f:
        if f.read(8) != b"DEFTREF1":
            sys.exit("%s: not a DEFTREF1 file" % path)
        (n,) = struct.unpack("<i", f.read(4))
        for _ in range(n):
            (ln,) = struct.unpack("<i", f.read(4))
            name = f.read(ln).decode()
            dt, nd = struct.unpack("<ii", f.read(8))
            dims = struct.unpack("<%dq" % nd, f.read(8 * nd))
            count = 1
            for d in dims:
                count *= d
            values = array.array("f")
            values.frombytes(f.read(4 * count))
            t = torch.tensor(values.tolist(), dtype=torch.float32).view(*dims)
            params[name[len("param/"):]] = t
    return params


def forward(p, x, y, cfg, F):
    b, t = x.shape
    width, heads = cfg.width, cfg.heads
    h = p["wte"][x] + p["wpe"][:t]
    for i in range(cfg.layers):
        pre = "h%d." % i
        a = F.layer_norm(h, (width,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5)
        qkv = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = (z.view(b, t, heads, width // heads).transpose(1, 2) for z in qkv.split(width, dim=2))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, width)
        h = h + att @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        m = F.layer_norm(h, (width,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (width,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = h @ p["wte"].t()
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    span = a.steps - a.warmup
    t = min((step - a.warmup) / span, 1.0) if span > 0 else 1.0
    lo = a.lr * a.min_lr_frac
    return lo + 0.5 * (a.lr - lo) * (1 + math.cos(math.pi * t))


def batch(tokens, index, a, torch, dev):
    """Batch `index` of the stream-order windows, epochs repeating."""
    windows = (len(tokens) - 1) // a.seq
    per_epoch = windows // a.batch
    i = index % per_epoch
    rows = [tokens[(i * a.batch + r) * a.seq:(i * a.batch + r) * a.seq + a.seq + 1] for r in range(a.batch)]
    t = torch.tensor([list(r) for r in rows], dtype=torch.int64, device=dev)
    return t[:, :-1], t[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    for name, default in (("layers", 4), ("width", 128), ("heads", 4), ("seq", 128), ("vocab", 256), ("batch", 8),
                          ("steps", 200), ("warmup", -1), ("log-every", 10), ("val-batches", 8)):
        ap.add_argument("--" + name, type=int, default=default)
    for name, default in (("lr", 1e-3), ("min-lr-frac", 0.1), ("weight-decay", 0.1), ("clip", 1.0)):
        ap.add_argument("--" + name, type=float, default=default)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--autocast", default="bf16", choices=("bf16", "none"))
    a = ap.parse_args()
    if a.warmup < 0:
        a.warmup = a.steps // 10
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("gpt2_train.py: skipped: PyTorch is not installed")
        return
    dev = torch.device(a.device)
    p = {k: v.to(dev).requires_grad_() for k, v in read_init(a.init, torch).items()}
    train, val = read_shard(a.train), read_shard(a.val)
    decay = [v for v in p.values() if v.dim() >= 2]
    rest = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16")
    print("gpt2_train.py: %d layers, width %d, %d heads, seq %d, vocab %d on %s (%s)" %
          (a.layers, a.width, a.heads, a.seq, a.vocab, dev, a.autocast))
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        x, y = batch(train, step, a, torch, dev)
        with amp:
            loss = forward(p, x, y, a, F)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            print("step %d/%d  loss %.4f  lr %.3g" % (step + 1, a.steps, loss.item(), lr_at(a, step)))
    per = a.batch * a.seq
    k = min(a.val_batches, (len(val) - 1) // per)
    total = 0.0
    with torch.no_grad(), amp:
        for b in range(k):
            x, y = batch(val, b, a, torch, dev)
            total += forward(p, x, y, a, F).item()
    print("validation loss %.4f" % (total / k if k else float("nan")))


if __name__ == "__main__":
    main()
