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
>>> print(str(c).splitlines()[0])
castlab comparison: 2 results, shape (64, 16); reference float64; mismatches and same() against 'eager'
>>> c["fused"]["correctly_rounded"], c["fused"]["max_ulp_error"] <= 0.5 < c["eager"]["max_ulp_error"]
(1.0, True)

Definitions used throughout (p = explicit mantissa bits, emin = exponent of the smallest
normal of the format; bf16: p=7, emin=-126):

* ulp(r) = 2**(max(floor(log2|r|), emin) - p), computed from the exact value r (not
  from r rounded to the format); ulp(0) = 2**(emin - p), the smallest subnormal.
* ulp error of a result x against the reference r (``max_ulp_error``): |x - r| / ulp(r)
  per element. Under cancellation (r tiny or 0, e.g. RoPE's ``q*cos - q'*sin``) ulp(r)
  is tiny and this explodes (thousands of ulps, 1e37 against an exact 0) although x is
  as good as its inputs allow; ``max_ulp_error_at_scale`` = max |x - r| / ulp(max |r|),
  the error in ulps of the largest reference magnitude, does not. :func:`compare`
  reports both and the worst element's index (:meth:`Comparison.worst`; pass it to
  :func:`explain`); :func:`differences` lists every element where two results differ.
* ulp distance of two values of one format: the difference of their positions in the
  ordered list of the format's values (sign-magnitude bits mapped to a monotone integer),
  so +0 and -0 are 0 apart and the largest finite value is 1 away from infinity.

Submodules (private; everything public is re-exported here): ``_formats`` (formats,
ULPs, direct rounding), ``_torchcheck`` (PyTorch-compatible checks), ``_compare``
(golden comparison), ``_metrics`` (compare's chunked, threaded metrics),
``_differences`` (the differing elements), ``_ties`` (near ties), ``_explain`` (explain and drift),
``_tables`` (text/HTML tables), ``_attribute`` (which named factor flipped each bit).
"""

from ._attribute import Attribution, Factor, attribute
from ._compare import Comparison, compare
from ._differences import Differences, differences
from ._exhaustive import HIST_EDGES as HIST_EDGES  # (a tuple: no docstring example)
from ._exhaustive import Enumeration, Exhaustive, ExhaustiveTooLong, exhaustive
from ._explain import Divergence, Drift, Explanation, drift, explain
from ._formats import neighbours, round_to, ulp, ulp_diff, ulp_error
from ._ties import NearTies, TieSplit, near_ties
from ._torchcheck import SameVerdict, assert_close_message, default_tolerances, same

__all__ = [
    "ulp", "ulp_diff", "ulp_error", "round_to", "neighbours", "compare", "Comparison",
    "same", "SameVerdict", "assert_close_message", "default_tolerances", "near_ties",
    "NearTies", "TieSplit", "explain", "Explanation", "drift", "Drift", "Divergence",
    "attribute", "Attribution", "Factor", "differences", "Differences", "exhaustive",
    "Exhaustive", "Enumeration", "ExhaustiveTooLong",
]
