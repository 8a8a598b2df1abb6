"""Lowering: graph + policy + math -> a plan of Programs the executors run.

The passes, one module each, this one driving them:
1. Rounding placement (castlab._rounding): a pure function from the graph, policy, math
   and device to one decision per node (its register type, whether and to what it is
   rounded, and why), kept with the plan (``plan.rounding``).
2. Views (castlab._lower_views): every output is expressed as a tree of expressions over
   *leaves* (strided views of inputs): view ops are pushed down to the leaves, where they
   cost nothing; concatenations are hoisted to the top, so each output splits into
   rectangular regions and every region is a pure elementwise DAG. Reductions
   (castlab._lower_reduce) become steps of their own.
3. Each region becomes one Program (castlab._lower_build): a load per leaf, one
   instruction per op, and a rounding step wherever the placement puts one; PyTorch's
   kernels are reproduced where the math asks (castlab._torch_kernels).
4. The schedule (castlab._schedule): regions of one shape share a Program; reductions
   are fused with their prologue and epilogue into row steps; Triton's tiles.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from . import _C
from ._device import as_device
from ._dtype import _BY_CODE, as_dtype, dtype, float32, float64, int64
from ._graph import EXPANSIONS, Node, expand
from ._lower_build import ProgramBuilder as ProgramBuilder
from ._lower_reduce import ReductionLowering
from ._lower_steps import ProgramStep, RowStep
from ._lower_views import Cat, Elem, Leaf, Reduced, Scalar, ViewLowering, _dtype_code
from ._lower_views import _norm_vop as _norm_vop
from ._lower_views import apply_view as apply_view
from ._optable import BACKWARD_KERNELS, F32, F64, I64, REDUCE_OPS, output
from ._rounding import RT_NAME, RoundingPlan
from ._schedule import TRITON_CONFIGS as TRITON_CONFIGS
from ._schedule import _pow2_at_least as _pow2_at_least
from ._schedule import fuse_rows, program_groups
from ._schedule import triton_config as triton_config
from ._schedule import triton_tile as triton_tile
from ._torch_kernels import TorchKernelLowering
from .policy import Math, Policy

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
    A jit plan carries it as ``plan.record``; ``trace()`` prints it. ``rounding``: the
    rounding placement (castlab._rounding) the decisions follow, one per node.

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
        # where each node is rounded (castlab._rounding): what every Decision's rounding
        # follows, and what the analyses read
        self.rounding = RoundingPlan(policy, math, device)

    @property
    def decisions(self) -> list:
        return sorted(self._by_node.values(), key=lambda d: d.index)

    def of(self, node: Node) -> Decision | None:
        return self._by_node.get(id(node))

    def decide(self, node: Node, rt: int) -> Decision:
        d = self._by_node.get(id(node))
        if d is None:
            d = self._by_node[id(node)] = Decision(node, RT_NAME[int(rt)])
        return d


# ---------------------------------------------------------------- expressions
class Lowering(ViewLowering, ReductionLowering, TorchKernelLowering):
    """Builds expressions and regions for one graph under one policy and math: the
    expressions and views (ViewLowering), the reductions (ReductionLowering) and PyTorch's
    kernels (TorchKernelLowering) are in their own modules."""

    def __init__(self, policy: Policy, math: Math, device, inputs: list):
        self.policy = policy
        self.math = math
        self.device = as_device(device)   # the graph's device: temporaries and outputs
        self.cuda = self.device.is_cuda
        self.inputs = inputs          # concrete tensors bound to 'input' nodes
        self.temps: list = []         # (shape, dtype) of temporaries
        self.temp_tensors: list = []
        self.steps: list = []         # castlab._lower_steps records, in execution order
        self.reduce_decisions: dict = {}  # id(reduce step) -> its node's Decision
        self._expr_memo: dict = {}
        self._view_memo: dict = {}
        self._hoist_memo: dict = {}
        self.record = Record(policy, math, self.device)  # what was decided, per node

    # -- value types and rounding (castlab._rounding's placement) ----------------------
    @property
    def rounding(self) -> RoundingPlan:
        """The rounding placement of this graph: one decision per node."""
        return self.record.rounding

    def vt64(self, node: Node) -> bool:
        """Does this node's value live in a double register?"""
        return self.vt(node) == F64

    def vt(self, node: Node) -> int:
        """The register type of this node's value: I64 for integer and bool values
        (loads, casts to integer formats, where, comparisons of integers), which stay
        exact there; else F64 or F32."""
        return self.record.rounding.of(node).register

    def round_target(self, node: Node) -> dtype | None:
        """The dtype the placement rounds this node's value to (None: not rounded)."""
        return self.record.rounding.of(node).round_to

    def kernel_inner(self, node: Node) -> bool:
        """Is this node inside one of PyTorch's fused backward kernels that computes in
        op-math on this device (its value is never rounded on its own)?"""
        return self.record.rounding.of(node).kernel_inner

    def _kernel(self, node: Node):
        k = node.attrs.get("kernel")
        return BACKWARD_KERNELS[k] if k is not None else None

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
        return not self.record.rounding.of(mul).rounds and self.round_target(mul) is None

    def contracts_division(self, div: Node, f64: bool, uses: int) -> bool:
        """Does this approximate division contract into the add/sub that uses it? ptxas
        expands Triton's ``/`` (div.full.f32) into a product by the divisor's reciprocal
        and contracts that product as any other (Liger's ``sum / n_cols + eps``: measured
        on an H100, every row equals fma(s, rcp(n), eps)). Same conditions as a product:
        contraction on, one use, neither rounded nor a kernel boundary."""
        if (div.op != "div" or uses != 1 or not self.cuda or f64 or self.vt64(div)
                or self.math.division != "approx" or not self.math.fma):
            return False
        return not self.record.rounding.of(div).rounds and self.round_target(div) is None

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

    def _temp_from(self, e, shape: tuple, dt: dtype) -> Leaf:
        k = len(self.temps)
        self.temps.append((tuple(shape), dt))
        t = _C.empty(list(shape), dt.name, str(self.device))
        self.temp_tensors.append(t)
        self.emit_regions(self.hoist(e), Leaf(t, ("tmp", k)), out_meta=None)
        return Leaf(t, ("tmp", k))

    # -- kernel nodes ---------------------------------------------------------------
    def _expand(self, node: Node) -> Node:
        """A kernel node (var, layer_norm) as the nodes it computes under this lowering's
        order of accumulation (castlab._graph.expand)."""
        order = self.math.reduction_order(self.cuda)
        key = ("expand", id(node), order)
        r = self._expr_memo.get(key)
        if r is None:
            ctx = _ExpandContext(self, node, order)
            r, new = expand(node, ctx)
            self._expr_memo[key] = r
            self.record.expansions[id(node)] = [m for m in new if m is not r] + [r]
            how = ctx.how or ("PyTorch's Welford kernel" if order in ("torch_cpu", "torch_cuda")
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

    # -- programs -------------------------------------------------------------------
    def emit_regions(self, e, out: Leaf, out_meta):
        self.emit_grouped(self.regions(e, out, out_meta, []))

    def emit_grouped(self, regs: list):
        """One Program per group of regions of equal shape: RoPE's two halves (and several
        outputs of one shape) become one kernel that reads each input element once.
        Stochastic rounding keeps one Program per region, since its random stream is
        indexed by the position in the Program's first output."""
        for g in program_groups(regs, self.policy.rounding == "stochastic"):
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
        self.steps.append(ProgramStep(prog, b.leaves, outs))


class _ExpandContext:
    """What a kernel expansion may ask the lowering: the order, the device, whether
    PyTorch would see the operands aligned."""

    def __init__(self, low: Lowering, node: Node, order: str):
        self.order = order
        self.cuda = low.cuda
        self.math = low.math
        self.attrs: dict = {}  # set by the expansion: attrs of every node it records
        self.how: str | None = None  # set by the expansion: how it computes, for the trace
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


#: Fuse reductions with their prologue and epilogue (row steps, castlab._schedule.fuse_rows):
#: "auto" where it was measured faster (on a GPU, runs whose sums are in NumPy's pairwise
#: order and max/min: benchmarks/RESULTS.md), True always, False never (tests check that
#: fusing changes no bit; benchmarks measure what it gains). The environment variable
#: CASTLAB_FUSE_ROWS=1 / 0 sets it to True / False when castlab is imported (test runs in
#: worker processes).
FUSE_ROWS: bool | str = {"1": True, "0": False}.get(os.environ.get("CASTLAB_FUSE_ROWS", ""),
                                                   "auto")


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

        # the steps (castlab._lower_steps records) with their leaves and outputs bound
        self.steps = [st._replace(leaves=[spec(x) for x in st.leaves],
                                  outs=[spec(x) for x in st.outs]) for st in low.steps]
        # each row step's spec and its operands' dtypes (kernel sources without a GPU)
        self.row_steps = [(st.spec, [x.t._dtype_name for x in st.leaves + st.outs])
                          for st in low.steps if isinstance(st, RowStep)]
        self.record = low.record  # what the lowering decided, per node
        self.rounding = low.record.rounding  # where it rounds, per node (castlab._rounding)
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


_depth_lock = threading.Lock()
_depth_users = 0
_depth_saved = 0


@contextlib.contextmanager
def _recursion_for(outputs: list[Node]):
    """The lowering walks expressions recursively (a few frames per node of the longest
    chain). A graph of thousands of nodes in one chain (a block sum written out, e.g. vLLM's
    RMSNorm at hidden 131,072) needs more than Python's default 1,000 frames: raise the
    limit for as long as any thread lowers such a graph, then put it back."""
    global _depth_users, _depth_saved
    seen: set = set()
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.inputs)
    want = 1000 + 8 * len(seen)
    with _depth_lock:
        if _depth_users == 0:
            _depth_saved = sys.getrecursionlimit()
        _depth_users += 1
        if want > sys.getrecursionlimit():
            sys.setrecursionlimit(want)
    try:
        yield
    finally:
        with _depth_lock:
            _depth_users -= 1
            if _depth_users == 0:
                sys.setrecursionlimit(_depth_saved)


def lower(outputs: list[Node], inputs: list, policy: Policy, math: Math,
          out_dtypes: list | None = None, out_tensors: list | None = None) -> tuple[Plan, list]:
    """Lower a graph whose 'input' nodes are bound to `inputs`; returns (plan, outputs).

    `out_dtypes` overrides the output dtypes (used to observe intermediate values in
    their register precision, without an extra rounding). `out_tensors` gives the output
    tensors to plan for (any strides: copy_ writes into a view); the plan then writes
    through their own strides, and runs only with outputs of that layout."""
    with _recursion_for(outputs):
        return _lower(outputs, inputs, policy, math, out_dtypes, out_tensors)


def _lower(outputs: list[Node], inputs: list, policy: Policy, math: Math,
           out_dtypes: list | None, out_tensors: list | None) -> tuple[Plan, list]:
    device = str(outputs[0].device) if outputs else "cpu"
    low = Lowering(policy, math, device, inputs)
    low.rounding.place(outputs)  # the rounding placement of the whole graph, first
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
        n, o = _root_view(n, out_tensors[k])
        roots.append((low.hoist(low.expr(n)), Leaf(o, ("out", k)), n))

    regs: list = []
    for k, (e, out, _) in enumerate(roots):
        low.regions(e, out, 1_000_003 + k, regs)
    low.emit_grouped(regs)
    if FUSE_ROWS and not given_outs and policy.rounding != "stochastic":
        fuse_rows(low, FUSE_ROWS)
    plan = Plan(low, inputs, out_shapes, out_dtypes, out_tensors)
    return plan, out_tensors


def _root_view(n: Node, o) -> tuple:
    """(node, output view): layout ops at the root become views of the output buffer."""
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
    return n, o


def input_node(t, slot: int) -> Node:
    n = Node("input", (), t.shape, as_dtype(t._dtype_name), t._device_str, {"slot": slot})
    n.tensor = t
    return n


__all__ = ["lower", "Plan", "Record", "Decision", "input_node", "ProgramBuilder", "Lowering"]
