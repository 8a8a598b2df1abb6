"""Golden comparison: :func:`compare` measures results of one computation against each
other and against a more precise reference, one row of metrics per result
(:class:`Comparison`)."""

from __future__ import annotations

import html as _html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _C
from .._dtype import float64
from ._formats import (
    _at_least_as_precise,
    _broadcast,
    _check_devices,
    _check_float,
    _dense,
    _device_tensor,
    _DevVal,
    _f64,
    _float_val,
    _fmt,
    _round_np,
    _ulp_error_np,
    _ulp_np,
    _Val,
)
from ._metrics import _LEAF, _flat, kernel_scan, scan
from ._tables import _html_table, _text_table
from ._torchcheck import (
    SameVerdict,
    _assert_close_msg,
    _check_tol,
    _isclose_torch,
    _rmse_verdict,
    _same,
)

__all__ = ["compare", "Comparison"]


# ================================================================ compare

_COLUMNS = [
    ("dtype", "dtype"), ("mismatches", "mismatch"), ("mismatch_fraction", "mismatch %"),
    ("max_ulp_apart", "max ulp apart"), ("nan_mismatches", "NaN mism."),
    ("max_abs_error", "max abs err"), ("mean_abs_error", "mean abs err"),
    ("max_rel_error", "max rel err"), ("rmse", "RMSE"), ("rel_rmse", "rel RMSE"),
    ("max_ulp_error", "max ulp err"), ("mean_ulp_error", "mean ulp err"),
    ("max_ulp_error_at_scale", "max ulp err @scale"), ("worst_index", "worst index"),
    ("correctly_rounded", "correctly rounded"), ("same", "same() vs first"),
]

_LEGEND = ("max ulp err: |x - ref| / ulp(ref), per element (it explodes where ref is tiny, "
           "e.g. after cancellation); max ulp err @scale: max |x - ref| / ulp(max |ref|), in "
           "ulps of the largest reference magnitude.\nworst index: the element with the "
           "largest per-element ulp err (Comparison.worst(name)); explain(fn, args, index) shows why.")


def _element(v: _Val, idx: tuple) -> float:
    """One element as a Python float; a value kept on a GPU copies only that element."""
    if isinstance(v, _DevVal) and v._a is None:
        return float(_f64(v.t[idx].cpu().numpy()))
    return float(_f64(np.asarray(v.a[idx])))


def _bits(v: float, dt) -> str:
    f = _fmt(dt)
    with np.errstate(invalid="ignore", over="ignore"):
        b = np.array([v], dtype=np.float64).astype(dt.numpy).view(f.uint)[0]
    return f"0x{int(b):0{f.bits // 4}X}"


class _UlpErrors(Mapping):
    """``{name: per-element ulp errors}`` computed on first access (float64 arrays)."""

    def __init__(self, c):
        self._c = c
        self._cache: dict = {}

    def __getitem__(self, name):
        k = self._c._index(name) if not isinstance(name, int) else name
        name = self._c.names[k]
        if name not in self._cache:
            c = self._c
            self._cache[name] = None if c._ref is None else _ulp_error_np(
                c._vals[k].f64, c._ref.f64, _fmt(c._vals[k].dt))
        return self._cache[name]

    def __iter__(self):
        return iter(self._c.names)

    def __len__(self):
        return len(self._c.names)


class Comparison:
    """Result of :func:`compare`: one row of metrics per result.

    Attributes: ``names``, ``rows`` (list of dicts, keys as in :meth:`to_dict`),
    ``ref_dtype``. Per-element arrays for plots, computed when asked for:
    ``ulp_errors[name]`` (float64 NumPy, None without a reference), ``values[name]``
    (float64 NumPy), ``ref_values``.

    Two ulp errors against the reference (x a result, r the reference, ulp() in x's
    format, see :func:`ulp`):

    * ``max_ulp_error`` / ``mean_ulp_error``: per element, |x - r| / ulp(r). A correctly
      rounded element has at most 0.5. Where r is tiny (cancellation: RoPE's
      ``q*cos - q'*sin`` near 0, a sum that should be 0) ulp(r) is tiny too and this
      explodes (thousands of ulps, or 1e37 where r is 0 and x is not) although x is
      as good as its inputs allow.
    * ``max_ulp_error_at_scale``: max |x - r| / ulp(max |r|), the error in ulps of the
      largest finite reference magnitude of the tensor: it does not explode under
      cancellation and says how many ulps of the tensor's scale the worst error is.

    ``worst_index`` is the multi-index of the element with the largest per-element ulp
    error (the first one; NaN counts largest); :meth:`worst` gives its values and
    :func:`explain` shows why it came out so.

    >>> import castlab as cl, castlab.numerics as nm
    >>> c = nm.compare(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]), names=["a", "b"])
    >>> c.to_dict()["b"]["mismatches"]
    1
    """

    def __init__(self, names, vals, ref, tol, rows, worst=None, scale=None):
        self.names = list(names)
        self._vals = vals
        self._ref = ref
        self.tol = tol
        self.rows = rows
        self._worst = worst or [None] * len(self.names)
        self._scale = scale
        self.ulp_errors = _UlpErrors(self)
        self.ref_dtype = None if ref is None else ref.dt

    @property
    def values(self) -> dict:
        """``{name: float64 NumPy array}``: each result (broadcast to the common shape)."""
        return {n: v.f64 for n, v in zip(self.names, self._vals)}

    @property
    def ref_values(self):
        """The reference as a float64 NumPy array (None without a reference)."""
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

    def worst(self, name: int | str = 0) -> dict:
        """The element of result `name` (name or position) with the largest per-element
        ulp error against the reference: ``index`` (multi-index tuple), ``flat_index``
        (C order), ``value`` and ``bits`` (the result's), ``ref`` (the reference value),
        ``ref_rounded`` (the reference rounded once to the result's dtype) and its
        ``ref_rounded_bits``, ``abs_error``, ``ulp_error`` and ``ulp_error_at_scale``.
        Pass ``index`` to :func:`explain` to see why.

        >>> import castlab as cl, castlab.numerics as nm
        >>> x = cl.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=cl.bfloat16)
        >>> ref = cl.tensor([[1.0, 2.0], [3.0, 4.01]], dtype=cl.float64)
        >>> w = nm.compare(x, ref=ref).worst()
        >>> w["index"], w["value"], w["bits"], w["ref"], w["ulp_error"]
        ((1, 1), 4.0, '0x4080', 4.01, 0.3199999999999932)
        """
        k = self._index(name)
        if self._ref is None:
            raise ValueError("this comparison has no reference; pass ref= to compare()")
        flat = self._worst[k]
        if flat is None:
            raise ValueError("the compared tensors are empty")
        v = self._vals[k]
        f = _fmt(v.dt)
        shape = v.shape
        idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
        x, r = _element(v, idx), _element(self._ref, idx)
        cr = float(_round_np(np.array([r]), f)[0])
        ue = float(_ulp_error_np(np.array([x]), np.array([r]), f)[0])
        with np.errstate(all="ignore"):
            ae = 0.0 if (np.isnan(x) and np.isnan(r)) else abs(x - r)
        su = float(_ulp_np(np.array([self._scale or 0.0]), f)[0])
        return {"name": self.names[k], "index": idx, "flat_index": int(flat), "value": x,
                "bits": _bits(x, v.dt), "ref": r, "ref_rounded": cr,
                "ref_rounded_bits": _bits(cr, v.dt), "abs_error": ae, "ulp_error": ue,
                "ulp_error_at_scale": ae / su}

    def assert_close_message(self, i: int | str = 1, *, against: str = "first",
                             rtol: float | None = None, atol: float | None = None) -> str | None:
        """The ``torch.testing.assert_close`` message for result `i` (index or name)
        against the first result (``against="first"``) or the reference
        (``against="ref"``), with PyTorch's default tolerances; None when close.

        >>> import castlab as cl, castlab.numerics as nm
        >>> c = nm.compare(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]), names=["a", "b"])
        >>> print(c.assert_close_message("b"))
        Tensor-likes are not close!
        <BLANKLINE>
        Mismatched elements: 1 / 2 (50.0%)
        Greatest absolute difference: 0.5 at index (1,) (up to 1e-05 allowed)
        Greatest relative difference: 0.25 at index (1,) (up to 1.3e-06 allowed)
        """
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
        (None for the baseline) and ``same_detail`` the verdict's explanation.

        >>> import castlab as cl, castlab.numerics as nm
        >>> d = nm.compare(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]), names=["a", "b"]).to_dict()
        >>> d["a"]["same"], d["b"]["same"], d["b"]["same_detail"]
        (None, False, 'FAIL (not allclose (tol=0.0001); no fp64 reference)')
        """
        out = {}
        for n, r in zip(self.names, self.rows):
            d = dict(r)
            v = d.get("same")
            d["same"] = None if v is None else bool(v)
            d["same_detail"] = None if v is None else str(v)
            out[n] = d
        return out

    def to_frame(self):
        """The table as a pandas DataFrame (index: result names).

        >>> import castlab as cl, castlab.numerics as nm
        >>> df = nm.compare(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5]), names=["a", "b"]).to_frame()
        >>> list(df.index), df["mismatches"].tolist()
        (['a', 'b'], [0, 1])
        """
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
                elif isinstance(v, float) and math.isinf(v):
                    v = "inf" if v > 0 else "-inf"   # _tables._fmt_num fails on inf
                row.append(v)
            rows.append(row)
        return headers, rows

    def _caption(self) -> str:
        shape = self._vals[0].shape
        ref = f"; reference {self.ref_dtype.name}" if self._ref is not None else "; no reference"
        return (f"castlab comparison: {len(self.names)} results, shape {shape}{ref}; mismatches "
                f"and same() against {self.names[0]!r}")

    def _legend(self) -> str:
        return _LEGEND if self._ref is not None else ""

    def __str__(self) -> str:
        h, r = self._table()
        leg = self._legend()
        return self._caption() + "\n" + _text_table(h, r) + ("\n" + leg if leg else "")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        h, r = self._table()
        leg = self._legend()
        return _html_table(h, r, self._caption()) + (
            "<div style='font-family:monospace;font-size:smaller'>"
            + _html.escape(leg).replace("\n", "<br>") + "</div>" if leg else "")


def compare(*results: Any, ref: Any = None, names: Any = None, tol: float = 1e-4) -> Comparison:
    """Compare results of one computation against each other and, optionally, against a
    more precise reference (typically the ``fp64`` policy's output).

    For every result: mismatches against the first result (count, fraction, NaN
    mismatches, max ulp apart: :func:`ulp_diff` when the dtypes agree, else the coarser
    one's :func:`ulp_error` at the finer one), and against `ref`: max/mean abs error, max
    rel error (|x-r|/|r|; 0/0 counts 0, x/0 inf), RMSE, relative RMSE (RMSE/RMS(ref)),
    max and mean :func:`ulp_error` (per element, in ulps of the reference value),
    ``max_ulp_error_at_scale`` (max |x - ref| in ulps of the largest reference magnitude:
    it stays meaningful where the per-element ulp error explodes under cancellation, see
    :class:`Comparison`), ``worst_index`` (the element with the largest ulp error; see
    :meth:`Comparison.worst`), the fraction of elements equal to ref rounded once to
    the result's dtype (``correctly_rounded``; NaN = NaN counts equal), and PyTorch's
    ``same(first, result, ref, tol)`` verdict (:func:`same`). Results may also be given
    as one dict ``{name: tensor}``. Shapes must broadcast; all on one device.

    castlab and torch tensors (at most ``_C.CMP_MAX_RESULTS`` results) are measured by
    castlab's compare kernels on their device, CPU threads or the GPU, without a float64
    copy: three 16M-element bf16 results against an fp64 reference take about 0.5 s on 2
    CPU cores and 5-7 ms on an H200 (benchmarks/bench_compare_cpu.py, bench_compare_cuda.py).
    NumPy arrays and more results go through a chunked NumPy scan with the same
    definitions and the same bits.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> x = cl.randn(64, 64, seed=1, dtype=cl.bfloat16)
    >>> c = nm.compare({"eager": sw.run(x, policy="eager"), "fused": sw(x)},
    ...                ref=sw.run(x, policy="fp64"))
    >>> c["fused"]["correctly_rounded"] > c["eager"]["correctly_rounded"]
    True
    """
    tol = _check_tol("compare", tol)
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
    kern = _kernel_vals(results, ref, names)
    if kern is not None:
        vals, rv = kern
    else:
        vals = [_float_val(r, f"result {n!r}") for n, r in zip(names, results)]
        rv = None if ref is None else _float_val(ref, "ref")
    allv, alln = list(vals), list(names)
    if ref is not None:
        allv.append(rv)
        alln.append("ref")
        for n, v in zip(names, vals):
            if not _at_least_as_precise(_fmt(rv.dt), _fmt(v.dt)):
                raise ValueError(f"the reference ({rv.dt.name}) is less precise than result "
                                 f"{n!r} ({v.dt.name}); use a reference of higher precision, "
                                 "e.g. fn.run(..., policy='fp64')")
    _check_devices(allv, alln)
    shape = _broadcast(allv, alln)
    if math.prod(shape) == 0:
        raise ValueError(f"compare: the results are empty (shape {tuple(shape)}): there are "
                         "no elements to compare")
    if kern is not None:
        # castlab's own kernels (ops/compare.h) on the tensors' device, dense operands of
        # one shape
        vals = [_dense(v, shape) for v in vals]
        rv = None if rv is None else _dense(rv, shape)
        st = kernel_scan(vals, [v.t for v in vals], None if rv is None else rv.t, tol)
    else:
        vals = [_Val(np.broadcast_to(v.a, shape), v.dt, v.device) for v in vals]
        if rv is not None:
            rv = _Val(np.broadcast_to(rv.a, shape), rv.dt, rv.device)
        st = scan(vals, rv, shape)
    rows = st["rows"]
    for k, (v, row) in enumerate(zip(vals, rows)):
        w = st["worst"][k]
        row["worst_index"] = (tuple(int(i) for i in np.unravel_index(w, shape)) if shape else ()) \
            if w is not None else None
        row["same"] = None if k == 0 else _same_fast(vals[0], v, rv, tol, st, k, shape)
    return Comparison(names, vals, rv, tol, rows, st["worst"], st["scale"])


def _kernel_vals(results: tuple, ref: Any, names: list):
    """The results and reference as values kept on their device (:class:`_DevVal`), for
    castlab's compare kernels (ops/compare.h: CPU threads or the GPU), when every one is a
    castlab or torch tensor and they are at most ``_C.CMP_MAX_RESULTS``; else None (the
    NumPy scan of host copies)."""
    if len(results) > int(_C.CMP_MAX_RESULTS):
        return None
    ts = [_device_tensor(r) for r in results]
    rt = None if ref is None else _device_tensor(ref)
    if any(t is None for t in ts) or (ref is not None and rt is None):
        return None
    out = []
    for t, what in zip(ts + ([rt] if rt is not None else []),
                       [f"result {n!r}" for n in names] + ["ref"]):
        _check_float(t.dtype, what)
        out.append(_DevVal(t, t.dtype, str(t.device)))
    return out[:len(ts)], (out[-1] if rt is not None else None)


def _same_fast(base: _Val, res: _Val, ref: _Val | None, tol: float, st: dict, k: int,
               shape: tuple) -> SameVerdict:
    """``_same(base, res, ref, tol)`` (torch._dynamo.utils.same) from the scan's numbers:
    allclose is decided on the elements that differ, chunk by chunk, stopping at the
    first chunk that is not close; the RMSEs are the rows'. Falls back to ``_same`` for
    the rare cases that need the arrays (an fp64 baseline without reference, a baseline
    with NaN where the result and reference have none)."""
    if base.dt is not res.dt:
        return _same(base, res, ref, tol)
    any_nan = st["has_nan"][0] or st["has_nan"][k]
    not_close = st.get("not_close")
    if not_close is not None:     # counted by the kernels (same dtype: always counted)
        close = not any_nan and not_close[k] == 0
    else:
        close = _allclose(base, res, tol, any_nan)
    if close:
        return SameVerdict(True, "allclose")
    if ref is None:
        if base.dt is float64:
            return _same(base, res, ref, tol)
        return SameVerdict(False, f"not allclose (tol={tol}); no fp64 reference")
    if ref.dt is not float64:
        return SameVerdict(False, f"not allclose (tol={tol}); no fp64 reference")
    if st["has_nan"][0] and not st["has_nan"][k]:
        return _same(base, res, ref, tol)   # may pass as "baseline has NaN": needs arrays
    return _rmse_verdict(st["rows"][0]["rmse"], st["rows"][k]["rmse"], res.dt, tuple(shape),
                         tol)


def _allclose(base: _Val, res: _Val, tol: float, any_nan: bool) -> bool:
    """torch.isclose(base, res, rtol=tol, atol=tol).all() for one dtype: equal elements are
    close, a NaN never is; the others go through the PyTorch-exact ``_isclose_torch``."""
    if any_nan:
        return False
    bf, rf = _flat(base.a), _flat(res.a)
    for lo in range(0, bf.size, _LEAF):
        b, r = bf[lo:lo + _LEAF], rf[lo:lo + _LEAF]
        d = np.flatnonzero(_f64(b) != _f64(r))
        if d.size:
            with np.errstate(invalid="ignore"):
                close, *_ = _isclose_torch(_Val(b[d], base.dt, "cpu"), _Val(r[d], res.dt, "cpu"),
                                           tol, tol, False)
            if not close.all():
                return False
    return True
