"""castlab eager (torch_eager math on the CPU) vs torch CPU eager, per unary op, as ratios
measured in the same run (issue 22: castlab at least as fast at 16M elements, 2 threads).

    PYTHONPATH=python python benchmarks/bench_torch_cpu_math.py [--n 16777216] [--threads 2]

Prints, per op and dtype, the median time of each and castlab/torch (< 1: castlab faster).
"""

from __future__ import annotations

import argparse
import time

import torch

import castlab as cl
from castlab import _optable
from castlab.torch._aten import torch_pairs

# The transcendental unary ops (those that read Math.impl), from the op table.
OPS = {n: p for n, p in torch_pairs("unary_float").items() if _optable.OPS[n].factors & _optable.IMPL_MASK}


def _median(f, arg, reps: int) -> float:
    f(arg)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(arg)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"n={args.n} torch threads={torch.get_num_threads()} "
          f"capability={torch.backends.cpu.get_cpu_capability()}")
    print(f"{'op':10s} {'dtype':9s} {'torch ms':>9s} {'castlab ms':>11s} {'ratio':>6s}")
    for dn in args.dtypes.split(","):
        dt = getattr(torch, dn)
        x = (torch.randn(args.n) * 3).to(dt)
        xc = cl.from_dlpack(x)
        for name, (tf, cf) in OPS.items():
            with cl.use_math("torch_eager"):
                tt = _median(tf, x, args.reps)
                tc = _median(cf, xc, args.reps)
            print(f"{name:10s} {dn:9s} {tt * 1e3:9.2f} {tc * 1e3:11.2f} {tc / tt:6.2f}")


if __name__ == "__main__":
    main()
