"""Vocabulary-wide reductions on the GPU, castlab's default eager path against torch eager,
in one run (issue 49's eager speed goal).

Cases (bf16 logits [rows, V], V in 32,000 / 50,257 / 151,936): softmax and log_softmax over
the vocabulary, and cross_entropy against random targets. Implementations: castlab's eager
call (``cl.softmax(x, -1)``: the default math, PyTorch's SoftMax.cu order) and
``jit(...).run(policy="eager")``, torch eager, and a device copy of the bytes the op must
move (logits read + result written: the anchor). With --fuse, SoftMax.cu's orders run as
one kernel of that kernel's own threads (castlab._lower.FUSE_ROWS = True). Timing: CUDA
events on each library's stream (bench_cuda.device_ms).

Usage: python benchmarks/bench_vocab.py [--json PATH] [--rows N] [--fuse]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_backward import _require_gpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--fuse", action="store_true", help="castlab._lower.FUSE_ROWS = True")
    args = ap.parse_args()
    _require_gpu()

    import torch
    from bench_cuda import device_ms, gbps, run_header

    import castlab as cl
    from castlab import _lower

    if args.fuse:
        _lower.FUSE_ROWS = True
    ts, cs, results = run_header("vocabulary benchmark", f"rows {args.rows}  {args.dtype}")
    print(f"{'case':28s} {'impl':22s} {'ms':>9s} {'GB/s':>8s} {'of copy':>8s} {'torch/cl':>8s}")
    for v in (32000, 50257, 151936):
        x = (torch.randn(args.rows, v, device="cuda") * 3).to(getattr(torch, args.dtype))
        t = torch.randint(0, v, (args.rows,), device="cuda")
        for op, (impls, nbytes) in _cases(torch, cl, x, t, ts, cs).items():
            r = {k: device_ms(f, s, iters=10, reps=5) for k, (f, s) in impls.items()}
            case = f"{op} [{args.rows}, {v}]"
            results["cases"][case] = {"bytes": nbytes, **r}
            for k, ms in r.items():
                print(f"{case:28s} {k:22s} {ms:9.4f} {gbps(nbytes, ms):8.1f} "
                      f"{r['copy (same bytes)'] / ms:8.2f} {r['torch eager'] / ms:8.2f}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _cases(torch, cl, x, t, ts, cs) -> dict:
    """op -> ({impl: (fn, stream)}, bytes the op must move) for logits x and targets t."""
    X, T = cl.from_dlpack(x), cl.from_dlpack(t)
    soft, logsoft = cl.jit(lambda a: cl.softmax(a, -1)), cl.jit(lambda a: cl.log_softmax(a, -1))
    ce = cl.jit(lambda a, b: cl.cross_entropy(a, b))
    out = {}
    for op, tf, cf, jf, jargs, moves in (
            ("softmax", lambda: torch.softmax(x, -1), lambda: cl.softmax(X, -1), soft, (X,), 2),
            ("log_softmax", lambda: torch.log_softmax(x, -1), lambda: cl.log_softmax(X, -1),
             logsoft, (X,), 2),
            ("cross_entropy", lambda: torch.nn.functional.cross_entropy(x, t),
             lambda: cl.cross_entropy(X, T), ce, (X, T), 1)):
        nbytes = x.numel() * x.element_size() * moves  # the logits read (and as many written)
        src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        out[op] = ({"torch eager": (tf, ts), "castlab eager call": (cf, cs),
                    "castlab jit eager": (lambda jf=jf, a=jargs: jf.run(*a, policy="eager"), cs),
                    "copy (same bytes)": (lambda d=dst, s=src: d.copy_(s), ts)}, nbytes)
    return out


if __name__ == "__main__":
    main()
