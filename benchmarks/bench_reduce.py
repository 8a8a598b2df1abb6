"""castlab's reductions on the GPU against PyTorch, in one run (issue 16's speed goals).

Cases (bf16):
  RMSNorm  [16384, 4096] with weight, HF Qwen2RMSNorm; bytes = x read + y write (+ w)
  softmax  [32*4096, 4096] rows, dim -1;                 bytes = x read + y write
Implementations: castlab ``jit(...).run(policy="fused", math="inductor")`` and
``policy="eager", math="torch_eager"``, torch.compile(dynamic=False), torch eager, and a
device-to-device copy of the same bytes (the bandwidth anchor). Timing: CUDA events on one
stream (bench_cuda.device_ms) and the host clock around many calls.

Usage: python benchmarks/bench_reduce.py [--json PATH] [--small] [--quick] [--profile]

--quick times only castlab fused/inductor, torch.compile, torch eager and the copy (the
slow separate-step and eager castlab rows take most of a full run).

--profile times nothing: it runs castlab fused/inductor and torch.compile once each per
case between torch.cuda.profiler.start() and stop(), for
``ncu --profile-from-start off --clock-control none --section SpeedOfLight ... python
benchmarks/bench_reduce.py --profile`` (each kernel of one call of each).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_backward import _require_gpu, measure_case, print_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    ap.add_argument("--small", action="store_true", help="1/16 of the sizes (a smoke run)")
    ap.add_argument("--quick", action="store_true",
                    help="castlab fused/inductor, torch.compile, torch eager and copy only")
    ap.add_argument("--profile", action="store_true",
                    help="one call of castlab fused/inductor and torch.compile per case, "
                         "between profiler start/stop (for ncu); no timing")
    args = ap.parse_args()
    _require_gpu()

    import torch
    from bench_cuda import stream_of_castlab, to_cl

    import castlab as cl
    import castlab.cuda as clcuda

    info = clcuda.info()
    dev = info["devices"][0]
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"# castlab reduction benchmark  {now:%Y-%m-%d %H:%M} UTC")
    print(f"# {dev['name']} cc {dev['compute_capability']}  driver {info['driver_version']}  "
          f"NVRTC {info['nvrtc_version']}  torch {torch.__version__}")
    results: dict = {"device": dev["name"], "date": f"{now:%Y-%m-%d}", "cases": {}}
    ts, cs = torch.cuda.current_stream(), stream_of_castlab()
    div = 16 if args.small else 1
    rows = []

    def measure(case, nbytes, impls):
        if args.quick:
            impls = {k: v for k, v in impls.items()
                     if k in ("castlab fused/inductor", "torch.compile", "torch eager")}
        if not args.profile:
            measure_case(case, nbytes, impls, rows, results)
            return
        for name in ("castlab fused/inductor", "torch.compile"):
            fn = impls[name][0]
            for _ in range(3):  # compiled, planned, warm
                fn()
            clcuda.synchronize()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fn()
            clcuda.synchronize()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()

    g = torch.Generator(device="cuda").manual_seed(0)
    cuda_order = cl.Math("cuda_order", impl="portable", reduction="torch_cuda")

    def separate(fn, args, **kw):
        """A jit of `fn` whose plan keeps the reduction and its prologue and epilogue as
        separate steps (castlab before row kernels), planned by one run."""
        from castlab import _lower
        f = cl.jit(fn)
        _lower.FUSE_ROWS = False
        try:
            f.run(*args, **kw)
        finally:
            _lower.FUSE_ROWS = "auto"
        return f

    def rmsnorm():
        R, H = 16384 // div, 4096
        tx = torch.randn(R, H, device="cuda", generator=g).to(torch.bfloat16)
        tw = (torch.rand(H, device="cuda", generator=g) + 0.5).to(torch.bfloat16)

        def hf(x, w):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return w * h.to(x.dtype)
        torch._dynamo.reset()
        comp = torch.compile(hf, dynamic=False)
        x, w = to_cl(tx), to_cl(tw)
        def fn(x, w):
            return cl.rms_norm(x, H, w, 1e-6, cast="hf")
        f = cl.jit(fn)
        fs = separate(fn, (x, w), policy="fused", math="inductor")
        impls = {
            "castlab fused/inductor": (lambda: f.run(x, w, policy="fused", math="inductor"), cs),
            "castlab fused, separate": (
                lambda: fs.run(x, w, policy="fused", math="inductor"), cs),
            "castlab fused, cuda order": (
                lambda: f.run(x, w, policy="fused", math=cuda_order), cs),
            "castlab eager/torch_eager": (
                lambda: f.run(x, w, policy="eager", math="torch_eager"), cs),
            "torch.compile": (lambda: comp(tx, tw), ts),
            "torch eager": (lambda: hf(tx, tw), ts),
        }
        measure(f"rmsnorm bf16 [{R},{H}]", 2 * tx.numel() * 2 + H * 2, impls)

    def softmax():
        R, N = 32 * 4096 // div, 4096
        tx = torch.randn(R, N, device="cuda", generator=g).to(torch.bfloat16)
        torch._dynamo.reset()
        comp = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
        x = to_cl(tx)
        def fn(x):
            return cl.softmax(x, -1)
        f = cl.jit(fn)
        fs = separate(fn, (x,), policy="fused", math="inductor")
        impls = {
            "castlab fused/inductor": (lambda: f.run(x, policy="fused", math="inductor"), cs),
            "castlab fused, separate": (
                lambda: fs.run(x, policy="fused", math="inductor"), cs),
            "castlab fused, cuda order": (
                lambda: f.run(x, policy="fused", math=cuda_order), cs),
            "castlab eager/torch_eager": (lambda: f.run(x, policy="eager", math="torch_eager"),
                                          cs),
            "torch.compile": (lambda: comp(tx), ts),
            "torch eager": (lambda: torch.softmax(tx, -1), ts),
        }
        measure(f"softmax bf16 [{R},{N}]", 2 * tx.numel() * 2, impls)

    rmsnorm()
    torch.cuda.empty_cache()
    clcuda.empty_cache()
    softmax()

    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
