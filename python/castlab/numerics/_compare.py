"""Golden comparison: :func:`compare` measures results of one computation against each
other and against a more precise reference, one row of metrics per result
(:class:`Comparison`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._formats import (
    _at_least_as_precise,
    _broadcast,
    _check_devices,
    _float_val,
    _fmt,
    _rmse,
    _round_np,
    _ulp_diff_np,
    _ulp_error_np,
    _Val,
)
from ._tables import _html_table, _text_table
from ._torchcheck import _assert_close_msg, _check_tol, _same

__all__ = ["compare", "Comparison"]


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
