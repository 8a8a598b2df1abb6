"""Reproducing PyTorch's kernels: where castlab computes an op or a reduction as one of
PyTorch's eager kernels does rather than as "op-math, one rounding".

- TensorIterator's view of a CPU reduction (``_ti_reduce_groups``) and the layouts
  PyTorch's reduction kernels pick from it (``_reduce_layout``, ``_ti_sum_layout``);
- the ReduceSpec of each reduction order (ATen's cascade_sum, Reduce.cuh, SoftMax.cu,
  the Welford kernels, Inductor's Triton reductions): ``TorchKernelLowering.reduce_spec``;
- the elementwise kernels' details the program builder expands in place of an op (pow's
  special exponents, div_true_kernel_cuda's reciprocal, the 16-bit ``scalar_t``
  products, oneDNN's gelu backward, SoftMaxKernel.cpp's scalar columns):
  ``TorchKernelQuirks``, each recorded as the node's ``quirk``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import _torch_vml
from ._dtype import _BY_CODE, as_dtype, bfloat16, dtype, float16, float32, float64
from ._graph import Node
from ._inductor_cpp import UNROLL_BELOW, InductorCppReductions
from ._lower_views import Elem, Leaf, Scalar, _dtype_code, contiguous_strides
from ._optable import (
    BITS,
    F64,
    ORDER_CODE,
    POW_TENSOR_EXP,
    REDUCE_OPS,
    ROUND_MODES,
)
from ._schedule import (
    TRITON_CONFIGS,
    _loads_16bit_float,
    num_sms,
    triton_config,
)

RSQRT_SCALAR16 = BITS["rsqrt_scalar16"]
TORCH_TAIL = BITS["torch_tail"]
# Python-number exponents PyTorch's pow_tensor_scalar kernels special-case (op_pow and the
# lowering reproduce each); any other goes to pow in the tensor's dtype
_POW_SHORTCUTS = (0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0)

_RED_DOT = 5  # ops/scalar/reduce.h kRedDot
# SoftMaxKernel.cpp's kernels castlab follows on the CPU (Lowering.torch_cpu_softmax)
_TORCH_CPU_SOFTMAX_KERNELS = ("softmax", "log_softmax", "softmax_backward",
                              "log_softmax_backward")


def _row_geometry(e, shape: tuple, dims: tuple) -> tuple:
    """(first element past a 16-byte boundary, row stride) in elements of an input view
    whose rows Reduce.cuh loads as vectors: a computed value is a fresh contiguous tensor
    (0, 0); kept dims that do not collapse into one stride are taken as contiguous rows."""
    if not isinstance(e, Leaf):
        return (0, 0)
    t = e.t
    isz = max(1, _BY_CODE[_dtype_code(t)].bits // 8)
    mis = (t.data_ptr() % 16) // isz
    st = t._strides
    kept = [d for d in range(len(shape)) if d not in dims and shape[d] > 1]
    if not kept:
        return (mis, 0)
    if any(st[a] != st[b] * shape[b] for a, b in zip(kept, kept[1:])):
        return (mis, 0)
    return (mis, abs(st[kept[-1]]))


def _prod(xs) -> int:
    r = 1
    for x in xs:
        r *= x
    return r


def _strides_of(e, shape: tuple) -> tuple:
    """Element strides of an expression as PyTorch's kernels see it: an input view's own,
    a computed value's contiguous in logical order."""
    if isinstance(e, Leaf):
        return tuple(e.t._strides)
    return contiguous_strides(shape)


def _ti_reduce_groups(shape: tuple, strides: tuple, dims: tuple) -> list:
    """ATen's TensorIterator view of a CPU reduction of a tensor of `shape` and element
    `strides` over `dims` (reorder_dimensions: reduced dims first, then by stride, the
    output's strides deciding among kept dims; then coalesce_dimensions). Returns the
    iterator's dims, fastest first, as (size, input stride, reduced, logical dims slowest
    first); size-1 dims are folded into a neighbour as ATen does."""
    nd = len(shape)
    out_st = [0] * nd
    acc = 1
    for d in range(nd - 1, -1, -1):
        if d not in dims:
            out_st[d] = acc
            acc *= shape[d]
    ist = [abs(s) for s in strides]

    def should_swap(d0: int, d1: int) -> int:
        for st, is_out in ((out_st, True), (ist, False)):
            s0, s1 = st[d0], st[d1]
            if is_out and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(nd - 1, -1, -1))
    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    out: list = []
    for d in perm:
        size, s_in, s_out = shape[d], ist[d], out_st[d]
        if out:
            psize, ps_in, ps_out, pdims = out[-1]
            if psize == 1 or size == 1 or (psize * ps_in == s_in and psize * ps_out == s_out):
                if psize == 1:
                    ps_in, ps_out = s_in, s_out
                out[-1] = (psize * size, ps_in, ps_out, [d] + pdims)
                continue
        out.append((size, s_in, s_out, [d]))
    return [(s, si, so == 0 and s > 1, ds) for s, si, so, ds in out]


def _ti_sum_layout(groups: list, vec: int, default: tuple) -> tuple:
    """(inner, unit, cols) of _reduce_layout as cascade_sum picks its loop from
    TensorIterator's first two dims (the reduced one first; the kept dims ordered by the
    output's strides, so a permuted input's contiguous kept dim need not be second):
    vectorized_inner_sum, vectorized_outer_sum (the second dim contiguous and at least a
    vector of the input's dtype), scalar_inner_sum, else scalar_outer_sum."""
    if not groups or not groups[0][2]:
        return default
    g0, g1 = groups[0], (groups[1] if len(groups) > 1 else None)
    if g0[1] == 1 and g0[0] >= vec:
        return (True, True, 0)
    if g1 is not None and g1[1] == 1 and g1[0] >= vec:
        return (False, True, g1[0])
    if g1 is None or g0[1] < g1[1]:
        return (True, g0[1] == 1, 0)
    return (False, False, g1[0])


def _reduce_layout(e, shape: tuple, dims: tuple) -> tuple:
    """(inner, unit, cols) of a reduction of `e` over `dims`, as PyTorch's kernels see its
    memory: inner when the fastest-moving dim (smallest stride, size > 1) is reduced; unit
    when that dim has stride 1; cols: the product of the kept dims moving faster than every
    reduced dim. An input view (a Leaf) has its own strides; a computed value is laid out
    contiguously in logical order (as PyTorch's ops write contiguous inputs' results)."""
    nd = len(shape)
    st = [abs(x) for x in e.t._strides] if isinstance(e, Leaf) else contiguous_strides(shape)
    live = [d for d in range(nd) if shape[d] > 1]
    if not live or not dims:
        return (True, True, 0)
    fastest = min(live, key=lambda d: (st[d], -d))
    red = [d for d in dims if shape[d] > 1] or list(dims)
    if fastest in dims:
        return (True, st[fastest] == 1, 0)
    lo = min(st[d] for d in red)
    cols = 1
    for d in live:
        if d not in dims and st[d] < lo:
            cols *= shape[d]
    return (False, st[fastest] == 1, cols)


def _scalar_as(v, dt: dtype) -> float:
    """A Python number as c10 converts it to a 16-bit scalar_t: to float, then rounded to
    the format."""
    f = np.float32(v)
    return float(np.asarray(f, dtype=ml_dtypes.bfloat16 if dt is bfloat16 else np.float16))


class TorchKernelLowering(InductorCppReductions):
    """The lowering's knowledge of PyTorch's kernels (a part of castlab._lower.Lowering:
    it uses its ``math``, ``cuda``, ``device``, ``expr`` and ``vt64``)."""

    def torch_cpu_softmax(self, node: Node) -> bool:
        """Is this node inside softmax/log_softmax (or their backward kernels) as PyTorch's
        CPU kernel computes it (the torch_cpu order and implementation on the CPU)?"""
        return (not self.cuda and node.attrs.get("kernel") in _TORCH_CPU_SOFTMAX_KERNELS
                and self.math.reduction_order(False) == "torch_cpu"
                and self.math.aten_cpu(False))

    def softmax_columns(self, e: Elem) -> tuple | None:
        """(vector step, D << 32 | I, chunk) of SoftMaxKernel.cpp's kernel over a dim that
        is not the last ([outer, D, I]) for this exp or division inside it, whose scalar
        columns the executor recomputes (glibc's exp; 16-bit: the exponential rounded
        before the division); None elsewhere, or while torch's thread count is unknown.
        The step is Vectorized<scalar_t>::size() of the build Math.cpu_isa names (the
        kernels are also built for AVX512); log_softmax walks chunks of columns
        (vec_logsoftmax_chunk_size_and_num_chunks), softmax the threads' ranges (chunk 0).
        Bit 62 of the second: the value is computed as the reduction's operand, permuted to
        [outer * I, D] (reduce_expr)."""
        node = e.node
        geom = node.attrs.get("softmax_geom")
        if geom is None or not self.torch_cpu_softmax(node) or _torch_vml.unavailable():
            return None
        _, dim, inner = geom
        isz = as_dtype(node.attrs["storage_dtype"]).itemsize
        if node.op == "div" and isz != 2:
            return None  # fp32/fp64: the scalar columns divide as the vector ones
        w = self.math.torch_cpu_vector_bytes() // isz
        chunk = 0
        if node.attrs.get("softmax_last"):  # the 16-bit last-dim kernel: float vectors,
            # the row's remainder (geom (rows, 1, n))
            w, chunk = self.math.torch_cpu_vector_bytes() // 4, inner
        elif node.attrs.get("kernel") != "softmax":  # log_softmax, the backward kernels
            chunk = min(max(131072 // dim // isz, w) // w * w, inner)
        permuted = any(v[0] == "permute" for v in e.views)
        return w, (dim << 32) | inner | (int(permuted) << 62), float(chunk)

    def onednn_gelu_backward(self, e: Elem) -> Node | None:
        """x, when this node is the result of PyTorch's CPU gelu_backward (erf form) and
        PyTorch computes it with oneDNN (gelu_backward_out_cpu's use_mkldnn: a contiguous
        input of 2 or more elements, fp32, or bf16 where oneDNN takes it); else None."""
        node = e.node
        if (self.cuda or node.op != "mul" or node.attrs.get("kernel") != "gelu_backward"
                or node.attrs.get("kernel_inner") or e.views
                or not self.math.onednn_gelu_backward_bits(node.dtype.name)):
            return None
        # the kernel reads the cotangent (the product's left operand) and x from outside
        kid, g, seen, stack, outside = node.attrs.get("kernel_id"), node.inputs[0], set(), [node], []
        while stack:
            m = stack.pop()
            for a in m.inputs:
                if id(a) in seen or a.op == "scalar" or a is g:
                    continue
                seen.add(id(a))
                (stack if a.attrs.get("kernel_id") == kid else outside).append(a)
        if len(outside) != 1:
            return None
        x = outside[0]
        ex = self.expr(x)
        n = 1
        for s in x.shape:
            n *= s
        if n <= 1 or (isinstance(ex, Leaf) and not ex.t.is_contiguous()) or (
                not isinstance(ex, (Leaf, Elem))):
            return None
        return x

    def reduce_spec(self, node: Node, acc: dtype, layout: tuple, n: int,
                    geom: tuple = (0, 0), dot: bool = False, src_f32: bool = False,
                    zseg: tuple | None = None) -> tuple:
        """(kind, order, p0, p1, p2, p3[, p4, p5]) of ops/reduce.h's ReduceSpec for this
        node, whose rows have n elements (a dot row: the two factors side by side).
        `layout` (_reduce_layout): whether PyTorch's kernel would reduce each row (the
        fastest-moving dim is reduced), with unit stride, and `cols`, the contiguous kept
        extent below the reduced dims of an outer reduction. `geom` (_row_geometry): where
        the input's rows start, for Reduce.cuh's vectorized loads."""
        kind = REDUCE_OPS[node.op]
        order = node.attrs.get("order") or self.math.reduction_order(self.cuda)
        src = float32 if src_f32 else node.inputs[0].dtype
        inner, unit, cols = layout
        if dot:  # SoftMaxKernel.cpp's softmax backward (red_dot)
            return self._dot_spec(node, acc, order)
        if kind >= REDUCE_OPS["moments_mean"]:
            if order == "inductor_cpp":
                return self._inductor_welford_spec(node, kind, acc)
            return self._moments_spec(node, kind, order, layout, geom)
        if (order == "torch_cpu" and node.attrs.get("algo") == "softmax"
                and not node.attrs.get("softmax_last", True)):
            # _vec_softmax / serial_vec_logsoftmax_range: each column's D elements summed
            # in order (a vector of columns at a time, or one column in the scalar code)
            return (kind, ORDER_CODE["sequential"], 0, 0, 0, 0)
        if (order == "torch_cpu" and node.attrs.get("algo") in ("softmax", "reduce_all")
                and inner and unit):
            # SoftMaxKernel.cpp's _vec_softmax_lastdim / _vec_log_softmax_lastdim: the row's
            # sum by vec::reduce_all over the dispatched vector's lanes (mode 1); the bf16
            # kernel sums float lanes over full vectors, then the rest in order (mode 2);
            # the backward kernel's reduce_all over bf16/fp16 vectors (float halves, mode 4);
            # algo "reduce_all": vec::reduce_all in another kernel (layer_norm's backward)
            vb = node.attrs.get("vec_bytes") or self.math.torch_cpu_vector_bytes()
            w = vb // (8 if acc is float64 else 4)
            half = node.attrs.get("elem_bytes", src.bits // 8) == 2  # the kernel's input
            mode = (2 if half and node.attrs.get("kernel") == "softmax" else 4 if half
                    else 3 if acc is float64 else 1)
            if self.math.torch_cpu_isa() == "default":
                # the DEFAULT build: vec_base has no SIMD vec_reduce_all (generic lane sums)
                mode = {1: 3, 2: 5, 3: 3, 4: 6}[mode]
            return (kind, ORDER_CODE[order], w, w, 0, mode)
        if order == "torch_cpu" and node.op in ("amax", "amin") and not self.cuda:
            # binary_kernel_reduce_vec: the value in any order, the sign of a zero result
            # from its loops (red_cpu_extreme_zero): vectorized_reduction over a contiguous
            # row (each of the iterator's rows of zseg when the dims do not coalesce),
            # vectorized_outer_reduction down contiguous columns, else the scalar loop
            v = 32 // (src.bits // 8)  # an AVX2 vector of the input's dtype
            _torch_vml.unavailable()  # (torch's thread count, for the two-pass split)
            if zseg is not None:
                return (kind, ORDER_CODE[order], v, 2 if zseg[1] else 1, 0, 0, zseg[0], 0)
            loop = 1 if inner and unit else 2 if unit else 0
            return (kind, ORDER_CODE[order], v, 1 + loop, cols if loop == 2 else 0, 0)
        if order == "torch_cpu":
            return self._cascade_sum_spec(node, kind, acc, src, layout, src_f32)
        if order == "torch_cuda":
            if node.attrs.get("algo") == "softmax":
                return self._cuda_softmax_spec(node, kind, n)
            # 16-bit sums load 8 elements at a time (measured on an H200 with torch 2.11:
            # 8 accumulators per thread reproduce fp16 -> fp32 sums, 4 do not)
            ivs, vt0 = (8, 8) if (src.bits == 16 and kind == 0) else (4, 4)
            if inner and not unit:
                ivs, vt0 = 1, 4  # a strided row: no vectorized loads
            ovs = 0
            if not inner:  # an outer reduction: Reduce.cuh vectorizes along the outputs
                ovs = 4
                while cols % ovs:
                    ovs //= 2
            return (kind, ORDER_CODE[order], ivs, vt0, self._num_sms(), ovs, *geom)
        if order == "inductor_cpp":
            return self._inductor_cpp_spec(node, kind, acc, n)
        if order == "triton":
            tile = node.attrs.get("triton_tile")  # read from a compiled program (by the
            if isinstance(tile, dict):  # row's length where a node spans several kernels)
                tile = tile.get(n)
            # isz: the bytes the kernel loads (a float from bf16 loads: RMSNorm's backward)
            isz = node.attrs.get("elem_bytes") or (2 if _loads_16bit_float(node) else src.bits // 8)
            algo = node.attrs.get("algo")
            if tile is None and n < UNROLL_BELOW and (algo, n, isz) not in TRITON_CONFIGS:
                # ir.Reduction.create: a row shorter than unroll_reductions_threshold is
                # unrolled into pointwise ops, ((x0 + x1) + x2) ..., on a GPU
                return (kind, ORDER_CODE["sequential"], 0, 0, 0, 0)
            return (kind, ORDER_CODE[order], *(tile or triton_config(algo, n, isz)))
        if order == "sequential" and node.attrs.get("algo") == "var":
            _torch_vml.unavailable()  # (torch's thread count: see above)
            return (kind, ORDER_CODE[order], 1, 0, 0, 0)  # ATen's parallel_reduce
        return (kind, ORDER_CODE[order], 0, 0, 0, 0)

    def _dot_spec(self, node: Node, acc: dtype, order: str) -> tuple:
        """The spec of a sum of products PyTorch's kernel accumulates with its products
        fused in (red_dot): SoftMaxKernel.cpp's softmax backward, layer_norm's backward."""
        fused = self.math.torch_cpu_fma()
        if not node.attrs.get("softmax_last", True):  # `sum += grad * output`, fused
            # (node attr acc16: a 16-bit accumulator rounded after every step, the
            # dweight/dbias buffer of layer_norm's backward for 16-bit input)
            a16 = node.attrs.get("acc16")
            return (_RED_DOT, ORDER_CODE["sequential"], int(fused),
                    a16.code + 1 if a16 is not None else 0, 0, 0)
        # map2_reduce_all: GCC fuses the last partial vector's products in the fp32
        # kernels only (measured; the 16-bit kernels' float sums: rounding hides it)
        # (a kernel registered without AVX512, layer_norm's backward: its AVX2 build,
        # node attr vec_bytes)
        vb = node.attrs.get("vec_bytes") or self.math.torch_cpu_vector_bytes()
        w = vb // (8 if acc is float64 else 4)
        generic = acc is float64 or self.math.torch_cpu_isa() == "default"
        if node.attrs.get("elem_bytes") == 2:  # functional_bfloat16.h's float halves
            # (node attr dot_fused: the products fused into the accumulations after
            # the first vector, layer_norm's fp16 backward kernel)
            f16 = int(fused and bool(node.attrs.get("dot_fused")))
            # (dot_short_tree: a row of W..2W elements combines its lanes by the
            # butterfly, layer_norm's mixed-type backward frame: mode 7)
            mode = 6 if generic else (7 if node.attrs.get("dot_short_tree") else 4)
            return (_RED_DOT, ORDER_CODE[order], w, w, f16, mode)
        # (layer_norm's fp64 backward fuses its tail too: node attr dot_fused)
        tail = fused and (acc is float32 or bool(node.attrs.get("dot_fused")))
        return (_RED_DOT, ORDER_CODE[order], w, w, int(tail), 3 if generic else 1)

    def _cascade_sum_spec(self, node: Node, kind: int, acc: dtype, src: dtype, layout: tuple,
                          src_f32: bool) -> tuple:
        """The spec of a sum under the torch_cpu order (ATen's cascade_sum)."""
        inner, unit, cols = layout
        order = "torch_cpu"
        # ATen's cascade_sum: an innermost reduction sums each row (vectorized_inner_sum,
        # or scalar_inner_sum for a strided row); reducing outer dims sums each output
        # column down the reduced dims (vectorized_outer_sum), whose order depends on
        # the column's position among the `cols` contiguous kept elements
        # (a sum to one value reads torch's thread count, from the library
        # _torch_vml borrows: load it)
        # (the sum's own result is 16-bit; inside a kernel such as mean it is a float)
        out16 = (node.dtype.bits == 16 and not node.attrs.get("kernel_inner")
                 and not src_f32)  # (a float copy: summed into a float result)
        c16 = -node.dtype.code - 1 if out16 else 0
        if not self.cuda and node.op == "sum":
            _torch_vml.unavailable()
        if inner and not unit:
            return (kind, ORDER_CODE[order], 1, 1, c16, 0)
        if not inner and (not unit or cols < 32 // (src.bits // 8)):
            # scalar_outer_sum: the kept columns are strided, or fewer than one AVX2
            # vector of the input's dtype (16 for bf16/fp16): groups of 4 columns
            return (kind, ORDER_CODE[order], 1, 1, cols, 0)
        # (an innermost reduction to one value on several threads is ATen's two-pass
        # reduction, reduce.h: its buffer has the output's dtype, -code - 1 here)
        if acc is float64:
            return (kind, ORDER_CODE[order], 4, 4, 0 if inner else cols, 0)
        pair = src.bits == 16 and out16 and inner
        return (kind, ORDER_CODE[order], 16 if pair else 8, 8, c16 if inner else cols, 0)

    def _cuda_softmax_spec(self, node: Node, kind: int, n: int) -> tuple:
        """The sum or max of SoftMax.cu's kernel for this softmax / log_softmax row, as
        host_softmax picks it: over a dim with elements after it, the spatial kernel; else
        the persistent warp softmax up to 2048 elements (8 KiB), else the block kernels,
        whose choice and thread order depend on the row length, the element size and
        where the input starts (`_softmax_input`)."""
        (d,) = node.attrs["dims"]
        shape = tuple(node.inputs[0].shape)
        inner = 1
        for s in shape[d + 1:]:
            inner *= s
        if inner > 1:
            return (kind, ORDER_CODE["softmax_spatial"], inner, 0, 0, 0)
        isz, misalign, half_to_float = self._softmax_input(node)
        # the persistent warp kernel: rows up to 2048 elements (8 KiB) forward, 1024 (4 KiB)
        # backward
        bwd = bool(node.attrs.get("bwd"))
        lim = 1024 if bwd else 2048
        if n <= lim and n * isz <= 4 * lim:
            return (kind, ORDER_CODE["softmax_warp"], isz, 0, 0, 0)
        return (kind, ORDER_CODE["softmax_block"], isz, misalign, int(half_to_float),
                int(bwd))

    def _softmax_input(self, node: Node) -> tuple:
        """(element size, first byte mod 16, half_to_float) of the tensor SoftMax.cu's
        kernel reads for the softmax this reduction belongs to. PyTorch converts the input
        to a requested dtype first (a fresh, aligned tensor), except fp16 to fp32 on the
        GPU, which one kernel does (half_to_float); a contiguous input is read where it
        lies (a view may start inside a 16-byte word); anything else is copied first."""
        a = node.attrs
        isz = a.get("elem_bytes", 4)
        half_to_float = bool(a.get("cast") and a.get("fp16_in")) and isz == 4
        if a.get("cast") and not half_to_float:
            return isz, 0, False
        x = node.inputs[0]
        while x.op in ("exp", "sub", "astype", "reshape") and x.inputs:
            x = x.inputs[0]
        e = self.expr(x)
        misalign = 0
        if isinstance(e, Leaf) and e.t.is_contiguous():
            misalign = e.t.data_ptr() % 16
        return (2 if half_to_float else isz), misalign, half_to_float

    def _moments_spec(self, node: Node, kind: int, order: str, layout: tuple,
                      geom: tuple = (0, 0)) -> tuple:
        """The spec of a row's mean or M2 (ops/scalar/moments.h): the Welford kernel of
        layer_norm or var for the order."""
        ln = node.attrs.get("algo") == "layer_norm"
        if order == "torch_cpu":
            if not ln:  # std_var_kernel_impl: WelfordOps in one pass
                return (kind, ORDER_CODE[order], 0, 0, 0, 0)
            fma = int(self.math.torch_cpu_fma())
            if self.vt64(node):
                return (kind, ORDER_CODE["cpu_moments"], 4, 4, fma, 0)
            src = node.inputs[0].dtype
            # GCC fuses the scalar tail's M2 update in the fp16 kernel only (measured)
            tail = int(fma and src is float16)
            return (kind, ORDER_CODE["cpu_moments"], 16 if src.bits == 16 else 8, 8, fma, tail)
        if order == "torch_cuda":
            if ln:
                o = "cuda_layer_norm_vec" if node.attrs.get("vectorized") else "cuda_layer_norm_block"
                return (kind, ORDER_CODE[o], 0, 0, 0, 0)
            # ReduceMomentKernel.cu: gpu_reduce_kernel<scalar_t, out_t, 2>, so vt0 =
            # input_vec_size = 2 (a strided row: no vectorized loads)
            inner, unit, cols = layout
            ivs, vt0, ovs = (2, 2, 0) if unit or not inner else (1, 2, 0)
            if not inner:
                ovs = 4
                while cols % ovs:
                    ovs //= 2
            return (kind, ORDER_CODE[order], ivs, vt0, self._num_sms(), ovs, *geom)
        raise ValueError(f"the row moments have no {order!r} order (a torch order only)")


    def _num_sms(self) -> int:
        return num_sms(self.device)


class TorchKernelQuirks:
    """The program builder's expansions of PyTorch's elementwise kernels (a part of
    castlab._lower_build.ProgramBuilder: it uses its ``low``, ``operand``, ``new`` and
    ``ins``)."""

    def _scalar_args(self, e: Elem, kern, d) -> list:
        """The op's operands, a Python number read as PyTorch's kernel reads it."""
        low = self.low
        node = e.node
        op = node.op
        args = e.args
        if (op in ("add", "sub") and not low.cuda and not kern
                and node.dtype in (bfloat16, float16)
                and low.math.aten_cpu(False)
                and any(isinstance(a, Scalar) for a in args)):
            # ATen's CPU add/sub (ufunc kernels) read a Python number as the tensor's
            # scalar_t (double -> float -> bf16/fp16), where mul and div keep it in
            # float (measured: torch 2.13, bf16 x + 0.1 differs in 20% of elements
            # from the float-scalar sum)
            args = [Scalar(_scalar_as(a.value, node.dtype)) if isinstance(a, Scalar)
                    else a for a in args]
            d.quirk = f"the Python number read as {node.dtype.short} (ATen's CPU {op})"
        return args

    def _kernel_quirk(self, e: Elem, f64: int, d, gelu_x, kern, var: int):
        """The register of the op computed as PyTorch's kernel computes it where that
        differs from the op itself (recorded as the node's quirk); None elsewhere.
        `gelu_x`: x of oneDNN's gelu backward (TorchKernelLowering.onednn_gelu_backward)."""
        low = self.low
        node = e.node
        op = node.op
        if gelu_x is not None:
            quirk = self._onednn_gelu_backward(e, gelu_x, f64, d)
        else:
            quirk = self._pow_inductor(e, f64) if low.math.pow == "inductor" else None
            if quirk is not None:
                return quirk
            quirk = self._pow_scalar_root(e, f64)
        if quirk is None and low.cuda and low.math.cuda_kernels and low.math.impl == "torch":
            # (PyTorch's own kernels only: a library's math sets cuda_kernels for CUDA's
            # rsqrtf, and its kernel divides by n as it is written, e.g. Liger's Triton
            # `/ n_cols` as div.full.f32, not as PyTorch's x * (1/n))
            quirk = self._torch_cuda_kernel(e, f64)
        elif quirk is None and not kern and low.math.aten_cpu(low.cuda):
            # PyTorch's CPU pow_tensor_scalar_optimized_kernel runs for bf16 with
            # scalar_t = BFloat16 (PowKernel.cpp): x*x*x and 1/(x*x) round x*x to bf16,
            # in the vector body and the scalar lambda alike. fp16 takes its
            # std::pow / Vec::pow branch instead: one rounding (measured: 0 of 65,536
            # differ either way).
            quirk = self._pow_inner_rounded(e, f64, ("bfloat16",), "PowKernel.cpp")
        if (quirk is None and op == "log"
                and low.torch_cpu_softmax(node) and node.attrs.get("storage_dtype")):
            quirk = self._log_softmax_sum(e, f64, d, var)
        if (quirk is None and op == "div"
                and low.torch_cpu_softmax(node) and not node.attrs.get("softmax_geom")):
            quirk = self._softmax_reciprocal(e, f64, d)
        return quirk

    def _log_softmax_sum(self, e: Elem, f64: int, d, var: int) -> int:
        """serial_vec_log_softmax_lastdim_range (LogSoftmaxKernelImpl.h): the row's sum is
        stored in a bf16/fp16 array, its log is taken there (rounded again)."""
        node = e.node
        sdt = as_dtype(node.attrs["storage_dtype"])
        rne = ROUND_MODES["nearest"]
        a = self.operand(e.args[0], f64)
        r1, lg, out = self.new(), self.new(), self.new()
        self.ins("round", f64, r1, a=a, dtype=sdt.code, mode=rne, aux=node.index + 1)
        self.ins("log", f64, lg, r1, var=var)
        self.ins("round", f64, out, a=lg, dtype=sdt.code, mode=rne, aux=node.index + 1)
        d.quirk = (f"the sum and its log held in {sdt.short} "
                   "(LogSoftmaxKernelImpl.h, scalar_t tmp_sum)")
        return out

    def _softmax_reciprocal(self, e: Elem, f64: int, d) -> int:
        """_vec_softmax_lastdim: tmp_sum = 1 / tmp_sum, then x * tmp_sum."""
        a, b = (self.operand(x, f64) for x in e.args)
        one, inv, out = self.new(), self.new(), self.new()
        self.ins("const", f64, one, imm=1.0)
        self.ins("div", f64, inv, one, b)
        self.ins("mul", f64, out, a, inv)
        d.quirk = "expanded as x * (1 / sum) (SoftMaxKernel.cpp)"
        return out

    def _pow_inductor(self, e: Elem, f64: bool):
        """x ** n for an integer-valued Python number 0 <= n < 32 as Inductor lowers it
        (lowering.py pow_recursive): repeated squaring in op-math, x**3 = (x*x)*x,
        x**0 = 1 (NaN included), x**1 = x. None for any other pow."""
        node = e.node
        args = e.args
        if not (node.op == "pow" and isinstance(args[1], Scalar)
                and not isinstance(args[0], Scalar) and not isinstance(args[1].value, bool)):
            return None
        y = float(args[1].value)
        if not (y.is_integer() and 0 <= y < 32):
            return None
        x = self.operand(args[0], f64)

        def rec(n: int) -> int:
            if n == 0:
                r = self.new()
                self.ins("const", f64, r, imm=1.0)
                return r
            if n == 1:
                return x
            h = rec(n // 2)
            r = self.new()
            self.ins("mul", f64, r, h, h)
            if n % 2:
                r2 = self.new()
                self.ins("mul", f64, r2, r, x)
                r = r2
            return r

        out = rec(int(y))
        self.low.record.decide(node, f64).quirk = (
            f"expanded as repeated squaring, x**{int(y)} (Inductor's pow_recursive)")
        return out

    def _pow_scalar_root(self, e: Elem, f64: bool):
        """x ** 0.5 and x ** -0.5 with a Python-number exponent are sqrt(x) and 1/sqrt(x), as
        PyTorch's pow_tensor_scalar computes them (CPU and CUDA): they differ from C pow (the
        pow op, PyTorch's pow(tensor, tensor)) at x = -0 (-0, -inf) and x = -inf (NaN)."""
        node = e.node
        args = e.args
        if not (node.op == "pow" and isinstance(args[1], Scalar)
                and not isinstance(args[0], Scalar) and not isinstance(args[1].value, bool)
                and float(args[1].value) in (0.5, -0.5)):
            return None
        low = self.low
        torch_cpu = not low.cuda and low.math.aten_cpu(False)
        kern = node.attrs.get("kernel") is not None
        dt = node.dtype.name if node.dtype is not None else None
        if torch_cpu and dt == "float16" and not kern:
            return None  # PowKernel.cpp's Half branch: std::pow / Vec::pow, no shortcuts
        x = self.operand(args[0], f64)
        out = self.new()
        if float(args[1].value) == -0.5 and torch_cpu and not kern:
            # pow_tensor_scalar_kernel sends -0.5 to rsqrt_kernel (float, double, bf16)
            var = low.math.variant_bits("rsqrt", f64 == F64, False, dt, kern)
            self.ins("rsqrt", f64, out, x, var=var,
                     dtype=node.dtype.code if var & RSQRT_SCALAR16 else 0,
                     aux=low.math.torch_cpu_tail("rsqrt", dt) if var & TORCH_TAIL else 0)
            low.record.decide(node, f64).quirk = "expanded as rsqrt(x) (pow_tensor_scalar)"
            return out
        if float(args[1].value) == -0.5 and low.cuda and low.math.cuda_kernels:
            # PyTorch's CUDA pow_tensor_scalar sends -0.5 to its rsqrt kernel (rsqrtf)
            self.ins("rsqrt", f64, out, x, var=low.math.variant_bits("rsqrt", f64 == F64, True))
            low.record.decide(node, f64).quirk = "expanded as rsqrt(x) (pow_tensor_scalar)"
            return out
        # (under torch_cpu, 0.5 goes to sqrt_kernel: MKL VML for float and double)
        self.ins("sqrt", f64, out, x,
                 var=low.math.variant_bits("sqrt", f64 == F64, low.cuda, dt, kern) if torch_cpu else 0)
        form = "sqrt(x)"
        if float(args[1].value) == -0.5:
            r = self.new()
            self.ins("reciprocal", f64, r, out)  # var 0: an IEEE division, as pow's 1/sqrt(x)
            out, form = r, "1 / sqrt(x)"
        self.low.record.decide(node, f64).quirk = f"expanded as {form} (pow_tensor_scalar)"
        return out

    def _pow_device(self, e: Elem, var: int, d) -> tuple:
        """pow as PyTorch's CUDA kernels compute it (math.cuda_kernels): a tensor exponent
        goes straight to CUDA's pow (pow_tensor_tensor); a Python-number exponent other
        than the ones pow_tensor_scalar special-cases is converted to the tensor's dtype
        first (``exp_scalar.to<scalar_t>()``: rounded for bf16/fp16), then CUDA's pow."""
        args = e.args
        if not isinstance(args[1], Scalar):
            return var | POW_TENSOR_EXP, args
        y = args[1].value
        dt = e.node.dtype
        if (isinstance(y, bool) or float(y) in _POW_SHORTCUTS or isinstance(args[0], Scalar)
                or dt.name not in ("bfloat16", "float16")):
            return var, args
        r = float(np.asarray(float(y), dtype=np.float64).astype(dt.numpy).astype(np.float64))
        if r != float(y):
            d.quirk = f"exponent {y!r} rounded to {dt.short} first: {r!r} (pow_tensor_scalar)"
        return var, [args[0], Scalar(r)]

    def _torch_cuda_kernel(self, e: Elem, f64: bool):
        """PyTorch's eager CUDA kernels where they differ from "op-math, one rounding":
        a division by a Python number multiplies by its reciprocal (div_true_kernel_cuda),
        and bf16/fp16 x**3 and x**-2 compute the inner product in scalar_t
        (pow_tensor_scalar_kernel), i.e. rounded to the storage dtype."""
        node = e.node
        args = e.args
        k = self.low._kernel(node)
        if (node.op == "div" and isinstance(args[1], Scalar) and not isinstance(args[0], Scalar)
                and (k is None or k.scalar_div_reciprocal)):
            # (inside a PyTorch kernel, as the kernel does: mean's MeanOps multiplies by
            # 1/n, a backward kernel divides truly)
            b = float(args[1].value)
            inv = float(np.float64(1.0) / np.float64(b)) if f64 else float(np.float32(1.0) / np.float32(b))
            a = self.operand(args[0], f64)
            k = self.new()
            self.ins("const", f64, k, imm=inv)
            out = self.new()
            self.ins("mul", f64, out, a, k)
            self.low.record.decide(node, f64).quirk = (
                f"expanded as x * {inv!r} (div_true_kernel_cuda)")
            return out
        return self._pow_inner_rounded(e, f64, ("bfloat16", "float16"),
                                       "pow_tensor_scalar_kernel")

    def _pow_inner_rounded(self, e: Elem, f64: bool, dtypes: tuple, kernel: str):
        """x**3 and x**-2 (Python-number exponent) of a 16-bit tensor in `dtypes` as
        PyTorch's kernels compute them in scalar_t: x*x rounded to the storage dtype, then
        times x or its reciprocal."""
        node = e.node
        args = e.args
        if (node.op == "pow" and isinstance(args[1], Scalar) and not isinstance(args[0], Scalar)
                and not isinstance(args[1].value, bool)
                and float(args[1].value) in (3.0, -2.0) and not f64
                and node.dtype.name in dtypes):
            x = self.operand(args[0], f64)
            sq = self.new()
            self.ins("mul", f64, sq, x, x)
            r = self.new()
            self.ins("round", f64, r, a=sq, dtype=node.dtype.code, mode=0, sat=1)
            out = self.new()
            if float(args[1].value) == 3.0:
                self.ins("mul", f64, out, r, x)
                form = "round(x*x, {0}) * x"
            else:
                self.ins("reciprocal", f64, out, r)
                form = "1 / round(x*x, {0})"
            self.low.record.decide(node, f64).quirk = (
                f"expanded as {form.format(node.dtype.short)} ({kernel})")
            return out
        return None

    def _onednn_gelu_backward(self, e: Elem, x: Node, f64: int, d) -> int:
        """g * gelu'(x) as oneDNN's eltwise_gelu_erf backward computes it (the gelu op with
        the backward's variant bits, times the cotangent, rounded once by the caller)."""
        low = self.low
        var = low.math.onednn_gelu_backward_bits(e.node.dtype.name)
        xr = self.operand(low.expr(x), f64)
        gr = self.operand(e.args[0], f64)
        out = self.new()
        self.ins("gelu", f64, out, xr, gr, var=var)  # b: the cotangent
        d.quirk = ("oneDNN's JIT eltwise_gelu_erf backward, g * gelu'(x) (Activation.cpp "
                   "gelu_backward_out_cpu)")
        return out
