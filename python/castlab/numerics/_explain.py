"""Per-element explanation and per-node drift attribution of a castlab.jit function:
:func:`explain` shows why one output element comes out as it does under each
policy/math combination, :func:`drift` where along the trace the combinations start to
differ from each other and from fp64."""

from __future__ import annotations

import dataclasses
import html as _html
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from .. import _C, _jit, ops
from .._creation import arange
from .._dlpack import from_dlpack
from .._dtype import dtype, float64
from .._jit import JitFunction, jit
from .._optable import REDUCE_OPS
from ..policy import as_math, as_policy
from ._formats import (
    Tensor,
    _fmt,
    _neighbours_np,
    _round_np,
    _ulp_np,
    _val,
)
from ._metrics import drift_kernel, drift_scan
from ._tables import _html_table, _text_table

__all__ = ["explain", "Explanation", "drift", "Drift", "Divergence"]


_DIGITS = 25   # significant digits shown of a long exact decimal expansion
_FULL = 30     # expansions up to this many digits are shown in full


def _exact_decimal(v: float) -> str:
    """The exact decimal value of `v` (every binary float is a finite decimal), readable:
    up to 30 significant digits in full (every bf16, fp16 and fp32 value in the usual
    range); a longer expansion (fp64 values have up to 767 digits, subnormals hundreds) is
    cut to its first 25 digits followed by ``…(N digits)``; magnitudes below
    1e-7 or from 1e21 are written in scientific notation. The exact value is always
    pinned down by the hex bits printed next to it.

    >>> from castlab.numerics._explain import _exact_decimal
    >>> _exact_decimal(0.1806640625), _exact_decimal(0.1)
    ('0.1806640625', '0.1000000000000000055511151…(55 digits)')
    >>> _exact_decimal(2.0 ** -133)
    '9.183549615799121156005754…e-41 (93 digits)'
    """
    if math.isnan(v) or math.isinf(v):
        return str(v)
    d = Decimal(v)
    if d == 0:
        return format(d, "f")
    sign, digits, _ = d.as_tuple()
    nd, adj = len(digits), d.adjusted()
    if -7 <= adj < 21:
        if nd <= _FULL:
            return format(d, "f")
        cut = Decimal((sign, digits[:_DIGITS], adj - _DIGITS + 1))
        return f"{format(cut, 'f')}…({nd} digits)"
    ds = "".join(map(str, digits)).rstrip("0") if nd <= _FULL else \
        "".join(map(str, digits[:_DIGITS]))
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    more = f"…e{adj:+03d} ({nd} digits)" if nd > _FULL else f"e{adj:+03d}"
    return ("-" if sign else "") + mant + more


def _hex_bits(v: float, dt: dtype) -> str:
    f = _fmt(dt)
    b = np.array([v], dtype=np.float64).astype(dt.numpy).view(f.uint)[0]
    return f"0x{int(b):0{f.bits // 4}X}"


def _as_jit(fn):
    if isinstance(fn, JitFunction):
        return fn
    if callable(fn):
        return jit(fn)
    raise TypeError(f"fn must be a castlab.jit function or a callable, got {type(fn).__name__}")


def _bind_args(args) -> tuple:
    if isinstance(args, (list, tuple)):
        args = tuple(args)
    else:
        args = (args,)
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(a)
        elif type(a).__module__.startswith("torch") and hasattr(a, "__dlpack__"):
            out.append(from_dlpack(a.detach()))
        else:
            out.append(a)
    return tuple(out)


def _combo_label(pol, mth) -> str:
    return f"{pol.describe()}/{mth.name}"


def _combos(policies, maths) -> list:
    if isinstance(policies, (str,)) or not isinstance(policies, (list, tuple)):
        policies = (policies,)
    if isinstance(maths, (str,)) or not isinstance(maths, (list, tuple)):
        maths = (maths,)
    if not policies:
        raise ValueError("policies must name at least one policy, got an empty sequence")
    if not maths:
        raise ValueError("maths must name at least one math variant, got an empty sequence")
    out = []
    for p in policies:
        for m in maths:
            pol, mth = as_policy(p), as_math(m)
            out.append((_combo_label(pol, mth), pol, mth))
    labels = [c[0] for c in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policy/math combinations repeat: {labels}")
    return out


_VIEWS = ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze")


def _node_names(tr) -> dict:
    """The trace's names (as ``format_trace`` and ``JitFunction.trace`` print them): the
    function's argument names for its inputs, ``c0``, ``c1``... for captured tensors,
    ``t{k}`` for graph node k (the index ``Policy(round_after=...)`` takes)."""
    arg = list(getattr(tr, "arg_names", None) or _jit._arg_names(lambda: None, len(tr.inputs)))
    names = {}
    for i, n in enumerate(tr.inputs):
        names[id(n)] = arg[i] if i < len(arg) else f"x{i}"
    for i, n in enumerate(tr.captured_nodes):
        names[id(n)] = f"c{i}"
    for n in tr.nodes:
        names[id(n)] = f"t{n.index}"
    return names


def _node_expr(n, names) -> str:
    if n.op in ("input",):
        return f"{names[id(n)]} (input)"
    args = []
    for a in n.inputs:
        args.append(repr(a.value) if a.op == "scalar" else names.get(id(a), "?"))
    if n.op in _VIEWS:
        try:
            args.append(_jit._vop_args(n))
        except Exception:  # pragma: no cover - description only
            pass
    return f"{names[id(n)]} = {n.op}({', '.join(args)})"


def _all_values(jf, args, pol, mth, tr) -> dict:
    """id(node) -> tensor for inputs, op nodes (register precision) and views."""
    vals = {}
    for n, t in jf.node_values(*args, policy=pol, math=mth):
        vals[id(n)] = t
    for n, t in zip(tr.captured_nodes, tr.captured):
        vals[id(n)] = t
    for n in tr.nodes:
        if n.op in _VIEWS and id(n.inputs[0]) in vals:
            vals[id(n)] = ops._view(vals[id(n.inputs[0])], n.attrs["vop"])
    return vals


def _map_index(shape: tuple, out_shape: tuple, index: tuple):
    """Index into a tensor of `shape` broadcast to `out_shape` at `index`, or None."""
    if len(shape) > len(out_shape):
        return None
    try:
        if np.broadcast_shapes(shape, out_shape) != tuple(out_shape):
            return None
    except ValueError:
        return None
    off = len(out_shape) - len(shape)
    return tuple(0 if s == 1 else index[off + k] for k, s in enumerate(shape))


def _source_index(n, index_in_n: tuple):
    """For a view node, (input name, index into the input) reached through views."""
    chain = []
    cur = n
    while cur.op in _VIEWS:
        chain.append(cur.attrs["vop"])
        cur = cur.inputs[0]
    if cur.op != "input":
        return None
    numel = int(np.prod(cur.shape)) if cur.shape else 1
    t = arange(numel).reshape(list(cur.shape)) if cur.shape else arange(1).reshape([])
    for vop in reversed(chain):
        t = ops._view(t, vop)
    flat = int(t.numpy()[index_in_n])
    return cur, tuple(int(i) for i in np.unravel_index(flat, cur.shape))


@dataclasses.dataclass
class _Outcome:
    label: str
    value: float            # before the output rounding (register precision)
    value_dtype: dtype
    rounded: float          # the output element
    out_bits: str
    lo: float
    hi: float
    mid: float
    position: str           # "exact", "below midpoint", "above midpoint", "on midpoint (tie)"
    direction: str          # "up", "down", "none"
    correct: bool
    consistent: bool        # round(value) == rounded


class Explanation:
    """Result of :func:`explain`; print it, or display it in Jupyter.

    Attributes: ``index``, ``dtype`` (output dtype), ``exact`` (fp64 reference value),
    ``lo``, ``hi``, ``midpoint`` (floats), ``correctly_rounded`` (float), ``nodes`` (list
    of dicts: node label, then per combination the value, exact decimal and hex bits),
    ``outcomes`` (per combination: value before rounding, rounded output, position
    relative to the midpoint, direction, correct or not), ``why`` (str).

    >>> import castlab as cl, castlab.numerics as nm
    >>> @cl.jit
    ... def swiglu(x):
    ...     a, b = cl.chunk(x, 2, dim=-1)
    ...     return cl.silu(a) * b
    >>> e = nm.explain(swiglu, (cl.rand(8, 8, seed=0, dtype=cl.bfloat16),), (1, 2))
    >>> e.dtype.name, e.lo <= e.exact <= e.hi, e.correctly_rounded
    ('bfloat16', True, 0.181640625)
    >>> e.why.startswith("the exact value 0.18154408107851546794")
    True
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def _out_lines(self) -> list:
        f = self.dtype
        u = self.hi - self.lo if self.hi != self.lo else float(_ulp_np(np.array([self.exact]), _fmt(f))[0])
        L = []
        if getattr(self, "attribution", None):  # set by Attribution.explain
            L.append(self.attribution)
        L.append(f"output {self.out_label}  {f.name} at {self.index}")
        L.append(f"  exact (fp64 reference)   {_exact_decimal(self.exact)}  ({self.exact!r}, bits "
                 f"{_hex_bits(self.exact, float64)})")
        L.append(f"  {f.short} neighbours           {_exact_decimal(self.lo)} ({_hex_bits(self.lo, f)})"
                 f"  and  {_exact_decimal(self.hi)} ({_hex_bits(self.hi, f)})")
        if self.lo != self.hi:
            dm = Fraction(self.exact) - Fraction(self.midpoint)
            L.append(f"  midpoint                 {_exact_decimal(self.midpoint)}")
            L.append(f"  exact - midpoint         {float(dm):+.6g}  ({float(dm / Fraction(u)):+.6g} ulp)")
            L.append(f"  correctly rounded        {_exact_decimal(self.correctly_rounded)} "
                     f"({_hex_bits(self.correctly_rounded, f)}), "
                     f"{'up' if self.correctly_rounded > self.exact else 'down'} from the exact value")
        else:
            L.append("  the exact value is representable")
        return L

    def _outcome_rows(self) -> tuple:
        headers = ["policy/math", "value before rounding (exact decimal)", "bits",
                   "value - midpoint", "", "rounded to", "bits", "way", "correctly rounded"]
        rows = []
        for o in self.outcomes:
            dm = Fraction(o.value) - Fraction(o.mid) if o.lo != o.hi else Fraction(0)
            u = Fraction(o.hi) - Fraction(o.lo) if o.lo != o.hi else Fraction(1)
            rows.append([o.label, _exact_decimal(o.value), _hex_bits(o.value, o.value_dtype),
                         "-" if o.lo == o.hi else f"{float(dm):+.4g} ({float(dm / u):+.4g} ulp)",
                         o.position, _exact_decimal(o.rounded), o.out_bits, o.direction,
                         "yes" if o.correct else "NO"])
        return headers, rows

    def _node_rows(self) -> tuple:
        headers = ["node", "at", "fp64 reference"] + [o.label for o in self.outcomes]
        rows = []
        for nd in self.nodes:
            r = [nd["label"], nd["at"]]
            for v in nd["values"]:
                r.append("n/a" if v is None else f"{_exact_decimal(v[0])} [{v[1]}]")
            rows.append(r)
        return headers, rows

    def __str__(self) -> str:
        L = [f"castlab explain: {self.fn_name} at output index {self.index}"]
        L += self._out_lines()
        L.append("")
        L.append(_text_table(*self._outcome_rows()))
        L.append("")
        L.append("node values (exact decimal [hex bits, register precision]):")
        L.append(_text_table(*self._node_rows()))
        L.append("")
        for r in getattr(self, "rows", []):  # the rows reductions reduced for this element
            L.append("row reduction: " + r[0])
            L.extend(r[1:])
            L.append("")
        L.append("why: " + self.why)
        return "\n".join(L)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = _html.escape
        h = [f"<div><b>castlab explain: {e(self.fn_name)} at output index {e(str(self.index))}</b>"]
        h.append("<pre>" + e("\n".join(self._out_lines())) + "</pre>")
        h.append(_html_table(*self._outcome_rows(), "rounding of the output"))
        h.append(_html_table(*self._node_rows(), "node values (exact decimal [hex bits])"))
        for r in getattr(self, "rows", []):
            h.append("<pre>" + e("row reduction: " + "\n".join(r)) + "</pre>")
        h.append(f"<p><b>why:</b> {e(self.why)}</p></div>")
        return "".join(h)

    def to_dict(self) -> dict:
        """The explanation as plain Python values (dtypes by name), e.g. for JSON.

        >>> import castlab as cl, castlab.numerics as nm
        >>> @cl.jit
        ... def swiglu(x):
        ...     a, b = cl.chunk(x, 2, dim=-1)
        ...     return cl.silu(a) * b
        >>> d = nm.explain(swiglu, (cl.rand(8, 8, seed=0, dtype=cl.bfloat16),), (1, 2)).to_dict()
        >>> d["index"], d["dtype"], [o["label"] for o in d["outcomes"]]
        ((1, 2), 'bfloat16', ['eager/torch_eager', 'fused/torch_eager'])
        """
        return {"index": self.index, "dtype": self.dtype.name, "exact": self.exact, "lo": self.lo,
                "hi": self.hi, "midpoint": self.midpoint,
                "correctly_rounded": self.correctly_rounded,
                "outcomes": [dataclasses.asdict(o) | {"value_dtype": o.value_dtype.name}
                             for o in self.outcomes],
                "why": self.why}


def _norm_index(index, shape) -> tuple:
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        index = (int(index),)
    if not isinstance(index, (tuple, list)) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in index):
        raise TypeError(f"index must be a tuple of ints, got {index!r}")
    index = tuple(int(i) for i in index)
    if len(index) != len(shape):
        raise IndexError(f"index {index} has {len(index)} dimensions, the output has "
                         f"{len(shape)} (shape {tuple(shape)})")
    out = []
    for k, (i, s) in enumerate(zip(index, shape)):
        if not -s <= i < s:
            raise IndexError(f"index {i} is out of range for dimension {k} of size {s} "
                             f"(output shape {tuple(shape)})")
        out.append(i % s)
    return tuple(out)


def explain(fn: Any, args: Any, index: Any, policies: Any = ("eager", "fused"),
            maths: Any = ("torch_eager",), *, output: int = 0,
            ref_math: Any = "torch_eager") -> Explanation:
    """Why one output element comes out as it does under each policy/math combination.

    For the output element at `index`: the exact value (the ``fp64`` policy's), the two
    neighbouring values of the output dtype around it, their midpoint and the distances;
    for each (policy, math) the output's value before its final rounding (exact decimal
    and hex bits), where it lies relative to the midpoint, which way it was rounded and
    whether that is the correctly rounded result; and the value of every node of the
    trace at that element (nodes whose shape broadcasts to the output's; view nodes also
    name the input element they read). Nodes carry the trace's names
    (``JitFunction.trace``): the function's argument names, ``c0``... for captured
    tensors, ``t{k}`` for node k. Exact decimals longer than 30 digits are cut to 25
    followed by ``…(N digits)`` (the hex bits next to them are exact).

    >>> import castlab as cl, castlab.numerics as nm
    >>> @cl.jit
    ... def swiglu(x):
    ...     a, b = cl.chunk(x, 2, dim=-1)
    ...     return cl.silu(a) * b
    >>> x = cl.rand(8, 8, seed=0, dtype=cl.bfloat16)
    >>> e = nm.explain(swiglu, (x,), (1, 2), policies="fused",
    ...                maths=("inductor", "transformer_engine"))
    >>> [(o.label, o.direction, o.correct) for o in e.outcomes]
    [('fused/inductor', 'up', True), ('fused/transformer_engine', 'up', True)]
    >>> print(e)                                             # doctest: +ELLIPSIS
    castlab explain: swiglu at output index (1, 2)
    output t3 = mul(t2, t1)  bfloat16 at (1, 2)
      exact (fp64 reference)   0.1815440810785154679418695…(55 digits)  (0.18154408107851547, bits 0x3FC73CD62181DE4B)
      bf16 neighbours           0.1806640625 (0x3E39)  and  0.181640625 (0x3E3A)
      midpoint                 0.18115234375
    ...
    """
    jf = _as_jit(fn)
    args = _bind_args(args)
    combos = _combos(policies, maths)
    tr = jf.graph(*args)
    if not -len(tr.outputs) <= output < len(tr.outputs):
        raise IndexError(f"output {output} out of range: the function returns "
                         f"{len(tr.outputs)} tensor(s)")
    out_node = tr.outputs[output]
    out_shape = tuple(out_node.shape)
    index = _norm_index(index, out_shape)
    if not out_node.dtype.is_floating_point:
        raise TypeError(f"explain needs a floating-point output, this one is {out_node.dtype.name}")

    def pick(res):
        if isinstance(res, (tuple, list)):
            return res[output]
        return res

    ref_pol, ref_m = as_policy("fp64"), as_math(ref_math)
    ref_out = pick(jf.run(*args, policy=ref_pol, math=ref_m))
    exact = float(_val(ref_out).f64[index])
    ref_vals = _all_values(jf, args, ref_pol, ref_m, tr)
    names = _node_names(tr)
    node_list = list(tr.inputs) + list(tr.captured_nodes) + list(tr.nodes)

    outcomes, combo_vals, out_dts = [], [], []
    for label, pol, mth in combos:
        outcome, vals, odt = _outcome(jf, args, tr, output, index, exact, label, pol, mth)
        outcomes.append(outcome)
        combo_vals.append(vals)
        out_dts.append(odt)
    odt = next((d for d in out_dts if d is not float64), out_dts[0])
    f = _fmt(odt)
    lo, hi, _ = _neighbours_np(np.array([exact]), f)
    lo, hi = float(lo[0]), float(hi[0])
    mid = (lo + hi) / 2
    cr = float(_round_np(np.array([exact]), f)[0])

    nodes = _node_rows(node_list, names, out_node, index, [ref_vals] + combo_vals)

    x_cuda = any(getattr(a, "is_cuda", False) for a in args)
    rows = []
    for n in tr.nodes:
        idx = _map_index(tuple(n.shape), out_shape, index)
        if n.op in REDUCE_OPS and idx is not None:
            rows.append(_row_summary(n, idx, names, [ref_vals] + combo_vals,
                                     ["fp64 reference"] + [o.label for o in outcomes],
                                     [ref_m] + [c[2] for c in combos], x_cuda))
    why = _why(outcomes, exact, lo, hi, mid, cr, odt)
    return Explanation(fn_name=getattr(jf.fn, "__name__", "fn"), index=index, dtype=odt,
                       exact=exact, lo=lo, hi=hi, midpoint=mid, correctly_rounded=cr,
                       outcomes=outcomes, nodes=nodes, why=why, rows=rows,
                       out_label=_node_expr(out_node, names))


def _outcome(jf, args, tr, output: int, index: tuple, exact: float, label: str, pol,
             mth) -> tuple:
    """(_Outcome, every node's value, output dtype) of one configuration's run: the output
    before its last rounding, where it lies between its neighbours, which way it went."""
    out_node = tr.outputs[output]
    res = jf.run(*args, policy=pol, math=mth)
    res = _val(res[output] if isinstance(res, (tuple, list)) else res)
    odt = res.dt
    f = _fmt(odt)
    rounded = float(res.f64[index])
    vals = _all_values(jf, args, pol, mth, tr)
    # the output node before its last rounding
    if out_node.op in ("input",) or out_node.op in _VIEWS:
        pre = _val(vals[id(out_node)])
    else:
        # where the run's plan rounds (its rounding placement, castlab._rounding)
        rounding = jf._lowered(args, pol, mth).rounding

        def rounds(n) -> bool:
            return rounding.of(n).rounds

        if rounds(out_node) and pol.round_after != "none":
            keep = tuple(n.index for n in tr.nodes
                         if n is not out_node and n.op not in _VIEWS and rounds(n))
            pol2 = dataclasses.replace(pol, name="custom", round_after=keep)
            pre_vals = {id(n): t for n, t in jf.node_values(*args, policy=pol2, math=mth)}
            pre = _val(pre_vals[id(out_node)])
        else:
            pre = _val(vals[id(out_node)])
    value = float(pre.f64[index])
    lo, hi, _ = _neighbours_np(np.array([value]), f)
    lo, hi = float(lo[0]), float(hi[0])
    mid = (lo + hi) / 2
    cr_value = float(_round_np(np.array([value]), f)[0])
    if lo == hi:
        position, direction = "exact", "none"
    else:
        position = ("on the midpoint: tie, to even" if value == mid else
                    "above the midpoint" if value > mid else "below the midpoint")
        direction = "up" if rounded > value else ("down" if rounded < value else "none")
    cr = float(_round_np(np.array([exact]), f)[0])
    outcome = _Outcome(label, value, pre.dt, rounded, _hex_bits(rounded, odt), lo, hi, mid,
                       position, direction, rounded == cr or (math.isnan(rounded) and math.isnan(cr)),
                       cr_value == rounded or (math.isnan(cr_value) and math.isnan(rounded)))
    return outcome, vals, odt


def _node_rows(node_list: list, names: dict, out_node, index: tuple, all_vals: list) -> list:
    """One row per node: its expression, the element it holds at the output's `index`, and
    that element's value in each run (`all_vals`: the reference's, then each config's)."""
    out_shape = tuple(out_node.shape)
    nodes = []
    for n in node_list:
        if n.op == "scalar":
            continue
        idx = _map_index(tuple(n.shape), out_shape, index)
        label = _node_expr(n, names)
        at = "-"
        if idx is not None and n.op in _VIEWS:
            src = _source_index(n, idx)
            if src is not None:
                at = f"{names[id(src[0])]}{list(src[1])}"
        elif idx is not None:
            at = str(list(idx))
        if n is out_node:
            label += "  (output)"
        row_vals = []
        for vals in all_vals:
            t = vals.get(id(n))
            if idx is None or t is None:
                row_vals.append(None)
                continue
            v = _val(t)
            x = float(v.f64[idx])
            row_vals.append((x, _hex_bits(x, v.dt)))
        if idx is None:
            label += f"  [shape {list(n.shape)}]"
        nodes.append({"label": label, "at": at, "values": row_vals})
    return nodes


def _row_summary(n, idx: tuple, names: dict, all_vals: list, labels: list, maths: list,
                 cuda: bool) -> list:
    """Lines on the row a reduction node reduced for this element: its length, the exact
    sum of its inputs (math.fsum, correctly rounded) and their condition number, and per
    combination the computed value and the error the accumulation itself added (against
    the exact sum of that combination's own inputs), in ulps of the accumulator, with the
    order of accumulation it used."""
    x = n.inputs[0]
    dims = n.attrs["dims"]
    keep = n.attrs.get("keepdim", False)
    kept = [d for d in range(len(x.shape)) if d not in dims]
    sel: list = []
    it = iter(idx if not keep else [idx[d] for d in kept])
    for d in range(len(x.shape)):
        sel.append(slice(None) if d in dims else next(it))
    count = 1
    for d in dims:
        count *= x.shape[d]
    where = "[" + ", ".join(":" if isinstance(v, slice) else str(v) for v in sel) + "]"
    lines = [f"{names[id(n)]} = {n.op} over {names[id(x)]}{where}: {count} elements"]
    for vals, label, mth in zip(all_vals, labels, maths):
        t, r = vals.get(id(x)), vals.get(id(n))
        if t is None or r is None:
            continue
        row = np.asarray(_val(t).f64[tuple(sel)], dtype=np.float64).ravel()
        got = float(_val(r).f64[idx])
        order = mth.reduction_order(cuda)
        if n.op == "sum":
            exact = math.fsum(row) if np.isfinite(row).all() else float(np.sum(row))
            mag = float(np.sum(np.abs(row)))
            acc = _val(r).dt
            u = float(_ulp_np(np.array([exact if exact else mag or 1.0]), _fmt(acc))[0])
            err = (got - exact) / u if u and math.isfinite(got - exact) else float("nan")
            cond = mag / abs(exact) if exact else float("inf")
            lines.append(f"  {label:24s} {got!r:>24}  exact sum of its inputs {exact!r}, "
                         f"sum |x| {mag:.6g} (condition {cond:.3g}); accumulation error "
                         f"{err:+.3g} ulp of {acc.short} ({order})")
        else:
            k = int(np.nanargmax(row) if n.op == "amax" else np.nanargmin(row)) \
                if not np.isnan(row).all() else 0
            lines.append(f"  {label:24s} {got!r:>24}  at position {k} of the row (exact in any "
                         "order)")
    return lines


def _why(outcomes, exact, lo, hi, mid, cr, odt) -> str:
    s = []
    if lo == hi:
        s.append(f"the exact value {exact!r} is representable in {odt.name}.")
    else:
        side = "above" if exact > mid else ("below" if exact < mid else "exactly on")
        s.append(f"the exact value {_exact_decimal(exact)} lies {side} the {odt.short} midpoint "
                 f"{_exact_decimal(mid)}, so the correctly rounded result is {_exact_decimal(cr)}.")
    distinct = {o.rounded for o in outcomes}
    if len(distinct) == 1 and len(outcomes) > 1:
        s.append("All combinations give the same output.")
    for o in outcomes:
        if o.lo == o.hi:
            s.append(f"{o.label}: the value before rounding, {_exact_decimal(o.value)}, is "
                     f"representable: output {_exact_decimal(o.rounded)}.")
            continue
        where = ("lands exactly on the midpoint " + _exact_decimal(o.mid)
                 + " and the tie rounds to even, " + o.direction)
        if not o.position.startswith("on"):
            dm = Fraction(o.value) - Fraction(o.mid)
            where = (f"is {_exact_decimal(o.value)}, {abs(float(dm)):.3g} "
                     f"{'above' if dm > 0 else 'below'} the midpoint {_exact_decimal(o.mid)}, "
                     f"and rounds {o.direction}")
        s.append(f"{o.label} {where}, to {_exact_decimal(o.rounded)}"
                 f" ({'correctly rounded' if o.correct else 'not the correctly rounded value'}).")
    return " ".join(s)


# ================================================================ drift

@dataclasses.dataclass
class Divergence:
    """The first node at which the policy/math combinations' values differ
    (:attr:`Drift.first_divergence`).

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> fd = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),)).first_divergence
    >>> fd.op, fd.mismatches, fd.numel, fd.combos
    ('silu', 512, 512, ('fused/torch_eager',))
    """

    index: int        # node.index in the trace (-1 for the output row)
    op: str
    label: str
    mismatches: int   # elements that differ between some two combinations
    numel: int
    combos: tuple     # the combinations that differ from the first one there

    def __str__(self) -> str:
        return (f"{self.label}: {self.mismatches}/{self.numel} elements differ "
                f"({', '.join(self.combos)} vs the first)")


class Drift:
    """Result of :func:`drift`: ``rows`` (one dict per node and combination: node, op,
    dtype, combo, max_ulp, mean_ulp, rel_rmse, correctly_rounded), ``first_divergence``
    (:class:`Divergence` or None), ``combos`` (labels); ``to_frame()``, text and HTML.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> d = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),))
    >>> d.combos
    ['eager/torch_eager', 'fused/torch_eager']
    >>> [r["correctly_rounded"] for r in d.rows if r["op"] == "output"]
    [0.740234375, 1.0]
    """

    def __init__(self, fn_name, combos, rows, first_divergence, node_labels):
        self.fn_name = fn_name
        self.combos = combos
        self.rows = rows
        self.first_divergence = first_divergence
        self.node_labels = node_labels

    def to_frame(self):
        """The rows as a pandas DataFrame (one row per node and combination).

        >>> import castlab as cl, castlab.numerics as nm
        >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
        >>> df = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),)).to_frame()
        >>> df.shape, list(df.columns[:5])
        ((6, 9), ['node', 'index', 'op', 'dtype', 'combo'])
        """
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict:
        """The result as plain Python values (combos, rows, first_divergence), e.g. for JSON.

        >>> import castlab as cl, castlab.numerics as nm
        >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
        >>> d = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),)).to_dict()
        >>> d["first_divergence"]["label"], len(d["rows"])
        ('t2 = silu(t0)', 6)
        """
        return {"combos": list(self.combos), "rows": [dict(r) for r in self.rows],
                "first_divergence": None if self.first_divergence is None
                else dataclasses.asdict(self.first_divergence)}

    def _table(self) -> tuple:
        headers = ["node", "dtype"]
        for c in self.combos:
            headers += [f"{c} max ulp", "mean ulp", "rel RMSE", "corr. rounded"]
        by = {}
        for r in self.rows:
            by.setdefault(r["node"], {"dtype": r["dtype"]})[r["combo"]] = r
        rows = []
        for node in self.node_labels:
            d = by[node]
            row = [node, d["dtype"]]
            for c in self.combos:
                r = d[c]
                row += [r["max_ulp"], r["mean_ulp"], r["rel_rmse"],
                        f"{100 * r['correctly_rounded']:.2f}%"]
            rows.append(row)
        return headers, rows

    def _caption(self) -> str:
        fd = self.first_divergence
        return (f"castlab drift: {self.fn_name}, error vs fp64 per node (ulps of the node's "
                f"dtype); drift starts at: {fd if fd is not None else 'no divergence'}")

    def __str__(self) -> str:
        return self._caption() + "\n" + _text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(*self._table(), self._caption())


def drift(fn: Any, args: Any, policies: Any = ("eager", "fused"), maths: Any = ("torch_eager",),
          *, ref_math: Any = "torch_eager") -> Drift:
    """Per node of the trace, the error of each policy/math combination against the
    ``fp64`` policy (max and mean ulp error in the node's storage dtype, relative RMSE,
    fraction that rounds to the correctly rounded value), plus a final ``output`` row
    (what the function returns), and ``first_divergence``: the first node at which the
    combinations' values differ, i.e. where the drift starts.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    >>> d = nm.drift(sw, (cl.randn(32, 32, seed=0, dtype=cl.bfloat16),))
    >>> d.first_divergence.op
    'silu'
    """
    jf = _as_jit(fn)
    args = _bind_args(args)
    combos = _combos(policies, maths)
    tr = jf.graph(*args)
    ref_pol, ref_m = as_policy("fp64"), as_math(ref_math)
    # one node at a time (its value under fp64 and under every combination, then the
    # metrics, then the next node): never every node's values at once
    runs = [(ref_pol, ref_m)] + [(pol, mth) for _, pol, mth in combos]
    compute = [jf.node_computer(args, pol, mth)[0] for pol, mth in runs]
    names = _node_names(tr)
    rows, labels = [], []
    first = None

    # castlab's compare kernels where the values are (CPU threads or the GPU; only the
    # totals come back), at most CMP_MAX_RESULTS combinations at once; beyond, the
    # threaded NumPy scan of host copies, chunk by chunk (the same bits: tests)
    def add(label, op, idx, dt, xs, r):
        nonlocal first
        labels.append(label)
        diverge = first is None and len(xs) > 1
        if len(xs) <= _C.CMP_MAX_RESULTS:
            res = drift_kernel(xs, r, _fmt(dt), diverge)
        else:
            res = drift_scan([_val(x).a for x in xs], _val(r).a, _fmt(dt), diverge)
        for (clabel, _, _), (mx, mean, rr, crf) in zip(combos, res["rows"]):
            rows.append({"node": label, "index": idx, "op": op, "dtype": dt.name, "combo": clabel,
                         "max_ulp": mx, "mean_ulp": mean, "rel_rmse": rr, "correctly_rounded": crf})
        if res.get("mismatches"):
            who = tuple(c[0] for c, d in zip(combos[1:], res["differs"]) if d)
            first = Divergence(idx, op, label, res["mismatches"], int(r.numel()), who)

    for n in tr.nodes:
        if n.op in _VIEWS or n.op == "scalar" or not n.dtype.is_floating_point:
            continue
        vals = [c(n) for c in compute]
        add(_node_expr(n, names), n.op, n.index, n.dtype, vals[1:], vals[0])
        del vals
    ref_out = jf.run(*args, policy=ref_pol, math=ref_m)
    ref_outs = list(ref_out) if isinstance(ref_out, (tuple, list)) else [ref_out]
    outs = []
    for _label, pol, mth in combos:
        o = jf.run(*args, policy=pol, math=mth)
        outs.append(list(o) if isinstance(o, (tuple, list)) else [o])
    for k, on in enumerate(tr.outputs):
        xs = [o[k] for o in outs]
        add(f"output{k if len(tr.outputs) > 1 else ''} ({names.get(id(on), '?')} rounded)",
            "output", -1, xs[0].dtype, xs, ref_outs[k])
    return Drift(getattr(jf.fn, "__name__", "fn"), [c[0] for c in combos], rows, first, labels)


