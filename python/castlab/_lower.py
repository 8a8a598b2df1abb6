"""Lowering: graph + policy + math -> a plan of Programs the executors run.

Three steps:
1. Every output is expressed as a tree of expressions over *leaves* (strided views of
   inputs): view ops (slice, select, permute, expand, reshape, squeeze) are pushed down
   to the leaves, where they cost nothing; a reshape that no strided view can express
   materialises its operand in a temporary first.
2. Concatenations are hoisted to the top, so each output splits into rectangular
   regions and every region is a pure elementwise DAG (RoPE's ``cat(-x2, x1)`` becomes
   two regions that read the two halves of ``x`` directly).
3. Each region becomes one Program: a load per leaf, one instruction per op, and a
   rounding step wherever the policy says (after every op under ``eager``; only at
   the store under ``fused``; nowhere under ``fp64``).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

from . import _C, _torch_vml
from ._device import as_device
from ._dtype import _BY_CODE, as_dtype, bfloat16, dtype, float16, float32, float64, int64
from ._graph import COMPARE, EXPANSIONS, Node, expand
from ._optable import (
    BACKWARD_KERNELS,
    BITS,
    F32,
    F64,
    I64,
    OPCODE,
    ORDER_CODE,
    POW_TENSOR_EXP,
    REDUCE_OPS,
    ROUND_MODES,
    instr,
    output,
)
from .policy import Math, Policy

K_ROUND = OPCODE["round"]
POW_DEVICE = BITS["pow_device"]
RSQRT_SCALAR16 = BITS["rsqrt_scalar16"]
TORCH_TAIL = BITS["torch_tail"]
# Python-number exponents PyTorch's pow_tensor_scalar kernels special-case (op_pow and the
# lowering reproduce each); any other goes to pow in the tensor's dtype
_POW_SHORTCUTS = (0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0)
_RT_NAME = {F32: "f32", F64: "f64", I64: "i64"}
_INT_MIN = -(1 << 63)
_INT_END = 1 << 63


def _int_scalar(v) -> bool:
    return isinstance(v, (bool, int))


def int_const(v, what: str) -> int:
    """A Python integer as an int64 constant; ValueError when it does not fit."""
    iv = int(v)
    if not _INT_MIN <= iv < _INT_END:
        raise ValueError(f"{what}: the Python integer {iv} does not fit in int64 "
                         f"(range [-2**63, 2**63 - 1])")
    return iv


# ---------------------------------------------------------------- the record

class Decision:
    """What the lowering decided for one graph node; the trace listing prints these.

    index, op: the node (t{index} in the listing); compute: "f32", "f64" or "i64" (its
    register type; integer and bool values are exact in "i64"); variant: the math variant bits its instruction carries (description: their
    reading); fma_with: the product node contracted into this add/sub's fma (fma_into:
    on that product, the add/sub it went into); quirk: the PyTorch CUDA kernel detail
    expanded in its place, in words; round_to, round_mode: the rounding inserted after it
    (None: none); round_elided: that rounding is done by the output store."""

    __slots__ = ("node", "index", "op", "compute", "variant", "description", "fma_with",
                 "fma_into", "quirk", "round_to", "round_mode", "round_elided")

    def __init__(self, node: Node, compute: str):
        self.node = node
        self.index = node.index
        self.op = node.op
        self.compute = compute
        self.variant = 0
        self.description = ""
        self.fma_with: Node | None = None
        self.fma_into: Node | None = None
        self.quirk = ""
        self.round_to: dtype | None = None
        self.round_mode = ""
        self.round_elided = False

    def __repr__(self) -> str:
        facts = [f"t{self.index} {self.op} {self.compute}"]
        if self.variant:
            facts.append(f"variant={self.variant:#x}")
        if self.fma_with is not None:
            facts.append(f"fma with t{self.fma_with.index}")
        if self.fma_into is not None:
            facts.append(f"contracted into t{self.fma_into.index}")
        if self.quirk:
            facts.append(f"quirk: {self.quirk}")
        if self.round_to is not None:
            facts.append(f"round to {self.round_to.short} ({self.round_mode})"
                         + (", by the store" if self.round_elided else ""))
        return f"Decision({'; '.join(facts)})"


class Record:
    """The lowering's own record of one graph under one policy, math and device: one
    :class:`Decision` per node it computed (``decisions``, by node index; ``of(node)``).
    A jit plan carries it as ``plan.record``; ``trace()`` prints it.

    >>> f = cl.jit(lambda x: cl.silu(x) * x, policy="eager", math="inductor")
    >>> x = cl.randn(8, seed=0, dtype=cl.bfloat16)
    >>> y = f(x)
    >>> for d in f.graph(x).default_plan.record.decisions:
    ...     print(d)
    Decision(t0 silu f32; round to bf16 (nearest))
    Decision(t1 mul f32; round to bf16 (nearest), by the store)
    >>> g = cl.jit(lambda x: x * x + x, math="inductor")
    >>> print(g.trace(cl.randn(8, seed=0)).splitlines()[2:4])  # doctest: +NORMALIZE_WHITESPACE
    ['  t0 = mul(x, x)                              # f32[8]  product kept exact for the fma of t1  # <doctest castlab._lower.Record[4]>:1',
     '  t1 = add(t0, x)                             # f32[8]  fma-contracted with t0  # <doctest castlab._lower.Record[4]>:1']
    """

    def __init__(self, policy: Policy, math: Math, device):
        self.policy = policy
        self.math = math
        self.device = device  # castlab.device the graph was lowered for
        self.cuda = device.is_cuda
        self._by_node: dict = {}
        self.expansions: dict = {}  # id(kernel node) -> the nodes it was lowered as

    @property
    def decisions(self) -> list:
        return sorted(self._by_node.values(), key=lambda d: d.index)

    def of(self, node: Node) -> Decision | None:
        return self._by_node.get(id(node))

    def decide(self, node: Node, rt: int) -> Decision:
        d = self._by_node.get(id(node))
        if d is None:
            d = self._by_node[id(node)] = Decision(node, _RT_NAME[int(rt)])
        return d


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


class Lowering:
    """Builds expressions and regions for one graph under one policy and math."""

    def __init__(self, policy: Policy, math: Math, device, inputs: list):
        self.policy = policy
        self.math = math
        self.device = as_device(device)   # the graph's device: temporaries and outputs
        self.cuda = self.device.is_cuda
        self.inputs = inputs          # concrete tensors bound to 'input' nodes
        self.temps: list = []         # (shape, dtype) of temporaries
        self.temp_tensors: list = []
        self.steps: list = []         # (Program, leaves, outs) in execution order
        self.reduce_decisions: dict = {}  # id(reduce step) -> its node's Decision
        self._expr_memo: dict = {}
        self._view_memo: dict = {}
        self._hoist_memo: dict = {}
        self.record = Record(policy, math, self.device)  # what was decided, per node

    # -- value types -------------------------------------------------------------
    def vt64(self, node: Node) -> bool:
        """Does this node's value live in a double register?"""
        return self.vt(node) == F64

    def vt(self, node: Node) -> int:
        """The register type of this node's value: I64 for integer and bool values
        (loads, casts to integer formats, where, comparisons of integers), which stay
        exact there; else F64 or F32."""
        if node.dtype is not None and not node.dtype.is_floating_point:
            if node.op not in COMPARE or all(
                    _int_scalar(a.value) if a.op == "scalar" else not a.dtype.is_floating_point
                    for a in node.inputs):
                return I64
        return F64 if self._vt64_float(node) else F32

    def _vt64_float(self, node: Node) -> bool:
        if self.policy.compute is not None:
            return self.policy.compute is float64
        if node.op in ("input", "tmp"):
            return node.dtype in (float64, int64)
        if node.op in COMPARE:
            return any(a.op != "scalar" and a.dtype in (float64, int64) for a in node.inputs)
        if node.op == "astype":  # round from the input's own precision: no double rounding
            return node.dtype is float64 or self.vt(node.inputs[0]) == F64
        return node.dtype in (float64, int64)

    def round_target(self, node: Node) -> dtype | None:
        p = self.policy
        if node.op == "astype":
            if p.name == "fp64" or not p.round_casts:
                return None
            target = node.dtype
        elif node.op in COMPARE or node.op in ("input", "scalar"):
            return None
        elif p.rounds_after(node.index, node.op, node.attrs.get("phase"),
                            self.kernel_inner(node)):
            target = node.dtype
        else:
            return None
        f64 = self.vt64(node)
        if target is float64 or not target.is_floating_point or self.vt(node) == I64:
            return None
        if target is float32 and not f64:
            return None
        return target

    def _kernel(self, node: Node):
        k = node.attrs.get("kernel")
        return BACKWARD_KERNELS[k] if k is not None else None

    def torch_cpu_softmax(self, node: Node) -> bool:
        """Is this node inside softmax/log_softmax (or their backward kernels) as PyTorch's
        CPU kernel computes it (the torch_cpu order and implementation on the CPU)?"""
        return (not self.cuda and node.attrs.get("kernel") in _TORCH_CPU_SOFTMAX_KERNELS
                and self.math.reduction_order(False) == "torch_cpu"
                and self.math.impl_on(False) == "torch_cpu")

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

    def kernel_inner(self, node: Node) -> bool:
        """Is this node inside one of PyTorch's fused backward kernels that computes in
        op-math on this device (its value is never rounded on its own)?"""
        k = self._kernel(node)
        return (k is not None and node.attrs.get("kernel_inner", False)
                and k.arith_for(self.cuda, node.dtype) == "opmath")

    def kernel_contracts(self, node: Node) -> bool:
        """Inside one of PyTorch's backward kernels, does its compiler contract a*b+c to
        an fma here? Only when the math reproduces PyTorch's kernels (cuda_kernels):
        portable math keeps the CPU and the GPU identical; on the CPU, not in the DEFAULT
        build (Math.cpu_isa), which is compiled without -mfma."""
        k = self._kernel(node)
        return (k is not None and k.contract["cuda" if self.cuda else "cpu"]
                and self.math.cuda_kernels and not node.attrs.get("no_fma")
                and (self.cuda or self.math.torch_cpu_fma()))  # DEFAULT: built without -mfma

    def contracts(self, mul: Node, f64: bool, uses: int, into: Node | None = None) -> bool:
        """Does this product contract into the fma of the add/sub `into` (in f64 or not)
        that uses it? Only when the math asks for contraction (or both sit in one of
        PyTorch's backward kernels whose compiler contracts), the product has that one
        use, and the policy neither rounds it nor treats it as a kernel boundary (plain
        eager runs every op as its own kernel, even where its rounding is a no-op)."""
        if mul.op != "mul" or uses != 1 or self.vt64(mul) != f64:
            return False
        if not self.math.fma:
            if into is None or not self.kernel_contracts(into) or (
                    mul.attrs.get("kernel_id") != into.attrs.get("kernel_id")):
                return False
            return self.round_target(mul) is None
        return (not self.policy.rounds_after(mul.index, "mul", mul.attrs.get("phase"),
                                             self.kernel_inner(mul))
                and self.round_target(mul) is None)

    # -- expression building -----------------------------------------------------
    def expr(self, node: Node):
        key = id(node)
        e = self._expr_memo.get(key)
        if e is not None:
            return e
        op = node.op
        if op == "input":
            slot = node.attrs["slot"]  # bind the tensors of this lowering, not the trace's
            e = Leaf(self.inputs[slot] if slot < len(self.inputs) else node.tensor, ("in", slot))
        elif op == "scalar":
            e = Scalar(node.value)
        elif op == "cat":
            e = Cat(node.attrs["dim"], [self.expr(p) for p in node.inputs], node.shape)
        elif op in ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze"):
            inner = self.expr(node.inputs[0])
            e = self.view(inner, node.attrs["vop"])
        elif op in REDUCE_OPS:
            e = self.reduce_expr(node)
        elif op == "gather":
            e = self._gather(node)
        elif op == "scatter_add":
            e = self._scatter_add(node)
        elif op == "nll_reduce":
            e = self._nll(node)
        elif op == "rms_scale":
            e = self.expr(self._rms_scale(node))
        elif op in EXPANSIONS:
            e = self.expr(self._expand(node))
        else:
            args = []
            for a in node.inputs:
                ea = self.expr(a)
                if not isinstance(ea, Scalar) and tuple(ea.shape) != node.shape:
                    ea = self.view(ea, ("expand", node.shape))
                args.append(ea)
            e = Elem(node, args, node.shape)
        self._expr_memo[key] = e
        return e

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
        r = self._view(e, vop)
        self._view_memo[key] = r
        self._view_memo[(id(r), "keep")] = e  # keep e alive so its id is not reused
        return r

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
        before = sum(1 for st in self.steps if st[0] == "index")
        e = self.view(self.expr(x), ("gather", dim, idx, wrap, target))
        if sum(1 for st in self.steps if st[0] == "index") == before:
            self.steps.append(("index", [idx, idx], [idx],
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
        self.steps.append(("index", [src, idx], [out], (mode, dim, 0, wrap, target)))
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
        self.steps.append(("nll", [xg, wg, t], [Leaf(out_t, ("tmp", k))], spec))
        d = self.record.decide(node, F64 if acc is float64 else F32)
        d.description = (f"nll_loss {a['reduction']} {order} (" +
                         ("LossNLL.cpp: cascade in the input's format" if code == 0 else
                          "Loss.cu: one block's threads, then a tree") + ")")
        pick = 0 if a["what"] == "loss" else 1
        return Leaf(out_t._select(0, pick), ("tmp", k))

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

    def materialize(self, e):
        """Compute e into a temporary (in its register type, so no rounding is added)."""
        if isinstance(e, Leaf):
            dt = _BY_CODE[_dtype_code(e.t)]
        else:
            dt = self._expr_dtype(e)
        k = len(self.temps)
        self.temps.append((tuple(e.shape), dt))
        t = _C.empty(list(e.shape), dt.name, str(self.device))
        self.temp_tensors.append(t)
        self.emit_regions(self.hoist(e), Leaf(t, ("tmp", k)), out_meta=None)
        return Leaf(t, ("tmp", k))

    def _expr_dtype(self, e) -> dtype:
        """The dtype that holds e's register values exactly (a temporary's dtype)."""
        if isinstance(e, Leaf):
            d = _BY_CODE[_dtype_code(e.t)]
            if not d.is_floating_point:
                return int64
            return float64 if d is float64 or self.policy.compute is float64 else float32
        if isinstance(e, (Elem, Reduced)):
            rt = self.vt(e.node)
            return int64 if rt == I64 else (float64 if rt == F64 else float32)
        if isinstance(e, Cat):
            ds = [self._expr_dtype(p) for p in e.parts]
            if all(d is int64 for d in ds):
                return int64
            return float64 if any(d is not float32 for d in ds) else float32
        return float32

    # -- reductions ---------------------------------------------------------------
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
        if dot is not None:  # the products' factors side by side: [rows, 2n] (red_dot)
            ev = self._temp_from(Cat(1, [as_rows(a) for a in dot], (rows, 2 * n)),
                                 (rows, 2 * n), acc)
        else:
            ev = as_rows(ev)
        if dot is None and not (isinstance(ev, Leaf) and _dtype_code(ev.t) == acc.code
                                and ev.t.is_contiguous()):
            ev = self._temp_from(ev, (rows, n), acc)
        k = len(self.temps)
        self.temps.append(((rows,), acc))
        t = _C.empty([rows], acc.name, str(self.device))
        self.temp_tensors.append(t)
        spec = self.reduce_spec(node, acc, layout, n, geom, dot=dot is not None,
                                src_f32=src_f32, zseg=zseg)
        self.steps.append((None, [ev], [Leaf(t, ("tmp", k))], spec))
        d = self.record.decide(node, F64 if acc is float64 else F32)
        self.reduce_decisions[id(self.steps[-1])] = d
        d.description = _C.describe_reduce(spec, 2 * n if dot else n, rows)
        if node.op in ("amax", "amin") and spec[1] == ORDER_CODE["torch_cpu"] and spec[3] > 0:
            loop = ("vectorized_reduction" + (f" over rows of {spec[6]}" if len(spec) > 6
                                              else "") if spec[3] == 2
                    else "vectorized_outer_reduction" if spec[3] == 3 else "the scalar loop")
            d.description = (f"{node.op[1:]} torch_cpu (binary_kernel_reduce_vec, "
                             f"{spec[2]}-element vectors: {loop} decides a zero's sign)")
        view = t._view_or_none(list(node.shape))
        return Reduced(node, Leaf(view, ("tmp", k)), node.shape)

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
            d = self.record.decide(node, F64 if acc is float64 else F32)
            self.reduce_decisions[id(self.steps[-1])] = d
            d.description = (
                "sum torch_cpu: TensorIterator's dims " + " x ".join(
                    f"{g[0]}{'r' if g[2] else ''}" for g in groups)
                + f"; each row of {n0} by " + _C.describe_reduce(spec1, n0, 1).split(" ", 1)[-1]
                + ", the rows' sums added in order (on several torch threads: ATen's two-pass"
                " split, the rows cut at its chunks)"
                + (" (from a float copy)" if node.inputs[0].dtype.bits == 16 else ""))
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
        d = self.record.decide(node, F64 if acc is float64 else F32)
        self.reduce_decisions[id(self.steps[-1])] = d
        d.description = (
            "sum torch_cpu: TensorIterator's dims " + " x ".join(
                f"{g[0]}{'r' if g[2] else ''}" for g in groups)
            + f"; each row of {n0} by " + _C.describe_reduce(spec1, n0, rows1).split(" ", 1)[-1]
            + f", then the {n} row sums added in order" + (" (from a float copy)"
                                                           if node.inputs[0].dtype.bits == 16
                                                           else ""))
        return Reduced(node, Leaf(t.t._view_or_none(list(node.shape)), t.src), node.shape)

    def _reduce_step(self, ev, rows: int, n: int, acc, spec: tuple) -> Leaf:
        """One reduce step over `ev` seen as [rows, n], into a fresh [rows] temporary."""
        if not (isinstance(ev, Leaf) and _dtype_code(ev.t) == acc.code and ev.t.is_contiguous()):
            ev = self._temp_from(ev, (rows, n), acc)
        k = len(self.temps)
        self.temps.append(((rows,), acc))
        t = _C.empty([rows], acc.name, str(self.device))
        self.temp_tensors.append(t)
        out = Leaf(t, ("tmp", k))
        self.steps.append((None, [ev], [out], spec))
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

    def _temp_from(self, e, shape: tuple, dt: dtype) -> Leaf:
        k = len(self.temps)
        self.temps.append((tuple(shape), dt))
        t = _C.empty(list(shape), dt.name, str(self.device))
        self.temp_tensors.append(t)
        self.emit_regions(self.hoist(e), Leaf(t, ("tmp", k)), out_meta=None)
        return Leaf(t, ("tmp", k))

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
        if kind >= REDUCE_OPS["moments_mean"]:
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
        if order == "triton":
            isz = node.attrs.get("elem_bytes", src.bits // 8)
            return (kind, ORDER_CODE[order], *triton_config(node.attrs.get("algo"), n, isz))
        if order == "sequential" and node.attrs.get("algo") == "var":
            _torch_vml.unavailable()  # (torch's thread count: see above)
            return (kind, ORDER_CODE[order], 1, 0, 0, 0)  # ATen's parallel_reduce
        return (kind, ORDER_CODE[order], 0, 0, 0, 0)

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
        """Streaming multiprocessors of the graph's GPU (Reduce.cuh sizes its grid by
        them); 132 (H100/H200) when emulating on the CPU."""
        if not self.cuda:
            return 132
        return _C.cuda_sm_count(self.device.index or 0)

    def _expand(self, node: Node) -> Node:
        """A kernel node (var, layer_norm) as the nodes it computes under this lowering's
        order of accumulation (castlab._graph.expand)."""
        order = self.math.reduction_order(self.cuda)
        key = ("expand", id(node), order)
        r = self._expr_memo.get(key)
        if r is None:
            r, new = expand(node, _ExpandContext(self, node, order))
            self._expr_memo[key] = r
            self.record.expansions[id(node)] = [m for m in new if m is not r] + [r]
            how = ("PyTorch's Welford kernel" if order in ("torch_cpu", "torch_cuda")
                   else "two passes")
            self.record.decide(node, F32).description = f"{node.op}: {how} ({order})"
        return r

    def _rms_scale(self, node: Node) -> Node:
        """castlab.rms_norm's last step, where the cast placement (Math.rms_norm, unless
        the call fixed it) decides the nodes: "hf" casts the normalised fp32 value to the
        input dtype and multiplies by the weight there; "te" multiplies by the weight in
        fp32 and casts once."""
        h, w = node.inputs
        cast = node.attrs.get("cast") or self.math.rms_norm
        key = ("rms", id(node), cast)
        r = self._expr_memo.get(key)
        if r is not None:
            return r
        out_dt = node.dtype
        self.record.decide(node, F32).description = (
            f"rms_norm cast={cast}: " + (f"weight * h.to({node.attrs['in_dtype'].short})"
                                         if cast == "hf" else
                                         f"(h * weight.float()).to({out_dt.short}), one kernel"))
        if cast == "hf":
            a = Node("astype", (h,), h.shape, node.attrs["in_dtype"], node.device,
                     dict(node.attrs))
            y = Node("mul", (w, a), node.shape, out_dt, node.device, dict(node.attrs))
            a.index = node.index
        else:
            inner = {**node.attrs, "kernel": "rms_norm_te", "kernel_inner": True}
            wf = Node("astype", (w,), w.shape, h.dtype, node.device, inner)
            p = Node("mul", (h, wf), node.shape, h.dtype, node.device, inner)
            y = Node("astype", (p,), node.shape, out_dt, node.device, dict(node.attrs))
            for m in (wf, p):
                m.index = node.index
        y.index = node.index
        self._expr_memo[key] = y
        return y

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

    # -- regions and programs -----------------------------------------------------
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

    def emit_regions(self, e, out: Leaf, out_meta):
        self.emit_grouped(self.regions(e, out, out_meta, []))

    def emit_grouped(self, regs: list):
        """One Program per group of regions of equal shape: RoPE's two halves (and several
        outputs of one shape) become one kernel that reads each input element once.
        Stochastic rounding keeps one Program per region, since its random stream is
        indexed by the position in the Program's first output."""
        if self.policy.rounding == "stochastic":
            for e, out, meta in regs:
                self.emit_program([e], [out], [meta])
            return
        groups: dict = {}
        for r in regs:
            groups.setdefault(tuple(r[0].shape), []).append(r)
        for g in groups.values():
            self.emit_program([r[0] for r in g], [r[1] for r in g], [r[2] for r in g])

    def emit_program(self, exprs: list, outs: list, metas: list):
        b = ProgramBuilder(self)
        regs = [b.value(e) for e in exprs]
        regs = [b.elide_final_round(r, o) for r, o in zip(regs, outs)]
        specs = []
        for r, m in zip(regs, metas):
            if m is None:
                specs.append(output(r))
            else:
                specs.append(output(r, self.policy.rounding_code, int(self.policy.saturate), m))
        if any(isinstance(e, Scalar) for e in exprs):
            raise ValueError("an output that is a plain Python number is not supported")
        prog = _C.Program(b.code, b.nregs, specs, self.policy.seed)
        self.steps.append((prog, b.leaves, outs))


class _ExpandContext:
    """What a kernel expansion may ask the lowering: the order, the device, whether
    PyTorch would see the operands aligned."""

    def __init__(self, low: Lowering, node: Node, order: str):
        self.order = order
        self.cuda = low.cuda
        self.math = low.math
        self.attrs: dict = {}  # set by the expansion: attrs of every node it records
        self._low = low
        self._policy = low.policy
        self._node = node

    def eager_rounding(self) -> bool:
        """Does the policy round after every op, as PyTorch eager (its backward kernels
        then run as PyTorch's)?"""
        return self._policy.round_after == "all"

    def memory_perm(self) -> tuple:
        """The permutation of the first operand's dims into memory order (largest stride
        first), as TensorIterator walks a strided input; identity for a computed value."""
        a = self._node.inputs[0]
        e = self._low.expr(a)
        nd = len(a.shape)
        if not isinstance(e, Leaf):
            return tuple(range(nd))
        st = e.t._strides
        return tuple(sorted(range(nd), key=lambda d: -abs(st[d])))

    def aligned(self, nbytes: int) -> bool:
        """Would every operand's data start at a multiple of `nbytes` in PyTorch's kernel?
        A contiguous input view as it is; anything else PyTorch makes contiguous first
        (a fresh, aligned buffer)."""
        for a in self._node.inputs:
            e = self._low.expr(a)
            if isinstance(e, Leaf) and e.t.is_contiguous() and e.t.data_ptr() % nbytes:
                return False
        return True


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
    st, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= shape[d]
    return tuple(st)


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
    if isinstance(e, Leaf):
        st = [abs(x) for x in e.t._strides]
    else:
        st, acc = [0] * nd, 1
        for d in range(nd - 1, -1, -1):
            st[d] = acc
            acc *= shape[d]
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


# -- Inductor's Triton reductions --------------------------------------------------
#: (algo, row length, loaded element bytes) -> (R0_BLOCK, per thread, lanes, warps): a
#: configuration to use instead of triton_config's (a test or a study of another
#: autotuning outcome sets it).
TRITON_CONFIGS: dict = {}


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def triton_config(algo: str | None, n: int, isz: int) -> tuple:
    """The tile of Inductor's Triton kernel for a row of `n` elements loaded as `isz`-byte
    values: (R0_BLOCK, contiguous elements per thread, lanes, warps) along the row, as
    torch 2.11's Inductor with Triton 3.6 chose them on an H200 (its heuristics, then its
    autotuning by time: another GPU or version may pick other tiles, and so another order;
    ``TRITON_CONFIGS`` overrides). Each thread holds up to 16 bytes of contiguous elements
    (Triton's coalescing), fewer when the tile has fewer.

    softmax: rows up to 4096 elements are one tile of the next power of two, on 2 warps
    with several rows per block up to 128 elements, else 8 warps, 16 from 8 KiB per tile
    (measured: bit for bit equal to torch.compile at 32 to 4096 elements, bf16, fp16 and
    fp32, except where Inductor autotuned to two tiles); longer rows loop over tiles of
    4096 (not measured). Other sums (RMSNorm's): rows up to 1024 elements are one tile on
    1 warp (``triton_per_``); longer rows loop over tiles of 4096 (16-bit rows of a
    multiple of 4096) or 2048 elements on 16 warps (``triton_red_``)."""
    key = (algo, n, isz)
    if key in TRITON_CONFIGS:
        return tuple(TRITON_CONFIGS[key])
    if algo == "softmax":
        r = _pow2_at_least(max(n, 1)) if n <= 4096 else 4096
        if r <= 64:
            xblock, warps = 128, 2
        elif r <= 128:
            xblock, warps = 8, 2
        else:
            xblock, warps = 1, 16 if r * isz >= 8192 else 8
    elif n <= 1024:
        r, xblock, warps = _pow2_at_least(max(n, 1)), 1, 1
    else:
        r = 4096 if (isz == 2 and n % 4096 == 0) else 2048
        xblock, warps = 1, 16
    return triton_tile(r, xblock, warps, isz)


def triton_tile(r: int, xblock: int, warps: int, isz: int) -> tuple:
    """(R0_BLOCK, contiguous elements per thread, lanes, warps) along the row of Triton's
    blocked layout for a tile of R0_BLOCK `r` by XBLOCK `xblock` on `warps` warps, for
    `isz`-byte elements: a tile Inductor chose (its ``.best_config``) in castlab's terms,
    for ``TRITON_CONFIGS``."""
    per16 = max(1, 16 // isz)
    per = max(1, min(per16, r, r * xblock // (32 * warps)))
    lanes = max(1, min(32, r // per))
    wr = max(1, min(warps, r // (per * lanes)))
    return (r, per, lanes, wr)


# -- row steps: reductions fused with their prologues and epilogue ----------------
#: Fuse reductions with their prologue and epilogue (row steps): "auto" where it was
#: measured faster (on a GPU, runs whose sums are in NumPy's pairwise order and max/min:
#: benchmarks/RESULTS.md), True always, False never (tests check that fusing changes no
#: bit; benchmarks measure what it gains). The environment variable CASTLAB_FUSE_ROWS=1 / 0
#: sets it to True / False when castlab is imported (test runs in worker processes).
FUSE_ROWS: bool | str = {"1": True, "0": False}.get(os.environ.get("CASTLAB_FUSE_ROWS", ""),
                                                   "auto")
# SoftMax.cu's orders can run fused as that kernel's own threads (ops/cuda/row_kernel.cpp
# torch_row_source: the row read from memory, any length) with FUSE_ROWS = True; not by
# default until that kernel has run against PyTorch on a GPU (it compiles with NVRTC).
_FAST_ROW_MAX = {ORDER_CODE[o] for o in ("sequential", "pairwise", "torch_cpu", "triton")}
# by ReduceKind (the Welford moments: never measured fused, so not fused by default)
_FAST_ROW = {REDUCE_OPS["sum"]: {ORDER_CODE["pairwise"], ORDER_CODE["triton"]},
             REDUCE_OPS["amax"]: _FAST_ROW_MAX,
             REDUCE_OPS["amin"]: _FAST_ROW_MAX}

def _rows_strides(t, rows: int, n: int) -> tuple | None:
    """(rs, cs) when the view `t` (of an index space of rows * n elements, the reduced
    dims last) places its element (r, j) at r * rs + j * cs, else None."""
    shape, st = tuple(t.shape), tuple(t._strides)
    total = 1
    for x in shape:
        total *= x
    if total != rows * n:  # another index space (a program beside the rows, not on them)
        return None
    for p in range(len(shape) + 1):
        lead = 1
        for x in shape[:p]:
            lead *= x
        if lead != rows:
            continue
        parts = []
        for dims in (range(p), range(p, len(shape))):
            live = [d for d in dims if shape[d] > 1]
            ok = all(st[a] == st[b] * shape[b] for a, b in zip(live, live[1:]))
            parts.append(st[live[-1]] if live else 0)
            if not ok:
                break
        else:
            return tuple(parts)
    return None


def fuse_rows(low: Lowering) -> None:
    """Replace each run of reduce steps over the same [rows, n] rows (each with the
    Program computing the value it reduces) and the Program after them (the epilogue:
    RMSNorm's scaling, softmax's division) by one row step: one kernel per row on the
    GPU, row chunks that stay in cache on the CPU (ops/row_step.h). Same values, same
    order of accumulation: no bit changes. A run ends where a step would read a row result
    of the run other than its own row's, or does not fit the row layout."""
    steps = low.steps
    readers: dict = {}
    for st in steps:
        for leaf in st[1]:
            readers[leaf.src] = readers.get(leaf.src, 0) + 1
    out, i = [], 0
    while i < len(steps):
        grp = _row_group(low, steps, i, readers)
        if grp is None:
            out.append(steps[i])
            i += 1
            continue
        step, j, dropped = grp
        for k in dropped:  # prologue temporaries nothing reads any more
            low.temps[k] = ((0,), low.temps[k][1])
        for st in steps[i:j]:
            d = low.reduce_decisions.get(id(st))
            if d is not None:
                d.description += ("; fused with its prologue and epilogue: " +
                                  ("one kernel, thread blocks over the rows" if low.cuda
                                   else "row chunks kept in cache"))
        out.append(step)
        i = j
    low.steps = out


def _row_group(low: Lowering, steps: list, i: int, readers: dict):
    """(row step, end index, dropped temporaries) of the longest fusable run at i."""
    phases, leaves, outs, dropped = [], [], [], []
    qsrcs: set = set()
    rows = n = None
    j = i

    def operand(lst, leaf) -> int:
        key = (leaf.src, leaf.t._offset, tuple(leaf.t.shape), tuple(leaf.t._strides))
        for k, x in enumerate(lst):
            if (x.src, x.t._offset, tuple(x.t.shape), tuple(x.t._strides)) == key:
                return k
        lst.append(leaf)
        return len(lst) - 1

    def rowable(ls: list) -> bool:
        for leaf in ls:
            rc = _rows_strides(leaf.t, rows, n)
            if rc is None:
                return False
            if leaf.src in qsrcs and (rc != (1, 0) or leaf.t._offset
                                      != low.temp_tensors[leaf.src[1]]._offset):
                return False
        return True

    while j < len(steps):
        st = steps[j]
        prog, red = None, None
        if st[0] is None:
            red = st
        elif (not isinstance(st[0], str) and j + 1 < len(steps)
              and steps[j + 1][0] is None and len(st[2]) == 1
              and st[2][0].src == steps[j + 1][1][0].src and st[2][0].src[0] == "tmp"
              and readers.get(st[2][0].src) == 1):
            prog, red = st, steps[j + 1]
        else:
            break
        src, dst = red[1][0], red[2][0]
        if len(src.t.shape) != 2 or dst.src[0] != "tmp":
            break
        r, m = src.t.shape
        if r * m == 0 or (rows is not None and (r, m) != (rows, n)):
            break
        if phases and _dtype_code(dst.t) != _dtype_code(phases[0][3].t):
            break  # one accumulator type per row step (var's CPU M2 is in double)
        rows, n = r, m
        ins = prog[1] if prog else [src]
        if not rowable(ins):
            break
        phases.append((prog, ins, red, dst))
        qsrcs.add(dst.src)
        if prog:
            dropped.append(st[2][0].src[1])
        j += 2 if prog else 1
    if not phases:
        return None
    epi = None
    if j < len(steps) and steps[j][0] is not None and not isinstance(steps[j][0], str):
        cand = steps[j]
        if all(_rows_strides(o.t, rows, n) is not None for o in cand[2]) and rowable(cand[1]):
            epi = cand
    spec_phases = []
    for prog, ins, red, dst in phases:
        idx = [operand(leaves, x) for x in ins]
        spec_phases.append([prog[0] if prog else None, idx, tuple(red[3]), dst])
    epi_ins = [operand(leaves, x) for x in epi[1]] if epi else []
    for ph in spec_phases:
        ph[3] = len(leaves) + operand(outs, ph[3])
    epi_outs = [len(leaves) + operand(outs, o) for o in epi[2]] if epi else []
    rs, cs = [], []
    for leaf in leaves + outs:
        if leaf.src in qsrcs and len(leaf.t.shape) == 1:
            a, b = 1, 0   # a row result written by the step
        else:
            a, b = _rows_strides(leaf.t, rows, n)
        rs.append(a)
        cs.append(b)
    spec = (rows, n, [tuple(p) for p in spec_phases], epi[0] if epi else None, epi_ins,
            epi_outs, rs, cs)
    acc64 = _dtype_code(phases[0][3].t) == float64.code
    if FUSE_ROWS == "auto" and not (low.cuda and all(
            red[3][1] in _FAST_ROW.get(red[3][0], ()) for _, _, red, _ in phases)):
        return None
    if low.cuda and not _C.row_kernel_fits(spec, acc64, low.device.index or 0):
        return None
    if low.cuda and any(red[3][0] >= REDUCE_OPS["moments_mean"] for _, _, red, _ in phases):
        return None  # Welford moments in a row kernel have not run on a GPU: kept apart
    end = j + (1 if epi else 0)
    return ("row", leaves, outs, spec), end, dropped


def _scalar_as(v, dt: dtype) -> float:
    """A Python number as c10 converts it to a 16-bit scalar_t: to float, then rounded to
    the format."""
    f = np.float32(v)
    return float(np.asarray(f, dtype=ml_dtypes.bfloat16 if dt is bfloat16 else np.float16))


def _dtype_code(t) -> int:
    return as_dtype(t._dtype_name).code


def _narrow_int(v: int, to: dtype) -> int:
    """An int64 value as integer format `to` (int32 wraps, bool: v != 0), as to_i64."""
    if to.name == "bool":
        return int(v != 0)
    if to.name == "int32":
        return ((v + (1 << 31)) % (1 << 32)) - (1 << 31)
    return v


class ProgramBuilder:
    """Turns one region's expression DAG into instructions (one register per value)."""

    def __init__(self, low: Lowering):
        self.low = low
        self.code: list = []
        self.nregs = 0
        self.leaves: list = []
        self._leaf_regs: dict = {}
        self._memo: dict = {}
        self._conv: dict = {}
        self._uses: dict = {}
        self._round_of: dict = {}   # register of an inserted rounding -> its Decision
        self._elided: dict = {}     # rounding register -> the value its output store rounds

    def elide_final_round(self, reg: int, out: Leaf) -> int:
        """A deterministic rounding to the output's own dtype right before the store is
        done by the store itself: skip the separate step (same bits, less work). A value
        stored to several outputs (a function returning it twice) is elided once and every
        store rounds it."""
        if reg in self._elided:
            return self._elided[reg]
        ins = next((i for i in self.code if i.dst == reg), None)
        if (ins is None or ins.op != K_ROUND or ins.mode == ROUND_MODES["stochastic"]
                or ins.dtype != _dtype_code(out.t)):
            return reg
        if self.low.policy.rounding_code != ins.mode:
            return reg
        if any(reg in (i.a, i.b, i.c) for i in self.code):
            return reg
        self.code.remove(ins)
        d = self._round_of.get(reg)
        if d is not None:
            d.round_elided = True
        self._elided[reg] = ins.a
        return ins.a

    def new(self) -> int:
        self.nregs += 1
        return self.nregs - 1

    def ins(self, op: str, rt: int, dst: int, a=-1, b=-1, c=-1, var=0, dtype=0, mode=0,
            sat=0, aux=0, imm=0.0, iimm=0):
        self.code.append(instr(op, rt, dst, a, b, c, var=var, dtype=dtype, mode=mode,
                               saturate=sat, aux=aux, imm=imm, iimm=iimm))

    def value(self, e) -> int:
        self._count_uses(e)
        return self._value(e)[0]

    def _count_uses(self, e):
        if isinstance(e, Elem):
            k = id(e)
            self._uses[k] = self._uses.get(k, 0) + 1
            if self._uses[k] == 1:
                for a in e.args:
                    self._count_uses(a)

    def _value(self, e) -> tuple[int, int]:
        """(register, register type) holding e's value."""
        k = id(e)
        r = self._memo.get(k)
        if r is not None:
            return r
        if isinstance(e, Leaf):
            t = e.t
            key = (e.src, t._offset, t.shape, t._strides)
            r = self._leaf_regs.get(key)
            if r is None:
                code = _dtype_code(t)
                if not _BY_CODE[code].is_floating_point:
                    rt = I64  # integers and bools: exact
                else:
                    rt = F64 if (self.low.policy.compute is float64) or (
                        self.low.policy.compute is None and code == float64.code) else F32
                reg = self.new()
                self.ins("load", rt, reg, dtype=code, aux=len(self.leaves))
                self.leaves.append(e)
                r = (reg, rt)
                self._leaf_regs[key] = r
        elif isinstance(e, Scalar):
            r = None  # constants are materialised by their consumer in its type
        elif isinstance(e, Reduced):
            r = self._reduced(e)
        else:
            r = self._elem(e)
        self._memo[k] = r
        return r

    @staticmethod
    def _dtype_of(e) -> dtype:
        return _BY_CODE[_dtype_code(e.t)] if isinstance(e, Leaf) else e.node.dtype

    def operand(self, e, rt: int, to: dtype | None = None) -> int:
        """A register of type `rt` holding e's value. For an int64 register, `to` names
        the integer format the value is converted to (default: e's own dtype)."""
        rt = int(rt)
        if isinstance(e, Scalar):
            if rt == I64:
                v = e.value
                if not _int_scalar(v) and not float(v).is_integer():
                    raise ValueError(f"the Python number {v!r} is not an integer")
                iv = int_const(v, "constant")
                if to is not None:
                    iv = _narrow_int(iv, to)
                key = ("iconst", iv)
                r = self._conv.get(key)
                if r is None:
                    r = self.new()
                    self.ins("const", I64, r, iimm=iv)
                    self._conv[key] = r
                return r
            try:
                fv = float(e.value)
            except OverflowError:
                raise ValueError(f"the Python integer {e.value} is too large for a "
                                 "floating-point computation") from None
            key = ("const", fv, rt)
            r = self._conv.get(key)
            if r is None:
                r = self.new()
                self.ins("const", rt, r, imm=fv)
                self._conv[key] = r
            return r
        reg, have = self._value(e)
        have = int(have)
        src = self._dtype_of(e)
        if rt == I64:
            if to is None:
                to = src if not src.is_floating_point else int64
            narrow = (have != I64 or (to.name == "int32" and src.name == "int64")
                      or (to.name == "bool" and src.name != "bool"))
            if not narrow:
                return reg
            key = (reg, rt, to.code)
        else:
            if have == rt:
                return reg
            key = (reg, rt)
        r = self._conv.get(key)
        if r is None:
            r = self.new()
            if rt == I64:
                self.ins("to_i64", I64, r, a=reg, dtype=to.code)
            else:
                self.ins("to_f64" if rt == F64 else "to_f32", rt, r, a=reg)
            self._conv[key] = r
        return r

    def _elem(self, e: Elem) -> tuple[int, int]:
        low = self.low
        node = e.node
        op = node.op
        f64 = low.vt(node)  # the register type (F32, F64 or I64)
        args = e.args
        d = low.record.decide(node, f64)
        if op == "astype":
            src = self.operand(args[0], f64, to=node.dtype if f64 == I64 else None)
            out = src
        elif f64 == I64:  # comparisons of integers, where: exact in int64
            regs = [self.operand(a, I64) for a in args]
            out = self.new()
            self.ins(op, I64, out, *(regs + [-1, -1, -1])[:3])
        else:
            dt = node.dtype.name if node.dtype is not None else None
            # a step inside another PyTorch kernel (layer_norm, softmax, a backward kernel)
            # is not PyTorch's own kernel for the op: none of that kernel's details apply
            kern = node.attrs.get("kernel") or False  # the kernel's name
            if (op in ("add", "sub") and not low.cuda and not kern
                    and node.dtype in (bfloat16, float16)
                    and low.math.impl_on(False) == "torch_cpu"
                    and any(isinstance(a, Scalar) for a in args)):
                # ATen's CPU add/sub (ufunc kernels) read a Python number as the tensor's
                # scalar_t (double -> float -> bf16/fp16), where mul and div keep it in
                # float (measured: torch 2.13, bf16 x + 0.1 differs in 20% of elements
                # from the float-scalar sum)
                args = [Scalar(_scalar_as(a.value, node.dtype)) if isinstance(a, Scalar)
                        else a for a in args]
                d.quirk = f"the Python number read as {node.dtype.short} (ATen's CPU {op})"
            if low.torch_cpu_softmax(node):
                dt = None  # the kernel's Vectorized exp/log: SLEEF's, whatever the dtype
            var = low.math.variant_bits(op, f64 == F64, low.cuda, dt, kern)
            if var != d.variant or not d.description:
                d.variant = var
                d.description = low.math.describe_op(op, low.cuda, dt, kern) or ""
            gelu_x = low.onednn_gelu_backward(e)
            contracted = (self._try_fma(e, f64) if gelu_x is None and op in ("add", "sub") and (
                low.math.fma or low.kernel_contracts(node)) else None)
            if gelu_x is not None:
                quirk = self._onednn_gelu_backward(e, gelu_x, f64, d)
            else:
                quirk = self._pow_scalar_root(e, f64) if contracted is None else None
            if quirk is None and low.cuda and low.math.cuda_kernels and contracted is None:
                quirk = self._torch_cuda_kernel(e, f64)
            elif (quirk is None and contracted is None and not kern
                  and low.math.impl_on(low.cuda) == "torch_cpu"):
                # PyTorch's CPU pow_tensor_scalar_optimized_kernel runs for bf16 with
                # scalar_t = BFloat16 (PowKernel.cpp): x*x*x and 1/(x*x) round x*x to bf16,
                # in the vector body and the scalar lambda alike. fp16 takes its
                # std::pow / Vec::pow branch instead: one rounding (measured: 0 of 65,536
                # differ either way).
                quirk = self._pow_inner_rounded(e, f64, ("bfloat16",), "PowKernel.cpp")
            if (quirk is None and contracted is None and op == "log"
                    and low.torch_cpu_softmax(node) and node.attrs.get("storage_dtype")):
                # serial_vec_log_softmax_lastdim_range (LogSoftmaxKernelImpl.h): the row's
                # sum is stored in a bf16/fp16 array, its log is taken there (rounded again)
                sdt = as_dtype(node.attrs["storage_dtype"])
                rne = ROUND_MODES["nearest"]
                a = self.operand(args[0], f64)
                r1, lg, quirk = self.new(), self.new(), self.new()
                self.ins("round", f64, r1, a=a, dtype=sdt.code, mode=rne, aux=node.index + 1)
                self.ins("log", f64, lg, r1, var=var)
                self.ins("round", f64, quirk, a=lg, dtype=sdt.code, mode=rne, aux=node.index + 1)
                d.quirk = (f"the sum and its log held in {sdt.short} "
                           "(LogSoftmaxKernelImpl.h, scalar_t tmp_sum)")
            if (quirk is None and contracted is None and op == "div"
                    and low.torch_cpu_softmax(node) and not node.attrs.get("softmax_geom")):
                # _vec_softmax_lastdim: tmp_sum = 1 / tmp_sum, then x * tmp_sum
                a, b = (self.operand(x, f64) for x in args)
                one, inv, quirk = self.new(), self.new(), self.new()
                self.ins("const", f64, one, imm=1.0)
                self.ins("div", f64, inv, one, b)
                self.ins("mul", f64, quirk, a, inv)
                d.quirk = "expanded as x * (1 / sum) (SoftMaxKernel.cpp)"
            if contracted is not None:
                out, mul = contracted
                d.fma_with = mul
                low.record.decide(mul, f64).fma_into = node
            elif quirk is not None:
                out = quirk
            else:
                if op == "pow" and var & POW_DEVICE:
                    var, args = self._pow_device(e, var, d)
                regs = [self.operand(a, f64) for a in args]
                out = self.new()
                # rsqrt's scalar-loop rounding and pow's scalar lambda (double pow for a
                # float tensor and a Python exponent) need the storage dtype; the tail
                # width of PyTorch's vectorised loop rides in aux
                code = node.dtype.code if var & (RSQRT_SCALAR16 | TORCH_TAIL) else 0
                tail = low.math.torch_cpu_tail(op, dt, low.cuda, kern) if var & TORCH_TAIL else 0
                imm = (float(args[1].value) if op == "pow" and var & TORCH_TAIL
                       and isinstance(args[1], Scalar) else 0.0)  # the exponent, in double
                iimm = 0
                cols = low.softmax_columns(e) if op in ("exp", "div") else None
                if cols is not None:  # the scalar columns of _vec_softmax & co.
                    var |= TORCH_TAIL
                    tail, iimm, imm = cols
                    code = as_dtype(node.attrs["storage_dtype"]).code
                    d.variant = var
                self.ins(op, f64, out, *(regs + [-1, -1, -1])[:3], var=var, dtype=code,
                         aux=tail, imm=imm, iimm=iimm)
        tgt = low.round_target(node)
        if tgt is not None:
            r = self.new()
            self.ins("round", f64, r, a=out, dtype=tgt.code, mode=low.policy.rounding_code,
                     sat=int(low.policy.saturate), aux=node.index + 1)
            out = r
            d.round_to, d.round_mode = tgt, low.policy.rounding
            self._round_of[r] = d
        return (out, f64)

    def _reduced(self, e: Reduced) -> tuple[int, int]:
        """A reduction's row result: loaded exactly, then rounded as the policy says."""
        low = self.low
        reg, rt = self._value(e.leaf)
        node = e.node
        d = low.record.decide(node, rt)
        tgt = low.round_target(node)
        if tgt is not None:
            r = self.new()
            self.ins("round", rt, r, a=reg, dtype=tgt.code, mode=low.policy.rounding_code,
                     sat=int(low.policy.saturate), aux=node.index + 1)
            d.round_to, d.round_mode = tgt, low.policy.rounding
            self._round_of[r] = d
            reg = r
        return (reg, rt)

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
        torch_cpu = not low.cuda and low.math.impl_on(False) == "torch_cpu"
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
        import numpy as np

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
            import numpy as np

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

    def _try_fma(self, e: Elem, f64: bool):
        """a*b + c -> fma(a, b, c) when the product is not rounded and used once."""
        low = self.low

        def is_mul(a):
            return (isinstance(a, Elem) and id(a) not in self._memo
                    and low.contracts(a.node, f64, self._uses.get(id(a), 0), e.node))

        x, y = e.args
        op = e.node.op
        k = low._kernel(e.node)
        both = is_mul(x) and is_mul(y)
        right = both and k is not None and k.fused_product(low.cuda, e.node.dtype) == "right"
        if is_mul(x) and not right:
            mul, (ea, eb), ec, negate = x, x.args, y, "c"
        elif is_mul(y):
            mul, (ea, eb), ec, negate = y, y.args, x, "a"
        else:
            return None
        if (both and k is not None and op == "add" and not low.cuda
                and k.fused_product(False, e.node.dtype, tail=True)
                != k.fused_product(False, e.node.dtype)):
            w = low.math.torch_cpu_tail("", e.node.dtype.name, False, e.node.attrs["kernel"])
            if w:  # the kernel's scalar tails fuse the other product: both, then a select
                body = self.operand(ea, f64), self.operand(eb, f64)
                other = x if mul is y else y
                tail = self.operand(other.args[0], f64), self.operand(other.args[1], f64)
                ob, ot, one, out = self.new(), self.new(), self.new(), self.new()
                self.ins("fma", f64, ob, *body, self.operand(ec, f64))
                self.ins("fma", f64, ot, *tail, self.operand(mul, f64))
                self.ins("const", f64, one, imm=1.0)
                self.ins("where", f64, out, one, ob, ot, var=TORCH_TAIL, aux=w)
                low.record.decide(e.node, f64).quirk = (
                    "fma of the other product in the kernel's scalar tails")
                return out, mul.node
        tgt = low.round_target(e.node)
        # a native 16-bit fma (fma.rn.bf16/.f16): the exact a*b + c rounded once. In fp64
        # the product of two fp32 values is exact and the sum rounds once; the rounding to
        # tgt follows (the caller's rounding of the result, a tgt value, changes nothing)
        native = (low.math.fma_rounding == "storage" and f64 == F32 and tgt is not None
                  and tgt.itemsize == 2 and tgt is e.node.dtype)
        rt = F64 if native else f64
        ma, mb, c = (self.operand(a, rt) for a in (ea, eb, ec))
        if op == "sub":
            n = self.new()
            self.ins("neg", rt, n, a=c if negate == "c" else ma)
            if negate == "c":
                c = n
            else:
                ma = n
        out = self.new()
        if not native:
            self.ins("fma", f64, out, ma, mb, c)
            return out, mul.node
        wide, r = self.new(), self.new()
        self.ins("fma", F64, wide, ma, mb, c)
        self.ins("round", F64, r, a=wide, dtype=tgt.code, mode=low.policy.rounding_code,
                 sat=int(low.policy.saturate), aux=e.node.index + 1)
        self.ins("to_f32", F32, out, a=r)
        low.record.decide(e.node, f64).quirk = (
            f"fma rounded once to {tgt.short} (a native {tgt.short} fma: Math.fma_rounding)")
        return out, mul.node


# ---------------------------------------------------------------- plans

_KIND = {"in": 0, "tmp": 1, "out": 2}


class Plan:
    """A lowered graph: Programs to run, and how to bind fresh inputs to them.

    The binding and the launches run in C++ (``_C.Plan``): one call per execution."""

    def __init__(self, low: Lowering, input_tensors: list, out_shapes: list, out_dtypes: list,
                 out_tensors: list):
        base = {("in", i): t for i, t in enumerate(input_tensors)}
        for k, t in enumerate(low.temp_tensors):
            base[("tmp", k)] = t
        for k, t in enumerate(out_tensors):
            base[("out", k)] = t

        def spec(leaf: Leaf):
            b = base[leaf.src]
            t = leaf.t
            return (_KIND[leaf.src[0]], leaf.src[1], list(t.shape), list(t._strides),
                    t._offset - b._offset)

        # a Program step (prog, leaves, outs); a reduce step (None, [rows], [result], spec)
        self.steps = [(st[0], [spec(x) for x in st[1]], [spec(x) for x in st[2]]) + tuple(st[3:])
                      for st in low.steps]
        # each row step's spec and its operands' dtypes (kernel sources without a GPU)
        self.row_steps = [(st[3], [x.t._dtype_name for x in st[1] + st[2]])
                          for st in low.steps if isinstance(st[0], str)]
        self.temps = list(low.temps)
        self.out_shapes = out_shapes
        self.out_dtypes = out_dtypes
        self.device = str(low.device)
        self._c = _C.Plan(self.steps, [(list(s), d.name) for s, d in self.temps],
                          [(list(s), d.name) for s, d in zip(out_shapes, out_dtypes)],
                          self.device)
        # run() refuses outputs of another layout than the one planned for
        self._c.output_strides = [list(t._strides) for t in out_tensors]
        self.run = self._c.run  # run(inputs, outputs=[]) -> outputs


def lower(outputs: list[Node], inputs: list, policy: Policy, math: Math,
          out_dtypes: list | None = None, out_tensors: list | None = None) -> tuple[Plan, list]:
    """Lower a graph whose 'input' nodes are bound to `inputs`; returns (plan, outputs).

    `out_dtypes` overrides the output dtypes (used to observe intermediate values in
    their register precision, without an extra rounding). `out_tensors` gives the output
    tensors to plan for (any strides: copy_ writes into a view); the plan then writes
    through their own strides, and runs only with outputs of that layout."""
    device = str(outputs[0].device) if outputs else "cpu"
    low = Lowering(policy, math, device, inputs)
    if out_dtypes is None:
        out_dtypes = []
        for n in outputs:
            d = n.dtype
            if policy.output is not None and d.is_floating_point:
                d = policy.output
            out_dtypes.append(d)
    out_shapes = [n.shape for n in outputs]
    given_outs = out_tensors is not None
    if out_tensors is None:
        out_tensors = [_C.empty(list(s), d.name, device) for s, d in zip(out_shapes, out_dtypes)]
    else:
        out_tensors = list(out_tensors)
        for o, s, d in zip(out_tensors, out_shapes, out_dtypes):
            if tuple(o.shape) != tuple(s) or o._dtype_name != d.name:
                raise ValueError(f"lower: output of shape {tuple(o.shape)} and dtype "
                                 f"{o._dtype_name} given for a {d.name} result of shape {tuple(s)}")

    roots = []
    for k, n in enumerate(outputs):
        # Layout ops at the root become views of the output buffer.
        o = out_tensors[k]
        while n.op in ("reshape", "unsqueeze", "squeeze", "permute") and n.inputs[0].op != "input":
            inner = n.inputs[0]
            vop = _norm_vop(n.attrs["vop"], inner.shape)
            if n.op == "reshape":
                o = o._view_or_none(list(inner.shape))
            elif n.op == "unsqueeze":
                o = o._squeeze(vop[1])
            elif n.op == "squeeze":
                o = o._unsqueeze(vop[1]) if len(inner.shape) > len(n.shape) else o
            else:
                inv = [0] * len(vop[1])
                for i, p in enumerate(vop[1]):
                    inv[p] = i
                o = o._permute(inv)
            n = inner
        roots.append((low.hoist(low.expr(n)), Leaf(o, ("out", k)), n))

    regs: list = []
    for k, (e, out, _) in enumerate(roots):
        low.regions(e, out, 1_000_003 + k, regs)
    low.emit_grouped(regs)
    if FUSE_ROWS and not given_outs and policy.rounding != "stochastic":
        fuse_rows(low)
    plan = Plan(low, inputs, out_shapes, out_dtypes, out_tensors)
    plan.record = low.record
    return plan, out_tensors


def input_node(t, slot: int) -> Node:
    n = Node("input", (), t.shape, as_dtype(t._dtype_name), t._device_str, {"slot": slot})
    n.tensor = t
    return n


__all__ = ["lower", "Plan", "Record", "Decision", "input_node"]
