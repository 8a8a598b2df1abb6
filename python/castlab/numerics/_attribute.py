"""Attribution: which named factor makes configuration B's bits differ from A's, element
by element, and whether the change moved the result toward or away from the exact value.

Between two runs of one graph the only variables are named: the policy (after which nodes
it rounds, the compute dtype, the rounding mode and seed, saturation, whether casts round)
and the math variant (exp implementation, silu/sigmoid formula, division, FMA contraction,
PyTorch-kernel details). :func:`attribute` switches those factors from A's setting to B's,
alone, then in pairs, then in triples (a run of the fused graph each), and gives every
differing element the smallest set whose switch reproduces B's bits there.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from .._jit import JitFunction
from .._optable import REDUCE_OPS
from ..policy import Math, Policy, as_math, as_policy
from ._explain import _VIEWS, _as_jit, _bind_args, explain
from ._formats import _f64, _fmt, _round_np, _ulp_np, _val
from ._metrics import _flat, _ordinal
from ._tables import _html_table, _text_table

__all__ = ["attribute", "Attribution", "Factor"]

#: How near the exact value must be to a midpoint of the output format, in ulps of
#: fp32 (the op-math of 16-bit and 8-bit outputs), for two results on either side of it
#: to count as a tie rather than one being closer.
TIE_FP32_ULPS = 4
VERDICTS = ("toward", "away", "tie", "equal", "nan")

_MATH_FIELDS = tuple(f.name for f in dataclasses.fields(Math) if f.name != "name")
_POLICY_FIELDS = ("compute", "rounding", "seed", "saturate", "round_casts")
_NOT_OPS = set(_VIEWS) | {"cat", "input", "scalar", "astype"}


@dataclasses.dataclass(frozen=True)
class Factor:
    """One named difference between configurations A and B.

    kind: "rounding" (whether the policy rounds node ``t{node}``), "policy" (a policy
    field) or "math" (a Math field); name: readable; a, b: the two settings; nodes: the
    graph nodes where it acts (``t{k}`` in ``trace()``).

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda a, b: cl.silu(a) * b)
    >>> x = cl.randn(256, seed=0, dtype=cl.bfloat16)
    >>> [str(f) for f in nm.attribute(sw, (x, x), a="eager", b="fused").factors]
    ['rounding after silu (t0)']
    """

    kind: str
    key: Any
    name: str
    a: Any
    b: Any
    nodes: tuple = ()

    def __str__(self) -> str:
        return self.name


def _config(c: Any, default_math: Math, what: str) -> tuple:
    if isinstance(c, dict):
        return as_policy(c.get("policy", "fused")), as_math(c.get("math", default_math))
    if isinstance(c, (tuple, list)):
        if len(c) != 2:
            raise ValueError(f"{what}: expected (policy, math), got {len(c)} items")
        return as_policy(c[0]), as_math(c[1])
    if isinstance(c, Math):
        return as_policy("fused"), c
    if isinstance(c, str) and c in Math.presets():
        return as_policy("fused"), as_math(c)
    return as_policy(c), default_math


def _label(pol: Policy, mth: Math) -> str:
    return f"{pol.describe()}/{mth.name}"


def _op_nodes(tr) -> list:
    return [n for n in tr.nodes if n.op not in _NOT_OPS]


def _rounding_set(tr, rounding) -> frozenset:
    """The op nodes after which a policy rounds (or, in fp32, closes a kernel), as the
    lowering decided: its phases and PyTorch's backward kernels included. `rounding`: the
    rounding placement a plan carries (``plan.rounding``, castlab._rounding)."""
    return frozenset(n.index for n in _op_nodes(tr) if rounding.of(n).rounds)


def _bits(v, idx: np.ndarray | None = None) -> np.ndarray:
    """Comparable bits (of the flat elements `idx`, default all): every NaN maps to one
    pattern (NaN == NaN), -0 != +0. Integer work only, on the elements asked for."""
    f = _fmt(v.dt)
    b = _flat(np.asarray(v.a)).view(f.uint)
    if idx is not None:
        b = b[idx]
    mag = b & f.uint((1 << (f.bits - 1)) - 1)
    nan_from = np.array(np.nan, dtype=v.dt.numpy).view(f.uint) & f.uint((1 << (f.bits - 1)) - 1)
    if f.has_inf:
        nan_from = np.array(np.inf, dtype=v.dt.numpy).view(f.uint) + f.uint(1)
    return np.where(mag >= nan_from, np.iinfo(f.uint).max, b)


def _at(v, idx: np.ndarray) -> np.ndarray:
    """The flat elements `idx` of a value's array."""
    return _flat(np.asarray(v.a))[idx]


class Attribution:
    """Result of :func:`attribute`. Per differing element (flat ``indices`` into the
    output): ``sets[i]`` (tuple of factor positions into ``factors``; None when
    unexplained), ``verdicts[i]`` ("toward", "away", "tie" (A and B are the two
    neighbours of an exact value on their midpoint, or within ``TIE_FP32_ULPS`` fp32 ulps
    of it), "equal", or "nan"), ``suspicious[i]`` (B more than 1 ulp from
    the exact value, or A correctly rounded and B not). ``summary()`` is the table,
    ``verdict`` the one-line answer, ``plot()`` a bar chart, ``explain(k)`` the
    per-element explanation of the k-th differing element.

    >>> import castlab as cl, castlab.numerics as nm
    >>> f = cl.jit(lambda a, b, c: a * b + c)
    >>> a, b, c = (cl.randn(4096, seed=s) for s in range(3))
    >>> att = nm.attribute(f, (a, b, c), a="eager", b=("fused", "inductor"))
    >>> [att.set_name(s) for s, _ in att._groups()]
    ['kernel boundary after mul (t0) + math fma']
    >>> att.unexplained
    0
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    # -- tables -------------------------------------------------------------------
    def set_name(self, s) -> str:
        if s is None:
            return "unexplained"
        return " + ".join(self.factors[i].name for i in s)

    @property
    def sets(self) -> list:
        """Per differing element, its factor set (tuple of positions) or None."""
        return [None if i < 0 else self.subsets[i] for i in self.set_id]

    @property
    def verdicts(self) -> np.ndarray:
        """Per differing element: "toward", "away", "tie", "equal" or "nan"."""
        return np.array(VERDICTS)[self.verdict_codes]

    def _groups(self) -> list:
        if getattr(self, "_groups_cache", None) is None:
            nset = len(self.subsets) + 1
            key = (self.set_id + 1) * len(VERDICTS) + self.verdict_codes
            counts = np.bincount(key, minlength=nset * len(VERDICTS)).reshape(nset, -1)
            sus = np.bincount(self.set_id + 1, weights=self.suspicious, minlength=nset)
            out = []
            for sid in range(-1, nset - 1):
                c = counts[sid + 1]
                if not c.sum():
                    continue
                g = {k: int(c[i]) for i, k in enumerate(VERDICTS)}
                g["n"] = int(c.sum())
                g["suspicious"] = int(sus[sid + 1])
                out.append((None if sid < 0 else self.subsets[sid], g))
            self._groups_cache = sorted(out, key=lambda kv: (kv[0] is None, -kv[1]["n"]))
        return self._groups_cache

    _HEAD = ["factors", "elements", "toward fp64", "away from fp64", "tie at midpoint",
             "equally far", "NaN", "suspicious"]

    def _rows(self) -> list:
        return [[self.set_name(s), g["n"], g["toward"], g["away"], g["tie"], g["equal"],
                 g["nan"], g["suspicious"]] for s, g in self._groups()]

    def summary(self):
        """The summary as a pandas DataFrame: one row per factor set."""
        import pandas as pd

        return pd.DataFrame(self._rows(), columns=self._HEAD)

    def to_dict(self) -> dict:
        return {"a": self.a_label, "b": self.b_label, "elements": self.total,
                "differ": len(self.indices), "verdict": self.verdict,
                "factors": [dataclasses.asdict(f) | {"a": repr(f.a), "b": repr(f.b)}
                            for f in self.factors],
                "rows": [dict(zip(self._HEAD, r)) for r in self._rows()]}

    @property
    def unexplained(self) -> int:
        return int((self.set_id < 0).sum())

    def _caption(self) -> str:
        return (f"castlab attribution: {self.fn_name}, A = {self.a_label}, B = {self.b_label}, "
                f"device {self.device}")

    def __str__(self) -> str:
        lines = [self._caption(), self.verdict, ""]
        lines.append(_text_table(self._HEAD, self._rows()))
        lines.append("")
        lines.append("factors (A -> B) and where they act:")
        for f in self.factors:
            where = ", ".join(self.node_labels[k] for k in f.nodes) or "nowhere on this device"
            lines.append(f"  {f.name}: {f.a!r} -> {f.b!r}; acts at {where}")
        for f in self.inert:
            lines.append(f"  {f.name}: {f.a!r} -> {f.b!r}; no effect on {self.device}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        import html

        return (f"<p>{html.escape(self.verdict)}</p>"
                + _html_table(self._HEAD, self._rows(), self._caption()))

    def element(self, k: int) -> dict:
        """The k-th differing element: its index, values, factor set and verdict."""
        i = int(self.indices[k])
        idx = np.unravel_index(i, self.shape)
        sid = int(self.set_id[k])
        return {"index": tuple(int(j) for j in idx), "a": float(self.a_values[k]),
                "b": float(self.b_values[k]), "exact": float(self.ref_values[k]),
                "factors": self.set_name(None if sid < 0 else self.subsets[sid]),
                "verdict": VERDICTS[int(self.verdict_codes[k])],
                "suspicious": bool(self.suspicious[k])}

    def explain(self, k: int = 0):
        """``castlab.numerics.explain`` of the k-th differing element under A and B, with
        its attribution as the first line."""
        e = self.element(k)
        pa, ma = self.a_config
        pb, mb = self.b_config
        pols = (pa,) if pa == pb else (pa, pb)
        maths = (ma,) if ma == mb else (ma, mb)
        ex = explain(self.fn, self.args, e["index"], policies=pols, maths=maths,
                     output=self.output)
        ex.attribution = (f"attribution: {e['factors']} ({e['verdict']}"
                          + (", suspicious" if e["suspicious"] else "") + ")")
        return ex

    def plot(self, ax=None):
        """A horizontal bar chart: elements per factor set, split by the fp64 verdict."""
        import matplotlib.pyplot as plt

        groups = self._groups()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(groups))))
        labels = [self.set_name(s) for s, _ in groups]
        left = np.zeros(len(groups))
        for key, color in (("toward", "tab:green"), ("tie", "tab:gray"), ("equal", "tab:blue"),
                           ("away", "tab:red"), ("nan", "black")):
            vals = np.array([g[key] for _, g in groups], dtype=float)
            ax.barh(labels, vals, left=left, color=color, label=key)
            left += vals
        ax.set_xlabel("differing elements")
        ax.set_title(f"{self.b_label} vs {self.a_label}")
        ax.legend(loc="lower right", fontsize=8)
        ax.invert_yaxis()
        return ax


def attribute(fn: Any, args: Any, a: Any = "eager", b: Any = "fused", *, ref: Any = "fp64",
              output: int = 0, max_set: int = 3) -> Attribution:
    """For every element where configuration `b` differs from `a`, the smallest set of
    named factors whose switch from A's setting to B's reproduces B's bits there, and the
    fp64 verdict (did B move toward the exact value, away from it, or is it a tie?).

    `a`, `b`: a ``(policy, math)`` pair, a policy (name or ``castlab.Policy``; math: the
    jit's), or a math preset name (policy "fused"). `ref`: "fp64" (the fp64 policy under
    A's math) or a float64 tensor of the output's shape. `output`: which output of a
    multi-output function. `max_set`: the largest factor set searched exhaustively;
    elements still unexplained then get a minimal set found by removing factors one at a
    time from the full switch.

    >>> import castlab as cl, castlab.numerics as nm
    >>> sw = cl.jit(lambda a, b: cl.silu(a) * b)
    >>> a, b = cl.randn(4096, seed=0, dtype=cl.bfloat16), cl.randn(4096, seed=1, dtype=cl.bfloat16)
    >>> att = nm.attribute(sw, (a, b), a="eager", b="fused")
    >>> print(att.verdict)                                    # doctest: +ELLIPSIS
    B (fused/torch_eager) differs from A (eager/torch_eager) in ... of 4,096 elements: ... by rounding after silu (t0)...
    """
    jf: JitFunction = _as_jit(fn)
    args = _bind_args(args)
    if isinstance(max_set, bool) or not isinstance(max_set, int) or max_set < 1:
        raise ValueError(f"attribute: max_set must be an int >= 1, got {max_set!r}")
    pa, ma = _config(a, jf.math, "a")
    pb, mb = _config(b, jf.math, "b")
    tr = jf.graph(*args)
    if not -len(tr.outputs) <= output < len(tr.outputs):
        raise IndexError(f"attribute: output {output} out of range: the function returns "
                         f"{len(tr.outputs)} tensor(s)")
    out_node = tr.outputs[output]
    if not out_node.dtype.is_floating_point:
        raise TypeError(f"attribute needs a floating-point output, this one is "
                        f"{out_node.dtype.name}")

    def run(pol, mth):
        r = jf.run(*args, policy=pol, math=mth)
        return _val(r[output] if isinstance(r, (tuple, list)) else r)

    va, vb = run(pa, ma), run(pb, mb)
    if va.dt is not vb.dt:
        raise ValueError(f"attribute: A's output is {va.dt.name} but B's is {vb.dt.name}; "
                         "bits can be attributed only between results of one dtype (compare "
                         "each against the fp64 reference with castlab.numerics.compare)")
    device = va.device
    # -- the reference
    if isinstance(ref, str):
        if ref != "fp64":
            raise ValueError(f"attribute: ref must be 'fp64' or a float64 tensor, got {ref!r}")
        vr = run(as_policy("fp64"), ma)
    else:
        vr = _val(ref, "ref")
    if vr.dt.name != "float64":
        raise ValueError(f"attribute: the reference must be exact for {va.dt.name}: a float64 "
                         f"result, got {vr.dt.name}")
    if tuple(vr.a.shape) != tuple(va.a.shape):
        raise ValueError(f"attribute: the reference has shape {tuple(vr.a.shape)}, the output "
                         f"{tuple(va.a.shape)}")

    # -- the factors: where A and B round, as the plans of their runs above placed it
    ra = _rounding_set(tr, jf._lowered(args, pa, ma).rounding)
    rb = _rounding_set(tr, jf._lowered(args, pb, mb).rounding)
    factors = _factors(tr, (pa, ma), (pb, mb), ra, rb)
    factors, inert = _acting(jf, tr, args, factors, (pa, ma), ra, rb)

    def mixed(subset) -> tuple:
        return _mixed(factors, ra, pa, ma, subset)

    bits_a, bits_b = _bits(va), _bits(vb)
    diff = np.nonzero(bits_a != bits_b)[0]
    want = bits_b[diff]

    def attempt(subset, where):
        """Mask over `where`: the positions whose bits `subset` reproduces."""
        return _bits(run(*mixed(subset)), diff[where]) == want[where]

    subsets, set_id = _search(len(diff), len(factors), max_set, attempt)

    a64, b64, r64, codes, suspicious = _verdicts(va, vb, vr, diff)

    node_labels = {}
    for nd in tr.nodes:
        w = nd.where
        src = f" at {w[0].rsplit('/', 1)[-1]}:{w[1]}" if w else ""
        node_labels[nd.index] = f"t{nd.index} {nd.op}{src}"
    att = Attribution(
        fn=jf, fn_name=getattr(jf.fn, "__name__", "fn"), args=args, output=output,
        a_config=(pa, ma), b_config=(pb, mb), a_label=_label(pa, ma), b_label=_label(pb, mb),
        device=device, factors=factors, inert=inert, node_labels=node_labels,
        shape=tuple(va.a.shape), total=int(va.a.size), indices=diff, subsets=subsets,
        set_id=set_id, verdict_codes=codes, suspicious=suspicious,
        a_values=a64, b_values=b64, ref_values=r64)
    att.verdict = _verdict(att)
    return att


def _factors(tr, a: tuple, b: tuple, ra: frozenset, rb: frozenset) -> list:
    """The factors A = (policy, math) and B differ in: a rounding after a node (`ra`, `rb`:
    where each rounds), a policy field, a math field."""
    (pa, ma), (pb, mb) = a, b
    if pa.output != pb.output:
        raise ValueError("attribute: A and B write different output dtypes "
                         f"({pa.output} vs {pb.output})")
    factors: list = []
    by_index = {n.index: n for n in tr.nodes}
    used = {id(i) for m in tr.nodes for i in m.inputs}
    outs = {id(o) for o in tr.outputs}
    for k in sorted(ra ^ rb):
        n = by_index[k]
        if (id(n) in outs and id(n) not in used and pa.output is None
                and "stochastic" not in (pa.rounding, pb.rounding)):
            continue  # rounding an output that nothing reads is the output store's rounding
            # (not under stochastic rounding: an explicit rounding and the store draw
            # different random streams)
        what = "rounding" if n.dtype.bits < 32 or (pa.compute or pb.compute) else "kernel boundary"
        factors.append(Factor("rounding", k, f"{what} after {n.op} (t{k})", k in ra, k in rb,
                              (k,)))
    for f in _POLICY_FIELDS:
        if getattr(pa, f) != getattr(pb, f):
            if f == "seed" and "stochastic" not in (pa.rounding, pb.rounding):
                continue
            factors.append(Factor("policy", f, f"policy {f}", getattr(pa, f), getattr(pb, f)))
    for f in _MATH_FIELDS:
        if getattr(ma, f) != getattr(mb, f):
            factors.append(Factor("math", f, f"math {f}", getattr(ma, f), getattr(mb, f)))
    if not factors:
        raise ValueError(f"attribute: A ({_label(pa, ma)}) and B ({_label(pb, mb)}) differ in "
                         "no factor: they compute the same thing")
    return factors


def _mixed(factors: list, ra: frozenset, pa: Policy, ma: Math, subset) -> tuple:
    """(policy, math) of A with the factors `subset` (positions into `factors`) switched
    to B's setting."""
    chosen = {factors[i].key: factors[i] for i in subset}
    rset = set(ra)
    for i in subset:
        if factors[i].kind == "rounding":
            rset ^= {factors[i].key}
    pf = {f: (chosen[f].b if f in chosen else getattr(pa, f)) for f in _POLICY_FIELDS}
    pol = Policy("attribution", round_after=tuple(sorted(rset)) or "none",
                 output=pa.output, **pf)
    mf = {f: (chosen[f].b if f in chosen else getattr(ma, f)) for f in _MATH_FIELDS}
    return pol, Math("attribution", **mf)


def _acting(jf: JitFunction, tr, args, factors: list, a: tuple, ra: frozenset,
            rb: frozenset) -> tuple:
    """(acting, inert): the factors with the nodes each acts at (``Factor.nodes``), and
    the policy/math factors that change no node's lowering decision."""
    pa, ma = a

    # where each policy/math factor acts: the nodes whose lowering decision it changes,
    # switched alone from A or alone back from B (fma acts only where nothing rounds)
    def record(subset):
        return jf._plan(tr, list(args) + list(tr.captured),
                        *_mixed(factors, ra, pa, ma, subset))[0].record

    every = tuple(range(len(factors)))
    rec_a, rec_b = record(()), record(every)
    inert = []
    acting = []
    for i, f in enumerate(factors):
        if f.kind == "rounding":
            acting.append(f)
            continue
        rec_ai = record((i,))
        rec_bi = record(tuple(j for j in every if j != i))
        nodes = tuple(n.index for n in _op_nodes(tr) + [m for m in tr.nodes if m.op == "astype"]
                      if _decision(rec_a.of(n)) != _decision(rec_ai.of(n))
                      or _decision(rec_b.of(n)) != _decision(rec_bi.of(n)))
        if f.kind == "policy" and f.key in ("rounding", "seed", "saturate"):
            nodes = tuple(sorted(set(nodes) | (ra & rb)))  # acts at every rounding
        f = dataclasses.replace(f, nodes=tuple(sorted(nodes)))
        (acting if f.nodes or f.kind == "policy" else inert).append(f)
    return acting, inert


def _search(ndiff: int, n: int, max_set: int, attempt) -> tuple:
    """(subsets, set_id): the smallest factor sets (of the n) reproducing B's bits at each
    of the ndiff differing elements, up to max_set exhaustively, then greedily from the
    full switch. `attempt(subset, where)`: the mask over positions `where` it reproduces."""
    subsets: list = []                      # set_id -> tuple of factor positions
    set_id = np.full(ndiff, -1, dtype=np.int64)
    remaining = np.arange(ndiff)            # positions into diff
    for size in range(1, min(max_set, n) + 1):
        for subset in itertools.combinations(range(n), size):
            if len(remaining) == 0:
                break
            ok = attempt(subset, remaining)
            if ok.any():
                set_id[remaining[ok]] = len(subsets)
                subsets.append(subset)
                remaining = remaining[~ok]
    if len(remaining) and n > max_set:
        # greedy: from the full switch, drop the factors that are not needed
        full = tuple(range(n))
        cur = {full: remaining[attempt(full, remaining)]}
        for i in range(n):
            nxt: dict = {}
            for s_, where in cur.items():
                t = tuple(j for j in s_ if j != i)
                ok = attempt(t, where) if t and i in s_ else np.zeros(len(where), bool)
                hit, rest = where[ok], where[~ok]
                for key, w in ((t, hit), (s_, rest)):
                    if len(w):
                        nxt[key] = np.concatenate([nxt[key], w]) if key in nxt else w
            cur = nxt
        for s_, where in cur.items():
            set_id[where] = len(subsets)
            subsets.append(s_)
    return subsets, set_id


def _verdicts(va, vb, vr, diff: np.ndarray) -> tuple:
    """(A, B and the reference at the differing elements in float64, verdict codes,
    suspicious) (toward/away compare |x - ref| directly: the same ulp(ref) scales both)."""
    a64, b64, r64 = (_f64(_at(v, diff)) for v in (va, vb, vr))
    fmt = _fmt(va.dt)
    with np.errstate(all="ignore"):
        da, db = np.abs(a64 - r64), np.abs(b64 - r64)
        nan = np.isnan(a64) | np.isnan(b64) | np.isnan(r64)
        # A tie: A and B are adjacent values of the format on either side of an exact
        # value that sits on their midpoint, or so near it (TIE_FP32_ULPS ulps of fp32
        # op-math, for outputs narrower than fp32) that the op-math result itself can
        # land on the midpoint and round to even.
        lo, hi = np.minimum(a64, b64), np.maximum(a64, b64)
        adjacent = np.abs(_ordinal(_at(va, diff).view(fmt.uint), fmt.bits)
                          - _ordinal(_at(vb, diff).view(fmt.uint), fmt.bits)) == 1
        near = TIE_FP32_ULPS * 2.0 ** (fmt.p - 23) if fmt.p < 23 else 0.0
        tie = adjacent & (lo <= r64) & (r64 <= hi) & (np.abs(r64 - (lo + hi) / 2)
                                                       <= near * (hi - lo))
        u = _ulp_np(r64, fmt)
        finite = np.where(np.isfinite(r64), r64, 0.0)
        cr = _round_np(finite, fmt)
        suspicious = ~nan & ~tie & ((db > u) | ((a64 == cr) & (b64 != cr)))
    codes = np.select([nan, tie, db < da, db > da], [4, 2, 0, 1], default=3).astype(np.int8)
    return a64, b64, r64, codes, suspicious


def _decision(d) -> tuple | None:
    if d is None:
        return None
    # a reduction's description names its order of accumulation (Math.reduction)
    return (d.compute, d.variant, d.fma_with is not None, d.fma_into is not None, d.quirk,
            d.round_to, d.round_mode, d.description if d.op in REDUCE_OPS else "")


def _verdict(att: Attribution) -> str:
    n = len(att.indices)
    head = f"B ({att.b_label}) differs from A ({att.a_label}) in {n:,} of {att.total:,} elements"
    if n == 0:
        return head.replace(f"in 0 of {att.total:,} elements", "in no element") + "."
    parts = []
    for s, g in att._groups():
        words = []
        for key, text, one in (("toward", "toward fp64", "toward fp64"),
                               ("away", "away from fp64", "away from fp64"),
                               ("tie", "ties at midpoints", "tie at a midpoint"),
                               ("equal", "equally far", "equally far"), ("nan", "NaN", "NaN")):
            if g[key]:
                words.append("all " + text if g[key] == g["n"] and g["n"] > 1 else
                             f"{g[key]:,} " + (one if g[key] == 1 else text))
        name = "unexplained" if s is None else "by " + att.set_name(s)
        parts.append(f"{g['n']:,} {name}, {', '.join(words)}")
    sus = int(att.suspicious.sum())
    tail = f"; {sus:,} suspicious (B over 1 ulp from fp64, or A correctly rounded and B not)" \
        if sus else ""
    return head + ": " + "; ".join(parts) + tail + "."
