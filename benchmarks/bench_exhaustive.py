"""castlab.numerics.exhaustive: how fast every input of a chain is checked.

    PYTHONPATH=$PWD/python python benchmarks/bench_exhaustive.py          # CPU figures
    PYTHONPATH=$PWD/python python benchmarks/bench_exhaustive.py --gpu    # + GPU and PyTorch

CPU: all 2**16 bf16 inputs of unary chains (5 configurations), and SwiGLU over every
finite bf16 a x 128 values of b (8.4M pairs, 4 configurations): inputs per second and the
time that rate gives for all 2**32 pairs.

GPU (--gpu): all 2**32 bf16 (a, b) pairs of SwiGLU with the issue's 4 configurations
(eager and fused under torch_eager, fused under inductor and transformer_engine), the fp64
reference and every statistic, timed warm (the NVRTC compile excluded; it is reported
apart); all 2**16 inputs of a unary chain; and in the same run the PyTorch brute force of
the issue: materialise a 2**28-pair chunk, compute eager bf16, a fused-like fp32 version
and the fp64 reference, count correctly rounded results, for all 16 chunks. Prints the
ratio and the fp64 bound (see FP64_OPS_PER_PAIR).
"""

from __future__ import annotations

import argparse
import os
import time

import castlab as cl
from castlab import numerics as nm
from castlab.numerics import Enumeration

CONFIGS = [("eager", "torch_eager"), ("fused", "torch_eager"), ("fused", "inductor"),
           ("fused", "transformer_engine")]
UNARY = {"silu": cl.silu, "exp": cl.exp, "silu(x)*x": lambda x: cl.silu(x) * x,
         "gelu": cl.gelu, "tanh": cl.tanh}
# fp64 instructions of the reference per SwiGLU pair if it ran once per pair, counted in
# ops/scalar/math_portable.h (exp_: range clamps 2, reduction 7, degree-10 polynomial 10 fma,
# reconstruction 9, scaling 2 = 30) plus silu (neg, add, an IEEE division ~12, mul) and the
# product with b: ~46. The H200's plain fp64 rate: 132 SMs x 64 fp64 lanes x 1.98 GHz =
# 16.7e12 instructions/s (33.5 TFLOP/s counting an fma as 2; the 67 TFLOP/s of its data
# sheet is the fp64 tensor cores, which an elementwise kernel does not use).
FP64_OPS_PER_PAIR = 46
H200_FP64_INSTR = 132 * 64 * 1.98e9


def swiglu(a, b):
    return cl.silu(a) * b


def best_of(fn, repeat: int = 3) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def cpu() -> None:
    print(f"CPU, {os.cpu_count()} cores")
    for name, f in UNARY.items():
        cfg = CONFIGS + [("eager", "portable")]
        t = best_of(lambda f=f, cfg=cfg: nm.exhaustive(f, [cl.bfloat16], cfg))
        print(f"  all 65,536 bf16 inputs of {name:<10} 5 configs: {1e3 * t:7.1f} ms "
              f"(goal < 1000 ms: {'met' if t < 1 else 'NOT met'})")
    ins = [Enumeration.finite(cl.bfloat16), Enumeration.bits(cl.bfloat16, 0x3F00, 0x3F80)]
    t = best_of(lambda: nm.exhaustive(swiglu, ins, CONFIGS), repeat=2)
    n = 65280 * 128
    print(f"  SwiGLU finite bf16 x 128 values ({n:,} pairs), 4 configs: {t:.2f} s, "
          f"{n / t / 1e6:.2f} M pairs/s -> all 2**32 pairs ~{2**32 * t / n:.0f} s")


def gpu() -> None:
    import torch

    dev = "cuda"
    t0 = time.perf_counter()
    full = nm.exhaustive(swiglu, [cl.bfloat16, cl.bfloat16], CONFIGS, device=dev)
    first = time.perf_counter() - t0
    t = best_of(lambda: nm.exhaustive(swiglu, [cl.bfloat16, cl.bfloat16], CONFIGS, device=dev))
    print(f"GPU: all 2**32 bf16 pairs of SwiGLU, 4 configs + fp64 + statistics: {1e3 * t:.1f} ms "
          f"warm (first call with the NVRTC compile: {first:.2f} s; goal <= 100 ms)")
    for k, r in full.rows.items():
        print(f"    {k:<26} correctly rounded {r['correctly_rounded']:,} / {full.n:,}")
    p = full.pairs[("fused/inductor", "fused/transformer_engine")]
    print(f"    inductor vs transformer_engine: {p['differ']:,} pairs differ, "
          f"{p['differ_at_ties']} at exact midpoints, max distance from a midpoint "
          f"{p['max_tie_distance']} ulps")
    bound = 2**32 * FP64_OPS_PER_PAIR / H200_FP64_INSTR
    print(f"    fp64 floor of a reference run per pair ({FP64_OPS_PER_PAIR} fp64 instructions at "
          f"16.7e12/s): {1e3 * bound:.1f} ms. castlab runs the reference's silu(a) once per "
          f"value of a (hoisted out of the loop over b), so per pair it pays the product and "
          f"the statistics; what bounds it is instruction issue (benchmarks/RESULTS.md)")
    for name, f in UNARY.items():
        tu = best_of(lambda f=f: nm.exhaustive(f, [cl.bfloat16], CONFIGS, device=dev))
        print(f"    all 65,536 bf16 inputs of {name:<10}: {1e3 * tu:6.2f} ms (goal < 5 ms)")

    # the PyTorch brute force of the issue, in the same run
    allb = torch.arange(65536, dtype=torch.int32, device=dev).to(torch.int16).view(torch.bfloat16)
    chunk_a = 1 << 12                       # 4096 values of a x 65536 of b = 2**28 pairs
    b = allb.repeat(chunk_a)

    def chunk(i: int) -> int:
        a = allb[i * chunk_a:(i + 1) * chunk_a].repeat_interleave(65536)
        eager = torch.nn.functional.silu(a) * b
        fused = (torch.nn.functional.silu(a.float()) * b.float()).bfloat16()
        ref = (torch.nn.functional.silu(a.double()) * b.double()).bfloat16()
        return int((eager == ref).sum()) + int((fused == ref).sum())

    chunk(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    chunk(0)
    torch.cuda.synchronize()
    per_chunk = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(16):
        chunk(i)
    torch.cuda.synchronize()
    tb = time.perf_counter() - t0
    print(f"PyTorch brute force: {1e3 * per_chunk:.1f} ms per 2**28-pair chunk, {tb:.2f} s for "
          f"2**32 pairs (2 configurations, no histograms); castlab {tb / t:.1f}x faster "
          f"(goal >= 4x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="also the GPU figures (needs CUDA)")
    args = ap.parse_args()
    cpu()
    if args.gpu:
        gpu()


if __name__ == "__main__":
    main()
