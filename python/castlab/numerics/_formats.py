"""Formats, values and ULPs: the dtype descriptions, the conversion of inputs (castlab,
PyTorch, NumPy) to host arrays, ULP distances and errors, and rounding once, directly,
from fp64 to a narrow format."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

from .. import _C
from .._creation import from_numpy
from .._dlpack import from_dlpack
from .._dtype import as_dtype, dtype, float64
from .._graph import elementwise
from .._lower import input_node, lower
from ..ops import broadcast_to, contiguous
from ..policy import Policy, current_math

__all__ = ["ulp", "ulp_diff", "ulp_error", "round_to", "neighbours"]

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

def _f64(a: np.ndarray) -> np.ndarray:
    """`a` as float64 (no copy when it already is)."""
    if a.dtype == np.float64:
        return a
    with np.errstate(invalid="ignore"):  # NaN payloads of narrow types
        return a.astype(np.float64)


class _Val:
    """A value converted for the metrics: NumPy array (host), castlab dtype, device."""

    __slots__ = ("a", "dt", "device")

    def __init__(self, a: np.ndarray, dt: dtype, device: str):
        self.a, self.dt, self.device = a, dt, device

    @property
    def f64(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # NaN payloads of narrow types
            return self.a.astype(np.float64)

    @property
    def shape(self) -> tuple:
        return tuple(self.a.shape)


class _DevVal(_Val):
    """A value that stays on its device: ``t`` is the castlab tensor; the host array ``a``
    is copied on first use only (per-element views, :meth:`Comparison.worst`)."""

    __slots__ = ("t", "_a")

    def __init__(self, t: Tensor, dt: dtype, device: str):  # noqa: D107
        self.t, self.dt, self.device, self._a = t, dt, device, None

    @property
    def a(self) -> np.ndarray:   # type: ignore[override]
        if self._a is None:
            self._a = self.t.cpu().numpy()
        return self._a

    @property
    def shape(self) -> tuple:
        return tuple(self.t.shape)


def _device_tensor(x: Any):
    """`x` as a castlab tensor on its own device (torch tensors zero-copy through DLPack),
    or None when it is not a castlab or torch tensor."""
    if isinstance(x, Tensor):
        return x
    if type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__"):
        return from_dlpack(x.detach())
    return None


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


def _check_float(dt: dtype, what: str) -> None:
    if not dt.is_floating_point:
        raise TypeError(f"{what} has dtype {dt.name}; ULP metrics need a floating-point "
                        "dtype (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2)")


def _float_val(x: Any, what: str) -> _Val:
    v = _val(x, what)
    _check_float(v.dt, what)
    return v


def _float_tensor(x: Any, what: str) -> Tensor:
    """`x` as a castlab tensor on its own device (castlab and torch tensors without a
    copy, NumPy arrays and Python numbers as CPU tensors), of a floating-point dtype."""
    t = _device_tensor(x)
    if t is None:
        t = _tensor(_val(x, what).a)
    _check_float(t.dtype, what)
    return t


def _check_devices(vals: list, names: list) -> None:
    devs = {v.device for v in vals}
    if len(devs) > 1:
        where = ", ".join(f"{n}: {v.device}" for n, v in zip(names, vals))
        raise ValueError(f"tensors are on different devices ({where}); move them to one "
                         "device first (e.g. .cpu())")


def _broadcast(vals: list, names: list) -> tuple:
    try:
        return np.broadcast_shapes(*[v.shape for v in vals])
    except ValueError:
        shapes = ", ".join(f"{n}: {v.shape}" for n, v in zip(names, vals))
        raise ValueError(f"shapes do not match and cannot be broadcast together ({shapes})") from None


def _dense(v: _DevVal, shape: tuple) -> _DevVal:
    """`v` broadcast to `shape` and contiguous, on its device (a copy only when needed)."""
    t = v.t
    if tuple(t.shape) != tuple(shape):
        t = broadcast_to(t, tuple(shape))
    if not t.is_contiguous():
        t = contiguous(t)
    return v if t is v.t else _DevVal(t, v.dt, v.device)


def _dense_tensors(ts: list, names: list) -> tuple:
    """Tensors of one device broadcast to their common shape, each contiguous (castlab's
    elementwise kernels read them flat), and that shape."""
    vals = [_DevVal(t, t.dtype, str(t.device)) for t in ts]
    _check_devices(vals, names)
    shape = _broadcast(vals, names)
    return [_dense(v, shape).t for v in vals], shape


def _tensor(a: np.ndarray) -> Tensor:
    return from_numpy(np.ascontiguousarray(a))


# ================================================================ ulp primitives

def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) exactly, for finite a > 0 (float64)."""
    _, e = np.frexp(a)
    return e.astype(np.int64) - 1


def _ulp_np(r: np.ndarray, f: _Fmt) -> np.ndarray:
    """ulp(r) for format f, elementwise, from the fp64 bits: 2**floor(log2|r|) is |r| with
    its mantissa bits cleared (exact for normal fp64 values), scaled by 2**-p (exact) and
    floored at 2**(emin-p) (which also covers 0 and fp64 subnormals, whose floor(log2) is
    below every format's emin); inf for inf, NaN for NaN."""
    a = np.abs(np.asarray(r, dtype=np.float64))
    e = (a.view(np.uint64) & np.uint64(0x7FF0000000000000)).view(np.float64)
    u = np.asarray(np.maximum(e * math.ldexp(1.0, -f.p), math.ldexp(1.0, f.emin - f.p)))
    if u.ndim == 0:
        return np.where(np.isnan(a), np.nan, u)
    nan = np.isnan(a)
    if nan.any():
        u[nan] = np.nan
    return u


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
    one to the other. Returns an int64 castlab tensor (broadcast shape), computed by
    castlab's code on the operands' device.

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
    ta, tb = _float_tensor(a, "a"), _float_tensor(b, "b")
    if ta.dtype is not tb.dtype:
        raise TypeError(f"ulp_diff needs two tensors of one dtype, got {ta.dtype.name} and "
                        f"{tb.dtype.name}; to measure a result against a more precise "
                        "reference use ulp_error(x, ref)")
    (ta, tb), _ = _dense_tensors([ta, tb], ["a", "b"])
    d, nan_mismatch = _C._ulp_diff(ta, tb)
    return (d, nan_mismatch) if return_nan_mask else d


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
    rounded x has error <= 0.5. Returns a float64 tensor on the operands' device
    (castlab's code: CPU threads or the GPU); NaN vs NaN and equal infinities are 0, NaN vs
    a number is NaN, a finite x against an infinite ref is inf.

    `dtype` overrides the format the ulps are counted in (e.g. a bf16 node held in fp32
    registers).

    >>> import castlab as cl, castlab.numerics as nm
    >>> x = cl.tensor([1.0], dtype=cl.bfloat16)
    >>> nm.ulp_error(x, cl.tensor([1.001953125], dtype=cl.float64)).tolist()
    [0.25]
    """
    tx, tr = _float_tensor(x, "x"), _float_tensor(ref, "ref")
    f = _fmt(tx.dtype if dtype is None else dtype)
    if dtype is None and not _at_least_as_precise(_fmt(tr.dtype), f):
        raise ValueError(f"the reference ({tr.dtype.name}) is less precise than the result "
                         f"({tx.dtype.name}); pass a reference of higher precision (e.g. the "
                         "fp64 policy's output)")
    (tx, tr), _ = _dense_tensors([tx, tr], ["x", "ref"])
    return _C._ulp_error(tx, tr, f.dt.name)


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.mean(np.square(a - b))))


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


def _round_narrow_np(r: np.ndarray, f: _Fmt, saturate: bool | None = None) -> np.ndarray:
    """fp64 values rounded once, directly, to format f by castlab's own conversion
    (core/convert.h), as an array of f's dtype (see :func:`_round_np`)."""
    r = np.ascontiguousarray(r, dtype=np.float64)
    t = from_numpy(r)
    node = elementwise("astype", [input_node(t, 0)], {"dtype": f.dt})
    policy = Policy.eager(saturate=True if saturate is None else bool(saturate))
    plan, out = lower([node], [t], policy, current_math())
    plan.run([t], out)
    return out[0].numpy()


def _round_np(r: np.ndarray, f: _Fmt, saturate: bool | None = None) -> np.ndarray:
    """Round fp64 values once, directly, to format f (nearest, ties to even) with castlab's
    own conversion (core/convert.h) and return them as float64. Overflow gives inf (bf16,
    fp16, fp32, e5m2 unless saturated) or, for fp8, the largest finite value (saturate,
    castlab's default) / NaN (e4m3fn without saturation)."""
    r = np.ascontiguousarray(r, dtype=np.float64)
    if f.bits == 64:
        return r.copy()
    m = _round_narrow_np(r, f, saturate).astype(np.float64)
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
    if saturate is not None and not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"round_to: saturate must be True, False or None, got "
                        f"{type(saturate).__name__} {saturate!r}")
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
