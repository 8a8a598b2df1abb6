"""Which kernels castlab's eager vocabulary softmax runs on this GPU, and for how long,
beside torch's own (issue 49's eager speed): torch.profiler's CUDA activity over a few
calls of each implementation, per kernel name, and the row kernel's source.

    python scripts/profile_vocab.py OUT_DIR [--rows 2048] [--v 32000 151936] [--fuse]

Under `ncu --clock-control none -k regex:castlab_srow|SoftMax python scripts/...` the
same calls give the hardware counters of each kernel (--calls 1 keeps ncu's replays few).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import castlab as cl
import castlab.cuda as clcuda
from castlab import _C, _lower


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--v", type=int, nargs="+", default=[32000, 151936])
    ap.add_argument("--fuse", action="store_true", help="castlab._lower.FUSE_ROWS = True")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.fuse:
        _lower.FUSE_ROWS = True
    for v in args.v:
        x = (torch.randn(args.rows, v, device="cuda") * 3).to(torch.bfloat16)
        X = cl.from_dlpack(x)
        soft = cl.jit(lambda a: cl.softmax(a, -1))
        impls = {"torch": lambda x=x: torch.softmax(x, -1),
                 "castlab eager call": lambda X=X: cl.softmax(X, -1),
                 "castlab jit eager": lambda X=X, soft=soft: soft.run(X, policy="eager")}
        for name, fn in impls.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            clcuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn()
                torch.cuda.synchronize()
                clcuda.synchronize()
            print(f"== [{args.rows}, {v}] {name} (fuse={_lower.FUSE_ROWS}), {args.calls} calls")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
                if e.device_time_total <= 0:
                    continue
                print(f"  {e.count:4d} x {e.device_time_total / e.count:9.1f} us  {e.key[:110]}")
        tr, _ = soft._traced(soft._bind((X,)))
        for k, plan in enumerate(tr.plans.values()):
            print(f"  plan {k}: {len(plan.steps)} steps: "
                  + ", ".join(type(s).__name__ for s in plan.steps))
            for j, (spec, dts) in enumerate(plan.row_steps):
                src = _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])
                with open(os.path.join(args.out, f"row_{v}_{k}_{j}.cu"), "w") as f:
                    f.write(src)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
