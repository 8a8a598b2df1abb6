"""A captured FX graph split into castlab regions and external PyTorch nodes (``partition``):
which nodes castlab can run, where each came from in the user's code, and the function a
region becomes."""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .. import _graph
from .._jit import JitFunction
from . import _aten


class CaptureError(RuntimeError):
    """PyTorch could not capture the forward, or castlab cannot run one of its ops."""


def _export_error(name: str, e: Exception) -> CaptureError:
    """What capture raises when torch.export fails on `name` with `e`: torch's own message
    (the first lines and the user's line it names), and what it means."""
    lines = str(e).strip().splitlines()
    head = lines[:6]
    for i, ln in enumerate(lines):  # the user's line torch names
        if ln.strip().startswith("File \"") and i >= 6:
            head += lines[i:i + 2]
    head = "\n".join(head)
    m = re.search(r"Found <class '([^']+)'> in output", str(e))
    if m:  # an output torch.export cannot flatten (a Hugging Face KV cache, for one)
        hint = (" A Hugging Face model returns its KV cache unless called with "
                "kwargs={'use_cache': False}." if m.group(1).endswith("Cache") else "")
        return CaptureError(
            f"castlab.torch.capture: {name} returns a {m.group(1)}, which torch.export "
            f"cannot flatten into tensors: return tensors (or tuples, lists or dicts of "
            f"them).{hint}")
    return CaptureError(
        f"castlab.torch.capture: torch.export could not capture {name} as one static "
        f"graph ({type(e).__name__}). Data-dependent control flow (an `if` on a tensor's "
        f"value), graph breaks and dynamic shapes are not supported. PyTorch said:\n"
        f"{head}")


def _wrap(fn: Callable) -> torch.nn.Module:
    if isinstance(fn, torch.nn.Module):
        return fn

    # torch.export keeps only the stack frames of `forward` methods (and registered
    # anchors) in each node's recorded stack: register the user's function too, so its
    # lines are the ones castlab shows (private hook: skipped where torch lacks it)
    anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if anchor is not None:
        anchor(fn)

    class Fn(torch.nn.Module):
        def forward(self, *a, **k):
            return fn(*a, **k)
    return Fn()


_SKIP = ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
         "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg")


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _where(node) -> tuple | None:
    """(file, line, source text) of the user's code that made FX node `node`: the
    innermost frame of its recorded stack trace."""
    st = node.meta.get("stack_trace")
    if not st:
        return None
    lines = st.rstrip().splitlines()
    fallback = None
    for i in range(len(lines) - 1, -1, -1):
        s = lines[i].strip()
        if s.startswith("File \""):
            try:
                fname = s.split("\"")[1]
                lineno = int(s.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                return None
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if _graph._in_package(fname):
                continue  # castlab's wrapper of a plain function
            if fname.startswith(_TORCH_DIR):  # torch.nn's modules: the user's call, if known
                fallback = fallback or (fname, lineno, code)
                continue
            return (fname, lineno, code)
    return fallback


def where_text(node) -> str:
    """``file.py:LINE`` of the user code behind an FX node ("" when unknown)."""
    w = _where(node)
    return f"{os.path.basename(w[0])}:{w[1]}" if w else ""


def module_path(node) -> str:
    """The dotted path of the innermost ``nn.Module`` that ran the node ("" at the top)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


def _short_type(v) -> str:
    if isinstance(v, torch.Tensor):
        name = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
                torch.float64: "f64", torch.int64: "i64", torch.int32: "i32",
                torch.bool: "bool"}.get(v.dtype, str(v.dtype).replace("torch.", ""))
        return f"{name}[{', '.join(str(s) for s in v.shape)}]"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_short_type(x) for x in v) + ")"
    return type(v).__name__


class Segment:
    """One step of a captured program: ``kind`` is "region" (castlab computes
    ``nodes``, a ``castlab.jit`` function ``jit``), "external" (one ATen op run by
    PyTorch) or "view" (a view or tuple item taken in PyTorch: exact)."""

    def __init__(self, kind: str, nodes: list):
        self.kind = kind
        self.nodes = nodes
        self.inputs: list = []      # region: FX nodes read from outside, in order
        self.outputs: list = []     # region: FX nodes used outside
        self.jit: JitFunction | None = None
        self.maps: dict = {}        # region: id(first input node) -> {fx name: castlab node}
        self.io: tuple | None = None  # region: (input names, made by PyTorch, output layouts)

    def __repr__(self) -> str:
        names = ", ".join(n.name for n in self.nodes[:4]) + (", ..." if len(self.nodes) > 4 else "")
        return f"Segment({self.kind}: {names})"


def _arg_nodes(n) -> list:
    out: list = []
    pytree.tree_map(lambda a: out.append(a) if isinstance(a, torch.fx.Node) else None,
                    (n.args, n.kwargs))
    return out


def _subst(a: Any, env: dict) -> Any:
    return pytree.tree_map(lambda x: env[x.name] if isinstance(x, torch.fx.Node) else x, a)


def _getter(a: Any, leaf: Callable | None = None, const: Callable | None = None) -> Callable:
    """env -> `a` with every FX node replaced by its value: _subst's result, with the
    structure walked once when the program is built instead of on every run (a captured
    24-layer model binds ~1,000 nodes per run). `leaf`: node name -> its getter (default
    env[name]); `const`: applied once to each part of `a` that holds no node."""
    if isinstance(a, torch.fx.Node):
        name = a.name
        return leaf(name) if leaf is not None else (lambda env: env[name])
    if isinstance(a, (list, tuple)) and any(_has_node(b) for b in a):
        gs = [_getter(b, leaf, const) for b in a]
        kind = type(a) if type(a) in (list, tuple) else list
        return lambda env: kind([g(env) for g in gs])
    if isinstance(a, dict) and any(_has_node(b) for b in a.values()):
        gd = {k: _getter(b, leaf, const) for k, b in a.items()}
        return lambda env: {k: g(env) for k, g in gd.items()}
    c = a if const is None else const(a)
    return lambda env: c


def _has_node(a: Any) -> bool:
    if isinstance(a, torch.fx.Node):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_node(b) for b in a)
    if isinstance(a, dict):
        return any(_has_node(b) for b in a.values())
    return False


def _subst_nominal(a: Any, env: dict) -> Any:
    """Like _subst, with every floating value in the dtype PyTorch gives that node."""
    def get(x):
        v = env[x.name]
        meta = x.meta.get("val")
        if isinstance(v, torch.Tensor) and isinstance(meta, torch.Tensor) and v.dtype != meta.dtype:
            return v.to(meta.dtype)
        return v
    return pytree.tree_map(lambda x: get(x) if isinstance(x, torch.fx.Node) else x, a)


def _check_external(n) -> None:
    """An op castlab hands to PyTorch must be one PyTorch can call again as a function:
    an ATen op without side effects (no in-place, out= or random ops)."""
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        if t._schema.is_mutable or (torch.Tag.nondeterministic_seeded in t.tags
                                    and not _no_randomness(n)):
            raise CaptureError(
                f"castlab.torch.capture: {t} at {where_text(n) or n.name} mutates its "
                "inputs or draws random numbers; castlab can neither map it nor run it again "
                "as an external PyTorch node (capture the model in eval() mode and without "
                "in-place updates)")
        return
    if t is operator.getitem:
        return
    raise CaptureError(
        f"castlab.torch.capture: {getattr(t, '__name__', t)} at {where_text(n) or n.name} "
        "is not an ATen op (a higher-order op such as torch.cond, or a Python call): "
        "castlab can neither map it nor run it as an external PyTorch node")


_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _check_static(n) -> None:
    """The first node whose result has a size known only at run time (boolean-mask
    indexing, nonzero, ...) is a clear error: castlab captures static shapes."""
    v = n.meta.get("val")
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if any(isinstance(x, _SYM) or (isinstance(x, torch.Tensor)
                                   and any(isinstance(s, _SYM) for s in x.shape))
           for x in vals):
        op = "getitem" if n.target is operator.getitem else str(n.target)
        raise CaptureError(
            f"castlab.torch.capture: {op} at {where_text(n) or n.name} gives a result whose "
            "size depends on the data (dynamic shapes, e.g. boolean-mask indexing or "
            "nonzero); castlab captures static shapes only")


def _no_randomness(n) -> bool:
    """A seeded op called so that it draws nothing: dropout probability 0 (attention in
    eval mode) or train=False."""
    vals = {}
    for k, a in enumerate(n.target._schema.arguments):
        if k < len(n.args):
            vals[a.name] = n.args[k]
        elif a.name in n.kwargs:
            vals[a.name] = n.kwargs[a.name]
        elif a.has_default_value():
            vals[a.name] = a.default_value
    if "train" in vals:
        return vals["train"] is False
    p = vals.get("dropout_p", vals.get("p"))
    return p is not None and p == 0


def partition(nodes: list, given: frozenset = frozenset(),
              kernels: dict | None = None) -> list[Segment]:
    """Split the graph's op nodes into segments (see the module docstring). `given`: names
    of nodes whose value is supplied from outside (drift substitutes reference values).
    `kernels`: node name -> None for the nodes a library kernel computes instead, or its
    "kernel" segment at the node where it runs (placed as an external node is)."""
    kernels = kernels or {}
    segs: list[Segment] = []
    region: Segment | None = None
    in_region: set = set()
    users: dict = {}

    def close():
        nonlocal region
        if region is not None:
            segs.append(region)
            region = None
            in_region.clear()

    for n in nodes:
        if n.op != "call_function" or n.name in given:
            continue
        if n.name in kernels:
            k = kernels[n.name]
            if k is not None:
                if any(d.name in in_region for d in k.inputs):
                    close()
                segs.append(k)
            continue
        name = str(n.target)
        if name in _SKIP:
            continue
        _check_static(n)
        deps = _arg_nodes(n)
        reads_region = any(d.name in in_region for d in deps)
        kind = None
        if n.target is operator.getitem:
            kind = "region" if reads_region else "view"
        elif _aten.can_map(n):
            view = _aten.ATEN[name][0] == "view"
            kind = "view" if view and not reads_region else "region"
        if kind == "region":
            if region is None:
                region = Segment("region", [])
            region.nodes.append(n)
            in_region.add(n.name)
            continue
        if kind is None:
            _check_external(n)
            kind = "external"
        if reads_region:
            close()
        segs.append(Segment(kind, [n]))
    close()
    # region inputs and outputs
    for s in segs:
        for n in s.nodes:
            for d in _arg_nodes(n):
                users.setdefault(d.name, set()).add(id(s))
    outs = {a.name for a in _arg_nodes(nodes[-1])} if nodes and nodes[-1].op == "output" else set()
    for s in segs:
        if s.kind != "region":
            continue
        mine = {n.name for n in s.nodes}
        seen: set = set()
        for n in s.nodes:
            for d in _arg_nodes(n):
                if d.name not in mine and d.name not in seen:
                    seen.add(d.name)
                    s.inputs.append(d)
        s.outputs = [n for n in s.nodes
                     if n.name in outs or users.get(n.name, set()) - {id(s)}]
        s.jit = JitFunction(_region_function(s), policy="fused", math="torch_eager")
    return [s for s in segs if s.kind != "region" or s.outputs]  # (unused values: dead)


def _region_function(seg: Segment) -> Callable:
    """The Python function castlab.jit traces for a region: replays its ATen nodes with
    castlab's op functions, each recorded at the user's source line."""
    nodes, outputs = seg.nodes, seg.outputs
    input_names = [n.name for n in seg.inputs]

    def region(*xs):
        env = dict(zip(input_names, xs))
        mapping: dict = {}
        st = _graph._state
        try:
            for n in nodes:
                st.where = _where(n)
                args, kwargs = _subst(list(n.args), env), _subst(dict(n.kwargs), env)
                if n.target is operator.getitem:
                    v = args[0][args[1]]
                else:
                    v = _aten.build(n, args, kwargs)
                env[n.name] = v
                if isinstance(v, _graph.Proxy):
                    mapping[n.name] = v.node
        finally:
            st.where = None
        if xs:
            seg.maps[id(xs[0].node)] = mapping
        return tuple(env[o.name] for o in outputs)

    region.__name__ = region.__qualname__ = f"region_{nodes[0].name}"
    region._castlab_arg_names = lambda k: input_names[:k]
    region._castlab_unguarded = True  # its closure and globals are fixed at capture
    return region


def _op_name(n) -> str:
    t = n.target
    return "getitem" if t is operator.getitem else str(t).replace("aten.", "").rsplit(".", 1)[0]


def _fmt_arg(a: Any) -> str:
    if isinstance(a, torch.fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt_arg(b) for b in a) + "]"
    return repr(a)
