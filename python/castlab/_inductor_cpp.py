"""Inductor's C++ reductions (the ``inductor_cpp`` order of the ``inductor_cpu`` preset and
the torch_compile stack on the CPU): how the loop nests Inductor generates for a reduction
sum its rows, read from the graph castlab traced (or from a compiled program, ``cpp_lanes``):
the vector they are tiled with, along the row or across the rows (TilingSelect), the
cascade sum, the split over torch's threads, Welford's lanes."""

from __future__ import annotations

import math

from . import _torch_vml
from ._dtype import dtype, float32, float64
from ._graph import ELEMENTWISE, VIEW_OPS, Node
from ._lower_views import contiguous_strides
from ._optable import ORDER_CODE, REDUCE_OPS
from ._schedule import _loads_16bit_float, _read_lanes

#: Inductor's config.unroll_reductions_threshold: shorter reductions become pointwise ops.
UNROLL_BELOW = 8


def _live_dims(a: Node, m: Node, live: frozenset) -> frozenset | None:
    """The dims of m's input `a` that are m's `live` dims (None: not followed, as by a
    reshape that merges or splits one of them); a broadcast input loses the dims it is
    broadcast along (its values do not vary there)."""
    vop = m.attrs.get("vop") or ("",)
    if vop[0] == "permute":
        return frozenset(vop[1][d] for d in live)
    if vop[0] == "slice":
        return live
    if vop[0] == "select":
        return frozenset(d + (d >= vop[1]) for d in live)
    if vop[0] in ("reshape", "unsqueeze", "squeeze"):
        out, src, got = m.shape, a.shape, set()
        for d in live:
            if out[d] == 1:
                continue  # (does not vary)
            at = math.prod(out[:d])
            j = next((j for j in range(len(src)) if math.prod(src[:j]) == at and src[j] == out[d]),
                     None)
            if j is None:
                return None
            got.add(j)
        return frozenset(got)
    k = len(m.shape) - len(a.shape)  # elementwise operands and expand: broadcasting
    return frozenset(d - k for d in live if d >= k and a.shape[d - k] == m.shape[d] != 1)


def _contiguous_dim(m: Node, strides: tuple | None, kept: frozenset) -> tuple:
    """(the dim a load of `m` is contiguous along (stride 1, size over 1), or None; the
    extent of the loop Inductor vectorizes there when that dim is `kept`: the kept dims
    that follow it in memory merge with it). A graph input has its own `strides`; another
    kernel's result is stored contiguous (strides None)."""
    live = [d for d in range(len(m.shape)) if m.shape[d] > 1]
    strides = contiguous_strides(m.shape) if strides is None else strides
    c = next((d for d in reversed(live) if strides[d] == 1), None)
    extent = 0
    if c in kept:
        extent = m.shape[c]
        while True:
            d = next((d for d in live if d in kept and strides[d] == extent), None)
            if d is None:
                break
            extent *= m.shape[d]
    return c, extent


def inductor_cpp_row_reads(node: Node, strides_of=None) -> tuple[bool, int, int]:
    """What Inductor's C++ kernel for this reduction reads, from the nodes it inlines (the
    elementwise and view nodes feeding it, up to the graph's inputs and other kernels'
    results): (whether it is vectorized along the reduced dims, how many values it reads,
    the extent of the kept dims it is vectorized along where its loads are contiguous in
    them, else 0).
    TilingSelect._select_tiling_indices vectorizes the loop a load is contiguous along:
    where no load runs along the row (cross-entropy's gradient with label smoothing:
    per-row values and a one-hot from an index expression), or where the loads are
    contiguous along a kept dim and along no reduced one (a reduction over an inner dim:
    softmax over dim 1 of [N, C, L]), it vectorizes across the rows and sums each row in
    order. In the second case the last partial vector of the kept dim is a masked vector
    (its kernel has no masked selects), which sums through CascadeSumHelper as the full
    ones do. Positions from an ``iota`` input are Inductor's index expressions, not
    loads. `strides_of(input node)`: the strides of the tensor bound to a graph input."""
    dims = frozenset(node.attrs.get("dims", ()))
    a0 = node.inputs[0]
    kept0 = frozenset(range(len(a0.shape))) - dims
    todo, seen, reads, along = [(a0, dims, kept0)], set(), set(), False
    row_contig, extent = False, 0
    while todo and len(seen) < 512:
        m, live, kept = todo.pop()
        if (id(m), live, kept) in seen or m.op == "scalar" or m.attrs.get("iota"):
            continue
        seen.add((id(m), live, kept))
        if m.op in ELEMENTWISE or m.op in VIEW_OPS or m.op == "one_hot_scatter":
            for i, a in enumerate(m.inputs):
                if m.op == "one_hot_scatter" and i == 1:
                    continue  # its positions: an iota
                la = _live_dims(a, m, live)
                if la is None:
                    along = True
                else:
                    todo.append((a, la, _live_dims(a, m, kept) or frozenset()))
        else:
            reads.add(id(m))
            along = along or bool(live)
            c, e = _contiguous_dim(m, strides_of(m) if strides_of and m.op == "input" else None,
                                   kept)
            row_contig = row_contig or c in live
            if live and e:  # (a load along the row, contiguous across it; merged where all do)
                extent = min(extent, e) if extent else e
    if extent and not row_contig:
        return False, len(reads), extent
    return along or bool(todo), len(reads), 0


def _reads_a_reduction(node: Node) -> bool:
    """Is this reduction's operand computed from another reduction's result (through the
    elementwise and view nodes its kernel inlines)?"""
    todo, seen = list(node.inputs), set()
    while todo and len(seen) < 256:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op in REDUCE_OPS:
            return True
        if x.op in ELEMENTWISE or x.op in VIEW_OPS:
            todo.extend(x.inputs)
    return False


class InductorCppReductions:
    """ReduceSpecs of Inductor's C++ reductions (a mixin of castlab._torch_kernels'
    TorchKernelLowering: ``self.math`` is the lowering's Math)."""

    def _inductor_cpp_spec(self, node: Node, kind: int, acc: dtype, n: int) -> tuple:
        """Inductor's C++ reduction (codegen/cpp.py, cpp_prefix.h): one accumulator lane per
        position of the vector the kernel tiles the row with, each from zero (the tail vector
        masked), then ``vec_reduce_all``'s butterfly and ``0 + ...``. The vector holds
        ``pick_vec_isa().nelements(dtype)`` elements of the kernel's 16-bit float where it
        loads one (half of that for a row shorter than it), else of float: 32 bytes under
        AVX2, 64 under AVX512 (Inductor follows ATEN_CPU_CAPABILITY as torch does; "default"
        gives scalar loops: one lane). A float sum of over 4096 elements runs each lane's
        full vectors through CascadeSumHelper in chunks of 4096 (the triton order's p4).
        A sum's spec says p5 = 2: where the rows are few (under 1/300 of the row's vector
        iterations, or one row) and torch runs more than one thread, Inductor's kernel
        splits the row over its threads (decided when the reduction is planned, from
        torch's thread count then). A double row (VectorizedN<double, 2>) combines as
        ATen's generic ``vec_reduce_all``: the two vectors, then the lanes in order (+ 4).
        Where the kernel loads nothing along the row (inductor_cpp_row_reads) it is
        vectorized across the rows instead: one lane, each row in order, never split, the
        cascade only in the rows of full float vectors (p4's bits above 32). Where its
        loads run along the row but are contiguous along a kept dim (a reduction over an
        inner dim), it is vectorized along that dim: one lane, each row in order, the
        cascade in every row, and split over the threads by the outer loops' vector
        steps (p5 + 16 * (1 + steps))."""
        rows = math.prod(node.shape)
        if n < UNROLL_BELOW and rows != 1:
            # ir.Reduction.create: unrolled into pointwise ops, ((x0 + x1) + x2) ... (on the
            # CPU only where the reduction has more than one output)
            return (kind, ORDER_CODE["sequential"], 0, 0, 0, 0)
        bits = self._inductor_vector_bits()
        lanes = _read_lanes(node, n)  # read from a compiled program
        # (negative: that many lanes, and the row's last partial vector is the scalar tail
        # loop: TilingSelect's _tail_vec_worthwhile said no)
        scalar_tail = lanes is not None and lanes < 0
        # inner: the extent of the kept dims it is vectorized along (a reduction over an inner
        # dim; its partial vector masked, not scalar); steps: 1 + the outer loops' vector
        # iterations there (max_parallel_depth's num_steps: the split's rule), else 0
        inner = steps = 0
        if lanes is None:
            along, reads, inner = inductor_cpp_row_reads(node, self._input_strides)
            # an operand the kernel reads again after the sum (log_softmax's backward) is
            # stored first where it reads more than realize_reads_threshold (4) values
            # (ir.StorageBox.should_realize_on_reuse): a float buffer along the row
            stored = bool(node.attrs.get("reuses_input")) and reads > 4
            # a softmax's sum reads its exponentials from the float buffer the division
            # reads too (outer-loop fusion's local buffer), not the 16-bit input
            lowp = (_loads_16bit_float(node) and node.attrs.get("softmax_log") is not False
                    and not node.attrs.get("cpp_float_tiles") and not stored)
            lanes = bits // (16 if lowp else 32)
            if lowp and (inner or n) < lanes:
                lanes //= 2  # (the vectorized loop shorter than a 16-bit vector)
            # (a reduction of a value computed from another reduction over the row, and
            # var's first sum, share their outer loops with it unless the row is over 300
            # times those loops' range: cpp.py's outer-loop fusion; then the parallel loop
            # is the outer one. A softmax's sum reads its stored exponentials, a pointwise
            # kernel apart.)
            fused = node.attrs.get("kernel") == "var" or (
                _reads_a_reduction(node) and node.attrs.get("softmax_log") is not False)
            if inner and lanes and not (fused and rows * 300 >= n):
                steps = 1 + rows // inner * (inner // lanes)
            # (one row: its loop is the reduction's only loop, vectorized along the row)
            lanes = max(1, lanes) if along or stored or rows == 1 else 1  # else: in order
        # lanes 1 under a vector ISA: the kernel is vectorized across the rows, each row
        # summed in order, never split over threads (but over an inner dim); a last partial
        # vector's rows run the scalar tail loop, which sums without CascadeSumHelper (p4's
        # bits above 32; over an inner dim it is a masked vector, with it).
        # (0, read from a program: its scalar loops, one lane)
        across, lanes = lanes == 1 and bits > 0, max(1, abs(lanes))
        cascade = 4096 if (kind == REDUCE_OPS["sum"] and acc is float32 and n > 4096) else 0
        if cascade and across and not inner:
            cascade |= (bits // 32) << 32
        split = 2 if kind == REDUCE_OPS["sum"] and (not across or inner) else 1
        if split == 2:
            _torch_vml.unavailable()  # (torch's thread count, from the library it borrows)
        in_order = 4 if acc is float64 and lanes > 1 else 0  # (float: a SIMD butterfly)
        tail = 8 if scalar_tail and lanes > 1 and not across else 0
        return (kind, ORDER_CODE["triton"], lanes, 1, lanes, 1, cascade,
                split + in_order + tail + 16 * steps * (split == 2))

    def _input_strides(self, m: Node) -> tuple | None:
        """The strides of the tensor this lowering binds to graph input `m`."""
        slot = m.attrs.get("slot")
        t = self.inputs[slot] if slot is not None and slot < len(self.inputs) else m.tensor
        return tuple(t._strides) if t is not None else None

    def _inductor_vector_bits(self) -> int:
        """The width of Inductor's C++ vectors: 256 bits under AVX2, 512 under AVX512, 0
        (scalar loops) under torch's DEFAULT build."""
        return {"avx512": 512, "avx2": 256}.get(self.math._cpu_isa(), 0)

    def _inductor_welford_spec(self, node: Node, kind: int, acc: dtype) -> tuple:
        """Inductor's C++ Welford (cpp_prefix.h welford_combine with a WelfordHelper): the
        lanes of the vector the kernel tiles the row with, as `_inductor_cpp_spec` counts
        them (a 16-bit input or a double row: VectorizedN<., 2>, two halves), and the split
        over torch's threads where the rows are few (p5 = 2)."""
        bits = self._inductor_vector_bits()
        floats = max(1, bits // (64 if acc is float64 else 32))
        lanes = _read_lanes(node, None)  # read from a compiled program (0: scalar loops)
        steps = 0
        if lanes is None:  # (torch's DEFAULT build: scalar loops, one state for any dtype)
            lanes = bits // (16 if _loads_16bit_float(node) else 32)
            inner = inductor_cpp_row_reads(node, self._input_strides)[2]
            if inner and lanes:  # vectorized along a kept dim: each row in order
                steps = 1 + math.prod(node.shape) // inner * (inner // lanes)
                lanes = 1
        # (a scalar tail loop, lanes < 0, is not modelled for Welford: its lanes only)
        lanes = max(1, abs(lanes))
        floats = min(floats, lanes)
        _torch_vml.unavailable()  # (torch's thread count, from the library it borrows)
        return (kind, ORDER_CODE["triton"], lanes, 1, lanes, 1, floats, 2 + 16 * steps)
