"""Per-chunk statistics of a result against a reference, on the result's device: NumPy
for host tensors, PyTorch (through DLPack, no copy) for GPU tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._dtype import float64
from ..numerics import ulp_diff, ulp_error

__all__ = ["chunk_stats", "Namespace"]


class Namespace:
    """The few array operations the statistics need, over NumPy or PyTorch."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "torch":
            import torch

            self.m = torch
        else:
            self.m = np

    def of(self, t: Any) -> Any:
        if self.kind == "torch":
            return self.m.from_dlpack(t)
        return np.asarray(t.numpy())

    def f64(self, a: Any) -> Any:
        return a.double() if self.kind == "torch" else a.astype(np.float64)

    def argmax(self, a: Any) -> int:
        return int(self.m.argmax(a))

    def count(self, mask: Any) -> int:
        return int(mask.sum())


def n_of(a: Any) -> int:
    return int(a.shape[0])


def _abs_rel(xp: Namespace, g: Any, r: Any) -> tuple:
    """Largest absolute and relative differences (0 for empty arrays): a NaN on either
    side is left out (a NaN mismatch), a nonzero difference from 0 is relatively inf."""
    m = xp.m
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = m.abs(g - r)
        d = m.where(m.isnan(d), 0.0, d)
        rel = m.where(d == 0, 0.0, d / m.abs(r))
        rel = m.where(m.isnan(rel), float("inf"), rel)
    if not n_of(d):
        return 0.0, 0.0
    return float(d.max()), float(rel.max())


def chunk_stats(got: Any, want: Any, exact: bool, xp: Namespace) -> dict:
    """``{"n", "differ", "nan_mismatches", "overflows", "max_ulp", "worst", "max_abs",
    "max_rel"}`` of the flat castlab tensor `got` against `want` (same dtype, or the fp64
    exact value when `exact`).

    Against fp64: ``differ`` counts the results not correctly rounded, ``overflows`` the
    results infinite where the exact value rounds to a finite one or the reverse, and
    ``max_ulp`` is the largest ``|x - r| / ulp(r)`` of the others (neither the result
    nor the rounded exact value infinite). Against a configuration: ``max_ulp`` is the
    number of values of the dtype between the two (+0 and -0 are equal), ``differ``
    counts unequal values and ``overflows`` the elements infinite on one side only.
    ``max_abs`` and ``max_rel`` are over the elements finite on both sides (against fp64:
    the result and the exact value rounded once); ``worst`` is where ``max_ulp`` is."""
    m = xp.m
    g, r = xp.f64(xp.of(got)), xp.of(want if exact else want.astype(float64))
    r = xp.f64(r)
    n = n_of(g)
    with np.errstate(invalid="ignore"):
        nan_g, nan_r = m.isnan(g), m.isnan(r)
        nan_mis = xp.count(nan_g != nan_r)
        if exact:
            rr = xp.f64(xp.of(want.astype(got.dtype)))   # the exact value rounded once
            nan_rr = m.isnan(rr)
            differ = xp.count((g != rr) & ~(nan_g & nan_rr))
            inf_g, inf_rr = m.isinf(g), m.isinf(rr)
            over = xp.count((inf_g != inf_rr) & ~nan_g & ~nan_rr)
            ue = xp.of(ulp_error(got, want))
            fin = m.where(m.isfinite(ue) & ~inf_g & ~inf_rr, ue, -1.0)
            k = xp.argmax(fin)
            mu = max(0.0, float(fin[k]))
        else:
            ud, _ = ulp_diff(got, want, return_nan_mask=True)
            ud = xp.of(ud)
            differ = xp.count(ud != 0)     # (a NaN mismatch holds -1)
            over = xp.count((m.isinf(g) != m.isinf(r)) & ~nan_g & ~nan_r)
            k = xp.argmax(ud)
            mu = max(0.0, float(ud[k]))
        both = m.isfinite(g) & m.isfinite(rr if exact else r)
        ma, mr = _abs_rel(xp, m.where(both, g, 0.0), m.where(both, r, 0.0))
    return {"n": n, "differ": differ, "nan_mismatches": nan_mis, "overflows": over,
            "max_ulp": mu, "worst": k, "max_abs": ma, "max_rel": mr}
