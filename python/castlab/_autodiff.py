"""Reverse mode: the backward graph of a traced function, as ordinary castlab ops.

Each op's derivative rule is written once, in the op table (ops/op_table.h, column
``grad``), as Python statements over castlab ops; view ops and ``cat`` have theirs
here. :func:`backward` runs inside a trace: it records the function's forward graph
(phase "forward": under the eager policy these values are rounded, i.e. saved in their
storage dtype as PyTorch autograd saves them; under fused they are recomputed in fp32),
then walks it in reverse, recording each rule's ops (phase "backward"). The result is
one graph that traces, prints, fuses and runs under every policy and math variant.

Gradient accumulation follows autograd's input buffers: the contributions to a value
used several times are added in the order the engine produces them (the consumer
created last first), in the value's dtype (rounded after each add under eager).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from typing import Any

from . import _C, _composite, _index, _reduce, ops
from ._creation import arange, zeros
from ._dtype import dtype as _dtype
from ._dtype import float64, int32, int64
from ._graph import COMPARE, Node, Proxy, _state
from ._graph import record as _graph_record
from ._optable import BACKWARD_KERNELS, OPS, grad_rule_kernel

Tensor = _C.Tensor

__all__ = ["backward", "rule_text", "differentiable_ops"]


# ---------------------------------------------------------------- the rules

def _sgn(x):
    """sign(x) in x's dtype, as torch.sgn for real x: +0 at +-0 and at NaN."""
    return ops.where(ops.gt(x, 0), 1.0, ops.where(ops.lt(x, 0), -1.0, 0.0)).astype(x.dtype)


class _Wide(threading.local):
    on = False


#: float64 cotangents for outputs of any floating dtype (castlab.torch's fp64 reference
#: backward: its values are float64 whatever the nominal dtype); see wide_cotangents.
_WIDE = _Wide()


@contextlib.contextmanager
def wide_cotangents():
    """Within: a float64 cotangent is accepted for an output of any floating dtype (the
    backward then computes from it in float64)."""
    prev = _WIDE.on
    _WIDE.on = True
    try:
        yield
    finally:
        _WIDE.on = prev


def _zeros(shape, dt, device):
    """Zeros of a shape and dtype: a 0-d constant, broadcast (costs no memory)."""
    return ops.expand(zeros((), dtype=dt, device=device), tuple(shape))


def _zeros_like(x):
    return _zeros(x.shape, x.dtype, x.device)


def _pow_backward_self(g, a, b):
    # FunctionsManual.cpp pow_backward (Python-number exponent) / pow_backward_self
    if isinstance(b, (int, float)):
        if b == 0:
            return _zeros_like(a)
        return g * (b * ops.pow(a, b - 1))
    return ops.where(ops.eq(b, 0.0), 0.0, g * (b * ops.pow(a, b - 1)))


def _pow_backward_exponent(g, a, b, y):
    # FunctionsManual.cpp pow_backward_exponent: 0 where exponent >= 0 and self == 0
    if isinstance(a, (int, float)):  # Python-number base: grad * (result * log(base))
        log_a = math.log(a) if a > 0 else (-math.inf if a == 0 else math.nan)
        if a == 0:
            return g * ops.where(ops.ge(b, 0.0), 0.0, y * log_a)
        return g * (y * log_a)
    r = y * ops.log(a)
    return g * ops.where(ops.ge(b, 0.0), ops.where(ops.eq(a, 0.0), 0.0, r), r)


_NAMESPACE: dict = {name: fn for name, fn in ops.ELEMENTWISE_FUNCTIONS.items()}
_NAMESPACE.update({
    "sgn": _sgn,
    "pow_backward_self": _pow_backward_self,
    "pow_backward_exponent": _pow_backward_exponent,
    "M_SQRT1_2": 0.70710678118654752440,
    "M_2_SQRTPI": 1.12837916709551257390,
    # gelu_backward's kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5, a double product
    "GELU_BETA": 1.12837916709551257390 * 0.70710678118654752440 * 0.5,
    # gelu_backward (tanh form): kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, a double product
    # converted to opmath_t; 3 * kKappa is folded in opmath_t (see _per_dtype)
    "GELU_TANH_BETA": 1.4142135623730951 * 1.1283791670955126 * 0.5,
    "__builtins__": {},
})


def _per_dtype(dt) -> dict:
    """Constants a kernel folds in its opmath_t: float products for bf16/fp16/fp32,
    double ones for fp64 (they differ: float(3) * 0.044715f != float(3 * 0.044715))."""
    if dt is not None and dt.name == "float64":
        return {"GELU_TANH_3KAPPA": 3 * 0.044715}
    return {"GELU_TANH_3KAPPA": 0.13414499163627625}  # np.float32(3) * np.float32(0.044715)


class _Rule:
    """One op's derivative rule, parsed: statements ``name = expression`` over the
    operands (x or a, b, c), the result y and the cotangent g."""

    __slots__ = ("op", "kernel", "text", "outputs", "stmts")

    def __init__(self, op: str, text: str):
        self.op = op
        self.text = text
        self.kernel, body = grad_rule_kernel(text)
        if self.kernel is not None and self.kernel not in BACKWARD_KERNELS:
            raise RuntimeError(f"op table: {op}'s grad rule names an unknown kernel "
                               f"{self.kernel!r}")
        arity = OPS[op].arity
        self.outputs = ("dx",) if arity == 1 else ("da", "db", "dc")[:arity]
        self.stmts = []  # (target, compiled expression, names it reads)
        for part in body.split(";"):
            sm = re.match(r"\s*(\w+)\s*=(?!=)(.*)$", part, re.S)
            if sm is None:
                raise RuntimeError(f"op table: {op}'s grad rule: {part.strip()!r} is not "
                                   "'name = expression'")
            code = compile(sm.group(2).strip(), f"<grad rule of {op}>", "eval")
            self.stmts.append((sm.group(1), code, set(code.co_names)))

    def assigns(self) -> set:
        return {t for t, _, _ in self.stmts}

    def needed(self, wanted: set) -> list:
        """The statements that the wanted outputs depend on, in order."""
        need = set(wanted)
        keep = []
        for t, code, reads in reversed(self.stmts):
            if t in need:
                keep.append((t, code))
                need |= reads
        return keep[::-1]


_RULES: dict = {}


def _rule(op: str) -> _Rule | None:
    r = _RULES.get(op)
    if r is None and op not in _RULES:
        text = OPS[op].grad
        r = _Rule(op, text) if text else None
        _RULES[op] = r
    return r


def rule_text(op: str) -> str:
    """The derivative rule of an op-table op, as written in the table ("" for none)."""
    return OPS[op].grad


def differentiable_ops() -> list[str]:
    """The op-table ops that have a derivative rule."""
    return [name for name, o in OPS.items() if o.grad]


# ---------------------------------------------------------------- the walk

class GradError(ValueError):
    """A gradient that cannot be formed (bad cotangent, non-differentiable path, ...)."""


def _is_float(n: Node) -> bool:
    return n.op != "scalar" and n.dtype is not None and n.dtype.is_floating_point


def _diff_inputs(n: Node) -> list[int]:
    """Positions of n's inputs a gradient flows to (before activity is checked)."""
    op = n.op
    if op in COMPARE:
        return []
    if op == "astype":
        return [0] if _is_float(n) and _is_float(n.inputs[0]) else []
    if op in ("gather", "scatter_add", "nll_reduce", "one_hot_scatter"):  # not through
        return [0]  # indices or weights
    if op in OPS:
        r = _rule(op)
        if r is None:
            return []
        assigned = r.assigns()
        return [i for i, nm in enumerate(r.outputs) if nm in assigned]
    return list(range(len(n.inputs)))  # views and cat


def _value(n: Node, proxies: dict):
    if n.op == "scalar":
        return n.value
    return proxies.setdefault(id(n), Proxy(n))


def _apply_rule(n: Node, g: Proxy, proxies: dict, want: list[bool], kernel_ids: list) -> list:
    """The contributions of n's rule to its inputs (None where not wanted)."""
    op = n.op
    if op == "astype":
        return [g.astype(n.inputs[0].dtype)]
    if op in OPS:
        r = _rule(op)
        ns = dict(_NAMESPACE)
        args = [_value(a, proxies) for a in n.inputs]
        if OPS[op].arity == 1:
            ns["x"] = args[0]
        else:
            ns.update(zip(("a", "b", "c"), args))
        ns.update(_per_dtype(n.dtype))
        ns["y"] = _value(n, proxies)
        ns["g"] = g
        start = len(_state.graph)
        saved = _state.annot
        if r.kernel is not None:
            kernel_ids[0] += 1
            _state.annot = {**saved, "kernel": r.kernel, "kernel_id": kernel_ids[0]}
        try:
            for t, code in r.needed({nm for nm, w in zip(r.outputs, want) if w}):
                ns[t] = eval(code, ns)  # noqa: S307  (the op table's own rule text)
        finally:
            _state.annot = saved
        outs = [ns.get(nm) if w else None for nm, w in zip(r.outputs, want)]
        if r.kernel is not None:
            final = {id(o.node) for o in outs if isinstance(o, Proxy)}
            for m in _state.graph[start:]:
                if id(m) not in final:
                    m.attrs["kernel_inner"] = True
        return outs
    if op in ("sum", "amax", "amin"):
        return [_reduce_backward(n, g, proxies)]
    if op == "rms_scale":
        return _rms_scale_backward(n, g, proxies, want)
    if op == "var":
        return [_var_backward(n, g, proxies)]
    if op == "layer_norm":
        return _layer_norm_backward(n, g, proxies, want)
    if op == "gather":  # gather_backward: zeros with g added at the index (scatter_add)
        x, ix = n.inputs
        dx = _gather_backward(n, g, _value(ix, proxies))
        return [dx.astype(x.dtype) if dx.dtype is not x.dtype else dx, None]
    if op == "nll_reduce":
        return [_nll_backward(n, g, proxies), None, None][:len(n.inputs)]
    if op == "scatter_add":  # its gradient: g gathered at the index
        src, ix = n.inputs
        return [_index._gather_node(g, n.attrs["dim"], _value(ix, proxies)), None]
    if op == "one_hot_scatter":  # the same, at the checked index
        return [_index._gather_node(g, n.attrs["dim"], _value(n.inputs[2], proxies)), None,
                None]
    if op == "cat":
        d = n.attrs["dim"]
        out, o = [], 0
        for p, w in zip(n.inputs, want):
            s = p.shape[d]
            out.append(ops.narrow_slice(g, d, o, o + s) if w else None)
            o += s
        return out
    return [_view_backward(n, g)]


def _reduce_backward(n: Node, g: Proxy, proxies: dict):
    """sum: the gradient broadcast back over the reduced dims (autograd's sum_backward;
    mean's division by n is its own node). amax/amin: split evenly among the elements
    equal to the result (autograd's scale_grad_by_count). The max softmax and log_softmax
    subtract gets none: their result does not depend on it, and PyTorch's softmax
    backward has no such term."""
    x = n.inputs[0]
    dims = tuple(sorted(n.attrs["dims"]))
    shape = tuple(x.shape)
    if n.op != "sum" and n.attrs.get("algo") == "softmax":
        return _zeros(shape, x.dtype, x.device)
    gg, yy = g, _value(n, proxies)
    if not n.attrs.get("keepdim"):
        for d in dims:
            gg, yy = ops.unsqueeze(gg, d), ops.unsqueeze(yy, d)
    if n.op == "sum":
        out = ops.expand(gg, shape)
    else:
        mask = ops.astype(ops.eq(_value(x, proxies), yy), gg.dtype)
        out = (gg / _reduce.sum(mask, dims, keepdim=True)) * mask
    return out.astype(x.dtype) if out.dtype is not x.dtype else out


def _gather_backward(n: Node, g: Proxy, ix: Proxy) -> Proxy:
    """gather_backward: ``zeros(x.shape).scatter_add_(dim, index, g)``, each output's
    adds in op-math (float32 for a 16-bit g) and rounded once, as PyTorch's CPU kernel
    gives it (measured: bf16 1 + 2**-8 + 2**-8 is 1.0078125). A take_along_dim index is
    wrapped first (its ``indices % size``)."""
    x = n.inputs[0]
    dim, shape = n.attrs["dim"], tuple(x.shape)
    if n.attrs.get("wrap") and shape:
        # the floor modulo in float64 (exact for |index| < 2**53): a truncated quotient,
        # its remainder brought into [0, size)
        b = float(shape[dim])
        a = ops.astype(ix, float64)
        r = a - ops.astype(ops.astype(a / b, ix.dtype), float64) * b
        r = ops.where(ops.lt(r, 0.0), r + b, r)
        r = ops.where(ops.ge(r, b), r - b, r)
        ix = ops.astype(r, ix.dtype)
    if shape and ix.shape[dim] == 1 and all(
            a == b for d, (a, b) in enumerate(zip(ix.shape, shape)) if d != dim):
        return _one_hot_scatter(g, dim, ix, shape, bool(n.attrs.get("target")))
    return _index.scatter_add_zeros(g, dim, ix, shape)


def _one_hot_scatter(g: Proxy, dim: int, ix: Proxy, shape: tuple, target: bool) -> Proxy:
    """zeros(shape).scatter_add_(dim, ix, g) for an index of one position along `dim` that
    spans the other dims (cross-entropy's gradient), as a kernel node computed elementwise
    where a position along `dim` equals the index (castlab._index._expand_one_hot: ATen's
    0 + g, or under Inductor's orders its nll_loss_backward decomposition for a `target`
    gather), so it fuses into the kernel that reads it instead of a [rows, V] temporary.
    The positions are an int32 arange broadcast over the other dims; the index is read
    through a gather of it (its own value), so an index out of range still raises."""
    size = shape[dim]
    at = arange(size, dtype=int32 if size < 2**31 else int64, device=g.device)
    node = ops._trace_input(at)
    node.attrs = {**node.attrs, "iota": True}  # (Inductor's index expression, not a load)
    at = ops.reshape(Proxy(node),
                     tuple(size if d == dim else 1 for d in range(len(shape))))
    pos = ops.expand(at, shape)
    checked = _index._gather_node(pos, dim, ix, target=target)
    node = Node("one_hot_scatter", (g.node, pos.node, checked.node), tuple(shape), g.dtype,
                g.node.device, {"dim": dim, "nll": target})
    return Proxy(_graph_record(node))


def _nll_backward(n: Node, g: Proxy, proxies: dict) -> Proxy:
    """nll_loss_backward (LossNLL.cpp, Loss.cu) for the gathered values: ``-w * go`` per row
    not ignored ("mean": ``-w * (go / total_weight)``, each op in the input's format), 0 for
    the others. The total weight is the forward's, from the same kernel."""
    a = n.attrs
    xg, t = n.inputs[0], _value(n.inputs[1], proxies)
    gg = g
    if a["reduction"] == "mean":
        tw = Proxy(_graph_record(Node("nll_reduce", n.inputs, (), n.dtype, n.device,
                                      {**a, "what": "total_weight"})))
        gg = g / tw
    gg = -gg
    if a["weight"]:
        gg = _value(n.inputs[2], proxies) * gg
    # an ignored row's value is -0.0: ATen's one-hot adds it to zeros (+0.0, as its kernel
    # skips the row), Inductor's decomposition multiplies its masked +0.0 by -1.0 (-0.0)
    out = ops.where(ops.ne(t, a["ignore_index"]), gg, -0.0)
    return out.astype(xg.dtype) if out.dtype is not xg.dtype else out


def _kernel_input(n: Node) -> Node:
    """The one value from outside that the PyTorch kernel ending at `n` reads (its nodes
    share n's kernel_id)."""
    kid, seen, stack, outside = n.attrs.get("kernel_id"), set(), [n], []
    while stack:
        m = stack.pop()
        for a in m.inputs:
            if id(a) in seen or a.op == "scalar":
                continue
            seen.add(id(a))
            (stack if a.attrs.get("kernel_id") == kid else outside).append(a)
    if len(outside) != 1:
        raise GradError(f"internal: the kernel of {n.op} reads {len(outside)} values")
    return outside[0]


def _softmax_backward(n: Node, g: Proxy, proxies: dict, active: set, contribs: dict) -> None:
    """softmax / log_softmax as autograd differentiates it: PyTorch's fused backward kernel
    of the device (castlab._reduce.softmax_backward, one rounding) from the output and the
    cotangent, straight to the kernel's input."""
    x = _kernel_input(n)
    if id(x) not in active:
        return
    dim, log = n.attrs["softmax"]
    gx = _reduce.softmax_backward(g, _value(n, proxies), dim, log)
    contribs.setdefault(id(x), []).append(gx.astype(x.dtype) if gx.dtype is not x.dtype else gx)


def _rms_scale_backward(n: Node, g: Proxy, proxies: dict, want: list[bool]) -> list:
    """castlab.rms_norm's last step (the normalised fp32 value h and the weight w), by its
    cast placement: "hf" is ``w * h.to(x.dtype)`` (two PyTorch ops: the cast's and the
    product's gradients), "te" ``(h * w.float()).to(out)``."""
    h, w = n.inputs
    cast = n.attrs.get("cast")
    if cast is None:
        raise GradError("rms_norm with cast=None has no derivative (Math.rms_norm decides "
                        "its cast when the graph runs): pass cast='hf' or 'te'")
    hp, wp = _value(h, proxies), _value(w, proxies)
    if cast == "hf":
        a = ops.astype(hp, n.attrs["in_dtype"])
        dh = ops.astype(g * wp, h.dtype) if want[0] else None
        dw = _sum_to(g * a, tuple(w.shape)) if want[1] else None
    else:
        gf = ops.astype(g, h.dtype)
        dh = gf * ops.astype(wp, h.dtype) if want[0] else None
        dw = _sum_to(gf * hp, tuple(w.shape)) if want[1] else None
    if dw is not None and dw.dtype is not w.dtype:
        dw = ops.astype(dw, w.dtype)
    return [dh, dw]


def _var_backward(n: Node, g: Proxy, proxies: dict) -> Proxy:
    """autograd's var_backward (FunctionsManual.cpp), op for op, each a PyTorch op of its
    own (rounded under eager): ``(2 / (N - correction)) * grad * (x - x.mean(dim,
    keepdim=True))``, the gradient unsqueezed back over the reduced dims first; for
    dim=None (or a 0-d input) the full mean, and where N - correction <= 0 ``grad *
    where(x == x.mean(), nan, inf)``. The factor is a double, a weak scalar."""
    a = n.attrs
    x = n.inputs[0]
    xp = _value(x, proxies)
    shape = tuple(x.shape)
    dims = tuple(sorted(a["dims"]))
    corr = a["correction"]
    if not shape or a.get("dim_none"):
        numel = 1
        for s in shape:
            numel *= s
        dof = float(numel) - corr
        m = _reduce.mean(xp)
        if dof <= 0:
            return g * ops.where(ops.eq(xp, m), math.nan, math.inf)
        return ((2.0 / dof) * g) * (xp - m)
    gg = g
    if not a["keepdim"] and len(shape) > 1:
        for d in dims:
            gg = ops.unsqueeze(gg, d)
    rnumel = 1
    for d in dims:
        rnumel *= shape[d]
    den = float(rnumel) - corr
    # C++'s double division: 2 / 0 is inf
    f = 2.0 / den if den != 0 else math.inf
    return (f * gg) * (xp - _reduce.mean(xp, dims, keepdim=True))


def _layer_norm_backward(n: Node, g: Proxy, proxies: dict, want: list[bool]) -> list:
    """layer_norm as autograd differentiates it: native_layer_norm_backward, one kernel
    whose three results (dx, dweight, dbias) castlab records as one node each, expanded
    by the lowering for its order and policy (castlab._reduce._expand_layer_norm_backward:
    PyTorch's CPU kernel under eager, the decomposition torch.compile uses otherwise)."""
    a = n.attrs
    if a.get("moments_of"):
        raise NotImplementedError("layer_norm: the gradient of a layer_norm whose moments are "
                                  "of another value (a compiled program's placement) is not "
                                  "defined; run it without gradients")
    x = n.inputs[0]
    ins = [g.node, x] + ([n.inputs[1]] if a["weight"] else [])
    whats = ["dx"] + (["dgamma"] if a["weight"] else []) + (["dbeta"] if a["bias"] else [])
    kid = next(_composite._kernel_ids)
    outs = []
    for i, what in enumerate(whats):
        if not want[i]:
            outs.append(None)
            continue
        p = n.inputs[i]
        attrs = {"dims": a["dims"], "eps": a["eps"], "weight": a["weight"],
                 "bias": a["bias"], "what": what, "kernel": "layer_norm_backward",
                 "kernel_id": kid}
        node = Node("layer_norm_backward", tuple(ins), tuple(p.shape), p.dtype, x.device,
                    attrs)
        outs.append(Proxy(_graph_record(node)))
    return outs


def _view_backward(n: Node, g: Proxy):
    x = n.inputs[0]
    vop = n.attrs["vop"]
    k = vop[0]
    if k in ("reshape", "unsqueeze", "squeeze"):
        return ops.reshape(g, tuple(x.shape))
    if k == "permute":
        perm = vop[1]
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        return ops.permute(g, tuple(inv))
    if k == "expand":
        return _sum_to(g, tuple(x.shape))
    if k == "select":
        d, i = vop[1], vop[2]
        size = x.shape[d]
        i = i + size if i < 0 else i
        return _pad(ops.unsqueeze(g, d), x, d, i, i + 1, 1)
    if k == "slice":
        _, d, start, stop, step = vop
        size = x.shape[d]
        start, stop, _ = slice(start, stop, step).indices(size)
        return _pad(g, x, d, start, stop, step)
    raise GradError(f"no derivative for the view op {k!r}")


def _sum_to(g: Proxy, shape: tuple) -> Proxy:
    """The gradient of an input broadcast to g's shape, as autograd's at::sum_to: a sum
    (in g's dtype, accumulated in op-math, in the order Math.reduction names) over the
    leading dims and the dims the input had as 1, keepdim, then viewed as the input."""
    lead = len(g.shape) - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + i] != 1)
    if dims:
        g = _reduce.sum(g, dims, keepdim=True)
    return ops.reshape(g, shape) if tuple(g.shape) != tuple(shape) else g


def _zeros_shape(x: Node, d: int, size: int, dt: _dtype):
    shape = list(x.shape)
    shape[d] = size
    return _zeros(shape, dt, x.device)


def _pad(g, x: Node, d: int, start: int, stop: int, step: int):
    """slice_backward: zeros of x's shape with g written at start:stop:step along d."""
    size = x.shape[d]
    m = g.shape[d]
    dt = g.dtype
    if m == 0:
        return _zeros_shape(x, d, size, dt)
    if step > 1:
        # interleave: [g_0, 0 * (step-1), g_1, ...], then trim to the slice's extent
        shp = list(g.shape)
        gi = ops.unsqueeze(g, d + 1)
        shp.insert(d + 1, step - 1)
        zi = _zeros(shp, dt, x.device)
        inter = ops.cat([gi, zi], d + 1)
        shp2 = list(g.shape)
        shp2[d] = m * step
        g = ops.narrow_slice(ops.reshape(inter, tuple(shp2)), d, 0, (m - 1) * step + 1)
        stop = start + (m - 1) * step + 1
    parts = []
    if start > 0:
        parts.append(_zeros_shape(x, d, start, dt))
    parts.append(g)
    if stop < size:
        parts.append(_zeros_shape(x, d, size - stop, dt))
    return parts[0] if len(parts) == 1 else ops.cat(parts, d)


def backward(fn, primals: list, cotangents: list, argnums: tuple, arg_names: list,
             cot_names: list) -> list:
    """Inside a trace: record fn(*primals) and the vector-Jacobian product with
    `cotangents`; returns the gradients of primals[argnums] (Proxies)."""
    saved_annot, saved_where = _state.annot, _state.where
    _state.annot = {"phase": "forward"}
    try:
        result = fn(*primals)
    finally:
        _state.annot = saved_annot
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(outs) != len(cotangents):
        raise GradError(f"the function returned {len(outs)} output(s) but "
                        f"{len(cotangents)} cotangent(s) were given")
    out_nodes = []
    for k, (o, c) in enumerate(zip(outs, cotangents)):
        if not isinstance(o, Proxy):
            raise GradError(f"output {k} of the function is not a traced tensor "
                            f"({type(o).__name__}); only values computed from the inputs "
                            "can be differentiated")
        if not o.dtype.is_floating_point:
            raise GradError(f"output {k} has dtype {o.dtype.name}: only floating-point "
                            "outputs can be differentiated (return integer and bool results "
                            "from another function)")
        if tuple(c.shape) != tuple(o.shape):
            raise GradError(f"cotangent {cot_names[k]} has shape {list(c.shape)} but output "
                            f"{k} has shape {list(o.shape)}")
        if c.dtype is not o.dtype and not (_WIDE.on and c.dtype.name == "float64"):
            raise GradError(f"cotangent {cot_names[k]} has dtype {c.dtype.name} but output "
                            f"{k} has dtype {o.dtype.name}")
        if c.device != o.device:
            raise GradError(f"cotangent {cot_names[k]} is on {c.device} but output {k} is "
                            f"on {o.device}")
        out_nodes.append(o.node)

    # which values depend differentiably on the selected inputs
    active: set = set()
    for i in argnums:
        n = primals[i].node
        if not n.dtype.is_floating_point:
            raise GradError(f"argument {arg_names[i]} has dtype {n.dtype.name}: only "
                            "floating-point inputs can be differentiated (leave it out of "
                            "argnums)")
        active.add(id(n))
    fwd = [n for n in _state.graph if n.attrs.get("phase") == "forward"]
    for n in fwd:
        if any(id(n.inputs[i]) in active for i in _diff_inputs(n)):
            active.add(id(n))
    if not any(id(n) in active for n in out_nodes):
        names = ", ".join(arg_names[i] for i in argnums)
        raise GradError(f"no output depends differentiably on {names}: the function uses "
                        "it only through comparisons, where's condition or integer casts "
                        "(PyTorch: 'does not require grad')")

    proxies: dict = {}
    contribs: dict = {}
    for n, c in zip(out_nodes, cotangents):
        if id(n) in active:
            contribs.setdefault(id(n), []).append(c)
    kernel_ids = [0]
    try:
        by_index = {n.index: n for n in fwd}
        for n in reversed(fwd):
            if "split_of" in n.attrs:
                if id(n) in active:
                    _split_backward(n, by_index, contribs)
                continue
            cs = contribs.pop(id(n), None)
            if cs is None or id(n) not in active:
                continue
            _state.annot = {"phase": "backward"}
            _state.where = n.where
            g = _accumulate(cs)
            if n.attrs.get("softmax") is not None:
                _softmax_backward(n, g, proxies, active, contribs)
                continue
            pos = _diff_inputs(n)
            want = [i in pos and id(a) in active for i, a in enumerate(n.inputs)]
            grads = _apply_rule(n, g, proxies, want, kernel_ids)
            for a, w, ga in zip(n.inputs, want, grads):
                if not w:
                    continue
                if ga is None:
                    raise GradError(f"no derivative of {n.op} for that operand")
                if tuple(ga.shape) != tuple(a.shape):
                    ga = _sum_to(ga, tuple(a.shape))
                if ga.dtype is not a.dtype:
                    ga = ga.astype(a.dtype)
                contribs.setdefault(id(a), []).append(ga)
        _state.annot = {"phase": "backward"}
        _state.where = None
        grads = []
        for i in argnums:
            n = primals[i].node
            cs = contribs.get(id(n))
            grads.append(_accumulate(cs) if cs else _zeros_like(primals[i]))
    finally:
        _state.annot, _state.where = saved_annot, saved_where
    return grads


def _split_backward(n: Node, by_index: dict, contribs: dict) -> None:
    """split/chunk as autograd's SplitBackward: when the walk reaches the group (at its
    last piece), the pieces' gradients (zeros for unused ones) are concatenated into one
    contribution to the split tensor; a -0 gradient stays -0."""
    first, _, count, d = n.attrs["split_of"]
    pieces = [by_index.get(first + i) for i in range(count)]
    if any(p is None or p.attrs.get("split_of", (None,))[0] != first for p in pieces):
        raise GradError("internal: a split's pieces are not consecutive graph nodes")
    cs = [contribs.pop(id(p), None) for p in pieces]
    if not any(cs):
        return
    _state.annot = {"phase": "backward"}
    _state.where = n.where
    x = n.inputs[0]
    grads = [_accumulate(c) if c else _zeros_like(Proxy(p)) for c, p in zip(cs, pieces)]
    g = grads[0] if len(grads) == 1 else ops.cat(grads, d)
    contribs.setdefault(id(x), []).append(g)


def _accumulate(cs: list):
    g = cs[0]
    for c in cs[1:]:
        g = g + c
    return g


def check_argnums(argnums: Any, n: int) -> tuple:
    """argnums as a tuple of distinct non-negative ints < n."""
    if isinstance(argnums, bool):
        raise TypeError(f"argnums must be an int or a tuple of ints, not bool {argnums!r}")
    single = isinstance(argnums, int)
    items = (argnums,) if single else argnums
    try:
        items = tuple(items)
    except TypeError:
        raise TypeError(f"argnums must be an int or a tuple of ints, not "
                        f"{type(argnums).__name__}") from None
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"argnums must be ints, got {type(a).__name__} {a!r}")
        if not -n <= a < n:
            raise ValueError(f"argnums: {a} is out of range for a function of {n} "
                             "argument(s)")
        a = a % n
        if a in out:
            raise ValueError(f"argnums: argument {a} is listed twice")
        out.append(a)
    if not out:
        raise ValueError("argnums must name at least one argument")
    return tuple(out)
