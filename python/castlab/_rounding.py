"""Rounding placement: a pure function from (graph, policy, math, device) to one
:class:`Rounding` per node: the register type its value lives in, whether the policy
rounds after it (or, in fp32, closes a kernel there), the dtype it is rounded to (None:
not rounded), why, and which of PyTorch's fused kernels it sits in.

The lowering (castlab._lower) places every rounding it inserts from this record, and keeps
it with the plan (``plan.rounding``); the trace listing, ``explain``, ``attribute`` and
``drift`` read it there instead of lowering again to ask.

>>> f = cl.jit(lambda x: cl.silu(x) * x, policy="eager")
>>> x = cl.randn(8, seed=0, dtype=cl.bfloat16)
>>> y = f(x)
>>> for r in f.graph(x).default_plan.rounding.decisions:
...     print(r)
Rounding(t-1 input f32; no rounding: an input: read as stored)
Rounding(t0 silu f32; round to bf16: policy eager rounds after silu)
Rounding(t1 mul f32; round to bf16: policy eager rounds after mul)
>>> g = cl.jit(lambda x: x * x + x, policy="fused")
>>> _ = g(x)
>>> r = g.graph(x).default_plan.rounding
>>> [(d.op, d.rounds, d.round_to, d.why) for d in r.decisions if d.op != "input"]
... # doctest: +NORMALIZE_WHITESPACE
[('mul', False, None, 'policy fused does not round after mul'),
 ('add', False, None, 'policy fused does not round after add')]
"""

from __future__ import annotations

import dataclasses

from ._device import as_device
from ._dtype import dtype, float32, float64, int64
from ._graph import COMPARE, Node
from ._optable import BACKWARD_KERNELS, F32, F64, I64
from .policy import Math, Policy

#: register type -> its name in a decision ("f32", "f64", "i64")
RT_NAME = {F32: "f32", F64: "f64", I64: "i64"}
_RT_CODE = {v: k for k, v in RT_NAME.items()}


def _int_scalar(v) -> bool:
    return isinstance(v, (bool, int))


@dataclasses.dataclass(frozen=True, eq=False)
class Rounding:
    """Where the lowering rounds one node's value. compute: its register type ("f32",
    "f64", or "i64" for integer and bool values, exact there); rounds: the policy rounds
    after it (in fp32: a kernel boundary) (Policy.rounds_after); round_to: the dtype of
    the rounding the lowering inserts after it (None: none, and `why` says why not);
    kernel: the PyTorch kernel it is a step of (node attr "kernel", None for an op of its
    own); kernel_inner: inside that kernel, which computes in op-math and rounds only its
    result, so the node is not rounded on its own."""

    node: Node
    compute: str
    rounds: bool
    round_to: dtype | None
    why: str
    kernel: str | None = None
    kernel_inner: bool = False

    @property
    def index(self) -> int:
        return self.node.index

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def register(self) -> int:
        """The register type as the instructions name it (F32, F64, I64)."""
        return _RT_CODE[self.compute]

    @property
    def kernel_source(self) -> str:
        """Where PyTorch's kernel (``kernel``) is, when castlab's op table knows it."""
        k = BACKWARD_KERNELS.get(self.kernel) if self.kernel else None
        return k.source if k is not None else ""

    def __repr__(self) -> str:
        head = f"t{self.index} {self.op} {self.compute}"
        what = f"round to {self.round_to.short}" if self.round_to is not None else "no rounding"
        return f"Rounding({head}; {what}: {self.why})"


def kernel_inner(node: Node, cuda: bool) -> bool:
    """Is this node inside one of PyTorch's fused kernels that computes in op-math on this
    device (its value is never rounded on its own)?"""
    name = node.attrs.get("kernel")
    k = BACKWARD_KERNELS.get(name) if name is not None else None
    if k is None or not node.attrs.get("kernel_inner", False):
        return False
    if node.dtype is None and isinstance(k.arith["cuda" if cuda else "cpu"], dict):
        return False  # (a Python number inside the kernel: nothing to round)
    return k.arith_for(cuda, node.dtype) == "opmath"


def register_type(node: Node, policy: Policy, of) -> int:
    """The register type of this node's value: I64 for integer and bool values (loads,
    casts to integer formats, where, comparisons of integers), which stay exact there;
    else F64 or F32. `of(node)`: the Rounding of another node (a cast's input)."""
    if node.dtype is not None and not node.dtype.is_floating_point:
        if node.op not in COMPARE or all(
                _int_scalar(a.value) if a.op == "scalar" else not a.dtype.is_floating_point
                for a in node.inputs):
            return I64
    return F64 if _f64_register(node, policy, of) else F32


def _f64_register(node: Node, policy: Policy, of) -> bool:
    if policy.compute is not None:
        return policy.compute is float64
    if node.op in ("input", "tmp"):
        return node.dtype in (float64, int64)
    if node.op in COMPARE:
        return any(a.op != "scalar" and a.dtype in (float64, int64) for a in node.inputs)
    if node.op == "astype":  # round from the input's own precision: no double rounding
        return node.dtype is float64 or of(node.inputs[0]).register == F64
    return node.dtype in (float64, int64)


def _target(node: Node, policy: Policy, rounds: bool, inner: bool, kernel) -> tuple:
    """(dtype the policy asks this node rounded to, or None; why)."""
    op, p = node.op, policy
    if op == "astype":
        if node.attrs.get("store") and p.name != "fp64":
            return node.dtype, (f"a store to a {node.dtype.short} buffer (a compiled "
                                "program's kernel writes it; the reader loads it)")
        if p.name == "fp64" or not p.round_casts:
            return None, f"a cast: policy {p.describe()} does not round casts"
        return node.dtype, f"astype to {node.dtype.short}"
    if op in COMPARE:
        return None, "a comparison: its bool result is exact"
    if op == "input":
        return None, "an input: read as stored"
    if op == "scalar":
        return None, "a Python number: converted by the op that reads it"
    if rounds:
        return node.dtype, (f"policy {p.describe()} rounds after {op}"
                            + (f" (selected inside PyTorch's {kernel} kernel)" if inner else ""))
    if inner:
        return None, (f"inside PyTorch's {kernel} kernel, which computes in op-math and "
                      "rounds only its result")
    return None, f"policy {p.describe()} does not round after {op}"


def place(node: Node, policy: Policy, cuda: bool, of) -> Rounding:
    """The Rounding of one node under `policy` on a CUDA device or not; `of(node)`: the
    Rounding of another node (the graph's record, for a cast's input)."""
    rt = register_type(node, policy, of)
    kernel = node.attrs.get("kernel")
    inner = kernel_inner(node, cuda)
    rounds = policy.rounds_after(node.index, node.op, node.attrs.get("phase"), inner)
    target, why = _target(node, policy, rounds, inner, kernel)
    if target is not None:
        if target is float64:
            target, why = None, "a float64 result: nothing to round"
        elif not target.is_floating_point or rt == I64:
            target, why = None, "an integer value: exact in an int64 register"
        elif target is float32 and rt != F64:
            target, why = None, "a float32 result computed in float32: nothing to round"
    return Rounding(node, RT_NAME[rt], rounds, target, why, kernel, inner)


class RoundingPlan:
    """The rounding placement of one graph under one policy, math and device: one
    :class:`Rounding` per node (``of(node)``; ``decisions``: those placed, by node index).
    ``place(outputs)`` places every node the outputs depend on; a node the lowering
    creates (a kernel's expansion) or one no output reads is placed when first asked, by
    the same function."""

    def __init__(self, policy: Policy, math: Math, device):
        self.policy = policy
        self.math = math
        self.device = as_device(device)
        self.cuda = self.device.is_cuda
        self._by_node: dict = {}

    def of(self, node: Node) -> Rounding:
        r = self._by_node.get(id(node))
        if r is None:
            if node.op == "astype" and node.inputs:
                self.of(node.inputs[0])
            r = self._by_node[id(node)] = place(node, self.policy, self.cuda, self.of)
        return r

    def place(self, nodes) -> RoundingPlan:
        """Place every node that `nodes` depend on (inputs first)."""
        seen: set = set()
        order: list = []
        stack = [(n, False) for n in reversed(list(nodes))]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            stack.extend((a, False) for a in reversed(n.inputs) if id(a) not in seen)
        for n in order:
            self.of(n)
        return self

    @property
    def decisions(self) -> list:
        return sorted(self._by_node.values(), key=lambda r: r.index)


def place_rounding(outputs: list, policy: Policy, math: Math, device) -> RoundingPlan:
    """The rounding placement of the graph of `outputs` (castlab._graph nodes) under
    `policy` and `math` on `device`: a :class:`RoundingPlan`."""
    return RoundingPlan(policy, math, device).place(outputs)


__all__ = ["Rounding", "RoundingPlan", "place_rounding", "place", "register_type",
           "kernel_inner", "RT_NAME"]
