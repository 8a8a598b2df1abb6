"""The values to feed a kernel: every pattern of a dtype, the finite ones, the special
ones, or a sample (:func:`inputs`, the ``castlab_inputs`` fixture)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._creation import from_numpy
from ..numerics import Enumeration
from ..numerics._formats import _fmt
from ._space import _table_of, check_dtype

__all__ = ["inputs", "special_bits", "KINDS", "AS"]

KINDS = ("all", "finite", "specials", "sample")
AS = ("torch", "castlab", "numpy")


def special_bits(dt: Any) -> np.ndarray:
    """The bit patterns of `dt` kernels get wrong, each with both signs, as sorted bit
    patterns: zero, the smallest and largest subnormals, the smallest normal, one and its
    neighbours, two, the largest finite value, infinity and a quiet NaN."""
    d = check_dtype(dt, "inputs")
    f = _fmt(d)
    m = f.p                       # mantissa bits
    e = d.bits - 1 - m            # exponent bits
    bias = (1 << (e - 1)) - 1
    exp_all = ((1 << e) - 1) << m
    one = bias << m
    pos = [0, 1, (1 << m) - 1, 1 << m,             # zero, the subnormals' ends, min normal
           one - 1, one, one + 1, one + (1 << m),  # one, its neighbours, two
           exp_all - 1, exp_all, exp_all | (1 << (m - 1))]   # max finite, inf, quiet NaN
    sign = 1 << (d.bits - 1)
    return np.array(sorted(set(pos) | {p | sign for p in pos}), dtype=np.uint64)


def inputs(dtype: Any, kind: str = "all", *, n: int = 4096, seed: int = 0,
           device: Any = "cpu", as_: str = "torch") -> Any:
    """The values of `dtype` as one flat tensor, for a kernel's test.

    kind: ``"all"`` (every bit pattern of a 16-bit dtype: NaNs and infinities included),
    ``"finite"`` (every finite value), ``"specials"`` (:func:`special_bits`: zeros,
    subnormals, one, the largest value, infinities, NaN, both signs) or ``"sample"`` (`n`
    distinct finite patterns drawn uniformly over the patterns with `seed`, sorted; float32
    takes only this and ``"specials"``). as_: ``"torch"`` (a torch tensor on `device`),
    ``"castlab"`` or ``"numpy"`` (host; `device` must be cpu).

    >>> from castlab.testing import inputs
    >>> x = inputs("bfloat16", "specials", as_="numpy")
    >>> x.dtype.name, len(x), float(x[0]), float(x[5])
    ('bfloat16', 22, 0.0, 1.0)
    """
    d = check_dtype(dtype, "inputs")
    if kind not in KINDS:
        raise ValueError(f"inputs: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if as_ not in AS:
        raise ValueError(f"inputs: as_ must be one of {', '.join(AS)}, got {as_!r}")
    if kind == "specials":
        bits = special_bits(d)
    elif kind == "sample":
        bits = _table_of(Enumeration.sample(d, n, seed=seed))
    elif d.bits > 16:
        raise ValueError(f"inputs: {d.name} has 2**{d.bits} patterns; use kind='sample' or "
                         "'specials' (castlab.testing.bounds samples float32 too)")
    else:
        bits = _table_of(Enumeration.all(d) if kind == "all" else Enumeration.finite(d))
    vals = bits.astype(_fmt(d).uint).view(d.numpy)
    dev = str(device)
    if as_ == "numpy":
        if dev != "cpu":
            raise ValueError("inputs: as_='numpy' lives on the host; use device='cpu'")
        return vals
    t = from_numpy(np.ascontiguousarray(vals))
    if dev != "cpu":
        t = t.to(dev)
    if as_ == "castlab":
        return t
    import torch

    return torch.from_dlpack(t)

