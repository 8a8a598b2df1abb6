"""Speed of castlab.numerics.compare on the GPU: three 16M-element bf16 results against an
fp64 reference, all on the device (issue 20 item 4: under 50 ms on the H200). The metrics
are computed by castlab's own kernels (ops/compare.h); the anchors in the same run are
compare's host path on the same tensors (copy to the host, then the chunked NumPy scan) and a
plain PyTorch CUDA computation of a subset of the metrics (max/mean abs error, RMSE, max/mean
ulp error, mismatches, correctly rounded count).

    python benchmarks/bench_compare_cuda.py [--n 16777216] [--repeat 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from bench_compare_cpu import inputs

import castlab as cl
import castlab.cuda as clcuda
import castlab.numerics as nm


def _best(fn, repeat: int) -> tuple:
    fn()                                   # warm-up (kernel compilation, allocator)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return min(ts), float(np.median(ts)), out


def _torch_subset(torch, xs, ref):
    """A subset of compare's metrics in plain PyTorch on the GPU (the anchor)."""
    out = []
    r = ref
    e = torch.frexp(r.abs())[1].clamp(min=-125) - 1 - 7          # bf16 ulp exponent
    ulp = torch.ldexp(torch.ones_like(r), e)
    cr = r.to(torch.float32).to(torch.bfloat16)  # (through fp32: double rounding; a timing anchor)
    for x in xs:
        d = x.double() - r
        ad = d.abs()
        ue = ad / ulp
        out.append((ad.max().item(), ad.mean().item(), d.square().mean().sqrt().item(),
                    ue.max().item(), ue.mean().item(), (x != xs[0]).sum().item(),
                    (x == cr).sum().item()))
    torch.cuda.synchronize()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not clcuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 0
    res, ref = inputs(args.n)
    names = ["eager", "fp32-path", "bumped"]
    ds = [cl.from_numpy(np.ascontiguousarray(r)).to("cuda") for r in res]
    dr = cl.from_numpy(np.ascontiguousarray(ref)).to("cuda")
    clcuda.synchronize()
    gpu_best, gpu_med, c_gpu = _best(lambda: nm.compare(*ds, ref=dr, names=names), args.repeat)

    def host():
        return nm.compare(*[d.cpu() for d in ds], ref=dr.cpu(), names=names)

    host_best, host_med, c_host = _best(host, max(2, args.repeat // 5))
    same = all(repr(c_gpu.rows[k]) == repr(c_host.rows[k]) for k in range(3))
    torch_best = None
    try:
        import torch

        tx = [torch.from_dlpack(d) for d in ds]
        tr = torch.from_dlpack(dr)
        torch_best, _, _ = _best(lambda: _torch_subset(torch, tx, tr), args.repeat)
    except ImportError:
        pass
    print(f"# castlab compare GPU benchmark {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f"  n={args.n}  3 bf16 results vs fp64 ref, all on the GPU")
    print(f"compare on the GPU (castlab kernels): best {1e3 * gpu_best:.2f} ms, median "
          f"{1e3 * gpu_med:.2f} ms  (goal: under 50 ms)")
    print(f"compare's host path on the same tensors (copy + NumPy scan): best "
          f"{1e3 * host_best:.1f} ms  -> GPU path {host_best / gpu_best:.1f}x faster")
    if torch_best is not None:
        print(f"PyTorch CUDA, a subset of the metrics: best {1e3 * torch_best:.2f} ms  -> "
              f"castlab / torch = {gpu_best / torch_best:.2f}")
    print(f"GPU rows == host rows (bit for bit, same() included): {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "gpu_best_s": gpu_best, "gpu_median_s": gpu_med,
                       "host_best_s": host_best, "torch_subset_best_s": torch_best,
                       "same_rows": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
