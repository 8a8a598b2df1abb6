"""One call each of torch's and castlab's eager vocabulary softmax and log_softmax, for
Nsight Compute (issue 49's eager speed): the calls are warmed (castlab's kernels compiled,
torch's loaded) before the profiled range opens, so ncu sees one launch of each.

    ncu --profile-from-start off --clock-control none -k regex:'castlab_srow|SoftMax' \
        --section SpeedOfLight --section WarpStateStats --section InstructionStats \
        python scripts/ncu_vocab.py [--rows 2048] [--v 32000]
"""

from __future__ import annotations

import argparse

import torch

import castlab as cl
import castlab.cuda as clcuda


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--v", type=int, nargs="+", default=[32000])
    args = ap.parse_args()
    calls = []
    for v in args.v:
        x = (torch.randn(args.rows, v, device="cuda") * 3).to(torch.bfloat16)
        X = cl.from_dlpack(x)
        for op in ("softmax", "log_softmax"):
            calls.append((f"torch {op} {v}", lambda x=x, op=op: getattr(torch, op)(x, -1)))
            calls.append((f"castlab {op} {v}", lambda X=X, op=op: getattr(cl, op)(X, -1)))
    for _, fn in calls:
        fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in calls:
        print(name, flush=True)
        fn()
        torch.cuda.synchronize()
        clcuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
