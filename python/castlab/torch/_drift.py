"""``castlab.torch.drift``: per captured node, the error of two configurations against
the fp64 run, where their results start to differ, and which nodes contribute most to
the outputs' error.

A node's value under a configuration is the value its consumers read: the rounded value
where the configuration rounds it (every node under ``eager``; a value leaving a castlab
region, or an external node's result, under ``fused``), the fp32 (fp64 for fp64 nodes)
register value inside a fused region. Errors are in ulps of the node's dtype against the
fp64 policy's value (castlab.numerics' definitions).

A node's contribution to a configuration's output error, ``1 - err' / err`` with
``err`` the relative RMSE of all floating outputs against fp64 and ``err'`` the same
after a change at that node and a rerun of the rest (1: the change removes the whole
output error, 0: nothing, negative: worse). `contributions` picks the change:

* ``"rounding"`` (default): the node's rounding left out (the configuration's policy,
  in that node's region, minus that node): how much of the output error this rounding
  causes. None where castlab has no rounding to leave out: external nodes, values that
  leave their region for PyTorch (PyTorch's kernels read the storage dtype), explicit
  casts, and nodes the policy does not round (everything inside a fused region).
* ``"global"``: the node's fp64 reference value substituted, held as the configuration
  holds that node (rounded once, directly, to the node's dtype where it rounds it; to
  fp32 in a fused region's registers). This also removes the error the node inherited
  from its inputs, so late nodes score high.
* ``"local"``: the node recomputed in fp64 from the configuration's own input values,
  held the same way: what the node's formula or accumulation order adds beyond its
  rounding (a matmul's or attention's accumulation, a fused region's fp32 steps).
"""

from __future__ import annotations

import math as _math
import operator
from typing import Any

import numpy as np
import torch

from .. import _progress
from .._dlpack import from_dlpack
from .._dtype import float32, float64
from .._graph import VIEW_OPS as _VIEW_OPS
from .._jit import JitFunction
from .._lower import lower
from ..numerics._formats import _fmt, _val, round_to
from ..numerics._metrics import drift_scan
from ..numerics._tables import _html_table, _text_table
from ..policy import Math, Policy
from . import _aten
from ._program import (
    CapturedModel,
    Segment,
    capture,
    config,
    module_path,
    partition,
    where_text,
)

__all__ = ["drift", "ModelDrift"]


def _config(c: Any, what: str) -> tuple:
    try:
        return config(c)
    except TypeError as e:
        raise TypeError(f"drift: {what}: {e}") from None


def _layer(path: str) -> str:
    """The layer of a module path: up to the first numbered component (``model.layers.0``),
    else the path's first component (``lm_head``), "" at the top."""
    parts = path.split(".") if path else []
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i + 1])
    return parts[0] if parts else ""


def _np(v: Any) -> np.ndarray:
    return _val(v).a


def _candidates(cm: CapturedModel) -> list:
    """(FX node, segment index, is a boundary value) of every floating value castlab
    computes or PyTorch computes as an external node, in graph order (views left out:
    they are exact)."""
    out = []
    for k, seg in enumerate(cm.segments):
        if seg.kind == "view":
            continue
        bound = {n.name for n in seg.outputs} if seg.kind == "region" else None
        for n in seg.nodes:
            meta = n.meta.get("val")
            if not isinstance(meta, torch.Tensor) or meta.dtype not in _aten.FLOAT_DTYPES:
                continue
            if seg.kind == "region" and _aten.ATEN.get(str(n.target), ("view",))[0] == "view":
                continue
            out.append((n, k, seg.kind == "external" or n.name in bound))
    return out


class _Values:
    """Every candidate node's value in one configuration's run."""

    def __init__(self, cm: CapturedModel, flat: list, pol: Policy, mth: Math):
        self.cm, self.pol, self.mth = cm, pol, mth
        with torch.no_grad():
            self.run = cm.execute(flat, pol, mth)
        self._computers: dict = {}
        self.seg_of = {n.name: k for k, s in enumerate(cm.segments) for n in s.nodes}

    def value(self, n, k: int, boundary: bool):
        """The node's value as its consumers read it (a torch or castlab tensor)."""
        if boundary:
            return self.run.env[n.name]
        vals = self._computers.get(k)
        if vals is None:
            vals = self._computers[k] = self._region_values(k)
        return vals[n.name]

    def _region_values(self, k: int) -> dict:
        """Every op node of region `k` in register precision (fp32, or fp64 where the
        policy keeps fp64), as ``JitFunction.node_values`` observes them, but from one
        plan per region (one kernel on a GPU) instead of one per node."""
        seg = self.cm.segments[k]
        xs = list(self.run.region_inputs[k])
        tr = seg.jit.graph(*xs)
        mapping = seg.maps[id(tr.inputs[0])]
        inputs = xs + list(tr.captured)
        # register types: the rounding placement of the plan the region ran with above
        rounding = seg.jit._lowered(tuple(xs), self.pol, self.mth).rounding
        names, nodes, dts = [], [], []
        for name, node in mapping.items():
            if node.op in _VIEW_OPS or node.op == "input" or not node.dtype.is_floating_point:
                continue
            names.append(name)
            nodes.append(node)
            dts.append(float64 if rounding.of(node).compute == "f64" else float32)
        if not nodes:
            return {}
        self.pol.check_graph(tr.nodes)
        plan, outs = lower(nodes, inputs, self.pol, self.mth, out_dtypes=dts)
        plan.run(inputs, outs)
        return dict(zip(names, outs))


def _local_ref(cm: CapturedModel, n, k: int, vals: _Values, ref_math: Math, jits: dict):
    """Node `n` recomputed in fp64 from the values its inputs have in `vals`' run: the
    node's value with only its own error (its rounding, its formula) taken out."""
    seg = cm.segments[k]
    if seg.kind == "external":
        args = _subst_values(cm, (list(n.args), dict(n.kwargs)), vals, widen=True)
        with torch.no_grad():
            return n.target(*args[0], **args[1])
    tensors: list = []
    names: list = []

    def grab(x):
        names.append(x.name)
        tensors.append(_castlab(_input_value(cm, x, vals)))
        return x
    torch.utils._pytree.tree_map(lambda x: grab(x) if isinstance(x, torch.fx.Node) else x,
                                 (list(n.args), dict(n.kwargs)))
    jf = jits.get(n.name)
    if jf is None:
        def one(*xs):
            env = dict(zip(names, xs))
            a = torch.utils._pytree.tree_map(
                lambda x: env[x.name] if isinstance(x, torch.fx.Node) else x,
                (list(n.args), dict(n.kwargs)))
            return _aten.build(n, a[0], a[1])
        jf = jits[n.name] = JitFunction(one, policy="fp64", math=ref_math)
    return jf.run(*tensors, policy="fp64", math=ref_math)


def _input_value(cm: CapturedModel, x, vals: _Values):
    """The value FX node `x` has in `vals`' run, as its consumers read it (views inside a
    region taken again from their input)."""
    if x.name in vals.run.env:
        return vals.run.env[x.name]
    k = vals.seg_of[x.name]
    if _aten.ATEN.get(str(x.target), ("compute",))[0] == "view" or x.target is operator.getitem:
        a = _subst_values(cm, (list(x.args), dict(x.kwargs)), vals, widen=False, castlab=True)
        if x.target is operator.getitem:
            return a[0][0][a[0][1]]
        return _aten.build(x, a[0], a[1])
    return vals.value(x, k, False)


def _subst_values(cm, a, vals, widen: bool, castlab: bool = False):
    def get(x):
        v = _input_value(cm, x, vals)
        if castlab:
            return _castlab(v) if isinstance(v, torch.Tensor) else v
        v = _torch(v)
        return v.to(torch.float64) if widen and v.is_floating_point() else v
    return torch.utils._pytree.tree_map(lambda x: get(x) if isinstance(x, torch.fx.Node) else x, a)


def _castlab(v):
    return from_dlpack(v.detach()) if isinstance(v, torch.Tensor) else v


def _unrounded(cm: CapturedModel, n, k: int, vals: _Values, flat: list, ref_outs: list,
               err: float) -> float | None:
    """1 - (output error with castlab node `n` left unrounded) / err: the share of the
    output error that this node's rounding causes under `vals`' configuration (None
    where there is no rounding castlab could leave out: an external node, a value that
    leaves its region for PyTorch, a node the policy does not round, an explicit cast)."""
    seg = cm.segments[k]
    pol = vals.pol
    if seg.kind != "region" or n in seg.outputs or str(n.target) in _CASTS:
        return None
    tr = seg.jit.graph(*vals.run.region_inputs[k])
    node = seg.maps[id(tr.inputs[0])].get(n.name)
    if node is None or node.attrs.get("kernel_inner") or not pol.rounds_after(
            node.index, node.op, node.attrs.get("phase")):
        return None
    keep = tuple(i for i, m in enumerate(tr.nodes)
                 if i != node.index and not m.attrs.get("kernel_inner")
                 and pol.rounds_after(i, m.op, m.attrs.get("phase")))
    rp = Policy("castlab.torch.drift", round_after=keep or "none", rounding=pol.rounding,
                seed=pol.seed, saturate=pol.saturate, round_casts=pol.round_casts,
                compute=pol.compute, output=pol.output)
    with torch.no_grad():
        run = cm.execute(flat, pol, vals.mth, start=k, env=vals.run.env, region_policy={k: rp})
    es = _output_error(cm, run, ref_outs)
    return (1 - es / err) if err else 0.0


_CASTS = ("aten._to_copy.default", "aten.to.dtype", "aten.to.device", "aten.to.dtype_layout")


def _output_error(cm: CapturedModel, run, ref_outs: list) -> float:
    """Relative RMSE of all floating outputs of a run against the fp64 outputs."""
    num = den = 0.0
    for o, r in zip(_float_outputs(cm, run), ref_outs):
        d = o.double() - r
        num += float((d * d).sum())
        den += float((r * r).sum())
    return _math.sqrt(num / den) if den else (0.0 if num == 0 else _math.inf)


def _float_outputs(cm: CapturedModel, run) -> list:
    import torch.utils._pytree as pytree

    out = []
    for a in pytree.tree_leaves(cm._output_node.args[0]):
        if isinstance(a, torch.fx.Node):
            v = run.env[a.name]
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                out.append(v)
    return out


class _Cuts:
    """Partitions of the program with one node's value given from outside, reusing
    the original regions (and their traces) that the cut leaves unchanged."""

    def __init__(self, cm: CapturedModel):
        self.cm = cm
        self.known = {self._key(s): s for s in cm.segments}

    @staticmethod
    def _key(s: Segment) -> tuple:
        return (s.kind, tuple(n.name for n in s.nodes), tuple(n.name for n in s.inputs),
                tuple(n.name for n in s.outputs))

    def segments(self, name: str) -> tuple[list, int]:
        """(segments, index of the first segment that differs from the original's)."""
        segs = partition(self.cm.nodes, frozenset([name]))
        out = [self.known.get(self._key(s), s) for s in segs]
        start = 0
        while (start < len(out) and start < len(self.cm.segments)
               and out[start] is self.cm.segments[start]):
            start += 1
        return out, start


def _held(ref, n, pol: Policy, boundary: bool) -> torch.Tensor:
    """The fp64 value `ref` of node `n`, held as configuration `pol` holds that node."""
    meta = n.meta["val"]
    dt = _aten.castlab_dtype(meta.dtype)
    rounds = boundary or pol.round_after == "all"
    if not rounds:
        dt = _aten.castlab_dtype(torch.float64 if meta.dtype == torch.float64 else torch.float32)
    r = ref if isinstance(ref, torch.Tensor) else torch.utils.dlpack.from_dlpack(ref)
    r = r.detach().to(torch.float64).cpu().contiguous()
    held = torch.utils.dlpack.from_dlpack(round_to(from_dlpack(r), dt)).to(meta.device)
    return held


class ModelDrift:
    """Result of :func:`drift`: ``rows`` (one dict per captured node: name, op, module,
    layer, line, dtype, kind, then per configuration max/mean ulp error, relative RMSE,
    fraction correctly rounded and contribution, ``mismatches`` between the two
    configurations after rounding to the node's dtype, and ``closer``: which configuration
    is closer to fp64), ``start`` (the first node where the two differ), ``top(k)``
    (largest contributors), ``output_error`` (per configuration); ``to_frame()``, text,
    HTML and ``plot()``."""

    def __init__(self, name, labels, rows, output_error, start):
        self.name = name
        self.labels = labels
        self.rows = rows
        self.output_error = output_error
        self.start = start

    def to_frame(self):
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def top(self, k: int = 5, config: str = "a") -> list:
        """The `k` nodes that contribute most to configuration `config`'s ("a" or "b")
        output error (substitution), as rows."""
        key = f"{config}_contribution"
        rows = [r for r in self.rows if r.get(key) is not None and _math.isfinite(r[key])]
        return sorted(rows, key=lambda r: -r[key])[:k]

    def verdict(self) -> str:
        """Which configuration is closer to fp64 at the outputs."""
        ea, eb = self.output_error
        a, b = self.labels
        if ea == eb:
            return f"{a} and {b} are equally close to fp64 (relative RMSE {ea:.3g})"
        better, worse = (a, b) if ea < eb else (b, a)
        return (f"{better} is closer to fp64 at the outputs (relative RMSE "
                f"{min(ea, eb):.3g} vs {max(ea, eb):.3g} for {worse})")

    def _table(self) -> tuple:
        a, b = self.labels
        heads = ["node", "op", "layer", "line", "dtype", f"a={a} mean ulp", "b mean ulp",
                 "a vs b differ", "closer", "a contrib.", "b contrib."]
        body = []
        for r in self.rows:
            body.append([r["node"], r["op"].replace("aten.", ""), r["layer"], r["line"],
                         r["dtype"], r["a_mean_ulp"], r["b_mean_ulp"], r["mismatches"],
                         r["closer"], _pct(r.get("a_contribution")),
                         _pct(r.get("b_contribution"))])
        return heads, body

    def _caption(self) -> str:
        s = self.start
        start = (f"{s['node']} ({s['op']}, {s['module'] or 'top'}, {s['line']}): "
                 f"{s['mismatches']}/{s['numel']} elements differ") if s else "nowhere"
        lines = [f"castlab.torch drift: {self.name}; a={self.labels[0]}, b={self.labels[1]}, "
                 "errors against fp64", f"drift starts at: {start}", self.verdict()]
        for c, lab in (("a", self.labels[0]), ("b", self.labels[1])):
            t = self.top(3, c)
            if t:
                lines.append(f"largest contributors to {lab}'s output error: " + ", ".join(
                    f"{r['node']} ({r['op'].replace('aten.', '')}, {r['line']}) "
                    f"{_pct(r[c + '_contribution'])}" for r in t))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._caption() + "\n" + _text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(*self._table(), self._caption().replace("\n", "; "))

    def plot(self, ax: Any = None):
        """Mean ulp error against fp64 of every node for both configurations, in graph
        order, one colour band per layer; returns the matplotlib Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 3.5))
        x = np.arange(len(self.rows))
        for c, lab, mk in (("a", self.labels[0], "o"), ("b", self.labels[1], "x")):
            ax.plot(x, [r[f"{c}_mean_ulp"] for r in self.rows], mk, ms=3, label=lab)
        layers = [r["layer"] for r in self.rows]
        start = 0
        for i in range(1, len(layers) + 1):
            if i == len(layers) or layers[i] != layers[start]:
                if (len({*layers}) > 1) and (start // 1) % 2 == 0:
                    ax.axvspan(start - 0.5, i - 0.5, color="0.93", zorder=0)
                ax.text((start + i - 1) / 2, 1.0, layers[start] or "top", rotation=90,
                        transform=ax.get_xaxis_transform(), fontsize=7, va="top", ha="center")
                start = i
        ax.set_yscale("symlog", linthresh=0.5)
        ax.set_xlabel("captured node (graph order)")
        ax.set_ylabel("mean ulp error vs fp64")
        ax.set_title(f"{self.name}: drift per node")
        ax.legend(fontsize=8)
        return ax


def _pct(v) -> str:
    if v is None:
        return ""
    if not _math.isfinite(v):
        return str(v)
    return f"{100 * v:.1f}%"


def drift(model: Any, inputs: Any, a: Any = "eager", b: Any = "fused/inductor", *,
          ref: Any = "fp64", kwargs: dict | None = None, contributions: Any = "rounding",
          progress: bool = False) -> ModelDrift:
    """Per captured node of `model` (a :class:`CapturedModel`, or a module/function
    captured here with `inputs`), the error of configurations `a` and `b` against the
    `ref` run ("fp64"), where their values start to differ, which is closer to fp64, and
    (with `contributions`) how much of each configuration's output error each node
    causes, by substituting its reference value and rerunning the rest. A configuration
    is a policy name, ``"policy/math"`` or a (policy, math) pair.

    >>> import torch, castlab.torch as ct
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = (torch.randn(64, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    >>> d = ct.drift(lambda x, y: torch.nn.functional.silu(x) * y, (x, y), a="eager",
    ...              b="fused")
    >>> d.start["op"], d.top(1, "a")[0]["op"]
    ('aten.mul.Tensor', 'aten.silu.default')
    >>> d.verdict().startswith("fused/torch_eager is closer")
    True
    """
    if contributions not in ("rounding", "local", "global", None, False):
        raise ValueError(f"drift: contributions must be 'rounding', 'global', 'local' or "
                         f"None, not "
                         f"{contributions!r}")
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    cm = model if isinstance(model, CapturedModel) else capture(model, *args, kwargs=kwargs)
    flat = cm._flat_inputs(args, kwargs)
    la, pa, ma = _config(a, "a")
    lb, pb, mb = _config(b, "b")
    lr, pr, mr = _config(ref, "ref")
    if la == lb:
        raise ValueError(f"drift: a and b are the same configuration {la}")
    va, vb, vr = (_Values(cm, flat, p, m) for p, m in ((pa, ma), (pb, mb), (pr, mr)))
    cands = _candidates(cm)
    ref_outs = [o.double() for o in _float_outputs(cm, vr.run)]
    err = (_output_error(cm, va.run, ref_outs), _output_error(cm, vb.run, ref_outs))
    rows: list = []
    start = None
    refs: dict = {}
    total = len(cands) * (3 if contributions else 1)
    for i, (n, k, boundary) in enumerate(cands):
        if progress:
            _progress.bar(i, total, n.name)
        meta = n.meta["val"]
        dt = _aten.castlab_dtype(meta.dtype)
        r = vr.value(n, k, boundary)
        xa, xb = va.value(n, k, boundary), vb.value(n, k, boundary)
        res = drift_scan([_np(xa), _np(xb)], _np(r), _fmt(dt), False)
        (amx, amean, arr, acr), (bmx, bmean, brr, bcr) = res["rows"]
        ta, tb = (_torch(x).to(meta.dtype) for x in (xa, xb))
        mism = int((ta != tb).sum())
        if refs is not None and contributions:
            refs[n.name] = r
        row = {"node": n.name, "op": str(n.target), "module": module_path(n),
               "layer": _layer(module_path(n)), "line": where_text(n), "dtype": dt.name,
               "kind": cm.segments[k].kind, "numel": meta.numel(),
               "a_max_ulp": amx, "a_mean_ulp": amean, "a_rel_rmse": arr,
               "a_correctly_rounded": acr, "b_max_ulp": bmx, "b_mean_ulp": bmean,
               "b_rel_rmse": brr, "b_correctly_rounded": bcr, "mismatches": mism,
               "closer": "a" if amean < bmean else ("b" if bmean < amean else "same")}
        rows.append(row)
        if start is None and mism:
            start = dict(row)
    if contributions:
        cuts = _Cuts(cm)
        jits: dict = {}
        j = len(cands)
        for row, (n, _k, boundary) in zip(rows, cands):
            segs, first = (None, 0) if contributions == "rounding" else cuts.segments(n.name)
            for c, vals, e in (("a", va, err[0]), ("b", vb, err[1])):
                if progress:
                    _progress.bar(j, total, f"{n.name} ({c})")
                j += 1
                if contributions == "rounding":
                    row[f"{c}_contribution"] = _unrounded(cm, n, _k, vals, flat, ref_outs, e)
                    continue
                r = refs[n.name] if contributions == "global" else \
                    _local_ref(cm, n, _k, vals, mr, jits)
                held = _held(r, n, vals.pol, boundary)
                with torch.no_grad():
                    run = cm.execute(flat, vals.pol, vals.mth, segs, {n.name: held},
                                     start=first, env=vals.run.env)
                es = _output_error(cm, run, ref_outs)
                row[f"{c}_contribution"] = (1 - es / e) if e else 0.0
    if progress:
        _progress.bar(total, total, "done")
    return ModelDrift(cm.name, (la, lb), rows, err, start)


def _torch(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.utils.dlpack.from_dlpack(x)
