"""Conversions between castlab's float formats, checked against references nobody here wrote:
ml_dtypes, torch (CPU) and exact rational arithmetic (fractions.Fraction).

Exhaustive where cheap: every bf16/fp16 bit pattern (65,536) and every fp8 pattern (256).
Narrowing is checked on every representable value, every exact midpoint between adjacent
representable values and the fp32 values one ulp either side of them, plus millions of
random fp32 bit patterns. NaN payloads are not compared (NaN == NaN), everything else is
bit-exact.

Reference behaviours worth knowing (torch 2.13 CPU, ml_dtypes 0.6):
- torch fp32 -> float8_e4m3fn *saturates* (1000 -> 448, Inf -> 448); -> float8_e5m2 does not
  (overflow -> Inf). ml_dtypes never saturates (e4m3fn overflow -> NaN, e5m2 -> Inf).
- torch and ml_dtypes round fp64 -> bf16/fp8 through fp32 (double rounding), so fp64
  narrowing is checked against Fraction instead.
"""

from __future__ import annotations

import math
from fractions import Fraction

import _hostcheck
import ml_dtypes
import numpy as np
import pytest

import castlab as cl

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

torch = pytest.importorskip("torch")

BF16, F16, E4, E5 = ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
NP = {cl.bfloat16: BF16, cl.float16: F16, cl.float8_e4m3fn: E4, cl.float8_e5m2: E5,
      cl.float32: np.float32, cl.float64: np.float64}
TORCH = {cl.bfloat16: torch.bfloat16, cl.float16: torch.float16,
         cl.float8_e4m3fn: torch.float8_e4m3fn, cl.float8_e5m2: torch.float8_e5m2,
         cl.float32: torch.float32, cl.float64: torch.float64}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
NARROW = [cl.bfloat16, cl.float16, cl.float8_e4m3fn, cl.float8_e5m2]
# (mantissa bits, min normal exponent, max finite value, has Inf)
FMT = {cl.bfloat16: (7, -126, float(ml_dtypes.finfo(BF16).max), True),
       cl.float16: (10, -14, 65504.0, True),
       cl.float8_e4m3fn: (3, -6, 448.0, False),
       cl.float8_e5m2: (2, -14, 57344.0, True),
       cl.float32: (23, -126, float(ml_dtypes.finfo(np.float32).max), True)}


# ----------------------------------------------------------------------------- helpers

def all_patterns(dt) -> np.ndarray:
    n = 2 ** (8 * dt.itemsize)
    return np.arange(n, dtype=UINT[dt.itemsize]).view(NP[dt])


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.dtype.itemsize])


def isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a.astype(np.float64))  # widening to fp64 is exact in ml_dtypes


def assert_bits_equal(got: np.ndarray, exp: np.ndarray, src: np.ndarray | None = None,
                      what: str = ""):
    """Bit-exact, except that any NaN equals any NaN (payload and sign not compared)."""
    got, exp = np.asarray(got), np.asarray(exp)
    assert got.dtype == exp.dtype, (got.dtype, exp.dtype)
    gn, en = isnan(got), isnan(exp)
    bad = (gn != en) | (~en & (bits(got) != bits(exp)))
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        w = 2 * got.dtype.itemsize
        lines = []
        for i in idx:
            s = f"in={bits(src.ravel()[i:i+1])[0]:#x} ({src.ravel()[i]!r}) " if src is not None else ""
            lines.append(f"  [{i}] {s}got {int(bits(got.ravel()[i:i+1])[0]):#0{w + 2}x} "
                         f"expected {int(bits(exp.ravel()[i:i+1])[0]):#0{w + 2}x}")
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ\n" + "\n".join(lines))


def cl_astype(a: np.ndarray, dt) -> np.ndarray:
    return cl.from_numpy(np.ascontiguousarray(a)).astype(dt).numpy()


def torch_to(a: np.ndarray, dt) -> np.ndarray:
    a = np.ascontiguousarray(a)
    src_cl = cl.as_dtype(a.dtype)
    t = torch.from_numpy(bits(a).view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[a.itemsize]))
    t = t.view(TORCH[src_cl]).to(TORCH[dt])
    ib = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dt.itemsize]
    return t.view(ib).numpy().view(UINT[dt.itemsize]).view(NP[dt])


_SAT = {}
_NONSAT = {}


def cl_astype_policy(a: np.ndarray, dt, **policy) -> np.ndarray:
    """astype through a jit'ed function under a custom policy (saturate, rounding, seed)."""
    key = dt.name
    if key not in _SAT:
        _SAT[key] = cl.jit(lambda x: x.astype(dt))
    pol = cl.Policy("custom", **policy)
    return _SAT[key].run(cl.from_numpy(np.ascontiguousarray(a)), policy=pol).numpy()


def saturate_expected(x: np.ndarray, ref: np.ndarray, dt) -> np.ndarray:
    """ml_dtypes' non-saturating result, with overflow (and Inf inputs) clamped to +-max."""
    out = ref.copy()
    maxv = FMT[dt][2]
    over = ~np.isnan(x.astype(np.float64)) & ~np.isfinite(ref.astype(np.float64))
    out[over] = np.where(np.signbit(x[over]), -maxv, maxv).astype(NP[dt])
    return out


def midpoint_probe_values(dt) -> np.ndarray:
    """Every finite value of `dt`, every exact midpoint between neighbours (including the
    one above max, where overflow starts), and the fp32 values one ulp either side of
    each, with both signs, as float32."""
    v = all_patterns(dt).astype(np.float64)
    v = np.unique(v[np.isfinite(v) & (v >= 0)])
    ext = np.concatenate([v, [v[-1] + (v[-1] - v[-2])]])  # the next value above max
    mids = (ext[:-1] + ext[1:]) / 2  # the last one is where overflow starts
    c = np.concatenate([v, mids])
    c32 = c.astype(np.float32)
    assert np.array_equal(c32.astype(np.float64), c), "midpoints must be exact in fp32"
    inf = np.float32(np.inf)
    c32 = np.concatenate([c32, np.nextafter(c32, inf), np.nextafter(c32, -inf)])
    c32 = np.concatenate([c32, -c32])
    return np.unique(c32)


def random_f32_bits(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def round_fraction(q: Fraction, dt, saturate: bool = True) -> float:
    """Exact round-to-nearest-even of a rational to format dt (unbounded exponent range,
    then overflow), returned as a float (inf for overflow without saturation; the caller
    maps non-Inf formats)."""
    mant, emin, maxv, has_inf = FMT[dt]
    if q == 0:
        return 0.0
    neg = q < 0
    a = -q if neg else q
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, emin)
    ulp = Fraction(2) ** (e - mant)
    n = a / ulp
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    r = fl * ulp
    if r > Fraction(maxv):
        val = maxv if saturate else (math.inf if has_inf else math.nan)
    else:
        val = float(r)
    return -val if neg else val


# ----------------------------------------------------------------------------- widening

@pytest.mark.parametrize("src", NARROW, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", [cl.float32, cl.float64], ids=lambda d: d.name)
def test_widen_exhaustive(src, dst):
    a = all_patterns(src)
    got = cl_astype(a, dst)
    assert got.dtype == NP[dst]
    assert_bits_equal(got, a.astype(NP[dst]), a, f"{src.name}->{dst.name} vs ml_dtypes")
    assert_bits_equal(got, torch_to(a, dst), a, f"{src.name}->{dst.name} vs torch")
    # round trip back is the identity on non-NaN patterns (fp8 saturates Inf by default)
    back = cl_astype(got, src)
    keep = ~isnan(a) & (np.isfinite(a.astype(np.float64)) | (src.itemsize == 2))
    assert np.array_equal(bits(back)[keep], bits(a)[keep])
    assert isnan(back[isnan(a)]).all()


def test_widen_preserves_nan_payload_bf16():
    # bf16 -> fp32 is a 16-bit shift: payloads survive, and 0x7F81 is not turned into Inf.
    a = np.array([0x7F81, 0xFF81, 0x7FC1, 0x7FFF], np.uint16).view(BF16)
    got = bits(cl_astype(a, cl.float32))
    assert got.tolist() == [0x7F810000, 0xFF810000, 0x7FC10000, 0x7FFF0000]


# ----------------------------------------------------------------------------- narrowing fp32

def _check_narrow_f32(x32: np.ndarray, dt, what: str):
    ref_ml = x32.astype(NP[dt])
    got = cl_astype(x32, dt)
    if dt in (cl.bfloat16, cl.float16):
        assert_bits_equal(got, ref_ml, x32, f"{what} f32->{dt.name} vs ml_dtypes")
        assert_bits_equal(got, torch_to(x32, dt), x32, f"{what} f32->{dt.name} vs torch")
        return
    # fp8: castlab saturates by default, ml_dtypes never does.
    assert_bits_equal(got, saturate_expected(x32, ref_ml, dt), x32,
                      f"{what} f32->{dt.name} (saturating) vs ml_dtypes+clamp")
    nonsat = cl_astype_policy(x32, dt, saturate=False)
    assert_bits_equal(nonsat, ref_ml, x32, f"{what} f32->{dt.name} (saturate=False) vs ml_dtypes")
    ref_t = torch_to(x32, dt)
    # Whether torch saturates depends on its version (2.13 saturates e4m3fn, like castlab's
    # default; older versions gave NaN, like saturate=False); e5m2 never saturates.
    torch_sat = dt is cl.float8_e4m3fn and _torch_saturates_e4m3fn()
    assert_bits_equal(got if torch_sat else nonsat, ref_t, x32,
                      f"{what} f32->{dt.name} vs torch")


def _torch_saturates_e4m3fn() -> bool:
    return torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().item() == 448.0


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_narrow_f32_midpoints_and_neighbours(dt):
    x = midpoint_probe_values(dt)
    x = np.concatenate([x, np.array([np.inf, -np.inf, np.nan], np.float32)])
    _check_narrow_f32(x, dt, "midpoints")


@pytest.mark.parametrize("dt,n", [(cl.bfloat16, 4_000_000), (cl.float16, 4_000_000),
                                  (cl.float8_e4m3fn, 2_000_000), (cl.float8_e5m2, 2_000_000)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_narrow_f32_random_bit_patterns(dt, n):
    x = random_f32_bits(n, seed=1234 + dt.code)
    _check_narrow_f32(x, dt, "random bits")


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_narrow_f32_random_in_range(dt):
    # Random bits mostly produce huge/tiny values; also hit the format's own range densely.
    rng = np.random.default_rng(7 + dt.code)
    _, emin, maxv, _ = FMT[dt]
    e = rng.uniform(emin - 12, math.log2(maxv) + 1, size=1_000_000)
    x = (np.exp2(e) * rng.choice([-1.0, 1.0], size=e.size)).astype(np.float32)
    _check_narrow_f32(x, dt, "in-range")


# ----------------------------------------------------------------------------- cross conversions

@pytest.mark.parametrize("src,dst", [(s, d) for s in NARROW for d in NARROW if s is not d],
                         ids=lambda d: d.name)
def test_cross_exhaustive(src, dst):
    a = all_patterns(src)
    got = cl_astype(a, dst)
    # the exact value widened to fp32 (exact), then one rounding: that's what ml_dtypes does
    ref = a.astype(np.float32).astype(NP[dst])
    if dst in (cl.float8_e4m3fn, cl.float8_e5m2):
        ref = saturate_expected(a, ref, dst)
    assert_bits_equal(got, ref, a, f"{src.name}->{dst.name} vs ml_dtypes")
    if src.itemsize == 2 and dst.itemsize == 2:
        assert_bits_equal(got, torch_to(a, dst), a, f"{src.name}->{dst.name} vs torch")


def test_bf16_fp16_known_values():
    # bf16 1 + 2^-7 is exact in fp16; bf16 max overflows fp16 to Inf; fp16 min subnormal
    # 2^-24 is exact in bf16.
    a = np.array([1 + 2**-7, 3.3895313892515355e38, 2**-24], np.float64).astype(BF16)
    got = cl_astype(a, cl.float16).astype(np.float64)
    assert got[0] == 1 + 2**-7 and got[1] == np.inf and got[2] == 2**-24


# ----------------------------------------------------------------------------- fp64 directly

def _near_midpoint_f64(dt, n: int, seed: int) -> np.ndarray:
    """fp64 values very close to (and exactly on) midpoints between neighbours of dt: the
    ones where rounding through fp32 first gives a different answer."""
    rng = np.random.default_rng(seed)
    v = all_patterns(dt).astype(np.float64)
    v = np.unique(v[np.isfinite(v) & (v >= 0)])
    i = rng.integers(0, v.size - 1, size=n)
    lo, hi = v[i], v[i + 1]
    mid = (lo + hi) / 2
    ulp = hi - lo
    k = rng.integers(24, 50, size=n).astype(np.float64)
    eps = rng.choice([-1.0, 0.0, 1.0], size=n) * ulp * np.exp2(-k)
    x = mid + eps
    x = np.where(rng.random(n) < 0.1, np.nextafter(mid, rng.choice([-np.inf, np.inf], size=n)), x)
    return x * rng.choice([-1.0, 1.0], size=n)


@pytest.mark.parametrize("dt", NARROW + [cl.float32], ids=lambda d: d.name)
def test_f64_narrow_direct_vs_fractions(dt):
    if dt is cl.float32:
        rng = np.random.default_rng(3)
        f = rng.uniform(-126 - 20, 128, size=3000)
        x = np.exp2(f) * (1 + rng.integers(0, 2**20, size=f.size) * 2.0**-20)
        x = np.concatenate([x, (x.astype(np.float32).astype(np.float64) +
                                np.nextafter(x.astype(np.float32), np.float32(np.inf)).astype(np.float64)) / 2])
        x = x[np.isfinite(x)]
    else:
        x = _near_midpoint_f64(dt, 3000, seed=11 + dt.code)
    got = cl_astype(x, dt).astype(np.float64)
    sat = dt in (cl.float8_e4m3fn, cl.float8_e5m2)  # bf16/fp16/fp32 overflow to Inf
    exp = np.array([round_fraction(Fraction(float(v)), dt, saturate=sat) for v in x])
    bad = np.flatnonzero(~((got == exp) & (np.signbit(got) == np.signbit(exp))))
    assert bad.size == 0, [(repr(x[i]), got[i], exp[i]) for i in bad[:8]]
    if dt is not cl.float32:
        # the test set has teeth: going through fp32 would get many of these wrong
        via32 = x.astype(np.float32).astype(NP[dt]).astype(np.float64)
        fin = np.isfinite(via32)
        assert (via32[fin] != exp[fin]).sum() > 50


def test_f64_to_bf16_double_rounding_vector():
    x = np.array([1 + 2**-8 + 2**-30])
    assert cl_astype(x, cl.bfloat16).astype(np.float64).tolist() == [1.0078125]
    # what double rounding (fp64 -> fp32 -> bf16) would give:
    assert x.astype(np.float32).astype(BF16).astype(np.float64).tolist() == [1.0]
    assert cl.tensor([1 + 2**-8 + 2**-30], dtype=cl.bfloat16).tolist() == [1.0078125]
    assert cl.from_numpy(x).astype(cl.float32).astype(cl.bfloat16).tolist() == [1.0]


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_f64_narrow_all_patterns_and_midpoints(dt):
    # every representable value and every exact midpoint, from fp64: same as from fp32
    x = midpoint_probe_values(dt).astype(np.float64)
    got = cl_astype(x, dt)
    ref = cl_astype(x.astype(np.float32), dt)  # exact fp32 values: already checked above
    assert_bits_equal(got, ref, x, f"f64->{dt.name}")


# ----------------------------------------------------------------------------- edge cases

BF16_EDGE = [  # (fp32 bits, bf16 bits or "nan")
    (0x3F808000, 0x3F80),  # 1 + 2^-8: tie, rounds to even (down)
    (0x3F818000, 0x3F82),  # tie with odd lower neighbour: rounds up
    (0x3F808001, 0x3F81),  # just above the tie
    (0x3F807FFF, 0x3F80),  # just below the tie
    (0x7F800000, 0x7F80), (0xFF800000, 0xFF80),  # +-Inf exact
    (0x7F7F0000, 0x7F7F),  # bf16 max exact
    (0x7F7F7FFF, 0x7F7F),  # just below max + half ulp
    (0x7F7F8000, 0x7F80),  # max + half ulp: tie to even -> Inf
    (0x7F7FFFFF, 0x7F80),  # fp32 max -> Inf
    (0x00000001, 0x0000), (0x80000001, 0x8000),  # tiniest subnormal -> +-0
    (0x00008000, 0x0000), (0x00018000, 0x0002),  # subnormal ties to even
    (0x00010000, 0x0001),  # subnormal exact
    (0x80000000, 0x8000),  # -0 exact
    (0x7F800001, "nan"), (0xFF800001, "nan"), (0x7FFFFFFF, "nan"), (0xFFFFFFFF, "nan"),
    (0x7FC00000, "nan"), (0x7F80FFFF, "nan"), (0xFF80FFFF, "nan"), (0x7FFF8000, "nan"),
]


@pytest.mark.parametrize("src,exp", BF16_EDGE, ids=lambda v: hex(v) if isinstance(v, int) else v)
def test_f32_to_bf16_edge(src, exp):
    x = np.array([src], np.uint32).view(np.float32)
    for got in (cl_astype(x, cl.bfloat16), cl_astype(x.astype(np.float64), cl.bfloat16)):
        b = int(bits(got)[0])
        if exp == "nan":
            # NaN stays NaN: never Inf (0x7F80) and never -0 (0x8000: the +0x7FFF carry)
            assert (b & 0x7F80) == 0x7F80 and (b & 0x7F) != 0, hex(b)
        else:
            assert b == exp, (hex(src), hex(b), hex(exp))


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_nan_payloads_stay_nan(dt):
    pay = np.array([0x7F800001, 0xFF800001, 0x7F800100, 0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF,
                    0xFFFFFFFF, 0x7F802000, 0x7F801FFF], np.uint32).view(np.float32)
    for x in (pay, pay.astype(np.float64)):
        for got in (cl_astype(x, dt), cl_astype_policy(x, dt, saturate=False),
                    cl_astype_policy(x, dt, rounding="toward_zero")):
            assert isnan(got).all(), bits(got)


def test_fp16_edges():
    x = np.array([65504, 65519.996, 65520, -65520, np.inf, 2**-24, 2**-25, 3 * 2**-26, 2**-25 * 1.0000001,
                  6.103515625e-05, 1 + 2**-11, 1 + 3 * 2**-11], np.float32)
    got = cl_astype(x, cl.float16).astype(np.float64)
    assert got.tolist() == [65504, 65504, np.inf, -np.inf, np.inf, 2**-24, 0.0, 2**-24, 2**-24,
                            6.103515625e-05, 1.0, 1 + 2**-9]


def test_fp8_saturating_default():
    x = np.array([448, 464, 465, 1000, -1000, np.inf, -np.inf, 1e30, np.nan], np.float32)
    e4 = cl_astype(x, cl.float8_e4m3fn).astype(np.float64)
    assert e4[:8].tolist() == [448, 448, 448, 448, -448, 448, -448, 448] and np.isnan(e4[8])
    e4ns = cl_astype_policy(x, cl.float8_e4m3fn, saturate=False).astype(np.float64)
    assert e4ns[:2].tolist() == [448, 448] and np.isnan(e4ns[2:]).all()
    y = np.array([57344, 61439, 61440, 1e6, -1e6, np.inf, -np.inf, np.nan], np.float32)
    e5 = cl_astype(y, cl.float8_e5m2).astype(np.float64)
    assert e5[:7].tolist() == [57344, 57344, 57344, 57344, -57344, 57344, -57344] and np.isnan(e5[7])
    e5ns = cl_astype_policy(y, cl.float8_e5m2, saturate=False).astype(np.float64)
    assert e5ns[:7].tolist() == [57344, 57344, np.inf, np.inf, -np.inf, np.inf, -np.inf]
    assert np.isnan(e5ns[7])
    # saturation is also what the fp64 path does
    assert cl_astype(x.astype(np.float64), cl.float8_e4m3fn).astype(np.float64)[3] == 448


def test_eager_astype_is_saturating_and_policy_default_too():
    x = cl.tensor([1000.0])
    assert x.astype(cl.float8_e4m3fn).tolist() == [448.0]
    f = cl.jit(lambda t: t.astype(cl.float8_e4m3fn))
    assert f(x).tolist() == [448.0]
    assert math.isnan(f.run(x, policy=cl.Policy(saturate=False)).tolist()[0])


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_subnormals_exact(dt):
    a = all_patterns(dt)
    v = a.astype(np.float64)
    tiny = np.isfinite(v) & (np.abs(v) < 2.0 ** FMT[dt][1]) & (v != 0)
    sub = a[tiny]
    assert sub.size > 0
    w = cl_astype(sub, cl.float32)
    assert np.array_equal(w.astype(np.float64), sub.astype(np.float64))
    assert np.array_equal(bits(cl_astype(w, dt)), bits(sub))
    assert np.array_equal(bits(cl_astype(w.astype(np.float64), dt)), bits(sub))


# ----------------------------------------------------------------------------- rounding modes

def _rz_reference(x32: np.ndarray, dt) -> np.ndarray:
    """Round toward zero: RNE result, stepped one ulp toward zero if it grew the magnitude
    (bf16/fp16: magnitudes are monotone in the bits, Inf - 1 is the max finite)."""
    r = x32.astype(NP[dt])
    grew = np.abs(r.astype(np.float64)) > np.abs(x32.astype(np.float64))
    b = bits(r).copy()
    b[grew] -= 1
    return b.view(NP[dt])


@pytest.mark.parametrize("dt", [cl.bfloat16, cl.float16], ids=lambda d: d.name)
def test_toward_zero(dt):
    x = np.concatenate([random_f32_bits(1_000_000, 99), midpoint_probe_values(dt)])
    x = x[~np.isnan(x) & np.isfinite(x)]
    got = cl_astype_policy(x, dt, rounding="toward_zero")
    assert_bits_equal(got, _rz_reference(x, dt), x, f"toward_zero f32->{dt.name}")
    assert (np.abs(got.astype(np.float64)) <= np.abs(x.astype(np.float64))).all()
    # from fp64 too: never increases the magnitude
    x64 = x.astype(np.float64) * (1 + 2.0**-40)
    g64 = cl_astype_policy(x64, dt, rounding="toward_zero").astype(np.float64)
    fin = np.isfinite(x64)
    assert (np.abs(g64[fin]) <= np.abs(x64[fin])).all()


@pytest.mark.parametrize("dt", [cl.float8_e4m3fn, cl.float8_e5m2], ids=lambda d: d.name)
def test_toward_zero_fp8_never_increases_magnitude(dt):
    x = random_f32_bits(200_000, 5)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, midpoint_probe_values(dt)])
    got = cl_astype_policy(x, dt, rounding="toward_zero").astype(np.float64)
    assert not np.isnan(got).any()
    assert (np.abs(got) <= np.abs(x.astype(np.float64))).all()
    # and it is the largest such value: one step up in magnitude would exceed |x|
    ne = cl_astype(x, dt).astype(np.float64)
    assert ((ne == got) | (np.abs(ne) > np.abs(x.astype(np.float64)))).all()


def _neighbours(x: np.ndarray, dt):
    lo = _rz_reference(x, dt)
    b = bits(lo).copy()
    hi_b = b + 1  # next magnitude
    hi = hi_b.view(NP[dt])
    exact = lo.astype(np.float64) == x.astype(np.float64)
    return lo, hi, exact


@pytest.mark.parametrize("dt", [cl.bfloat16, cl.float16], ids=lambda d: d.name)
def test_stochastic_rounding_neighbours_and_determinism(dt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(500_000) * 3).astype(np.float32)
    a = cl_astype_policy(x, dt, rounding="stochastic", seed=1)
    b = cl_astype_policy(x, dt, rounding="stochastic", seed=1)
    c = cl_astype_policy(x, dt, rounding="stochastic", seed=2)
    assert np.array_equal(bits(a), bits(b)), "same seed must give the same bits"
    assert not np.array_equal(bits(a), bits(c)), "different seeds should differ"
    lo, hi, exact = _neighbours(x, dt)
    av = a.astype(np.float64)
    assert ((av == lo.astype(np.float64)) | (av == hi.astype(np.float64))).all()
    assert (av[exact] == x[exact]).all(), "representable values must stay exact"
    # both neighbours are actually used
    up = (av != lo.astype(np.float64))
    assert 0.3 < up[~exact].mean() < 0.7


@pytest.mark.parametrize("frac", [0.1, 0.3, 0.5, 0.77, 0.999])
@pytest.mark.parametrize("src", [np.float32, np.float64], ids=["f32", "f64"])
def test_stochastic_rounding_unbiased(frac, src):
    n = 400_000
    ulp = 2.0**-7  # bf16 ulp in [1, 2)
    x_val = 1.0 + frac * ulp
    x_val = float(np.asarray(x_val).astype(src))
    x = np.full(n, x_val, src)
    y = cl_astype_policy(x, cl.bfloat16, rounding="stochastic", seed=1234).astype(np.float64)
    assert set(np.unique(y).tolist()) <= {1.0, 1.0 + ulp}
    p = (x_val - 1.0) / ulp
    phat = (y == 1.0 + ulp).mean()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(phat - p) < 5 * sigma + 1e-9, (phat, p, sigma)
    # the mean of many stochastic roundings approaches the exact value
    assert abs(y.mean() - x_val) < 5 * sigma * ulp + 1e-12


ROUND_CHECK = r"""#include "core/convert.h"
using namespace cl;
static void check(double v, int code) {
  for (bool sat : {true, false}) {
    const double a = round_f64_to(v, code, kNearestEven, sat, 0);
    const double b = bits_to_f64(round_f64_to_bits(v, code, kNearestEven, sat, 0), code);
    // (fp32's hardware conversion keeps a NaN's payload; the general path makes it canonical)
    const bool nan32 = code == kFloat32 && a != a && b != b;
    report(f64_bits(a) == f64_bits(b) || nan32, "code %d v %a: %a vs %a\n", code, v, a, b);
  }
}
int main() {
  std::mt19937_64 g(3);
  for (int code : {kBFloat16, kFloat16, kFloat32, kFloat8E4M3FN, kFloat8E5M2}) {
    const auto at = [&](double v) { check(v, code); };
    const int nb = code == kFloat32 ? 20 : (code == kBFloat16 || code == kFloat16) ? 16 : 8;
    for (unsigned long long k = 0; k + 1 < (1ull << nb); ++k) {  // values, midpoints, +-3 ulps
      const uint32_t b = code == kFloat32 ? (uint32_t)g() : (uint32_t)k;
      const double v = bits_to_f64(b, code), w = bits_to_f64(b + 1, code);
      around(v, at);
      around(-v, at);
      if (std::isfinite(v) && std::isfinite(w)) around(v + (w - v) / 2, at);
    }
    for (int k = 0; k < 1000000; ++k) {
      check(f64_from_bits(g()), code);
      check(std::ldexp((double)(g() >> 11) * 0x1p-53, (int)(g() % 340) - 170), code);
    }
    check(INFINITY, code);
    check(-INFINITY, code);
    check(NAN, code);
    check(-NAN, code);
  }
  printf("%llu %llu\n", checked, bad);
  return 0;
}
"""


def test_round_f64_to_fast_paths_are_the_general_conversion(tmp_path):
    """round_f64_to's nearest-even fast paths (fp32 by the hardware conversion, bf16/fp16
    by rounding the double's own mantissa) give the general conversion's value bit for
    bit (a NaN is the format's NaN; fp32's keeps its payload): every bf16/fp16/fp8 value, its negation, the midpoints with the
    next encoding, 3 fp64 ulps either side, random fp32 values, specials, and 2M random
    doubles per format, saturating and not."""
    checked, bad, out = _hostcheck.run(tmp_path, ROUND_CHECK)
    assert checked > 20_000_000 and bad == 0, out
