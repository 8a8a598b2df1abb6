"""The per-element metrics of :func:`compare`, computed in one pass over chunks of the
flattened (C-order) tensors, on a few threads, without a float64 copy of every array.

Every value is the one of the plain NumPy definitions (``_reference_rows`` in
tests/test_numerics_scale.py keeps them): maxima are maxima; sums follow NumPy's pairwise
summation tree exactly (:func:`_pairwise_tree`: the chunks are the leaves of the tree
``np.add.reduce`` walks on the whole array, so each chunk's ``np.add.reduce`` is the
subtree's sum and the partial sums are combined in NumPy's order); comparisons of values
of one dtype are done on the bits. A chunk that holds a NaN, an infinity, a zero
reference or a zero/NaN rounded reference takes the plain definitions on that chunk.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _C
from ._formats import (
    _f64,
    _fmt,
    _round_narrow_np,
    _round_np,
    _ulp_diff_np,
    _ulp_error_np,
    _ulp_np,
    _Val,
)

_LEAF = 1 << 15          # elements per chunk (the leaves of the summation tree)


def _pairwise_tree(n: int, leaf: int = _LEAF):
    """NumPy's pairwise summation split of [0, n) (numpy/_core/src/umath/loops_utils.h:
    halve, rounding the first half down to a multiple of 8, while longer than 128),
    stopped at segments of at most `leaf` elements. Returns (leaves, tree): leaves as
    (lo, hi) in order, tree as nested pairs of leaf numbers."""
    leaves: list = []

    def split(lo, m):
        if m <= leaf:
            leaves.append((lo, lo + m))
            return len(leaves) - 1
        m2 = m // 2
        m2 -= m2 % 8
        return (split(lo, m2), split(lo + m2, m - m2))

    tree = split(0, n)
    return leaves, tree


def _tree_sum(tree, parts) -> float:
    if isinstance(tree, int):
        return parts[tree]
    return _tree_sum(tree[0], parts) + _tree_sum(tree[1], parts)


def parallel_map(work, items: list, n: int) -> list:
    """[work(item) for item in items], on a few threads when the `n` elements the items
    cover are many (chunks of _LEAF elements each)."""
    workers = min(os.cpu_count() or 1, 8, len(items))
    if workers > 1 and n >= 4 * _LEAF:
        with ThreadPoolExecutor(workers) as ex:
            return list(ex.map(work, items))
    return [work(i) for i in items]


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


def _nanmax(vals) -> float:
    """max over partial maxima with NumPy's NaN propagation."""
    return float(np.max(np.array(vals, dtype=np.float64))) if len(vals) else 0.0


class _Leaf:
    """Per-chunk partial results (one per result)."""

    __slots__ = ("mism", "nan_mism", "apart", "abs_max", "abs_sum", "rel_max", "sq_sum",
                 "ue_arg", "ue_max", "ue_sum", "ok", "has_nan")


def _ordinal(bits: np.ndarray, nbits: int) -> np.ndarray:
    """Monotone integer position of each (non-NaN) value: +-magnitude of the bits."""
    i = bits.astype(np.int64)
    mag = i & ((1 << (nbits - 1)) - 1)
    return np.where(i >> (nbits - 1), -mag, mag)


def scan(vals: list, rv, shape: tuple) -> dict:
    """The metrics of every result in `vals` (``_Val`` broadcast to `shape`), against the
    first and, when `rv` is given, the reference. Returns {"rows": [...], "worst": [...],
    "ref_rms": float, "has_nan": [...]} (rows without "same")."""
    n = int(np.prod(shape)) if shape else 1
    base = vals[0]
    flats = [_flat(v.a) for v in vals]
    rflat = None if rv is None else _flat(rv.a)
    fmts = [_fmt(v.dt) for v in vals]
    bf = fmts[0]
    # the reference rounded once to each result dtype (castlab's own conversion), narrow
    crs = {}
    if rv is not None:
        for f in fmts:
            if f.name not in crs:
                crs[f.name] = _f64(rflat) if f.bits == 64 else _round_narrow_np(_f64(rflat), f)
    leaves, tree = _pairwise_tree(n)
    nres = len(vals)

    def work(k):
        lo, hi = leaves[k]
        outs = [_Leaf() for _ in range(nres)]
        r = None
        shared = {}
        if rflat is not None:
            r = _f64(rflat[lo:hi])
            absr = np.abs(r)
            rmax, rmin = float(absr.max()), float(absr.min())
            rfin = math.isfinite(rmax)
            shared["r_sq"] = float(np.add.reduce(np.square(r)))
            if rfin:
                shared["r_absmax"] = rmax
            else:
                fin = absr[np.isfinite(absr)]
                shared["r_absmax"] = float(fin.max()) if fin.size else -math.inf
        bb = flats[0][lo:hi]
        b64 = _f64(bb)
        bmin = float(np.abs(b64).min())
        b_plain = bmin > 0          # no zero, no NaN in the base chunk
        b_nan = False if b_plain else bool(np.isnan(b64).any())
        for j in range(nres):
            o = outs[j]
            f = fmts[j]
            xb = flats[j][lo:hi]
            x = b64 if j == 0 else _f64(xb)
            amax = None
            if r is not None:
                with np.errstate(all="ignore"):
                    d = x - r
                    ad = np.abs(d)
                    amax = float(ad.max())
                    fast = rfin and math.isfinite(amax)
                    if fast:
                        o.abs_max = amax
                        o.abs_sum = float(np.add.reduce(ad))
                        rel = ad / absr
                        if rmin == 0:
                            z = absr == 0
                            rel[z] = np.where(ad[z] == 0, 0.0, np.inf)
                        o.rel_max = float(rel.max())
                        o.sq_sum = float(np.add.reduce(np.square(d, out=d)))
                        ue = np.divide(ad, _ulp_np(r, f), out=ad)
                        a = int(np.argmax(ue))
                        o.ue_arg, o.ue_max = lo + a, float(ue[a])
                        o.ue_sum = float(np.add.reduce(ue))
                        crb = crs[f.name][lo:hi]
                        if rmin > math.ldexp(1.0, f.emin - f.p - 1) and f.bits < 64:
                            # the rounded reference has no zero and no NaN: bits compare
                            o.ok = int(np.count_nonzero(crb.view(f.uint) == xb.view(f.uint)))
                        else:
                            cr = _f64(crb)
                            o.ok = int(np.count_nonzero((cr == x) | (np.isnan(cr) & np.isnan(x))))
                        o.has_nan = False
                    else:
                        _plain_ref(o, lo, x, r, f, crs[f.name][lo:hi])
            if j == 0:
                o.mism, o.nan_mism, o.apart = 0, 0, 0
                o.has_nan = b_nan
                continue
            if r is None:
                o.has_nan = bool(np.isnan(x.max())) if x.size else False
            x_nan = o.has_nan
            if f.dt is base.dt and f.bits < 64 and b_plain and not x_nan:
                # no NaN, no zero in the base: float equality is bit equality
                xu, bu = xb.view(f.uint), bb.view(f.uint)
                neq = xu != bu
                o.mism = int(np.count_nonzero(neq))
                o.nan_mism = 0
                o.apart = int(np.abs(_ordinal(xu[neq], f.bits) - _ordinal(bu[neq], f.bits)).max()) \
                    if o.mism else 0
            else:
                _plain_base(o, x, b64, vals[j], base, xb, bb, f, bf)
        return outs, shared

    parts = parallel_map(work, list(range(len(leaves))), n)
    tots, ref = _totals(vals, parts, tree, rv)
    return assemble(vals, n, tots, ref)


def _totals(vals: list, parts: list, tree, rv) -> tuple:
    """The leaves' partial metrics (``parts``: per leaf, a ``_Leaf`` per result and the
    reference's partial sums) combined: counts added, maxima taken, sums over NumPy's
    pairwise tree. Returns (per-result totals, the reference's totals or None)."""
    base = vals[0]
    tots = []
    for j, v in enumerate(vals):
        ls = [p[0][j] for p in parts]
        t = {"mism": sum(o.mism for o in ls), "nan_mism": sum(o.nan_mism for o in ls),
             "has_nan": any(o.has_nan for o in ls)}
        if v.dt is base.dt:
            t["apart"] = max(o.apart for o in ls)
        else:
            ap = [o.apart for o in ls if o.apart is not None]
            t["apart"] = max(ap) if ap else None
        if rv is not None:
            # worst element: the first largest ulp error (NaN counts largest, as in max)
            best_v, best_i = None, None
            for o in ls:
                if best_v is None or (not math.isnan(best_v)
                                      and (math.isnan(o.ue_max) or o.ue_max > best_v)):
                    best_v, best_i = o.ue_max, o.ue_arg
            t.update(abs_max=_nanmax([o.abs_max for o in ls]),
                     abs_sum=_tree_sum(tree, [o.abs_sum for o in ls]),
                     rel_max=_nanmax([o.rel_max for o in ls]),
                     sq_sum=_tree_sum(tree, [o.sq_sum for o in ls]),
                     ue_max=best_v, ue_arg=best_i,
                     ue_sum=_tree_sum(tree, [o.ue_sum for o in ls]),
                     ok=sum(o.ok for o in ls))
        tots.append(t)
    ref = None
    if rv is not None:
        ref = {"r_sq": _tree_sum(tree, [p[1]["r_sq"] for p in parts]),
               "r_absmax": max(p[1]["r_absmax"] for p in parts)}
    return tots, ref


def assemble(vals: list, n: int, tots: list, ref: dict | None) -> dict:
    """scan()'s result from the whole tensors' totals: per result (``tots[j]``) the counts
    (mism, nan_mism, ok), maxima (apart, abs_max, rel_max, ue_max with its first index
    ue_arg), NaN flag and the pairwise sums (abs_sum, sq_sum, ue_sum); for the reference
    the sum of squares and the largest finite magnitude (-inf when none). The CPU scan and
    castlab's own kernels (ops/compare.h) both end here."""
    base = vals[0]
    rows, worst, has_nan = [], [], []
    ref_rms = None
    rel_scale = None
    if ref is not None:
        ref_rms = float(np.sqrt(np.float64(ref["r_sq"]) / n))
        m = ref["r_absmax"]
        rel_scale = m if m >= 0 else 0.0
    for j, v in enumerate(vals):
        f = _fmt(v.dt)
        t = tots[j]
        row: dict = {"dtype": v.dt.name, "numel": n}
        row["mismatches"] = int(t["mism"])
        row["mismatch_fraction"] = row["mismatches"] / n
        row["nan_mismatches"] = int(t["nan_mism"])
        if v.dt is base.dt:
            row["max_ulp_apart"] = int(t["apart"])
        else:
            row["max_ulp_apart"] = 0.0 if t["apart"] is None else float(t["apart"])
        has_nan.append(bool(t["has_nan"]))
        if ref is not None:
            row["max_abs_error"] = float(t["abs_max"])
            row["mean_abs_error"] = float(np.float64(t["abs_sum"]) / n)
            row["max_rel_error"] = float(t["rel_max"])
            row["rmse"] = float(np.sqrt(np.float64(t["sq_sum"]) / n))
            rms = ref_rms
            row["rel_rmse"] = row["rmse"] / rms if rms else (0.0 if row["rmse"] == 0 else math.inf)
            row["max_ulp_error"] = float(t["ue_max"])
            row["mean_ulp_error"] = float(np.float64(t["ue_sum"]) / n)
            su = float(_ulp_np(np.array([rel_scale]), f)[0])
            row["max_ulp_error_at_scale"] = row["max_abs_error"] / su
            row["correctly_rounded"] = float(np.float64(int(t["ok"])) / n)
            worst.append(int(t["ue_arg"]))
        else:
            worst.append(None)
        rows.append(row)
    return {"rows": rows, "worst": worst, "ref_rms": ref_rms, "has_nan": has_nan,
            "scale": rel_scale}


def kernel_scan(vals: list, tensors: list, ref_tensor, tol: float) -> dict:
    """scan()'s result computed by castlab's own code on the tensors' device
    (``_C._compare``: ops/compare.h, the same definitions and NumPy's summation tree), for
    contiguous castlab tensors of one size. Adds ``"not_close"``: per result of the first
    one's dtype, the elements where torch.isclose(first, result, tol, tol) fails."""
    ref, tots = _C._compare(tensors, ref_tensor, float(tol))
    base = vals[0]
    not_close = []
    for j, (v, t) in enumerate(zip(vals, tots)):
        if j == 0:
            t["apart"] = 0
        elif v.dt is base.dt:
            t["apart"] = t["apart_i"]
        else:
            t["apart"] = None if t["apart_f"] == -math.inf else t["apart_f"]
        not_close.append(t["not_close"] if (j > 0 and v.dt is base.dt) else None)
    st = assemble(vals, tensors[0].numel(), tots, None if ref_tensor is None else ref)
    st["not_close"] = not_close
    return st


def _plain_ref(o, lo, x, r, f, crb) -> None:
    """The reference metrics of one chunk, by the plain definitions."""
    with np.errstate(all="ignore"):
        both_nan = np.isnan(x) & np.isnan(r)
        d = x - r
        err = np.where(both_nan, 0.0, np.abs(d))
        rel = np.where(r == 0, np.where(err == 0, 0.0, np.inf), err / np.abs(r))
        o.abs_max = float(err.max())
        o.abs_sum = float(np.add.reduce(err))
        o.rel_max = float(rel.max())
        o.sq_sum = float(np.add.reduce(np.square(d)))
        ue = _ulp_error_np(x, r, f)
        a = int(np.argmax(ue))
        o.ue_arg, o.ue_max = lo + a, float(ue[a])
        o.ue_sum = float(np.add.reduce(ue))
        cr = _f64(crb)
        o.ok = int(np.count_nonzero((cr == x) | (np.isnan(cr) & np.isnan(x))))
        o.has_nan = bool(np.isnan(x).any())


def _plain_base(o, x, b64, v, base, xb, bb, f, bf) -> None:
    """The metrics against the first result of one chunk, by the plain definitions."""
    xn, bn = np.isnan(x), np.isnan(b64)
    o.mism = int(np.count_nonzero(~((x == b64) | (xn & bn))))
    o.nan_mism = int(np.count_nonzero(xn ^ bn))
    if v.dt is base.dt:
        d, _ = _ulp_diff_np(_Val(xb, v.dt, "cpu"), _Val(bb, base.dt, "cpu"))
        o.apart = int(d.max()) if d.size else 0
    else:
        # the coarser one's ulp error at the finer one
        e = _ulp_error_np(x, b64, f) if f.p <= bf.p else _ulp_error_np(b64, x, bf)
        e = e[~np.isnan(e)]
        o.apart = float(e.max()) if e.size else None



# ================================================================ drift

_DRIFT_LEAF = 1 << 17   # drift's chunks: fewer, larger NumPy calls (1 MiB float64
                        # temporaries) measured fastest on 2 cores: 0.9 s vs 1.5 s at 2**15
_ROUND_LOCK = threading.Lock()   # castlab's conversion, called from the worker threads


def _round_ieee(v: np.ndarray, u: np.ndarray, f) -> np.ndarray:
    """Finite float64 `v` rounded once to format `f` (bf16, fp16 or fp32: IEEE overflow to
    inf), nearest, ties to even, given u = ulp(v, f): v / u is exact (u is a power of two
    at least 2**(emin-p)), ``rint`` rounds it to an integer (ties to even) and the product
    with u is exact; beyond the largest finite value it is inf. The value castlab's
    conversion (core/convert.h, round_f64_to_bits) gives, as float64."""
    q = np.rint(v / u)
    q *= u
    big = np.abs(q) > f.max
    if big.any():
        q[big] = np.copysign(np.inf, v[big])
    return q


def _plain_round(v: np.ndarray, f) -> np.ndarray:
    with _ROUND_LOCK:
        return _round_np(v, f)


def drift_kernel(xs: list, r, f, diverge: bool) -> dict:
    """drift()'s metrics of one node: :func:`drift_scan`'s result computed by castlab's
    own code on the tensors' device
    (``_C._compare``, ops/scalar/compare.h, with every result measured in ulps of `f` and
    rounded to `f`): the same definitions and NumPy's summation tree, so the same bits.
    `xs` and `r`: castlab tensors of one shape on one device, at most
    ``_C.CMP_MAX_RESULTS`` results; no float64 copy is made and nothing but the totals
    leaves the device."""
    n = r.numel()
    nx = len(xs)
    if n == 0:   # the plain definitions' values, as drift_scan
        return {"rows": [(0.0, 0.0, math.inf, 1.0)] * nx, "mismatches": 0,
                "differs": [False] * (nx - 1)}
    xs = [x.contiguous() for x in xs]
    ref, tots = _C._compare(xs, r.contiguous(), 0.0, [f.dt.name] * nx)
    rms = float(np.sqrt(np.float64(ref["r_sq"]) / n))
    rows = []
    for t in tots:
        mean = float(np.float64(t["ue_sum"]) / n)
        e = float(np.sqrt(np.float64(t["sq_sum"]) / n))
        rr = e / rms if rms else (0.0 if e == 0 else math.inf)
        rows.append((float(t["ue_max"]), mean, rr, float(np.float64(int(t["ok"])) / n)))
    res: dict = {"rows": rows}
    if diverge and nx > 1:
        res["mismatches"] = int(ref["union_mism"])
        res["differs"] = [int(t["mism"]) > 0 for t in tots[1:]]
    return res


def drift_scan(xs: list, r: np.ndarray, f, diverge: bool) -> dict:
    """drift()'s metrics of one node: each array of `xs` (the node's values under one
    policy/math, any float dtype, e.g. fp32 registers) against `r` (the fp64 policy's
    values), in ulps of `f` (the node's dtype), in one chunked, threaded pass.

    Returns {"rows": [(max_ulp, mean_ulp, rel_rmse, correctly_rounded) per x],
    "mismatches": elements where some x differs from xs[0] (float equality, NaN equals
    NaN), "differs": [bool per x after the first]} (the last two when `diverge`).

    The values are those of the plain definitions on whole float64 arrays
    (``_ulp_error_np``; ``np.mean``/``np.max``; rmse / rms; both rounded once to `f` with
    castlab's conversion and compared): sums follow NumPy's pairwise tree
    (:func:`_pairwise_tree`), the direct rounding of finite chunks to bf16/fp16/fp32 is
    :func:`_round_ieee`; a chunk with a NaN or an infinity, and other formats, take the
    plain definitions on that chunk."""
    shape = np.broadcast_shapes(r.shape, *[x.shape for x in xs])
    if r.shape != shape or any(x.shape != shape for x in xs):
        r = np.ascontiguousarray(np.broadcast_to(r, shape))
        xs = [np.ascontiguousarray(np.broadcast_to(x, shape)) for x in xs]
    n = int(np.prod(shape)) if shape else 1
    nx = len(xs)
    if n == 0:   # the plain definitions' values (np.mean of nothing is NaN: rel_rmse inf)
        return {"rows": [(0.0, 0.0, math.inf, 1.0)] * nx, "mismatches": 0,
                "differs": [False] * (nx - 1)}
    rflat = _flat(r)
    xflats = [_flat(x) for x in xs]
    fast_fmt = f.bits in (16, 32) and f.has_inf
    ident = [f.bits == 64 or (f.bits >= 16 and x.dtype == np.dtype(f.dt.numpy)) for x in xs]
    leaves, tree = _pairwise_tree(n, 1 << 18)
    diverge = diverge and nx > 1

    def work(k):
        lo, hi = leaves[k]
        r = _f64(rflat[lo:hi])
        out = []
        crr = crr_plain = None
        with np.errstate(all="ignore"):
            r_sq = float(np.add.reduce(np.square(r)))
            ur = _ulp_np(r, f)
            rfin = math.isfinite(float(np.abs(r).max()))
            for j in range(nx):
                x = _f64(xflats[j][lo:hi])
                d = x - r
                ad = np.abs(d)
                fin = rfin and math.isfinite(float(ad.max()))
                if fin:                  # x and r finite
                    ue = np.divide(ad, ur, out=ad)
                    ue_max = float(ue.max())
                    ue_sum = float(np.add.reduce(ue))
                    sq = float(np.add.reduce(np.square(d, out=d)))
                else:
                    ue = _ulp_error_np(x, r, f)
                    ue_max = float(np.max(ue))
                    ue_sum = float(np.add.reduce(ue))
                    sq = float(np.add.reduce(np.square(x - r)))
                if fin and (ident[j] or fast_fmt):
                    if crr is None:
                        crr = r if f.bits == 64 else _round_ieee(r, ur, f)
                    cx = x if ident[j] else _round_ieee(x, _ulp_np(x, f), f)
                    ok = int(np.count_nonzero(crr == cx))
                else:
                    if crr_plain is None:
                        crr_plain = _plain_round(r, f)
                    cx = _plain_round(x, f)
                    ok = int(np.count_nonzero((crr_plain == cx)
                                              | (np.isnan(crr_plain) & np.isnan(cx))))
                out.append((ue_max, ue_sum, sq, ok))
            mism, differs = 0, []
            if diverge:
                x0 = xflats[0][lo:hi]
                diff = None
                for j in range(1, nx):
                    a, b = xflats[j][lo:hi], x0
                    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
                        a, b = _f64(a), _f64(b)
                    eq = a == b
                    if not eq.all():
                        eq |= np.isnan(a) & np.isnan(b)
                    neq = np.logical_not(eq, out=eq)
                    differs.append(bool(neq.any()))
                    diff = neq if diff is None else np.logical_or(diff, neq, out=diff)
                mism = int(np.count_nonzero(diff))
        return out, r_sq, mism, differs

    parts = parallel_map(work, list(range(len(leaves))), n)

    rms = float(np.sqrt(np.float64(_tree_sum(tree, [p[1] for p in parts])) / n))
    rows = []
    for j in range(nx):
        ls = [p[0][j] for p in parts]
        mx = _nanmax([o[0] for o in ls])
        mean = float(np.float64(_tree_sum(tree, [o[1] for o in ls])) / n)
        e = float(np.sqrt(np.float64(_tree_sum(tree, [o[2] for o in ls])) / n))
        rr = e / rms if rms else (0.0 if e == 0 else math.inf)
        crf = float(np.float64(sum(o[3] for o in ls)) / n)
        rows.append((mx, mean, rr, crf))
    res: dict = {"rows": rows}
    if diverge:
        res["mismatches"] = sum(p[2] for p in parts)
        res["differs"] = [any(p[3][j] for p in parts) for j in range(nx - 1)]
    return res
