"""View push-down and concatenation hoisting: the expressions a graph is lowered into.

An output is expressed as a tree of expressions over *leaves* (strided views of inputs and
temporaries): view ops (slice, select, permute, expand, reshape, squeeze, gather) are
pushed down to the leaves, where they cost nothing; a reshape that no strided view can
express materialises its operand in a temporary first. Concatenations are then hoisted to
the top, so each output splits into rectangular regions and every region is a pure
elementwise DAG (RoPE's ``cat(-x2, x1)`` becomes two regions that read the two halves of
``x`` directly).
"""

from __future__ import annotations

import math

from . import _C
from ._dtype import _BY_CODE, as_dtype, float32, int64
from ._graph import Node
from ._lower_steps import IndexStep

# ---------------------------------------------------------------- expressions

class Leaf:
    __slots__ = ("t", "src", "shape")

    def __init__(self, t, src):
        self.t = t          # a _C.Tensor view
        self.src = src      # ("in", i) | ("tmp", k)
        self.shape = t.shape


class Scalar:
    __slots__ = ("value",)
    shape = None

    def __init__(self, value):
        self.value = value


class Elem:
    """An elementwise node over `args`, computed in `shape`; `views`: the view ops pushed
    through it (its index space is its node's seen through them)."""

    __slots__ = ("node", "args", "shape", "views")

    def __init__(self, node: Node, args: list, shape: tuple, views: tuple = ()):
        self.node = node
        self.args = args
        self.shape = tuple(shape)
        self.views = views


class Cat:
    __slots__ = ("dim", "parts", "shape")

    def __init__(self, dim: int, parts: list, shape: tuple):
        self.dim = dim
        self.parts = parts
        self.shape = tuple(shape)


class Reduced:
    """The result of a reduction node: its row results (a temporary in the accumulator's
    type) seen through `leaf`; a program that reads it rounds it as the policy says."""

    __slots__ = ("node", "leaf", "shape")

    def __init__(self, node: Node, leaf: Leaf, shape: tuple):
        self.node = node
        self.leaf = leaf
        self.shape = tuple(shape)


def apply_view(t, vop):
    k = vop[0]
    if k == "slice":
        return t._slice(*vop[1:])
    if k == "select":
        return t._select(*vop[1:])
    if k == "permute":
        return t._permute(list(vop[1]))
    if k == "expand":
        return t._expand(list(vop[1]))
    if k == "reshape":
        return t._view_or_none(list(vop[1]))
    if k == "unsqueeze":
        return t._unsqueeze(vop[1])
    if k == "squeeze":
        return t._squeeze(vop[1])
    raise ValueError(k)


def contiguous_strides(shape: tuple) -> tuple:
    """The element strides of a contiguous tensor of `shape` (logical order)."""
    st, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= shape[d]
    return tuple(st)


def view_shape(shape: tuple, vop) -> tuple:
    k = vop[0]
    s = list(shape)
    if k == "slice":
        _, d, start, stop, step = vop
        n = s[d]
        start = max(0, min(n, start + n if start < 0 else start))
        stop = max(0, min(n, stop + n if stop < 0 else stop))
        s[d] = max(0, (stop - start + step - 1) // step)
        return tuple(s)
    if k == "select":
        del s[vop[1]]
        return tuple(s)
    if k == "permute":
        return tuple(shape[i] for i in vop[1])
    if k in ("expand", "reshape"):
        return tuple(vop[1])
    if k == "unsqueeze":
        s.insert(vop[1], 1)
        return tuple(s)
    if k == "squeeze":
        if s[vop[1]] == 1:
            del s[vop[1]]
        return tuple(s)
    raise ValueError(k)


def _norm_vop(vop, shape):
    """Make dims non-negative and expand shapes explicit, for a given input shape."""
    k = vop[0]
    nd = len(shape)
    if k == "gather":  # ("gather", dim, index Leaf, wrap, target): from castlab._index
        return vop
    if k in ("slice", "select", "squeeze"):
        d = vop[1] + nd if vop[1] < 0 else vop[1]
        return (k, d) + tuple(vop[2:])
    if k == "unsqueeze":
        d = vop[1] + nd + 1 if vop[1] < 0 else vop[1]
        return (k, d)
    if k == "permute":
        return (k, tuple(d + nd if d < 0 else d for d in vop[1]))
    if k == "expand":
        tgt = list(vop[1])
        off = len(tgt) - nd
        for i in range(len(tgt)):
            if tgt[i] == -1:
                tgt[i] = shape[i - off]
        return (k, tuple(tgt))
    return vop


def _dtype_code(t) -> int:
    return as_dtype(t._dtype_name).code


#: A broadcast recomputes its expression for every element it makes, and each view pushed
#: through an expression copies it. Past this many elementwise nodes, an expression that
#: a broadcast multiplies at least BROADCAST_GROWTH times, or that is seen through two
#: different views, is computed once into a temporary (in its register type: the same
#: values) and the views read that. A reduction
#: written out as a tree of slices (the Liger and vLLM RMSNorm presets' block sums) has
#: thousands of nodes per row; recomputed for each element of the row, a 4,096-wide
#: RMSNorm took 9 s on a CPU and its GPU kernel did not compile in minutes.
BROADCAST_RECOMPUTE_NODES = 32
BROADCAST_GROWTH = 16


def _broadcast_costly(e: Elem, shape: tuple) -> bool:
    return math.prod(shape) >= BROADCAST_GROWTH * max(math.prod(e.shape), 1) and _large(e)


def _large(e: Elem) -> bool:
    """More than BROADCAST_RECOMPUTE_NODES elementwise nodes."""
    seen: set = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if not isinstance(x, Elem) or id(x) in seen:
            continue
        seen.add(id(x))
        if len(seen) > BROADCAST_RECOMPUTE_NODES:
            return True
        stack.extend(x.args)
    return False


class ViewLowering:
    """The lowering's view push-down, indexing and concatenation hoisting (a part of
    castlab._lower.Lowering: it uses its ``expr``, ``materialize``, ``_temp_from``,
    ``_expr_dtype``, ``steps``, ``temps`` and ``device``)."""

    def view(self, e, vop):
        if isinstance(e, Scalar):
            return e
        vop = _norm_vop(vop, e.shape)
        if vop[0] == "expand" and tuple(vop[1]) == tuple(e.shape):
            return e
        if vop[0] == "reshape" and tuple(vop[1]) == tuple(e.shape):
            return e
        key = (id(e), vop)
        r = self._view_memo.get(key)
        if r is not None:
            return r
        if isinstance(e, Elem) and self._recomputed(e, vop):
            m = self._view_memo.get((id(e), "materialized"))
            if m is None:
                m = self.materialize(e)
                self._view_memo[(id(e), "materialized")] = m
            r = self.view(m, vop)
            self._view_memo[key] = r
            return r
        r = self._view(e, vop)
        self._view_memo[key] = r
        self._view_memo[(id(r), "keep")] = e  # keep e alive so its id is not reused
        return r

    def _recomputed(self, e: Elem, vop) -> bool:
        """Whether pushing `vop` through `e` would make the program recompute a large
        expression many times: a broadcast of it (every element it makes computes it
        again), or a second, different view of it (each view is a copy of the whole
        expression; a tree of slices of slices doubles at every level)."""
        # (e kept alive for the lowering: the entries below are keyed by its id)
        self._view_memo.setdefault((id(e), "alive"), e)
        if self._onednn_gelu_here(e):
            return True
        if vop[0] == "expand":
            return _broadcast_costly(e, vop[1])
        if vop[0] == "gather":
            return False
        views = self._view_memo.setdefault((id(e), "views"), set())
        views.add(vop)
        return len(views) > 1 and _large(e)

    def _onednn_gelu_here(self, e: Elem) -> bool:
        """A gelu PyTorch's CPU kernel hands to oneDNN only for a contiguous input of 2 or
        more elements (castlab._onednn): the executor decides by the layout it runs the
        instruction over, so a view pushed through it (gelu(y) broadcast into x + gelu(y),
        a slice of gelu(y)) would change that choice. The gelu is computed on its own
        input first, as PyTorch computes it, and the view reads the result."""
        n = e.node
        return (n.op == "gelu" and not n.attrs.get("kernel_inner")
                and bool(self.math._onednn_gelu("gelu", n.dtype.name, self.cuda)))

    # -- indexing by tensors (castlab._index) --------------------------------------------
    def _index_leaf(self, node: Node) -> Leaf:
        """An int64 index as a Leaf an index step reads: the tensor itself, or its values
        computed into a temporary."""
        e = self.expr(node)
        if isinstance(e, Leaf) and _dtype_code(e.t) == int64.code:
            return e
        return self.materialize(e)

    def _gather(self, node: Node):
        """gather(x, dim, index) as a view of x's expression: pushed through its
        elementwise ops (each op computes only the gathered values) to the tensors they
        read; each of those read along `dim` is gathered by an index step, one broadcast
        along `dim` is read as it is. An index step checks the index's range; where none
        runs (x broadcast along dim), a check step does."""
        x, ix = node.inputs
        dim, wrap = node.attrs["dim"], bool(node.attrs.get("wrap"))
        target = bool(node.attrs.get("target"))
        idx = self._index_leaf(ix)
        before = sum(1 for st in self.steps if isinstance(st, IndexStep))
        e = self.view(self.expr(x), ("gather", dim, idx, wrap, target))
        if sum(1 for st in self.steps if isinstance(st, IndexStep)) == before:
            self.steps.append(IndexStep.make([idx, idx], [idx],
                                             (2, dim, x.shape[dim], wrap, target)))
        return e

    def _index_step(self, mode: int, src: Leaf, idx: Leaf, dim: int, shape: tuple,
                    wrap: bool = False, target: bool = False) -> Leaf:
        """A temporary of `shape` that an index step writes from src (same dtype)."""
        dt = _BY_CODE[_dtype_code(src.t)]
        k = len(self.temps)
        self.temps.append((tuple(shape), dt))
        t = _C.empty(list(shape), dt.name, str(self.device))
        self.temp_tensors.append(t)
        out = Leaf(t, ("tmp", k))
        self.steps.append(IndexStep.make([src, idx], [out], (mode, dim, 0, wrap, target)))
        return out

    def _scatter_add(self, node: Node) -> Leaf:
        """Zeros of the node's shape with src added at index along dim (gather's gradient),
        src computed in its register type (exact), the sums in it too."""
        src, ix = node.inputs
        e = self.expr(src)
        acc = self._expr_dtype(e) if not isinstance(e, Scalar) else float32
        if not isinstance(e, Leaf) or _dtype_code(e.t) != acc.code:
            e = self._temp_from(e, tuple(src.shape), acc)  # widened exactly (a bf16 src too)
        return self._index_step(1, e, self._index_leaf(ix), node.attrs["dim"], node.shape)

    def _view_gather(self, e, vop):
        _, dim, idx, wrap, target = vop
        ishape = tuple(idx.shape)
        if isinstance(e, Leaf):
            t = e.t
            for d in range(len(ishape)):  # other dims: the index's extent
                if d != dim and t.shape[d] != ishape[d]:
                    t = t._slice(d, 0, ishape[d], 1)
            if t.shape[dim] == 1 or t._strides[dim] == 0:  # the same value for every index
                t = t._slice(dim, 0, 1, 1)._expand(list(ishape))
                return Leaf(t, e.src)
            return self._index_step(0, Leaf(t, e.src), idx, dim, ishape, wrap, target)
        if isinstance(e, Elem):
            return Elem(e.node, [self.view(a, vop) for a in e.args], ishape)
        if isinstance(e, Reduced):
            return Reduced(e.node, self.view(e.leaf, vop), ishape)
        return self.view(self.materialize(e), vop)  # a concatenation: computed first

    def _view(self, e, vop):
        if vop[0] == "gather":
            return self._view_gather(e, vop)
        if isinstance(e, Leaf):
            t = apply_view(e.t, vop)
            if t is None:  # reshape that no strided view expresses: copy first
                return self.view(self.materialize(e), vop)
            return Leaf(t, e.src)
        if isinstance(e, Elem):
            shape = view_shape(e.shape, vop)
            if vop[0] == "reshape":
                args = []
                for a in e.args:
                    if isinstance(a, Scalar):
                        args.append(a)
                        continue
                    v = self.view(a, vop)
                    args.append(v)
                return Elem(e.node, args, shape, e.views + (vop,))
            return Elem(e.node, [self.view(a, vop) for a in e.args], shape, e.views + (vop,))
        if isinstance(e, Cat):
            return self._view_cat(e, vop)
        if isinstance(e, Reduced):
            return Reduced(e.node, self.view(e.leaf, vop), view_shape(e.shape, vop))
        raise TypeError(type(e))

    def _view_cat(self, e: Cat, vop):
        k, d = vop[0], e.dim
        sizes = [p.shape[d] for p in e.parts]
        offs = [sum(sizes[:i]) for i in range(len(sizes))]
        shape = view_shape(e.shape, vop)
        if k == "slice" and vop[1] == d:
            _, _, start, stop, step = vop
            n = e.shape[d]
            start = max(0, min(n, start + n if start < 0 else start))
            stop = max(0, min(n, stop + n if stop < 0 else stop))
            parts = []
            for p, o, s in zip(e.parts, offs, sizes):
                lo, hi = max(start, o), min(stop, o + s)
                if lo >= hi:
                    continue
                first = lo if (lo - start) % step == 0 else lo + (step - (lo - start) % step)
                if first >= hi:
                    continue
                parts.append(self.view(p, ("slice", d, first - o, hi - o, step)))
            if not parts:
                return self.view(e.parts[0], ("slice", d, 0, 0, 1))
            return parts[0] if len(parts) == 1 else Cat(d, parts, shape)
        if k == "select" and vop[1] == d:
            i = vop[2] + e.shape[d] if vop[2] < 0 else vop[2]
            for p, o, s in zip(e.parts, offs, sizes):
                if o <= i < o + s:
                    return self.view(p, ("select", d, i - o))
        if k in ("slice",):
            return Cat(d, [self.view(p, vop) for p in e.parts], shape)
        if k == "select":
            nd = d - 1 if vop[1] < d else d
            return Cat(nd, [self.view(p, vop) for p in e.parts], shape)
        if k == "permute":
            perm = vop[1]
            return Cat(perm.index(d), [self.view(p, vop) for p in e.parts], shape)
        if k == "unsqueeze":
            nd = d + 1 if vop[1] <= d else d
            return Cat(nd, [self.view(p, vop) for p in e.parts], shape)
        if k == "squeeze":
            if e.shape[vop[1]] != 1:
                return e
            nd = d - 1 if vop[1] < d else d
            return Cat(nd, [self.view(p, vop) for p in e.parts], shape)
        if k == "expand":
            tgt = list(vop[1])
            lead = len(tgt) - len(e.shape)
            nd = d + lead
            if tgt[nd] != e.shape[d]:
                return self.view(self.materialize(e), vop)
            parts = []
            for p in e.parts:
                t2 = list(tgt)
                t2[nd] = p.shape[d]
                parts.append(self.view(p, ("expand", tuple(t2))))
            return Cat(nd, parts, shape)
        # reshape of a concatenation: compute it first
        return self.view(self.materialize(e), vop)

    # -- hoisting concatenations ------------------------------------------------
    def hoist(self, e):
        key = id(e)
        r = self._hoist_memo.get(key)
        if r is not None:
            return r
        if isinstance(e, Cat):
            r = Cat(e.dim, [self.hoist(p) for p in e.parts], e.shape)
        elif isinstance(e, Elem):
            args = [self.hoist(a) for a in e.args]
            cat = next((a for a in args if isinstance(a, Cat)), None)
            if cat is None:
                r = Elem(e.node, args, e.shape, e.views)
            else:
                d = cat.dim
                parts, o = [], 0
                for p in cat.parts:
                    s = p.shape[d]
                    sub = [a if isinstance(a, Scalar) else self.view(a, ("slice", d, o, o + s, 1))
                           for a in args]
                    shape = list(e.shape)
                    shape[d] = s
                    parts.append(self.hoist(Elem(e.node, sub, tuple(shape),
                                                 e.views + (("slice", d, o, o + s, 1),))))
                    o += s
                r = Cat(d, parts, e.shape)
        else:
            r = e
        self._hoist_memo[key] = r
        self._hoist_memo[(key, "keep")] = e
        return r

    # -- regions ---------------------------------------------------------------
    def regions(self, e, out: Leaf, out_meta, acc: list) -> list:
        """Split e at its concatenations into (expr, output view, meta) regions."""
        if isinstance(e, Cat):
            d, o = e.dim, 0
            for p in e.parts:
                s = p.shape[d]
                sub = Leaf(out.t._slice(d, o, o + s, 1), out.src)
                self.regions(p, sub, out_meta, acc)
                o += s
        else:
            acc.append((e, out, out_meta))
        return acc


__all__ = ["Leaf", "Scalar", "Elem", "Cat", "Reduced", "apply_view", "view_shape", "ViewLowering"]
