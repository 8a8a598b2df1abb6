"""compare() at scale: the chunked, threaded metrics (numerics/_metrics.py) equal the
plain NumPy definitions they replace, bit for bit, on random data with NaN, inf,
subnormals and signed zeros; the @scale metric, worst(), differences()."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
import castlab.numerics as nm
from castlab.numerics import _metrics
from castlab.numerics._formats import (
    _float_val,
    _fmt,
    _rmse,
    _round_np,
    _ulp_diff_np,
    _ulp_error_np,
)
from castlab.numerics._torchcheck import _same


def _old_ulp_np(r, f):
    """ulp() as it was computed before the bit version (frexp/ldexp)."""
    a = np.abs(np.asarray(r, dtype=np.float64))
    with np.errstate(all="ignore"):
        pos = np.isfinite(a) & (a > 0)
        _, e = np.frexp(np.where(pos, a, 1.0))
        e = np.where(pos, e.astype(np.int64) - 1, f.emin)
        e = np.maximum(e, f.emin)
        u = np.ldexp(1.0, (e - f.p).astype(np.int32))
        return np.where(np.isnan(a), np.nan, np.where(np.isinf(a), np.inf, u))


def _reference_rows(vals, rv):
    """compare()'s rows by the plain definitions on whole float64 arrays (the code the
    chunked scan replaced)."""
    base = vals[0]
    b64 = base.f64
    r64 = None if rv is None else rv.f64
    n_el = b64.size
    rows = []
    for v in vals:
        x64 = v.f64
        row = {"dtype": v.dt.name, "numel": n_el}
        both_nan = np.isnan(x64) & np.isnan(b64)
        row["mismatches"] = int((~((x64 == b64) | both_nan)).sum())
        row["mismatch_fraction"] = row["mismatches"] / n_el if n_el else 0.0
        row["nan_mismatches"] = int((np.isnan(x64) ^ np.isnan(b64)).sum())
        if v.dt is base.dt:
            d, _ = _ulp_diff_np(v, base)
            row["max_ulp_apart"] = int(d.max()) if d.size else 0
        else:
            coarse, fine = (v, base) if _fmt(v.dt).p <= _fmt(base.dt).p else (base, v)
            e = _ulp_error_np(coarse.f64, fine.f64, _fmt(coarse.dt))
            e = e[~np.isnan(e)]
            row["max_ulp_apart"] = float(e.max()) if e.size else 0.0
        if r64 is not None:
            with np.errstate(all="ignore"):
                err = np.abs(x64 - r64)
                err = np.where(np.isnan(x64) & np.isnan(r64), 0.0, err)
                rel = np.where(r64 == 0, np.where(err == 0, 0.0, np.inf), err / np.abs(r64))
                row["max_abs_error"] = float(err.max())
                row["mean_abs_error"] = float(err.mean())
                row["max_rel_error"] = float(rel.max())
                row["rmse"] = _rmse(x64, r64)
                rms = float(np.sqrt(np.mean(np.square(r64))))
                row["rel_rmse"] = row["rmse"] / rms if rms else (0.0 if row["rmse"] == 0 else math.inf)
                ue = np.abs(x64 - r64) / _old_ulp_np(r64, _fmt(v.dt))
                ue = np.where((np.isnan(x64) & np.isnan(r64))
                              | (np.isinf(x64) & np.isinf(r64) & (x64 == r64)), 0.0, ue)
                ue = np.where(np.isinf(r64) & ~np.isnan(x64) & (x64 != r64), np.inf, ue)
            row["max_ulp_error"] = float(np.max(ue))
            row["mean_ulp_error"] = float(np.mean(ue))
            row["worst_flat"] = int(np.argmax(ue))
            fin = np.abs(r64[np.isfinite(r64)])
            scale = float(fin.max()) if fin.size else 0.0
            row["max_ulp_error_at_scale"] = row["max_abs_error"] / float(
                _old_ulp_np(np.array([scale]), _fmt(v.dt))[0])
            cr = _round_np(r64, _fmt(v.dt))
            row["correctly_rounded"] = float(((cr == x64) | (np.isnan(cr) & np.isnan(x64))).mean())
        rows.append(row)
    return rows


def _nasty(rng, n, dt, ref, p_special=0.002):
    """`ref` rounded to dt, then perturbed: one-ulp steps, and NaN, +-inf, +-0 and
    subnormals sprinkled in."""
    a = _round_np(ref, _fmt(dt)).astype(dt.numpy)
    u = a.view(_fmt(dt).uint)
    bump = rng.random(n) < 0.3
    u[bump] += np.array(1, dtype=u.dtype)
    sp = np.flatnonzero(rng.random(n) < p_special)
    tiny = float(ml_dtypes.finfo(dt.numpy).smallest_subnormal)
    choices = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -3 * tiny], dtype=np.float64)
    a[sp] = choices[rng.integers(0, len(choices), sp.size)].astype(dt.numpy)
    return a


def _same_val(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("n, special", [(3 * (1 << 15) * 5 + 13, True), (1 << 17, False),
                                        (1000, True), (7, True)])
def test_scan_equals_plain_definitions(n, special):
    rng = np.random.default_rng(n)
    ref = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    ref[rng.random(n) < 0.01] = 0.0                       # zeros in the reference
    ref[:3] = [1e-42, -0.0, 3e-39]                         # tiny: subnormal bf16 territory
    if special:
        k = rng.integers(0, n, 4)
        ref[k[:2]] = np.nan
        ref[k[2]] = np.inf
    bf = cl.bfloat16
    xs = [_nasty(rng, n, bf, ref, 0.002 if special else 0.0) for _ in range(3)]
    if not special:
        xs[1] = xs[0].copy()                               # an identical result
    xs.append(_round_np(ref, _fmt(cl.float16)).astype(np.float16))   # another dtype
    xs.append(_round_np(ref, _fmt(cl.float32)).astype(np.float32))
    vals = [_float_val(x, "x") for x in xs]
    rv = _float_val(ref, "ref")
    c = nm.compare(*xs, ref=ref, names=[f"r{i}" for i in range(len(xs))])
    want = _reference_rows(vals, rv)
    for k, (got, exp) in enumerate(zip(c.rows, want)):
        for key, ev in exp.items():
            if key == "worst_flat":
                wi = got["worst_index"]
                assert np.ravel_multi_index(wi, (n,)) == ev, (k, key)
                continue
            assert _same_val(got[key], ev), (k, key, got[key], ev)
        if k:
            sv = _same(vals[0], vals[k], rv, 1e-4)
            assert repr(got["same"]) == repr(sv), (k, got["same"], sv)   # NaN-safe
    # without a reference, and with the per-element arrays the plots read
    c2 = nm.compare(*xs[:3], names=["a", "b", "c"])
    for got, exp in zip(c2.rows, _reference_rows(vals[:3], None)):
        for key, ev in exp.items():
            assert _same_val(got[key], ev), (key, got[key], ev)
    for k in (0, 2):
        assert repr(c2.rows[k].get("same")) == repr(None if k == 0 else _same(vals[0], vals[k], None, 1e-4))
    ue = c.ulp_errors["r1"]
    assert np.array_equal(ue, _ulp_error_np(vals[1].f64, rv.f64, _fmt(bf)), equal_nan=True)


def test_pairwise_tree_matches_numpy_sum():
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 129, 1000, 5 * 4096 + 3, 300001):
        a = rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))
        leaves, tree = _metrics._pairwise_tree(n, 4096)
        parts = [float(np.add.reduce(a[lo:hi])) for lo, hi in leaves]
        assert _metrics._tree_sum(tree, parts) == float(np.sum(a)), n


def test_ulp_error_at_scale_stays_meaningful_under_cancellation():
    # RoPE-like cancellation: the exact result is tiny or 0, the result off by rounding
    ref = np.array([1.0, -2.0, 1e-30, 0.0, 3.0])
    x = np.array([1.0, -2.0, 2.0**-10, 2.0**-9, 3.0]).astype(ml_dtypes.bfloat16)
    c = nm.compare(x, ref=ref, names=["bf16"])
    r = c["bf16"]
    assert r["max_ulp_error"] > 1e30               # per element: explodes
    assert r["max_ulp_error_at_scale"] == pytest.approx(2.0**-9 / 2.0**-6)  # 0.125 ulp of 3.0
    assert r["worst_index"] == (3,)
    w = c.worst("bf16")
    assert w["index"] == (3,) and w["flat_index"] == 3 and w["value"] == 2.0**-9
    assert w["ref"] == 0.0 and w["bits"] == "0x3B00" and w["ref_rounded_bits"] == "0x0000"
    s = str(c)
    assert "max ulp err @scale" in s and "worst index" in s
    assert "explain(fn, args, index) shows why" in s
    assert "ulps of the largest reference magnitude" in c._repr_html_()


def test_differences_lists_differing_bits_in_index_order():
    a = np.array([[1.0, 2.0, np.nan], [0.0, 5.0, 6.0]]).astype(ml_dtypes.bfloat16)
    b = a.copy()
    b[0, 1] = 2.015625
    b[1, 0] = -0.0                                   # +0 vs -0: bits differ
    b[1, 2] = np.nan                                 # NaN vs a number
    bv = b.view(np.uint16)
    bv[0, 2] |= 1                                    # another NaN payload: equal
    d = nm.differences(a, b)
    assert d.count == 3 and [r["index"] for r in d.rows] == [(0, 1), (1, 0), (1, 2)]
    assert [r["ulp_apart"] for r in d.rows] == [1, 0, None]
    assert d.rows[0]["b_bits"] == "0x4001"
    lim = nm.differences(a, b, ref=np.ones((2, 3)), limit=2)
    assert len(lim) == 2 and lim.count == 3 and "first 2 shown" in str(lim)
    assert set(lim.to_frame().columns) >= {"index", "a", "b", "ref", "a_ulp_error", "b_ulp_error"}
    # large: chunks, limit
    n = 3 * (1 << 15) + 5
    x = np.zeros(n, dtype=np.float32)
    y = x.copy()
    y[[3, 1 << 15, n - 1]] = 1.0
    d = nm.differences(x, y)
    assert d.count == 3 and [r["index"] for r in d.rows] == [(3,), (1 << 15,), (n - 1,)]
    assert "differences" in nm.__all__


def test_explain_and_drift_use_the_trace_names_and_readable_decimals():
    @cl.jit
    def mix(q, k):
        return q * k + q

    q = cl.tensor([2.0 ** -140, 1.0], dtype=cl.float32)
    k = cl.tensor([3.0, 1.5], dtype=cl.float32)
    e = nm.explain(mix, (q, k), (0,))
    s = str(e)
    assert "t0 = mul(q, k)" in s and "t1 = add(t0, q)" in s and "%" not in s
    assert "q (input)" in s
    # a subnormal's exact value: 25 digits, the digit count, scientific notation
    assert not re.search(r"\d{31,}", s)
    assert "digits)" in s and "e-42" in s
    d = nm.drift(mix, (q, k))
    assert d.rows[0]["node"] == "t0 = mul(q, k)"
