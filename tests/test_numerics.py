"""Tests of castlab.numerics and castlab.plot against independently computed answers:
ml_dtypes/NumPy nextafter and spacing, sorted tables of every value of a format,
exact rationals (fractions.Fraction), PyTorch's own same() and assert_close."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
from castlab import numerics as nm
from castlab.numerics import _formats as nmf  # private helpers: _fmt, _round_np, _Val

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast")

NARROW = [cl.bfloat16, cl.float16, cl.float8_e4m3fn, cl.float8_e5m2]


def all_values(dt) -> np.ndarray:
    """Every bit pattern of a 16- or 8-bit format, as an array of that format."""
    u = {1: np.uint8, 2: np.uint16}[dt.itemsize]
    return np.arange(2 ** (8 * dt.itemsize), dtype=np.uint64).astype(u).view(dt.numpy)


def value_ranks(vals: np.ndarray) -> tuple:
    """Rank of every non-NaN value among the format's distinct values (+0 == -0)."""
    f = vals.astype(np.float64)
    ok = ~np.isnan(f)
    table = np.unique(f[ok])  # sorted, -0 and +0 merged
    return np.searchsorted(table, f[ok]), ok, table


def ref_round(r: float, table: np.ndarray, dt, saturate: bool) -> float:
    """Correct rounding by exact rationals, using the sorted table of finite values."""
    finite = table[np.isfinite(table)]
    mx = finite[-1]
    if math.isnan(r):
        return math.nan
    i = np.searchsorted(finite, r)
    if i < len(finite) and finite[i] == r:
        return r
    if i == 0 or i == len(finite):  # beyond the largest finite value
        fr = nmf._fmt(dt)
        umax = math.ldexp(1.0, fr.emax - fr.p)
        thr = Fraction(mx) + Fraction(umax) / 2
        a = Fraction(abs(r))
        if a < thr:
            return math.copysign(mx, r)
        big = mx if saturate else (math.inf if fr.has_inf else math.nan)
        return math.copysign(big, r)
    lo, hi = finite[i - 1], finite[i]
    dlo, dhi = Fraction(r) - Fraction(lo), Fraction(hi) - Fraction(r)
    if dlo < dhi:
        return lo
    if dhi < dlo:
        return hi
    blo = np.array([lo]).astype(dt.numpy).view({1: np.uint8, 2: np.uint16}[dt.itemsize])[0]
    return lo if int(blo) % 2 == 0 else hi


# ------------------------------------------------------------------ ulp_diff


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_ulp_diff_adjacent_patterns_exhaustive(dt):
    v = all_values(dt)
    f = v.astype(np.float64)
    fin = np.isfinite(f) & (f < float(ml_dtypes.finfo(dt.numpy).max))
    a = v[fin]
    up = np.nextafter(a, np.full(a.shape, np.inf, dtype=np.float64).astype(dt.numpy)) \
        if dt.itemsize == 2 else None
    if up is None:  # fp8: no nextafter ufunc guaranteed; the next pattern of a positive value
        ranks, ok, table = value_ranks(v)
        up = table[np.searchsorted(table, a.astype(np.float64)) + 1].astype(dt.numpy)
    d = nm.ulp_diff(cl.from_numpy(a), cl.from_numpy(up)).numpy()
    # -0 -> nextafter is the smallest subnormal: 1 ulp, as from +0
    assert (d == 1).all(), np.unique(d)


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_ulp_diff_random_pairs_vs_rank_table(dt):
    v = all_values(dt)
    ranks, ok, table = value_ranks(v)
    vals = v[ok]
    rng = np.random.default_rng(0)
    i = rng.integers(0, len(vals), 200_000)
    j = rng.integers(0, len(vals), 200_000)
    d = nm.ulp_diff(cl.from_numpy(vals[i]), cl.from_numpy(vals[j])).numpy()
    np.testing.assert_array_equal(d, np.abs(ranks[i] - ranks[j]))


def test_ulp_diff_every_bf16_fp16_pattern_against_its_neighbour_in_value_order():
    for dt in (cl.bfloat16, cl.float16):
        v = all_values(dt)
        ranks, ok, table = value_ranks(v)
        # every non-NaN pattern vs the value 1000 ranks further up (clipped): distance known
        tgt = np.minimum(ranks + 1000, len(table) - 1)
        b = table[tgt].astype(dt.numpy)
        d = nm.ulp_diff(cl.from_numpy(v[ok]), cl.from_numpy(b)).numpy()
        np.testing.assert_array_equal(d, tgt - ranks)


def test_ulp_diff_nan_zero_inf_semantics():
    a = cl.tensor([0.0, np.nan, np.nan, 1.0, np.inf, -np.inf], dtype=cl.bfloat16)
    b = cl.tensor([-0.0, np.nan, 2.0, np.nan, 3.3895313892515355e38, np.inf], dtype=cl.float32).astype(cl.bfloat16)
    d, m = nm.ulp_diff(a, b, return_nan_mask=True)
    assert d.dtype == cl.int64 and m.dtype == cl.bool
    assert d.tolist()[:4] == [0, 0, -1, -1]
    assert d.tolist()[4] == 1                       # max finite is 1 ulp below inf
    assert d.tolist()[5] == 2 * 0x7F80              # -inf to +inf
    assert m.tolist() == [False, False, True, True, False, False]
    # NaN payloads do not matter
    n1 = np.array([0x7FC0, 0x7F81, 0xFFFF], np.uint16).view(ml_dtypes.bfloat16)
    n2 = np.array([0x7FFF, 0xFFC0, 0x7FC0], np.uint16).view(ml_dtypes.bfloat16)
    assert nm.ulp_diff(cl.from_numpy(n1), cl.from_numpy(n2)).tolist() == [0, 0, 0]


def test_ulp_diff_fp32_fp64_and_broadcast():
    x = np.array([1.0, -1.0, 2.0**-149, 3.0], np.float32)
    y = np.nextafter(x, np.float32(np.inf))
    assert nm.ulp_diff(cl.from_numpy(x), cl.from_numpy(y)).tolist() == [1, 1, 1, 1]
    z = np.array([1.0, -np.finfo(np.float64).max])
    w = np.array([np.nextafter(1.0, 2.0), np.finfo(np.float64).max])
    d = nm.ulp_diff(cl.from_numpy(z), cl.from_numpy(w)).tolist()
    assert d[0] == 1 and d[1] == 2**63 - 1          # saturated, documented
    row = cl.tensor([[1.0, 2.0]], dtype=cl.bfloat16)
    col = cl.tensor([[1.0], [1.0078125]], dtype=cl.bfloat16)
    assert nm.ulp_diff(row, col).tolist() == [[0, 128], [1, 127]]


# ------------------------------------------------------------------ ulp / ulp_error

@pytest.mark.parametrize("dt", [cl.bfloat16, cl.float16, cl.float8_e5m2], ids=lambda d: d.name)
def test_ulp_matches_spacing_exhaustive(dt):
    v = all_values(dt)
    f = v.astype(np.float64)
    fin = np.isfinite(f) & (f >= 0) & (f < float(ml_dtypes.finfo(dt.numpy).max))
    a = v[fin]
    if dt is cl.float16:
        sp = np.spacing(a).astype(np.float64)                    # NumPy's own
    else:
        up = np.nextafter(a, np.full(a.shape, np.inf).astype(dt.numpy))  # ml_dtypes
        sp = up.astype(np.float64) - a.astype(np.float64)
    np.testing.assert_array_equal(nm.ulp(cl.from_numpy(a.astype(np.float64)), dt).numpy(), sp)


def test_ulp_error_known_answers():
    x = cl.tensor([1.0, 1.0, 0.0, 1.0], dtype=cl.bfloat16)
    r = cl.tensor([1 + 2**-9, 1 - 2**-10, 2**-134, math.nan], dtype=cl.float64)
    e = nm.ulp_error(x, r).tolist()
    assert e[0] == 0.25                 # ulp(1) = 2^-7
    assert e[1] == 0.25                 # below 1 the spacing is 2^-8: uses ref's binade
    assert e[2] == 0.5                  # subnormal spacing 2^-133
    assert math.isnan(e[3])
    both = nm.ulp_error(cl.tensor([math.nan, math.inf]), cl.tensor([math.nan, math.inf], dtype=cl.float64))
    assert both.tolist() == [0.0, 0.0]
    # dtype override: an fp32 register value measured in bf16 ulps
    assert nm.ulp_error(cl.tensor([1.0]), cl.tensor([1 + 2**-8], dtype=cl.float64),
                        dtype=cl.bfloat16).tolist() == [0.5]


@pytest.mark.parametrize("dt", NARROW + [cl.float32], ids=lambda d: d.name)
def test_correct_rounding_has_at_most_half_ulp_error(dt):
    rng = np.random.default_rng(1)
    mx = float(ml_dtypes.finfo(dt.numpy).max)
    r = rng.uniform(-1, 1, 20000) * np.exp2(rng.uniform(-20, math.log2(mx) - 0.01, 20000))
    rounded = nm.round_to(cl.from_numpy(r), dt)
    assert rounded.dtype == dt
    assert float(nm.ulp_error(rounded, cl.from_numpy(r)).numpy().max()) <= 0.5


# ------------------------------------------------------------------ direct rounding

def test_double_rounding_case_T8():
    x = 1 + 2**-8 + 2**-30
    r = cl.tensor([x], dtype=cl.float64)
    assert nm.round_to(r, cl.bfloat16).tolist() == [1.0078125]          # direct
    via_fp32 = np.array([x]).astype(np.float32).astype(ml_dtypes.bfloat16)
    assert float(via_fp32[0]) == 1.0                                    # double rounding
    lo, hi, mid = nm.neighbours(r, cl.bfloat16)
    assert (lo.tolist(), hi.tolist(), mid.tolist()) == ([1.0], [1.0078125], [1 + 2**-8])


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_round_to_vs_exact_rationals(dt):
    v = all_values(dt)
    _, _, table = value_ranks(v)
    finite = table[np.isfinite(table)]
    rng = np.random.default_rng(2)
    # random values, exact midpoints, and midpoints +- 1 fp64 ulp; plus overflow region
    k = rng.integers(0, len(finite) - 1, 700)
    mids = np.array([float((Fraction(finite[i]) + Fraction(finite[i + 1])) / 2) for i in k])
    r = np.concatenate([rng.uniform(finite[0], finite[-1], 700), mids, np.nextafter(mids, np.inf),
                        np.nextafter(mids, -np.inf), finite[-1] * np.array([1.01, 1.03, 1.2, -1.04])])
    for sat in (True, False):
        got = nmf._round_np(r, nmf._fmt(dt), saturate=sat)
        want = np.array([ref_round(float(x), table, dt, sat) for x in r])
        np.testing.assert_array_equal(got, want)


def test_round_to_overflow_conventions():
    r = cl.tensor([1e39, -1e39, math.inf, 70000.0, 465.0, 464.0], dtype=cl.float64)
    assert nm.round_to(r, cl.bfloat16).tolist()[:3] == [math.inf, -math.inf, math.inf]
    assert nm.round_to(r, cl.float16).tolist()[3] == math.inf
    e4 = nm.round_to(r, cl.float8_e4m3fn).tolist()
    assert e4[4:] == [448.0, 448.0]                     # saturating (castlab's default)
    e4n = nm.round_to(r, cl.float8_e4m3fn, saturate=False).tolist()
    assert math.isnan(e4n[4]) and e4n[5] == 448.0       # ml_dtypes / OCP non-saturating


# ------------------------------------------------------------------ near ties

def test_near_ties_midpoints_by_exact_rationals():
    v = all_values(cl.bfloat16)
    _, _, table = value_ranks(v)
    finite = table[np.isfinite(table) & (table > 2.0**-120)]
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(finite) - 1, 500)
    vals, inside = [], []
    for i in idx:
        lo, hi = Fraction(finite[i]), Fraction(finite[i + 1])
        mid, u = (lo + hi) / 2, hi - lo
        for off, expect in ((Fraction(0), True), (u / 256, True), (-u / 128, True),
                            (u / 64, False), (-u / 32, False), (u / 2, False)):
            vals.append(float(mid + off))   # exactly representable in fp64
            assert Fraction(vals[-1]) == mid + off
            inside.append(expect)
    r = cl.from_numpy(np.array(vals))
    nt = nm.near_ties(r, cl.bfloat16, within=0.01)
    np.testing.assert_array_equal(nt.mask.numpy(), np.array(inside))
    lo, hi, mid = nm.neighbours(r, cl.bfloat16)
    exact_mid = [float((Fraction(finite[i]) + Fraction(finite[i + 1])) / 2) for i in idx]
    np.testing.assert_array_equal(mid.numpy()[0::6], exact_mid)


def test_near_ties_mismatch_split():
    r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-30, 1.25, 1.5], dtype=cl.float64)
    nt = nm.near_ties(r, cl.bfloat16, within=0.01)
    a = cl.tensor([1.0, 1.0, 1.25, 1.5], dtype=cl.bfloat16)
    b = cl.tensor([1.0078125, 1.0078125, 1.25, 1.0], dtype=cl.bfloat16)
    s = nt.mismatch_rate(a, b)
    assert (s.inside_mismatches, s.inside_count, s.outside_mismatches, s.outside_count) == (2, 2, 1, 2)
    assert s.inside_rate == 1.0 and s.outside_rate == 0.5 and abs(s.share_inside - 2 / 3) < 1e-12
    assert "near ties" in str(s)
    with pytest.raises(ValueError, match="within"):
        nm.near_ties(r, cl.bfloat16, within=0.5)
    with pytest.raises(ValueError, match="more precise"):
        nm.near_ties(a, cl.bfloat16)


# ------------------------------------------------------------------ compare

def test_compare_known_rmse():
    ref = cl.tensor([1.0, 2.0, 3.0, 4.0], dtype=cl.float64)
    good = cl.tensor([1.0, 2.0, 3.0, 4.0])
    bad = cl.tensor([1.0, 2.0, 3.0, 5.0])
    c = nm.compare(good, bad, ref=ref, names=["good", "bad"])
    g, b = c["good"], c["bad"]
    assert g["rmse"] == 0 and g["correctly_rounded"] == 1.0 and g["same"] is None
    assert b["mismatches"] == 1 and b["mismatch_fraction"] == 0.25
    assert b["max_ulp_apart"] == 2**21                     # 4 -> 5 in fp32: 2^21 steps
    assert b["max_abs_error"] == 1.0 and b["mean_abs_error"] == 0.25
    assert b["max_rel_error"] == 0.25
    assert b["rmse"] == 0.5
    assert b["rel_rmse"] == pytest.approx(0.5 / math.sqrt(30 / 4), rel=1e-15)
    assert b["max_ulp_error"] == 2**21 and b["correctly_rounded"] == 0.75
    assert not b["same"]            # 0.5 > 3 * 0 + 1e-5
    d = c.to_dict()
    assert set(d) == {"good", "bad"} and d["bad"]["rmse"] == 0.5
    s = str(c)
    assert "bad" in s and "RMSE" in s and "baseline" in s
    assert "<table" in c._repr_html_()
    pd = pytest.importorskip("pandas")
    fr = c.to_frame()
    assert isinstance(fr, pd.DataFrame) and fr.loc["bad", "rmse"] == 0.5


def test_compare_bf16_correctly_rounded_and_dict_input():
    rng = np.random.default_rng(4)
    r = rng.standard_normal(3000)
    cr = nm.round_to(cl.from_numpy(r), cl.bfloat16)
    trunc = cl.from_numpy(r.astype(np.float32)).astype(cl.bfloat16)   # fp32 path: double rounding
    c = nm.compare({"direct": cr, "via_fp32": trunc}, ref=cl.from_numpy(r))
    assert c["direct"]["correctly_rounded"] == 1.0
    assert c["direct"]["max_ulp_error"] <= 0.5
    assert 0.99 < c["via_fp32"]["correctly_rounded"] <= 1.0
    assert c["via_fp32"]["max_ulp_apart"] <= 1


def test_compare_mixed_dtypes_and_nan():
    a = cl.tensor([1.0, math.nan, 2.0], dtype=cl.bfloat16)
    b = cl.tensor([1.001, math.nan, math.nan])
    c = nm.compare(a, b)
    assert c[1]["mismatches"] == 2 and c[1]["nan_mismatches"] == 1
    assert isinstance(c[1]["max_ulp_apart"], float)
    assert c[1]["same"].passed is False and "dtype" in c[1]["same"].reason


# ------------------------------------------------------------------ PyTorch's same() and assert_close

torch = pytest.importorskip("torch")


def _t2c(t):
    return cl.from_dlpack(t)


def _same_cases():
    g = torch.Generator().manual_seed(0)
    out = []
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for n in (64, 4096):
            x = torch.randn(n, generator=g, dtype=torch.float64)
            ref = x.to(dt)
            noise = torch.randn(n, generator=g, dtype=torch.float64)
            for scale in (0.0, 1e-5, 3e-3, 1e-2, 3e-2):
                res = (x * (1 + scale * noise)).to(dt)
                out.append((ref, res, x))
            out.append((ref, ref.clone(), x))
    return out


def test_same_matches_torch_dynamo_same():
    from torch._dynamo.utils import same as torch_same

    cases = _same_cases()
    verdicts = []
    for ref, res, fp64 in cases:
        want = torch_same(ref, res, fp64, log_error=lambda *a, **k: None)
        got = nm.same(_t2c(ref), _t2c(res), _t2c(fp64))
        assert bool(got) == want, (ref.dtype, got)
        verdicts.append(want)
    assert any(verdicts) and not all(verdicts)   # both outcomes exercised


def test_same_on_swiglu_eager_vs_fused_matches_torch():
    from torch._dynamo.utils import same as torch_same

    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    x = cl.randn(64, 64, seed=5, dtype=cl.bfloat16)
    ys = {p: sw.run(x, policy=p) for p in ("eager", "fused", "fp64")}
    tt = {p: torch.from_dlpack(v) for p, v in ys.items()}
    c = nm.compare(ys["eager"], ys["fused"], ref=ys["fp64"])
    assert bool(c[1]["same"]) == torch_same(tt["eager"], tt["fused"], tt["fp64"],
                                            log_error=lambda *a, **k: None)
    assert bool(nm.same(ys["fused"], ys["eager"], ys["fp64"])) == torch_same(
        tt["fused"], tt["eager"], tt["fp64"], log_error=lambda *a, **k: None)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_assert_close_message_matches_torch(dt):
    g = torch.Generator().manual_seed(7)
    e = torch.randn(40, 30, generator=g).to(dt)
    a = (e.double() * (1 + 0.02 * torch.randn(40, 30, generator=g, dtype=torch.float64))).to(dt)
    with pytest.raises(AssertionError) as info:
        torch.testing.assert_close(a, e)
    assert nm.assert_close_message(_t2c(a), _t2c(e)) == str(info.value)
    assert nm.assert_close_message(_t2c(e), _t2c(e.clone())) is None


def test_comparison_assert_close_message_against_first():
    e = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    a = torch.tensor([1.0, 2.5, 3.0], dtype=torch.bfloat16)
    with pytest.raises(AssertionError) as info:
        torch.testing.assert_close(a, e)
    c = nm.compare(_t2c(e), _t2c(a), names=["base", "cand"])
    assert c.assert_close_message("cand") == str(info.value)
    assert c.assert_close_message(0) is None
    with pytest.raises(ValueError, match="no reference"):
        c.assert_close_message(1, against="ref")
    with pytest.raises(IndexError):
        c.assert_close_message(5)


# ------------------------------------------------------------------ the seed-1234 element

@pytest.fixture(scope="module")
def seed1234():
    torch.manual_seed(1234)
    xt = torch.rand(512, 256).to(torch.bfloat16)

    @cl.jit
    def swiglu(x):
        a, b = cl.chunk(x, 2, dim=-1)
        return cl.silu(a) * b

    return swiglu, cl.from_dlpack(xt)


def test_seed1234_inductor_vs_te_differ_in_exactly_one_element(seed1234):
    sw, x = seed1234
    yi = sw.run(x, math="inductor")
    yt = sw.run(x, math="transformer_engine")
    c = nm.compare(yi, yt, ref=sw.run(x, policy="fp64"), names=["inductor", "te"])
    assert c["te"]["mismatches"] == 1 and c["te"]["max_ulp_apart"] == 1
    d = np.argwhere(yi.numpy() != yt.numpy())
    assert d.tolist() == [[456, 127]]
    assert float(yi.numpy()[456, 127]) == 0.470703125
    assert float(yt.numpy()[456, 127]) == 0.46875


def test_seed1234_explain(seed1234):
    sw, x = seed1234
    ex = nm.explain(sw, (x,), (456, 127), policies="fused",
                    maths=("inductor", "transformer_engine"))
    ind, te = ex.outcomes
    assert ind.value == float(Fraction("0.469726622104644775390625"))
    assert str(ind.value).startswith("0.46972662")
    assert te.value == 0.4697265625 and te.position.startswith("on the midpoint")
    assert ind.rounded == 0.470703125 and ind.direction == "up" and ind.correct
    assert te.rounded == 0.46875 and te.direction == "down" and not te.correct
    assert str(ex.exact).startswith("0.4697266134")
    assert (ex.lo, ex.hi, ex.midpoint) == (0.46875, 0.470703125, 0.4697265625)
    assert Fraction(ex.midpoint) == (Fraction(ex.lo) + Fraction(ex.hi)) / 2
    assert ex.correctly_rounded == 0.470703125
    s = str(ex)
    for needle in ("0.4697265625", "0.46875", "0.470703125", "0x3EF1", "0x3EF0", "tie",
                   "silu", "x[456, 255]", "0.4697266134790518"):
        assert needle in s, needle
    assert "tie rounds to even, down" in ex.why
    assert "<table" in ex._repr_html_()


def test_explain_eager_shows_value_before_last_rounding(seed1234):
    sw, x = seed1234
    ex = nm.explain(sw, (x,), (456, 127), policies=("eager", "fused"), maths="torch_eager")
    eager = ex.outcomes[0]
    silu_b = np.float32(0.5390625) * np.float32(0.87109375)  # rounded silu times b, in fp32
    assert eager.value == float(silu_b) and eager.rounded == 0.46875
    assert all(o.consistent for o in ex.outcomes)


def test_explain_bad_index_and_fn(seed1234):
    sw, x = seed1234
    with pytest.raises(IndexError, match="out of range"):
        nm.explain(sw, (x,), (512, 0))
    with pytest.raises(IndexError, match="dimensions"):
        nm.explain(sw, (x,), (1,))
    with pytest.raises(TypeError, match="tuple of ints"):
        nm.explain(sw, (x,), (1.5, 2))
    with pytest.raises(TypeError, match="callable"):
        nm.explain(42, (x,), (0, 0))
    # a plain function is wrapped with cl.jit; negative indices work
    ex = nm.explain(lambda a: a * 2.0, (cl.randn(3, 4, seed=0, dtype=cl.bfloat16),), (-1, -1))
    assert ex.index == (2, 3)


# ------------------------------------------------------------------ drift

def test_drift_first_divergence_and_table(seed1234):
    sw, x = seed1234
    d = nm.drift(sw, (x,), policies=("eager", "fused"))
    assert d.first_divergence.op == "silu"
    rows = {(r["node"].split(" ")[0], r["combo"]): r for r in d.rows}
    out_e = rows[("output", "eager/torch_eager")]
    out_f = rows[("output", "fused/torch_eager")]
    assert out_f["max_ulp"] <= 0.5 and out_e["max_ulp"] > 1
    assert out_f["correctly_rounded"] == 1.0 and out_e["correctly_rounded"] < 0.8
    assert "drift starts at" in str(d) and "<table" in d._repr_html_()
    assert len(d.to_frame()) == len(d.rows)
    same_math = nm.drift(sw, (x,), policies="fused", maths=("torch_eager", "portable"))
    assert same_math.first_divergence is None or same_math.first_divergence.op == "silu"
    # on the CPU inductor's math differs from torch_eager's only by GPU-only variants and
    # the implementation of exp (torch_eager's is PyTorch's CPU one, SLEEF)
    ind = dataclasses.replace(cl.Math.preset("inductor"), name="inductor_torch_exp", impl="torch")
    none = nm.drift(sw, (x,), policies=("fused",), maths=("torch_eager", ind))
    assert none.first_divergence is None


# ------------------------------------------------------------------ bad input

def test_bad_inputs():
    a = cl.zeros(3, 4, dtype=cl.bfloat16)
    b = cl.zeros(4, 3, dtype=cl.bfloat16)
    with pytest.raises(ValueError, match="broadcast"):
        nm.compare(a, b)
    with pytest.raises(ValueError, match="broadcast"):
        nm.ulp_diff(a, b)
    with pytest.raises(TypeError, match="one dtype"):
        nm.ulp_diff(a, cl.zeros(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        nm.ulp_diff(cl.arange(3), cl.arange(3))
    with pytest.raises(ValueError, match="less precise"):
        nm.compare(cl.zeros(3), ref=cl.zeros(3, dtype=cl.bfloat16))
    with pytest.raises(ValueError, match="less precise"):
        nm.ulp_error(cl.zeros(3, dtype=cl.bfloat16), cl.zeros(3, dtype=cl.float16))
    fake_gpu = nmf._Val(np.zeros((3, 4), ml_dtypes.bfloat16), cl.bfloat16, "cuda:0")
    with pytest.raises(ValueError, match="different devices"):
        nm.compare(a, fake_gpu)
    with pytest.raises(TypeError, match="expected a castlab"):
        nm.compare(a, object())
    with pytest.raises(ValueError, match="names"):
        nm.compare(a, a, names=["x"])


# ------------------------------------------------------------------ plots

def test_plots(seed1234):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from castlab import plot

    sw, x = seed1234
    ys = {"eager": sw.run(x, policy="eager"), "fused": sw(x)}
    ref = sw.run(x, policy="fp64")
    c = nm.compare(ys, ref=ref)
    assert isinstance(plot.ulp_histogram(c), Figure)
    assert isinstance(plot.ulp_histogram(ys["eager"], ys["fused"], ref=ref), Figure)
    assert isinstance(plot.error_vs_magnitude(ys, ref), Figure)
    assert isinstance(plot.drift_chart(nm.drift(sw, (x,))), Figure)
    with pytest.raises(ValueError, match="reference"):
        plot.ulp_histogram(nm.compare(ys["eager"]))


def test_explain_gradient_value_before_rounding():
    # The backward of silu(a) * b: da is silu_backward's result, one PyTorch kernel
    # that rounds once. Its value before rounding must not be taken from a run that
    # rounds the kernel's inner nodes (eager), and a phase selector (round_after=
    # ("backward",)) rounds it too: rounding the shown value gives the output.
    bwd = cl.jit(lambda a, b: cl.silu(a) * b).backward_fn()
    a = cl.randn(64, 64, seed=0, dtype=cl.bfloat16)
    b = cl.randn(64, 64, seed=1, dtype=cl.bfloat16)
    dy = cl.randn(64, 64, seed=2, dtype=cl.bfloat16)
    saved_fp32 = cl.Policy("saved_fp32", round_after=("backward",))
    e, f = (bwd.run(a, b, dy, policy=p)[0].numpy() for p in ("eager", "fused"))
    for idx in [tuple(int(i) for i in ix) for ix in np.argwhere(e != f)[:5]]:
        ex = nm.explain(bwd, (a, b, dy), idx, policies=("eager", "fused", saved_fp32))
        for o in ex.outcomes:
            assert o.consistent, (idx, o)
        eager, _, sf = ex.outcomes
        assert eager.value_dtype.name == "float32" and eager.value != eager.rounded
        assert sf.value == eager.value   # same rounded inputs to the same kernel
