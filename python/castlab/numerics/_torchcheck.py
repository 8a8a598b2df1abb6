"""PyTorch-compatible checks: ``torch.testing.assert_close``'s default tolerances and
message, and the accuracy gate ``torch._dynamo.utils.same()`` with the numbers behind
its verdict. The arithmetic is done as PyTorch does it (in the common dtype, each op
rounded), so the verdicts and messages match PyTorch's."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from .. import ops
from .._dtype import as_dtype, float64, promote_types
from ._formats import _broadcast, _check_devices, _float_val, _fmt, _rmse, _round_np, _tensor, _Val

__all__ = ["default_tolerances", "assert_close_message", "same", "SameVerdict"]


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
    if (rtol is None) != (atol is None):  # (as torch.testing.assert_close)
        raise ValueError("assert_close_message: give both rtol and atol, or neither")
    if rtol is not None:
        rtol = _check_tol("assert_close_message", rtol, "rtol")
        atol = _check_tol("assert_close_message", atol, "atol")
    if not isinstance(equal_nan, (bool, np.bool_)):
        raise TypeError(f"assert_close_message: equal_nan must be True or False, got "
                        f"{equal_nan!r}")
    va, ve = _float_val(actual, "actual"), _float_val(expected, "expected")
    _check_devices([va, ve], ["actual", "expected"])
    _broadcast([va, ve], ["actual", "expected"])
    return _assert_close_msg(va, ve, rtol, atol, equal_nan)


@dataclasses.dataclass
class SameVerdict:
    """PyTorch's ``torch._dynamo.utils.same(baseline, result, fp64_ref)`` outcome, with
    the numbers behind it; truthy when it passes. Returned by :func:`same` and in the
    ``same`` column of :func:`compare`.

    >>> import castlab as cl, castlab.numerics as nm
    >>> v = nm.same(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]))
    >>> bool(v), v.reason
    (False, 'not allclose (tol=0.0001); no fp64 reference')
    >>> print(v)
    FAIL (not allclose (tol=0.0001); no fp64 reference)
    """

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


def _check_tol(fn: str, tol: Any, what: str = "tol") -> float:
    """`tol` as a float: a real number (TypeError otherwise), finite or inf, >= 0
    (ValueError for negative or NaN)."""
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, numbers.Real):
        raise TypeError(f"{fn}: {what} must be a real number, got {type(tol).__name__} {tol!r}")
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"{fn}: {what} must be >= 0 (and not NaN), got {tol}")
    return tol


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
    return _rmse_verdict(_rmse(r64, b64), _rmse(r64, x64), res.dt, b64.shape, tol, equal_nan)


def _rmse_verdict(ref_error: float, res_error: float, dt, shape: tuple, tol: float,
                  equal_nan: bool = False) -> SameVerdict:
    """same()'s RMSE rule: pass iff RMSE(fp64, result) <= m * RMSE(fp64, baseline) +
    tol/10, m = 3 for bf16/fp16 results, small tensors, [..., 1, 1] shapes and large
    tolerances, else 2 (torch._dynamo.utils.same)."""
    n = int(np.prod(shape)) if len(shape) else 1
    mult = 3.0 if dt.name in ("float16", "bfloat16") else 2.0
    if n < 1000 or (len(shape) == 4 and shape[-1] == shape[-2] == 1) or tol >= 2e-2:
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
    tol = _check_tol("same", tol)
    vb, vr = _float_val(baseline, "baseline"), _float_val(result, "result")
    v64 = None if fp64_ref is None else _float_val(fp64_ref, "fp64_ref")
    vals = [vb, vr] + ([v64] if v64 is not None else [])
    nms = ["baseline", "result", "fp64_ref"][:len(vals)]
    _check_devices(vals, nms)
    _broadcast(vals, nms)
    return _same(vb, vr, v64, tol, equal_nan)
