"""Near ties: elements whose exact value lies close to a rounding midpoint of a format,
where two correct-looking computations can round different ways (:func:`near_ties`)."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from .._dtype import dtype, float64
from ._formats import (
    Tensor,
    _at_least_as_precise,
    _broadcast,
    _check_devices,
    _f64,
    _float_val,
    _fmt,
    _tensor,
    _ulp_np,
    _Val,
)
from ._metrics import _LEAF, _flat, parallel_map

__all__ = ["near_ties", "NearTies", "TieSplit"]


# ================================================================ near ties

class TieSplit(NamedTuple):
    """Mismatches of two results inside vs outside a near-tie set, from
    :meth:`NearTies.mismatch_rate`.

    >>> import castlab as cl, castlab.numerics as nm
    >>> s = nm.TieSplit(inside_mismatches=1, inside_count=2, outside_mismatches=0, outside_count=1)
    >>> s.inside_rate, s.outside_rate, s.share_inside
    (0.5, 0.0, 1.0)
    >>> print(s)
    near ties: 1/2 mismatched (50%); elsewhere: 0/1 (0%); 100% of mismatches are near ties
    """

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

    >>> import castlab as cl, castlab.numerics as nm
    >>> r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-20, 1.25], dtype=cl.float64)
    >>> nt = nm.near_ties(r, cl.bfloat16, within=0.01)
    >>> nt.count, nt.distance.tolist()
    (2, [0.0, 0.0001220703125, -0.5])
    >>> print(nt)
    2 of 3 elements (66.67%) lie within 0.01 ulp of a bfloat16 rounding midpoint
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

        >>> import castlab as cl, castlab.numerics as nm
        >>> r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-20, 1.25], dtype=cl.float64)
        >>> nt = nm.near_ties(r, cl.bfloat16, within=0.01)
        >>> y1 = cl.tensor([1.0, 1.0078125, 1.25], dtype=cl.bfloat16)
        >>> y2 = cl.tensor([1.0078125, 1.0078125, 1.25], dtype=cl.bfloat16)
        >>> nt.mismatch_rate(y1, y2)
        TieSplit(inside_mismatches=1, inside_count=2, outside_mismatches=0, outside_count=1)
        """
        va, vb = _float_val(a, "a"), _float_val(b, "b")
        _check_devices([va, vb], ["a", "b"])
        shape = _broadcast([va, vb, _Val(self._mask, float64, "cpu")], ["a", "b", "ref"])
        if shape != self._mask.shape:
            raise ValueError(f"results of shape {shape} do not match the reference's "
                             f"{self._mask.shape}")
        m = self._mask
        if va.a.shape != m.shape or vb.a.shape != m.shape:
            x, y = np.broadcast_arrays(va.f64, vb.f64)
            mism = ~((x == y) | (np.isnan(x) & np.isnan(y)))
            return TieSplit(int((mism & m).sum()), int(m.sum()), int((mism & ~m).sum()),
                            int((~m).sum()))
        # chunk by chunk, without float64 copies: (mismatches inside, inside, all mismatches)
        xf, yf, mf = _flat(va.a), _flat(vb.a), _flat(m)
        native = xf.dtype == yf.dtype and xf.dtype in (np.float32, np.float64)

        def work(lo, hi):
            x, y = xf[lo:hi], yf[lo:hi]
            if not native:
                x, y = _f64(x), _f64(y)
            eq = x == y
            if not eq.all():
                eq |= np.isnan(x) & np.isnan(y)
            mism = np.logical_not(eq, out=eq)
            mc = mf[lo:hi]
            return (int(np.count_nonzero(mism & mc)), int(np.count_nonzero(mc)),
                    int(np.count_nonzero(mism)))

        parts = _map_chunks(work, mf.size)
        mi, inside, mall = (sum(p[k] for p in parts) for k in range(3))
        return TieSplit(mi, inside, mall - mi, mf.size - inside)

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
    if isinstance(within, bool) or not isinstance(within, numbers.Real):
        raise TypeError(f"near_ties: within must be a real number (a fraction of an ulp), "
                        f"got {type(within).__name__} {within!r}")
    if not 0 <= within < 0.5:
        raise ValueError(f"within must be a fraction of an ulp in [0, 0.5), got {within}")
    v = _float_val(ref, "ref")
    f = _fmt(dtype)
    if not _at_least_as_precise(_fmt(v.dt), f) or v.dt is f.dt:
        raise ValueError(f"near_ties needs a reference more precise than {f.name}, got "
                         f"{v.dt.name}")
    mask, dist = _tie_scan(v.a, f, within)
    return NearTies(mask, dist, f.dt, within, v.device)


def _chunks(n: int) -> list:
    return [(lo, min(lo + _LEAF, n)) for lo in range(0, n, _LEAF)]


def _map_chunks(work, n: int) -> list:
    """work(lo, hi) over chunks of [0, n), on a few threads when n is large."""
    return parallel_map(lambda c: work(*c), _chunks(n), n)


def _tie_scan(ra: np.ndarray, f, within: float) -> tuple:
    """(mask, dist) of near_ties, chunk by chunk (elementwise: the values of the whole-array
    definitions), without a float64 copy of the reference: |r| / ulp(r) - its floor is
    the position between two neighbours, minus 1/2 the signed distance from the midpoint;
    NaN, infinite and beyond-the-largest-finite elements have distance NaN, no mask."""
    rflat = _flat(ra)
    n = rflat.size
    mask = np.empty(n, dtype=bool)
    dist = np.empty(n, dtype=np.float64)

    def work(lo, hi):
        with np.errstate(all="ignore"):
            a = np.abs(_f64(rflat[lo:hi]))
            t = a / _ulp_np(a, f)
            t -= np.floor(t)
            d = np.subtract(t, 0.5, out=dist[lo:hi])
            ok = np.isfinite(a)
            ok &= a <= f.max
            m = np.abs(d) <= within
            m &= ok
            m &= t != 0
            mask[lo:hi] = m
            if not ok.all():
                d[~ok] = np.nan

    _map_chunks(work, n)
    return mask.reshape(ra.shape), dist.reshape(ra.shape)
