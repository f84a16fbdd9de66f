"""Peer of bench_attention: causal scaled dot-product attention over [B, H, T, D] (GPT-2 124M's attention by default:
B 16, H 12, T 1024, D 64, bf16), forward alone and forward with backward, through each of PyTorch's fused SDPA
back ends that runs: FlashAttention-2 (flash), cuDNN's fused attention through its graph API (cudnn) and the
memory-efficient kernel (efficient). These are the candidates issue 28 names for deft's attention (cuDNN's, or
deft's own kernel, chosen by measurement); bench_attention prints the same names with deft_ in place of torch_.

Figures (median of --repeats repeats of N calls timed with device events, N calibrated to about 0.2 s):
attention.<key>.torch_<backend>_fwd_us and _fwdbwd_us, _fwd_tflops and _fwdbwd_tflops with the causal FLOP count
(forward 2 products of B H T^2 D / 2 multiply-adds each; backward 2.5 x that, FlashAttention's convention)."""
import argparse
import sys

from peer_common import Timer, open_device


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    opened = open_device("attention.py", a.device, "run it on a GPU host")
    if opened is None:
        return 0
    torch, device, cuda = opened
    if not cuda:
        print("attention.py: skipped: the fused back ends need a CUDA device")
        return 0
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    b, h, t, d = a.batch, a.heads, a.seq, a.head_dim
    key = f"b{b}_h{h}_t{t}_d{d}_{a.dtype}"
    gen = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dt, generator=gen, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, h, t, d, device=device, dtype=dt, generator=gen)
    fwd_flops = 2 * 2 * b * h * t * t * d / 2
    timer = Timer(torch, True)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for name, backend in backends.items():
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwdbwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), dout)

        try:
            with sdpa_kernel([backend]):
                for label, fn, flops in (("fwd", fwd, fwd_flops), ("fwdbwd", fwdbwd, 3.5 * fwd_flops)):
                    for _ in range(3):
                        fn()
                    per = timer.seconds(fn, 5) / 5
                    n = max(1, int(0.2 / max(per, 1e-7)))
                    us = sorted(timer.seconds(fn, n) / n * 1e6 for _ in range(a.repeats))[a.repeats // 2]
                    print(f"attention.{key}.torch_{name}_{label}_us {us:.1f} us")
                    print(f"attention.{key}.torch_{name}_{label}_tflops {flops / us / 1e6:.1f} TFLOP/s")
        except RuntimeError as e:
            print(f"# attention.{key}: torch_{name} failed: {str(e).splitlines()[0]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
