"""Kernel-library presets on the CPU: each preset's mismatch against Hugging Face eager
and its correctly-rounded fraction against fp64, on 1M elements per case.

    PYTHONPATH=python python scripts/presets_cpu_measure.py [--n 1048576]

On the CPU castlab's "cuda" functions are its portable ones and Triton's ex2.approx
sigmoid is the IEEE one, so these figures measure cast placement and formula order; the
GPU figures (tests/test_presets_cuda.py) add the device's own exp/sin/cos.
The fp64 reference is the library's own formula on the inputs it reads, under
``Policy("fp64")`` (no rounding anywhere): cos/sin as the cached values (bf16 for the
cache-reading libraries) or, for apex and transformer_engine, exact cos/sin of the fp32
angles.
"""

from __future__ import annotations

import argparse
import datetime

import ml_dtypes
import numpy as np

import castlab as cl

DT = {"bfloat16": cl.bfloat16, "float16": cl.float16}


def f64(t) -> np.ndarray:
    return np.asarray(t.astype(cl.float64).cpu().numpy(), dtype=np.float64)


def rnd(v: np.ndarray, dt: str) -> np.ndarray:
    """Round float64 once to dt (bf16 through float32 rounded to odd)."""
    if dt == "float16":
        return v.astype(np.float16).astype(np.float64)
    f = v.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(v)
    f = np.where(over, np.nextafter(f, np.float32(0)), f)
    bits = f.view(np.uint32) | (f.astype(np.float64) != v).astype(np.uint32)
    return bits.view(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def ref64(p, args):
    if p.grad_of is None:
        return cl.jit(p.fn, policy="fp64", math="portable")(*args)
    fwd, argnums = p.grad_of
    dy, *rest = args
    primals = rest if p.op.startswith("swiglu") else [dy, *rest]
    return cl.jit(fwd).backward(*primals, grad_outputs=dy, argnums=argnums, policy="fp64",
                                math="portable")


def as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 20)
    n = ap.parse_args().n
    rows = []
    for dt in ("bfloat16", "float16"):
        d = DT[dt]
        cols = 1024
        a = cl.randn(n // cols, cols, seed=1, dtype=cl.float64).__mul__(3.0).astype(d)
        b = cl.randn(n // cols, cols, seed=2, dtype=cl.float64).astype(d)
        dc = cl.randn(n // cols, cols, seed=3, dtype=cl.float64).astype(d)
        seq, dim = 1024, 128
        x = cl.randn(1, n // (seq * dim), seq, dim, seed=4, dtype=cl.float64).astype(d)
        dy = cl.randn(1, n // (seq * dim), seq, dim, seed=5, dtype=cl.float64).astype(d)
        inv = (1.0 / (1e6 ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(np.float32)
        fr = np.outer(np.arange(seq, dtype=np.float32), inv).astype(np.float32)
        emb = np.concatenate([fr, fr], axis=-1)
        freqs = cl.tensor(emb.astype(np.float64)).astype(cl.float32)
        c = cl.tensor(np.cos(emb.astype(np.float64))).astype(cl.float32).astype(d)
        s = cl.tensor(np.sin(emb.astype(np.float64))).astype(cl.float32).astype(d)
        eager = cl.library("torch_eager")
        inputs = {
            "swiglu": ((a, b), (a, b)),
            "swiglu_backward": ((dc, a, b), (dc, a, b)),
            "rope": ((x, c, s), (x, freqs)),
            "rope_backward": ((dy, c, s), (dy, freqs)),
        }
        for op, (cache_args, freq_args) in inputs.items():
            base = [f64(t) for t in as_list(eager[op](*cache_args))]
            for name in cl.libraries():
                lib = cl.library(name)
                if op not in lib.ops:
                    continue
                p = lib[op]
                args = freq_args if name in ("apex", "transformer_engine",
                                             "transformer_engine_unfused") else cache_args
                got = [f64(t) for t in as_list(p(*args))]
                ref = [rnd(f64(t), dt) for t in as_list(ref64(p, args))]
                total = sum(g.size for g in got)
                diff = sum(int((g != e).sum()) for g, e in zip(got, base))
                cr = sum(int((g == r).sum()) for g, r in zip(got, ref))
                rows.append((op, name, dt, total, diff, cr))
    print(f"# castlab presets on the CPU, {datetime.date.today()}, {n} elements per case")
    print("| op | library | dtype | differ from HF eager | correctly rounded vs fp64 |")
    print("|---|---|---|---|---|")
    for op, name, dt, total, diff, cr in rows:
        print(f"| {op} | {name} | {dt} | {100 * diff / total:.3f}% | {100 * cr / total:.3f}% |")


if __name__ == "__main__":
    main()
