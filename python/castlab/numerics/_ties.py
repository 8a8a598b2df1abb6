"""Near ties: elements whose exact value lies close to a rounding midpoint of a format,
where two correct-looking computations can round different ways (:func:`near_ties`)."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

from .. import _C
from .._dtype import dtype
from ._formats import Tensor, _at_least_as_precise, _dense_tensors, _float_tensor, _fmt

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
    """Result of :func:`near_ties`, on the reference's device.

    Attributes: ``mask`` (castlab bool tensor), ``distance`` (float64 tensor: signed
    distance of the exact value from the nearest rounding midpoint, in ulps of `dtype`;
    positive = above the midpoint in magnitude; NaN where there is none: NaN, infinite or
    beyond the largest finite value), ``count``, ``fraction``, ``dtype``, ``within``.

    >>> import castlab as cl, castlab.numerics as nm
    >>> r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-20, 1.25], dtype=cl.float64)
    >>> nt = nm.near_ties(r, cl.bfloat16, within=0.01)
    >>> nt.count, nt.distance.tolist()
    (2, [0.0, 0.0001220703125, -0.5])
    >>> print(nt)
    2 of 3 elements (66.67%) lie within 0.01 ulp of a bfloat16 rounding midpoint
    """

    def __init__(self, mask: Tensor, dist: Tensor, count: int, dt: dtype, within: float):
        self._mask = mask
        self._dist = dist
        self._count = int(count)
        self.dtype = dt
        self.within = within

    @property
    def mask(self) -> Tensor:
        return self._mask

    @property
    def distance(self) -> Tensor:
        return self._dist

    @property
    def count(self) -> int:
        return self._count

    @property
    def fraction(self) -> float:
        n = self._mask.numel()
        return self._count / n if n else 0.0

    def mismatch_rate(self, a: Any, b: Any) -> TieSplit:
        """Split the mismatches between results `a` and `b` into inside vs outside (counted
        by castlab's code on the mask's device; NaN equals NaN, +0 equals -0).

        >>> import castlab as cl, castlab.numerics as nm
        >>> r = cl.tensor([1 + 2**-8, 1 + 2**-8 + 2**-20, 1.25], dtype=cl.float64)
        >>> nt = nm.near_ties(r, cl.bfloat16, within=0.01)
        >>> y1 = cl.tensor([1.0, 1.0078125, 1.25], dtype=cl.bfloat16)
        >>> y2 = cl.tensor([1.0078125, 1.0078125, 1.25], dtype=cl.bfloat16)
        >>> nt.mismatch_rate(y1, y2)
        TieSplit(inside_mismatches=1, inside_count=2, outside_mismatches=0, outside_count=1)
        """
        m = self._mask
        (ta, tb, _), shape = _dense_tensors([_float_tensor(a, "a"), _float_tensor(b, "b"), m],
                                            ["a", "b", "near ties"])
        if tuple(shape) != tuple(m.shape):
            raise ValueError(f"results of shape {tuple(shape)} do not match the reference's "
                             f"{tuple(m.shape)}")
        mi, inside, mall = _C._tie_split(ta, tb, m)
        n = m.numel()
        return TieSplit(int(mi), int(inside), int(mall - mi), int(n - inside))

    def __str__(self) -> str:
        return (f"{self.count} of {self._mask.numel()} elements ({100 * self.fraction:.4g}%) "
                f"lie within {self.within} ulp of a {self.dtype.name} rounding midpoint")

    __repr__ = __str__


def near_ties(ref: Any, dtype: Any, within: float = 0.01) -> NearTies:
    """Elements whose exact value (`ref`, e.g. the fp64 policy's output) lies within
    `within` ulps of `dtype` of a rounding midpoint of `dtype` (where two correct-looking
    computations can round different ways). ``.mismatch_rate(a, b)`` splits the
    mismatches of two results into inside vs outside that set. Computed by castlab's code
    on the reference's device (CPU threads or the GPU); the mask and distances stay there.

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
    t = _float_tensor(ref, "ref")
    f = _fmt(dtype)
    if not _at_least_as_precise(_fmt(t.dtype), f) or t.dtype is f.dt:
        raise ValueError(f"near_ties needs a reference more precise than {f.name}, got "
                         f"{t.dtype.name}")
    mask, dist, count = _C._near_ties(t.contiguous(), f.dt.name, float(within))
    return NearTies(mask, dist, count, f.dt, within)
