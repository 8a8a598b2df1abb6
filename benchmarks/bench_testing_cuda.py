"""castlab.testing on the GPU: all 2**32 bf16 (a, b) pairs of a user's SwiGLU kernel
checked against a castlab preset (issue 54's goal: under 2 s on an H200, with castlab's
side not the bottleneck), and bounds() over the same pairs.

    PYTHONPATH=$PWD/python python benchmarks/bench_testing_cuda.py [--json FILE]

Prints, per kernel: the total time of assert_kernel_matches (warm: the castlab kernels'
NVRTC compile is done by a first, smaller call), the time inside the user's kernel and the
time in castlab (input generation, the reference, the comparison), and the ratio of the
total to the 2 s goal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

import castlab as cl
from castlab.testing import KernelMismatch, assert_kernel_matches, bounds

GOAL_S = 2.0
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def _kernels() -> dict:
    ks = {"torch eager silu(a)*b": (lambda a, b: torch.nn.functional.silu(a) * b,
                                    cl.library("torch_eager")["swiglu"])}
    try:
        from _triton_swiglu import triton_swiglu  # tests/_triton_swiglu.py

        ks["triton, Liger's order"] = (triton_swiglu, cl.library("liger")["swiglu"])
    except ImportError as e:
        print(f"triton: not run ({e})")
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        def liger_swiglu(a, b):  # Liger's kernel takes rows of at most 65,536
            cols = math.gcd(a.numel(), 1 << 16)
            return LigerSiLUMulFunction.apply(a.view(-1, cols), b.view(-1, cols)).view(-1)

        ks["liger-kernel"] = (liger_swiglu, cl.library("liger")["swiglu"])
    except ImportError as e:
        print(f"liger-kernel: not run ({e})")
    return ks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for name, (k, ref) in _kernels().items():
        assert_kernel_matches(k, ref, mode="sample", sample=1 << 24, device="cuda")  # warm
        t0 = time.perf_counter()
        try:
            r = assert_kernel_matches(k, ref, device="cuda")
        except KernelMismatch as e:
            r = e.report
        total = time.perf_counter() - t0
        rows.append({"kernel": name, "reference": r.reference, "pairs": r.inputs,
                     "passed": r.passed, "differ": r.differ, "total_s": total,
                     "kernel_s": r.seconds_kernel, "castlab_s": r.seconds_castlab,
                     "goal_ratio": GOAL_S / total, "phases_s": r.seconds_phases})
        print(f"{name:24s} vs {r.reference:22s} {r.inputs:,} pairs  "
              f"{'pass' if r.passed else 'FAIL'} ({r.differ} differ)  total {total:.2f} s  "
              f"kernel {r.seconds_kernel:.2f} s  castlab {r.seconds_castlab:.2f} s  "
              f"goal/total {GOAL_S / total:.2f}")
        print("    by phase (device time): " + ", ".join(
            f"{k} {v:.3f} s" for k, v in r.seconds_phases.items()))
    bounds(cl.library("liger")["swiglu"], "bfloat16", device="cuda", sample=1 << 24,
           cache=False)  # warm
    t0 = time.perf_counter()
    b = bounds(cl.library("liger")["swiglu"], "bfloat16", device="cuda", cache=False)
    tb = time.perf_counter() - t0
    print(f"bounds(liger swiglu, bf16, 3 references) over {b.inputs:,} pairs: {tb:.2f} s")
    rows.append({"kernel": "bounds liger swiglu", "pairs": b.inputs, "total_s": tb})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
