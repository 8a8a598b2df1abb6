"""castlab's fused reductions against torch.compile at every width users run (issue 49's
fused speed goal), in one run on a GPU.

Cases (bf16): softmax, log_softmax and cross_entropy (random targets) over rows of 1,024,
4,096, 32,000, 50,257 and 151,936; Hugging Face's RMSNorm (x * rsqrt(mean(x^2) + eps),
cast back, times the weight) at hidden 896, 2,048, 3,584, 4,096, 5,120 and 8,192; with
--backward, the forward and the gradient of each timed together (softmax and log_softmax:
of the input given dy; cross_entropy: of the logits; RMSNorm: of x and the weight), since
castlab's ``backward_fn`` recomputes its forward. About 2^26 elements a case
(--elements), as many rows as that makes.

Implementations: castlab ``cl.jit(f)(x)`` (what a user gets by default), castlab
``policy="fused", math="inductor"``, torch.compile(dynamic=False) (its default settings),
torch eager, and a device copy of the bytes the op must move (the anchor). Timing: CUDA
events on each library's stream (bench_cuda.device_ms), the median of five rounds.

    python benchmarks/bench_widths.py [--backward] [--only softmax,rmsnorm] [--json PATH]

Columns: ms, the fraction of the copy's bandwidth, and compile/castlab (> 1: castlab
faster than torch.compile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_backward import _require_gpu  # noqa: E402

WIDTHS = (1024, 4096, 32000, 50257, 151936)
HIDDEN = (896, 2048, 3584, 4096, 5120, 8192)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--backward", action="store_true", help="time the gradients too")
    ap.add_argument("--only", default="", help="comma-separated: softmax, log_softmax, "
                    "cross_entropy, rmsnorm")
    args = ap.parse_args()
    _require_gpu()

    import torch
    import torch.nn.functional as F
    from bench_cuda import device_ms, run_header

    import castlab as cl
    import castlab.cuda as clcuda

    ts, cs, results = run_header("widths benchmark", f"~{args.elements >> 20}M elements a case")
    only = set(filter(None, args.only.split(",")))
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'case':36s} {'impl':24s} {'ms':>9s} {'of copy':>8s} {'compile/cl':>10s}")

    def run(case, nbytes, impls):
        src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        impls = {**impls, "copy (same bytes)": (lambda: dst.copy_(src), ts)}
        r = {k: device_ms(f, s, iters=10, reps=5) for k, (f, s) in impls.items()}
        results["cases"][case] = {"bytes": nbytes, **r}
        for k, ms in r.items():
            print(f"{case:36s} {k:24s} {ms:9.4f} {r['copy (same bytes)'] / ms:8.1%} "
                  f"{r['torch.compile'] / ms:10.3f}", flush=True)
        torch.cuda.empty_cache()
        clcuda.empty_cache()

    def forward(op, tf, cf, targs, cargs, nbytes, case):
        torch._dynamo.reset()
        comp = torch.compile(tf, dynamic=False)
        f = cl.jit(cf)
        run(case, nbytes, {
            "castlab cl.jit(f)(x)": (lambda: f(*cargs), cs),
            "castlab fused/inductor": (
                lambda: f.run(*cargs, policy="fused", math="inductor"), cs),
            "torch.compile": (lambda: comp(*targs), ts),
            "torch eager": (lambda: tf(*targs), ts)})

    def backward(tf, cf, targs, cargs, dy, wrt, nbytes, case):
        """Forward and backward of tf/cf (the gradients with respect to the arguments
        `wrt` given dy) timed together: castlab's backward_fn takes the inputs, then dy,
        and recomputes the forward, so torch runs its forward in the timed call too."""
        torch._dynamo.reset()
        comp = torch.compile(tf, dynamic=False)
        ps = [a.detach().requires_grad_() if i in wrt else a for i, a in enumerate(targs)]
        leaves = [ps[i] for i in wrt]
        tdy = dy if dy is not None else torch.ones_like(comp(*ps))
        cdy = cl.from_dlpack(tdy)
        fb = cl.jit(cf).backward_fn(argnums=wrt if len(wrt) > 1 else wrt[0])
        run(case + " fwd+bwd", nbytes, {
            "castlab cl.jit(f)(x)": (lambda: fb(*cargs, cdy), cs),
            "castlab fused/inductor": (
                lambda: fb.run(*cargs, cdy, policy="fused", math="inductor"), cs),
            "torch.compile": (lambda: torch.autograd.grad(comp(*ps), leaves, tdy), ts),
            "torch eager": (lambda: torch.autograd.grad(tf(*ps), leaves, tdy), ts)})

    for n in WIDTHS:
        rows = max(1, args.elements // n)
        x = (torch.randn(rows, n, device="cuda", generator=g) * 3).to(torch.bfloat16)
        t = torch.randint(0, n, (rows,), device="cuda", generator=g)
        X, T = cl.from_dlpack(x), cl.from_dlpack(t)
        xb = x.numel() * 2
        dy = torch.randn(rows, n, device="cuda", generator=g).to(torch.bfloat16)
        for op, tf, cf, targs, cargs, moves in (
                ("softmax", lambda a: torch.softmax(a, -1), lambda a: cl.softmax(a, -1),
                 (x,), (X,), 2),
                ("log_softmax", lambda a: torch.log_softmax(a, -1),
                 lambda a: cl.log_softmax(a, -1), (x,), (X,), 2),
                ("cross_entropy", lambda a, b: F.cross_entropy(a, b),
                 lambda a, b: cl.cross_entropy(a, b), (x, t), (X, T), 1)):
            if only and op not in only:
                continue
            case = f"{op} bf16 [{rows}, {n}]"
            forward(op, tf, cf, targs, cargs, xb * moves, case)
            if args.backward:  # forward (x read, y written), then y, dy read, dx written
                # (cross_entropy: x read; then x read, dx written)
                backward(tf, cf, targs, cargs, None if op == "cross_entropy" else dy, (0,),
                         xb * (3 if op == "cross_entropy" else 5), case)
        del x, t, X, T, dy

    if not only or "rmsnorm" in only:
        for h in HIDDEN:
            rows = max(1, args.elements // h)
            x = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
            w = (torch.rand(h, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
            X, W = cl.from_dlpack(x), cl.from_dlpack(w)

            def hf(a, b):
                z = a.to(torch.float32)
                z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)
                return b * z.to(a.dtype)

            def hf_cl(a, b):
                return cl.rms_norm(a, a.shape[-1], b, 1e-6, cast="hf")
            case = f"rmsnorm bf16 [{rows}, {h}]"
            forward("rmsnorm", hf, hf_cl, (x, w), (X, W), 2 * x.numel() * 2 + h * 2, case)
            if args.backward:  # forward, then x, dy read, dx written (and dw)
                dy = torch.randn(rows, h, device="cuda", generator=g).to(torch.bfloat16)
                backward(hf, hf_cl, (x, w), (X, W), dy, (0, 1), 5 * x.numel() * 2 + 2 * h * 2,
                         case)
                del dy
            del x, w, X, W
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
