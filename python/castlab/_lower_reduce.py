"""Lowering reductions: each reduction node becomes a step of its own (a reduce step, or
nll_loss's), its operand computed into a temporary first; under the torch_cpu order, the
way ATen's TensorIterator splits and orders a CPU reduction."""

from __future__ import annotations

from . import _C, _torch_vml
from ._dtype import float32, float64
from ._graph import Node
from ._lower_steps import NllStep, ReduceStep
from ._lower_views import Cat, Elem, Leaf, Reduced, Scalar, _dtype_code
from ._optable import F32, F64, IMPL_MASK, ORDER_CODE, REDUCE_ONLINE, REDUCE_OPS
from ._schedule import num_sms
from ._torch_kernels import (
    _prod,
    _reduce_layout,
    _row_geometry,
    _strides_of,
    _ti_reduce_groups,
    _ti_sum_layout,
)


class ReductionLowering:
    """The lowering of reductions (a part of castlab._lower.Lowering: it uses its
    ``expr``, ``view``, ``_temp_from``, ``_expand``, ``reduce_spec``, ``record``,
    ``steps``, ``temps`` and ``math``)."""

    def _nll(self, node: Node):
        """nll_loss's reduction over rows: under the torch orders one nll step, PyTorch's
        own kernel (ops/scalar/loss.h) on the gathered values (computed exactly into the
        accumulate type); under the others, its expansion (castlab._loss)."""
        order = node.attrs.get("order") or self.math.reduction_order(self.cuda)
        a = node.attrs
        if order not in ("torch_cpu", "torch_cuda") or (a["one_d"] and order == "torch_cuda"):
            return self.expr(self._expand(node))
        acc = float64 if node.dtype is float64 else float32

        def values(n: Node) -> Leaf:
            e = self.expr(n)
            if isinstance(e, Leaf) and _dtype_code(e.t) == acc.code and e.t.is_contiguous():
                return e
            return self._temp_from(e, tuple(n.shape), acc)  # widened exactly
        xg, t = values(node.inputs[0]), self._index_leaf(node.inputs[1])
        if not t.t.is_contiguous():
            t = self.materialize(t)
        wg = values(node.inputs[2]) if a["weight"] else xg
        k = len(self.temps)
        self.temps.append(((2,), acc))
        out_t = _C.empty([2], acc.name, str(self.device))
        self.temp_tensors.append(out_t)
        code = {"torch_cpu": 0, "torch_cuda": 1}[order]
        spec = (code, 2 if a["reduction"] == "mean" else 1, node.dtype.code, int(a["weight"]),
                a["ignore_index"])
        self.steps.append(NllStep.make([xg, wg, t], [Leaf(out_t, ("tmp", k))], spec))
        d = self.record.decide(node, F64 if acc is float64 else F32)
        d.description = (f"nll_loss {a['reduction']} {order} (" +
                         ("LossNLL.cpp: cascade in the input's format" if code == 0 else
                          "Loss.cu: one block's threads, then a tree") + ")")
        pick = 0 if a["what"] == "loss" else 1
        return Leaf(out_t._select(0, pick), ("tmp", k))

    def reduce_expr(self, node: Node) -> Reduced:
        """A reduction becomes a step of its own: its operand (any expression, permuted so
        the reduced dims come last and seen as [rows, n]) is computed into a temporary in
        the accumulator's type (registers stored exactly, so no rounding is added), whose
        rows a reduce step sums in the order Math.reduction names into [rows]."""
        x = node.inputs[0]
        dims = node.attrs["dims"]
        nd = len(x.shape)
        kept = [d for d in range(nd) if d not in dims]
        rows = 1
        for d in kept:
            rows *= x.shape[d]
        n = 1
        for d in dims:
            n *= x.shape[d]
        acc = float64 if self.vt(node) == F64 else float32
        online = self._online_softmax(node, rows, n, acc)
        if online is not None:
            return online
        if (x.op == "astype" and x.attrs.get("to_copy") and not self.cuda
                and self.math.reduction_order(False) == "torch_cpu"):
            ev = self._to_copy(self.expr(x.inputs[0]), tuple(x.shape), x.dtype)
        else:
            ev = self.expr(x)
        src_f32 = False
        ti = self._ti_groups(node, ev)
        if ti is not None:
            # ATen's sum_out: two reduced dims in its 2-d loop (should_use_acc_buffer)
            # sum a 16-bit input converted to float first, into a float result
            if x.dtype.bits == 16:
                if x.op == "astype" and x.attrs.get("to_copy"):
                    # sum(dtype=16-bit): the buffer reads the call's own input as float
                    # (``self.to(torch.float)``), not its 16-bit copy
                    src_e = self.expr(x.inputs[0])
                    ev = (src_e if x.inputs[0].dtype is float32
                          else self._to_copy(src_e, x.shape, float32))
                else:
                    ev = self._to_copy(ev, x.shape, float32)
                src_f32 = True
                ti = self._ti_groups(node, ev)
            if ti is not None:
                return self._reduce_ti_split(node, ev, ti, acc)
        layout = _reduce_layout(ev, x.shape, dims)
        if self._plain_torch_cpu_sum(node) and x.shape and 0 not in tuple(x.shape):
            layout = _ti_sum_layout(_ti_reduce_groups(tuple(x.shape),
                                                      _strides_of(ev, tuple(x.shape)), dims),
                                    32 // (4 if src_f32 else x.dtype.bits // 8), layout)
        zseg = self._extreme_segment(node, ev)
        geom = _row_geometry(ev, x.shape, dims) if layout[0] and layout[1] else (0, 0)
        if isinstance(ev, Leaf) and self._memory_order(node):
            # ATen's CPU reduction loops visit a strided input's reduced elements in memory
            # order (TensorIterator sorts the dims by stride): so does a one-pass row here
            st = ev.t._strides
            dims = tuple(sorted(dims, key=lambda d: -abs(st[d])))
        perm = tuple(kept + list(dims))

        def as_rows(ev):
            if nd == 0:
                return self.view(self.view(ev, ("unsqueeze", 0)), ("unsqueeze", 0))
            if perm != tuple(range(nd)):
                ev = self.view(ev, ("permute", perm))
            return self.view(ev, ("reshape", (rows, n)))
        dot = self._dot_operands(node, ev)
        spec = self.reduce_spec(node, acc, layout, n, geom, dot=dot is not None,
                                src_f32=src_f32, zseg=zseg)
        if dot is not None:  # the products' factors side by side: [rows, 2n] (red_dot)
            ev = self._temp_from(Cat(1, [as_rows(a) for a in dot], (rows, 2 * n)),
                                 (rows, 2 * n), acc)
        elif self._columns(spec, dims, rows, n):
            # the reduced dims lead: the operand stays [n, rows] in its own layout and the
            # step reads its columns (written and read a row of the matrix at a time)
            ev = self.view(ev, ("reshape", (n, rows)))
            if not (isinstance(ev, Leaf) and _dtype_code(ev.t) == acc.code
                    and ev.t.is_contiguous()):
                ev = self._temp_from(ev, (n, rows), acc)
            ev = self.view(ev, ("permute", (1, 0)))
        else:
            ev = as_rows(ev)
            if not (isinstance(ev, Leaf) and _dtype_code(ev.t) == acc.code
                    and ev.t.is_contiguous()):
                ev = self._temp_from(ev, (rows, n), acc)
        k = len(self.temps)
        self.temps.append(((rows,), acc))
        t = _C.empty([rows], acc.name, str(self.device))
        self.temp_tensors.append(t)
        self.steps.append(ReduceStep.make([ev], [Leaf(t, ("tmp", k))], spec))
        d = self._decided(node, acc, _C.describe_reduce(spec, 2 * n if dot else n, rows))
        if node.op in ("amax", "amin") and spec[1] == ORDER_CODE["torch_cpu"] and spec[3] > 0:
            loop = ("vectorized_reduction" + (f" over rows of {spec[6]}" if len(spec) > 6
                                              else "") if spec[3] == 2
                    else "vectorized_outer_reduction" if spec[3] == 3 else "the scalar loop")
            d.description = (f"{node.op[1:]} torch_cpu (binary_kernel_reduce_vec, "
                             f"{spec[2]}-element vectors: {loop} decides a zero's sign)")
        view = t._view_or_none(list(node.shape))
        return Reduced(node, Leaf(view, ("tmp", k)), node.shape)

    def _columns(self, spec: tuple, dims, rows: int, n: int) -> bool:
        """Does a GPU reduction over the leading dims read its operand's columns in place
        (ops/cuda/reduce.cpp: each Triton thread's part of each column, then the parts'
        tree: the triton order's sum, max and min, ops/reduce.h reduce_columns_supported)
        rather than a transposed copy, whose rows the threads of a block read a row length
        apart (RMSNorm's weight gradient)?"""
        return (self.cuda and rows > 1 and n > 1 and tuple(dims) == tuple(range(len(dims)))
                and spec[1] == ORDER_CODE["triton"] and len(spec) == 6
                and spec[0] in (REDUCE_OPS["sum"], REDUCE_OPS["amax"], REDUCE_OPS["amin"]))

    def _plain_torch_cpu_sum(self, node: Node) -> bool:
        """A sum ATen's cascade_sum computes under the torch_cpu order on the CPU (not one
        inside softmax, var or a dot)."""
        return (not self.cuda and node.op == "sum" and not node.attrs.get("algo")
                and not node.attrs.get("order") and not node.attrs.get("dot")
                and self.math.reduction_order(False) == "torch_cpu")

    def _ti_groups(self, node: Node, ev) -> list | None:
        """TensorIterator's dims (_ti_reduce_groups) of a plain sum under the torch_cpu
        order on the CPU whose first two dims are both reduced (dims that do not coalesce:
        not adjacent, or a strided view): ATen's cascade_sum then sums each row of the
        first and adds the rows' sums into the zeroed output one after another across its
        2-d loop and the outer loops (CastStoreAccumulate). None for every other reduction."""
        dims = node.attrs["dims"]
        if (self.cuda or node.op != "sum" or len(dims) < 2 or node.attrs.get("algo")
                or node.attrs.get("order") or node.attrs.get("dot")
                or self.math.reduction_order(False) != "torch_cpu"):
            return None
        shape = tuple(node.inputs[0].shape)
        if any(s == 0 for s in shape):
            return None
        g = _ti_reduce_groups(shape, _strides_of(ev, shape), dims)
        return g if len(g) >= 2 and g[0][2] and g[1][2] else None

    def _extreme_segment(self, node: Node, ev) -> tuple | None:
        """(row length, unit stride) of TensorIterator's first dim for a plain amax / amin
        under the torch_cpu order whose first two iterator dims are both reduced: each such
        row is reduced into the output in turn (red_cpu_extreme_zero); None otherwise."""
        dims = node.attrs["dims"]
        if (self.cuda or node.op not in ("amax", "amin") or len(dims) < 2
                or node.attrs.get("algo")
                or (node.attrs.get("order") or self.math.reduction_order(False)) != "torch_cpu"):
            return None
        shape = tuple(node.inputs[0].shape)
        g = _ti_reduce_groups(shape, _strides_of(ev, shape), dims)
        if len(g) >= 2 and g[0][2] and g[1][2]:
            return g[0][0], g[0][1] == 1
        return None

    def _to_copy(self, ev, shape: tuple, dt) -> Leaf:
        """``self.to(dt)`` of an input: a dense view keeps its strides (preserve_format),
        anything else becomes contiguous."""
        st = _strides_of(ev, shape)
        nd = len(shape)
        order = sorted(range(nd), key=lambda d: (-abs(st[d]), d))
        dense = isinstance(ev, Leaf) and all(s >= 0 for s in st)
        if dense:
            want = 1
            for d in reversed(order):
                if shape[d] != 1 and st[d] != want:
                    dense = False
                    break
                want *= shape[d]
        if not dense or order == list(range(nd)):
            return self._temp_from(ev, shape, dt)
        inv = [order.index(d) for d in range(nd)]
        t = self._temp_from(self.view(ev, ("permute", tuple(order))),
                            tuple(shape[d] for d in order), dt)
        return self.view(t, ("permute", tuple(inv)))

    def _reduce_ti_split(self, node: Node, ev, groups: list, acc) -> Reduced:
        """A sum whose TensorIterator dims start with two reduced ones (_ti_groups), as
        cascade_sum computes it: each row of the first dim summed by the cascade
        (vectorized_inner_sum, or scalar_inner_sum for a strided row), then those row
        sums added into the output one after another, the iterator's second dim fastest."""
        shape = tuple(node.inputs[0].shape)
        nd = len(shape)
        reduced = [g for g in groups if g[2]]
        d0 = list(reduced[0][3])
        others = [d for d in range(nd) if d not in d0]
        rows1, n0 = _prod(shape[d] for d in others), _prod(shape[d] for d in d0)
        e1 = self.view(ev, ("permute", tuple(others + d0)))
        e1 = self.view(e1, ("reshape", (rows1, n0)))
        unit = reduced[0][1] == 1
        w = 4 if acc is float64 else 8
        code = ORDER_CODE["torch_cpu"]
        spec1 = (REDUCE_OPS["sum"], code, w if unit else 1, w if unit else 1, 0, 0)
        kept = [d for d in range(nd) if d not in node.attrs["dims"]]
        if _prod(shape[d] for d in kept) == 1:
            # ONE output: the whole row in the iterator's order, its rows of n0 summed in
            # turn, or cut at the chunks of ATen's two-pass split on several torch threads
            # (red_cpu_ti_rows; the thread count read when it runs)
            _torch_vml.unavailable()
            listed = [d for g in reversed(reduced) for d in g[3]]
            order = [d for d in range(nd) if d not in listed] + listed  # (size-1 dims first)
            e = self.view(self.view(ev, ("permute", tuple(order))),
                          ("reshape", (1, _prod(shape))))
            spec = (*spec1, n0, 0)
            t = self._reduce_step(e, 1, _prod(shape), acc, spec)
            self._decided(node, acc, (
                "sum torch_cpu: TensorIterator's dims " + " x ".join(
                    f"{g[0]}{'r' if g[2] else ''}" for g in groups)
                + f"; each row of {n0} by " + _C.describe_reduce(spec1, n0, 1).split(" ", 1)[-1]
                + ", the rows' sums added in order (on several torch threads: ATen's two-pass"
                " split, the rows cut at its chunks)"
                + (" (from a float copy)" if node.inputs[0].dtype.bits == 16 else "")))
            return Reduced(node, Leaf(t.t._view_or_none(list(node.shape)), t.src), node.shape)
        t1 = self._reduce_step(e1, rows1, n0, acc, spec1)
        # the row sums, over the dims other than d0, in logical order
        oshape = tuple(shape[d] for d in others)
        rest = [d for g in reversed(reduced[1:]) for d in g[3]]  # slowest first
        rest_pos = [others.index(d) for d in rest]
        # (the kept dims, and any reduced dim of size 1 the iterator folded into them)
        kept_pos = [i for i, d in enumerate(others) if d not in rest]
        rows, n = _prod(oshape[i] for i in kept_pos), _prod(oshape[i] for i in rest_pos)
        e2 = self.view(Leaf(t1.t._view_or_none(list(oshape)), t1.src),
                       ("permute", tuple(kept_pos + rest_pos)))
        e2 = self.view(e2, ("reshape", (rows, n)))
        spec2 = (REDUCE_OPS["sum"], ORDER_CODE["sequential"], 0, 0, 0, 0)
        t = self._reduce_step(e2, rows, n, acc, spec2)
        self._decided(node, acc, (
            "sum torch_cpu: TensorIterator's dims " + " x ".join(
                f"{g[0]}{'r' if g[2] else ''}" for g in groups)
            + f"; each row of {n0} by " + _C.describe_reduce(spec1, n0, rows1).split(" ", 1)[-1]
            + f", then the {n} row sums added in order" + (" (from a float copy)"
                                                           if node.inputs[0].dtype.bits == 16
                                                           else "")))
        return Reduced(node, Leaf(t.t._view_or_none(list(node.shape)), t.src), node.shape)

    def _online_softmax(self, node: Node, rows: int, n: int, acc) -> Reduced | None:
        """A softmax's sum of exp(x - amax(x)) over the last dim under the triton order,
        as Inductor computes it by default (config.online_softmax: the post-grad pattern
        prepare_softmax_online) for a row of several tiles: from x itself, a running
        (max, sum) per tile position (ops/scalar/reduce.h red_online_part). torch 2.11
        splits a row of over 8,192 elements among fewer than two rows a multiprocessor (264
        on an H100/H200) and then drops the online form (docs/inductor_wide_rows.md 3.1):
        those keep the plain sum, as does Math(online_softmax=False) (Inductor's config
        off). None where it does not apply."""
        a = node.attrs
        if (node.op != "sum" or a.get("algo") != "softmax" or not a.get("softmax_last")
                or not self.math.online_softmax
                or a.get("bwd") or (rows < 2 * num_sms(self.device) and n > 8192)
                or (a.get("order") or self.math.reduction_order(self.cuda)) != "triton"):
            return None
        e = node.inputs[0]
        z = e.inputs[0] if e.op == "exp" else None
        if (z is None or z.op != "sub" or z.inputs[1].op != "amax"
                or z.inputs[1].inputs[0] is not z.inputs[0] or len(node.shape) < 1):
            return None
        spec = self.reduce_spec(node, acc, (True, True, 0), n)
        if spec[1] != ORDER_CODE["triton"] or len(spec) != 6 or n <= spec[2]:
            return None  # (one tile: the online sum is the plain one)
        xf = z.inputs[0]
        impl = self.math.variant_bits("exp", acc is float64, self.cuda, None,
                                      a.get("kernel") or True) & IMPL_MASK
        # (without contraction, as Triton under Inductor's emulate_precision_casts, which
        # turns its fp fusion off: the products rounded before their additions)
        spec = (REDUCE_ONLINE, *spec[1:], impl, 0 if self.math.fma else 1)
        ev = self.view(self.expr(xf), ("reshape", (rows, n)))
        out = self._reduce_step(ev, rows, n, acc, spec)
        self._decided(node, acc, _C.describe_reduce(spec, n, rows))
        return Reduced(node, Leaf(out.t._view_or_none(list(node.shape)), out.src), node.shape)

    def _decided(self, node: Node, acc, description: str):
        """The decision recorded for `node`, computed by the last reduce step (the trace's
        line for it says `description`)."""
        d = self.record.decide(node, F64 if acc is float64 else F32)
        self.reduce_decisions[id(self.steps[-1])] = d
        d.description = description
        return d

    def _reduce_step(self, ev, rows: int, n: int, acc, spec: tuple) -> Leaf:
        """One reduce step over `ev` seen as [rows, n], into a fresh [rows] temporary."""
        if not (isinstance(ev, Leaf) and _dtype_code(ev.t) == acc.code and ev.t.is_contiguous()):
            ev = self._temp_from(ev, (rows, n), acc)
        k = len(self.temps)
        self.temps.append(((rows,), acc))
        t = _C.empty([rows], acc.name, str(self.device))
        self.temp_tensors.append(t)
        out = Leaf(t, ("tmp", k))
        self.steps.append(ReduceStep.make([ev], [out], spec))
        return out

    def _dot_operands(self, node: Node, ev) -> list | None:
        """The two factors of a sum of products that PyTorch's kernel accumulates with
        its products fused in (SoftMaxKernel.cpp's softmax backward: node attr "dot"),
        as the torch_cpu order on the CPU computes it (red_dot); None elsewhere."""
        if (not node.attrs.get("dot") or self.cuda or not isinstance(ev, Elem)
                or ev.node.op != "mul" or any(isinstance(a, Scalar) for a in ev.args)
                or self.math.reduction_order(False) != "torch_cpu"):
            return None
        return list(ev.args)

    def _memory_order(self, node: Node) -> bool:
        """Does this reduction visit its elements one after another as ATen's CPU loops do
        (var's Welford pass, the second pass of its reduction to one value)?"""
        order = node.attrs.get("order") or self.math.reduction_order(self.cuda)
        # (a plain torch_cpu sum too: its reduced dims coalesce into one in memory order)
        plain = (node.op in ("sum", "amax", "amin") and not node.attrs.get("algo")
                 and not node.attrs.get("dot"))
        return (order == "torch_cpu" and (node.attrs.get("algo") == "var" or plain)) or (
            node.attrs.get("order") == "sequential")
