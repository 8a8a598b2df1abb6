"""Speed of castlab.numerics.attribute on 16M-element outputs (the issue's goal: under 2 s
on an H200, under 30 s on 2 CPU cores), with the time of one fused run of the same graph
measured in the same process as the anchor.

    python benchmarks/bench_attribution.py [--device cuda|cpu] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import castlab as cl
import castlab.numerics as nm


def swiglu(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + cl.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def _sync(device):
    if device == "cuda":
        cl.cuda.synchronize()


def cases(device):
    x = cl.randn(4096, 8192, seed=0, dtype=cl.bfloat16, device=device)  # output 16M
    yield "swiglu bf16 out 16M", cl.jit(swiglu), (x,), ("eager", "torch_eager"), ("fused", "inductor")
    for dt in (cl.bfloat16, cl.float32):
        q = cl.randn(1, 32, 4096, 128, seed=1, dtype=dt, device=device)      # 16M
        ang = cl.rand(1, 1, 4096, 128, seed=2, dtype=cl.float32, device=device) * 6.0
        c, s = cl.cos(ang).astype(dt), cl.sin(ang).astype(dt)
        yield (f"rope {dt.short} 16M", cl.jit(rope), (q, c, s), ("eager", "torch_eager"),
               ("fused", "inductor"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if cl.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = args.device
    rows = []
    print(f"# castlab attribution benchmark  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f"  device={dev}")
    print(f"{'case':<22} {'differ':>10} {'factors':>8} {'sets':>5} {'attribute s':>12} "
          f"{'fused run ms':>13} {'runs-equiv':>10}")
    for name, fn, inputs, a, b in cases(dev):
        fn.run(*inputs, policy=b[0], math=b[1])  # compile/plan once
        _sync(dev)
        t = time.perf_counter()
        for _ in range(5):
            fn.run(*inputs, policy=b[0], math=b[1])
        _sync(dev)
        run_ms = (time.perf_counter() - t) / 5 * 1e3
        nm.attribute(fn, inputs, a=a, b=b)  # warm: plans for every factor setting
        t = time.perf_counter()
        att = nm.attribute(fn, inputs, a=a, b=b)
        _sync(dev)
        sec = time.perf_counter() - t
        row = dict(case=name, device=dev, differ=len(att.indices), elements=att.total,
                   factors=len(att.factors), sets=len(att._groups()),
                   unexplained=att.unexplained, seconds=sec, fused_run_ms=run_ms)
        rows.append(row)
        print(f"{name:<22} {row['differ']:>10,} {row['factors']:>8} {row['sets']:>5} "
              f"{sec:>12.3f} {run_ms:>13.3f} {sec * 1e3 / run_ms:>10.1f}")
        assert att.unexplained == 0, att.verdict
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
