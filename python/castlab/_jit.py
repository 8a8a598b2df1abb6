"""Tracing: ``castlab.jit`` records a Python function of tensors as a graph, then runs
that graph under any policy and math variant.

>>> import castlab as cl
>>> @cl.jit
... def swiglu(x):
...     a, b = cl.chunk(x, 2, dim=-1)
...     return cl.silu(a) * b
>>> x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
>>> y_fused = swiglu(x)                          # fp32 inside, one rounding
>>> y_eager = swiglu.run(x, policy="eager")      # rounds after every op
>>> print(swiglu.trace(x, policy="eager"))       # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from . import _C
from ._creation import asarray
from ._dtype import as_dtype, float32, float64
from ._graph import COMPARE, Node, Proxy, _state
from ._lower import Lowering, input_node, lower
from .policy import Math, Policy, as_math, as_policy

__all__ = ["jit", "JitFunction", "Trace"]

Tensor = _C.Tensor


def _debug() -> bool:
    return os.environ.get("CASTLAB_DEBUG", "") not in ("", "0")


class Traced:
    """One recorded graph (for one input signature)."""

    def __init__(self, name, nodes, inputs, captured, captured_nodes, outputs, structure):
        self.name = name
        self.nodes = nodes
        self.inputs = inputs                    # input nodes, by argument position
        self.captured = captured                # tensors the function closed over
        self.captured_nodes = captured_nodes
        self.outputs = outputs                  # output nodes
        self.structure = structure              # "single" | "tuple" | "list"
        self.plans: dict = {}
        self.default_plan = None  # the plan under the jit's own policy and math


def _signature(tensors: list) -> bytes:
    return _C.signature(tensors)


class JitFunction:
    """A traced-and-fused function. Call it to run the graph under its policy and math;
    ``.run(..., policy=, math=)`` runs the same graph under others; ``.trace(...)``
    returns the readable listing."""

    def __init__(self, fn: Callable, policy: Any = "fused", math: Any = "torch_eager"):
        self.fn = fn
        self.policy = as_policy(policy)
        self.math = as_math(math)
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    # -- tracing ---------------------------------------------------------------------
    def _bind(self, args) -> list:
        out = []
        for a in args:
            if isinstance(a, Tensor):
                out.append(a)
            elif isinstance(a, (bool, int, float)):
                raise TypeError("castlab.jit functions take tensors; pass Python numbers "
                                "through a closure or functools.partial")
            else:
                out.append(asarray(a))  # NumPy / DLPack producers, without copying
        return out

    def _traced(self, tensors: list) -> Traced:
        sig = _signature(tensors)
        tr = self._cache.get(sig)
        if tr is None:
            tr = self._record(tensors)
            self._cache[sig] = tr
        return tr

    def _record(self, tensors: list) -> Traced:
        if _state.graph is not None:
            raise RuntimeError("nested castlab.jit tracing is not supported")
        nodes: list = []
        _state.graph = nodes
        _state.captured = []
        _state.captured_nodes = []
        _state.n_inputs = len(tensors)
        try:
            inputs = []
            for i, t in enumerate(tensors):
                n = input_node(t, i)
                n.index = -1
                inputs.append(n)
            result = self.fn(*[Proxy(n) for n in inputs])
            captured = list(_state.captured)
            captured_nodes = list(_state.captured_nodes)
        finally:
            _state.graph = None
            _state.captured = []
            _state.captured_nodes = []
        structure = "single"
        if isinstance(result, tuple):
            structure, outs = "tuple", list(result)
        elif isinstance(result, list):
            structure, outs = "list", list(result)
        else:
            outs = [result]
        out_nodes = []
        for o in outs:
            if isinstance(o, Proxy):
                out_nodes.append(o.node)
            elif isinstance(o, Tensor):
                idx = next((i for i, t in enumerate(tensors) if t is o), None)
                if idx is None:
                    n = input_node(o, len(tensors) + len(captured))
                    captured.append(o)
                    captured_nodes.append(n)
                    out_nodes.append(n)
                else:
                    out_nodes.append(inputs[idx])
            else:
                raise TypeError(f"a castlab.jit function must return tensors, got {type(o).__name__}")
        tr = Traced(getattr(self.fn, "__name__", "fn"), nodes, inputs, captured, captured_nodes,
                    out_nodes, structure)
        tr.arg_names = _arg_names(self.fn, len(tensors))
        if _debug():
            print(format_trace(tr, self.policy, self.math))
        return tr

    # -- running ---------------------------------------------------------------------
    def run(self, *args, policy: Any = None, math: Any = None):
        """Run the traced graph under `policy` and `math` (defaults: the jit's own)."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        tensors = self._bind(args)
        tr = self._traced(tensors)
        all_inputs = tensors + tr.captured
        key = (pol, mth)
        plan = tr.plans.get(key)
        if plan is None:
            plan, outs = lower(tr.outputs, all_inputs, pol, mth)
            tr.plans[key] = plan
            if pol is self.policy and mth is self.math:
                tr.default_plan = plan
            if _debug():
                print(format_trace(tr, pol, mth))
                for k, (prog, _, _) in enumerate(plan.steps):
                    print(f"# program {k}\n{prog}")
            plan.run(all_inputs, outs)
        else:
            outs = plan.run(all_inputs)
        if tr.structure == "single":
            return outs[0]
        return tuple(outs) if tr.structure == "tuple" else list(outs)

    def __call__(self, *args):
        # Fast path: a cached graph and plan for this signature under the jit's own
        # policy and math: one dict lookup and one C++ call.
        if all(type(a) is Tensor for a in args):
            tensors = list(args)
            tr = self._cache.get(_C.signature(tensors))
            if tr is not None and tr.default_plan is not None and not tr.captured:
                outs = tr.default_plan.run(tensors)
                if tr.structure == "single":
                    return outs[0]
                return tuple(outs) if tr.structure == "tuple" else list(outs)
        return self.run(*args)

    def trace(self, *args, policy: Any = None, math: Any = None) -> Trace:
        """The readable listing of the graph under `policy` and `math`: one line per op,
        every widening and rounding the policy inserts shown as ``convert``."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        tr = self._traced(self._bind(args))
        return Trace(format_trace(tr, pol, mth))

    def node_values(self, *args, policy: Any = None, math: Any = None) -> list:
        """The value of every op node of the trace under `policy`/`math`, exactly as the
        graph computes it (after the policy's rounding, before any output rounding):
        a list of (node, tensor) with each tensor in its register precision (fp32 or
        fp64), so nothing is rounded for the observation. Input nodes come first.

        Note: each node is computed by its own plan; with FMA contraction on, a product
        that feeds several ops may contract differently than in the whole graph."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        tensors = self._bind(args)
        tr = self._traced(tensors)
        all_inputs = tensors + tr.captured
        low = Lowering(pol, mth, None, [])  # (only for vt64: the device does not matter)
        out = [(n, t) for n, t in zip(tr.inputs, tensors)]
        for n in tr.nodes:
            if n.op in ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze"):
                continue
            if n.op == "cat":
                dt = float64 if any(low.vt64(p) for p in n.inputs if p.op != "scalar") else float32
            elif n.op in COMPARE:
                dt = n.dtype
            else:
                dt = float64 if low.vt64(n) else float32
            plan, outs = lower([n], all_inputs, pol, mth, out_dtypes=[dt])
            plan.run(all_inputs, outs)
            out.append((n, outs[0]))
        return out

    def graph(self, *args) -> Traced:
        """The recorded graph for these inputs (nodes, inputs, outputs)."""
        return self._traced(self._bind(args))

    def __repr__(self) -> str:
        return f"<castlab.jit {getattr(self.fn, '__name__', 'fn')} policy={self.policy.describe()} math={self.math.name}>"


def _arg_names(fn: Callable, n: int) -> list:
    import inspect

    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n and len(set(params[:n])) == n:
        return params[:n]
    return ["x"] if n == 1 else [f"x{i}" for i in range(n)]


class Trace(str):
    """A trace listing (a str), shown in a fixed-width font in Jupyter."""

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"

    def __repr__(self) -> str:
        return str(self)


def jit(fn: Callable | None = None, *, policy: Any = "fused", math: Any = "torch_eager"):
    """Trace `fn` on its first call for each input signature (shapes, dtypes, strides,
    device) and run the graph fused from then on.

    >>> swiglu = cl.jit(lambda a, b: cl.silu(a) * b, policy="fused", math="inductor")
    """
    if fn is None:
        return lambda f: JitFunction(f, policy=policy, math=math)
    return JitFunction(fn, policy=policy, math=math)


# ---------------------------------------------------------------- trace listing

def _fmt_type(dt, shape) -> str:
    return f"{dt.short}[{', '.join(str(s) for s in shape)}]"


def _vop_args(node: Node) -> str:
    v = node.attrs["vop"]
    k = v[0]
    if k == "slice":
        _, d, a, b, s = v
        b = "" if b >= 2**62 else b
        return f"dim={d}, {a}:{b}" + (f":{s}" if s != 1 else "")
    if k == "select":
        return f"dim={v[1]}, index={v[2]}"
    if k in ("permute", "expand", "reshape"):
        return str(list(v[1]))
    return f"dim={v[1]}"


def format_trace(tr: Traced, policy: Policy, math: Math) -> str:
    """Render a traced graph under a policy, Thunder style."""
    low = Lowering(policy, math, tr.outputs[0].device if tr.outputs else None, [])
    cuda = low.cuda
    names: dict = {}
    lines: list = []
    # Names: graph node k is t{k} (the index that Policy(round_after=...) takes); a value
    # widened or rounded to another dtype gets that dtype as a suffix (t2_bf16).

    def emit(lhs, rhs, comment=""):
        s = f"  {lhs} = {rhs}"
        if comment:
            s = s.ljust(44) + "  # " + comment
        lines.append(s)

    arg_names = []
    arg_decl: list = []
    arg_names = getattr(tr, "arg_names", None) or _arg_names(lambda: None, len(tr.inputs))
    for i, n in enumerate(tr.inputs):
        nm = arg_names[i]
        names[id(n)] = nm
        arg_decl.append(f"{nm}: {_fmt_type(n.dtype, n.shape)}")
    for i, n in enumerate(tr.captured_nodes):
        nm = f"c{i}"
        names[id(n)] = nm
        arg_decl.append(f"{nm}: {_fmt_type(n.dtype, n.shape)} (captured)")
    header = (f"# castlab trace: policy={policy.describe()}  math={math.name}"
              f"  device={'cuda' if cuda else 'cpu'}")
    lines.append(header)
    lines.append(f"def {tr.name}({', '.join(arg_decl)}):")

    # representation of each value: ("st", dtype) in storage precision, ("cp", dtype) in compute
    rep: dict = {}
    conv: dict = {}
    for n in tr.inputs + tr.captured_nodes:
        rep[id(n)] = ("st", n.dtype)

    def comp_dt(node) -> Any:
        return float64 if low.vt64(node) else float32

    def operand(a: Node, cdt) -> str:
        if a.op == "scalar":
            return repr(a.value)
        nm = names[id(a)]
        kind, dt = rep[id(a)]
        if dt is cdt or (kind == "cp" and dt is cdt):
            return nm
        if dt is float64 and cdt is float32 or dt is not cdt:
            key = (id(a), cdt.name)
            if key not in conv:
                t = f"{nm}_{cdt.short}"
                what = "widen, exact" if (dt.bits < cdt.bits) else "round to nearest even"
                emit(t, f"convert({nm}, {cdt.short})", what)
                conv[key] = t
            return conv[key]
        return nm

    rounding = {"nearest": "round to nearest even", "toward_zero": "round toward zero",
                "stochastic": f"stochastic rounding, seed={policy.seed}"}[policy.rounding]
    users: dict = {}
    for n in tr.nodes:
        for a in n.inputs:
            users[id(a)] = users.get(id(a), 0) + 1

    for n in tr.nodes:
        if n.op in ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze"):
            t = f"t{n.index}"
            names[id(n)] = t
            rep[id(n)] = rep[id(n.inputs[0])]
            emit(t, f"{n.op}({names[id(n.inputs[0])]}, {_vop_args(n)})",
                 f"{_fmt_type(rep[id(n)][1] if rep[id(n)][0] == 'cp' else n.dtype, n.shape)}  view")
            continue
        if n.op == "cat":
            cdt = max((rep[id(p)][1] for p in n.inputs), key=lambda d: d.bits)
            parts = [operand(p, cdt) if rep[id(p)][1] is not cdt else names[id(p)] for p in n.inputs]
            t = f"t{n.index}"
            names[id(n)] = t
            kinds = {rep[id(p)][0] for p in n.inputs}
            rep[id(n)] = ("st", n.dtype) if kinds == {"st"} and cdt is n.dtype else ("cp", cdt)
            emit(t, f"cat([{', '.join(parts)}], dim={n.attrs['dim']})",
                 f"{_fmt_type(rep[id(n)][1], n.shape)}  data movement, exact")
            continue
        cdt = comp_dt(n)
        if n.op == "astype":
            src = operand(n.inputs[0], cdt)
            tgt = low.round_target(n)
            t = f"t{n.index}"
            names[id(n)] = t
            if tgt is not None:
                emit(t, f"convert({src}, {tgt.short})", f"astype: {rounding}")
                rep[id(n)] = ("st", tgt)
            else:
                emit(t, f"astype({src}, {n.dtype.short})",
                     "kept exact (fp64 policy)" if policy.name == "fp64" else "no rounding")
                rep[id(n)] = ("cp", cdt)
            continue
        args = [operand(a, cdt) for a in n.inputs]
        t = f"t{n.index}"
        names[id(n)] = t
        out_dt = n.dtype if n.op in COMPARE else cdt
        note = [_fmt_type(out_dt, n.shape)]
        desc = math.describe_op(n.op, cuda)
        if desc:
            note.append(desc)
        if n.op in ("add", "sub"):
            for a in n.inputs:
                if low.contracts(a, low.vt64(n), users.get(id(a), 0)):
                    note.append(f"fma-contracted with {names[id(a)]}")
                    break
        opname = {"gelu": "gelu", "gelu_tanh": "gelu_tanh"}.get(n.op, n.op)
        emit(t, f"{opname}({', '.join(args)})", "  ".join(note))
        rep[id(n)] = ("st", n.dtype) if n.op in COMPARE else ("cp", cdt)
        tgt = low.round_target(n)
        if tgt is not None:
            r = f"{t}_{tgt.short}"
            emit(r, f"convert({t}, {tgt.short})", rounding)
            names[id(n)] = r
            rep[id(n)] = ("st", tgt)

    rets = []
    for n in tr.outputs:
        want = n.dtype
        if policy.output is not None and want.is_floating_point:
            want = policy.output
        kind, dt = rep[id(n)]
        nm = names[id(n)]
        if dt is not want:
            t = f"{nm}_{want.short}"
            emit(t, f"convert({nm}, {want.short})",
                 f"output: {rounding}" if want.bits < dt.bits else "output: widen, exact")
            nm = t
        rets.append(nm)
    lines.append("  return " + ", ".join(rets))
    return "\n".join(lines)


_ = (as_dtype,)
