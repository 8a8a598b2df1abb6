"""The elements where two results differ: :func:`differences` lists them (index, both
values and bit patterns, how many ulps apart, and the errors against a reference)."""

from __future__ import annotations

import html as _html
from typing import Any

import numpy as np

from ._formats import (
    _at_least_as_precise,
    _broadcast,
    _check_devices,
    _f64,
    _float_val,
    _fmt,
    _ulp_diff_np,
    _ulp_error_np,
    _Val,
)
from ._metrics import _LEAF, _flat
from ._tables import _html_table, _text_table

__all__ = ["differences", "Differences"]


class Differences:
    """Result of :func:`differences`: ``rows`` (one dict per differing element, in index
    order: ``index`` (tuple), ``a``, ``b`` (float values), ``a_bits``, ``b_bits`` (hex),
    ``ulp_apart`` (:func:`ulp_diff` for one dtype, None for NaN vs a number; else the
    coarser one's ulp error at the finer one) and, with a reference, ``ref``,
    ``a_ulp_error``, ``b_ulp_error``), ``count`` (how many elements differ in all, also
    beyond `limit`), ``numel``, ``shape``, ``names``. ``len()`` is the number of rows;
    ``to_frame()`` gives a pandas DataFrame.

    >>> import castlab as cl, castlab.numerics as nm
    >>> d = nm.differences(cl.tensor([1.0, 2.0, 3.0]), cl.tensor([1.0, 2.5, 3.5]), limit=1)
    >>> d.count, len(d), d.rows[0]["index"], d.rows[0]["b_bits"]
    (2, 1, (1,), '0x40200000')
    """

    def __init__(self, rows, count, numel, shape, names, limit):
        self.rows = rows
        self.count = count
        self.numel = numel
        self.shape = shape
        self.names = names
        self.limit = limit

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def to_frame(self):
        """The rows as a pandas DataFrame (one row per differing element).

        >>> import castlab as cl, castlab.numerics as nm
        >>> df = nm.differences(cl.tensor([1.0, 2.0]), cl.tensor([1.0, 2.5])).to_frame()
        >>> df[["index", "a", "b", "ulp_apart"]].values.tolist()
        [[(1,), 2.0, 2.5, 2097152]]
        """
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _table(self) -> tuple:
        a, b = self.names
        keys = ["index", "a", "a_bits", "b", "b_bits", "ulp_apart"]
        heads = ["index", a, f"{a} bits", b, f"{b} bits", "ulp apart"]
        if self.rows and "ref" in self.rows[0]:
            keys += ["ref", "a_ulp_error", "b_ulp_error"]
            heads += ["ref", f"{a} ulp err", f"{b} ulp err"]
        rows = []
        for r in self.rows:
            rows.append([str(r[k]) if k == "index" else (repr(r[k]) if isinstance(r[k], float)
                                                           else r[k]) for k in keys])
        return heads, rows

    def _caption(self) -> str:
        shown = (f"; first {len(self.rows)} shown" if len(self.rows) < self.count else "")
        return (f"castlab differences: {self.count} of {self.numel} elements differ "
                f"(bits; NaN = NaN){shown}")

    def __str__(self) -> str:
        return self._caption() + "\n" + _text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(*self._table(), _html.escape(self._caption()))


def _hex(a: np.ndarray, f) -> list:
    w = f.bits // 4
    return [f"0x{int(u):0{w}X}" for u in np.ascontiguousarray(a).view(f.uint)]


def differences(a: Any, b: Any, ref: Any = None, limit: int | None = None,
                names: Any = ("a", "b")) -> Differences:
    """Every element where `a` and `b` differ, in index (C) order: the elements whose bit
    patterns differ (NaN = NaN whatever the payloads; +0 and -0 differ; tensors of two
    dtypes are compared on their exact float64 values), at most `limit` of them listed
    (``count`` has the total). Each row holds the index tuple, both values and bit
    patterns, how many ulps apart, and with `ref` (at least as precise) the reference
    value and both ulp errors. Shapes must broadcast; both on one device.

    >>> import castlab as cl, castlab.numerics as nm
    >>> a = cl.tensor([[1.0, 2.0], [float("nan"), 0.0]], dtype=cl.bfloat16)
    >>> b = cl.tensor([[1.0, 2.015625], [float("nan"), -0.0]], dtype=cl.bfloat16)
    >>> d = nm.differences(a, b, ref=cl.tensor([[1.0, 2.01], [0.0, 0.0]], dtype=cl.float64))
    >>> print(d)
    castlab differences: 2 of 4 elements differ (bits; NaN = NaN)
    index     a  a bits         b  b bits  ulp apart   ref           a ulp err            b ulp err
    ------  ---  ------  --------  ------  ---------  ----  ------------------  -------------------
    (0, 1)  2.0  0x4000  2.015625  0x4001          1  2.01  0.6399999999999864  0.36000000000001364
    (1, 1)  0.0  0x0000      -0.0  0x8000          0   0.0                 0.0                  0.0
    >>> d.rows[0]["index"], d.rows[0]["ulp_apart"]
    ((0, 1), 1)
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))
                              or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    names = tuple(str(n) for n in names)
    if len(names) != 2:
        raise ValueError(f"names must name the two tensors, got {names}")
    va, vb = _float_val(a, "a"), _float_val(b, "b")
    allv, alln = [va, vb], ["a", "b"]
    vr = None
    if ref is not None:
        vr = _float_val(ref, "ref")
        for v, nme in ((va, "a"), (vb, "b")):
            if not _at_least_as_precise(_fmt(vr.dt), _fmt(v.dt)):
                raise ValueError(f"the reference ({vr.dt.name}) is less precise than {nme} "
                                 f"({v.dt.name}); use a reference of higher precision")
        allv.append(vr)
        alln.append("ref")
    _check_devices(allv, alln)
    shape = _broadcast(allv, alln)
    fa, fb = _fmt(va.dt), _fmt(vb.dt)
    A = _flat(np.broadcast_to(va.a, shape))
    B = _flat(np.broadcast_to(vb.a, shape))
    n = A.size
    one = va.dt is vb.dt
    found, count = [], 0
    for lo in range(0, n, _LEAF):
        ca, cb = A[lo:lo + _LEAF], B[lo:lo + _LEAF]
        if one:
            d = ca.view(fa.uint) != cb.view(fb.uint)
        else:
            d = _f64(ca).view(np.uint64) != _f64(cb).view(np.uint64)
        if d.any():
            idx = np.flatnonzero(d)
            both = np.isnan(_f64(ca[idx])) & np.isnan(_f64(cb[idx]))
            idx = idx[~both] + lo
            count += idx.size
            if limit is None or sum(x.size for x in found) < limit:
                found.append(idx)
    flat = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    if limit is not None:
        flat = flat[:limit]
    xa, xb = A[flat], B[flat]
    a64, b64 = _f64(xa), _f64(xb)
    if one:
        dd, nm_ = _ulp_diff_np(_Val(xa, va.dt, "cpu"), _Val(xb, vb.dt, "cpu"))
        apart = [None if m else int(x) for x, m in zip(dd, nm_)]
    else:
        ca_, cf = (a64, b64) if fa.p <= fb.p else (b64, a64)
        e = _ulp_error_np(ca_, cf, fa if fa.p <= fb.p else fb)
        apart = [float(x) for x in e]
    cols = {"a": a64.tolist(), "b": b64.tolist(), "a_bits": _hex(xa, fa), "b_bits": _hex(xb, fb)}
    if vr is not None:
        r64 = _f64(_flat(np.broadcast_to(vr.a, shape))[flat])
        cols["ref"] = r64.tolist()
        cols["a_ulp_error"] = _ulp_error_np(a64, r64, fa).tolist()
        cols["b_ulp_error"] = _ulp_error_np(b64, r64, fb).tolist()
    idxs = (list(zip(*[i.tolist() for i in np.unravel_index(flat, shape)])) if shape
            else [()] * flat.size)
    rows = []
    for k in range(flat.size):
        r = {"index": tuple(idxs[k]), "a": cols["a"][k], "b": cols["b"][k],
             "a_bits": cols["a_bits"][k], "b_bits": cols["b_bits"][k], "ulp_apart": apart[k]}
        if vr is not None:
            r.update(ref=cols["ref"][k], a_ulp_error=cols["a_ulp_error"][k],
                     b_ulp_error=cols["b_ulp_error"][k])
        rows.append(r)
    return Differences(rows, count, n, tuple(shape), names, limit)
