"""Numerics toolkit: ULP metrics, golden comparison, near ties, per-element explanation
and per-node drift attribution.

Everything here works on castlab tensors (CPU or CUDA: CUDA tensors are copied to the
host), PyTorch tensors and NumPy / ml_dtypes arrays. Metrics are computed in NumPy in
float64; conversions to a narrow format ("the reference rounded once to bf16") are done
here, directly from float64 (never through float32, so no double rounding).

>>> import castlab as cl
>>> from castlab import numerics as nm
>>> x = cl.randn(64, 32, seed=0, dtype=cl.bfloat16)
>>> swiglu = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
>>> c = nm.compare(swiglu.run(x, policy="eager"), swiglu(x),
...                ref=swiglu.run(x, policy="fp64"), names=["eager", "fused"])
>>> print(c)                                             # doctest: +SKIP

Definitions used throughout (p = explicit mantissa bits, emin = exponent of the smallest
normal of the format; bf16: p=7, emin=-126):

* ulp(r) = 2**(max(floor(log2|r|), emin) - p), computed from the exact value r (not
  from r rounded to the format); ulp(0) = 2**(emin - p), the smallest subnormal.
* ulp distance of two values of one format: the difference of their positions in the
  ordered list of the format's values (sign-magnitude bits mapped to a monotone integer),
  so +0 and -0 are 0 apart and the largest finite value is 1 away from infinity.
"""

from __future__ import annotations

import dataclasses
import html as _html
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from . import _C
from ._dtype import as_dtype, dtype, float64

__all__ = [
    "ulp", "ulp_diff", "ulp_error", "round_to", "neighbours", "compare", "Comparison",
    "same", "assert_close_message", "default_tolerances", "near_ties", "NearTies", "TieSplit",
    "explain", "Explanation", "drift", "Drift", "Divergence",
]

Tensor = _C.Tensor


# ================================================================ formats

@dataclasses.dataclass(frozen=True)
class _Fmt:
    dt: dtype
    p: int          # explicit mantissa bits
    emin: int       # exponent of the smallest normal
    emax: int       # exponent of the largest finite
    max: float      # largest finite value
    bits: int
    has_inf: bool

    @property
    def name(self) -> str:
        return self.dt.name

    @property
    def uint(self):
        return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits]


_FMTS: dict = {}


def _fmt(d: Any) -> _Fmt:
    d = as_dtype(d)
    f = _FMTS.get(d.name)
    if f is None:
        if not d.is_floating_point:
            raise TypeError(f"{d} is not a floating-point dtype")
        fi = ml_dtypes.finfo(d.numpy)
        f = _Fmt(d, int(fi.nmant), int(fi.minexp), int(fi.maxexp) - 1, float(fi.max),
                 int(fi.bits), d.name != "float8_e4m3fn")
        _FMTS[d.name] = f
    return f


def _at_least_as_precise(ref: _Fmt, res: _Fmt) -> bool:
    """Can `ref` represent every value of `res` exactly?"""
    return ref.p >= res.p and ref.emax >= res.emax and ref.emin - ref.p <= res.emin - res.p


# ================================================================ inputs

class _Val:
    """A value converted for the metrics: NumPy array (host), castlab dtype, device."""

    __slots__ = ("a", "dt", "device")

    def __init__(self, a: np.ndarray, dt: dtype, device: str):
        self.a, self.dt, self.device = a, dt, device

    @property
    def f64(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # NaN payloads of narrow types
            return self.a.astype(np.float64)


def _val(x: Any, what: str = "tensor") -> _Val:
    if isinstance(x, _Val):
        return x
    if isinstance(x, Tensor):
        dev = str(x.device)
        if x.device.type == "cuda":
            x = x.cpu()
        return _Val(x.numpy(), x.dtype, dev)
    if type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__"):
        dev = str(x.device)
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        from ._dlpack import from_dlpack

        c = from_dlpack(t)
        return _Val(c.numpy(), c.dtype, dev)
    if isinstance(x, np.ndarray):
        try:
            dt = as_dtype(x.dtype)
        except TypeError as e:
            raise TypeError(f"{what}: {e}") from None
        return _Val(x, dt, "cpu")
    if isinstance(x, (float, int, list, tuple, np.floating)):
        a = np.asarray(x, dtype=np.float64)
        return _Val(a, float64, "cpu")
    raise TypeError(f"{what}: expected a castlab/torch tensor or a NumPy array, "
                    f"got {type(x).__name__}")


def _float_val(x: Any, what: str) -> _Val:
    v = _val(x, what)
    if not v.dt.is_floating_point:
        raise TypeError(f"{what} has dtype {v.dt.name}; ULP metrics need a floating-point "
                        "dtype (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2)")
    return v


def _check_devices(vals: list, names: list) -> None:
    devs = {v.device for v in vals}
    if len(devs) > 1:
        where = ", ".join(f"{n}: {v.device}" for n, v in zip(names, vals))
        raise ValueError(f"tensors are on different devices ({where}); move them to one "
                         "device first (e.g. .cpu())")


def _broadcast(vals: list, names: list) -> tuple:
    try:
        return np.broadcast_shapes(*[v.a.shape for v in vals])
    except ValueError:
        shapes = ", ".join(f"{n}: {tuple(v.a.shape)}" for n, v in zip(names, vals))
        raise ValueError(f"shapes do not match and cannot be broadcast together ({shapes})") from None


def _tensor(a: np.ndarray):
    from ._creation import from_numpy

    return from_numpy(np.ascontiguousarray(a))


# ================================================================ ulp primitives

def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) exactly, for finite a > 0 (float64)."""
    _, e = np.frexp(a)
    return e.astype(np.int64) - 1


def _ulp_np(r: np.ndarray, f: _Fmt) -> np.ndarray:
    a = np.abs(np.asarray(r, dtype=np.float64))
    with np.errstate(all="ignore"):
        pos = np.isfinite(a) & (a > 0)
        e = np.where(pos, _floor_log2(np.where(pos, a, 1.0)), f.emin)
        e = np.maximum(e, f.emin)
        u = np.ldexp(1.0, (e - f.p).astype(np.int32))
        return np.where(np.isnan(a), np.nan, np.where(np.isinf(a), np.inf, u))


def ulp(ref: Any, dtype: Any) -> Tensor:
    """The spacing of `dtype`'s values at `ref`: 2**(max(floor(log2|r|), emin) - p),
    from the exact (fp64) value, as a float64 tensor.

    >>> import castlab as cl, castlab.numerics as nm
    >>> nm.ulp(cl.tensor([1.0, 0.75, 0.0], dtype=cl.float64), cl.bfloat16).tolist()
    [0.0078125, 0.00390625, 9.183549615799121e-41]
    """
    return _tensor(_ulp_np(_val(ref, "ref").f64, _fmt(dtype)))


def _ordinal(v: _Val) -> tuple:
    """(sign, magnitude) of the bit patterns, as (bool array, uint64 array)."""
    f = _fmt(v.dt)
    bits = np.ascontiguousarray(v.a).view(f.uint).astype(np.uint64)
    sign = (bits >> np.uint64(f.bits - 1)) & np.uint64(1)
    mag = bits & np.uint64((1 << (f.bits - 1)) - 1)
    return sign.astype(bool), mag


def _ulp_diff_np(a: _Val, b: _Val) -> tuple:
    sa, ma = _ordinal(a)
    sb, mb = _ordinal(b)
    sa, ma, sb, mb = np.broadcast_arrays(sa, ma, sb, mb)
    same_sign = sa == sb
    d = np.where(same_sign, np.where(ma >= mb, ma - mb, mb - ma), ma + mb)
    d = np.minimum(d, np.uint64(2**63 - 1)).astype(np.int64)
    na, nb = np.broadcast_arrays(np.isnan(a.f64), np.isnan(b.f64))
    d = np.where(na & nb, 0, d)
    nan_mismatch = na ^ nb
    d = np.where(nan_mismatch, -1, d)
    return d, nan_mismatch


def ulp_diff(a: Any, b: Any, *, return_nan_mask: bool = False):
    """Distance between `a` and `b` (one floating-point dtype) in units in the last place:
    the number of representable values of the dtype one has to step through to go from
    one to the other. Returns an int64 castlab tensor (broadcast shape).

    Signs are handled through a monotone mapping of the bit patterns (+0 and -0 are 0
    apart, -min_subnormal and +min_subnormal are 2 apart, the largest finite value is 1
    from infinity). NaN vs NaN is 0 (equal, whatever the payloads). NaN vs a number is
    not a distance: those elements hold -1, and ``return_nan_mask=True`` returns
    ``(distances, nan_mismatch)`` with a bool tensor marking them. fp64 distances
    above 2**63-1 (only between huge values of opposite sign) saturate there.

    >>> import castlab as cl, castlab.numerics as nm
    >>> a = cl.tensor([1.0, 0.0, float("nan"), 1.0], dtype=cl.bfloat16)
    >>> b = cl.tensor([1.0078125, -0.0, float("nan"), float("nan")], dtype=cl.bfloat16)
    >>> nm.ulp_diff(a, b).tolist()
    [1, 0, 0, -1]
    """
    va, vb = _float_val(a, "a"), _float_val(b, "b")
    if va.dt is not vb.dt:
        raise TypeError(f"ulp_diff needs two tensors of one dtype, got {va.dt.name} and "
                        f"{vb.dt.name}; to measure a result against a more precise reference "
                        "use ulp_error(x, ref)")
    _check_devices([va, vb], ["a", "b"])
    _broadcast([va, vb], ["a", "b"])
    d, nm = _ulp_diff_np(va, vb)
    if return_nan_mask:
        return _tensor(d), _tensor(nm)
    return _tensor(d)


def _ulp_error_np(x64: np.ndarray, r64: np.ndarray, f: _Fmt) -> np.ndarray:
    with np.errstate(all="ignore"):
        err = np.abs(x64 - r64) / _ulp_np(r64, f)
        both_nan = np.isnan(x64) & np.isnan(r64)
        same_inf = np.isinf(x64) & np.isinf(r64) & (x64 == r64)
        err = np.where(both_nan | same_inf, 0.0, err)
        err = np.where(np.isinf(r64) & ~np.isnan(x64) & (x64 != r64), np.inf, err)
    return err


def ulp_error(x: Any, ref: Any, *, dtype: Any = None) -> Tensor:
    """Error of `x` against a reference at least as precise, in (fractional) ulps of
    x's format at the reference value: ``|x - ref| / ulp(ref)`` with
    ulp(r) = 2**(max(floor(log2|r|), emin) - p) taken from the exact r. A correctly
    rounded x has error <= 0.5. Returns a float64 tensor; NaN vs NaN and equal
    infinities are 0, NaN vs a number is NaN, a finite x against an infinite ref is inf.

    `dtype` overrides the format the ulps are counted in (e.g. a bf16 node held in fp32
    registers).

    >>> import castlab as cl, castlab.numerics as nm
    >>> x = cl.tensor([1.0], dtype=cl.bfloat16)
    >>> nm.ulp_error(x, cl.tensor([1.001953125], dtype=cl.float64)).tolist()
    [0.25]
    """
    vx, vr = _float_val(x, "x"), _float_val(ref, "ref")
    f = _fmt(vx.dt if dtype is None else dtype)
    if dtype is None and not _at_least_as_precise(_fmt(vr.dt), f):
        raise ValueError(f"the reference ({vr.dt.name}) is less precise than the result "
                         f"({vx.dt.name}); pass a reference of higher precision (e.g. the "
                         "fp64 policy's output)")
    _check_devices([vx, vr], ["x", "ref"])
    _broadcast([vx, vr], ["x", "ref"])
    return _tensor(_ulp_error_np(vx.f64, vr.f64, f))


# ================================================================ direct rounding

def _neighbours_np(r: np.ndarray, f: _Fmt) -> tuple:
    """(lo, hi, ulp) with lo <= r <= hi the adjacent values of format f around finite r
    (lo == hi when r is representable). hi may exceed the format's max (then it is
    the value an unbounded exponent would give; callers map it to inf)."""
    r = np.asarray(r, dtype=np.float64)
    a = np.abs(r)
    u = _ulp_np(a, f)
    with np.errstate(all="ignore"):
        q = np.floor(a / u)
        lo_m = q * u
        hi_m = np.where(lo_m == a, lo_m, lo_m + u)
        # above the largest finite: lo is the max, hi the next "virtual" value
        big = a > f.max
        umax = math.ldexp(1.0, f.emax - f.p)
        lo_m = np.where(big, f.max, lo_m)
        hi_m = np.where(big, f.max + umax, hi_m)
        u = np.where(big, umax, u)
    neg = np.signbit(r)
    lo = np.where(neg, -hi_m, lo_m)
    hi = np.where(neg, -lo_m, hi_m)
    return lo, hi, u


def _round_np(r: np.ndarray, f: _Fmt, saturate: bool | None = None) -> np.ndarray:
    """Round fp64 values once, directly, to format f (nearest, ties to even) with castlab's
    own conversion (core/convert.h) and return them as float64. Overflow gives inf (bf16,
    fp16, fp32, e5m2 unless saturated) or, for fp8, the largest finite value (saturate,
    castlab's default) / NaN (e4m3fn without saturation)."""
    from ._creation import from_numpy
    from ._graph import elementwise
    from ._lower import input_node, lower
    from .policy import Policy, current_math

    r = np.ascontiguousarray(r, dtype=np.float64)
    if f.bits == 64:
        return r.copy()
    t = from_numpy(r)
    node = elementwise("astype", [input_node(t, 0)], {"dtype": f.dt})
    policy = Policy.eager(saturate=True if saturate is None else bool(saturate))
    plan, out = lower([node], [t], policy, current_math())
    plan.run([t], out)
    m = out[0].numpy().astype(np.float64)
    if saturate and f.bits != 8:
        # castlab's conversion saturates fp8 only; saturate=True clamps any format.
        m = np.where(np.isinf(m), np.copysign(f.max, m), m)
    return m


def round_to(ref: Any, dtype: Any, *, saturate: bool | None = None) -> Tensor:
    """Round values once, directly, to `dtype` (nearest, ties to even) from their exact
    fp64 value, without the fp64 -> fp32 -> bf16 double rounding. Overflow: inf for
    bf16/fp16/fp32 (IEEE); fp8 saturates to the largest finite value by default
    (castlab's default conversion), `saturate=False` gives inf (e5m2) / NaN (e4m3fn).

    >>> import castlab as cl, castlab.numerics as nm
    >>> nm.round_to(cl.tensor([1 + 2**-8 + 2**-30], dtype=cl.float64), cl.bfloat16).tolist()
    [1.0078125]
    """
    f = _fmt(dtype)
    v = _float_val(ref, "ref")
    return _tensor(_round_np(v.f64, f, saturate).astype(f.dt.numpy))


def neighbours(ref: Any, dtype: Any) -> tuple:
    """The two adjacent values of `dtype` around each value of `ref` (lo <= ref <= hi,
    equal when ref is representable) and their midpoint, as float64 tensors
    ``(lo, hi, midpoint)``. Beyond the largest finite value hi is inf (or NaN for e4m3fn)
    and the midpoint is the overflow threshold max + ulp/2.

    >>> import castlab as cl, castlab.numerics as nm
    >>> lo, hi, mid = nm.neighbours(cl.tensor([0.4697266134], dtype=cl.float64), cl.bfloat16)
    >>> lo.tolist(), hi.tolist(), mid.tolist()
    ([0.46875], [0.470703125], [0.4697265625])
    """
    f = _fmt(dtype)
    v = _float_val(ref, "ref")
    lo, hi, _ = _neighbours_np(v.f64, f)
    mid = (lo + hi) / 2
    inf_val = np.inf if f.has_inf else np.nan
    hi = np.where(hi > f.max, inf_val, hi)
    lo = np.where(lo < -f.max, -inf_val, lo)
    return _tensor(lo), _tensor(hi), _tensor(mid)


# ================================================================ PyTorch-compatible checks

_TORCH_TOLS = {"float16": (1e-3, 1e-5), "bfloat16": (0.016, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7)}


def default_tolerances(*dtypes: Any) -> tuple:
    """``torch.testing.assert_close``'s default (rtol, atol): the loosest over `dtypes`;
    fp8 compares exactly (0, 0).

    >>> import castlab as cl, castlab.numerics as nm
    >>> nm.default_tolerances(cl.bfloat16, cl.float64)
    (0.016, 1e-05)
    """
    rt, at = zip(*[_TORCH_TOLS.get(as_dtype(d).name, (0.0, 0.0)) for d in dtypes])
    return max(rt), max(at)


def _isclose_torch(actual: _Val, expected: _Val, rtol: float, atol: float,
                   equal_nan: bool) -> tuple:
    """torch.isclose, with its arithmetic done as PyTorch does it: in the common dtype,
    each op rounded (castlab's eager ops follow PyTorch's). Returns (close, common dtype,
    actual and expected as castlab tensors of that dtype)."""
    from . import ops
    from ._dtype import promote_types

    dt = promote_types(actual.dt, expected.dt)
    a = _tensor(actual.a) if actual.dt is dt else _tensor(actual.f64).astype(dt)
    e = _tensor(expected.a) if expected.dt is dt else _tensor(expected.f64).astype(dt)
    a64 = a.numpy().astype(np.float64)
    e64 = e.numpy().astype(np.float64)
    close = a64 == e64
    if equal_nan:
        close |= np.isnan(a64) & np.isnan(e64)
    if (rtol == 0 and atol == 0) or dt.itemsize == 1:
        return close, dt, a, e
    allowed = (ops.abs(e * rtol) + atol).numpy().astype(np.float64)
    actual_err = ops.abs(a - e).numpy().astype(np.float64)
    close |= np.isfinite(actual_err) & (actual_err <= allowed)
    return close, dt, a, e


def _assert_close_msg(actual: _Val, expected: _Val, rtol: float | None = None,
                      atol: float | None = None, equal_nan: bool = False) -> str | None:
    from . import ops

    if rtol is None or atol is None:
        rtol, atol = default_tolerances(actual.dt, expected.dt)
    shape = np.broadcast_shapes(actual.a.shape, expected.a.shape)
    actual = _Val(np.broadcast_to(actual.a, shape), actual.dt, actual.device)
    expected = _Val(np.broadcast_to(expected.a, shape), expected.dt, expected.device)
    close, dt, a, e = _isclose_torch(actual, expected, rtol, atol, equal_nan)
    if close.all():
        return None
    equality = rtol == 0 and atol == 0
    n = close.size
    mism = n - int(close.sum())
    if len(shape) == 0:
        av, ev = float(a.numpy()), float(e.numpy())
        ad = abs(av - ev)
        rd = float("inf") if ev == 0 else ad / abs(ev)
        extra = f"Expected {ev} but got {av}."
        head = "Scalars"
        idx_a = idx_r = None
    else:
        extra = f"Mismatched elements: {mism} / {n} ({mism / n:.1%})"
        head = "Tensor-likes"
        if dt.itemsize == 1:
            first = tuple(int(i) for i in np.argwhere(~close)[0])
            return (f"{head} are not 'equal'!\n\n{extra}\n"
                    f"The first mismatched element is at index {first}.")
        absd_t = ops.abs(a - e)
        absd = absd_t.numpy().astype(np.float64).reshape(-1).copy()
        flat_close = close.reshape(-1)
        absd[flat_close] = 0
        ia = int(np.argmax(absd)) if not np.isnan(absd).any() else int(np.argmax(np.isnan(absd)))
        ad = float(absd[ia])
        reld = (absd_t / ops.abs(e)).numpy().astype(np.float64).reshape(-1).copy()
        reld[flat_close] = 0
        ir = int(np.argmax(reld)) if not np.isnan(reld).any() else int(np.argmax(np.isnan(reld)))
        rd = float(reld[ir])
        idx_a = tuple(int(i) for i in np.unravel_index(ia, shape))
        idx_r = tuple(int(i) for i in np.unravel_index(ir, shape))

    def line(kind, diff, idx, tol):
        s = (f"{kind.title()} difference: {diff}" if idx is None
             else f"Greatest {kind} difference: {diff} at index {idx}")
        if not equality:
            s += f" (up to {tol} allowed)"
        return s + "\n"

    msg = f"{head} are not {'equal' if equality else 'close'}!\n\n{extra.strip()}\n"
    msg += line("absolute", ad, idx_a, atol) + line("relative", rd, idx_r, rtol)
    return msg.strip()


def assert_close_message(actual: Any, expected: Any, *, rtol: float | None = None,
                         atol: float | None = None, equal_nan: bool = False) -> str | None:
    """The message ``torch.testing.assert_close(actual, expected, check_dtype=False)``
    would raise, or None when the tensors are close. Default tolerances per dtype as in
    PyTorch (bf16 0.016/1e-5, fp16 1e-3/1e-5, fp32 1.3e-6/1e-5, fp64 1e-7/1e-7; fp8 exact).

    >>> import castlab as cl, castlab.numerics as nm
    >>> print(nm.assert_close_message(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5])))
    Tensor-likes are not close!
    <BLANKLINE>
    Mismatched elements: 1 / 2 (50.0%)
    Greatest absolute difference: 0.5 at index (1,) (up to 1e-05 allowed)
    Greatest relative difference: 0.20000000298023224 at index (1,) (up to 1.3e-06 allowed)
    """
    va, ve = _float_val(actual, "actual"), _float_val(expected, "expected")
    _check_devices([va, ve], ["actual", "expected"])
    _broadcast([va, ve], ["actual", "expected"])
    return _assert_close_msg(va, ve, rtol, atol, equal_nan)


@dataclasses.dataclass
class SameVerdict:
    """PyTorch's ``torch._dynamo.utils.same(baseline, result, fp64_ref)`` outcome, with
    the numbers behind it."""

    passed: bool
    reason: str                    # "allclose", "rmse", "dtype mismatch", ...
    res_error: float | None = None  # RMSE(fp64_ref, result)
    ref_error: float | None = None  # RMSE(fp64_ref, baseline)
    multiplier: float | None = None
    threshold: float | None = None  # multiplier * ref_error + tol/10

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        s = "pass" if self.passed else "FAIL"
        if self.reason == "rmse":
            op = "<=" if self.passed else ">"
            return (f"{s} (rmse {self.res_error:.3g} {op} {self.multiplier:g}x{self.ref_error:.3g}"
                    f"+tol/10)")
        return f"{s} ({self.reason})"


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.mean(np.square(a - b))))


def _same(base: _Val, res: _Val, fp64_ref: _Val | None, tol: float = 1e-4,
          equal_nan: bool = False) -> SameVerdict:
    if fp64_ref is None:
        fp64_ref = base
    if base.dt is not res.dt:
        return SameVerdict(False, f"dtype mismatch {base.dt.name}, {res.dt.name}")
    close, *_ = _isclose_torch(base, res, tol, tol, equal_nan)
    if close.all():
        return SameVerdict(True, "allclose")
    if fp64_ref.dt is not float64:
        return SameVerdict(False, f"not allclose (tol={tol}); no fp64 reference")
    r64, b64, x64 = fp64_ref.f64, base.f64, res.f64
    if not np.isnan(r64).any() and not np.isnan(x64).any() and np.isnan(b64).any():
        lt = 4e-2
        c2, *_ = _isclose_torch(_Val(_round_np(r64, _fmt(res.dt)).astype(res.dt.numpy),
                                     res.dt, "cpu"), res, lt, lt, equal_nan)
        if c2.all():
            return SameVerdict(True, "baseline has NaN, result matches fp64")
    ref_error = _rmse(r64, b64)
    res_error = _rmse(r64, x64)
    mult = 3.0 if res.dt.name in ("float16", "bfloat16") else 2.0
    if r64.size < 1000 or (b64.ndim == 4 and b64.shape[-1] == b64.shape[-2] == 1) or tol >= 2e-2:
        mult = 3.0
    thr = mult * ref_error + tol / 10.0
    ok = res_error <= thr
    if not ok and equal_nan and math.isnan(ref_error) and math.isnan(res_error):
        ok = True
    return SameVerdict(bool(ok), "rmse", res_error, ref_error, mult, thr)


def same(baseline: Any, result: Any, fp64_ref: Any = None, *, tol: float = 1e-4,
         equal_nan: bool = False) -> SameVerdict:
    """PyTorch's accuracy gate ``torch._dynamo.utils.same(baseline, result, fp64_ref)``
    for tensors: pass if allclose(atol=rtol=tol); else, given an fp64 reference, pass iff
    RMSE(fp64, result) <= m * RMSE(fp64, baseline) + tol/10 with m = 3 for bf16/fp16
    results (and for tensors under 1000 elements), 2 otherwise. Returns a truthy
    :class:`SameVerdict` carrying the numbers.

    >>> import castlab as cl, castlab.numerics as nm
    >>> x = cl.randn(4, 4, seed=0)
    >>> bool(nm.same(x, x))
    True
    """
    vb, vr = _float_val(baseline, "baseline"), _float_val(result, "result")
    v64 = None if fp64_ref is None else _float_val(fp64_ref, "fp64_ref")
    vals = [vb, vr] + ([v64] if v64 is not None else [])
    nms = ["baseline", "result", "fp64_ref"][:len(vals)]
    _check_devices(vals, nms)
    _broadcast(vals, nms)
    return _same(vb, vr, v64, tol, equal_nan)


# ================================================================ tables

def _fmt_num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if v == 0:
            return "0"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.4g}"
    return str(v)


def _text_table(headers: list, rows: list) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else _fmt_num(c) for c in r]
                                           for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines)


def _html_table(headers: list, rows: list, caption: str = "") -> str:
    h = ['<table style="border-collapse:collapse;font-family:monospace">']
    if caption:
        h.append(f"<caption style='text-align:left'>{_html.escape(caption)}</caption>")
    h.append("<tr>" + "".join(f"<th style='padding:2px 8px;text-align:right'>{_html.escape(str(c))}</th>"
                              for c in headers) + "</tr>")
    for r in rows:
        h.append("<tr>" + "".join(
            f"<td style='padding:2px 8px;text-align:{'left' if i == 0 else 'right'}'>"
            f"{_html.escape(c if isinstance(c, str) else _fmt_num(c))}</td>"
            for i, c in enumerate(r)) + "</tr>")
    h.append("</table>")
    return "".join(h)


# ================================================================ compare

_COLUMNS = [
    ("dtype", "dtype"), ("mismatches", "mismatch"), ("mismatch_fraction", "mismatch %"),
    ("max_ulp_apart", "max ulp apart"), ("nan_mismatches", "NaN mism."),
    ("max_abs_error", "max abs err"), ("mean_abs_error", "mean abs err"),
    ("max_rel_error", "max rel err"), ("rmse", "RMSE"), ("rel_rmse", "rel RMSE"),
    ("max_ulp_error", "max ulp err"), ("mean_ulp_error", "mean ulp err"),
    ("correctly_rounded", "correctly rounded"), ("same", "same() vs first"),
]


class Comparison:
    """Result of :func:`compare`: one row of metrics per result.

    Attributes: ``names``, ``rows`` (list of dicts, keys as in :meth:`to_dict`),
    ``ref_dtype``. Per-element arrays are kept for plots: ``ulp_errors[name]`` (float64
    NumPy, None without a reference), ``values[name]`` (float64 NumPy), ``ref_values``.

    >>> import castlab as cl, castlab.numerics as nm
    >>> c = nm.compare(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]), names=["a", "b"])
    >>> c.to_dict()["b"]["mismatches"]
    1
    """

    def __init__(self, names, vals, ref, tol, rows, ulp_errors):
        self.names = list(names)
        self._vals = vals
        self._ref = ref
        self.tol = tol
        self.rows = rows
        self.ulp_errors = ulp_errors
        self.ref_dtype = None if ref is None else ref.dt

    @property
    def values(self) -> dict:
        return {n: v.f64 for n, v in zip(self.names, self._vals)}

    @property
    def ref_values(self):
        return None if self._ref is None else self._ref.f64

    def __getitem__(self, name) -> dict:
        if isinstance(name, int):
            return self.rows[name]
        return self.rows[self.names.index(name)]

    def _index(self, i) -> int:
        if isinstance(i, str):
            if i not in self.names:
                raise KeyError(f"no result named {i!r}; names: {self.names}")
            return self.names.index(i)
        if not -len(self.names) <= i < len(self.names):
            raise IndexError(f"result index {i} out of range for {len(self.names)} results")
        return i % len(self.names)

    def assert_close_message(self, i: int | str = 1, *, against: str = "first",
                             rtol: float | None = None, atol: float | None = None) -> str | None:
        """The ``torch.testing.assert_close`` message for result `i` (index or name)
        against the first result (``against="first"``) or the reference
        (``against="ref"``), with PyTorch's default tolerances; None when close."""
        k = self._index(i)
        if against == "first":
            exp = self._vals[0]
        elif against == "ref":
            if self._ref is None:
                raise ValueError("this comparison has no reference; pass ref= to compare()")
            exp = self._ref
        else:
            raise ValueError("against must be 'first' or 'ref'")
        return _assert_close_msg(self._vals[k], exp, rtol, atol)

    def to_dict(self) -> dict:
        """``{name: {metric: value}}`` with plain Python values; ``same`` is a bool
        (None for the baseline) and ``same_detail`` the verdict's explanation."""
        out = {}
        for n, r in zip(self.names, self.rows):
            d = dict(r)
            v = d.get("same")
            d["same"] = None if v is None else bool(v)
            d["same_detail"] = None if v is None else str(v)
            out[n] = d
        return out

    def to_frame(self):
        """The table as a pandas DataFrame (index: result names)."""
        import pandas as pd

        return pd.DataFrame.from_dict(self.to_dict(), orient="index")

    def _table(self) -> tuple:
        cols = [c for c in _COLUMNS if any(r.get(c[0]) is not None for r in self.rows)]
        headers = ["result"] + [c[1] for c in cols]
        rows = []
        for n, r in zip(self.names, self.rows):
            row = [n]
            for key, _ in cols:
                v = r.get(key)
                if key == "mismatch_fraction" and v is not None:
                    v = f"{100 * v:.4g}%"
                elif key == "correctly_rounded" and v is not None:
                    v = f"{100 * v:.4f}%"
                elif key == "same":
                    v = "baseline" if v is None and n == self.names[0] else (
                        "-" if v is None else str(v))
                row.append(v)
            rows.append(row)
        return headers, rows

    def _caption(self) -> str:
        shape = tuple(self._vals[0].a.shape)
        ref = f"; reference {self.ref_dtype.name}" if self._ref is not None else "; no reference"
        return (f"castlab comparison: {len(self.names)} results, shape {shape}{ref}; mismatches "
                f"and same() against {self.names[0]!r}")

    def __str__(self) -> str:
        h, r = self._table()
        return self._caption() + "\n" + _text_table(h, r)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        h, r = self._table()
        return _html_table(h, r, self._caption())


def compare(*results: Any, ref: Any = None, names: Any = None, tol: float = 1e-4) -> Comparison:
    """Compare results of one computation against each other and, optionally, against a
    more precise reference (typically the ``fp64`` policy's output).

    For every result: mismatches against the first result (count, fraction, NaN
    mismatches, max ulp apart: :func:`ulp_diff` when the dtypes agree, else the coarser
    one's :func:`ulp_error` at the finer one), and against `ref`: max/mean abs error, max
    rel error (|x-r|/|r|; 0/0 counts 0, x/0 inf), RMSE, relative RMSE (RMSE/RMS(ref)),
    max and mean :func:`ulp_error`, the fraction of elements equal to ref rounded once to
    the result's dtype (``correctly_rounded``; NaN = NaN counts equal), and PyTorch's
    ``same(first, result, ref, tol)`` verdict (:func:`same`). Results may also be given
    as one dict ``{name: tensor}``. Shapes must broadcast; all on one device.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> x = cl.randn(64, 64, seed=1, dtype=cl.bfloat16)
    >>> c = nm.compare({"eager": sw.run(x, policy="eager"), "fused": sw(x)},
    ...                ref=sw.run(x, policy="fp64"))
    >>> c["fused"]["correctly_rounded"] > c["eager"]["correctly_rounded"]
    True
    """
    if len(results) == 1 and isinstance(results[0], dict):
        if names is not None:
            raise TypeError("give names either as dict keys or as names=, not both")
        names = list(results[0].keys())
        results = tuple(results[0].values())
    if not results:
        raise TypeError("compare() needs at least one result")
    if names is None:
        names = [f"result{i}" for i in range(len(results))]
    names = [str(n) for n in names]
    if len(names) != len(results):
        raise ValueError(f"{len(names)} names for {len(results)} results")
    if len(set(names)) != len(names):
        raise ValueError(f"result names must be unique, got {names}")
    vals = [_float_val(r, f"result {n!r}") for n, r in zip(names, results)]
    allv, alln = list(vals), list(names)
    rv = None
    if ref is not None:
        rv = _float_val(ref, "ref")
        allv.append(rv)
        alln.append("ref")
        for n, v in zip(names, vals):
            if not _at_least_as_precise(_fmt(rv.dt), _fmt(v.dt)):
                raise ValueError(f"the reference ({rv.dt.name}) is less precise than result "
                                 f"{n!r} ({v.dt.name}); use a reference of higher precision, "
                                 "e.g. fn.run(..., policy='fp64')")
    _check_devices(allv, alln)
    shape = _broadcast(allv, alln)
    vals = [_Val(np.broadcast_to(v.a, shape), v.dt, v.device) for v in vals]
    if rv is not None:
        rv = _Val(np.broadcast_to(rv.a, shape), rv.dt, rv.device)
    n_el = int(np.prod(shape)) if shape else 1
    base = vals[0]
    b64 = base.f64
    r64 = None if rv is None else rv.f64
    rows, ulp_errors = [], {}
    for n, v in zip(names, vals):
        x64 = v.f64
        row: dict = {"dtype": v.dt.name, "numel": n_el}
        both_nan = np.isnan(x64) & np.isnan(b64)
        mism = ~((x64 == b64) | both_nan)
        row["mismatches"] = int(mism.sum())
        row["mismatch_fraction"] = row["mismatches"] / n_el if n_el else 0.0
        nan_m = np.isnan(x64) ^ np.isnan(b64)
        row["nan_mismatches"] = int(nan_m.sum())
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
                err = np.where(both_nan_r := (np.isnan(x64) & np.isnan(r64)), 0.0, err)
                rel = np.where(r64 == 0, np.where(err == 0, 0.0, np.inf), err / np.abs(r64))
                row["max_abs_error"] = float(err.max()) if n_el else 0.0
                row["mean_abs_error"] = float(err.mean()) if n_el else 0.0
                row["max_rel_error"] = float(rel.max()) if n_el else 0.0
                row["rmse"] = _rmse(x64, r64)
                rms = float(np.sqrt(np.mean(np.square(r64))))
                row["rel_rmse"] = row["rmse"] / rms if rms else (0.0 if row["rmse"] == 0 else math.inf)
            ue = _ulp_error_np(x64, r64, _fmt(v.dt))
            ulp_errors[n] = ue
            row["max_ulp_error"] = float(np.max(ue)) if n_el else 0.0
            row["mean_ulp_error"] = float(np.mean(ue)) if n_el else 0.0
            cr = _round_np(r64, _fmt(v.dt))
            ok = (cr == x64) | (np.isnan(cr) & np.isnan(x64))
            row["correctly_rounded"] = float(ok.mean()) if n_el else 1.0
            del both_nan_r
        else:
            ulp_errors[n] = None
        row["same"] = None if v is base else _same(base, v, rv, tol)
        rows.append(row)
    return Comparison(names, vals, rv, tol, rows, ulp_errors)


# ================================================================ near ties

class TieSplit(NamedTuple):
    """Mismatches of two results inside vs outside a near-tie set."""

    inside_mismatches: int
    inside_count: int
    outside_mismatches: int
    outside_count: int

    @property
    def inside_rate(self) -> float:
        return self.inside_mismatches / self.inside_count if self.inside_count else 0.0

    @property
    def outside_rate(self) -> float:
        return self.outside_mismatches / self.outside_count if self.outside_count else 0.0

    @property
    def share_inside(self) -> float:
        """Fraction of all mismatches that lie inside the near-tie set."""
        t = self.inside_mismatches + self.outside_mismatches
        return self.inside_mismatches / t if t else 0.0

    def __str__(self) -> str:
        return (f"near ties: {self.inside_mismatches}/{self.inside_count} mismatched "
                f"({100 * self.inside_rate:.3g}%); elsewhere: {self.outside_mismatches}/"
                f"{self.outside_count} ({100 * self.outside_rate:.3g}%); "
                f"{100 * self.share_inside:.3g}% of mismatches are near ties")


class NearTies:
    """Result of :func:`near_ties`.

    Attributes: ``mask`` (castlab bool tensor), ``distance`` (float64 tensor: signed
    distance of the exact value from the nearest rounding midpoint, in ulps of `dtype`;
    positive = above the midpoint in magnitude), ``count``, ``fraction``, ``dtype``,
    ``within``.
    """

    def __init__(self, mask: np.ndarray, dist: np.ndarray, dt: dtype, within: float, device: str):
        self._mask = mask
        self._dist = dist
        self.dtype = dt
        self.within = within
        self._device = device

    @property
    def mask(self) -> Tensor:
        return _tensor(self._mask)

    @property
    def distance(self) -> Tensor:
        return _tensor(self._dist)

    @property
    def count(self) -> int:
        return int(self._mask.sum())

    @property
    def fraction(self) -> float:
        return self.count / self._mask.size if self._mask.size else 0.0

    def mismatch_rate(self, a: Any, b: Any) -> TieSplit:
        """Split the mismatches between results `a` and `b` into inside vs outside.

        >>> # nt = nm.near_ties(ref, cl.bfloat16, within=0.01); print(nt.mismatch_rate(y1, y2))
        """
        va, vb = _float_val(a, "a"), _float_val(b, "b")
        _check_devices([va, vb], ["a", "b"])
        shape = _broadcast([va, vb, _Val(self._mask, float64, "cpu")], ["a", "b", "ref"])
        if shape != self._mask.shape:
            raise ValueError(f"results of shape {shape} do not match the reference's "
                             f"{self._mask.shape}")
        x, y = np.broadcast_arrays(va.f64, vb.f64)
        mism = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        m = self._mask
        return TieSplit(int((mism & m).sum()), int(m.sum()), int((mism & ~m).sum()), int((~m).sum()))

    def __str__(self) -> str:
        return (f"{self.count} of {self._mask.size} elements ({100 * self.fraction:.4g}%) lie "
                f"within {self.within} ulp of a {self.dtype.name} rounding midpoint")

    __repr__ = __str__


def near_ties(ref: Any, dtype: Any, within: float = 0.01) -> NearTies:
    """Elements whose exact value (`ref`, e.g. the fp64 policy's output) lies within
    `within` ulps of `dtype` of a rounding midpoint of `dtype` (where two correct-looking
    computations can round different ways). ``.mismatch_rate(a, b)`` splits the
    mismatches of two results into inside vs outside that set.

    >>> import castlab as cl, castlab.numerics as nm
    >>> r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-20, 1.25], dtype=cl.float64)
    >>> nm.near_ties(r, cl.bfloat16, within=0.01).mask.tolist()
    [True, True, False]
    """
    if not 0 <= within < 0.5:
        raise ValueError(f"within must be a fraction of an ulp in [0, 0.5), got {within}")
    v = _float_val(ref, "ref")
    f = _fmt(dtype)
    if not _at_least_as_precise(_fmt(v.dt), f) or v.dt is f.dt:
        raise ValueError(f"near_ties needs a reference more precise than {f.name}, got "
                         f"{v.dt.name}")
    r = v.f64
    a = np.abs(r)
    with np.errstate(all="ignore"):
        u = _ulp_np(a, f)
        s = a / u
        t = s - np.floor(s)
        dist = t - 0.5
        ok = np.isfinite(a) & (a <= f.max)
        mask = ok & (np.abs(dist) <= within) & (t != 0)
    dist = np.where(ok, dist, np.nan)
    return NearTies(mask, dist, f.dt, within, v.device)


# ================================================================ explain

def _exact_decimal(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return format(Decimal(v), "f")   # exact: every binary float is a finite decimal


def _hex_bits(v: float, dt: dtype) -> str:
    f = _fmt(dt)
    b = np.array([v], dtype=np.float64).astype(dt.numpy).view(f.uint)[0]
    return f"0x{int(b):0{f.bits // 4}X}"


def _as_jit(fn):
    from ._jit import JitFunction, jit

    if isinstance(fn, JitFunction):
        return fn
    if callable(fn):
        return jit(fn)
    raise TypeError(f"fn must be a castlab.jit function or a callable, got {type(fn).__name__}")


def _bind_args(args) -> tuple:
    if isinstance(args, (list, tuple)):
        args = tuple(args)
    else:
        args = (args,)
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(a)
        elif type(a).__module__.startswith("torch") and hasattr(a, "__dlpack__"):
            from ._dlpack import from_dlpack

            out.append(from_dlpack(a.detach()))
        else:
            out.append(a)
    return tuple(out)


def _combo_label(pol, mth) -> str:
    return f"{pol.describe()}/{mth.name}"


def _combos(policies, maths) -> list:
    from .policy import as_math, as_policy

    if isinstance(policies, (str,)) or not isinstance(policies, (list, tuple)):
        policies = (policies,)
    if isinstance(maths, (str,)) or not isinstance(maths, (list, tuple)):
        maths = (maths,)
    out = []
    for p in policies:
        for m in maths:
            pol, mth = as_policy(p), as_math(m)
            out.append((_combo_label(pol, mth), pol, mth))
    labels = [c[0] for c in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policy/math combinations repeat: {labels}")
    return out


_VIEWS = ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze")


def _node_names(tr) -> dict:
    names = {}
    for i, n in enumerate(tr.inputs):
        names[id(n)] = f"x{i}" if len(tr.inputs) > 1 else "x"
    for i, n in enumerate(tr.captured_nodes):
        names[id(n)] = f"c{i}"
    for n in tr.nodes:
        names[id(n)] = f"%{n.index}"
    return names


def _node_expr(n, names) -> str:
    if n.op in ("input",):
        return f"{names[id(n)]} (input)"
    args = []
    for a in n.inputs:
        args.append(repr(a.value) if a.op == "scalar" else names.get(id(a), "?"))
    if n.op in _VIEWS:
        try:
            from ._jit import _vop_args

            args.append(_vop_args(n))
        except Exception:  # pragma: no cover - description only
            pass
    return f"{names[id(n)]} = {n.op}({', '.join(args)})"


def _all_values(jf, args, pol, mth, tr) -> dict:
    """id(node) -> tensor for inputs, op nodes (register precision) and views."""
    from . import ops

    vals = {}
    for n, t in jf.node_values(*args, policy=pol, math=mth):
        vals[id(n)] = t
    for n, t in zip(tr.captured_nodes, tr.captured):
        vals[id(n)] = t
    for n in tr.nodes:
        if n.op in _VIEWS and id(n.inputs[0]) in vals:
            vals[id(n)] = ops._view(vals[id(n.inputs[0])], n.attrs["vop"])
    return vals


def _map_index(shape: tuple, out_shape: tuple, index: tuple):
    """Index into a tensor of `shape` broadcast to `out_shape` at `index`, or None."""
    if len(shape) > len(out_shape):
        return None
    try:
        if np.broadcast_shapes(shape, out_shape) != tuple(out_shape):
            return None
    except ValueError:
        return None
    off = len(out_shape) - len(shape)
    return tuple(0 if s == 1 else index[off + k] for k, s in enumerate(shape))


def _source_index(n, tr, index_in_n: tuple):
    """For a view node, (input name, index into the input) reached through views."""
    from . import ops
    from ._creation import arange

    chain = []
    cur = n
    while cur.op in _VIEWS:
        chain.append(cur.attrs["vop"])
        cur = cur.inputs[0]
    if cur.op != "input":
        return None
    numel = int(np.prod(cur.shape)) if cur.shape else 1
    t = arange(numel).reshape(list(cur.shape)) if cur.shape else arange(1).reshape([])
    for vop in reversed(chain):
        t = ops._view(t, vop)
    flat = int(t.numpy()[index_in_n])
    return cur, tuple(int(i) for i in np.unravel_index(flat, cur.shape))


@dataclasses.dataclass
class _Outcome:
    label: str
    value: float            # before the output rounding (register precision)
    value_dtype: dtype
    rounded: float          # the output element
    out_bits: str
    lo: float
    hi: float
    mid: float
    position: str           # "exact", "below midpoint", "above midpoint", "on midpoint (tie)"
    direction: str          # "up", "down", "none"
    correct: bool
    consistent: bool        # round(value) == rounded


class Explanation:
    """Result of :func:`explain`; print it, or display it in Jupyter.

    Attributes: ``index``, ``dtype`` (output dtype), ``exact`` (fp64 reference value),
    ``lo``, ``hi``, ``midpoint`` (floats), ``correctly_rounded`` (float), ``nodes`` (list
    of dicts: node label, then per combination the value, exact decimal and hex bits),
    ``outcomes`` (per combination: value before rounding, rounded output, position
    relative to the midpoint, direction, correct or not), ``why`` (str).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def _out_lines(self) -> list:
        f = self.dtype
        u = self.hi - self.lo if self.hi != self.lo else float(_ulp_np(np.array([self.exact]), _fmt(f))[0])
        L = []
        L.append(f"output {self.out_label}  {f.name} at {self.index}")
        L.append(f"  exact (fp64 reference)   {_exact_decimal(self.exact)}  ({self.exact!r}, bits "
                 f"{_hex_bits(self.exact, float64)})")
        L.append(f"  {f.short} neighbours           {_exact_decimal(self.lo)} ({_hex_bits(self.lo, f)})"
                 f"  and  {_exact_decimal(self.hi)} ({_hex_bits(self.hi, f)})")
        if self.lo != self.hi:
            dm = Fraction(self.exact) - Fraction(self.midpoint)
            L.append(f"  midpoint                 {_exact_decimal(self.midpoint)}")
            L.append(f"  exact - midpoint         {float(dm):+.6g}  ({float(dm / Fraction(u)):+.6g} ulp)")
            L.append(f"  correctly rounded        {_exact_decimal(self.correctly_rounded)} "
                     f"({_hex_bits(self.correctly_rounded, f)}), "
                     f"{'up' if self.correctly_rounded > self.exact else 'down'} from the exact value")
        else:
            L.append("  the exact value is representable")
        return L

    def _outcome_rows(self) -> tuple:
        headers = ["policy/math", "value before rounding (exact decimal)", "bits",
                   "value - midpoint", "", "rounded to", "bits", "way", "correctly rounded"]
        rows = []
        for o in self.outcomes:
            dm = Fraction(o.value) - Fraction(o.mid) if o.lo != o.hi else Fraction(0)
            u = Fraction(o.hi) - Fraction(o.lo) if o.lo != o.hi else Fraction(1)
            rows.append([o.label, _exact_decimal(o.value), _hex_bits(o.value, o.value_dtype),
                         "-" if o.lo == o.hi else f"{float(dm):+.4g} ({float(dm / u):+.4g} ulp)",
                         o.position, _exact_decimal(o.rounded), o.out_bits, o.direction,
                         "yes" if o.correct else "NO"])
        return headers, rows

    def _node_rows(self) -> tuple:
        headers = ["node", "at", "fp64 reference"] + [o.label for o in self.outcomes]
        rows = []
        for nd in self.nodes:
            r = [nd["label"], nd["at"]]
            for v in nd["values"]:
                r.append("n/a" if v is None else f"{_exact_decimal(v[0])} [{v[1]}]")
            rows.append(r)
        return headers, rows

    def __str__(self) -> str:
        L = [f"castlab explain: {self.fn_name} at output index {self.index}"]
        L += self._out_lines()
        L.append("")
        L.append(_text_table(*self._outcome_rows()))
        L.append("")
        L.append("node values (exact decimal [hex bits, register precision]):")
        L.append(_text_table(*self._node_rows()))
        L.append("")
        L.append("why: " + self.why)
        return "\n".join(L)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = _html.escape
        h = [f"<div><b>castlab explain: {e(self.fn_name)} at output index {e(str(self.index))}</b>"]
        h.append("<pre>" + e("\n".join(self._out_lines())) + "</pre>")
        h.append(_html_table(*self._outcome_rows(), "rounding of the output"))
        h.append(_html_table(*self._node_rows(), "node values (exact decimal [hex bits])"))
        h.append(f"<p><b>why:</b> {e(self.why)}</p></div>")
        return "".join(h)

    def to_dict(self) -> dict:
        return {"index": self.index, "dtype": self.dtype.name, "exact": self.exact, "lo": self.lo,
                "hi": self.hi, "midpoint": self.midpoint,
                "correctly_rounded": self.correctly_rounded,
                "outcomes": [dataclasses.asdict(o) | {"value_dtype": o.value_dtype.name}
                             for o in self.outcomes],
                "why": self.why}


def _norm_index(index, shape) -> tuple:
    if isinstance(index, (int, np.integer)):
        index = (int(index),)
    if not isinstance(index, (tuple, list)) or not all(isinstance(i, (int, np.integer)) for i in index):
        raise TypeError(f"index must be a tuple of ints, got {index!r}")
    index = tuple(int(i) for i in index)
    if len(index) != len(shape):
        raise IndexError(f"index {index} has {len(index)} dimensions, the output has "
                         f"{len(shape)} (shape {tuple(shape)})")
    out = []
    for k, (i, s) in enumerate(zip(index, shape)):
        if not -s <= i < s:
            raise IndexError(f"index {i} is out of range for dimension {k} of size {s} "
                             f"(output shape {tuple(shape)})")
        out.append(i % s)
    return tuple(out)


def explain(fn: Any, args: Any, index: Any, policies: Any = ("eager", "fused"),
            maths: Any = ("torch_eager",), *, output: int = 0,
            ref_math: Any = "torch_eager") -> Explanation:
    """Why one output element comes out as it does under each policy/math combination.

    For the output element at `index`: the exact value (the ``fp64`` policy's), the two
    neighbouring values of the output dtype around it, their midpoint and the distances;
    for each (policy, math) the output's value before its final rounding (exact decimal
    and hex bits), where it lies relative to the midpoint, which way it was rounded and
    whether that is the correctly rounded result; and the value of every node of the
    trace at that element (nodes whose shape broadcasts to the output's; view nodes also
    name the input element they read).

    >>> import castlab as cl, castlab.numerics as nm
    >>> @cl.jit
    ... def swiglu(x):
    ...     a, b = cl.chunk(x, 2, dim=-1)
    ...     return cl.silu(a) * b
    >>> x = cl.rand(8, 8, seed=0, dtype=cl.bfloat16)
    >>> print(nm.explain(swiglu, (x,), (1, 2), policies="fused",
    ...                  maths=("inductor", "transformer_engine")))   # doctest: +SKIP
    """
    from .policy import as_math, as_policy

    jf = _as_jit(fn)
    args = _bind_args(args)
    combos = _combos(policies, maths)
    tr = jf.graph(*args)
    if not -len(tr.outputs) <= output < len(tr.outputs):
        raise IndexError(f"output {output} out of range: the function returns "
                         f"{len(tr.outputs)} tensor(s)")
    out_node = tr.outputs[output]
    out_shape = tuple(out_node.shape)
    index = _norm_index(index, out_shape)
    if not out_node.dtype.is_floating_point:
        raise TypeError(f"explain needs a floating-point output, this one is {out_node.dtype.name}")

    def pick(res):
        if isinstance(res, (tuple, list)):
            return res[output]
        return res

    ref_pol, ref_m = as_policy("fp64"), as_math(ref_math)
    ref_out = pick(jf.run(*args, policy=ref_pol, math=ref_m))
    exact = float(_val(ref_out).f64[index])
    ref_vals = _all_values(jf, args, ref_pol, ref_m, tr)
    names = _node_names(tr)
    node_list = list(tr.inputs) + list(tr.captured_nodes) + list(tr.nodes)

    outcomes, combo_vals, out_dts = [], [], []
    for label, pol, mth in combos:
        res = _val(pick(jf.run(*args, policy=pol, math=mth)))
        odt = res.dt
        out_dts.append(odt)
        f = _fmt(odt)
        rounded = float(res.f64[index])
        vals = _all_values(jf, args, pol, mth, tr)
        combo_vals.append(vals)
        # the output node before its last rounding
        if out_node.op in ("input",) or out_node.op in _VIEWS:
            pre = _val(vals[id(out_node)])
        else:
            if pol.rounds_after(out_node.index, out_node.op) and pol.round_after != "none":
                keep = tuple(n.index for n in tr.nodes
                             if n is not out_node and n.op not in _VIEWS
                             and pol.rounds_after(n.index, n.op))
                pol2 = dataclasses.replace(pol, round_after=keep)
                pre_vals = {id(n): t for n, t in jf.node_values(*args, policy=pol2, math=mth)}
                pre = _val(pre_vals[id(out_node)])
            else:
                pre = _val(vals[id(out_node)])
        value = float(pre.f64[index])
        lo, hi, _ = _neighbours_np(np.array([value]), f)
        lo, hi = float(lo[0]), float(hi[0])
        mid = (lo + hi) / 2
        cr_value = float(_round_np(np.array([value]), f)[0])
        if lo == hi:
            position, direction = "exact", "none"
        else:
            position = ("on the midpoint: tie, to even" if value == mid else
                        "above the midpoint" if value > mid else "below the midpoint")
            direction = "up" if rounded > value else ("down" if rounded < value else "none")
        cr = float(_round_np(np.array([exact]), f)[0])
        outcomes.append(_Outcome(label, value, pre.dt, rounded, _hex_bits(rounded, odt), lo, hi, mid,
                                 position, direction, rounded == cr or (math.isnan(rounded) and math.isnan(cr)),
                                 cr_value == rounded or (math.isnan(cr_value) and math.isnan(rounded))))
    odt = next((d for d in out_dts if d is not float64), out_dts[0])
    f = _fmt(odt)
    lo, hi, _ = _neighbours_np(np.array([exact]), f)
    lo, hi = float(lo[0]), float(hi[0])
    mid = (lo + hi) / 2
    cr = float(_round_np(np.array([exact]), f)[0])

    nodes = []
    for n in node_list:
        if n.op == "scalar":
            continue
        idx = _map_index(tuple(n.shape), out_shape, index)
        label = _node_expr(n, names)
        at = "-"
        if idx is not None and n.op in _VIEWS:
            src = _source_index(n, tr, idx)
            if src is not None:
                at = f"{names[id(src[0])]}{list(src[1])}"
        elif idx is not None:
            at = str(list(idx))
        if n is out_node:
            label += "  (output)"
        row_vals = []
        for vals in [ref_vals] + combo_vals:
            t = vals.get(id(n))
            if idx is None or t is None:
                row_vals.append(None)
                continue
            v = _val(t)
            x = float(v.f64[idx])
            row_vals.append((x, _hex_bits(x, v.dt)))
        if idx is None:
            label += f"  [shape {list(n.shape)}]"
        nodes.append({"label": label, "at": at, "values": row_vals})

    why = _why(outcomes, exact, lo, hi, mid, cr, odt)
    return Explanation(fn_name=getattr(jf.fn, "__name__", "fn"), index=index, dtype=odt,
                       exact=exact, lo=lo, hi=hi, midpoint=mid, correctly_rounded=cr,
                       outcomes=outcomes, nodes=nodes, why=why,
                       out_label=_node_expr(out_node, names))


def _why(outcomes, exact, lo, hi, mid, cr, odt) -> str:
    s = []
    if lo == hi:
        s.append(f"the exact value {exact!r} is representable in {odt.name}.")
    else:
        side = "above" if exact > mid else ("below" if exact < mid else "exactly on")
        s.append(f"the exact value {_exact_decimal(exact)} lies {side} the {odt.short} midpoint "
                 f"{_exact_decimal(mid)}, so the correctly rounded result is {_exact_decimal(cr)}.")
    distinct = {o.rounded for o in outcomes}
    if len(distinct) == 1 and len(outcomes) > 1:
        s.append("All combinations give the same output.")
    for o in outcomes:
        if o.lo == o.hi:
            s.append(f"{o.label}: the value before rounding, {_exact_decimal(o.value)}, is "
                     f"representable: output {_exact_decimal(o.rounded)}.")
            continue
        where = ("lands exactly on the midpoint " + _exact_decimal(o.mid)
                 + " and the tie rounds to even, " + o.direction)
        if not o.position.startswith("on"):
            dm = Fraction(o.value) - Fraction(o.mid)
            where = (f"is {_exact_decimal(o.value)}, {abs(float(dm)):.3g} "
                     f"{'above' if dm > 0 else 'below'} the midpoint {_exact_decimal(o.mid)}, "
                     f"and rounds {o.direction}")
        s.append(f"{o.label} {where}, to {_exact_decimal(o.rounded)}"
                 f" ({'correctly rounded' if o.correct else 'not the correctly rounded value'}).")
    return " ".join(s)


# ================================================================ drift

@dataclasses.dataclass
class Divergence:
    """The first node at which the policy/math combinations' values differ."""

    index: int        # node.index in the trace (-1 for the output row)
    op: str
    label: str
    mismatches: int   # elements that differ between some two combinations
    numel: int
    combos: tuple     # the combinations that differ from the first one there

    def __str__(self) -> str:
        return (f"{self.label}: {self.mismatches}/{self.numel} elements differ "
                f"({', '.join(self.combos)} vs the first)")


class Drift:
    """Result of :func:`drift`: ``rows`` (one dict per node and combination: node, op,
    dtype, combo, max_ulp, mean_ulp, rel_rmse, correctly_rounded), ``first_divergence``
    (:class:`Divergence` or None), ``combos`` (labels); ``to_frame()``, text and HTML."""

    def __init__(self, fn_name, combos, rows, first_divergence, node_labels):
        self.fn_name = fn_name
        self.combos = combos
        self.rows = rows
        self.first_divergence = first_divergence
        self.node_labels = node_labels

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict:
        return {"combos": list(self.combos), "rows": [dict(r) for r in self.rows],
                "first_divergence": None if self.first_divergence is None
                else dataclasses.asdict(self.first_divergence)}

    def _table(self) -> tuple:
        headers = ["node", "dtype"]
        for c in self.combos:
            headers += [f"{c} max ulp", "mean ulp", "rel RMSE", "corr. rounded"]
        by = {}
        for r in self.rows:
            by.setdefault(r["node"], {"dtype": r["dtype"]})[r["combo"]] = r
        rows = []
        for node in self.node_labels:
            d = by[node]
            row = [node, d["dtype"]]
            for c in self.combos:
                r = d[c]
                row += [r["max_ulp"], r["mean_ulp"], r["rel_rmse"],
                        f"{100 * r['correctly_rounded']:.2f}%"]
            rows.append(row)
        return headers, rows

    def _caption(self) -> str:
        fd = self.first_divergence
        return (f"castlab drift: {self.fn_name}, error vs fp64 per node (ulps of the node's "
                f"dtype); drift starts at: {fd if fd is not None else 'no divergence'}")

    def __str__(self) -> str:
        return self._caption() + "\n" + _text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(*self._table(), self._caption())


def drift(fn: Any, args: Any, policies: Any = ("eager", "fused"), maths: Any = ("torch_eager",),
          *, ref_math: Any = "torch_eager") -> Drift:
    """Per node of the trace, the error of each policy/math combination against the
    ``fp64`` policy (max and mean ulp error in the node's storage dtype, relative RMSE,
    fraction that rounds to the correctly rounded value), plus a final ``output`` row
    (what the function returns), and ``first_divergence``: the first node at which the
    combinations' values differ, i.e. where the drift starts.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> d = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),))
    >>> d.first_divergence.op
    'silu'
    """
    from .policy import as_math, as_policy

    jf = _as_jit(fn)
    args = _bind_args(args)
    combos = _combos(policies, maths)
    tr = jf.graph(*args)
    ref_pol, ref_m = as_policy("fp64"), as_math(ref_math)
    ref = {id(n): t for n, t in jf.node_values(*args, policy=ref_pol, math=ref_m)}
    ref_out = jf.run(*args, policy=ref_pol, math=ref_m)
    ref_outs = list(ref_out) if isinstance(ref_out, (tuple, list)) else [ref_out]
    per = []
    outs = []
    for _label, pol, mth in combos:
        per.append({id(n): t for n, t in jf.node_values(*args, policy=pol, math=mth)})
        o = jf.run(*args, policy=pol, math=mth)
        outs.append(list(o) if isinstance(o, (tuple, list)) else [o])
    names = _node_names(tr)
    rows, labels = [], []
    first = None

    def metrics(x64, r64, dt):
        f = _fmt(dt)
        ue = _ulp_error_np(x64, r64, f)
        rms = float(np.sqrt(np.mean(np.square(r64)))) if r64.size else 0.0
        e = _rmse(x64, r64)
        crr = _round_np(r64, f)
        cx = _round_np(x64, f)
        ok = (crr == cx) | (np.isnan(crr) & np.isnan(cx))
        return (float(np.max(ue)) if ue.size else 0.0, float(np.mean(ue)) if ue.size else 0.0,
                e / rms if rms else (0.0 if e == 0 else math.inf), float(ok.mean()) if ok.size else 1.0)

    def add(label, op, idx, dt, xs, r64):
        labels.append(label)
        nonlocal first
        for (clabel, _, _), x64 in zip(combos, xs):
            mx, mean, rr, crf = metrics(x64, r64, dt)
            rows.append({"node": label, "index": idx, "op": op, "dtype": dt.name, "combo": clabel,
                         "max_ulp": mx, "mean_ulp": mean, "rel_rmse": rr, "correctly_rounded": crf})
        if first is None and len(xs) > 1:
            diff = np.zeros(xs[0].shape, dtype=bool)
            who = []
            for (clabel, _, _), x in zip(combos[1:], xs[1:]):
                d = ~((x == xs[0]) | (np.isnan(x) & np.isnan(xs[0])))
                if d.any():
                    who.append(clabel)
                diff |= d
            if diff.any():
                first = Divergence(idx, op, label, int(diff.sum()), int(diff.size), tuple(who))

    for n in tr.nodes:
        if n.op in _VIEWS or n.op == "scalar" or not n.dtype.is_floating_point:
            continue
        if id(n) not in ref:
            continue
        add(_node_expr(n, names), n.op, n.index, n.dtype, [_val(p[id(n)]).f64 for p in per],
            _val(ref[id(n)]).f64)
    for k, on in enumerate(tr.outputs):
        xs = [_val(o[k]) for o in outs]
        add(f"output{k if len(tr.outputs) > 1 else ''} ({names.get(id(on), '?')} rounded)",
            "output", -1, xs[0].dt, [x.f64 for x in xs], _val(ref_outs[k]).f64)
    return Drift(getattr(jf.fn, "__name__", "fn"), [c[0] for c in combos], rows, first, labels)
