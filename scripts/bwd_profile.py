"""Which kernels castlab's eager and fused backward of softmax, log_softmax, cross-entropy
and HF RMSNorm launch, and how long each takes (torch.profiler over one call, after a
warm-up): the plan's steps, then the kernel table. GPU only.

    python scripts/bwd_profile.py [--rows 2097 --n 32000] [--fuse auto|1|0]
                                  [--only rmsnorm,softmax] [--argnums 0,1]
"""

from __future__ import annotations

import argparse

import torch

import castlab as cl
from castlab import _lower


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2097)
    ap.add_argument("--n", type=int, default=32000)
    ap.add_argument("--fuse", default="auto")
    ap.add_argument("--only", default="", help="comma-separated cases (default: all)")
    ap.add_argument("--argnums", default="0",
                    help="gradients taken, e.g. 0,1 (RMSNorm's x and weight; others take 0)")
    args = ap.parse_args()
    _lower.FUSE_ROWS = {"1": True, "0": False}.get(args.fuse, "auto")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(args.rows, args.n, device="cuda", generator=g) * 3).to(torch.bfloat16)
    dy = torch.randn(args.rows, args.n, device="cuda", generator=g).to(torch.bfloat16)
    t = torch.randint(0, args.n, (args.rows,), device="cuda", generator=g)
    w = torch.ones(args.n, device="cuda", dtype=torch.bfloat16)
    X, DY, T, W = (cl.from_dlpack(a) for a in (x, dy, t, w))
    cases = {
        "softmax": (lambda a: cl.softmax(a, -1), (X, DY)),
        "log_softmax": (lambda a: cl.log_softmax(a, -1), (X, DY)),
        "cross_entropy": (lambda a, b: cl.cross_entropy(a, b), (X, T, cl.from_dlpack(
            torch.ones((), device="cuda", dtype=torch.bfloat16)))),
        "rmsnorm": (lambda a, b: cl.rms_norm(a, a.shape[-1], b, 1e-6, cast="hf"), (X, W, DY)),
    }
    only = [c for c in args.only.split(",") if c]
    wrt = tuple(int(a) for a in args.argnums.split(","))
    for name, (f, args_) in cases.items():
        if only and name not in only:
            continue
        argnums = wrt if name == "rmsnorm" and len(wrt) > 1 else 0
        for pol in (dict(), dict(policy="fused", math="inductor")):
            fb = cl.jit(f).backward_fn(argnums=argnums)
            fb.run(*args_, **pol)
            torch.cuda.synchronize()
            tr, _ = fb._traced(fb._bind(args_))
            steps = {str(k)[:60]: [type(st).__name__ for st in p.steps]
                     for k, p in tr.plans.items()}
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fb.run(*args_, **pol)
                torch.cuda.synchronize()
            print(f"== {name} {pol or 'default'}: steps {steps}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8,
                                            max_name_column_width=60))


if __name__ == "__main__":
    main()
