"""The ATen ops castlab computes itself, and how each maps to castlab's op functions.

One table, ``ATEN``: ATen overload name -> (kind, builder). A builder takes the node's
arguments with every tensor already a castlab traced tensor (``Proxy``) and calls
castlab's public functions, so castlab's own semantics apply (PyTorch's type promotion,
weak Python scalars, op-math, the eager kernels' formulas; softmax and mean as one
PyTorch kernel, rounded once). ``kind`` is "view" for ops that only move data (exact
under every policy), "compute" otherwise. :func:`can_map` says whether one FX node can be
built here; everything else runs as an external PyTorch node.

>>> from castlab.torch._aten import ATEN
>>> ATEN["aten.silu.default"][0], ATEN["aten.transpose.int"][0]
('compute', 'view')
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from .. import _index, _loss, _reduce, ops
from .._dtype import as_dtype
from .._optable import OPS

__all__ = ["ATEN", "can_map", "castlab_dtype", "FLOAT_DTYPES", "TORCH_OPS", "torch_fn",
           "castlab_fn", "torch_pairs"]

#: torch floating dtypes castlab stores (and computes with).
FLOAT_DTYPES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def castlab_dtype(dt: torch.dtype):
    """The castlab dtype of a torch floating dtype.

    >>> import torch
    >>> from castlab.torch._aten import castlab_dtype
    >>> castlab_dtype(torch.bfloat16).name
    'bfloat16'
    """
    return as_dtype(FLOAT_DTYPES[dt])


def _positional(fn: Callable, arity: int) -> Callable:
    return lambda a, kw: fn(*a[:arity])


def _rsub(a, kw):
    return ops.sub(a[1], a[0])


def _gelu(a, kw):
    return ops.gelu(a[0], approximate=kw.get("approximate", a[1] if len(a) > 1 else "none"))


def _cast(x, dt):
    if dt is None:
        return x
    return ops.astype(x, castlab_dtype(dt))


def _to_copy(a, kw):
    return _cast(a[0], kw.get("dtype"))


def _to_dtype(a, kw):  # to.dtype(self, dtype, non_blocking, copy, memory_format)
    return _cast(a[0], a[1] if len(a) > 1 else kw.get("dtype"))


def _to_device(a, kw):  # to.device(self, device, dtype, non_blocking, copy, memory_format)
    return _cast(a[0], a[2] if len(a) > 2 else kw.get("dtype"))


def _to_dtype_layout(a, kw):
    return _cast(a[0], kw.get("dtype"))


def _identity(a, kw):
    return a[0]


def _view(a, kw):
    return ops.reshape(a[0], tuple(a[1]))


def _transpose(a, kw):
    return ops.transpose(a[0], a[1], a[2])


def _t(a, kw):
    return a[0] if len(a[0].shape) < 2 else ops.transpose(a[0], 0, 1)


def _permute(a, kw):
    return ops.permute(a[0], tuple(a[1]))


def _unsqueeze(a, kw):
    nd = len(a[0].shape) + 1
    return ops.unsqueeze(a[0], a[1] % nd)


def _squeeze(a, kw):
    x = a[0]
    if len(a) == 1:
        return ops.squeeze(x)
    dims = a[1] if isinstance(a[1], (list, tuple)) else [a[1]]
    nd = len(x.shape)
    for d in sorted({d % nd for d in dims} if nd else set(), reverse=True):
        if x.shape[d] == 1:  # torch.squeeze(dim) leaves other sizes alone
            x = ops.squeeze(x, d)
    return x


def _expand(a, kw):
    return ops.expand(a[0], tuple(a[1]))


def _slice(a, kw):  # slice.Tensor(self, dim=0, start=None, end=None, step=1)
    x = a[0]
    dim = a[1] if len(a) > 1 else 0
    start = a[2] if len(a) > 2 else None
    end = a[3] if len(a) > 3 else None
    step = a[4] if len(a) > 4 else 1
    d = dim % len(x.shape)
    s, e, st = slice(start, end, step).indices(x.shape[d])
    e = max(e, s)
    return ops.narrow_slice(x, d, s, e, st)


def _select(a, kw):
    x, dim, index = a[0], a[1], a[2]
    d = dim % len(x.shape)
    return ops.select(x, d, index % x.shape[d])


def _cat(a, kw):
    return ops.cat(list(a[0]), a[1] if len(a) > 1 else kw.get("dim", 0))


def _split(a, kw):
    return list(ops.split(a[0], a[1], a[2] if len(a) > 2 else kw.get("dim", 0)))


def _chunk(a, kw):
    return list(ops.chunk(a[0], a[1], a[2] if len(a) > 2 else kw.get("dim", 0)))


def _unbind(a, kw):
    x = a[0]
    d = (a[1] if len(a) > 1 else kw.get("dim", 0)) % len(x.shape)
    return [ops.select(x, d, i) for i in range(x.shape[d])]


def _dims(a, k):
    return None if len(a) <= k or a[k] is None or (isinstance(a[k], (list, tuple)) and not a[k]) \
        else a[k]


def _sum(a, kw):
    return _reduce.sum(a[0], _dims(a, 1), a[2] if len(a) > 2 else False,
                       dtype=_cl(kw.get("dtype")))


def _sum_all(a, kw):
    return _reduce.sum(a[0], None, dtype=_cl(kw.get("dtype")))


def _mean(a, kw):
    return _reduce.mean(a[0], _dims(a, 1), a[2] if len(a) > 2 else False,
                        dtype=_cl(kw.get("dtype")))


def _mean_all(a, kw):
    return _reduce.mean(a[0], None, dtype=_cl(kw.get("dtype")))


def _amax(a, kw):
    return _reduce.amax(a[0], tuple(a[1]) if len(a) > 1 else (), a[2] if len(a) > 2 else False)


def _amin(a, kw):
    return _reduce.amin(a[0], tuple(a[1]) if len(a) > 1 else (), a[2] if len(a) > 2 else False)


def _softmax_int(a, kw):  # softmax.int(self, dim, dtype=None)
    return _reduce.softmax(a[0], a[1], _cl(a[2] if len(a) > 2 else kw.get("dtype")))


def _softmax_internal(a, kw):  # _softmax(self, dim, half_to_float)
    return _reduce.softmax(a[0], a[1])


def _log_softmax_int(a, kw):
    return _reduce.log_softmax(a[0], a[1], _cl(a[2] if len(a) > 2 else kw.get("dtype")))


def _log_softmax_internal(a, kw):
    return _reduce.log_softmax(a[0], a[1])


def _layer_norm(a, kw, moments_of=None):
    # layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable); `moments_of`:
    # see castlab._reduce._layer_norm (castlab.torch._inductor's placement)
    return _reduce._layer_norm(a[0], list(a[1]), _arg(a, kw, 2, "weight", None),
                               _arg(a, kw, 3, "bias", None), _arg(a, kw, 4, "eps", 1e-5),
                               moments_of)


def _var(a, kw):  # var.correction(self, dim=None, *, correction=None, keepdim=False)
    c = kw.get("correction")
    return _reduce.var(a[0], _dims(a, 1), correction=1 if c is None else c,
                       keepdim=kw.get("keepdim", False))


def _var_dim(a, kw):  # var.dim(self, dim, unbiased=True, keepdim=False)
    return _reduce.var(a[0], _dims(a, 1), correction=1 if _arg(a, kw, 2, "unbiased", True) else 0,
                       keepdim=_arg(a, kw, 3, "keepdim", False))


def _cl(dt):
    return None if dt is None else castlab_dtype(dt)


_REDUCTION = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction


def _arg(a, kw, k: int, name: str, default):
    return a[k] if len(a) > k else kw.get(name, default)


def _cross_entropy(a, kw):  # cross_entropy_loss(self, target, weight, reduction, ignore_index,
    # label_smoothing)
    return _loss.cross_entropy(a[0], a[1], _arg(a, kw, 2, "weight", None),
                               _arg(a, kw, 4, "ignore_index", -100),
                               _REDUCTION[_arg(a, kw, 3, "reduction", 1)],
                               _arg(a, kw, 5, "label_smoothing", 0.0))


def _nll_loss(a, kw):  # nll_loss(self, target, weight, reduction, ignore_index)
    return _loss.nll_loss(a[0], a[1], _arg(a, kw, 2, "weight", None),
                          _arg(a, kw, 4, "ignore_index", -100),
                          _REDUCTION[_arg(a, kw, 3, "reduction", 1)])


def _gather(a, kw):  # gather(self, dim, index, sparse_grad)
    return _index.gather(a[0], a[1], a[2])


def _take_along_dim(a, kw):  # take_along_dim(self, indices, dim)
    return _index.take_along_dim(a[0], a[1], _arg(a, kw, 2, "dim", None))


# ---------------------------------------------------------------- the op table's aten column

def _aten_spec(aten: str) -> tuple[str, dict[str, str]]:
    """("gelu", {"approximate": "tanh"}) for the op table's "aten.gelu approximate=tanh"."""
    name, *kws = aten.split()
    return name.removeprefix("aten."), dict(kw.split("=", 1) for kw in kws)


def castlab_fn(op: str) -> Callable:
    """castlab's function computing table op `op` (an op reached through another, such as
    gelu_tanh, calls that one with its aten keyword arguments)."""
    info = OPS[op]
    if info.public:
        return getattr(ops, op)
    if not info.aten:
        raise ValueError(f"op {op!r} is neither public nor reached through an ATen op")
    name, kw = _aten_spec(info.aten)
    base = next(o.name for o in OPS.values() if o.aten == f"aten.{name}")
    fn = getattr(ops, base)
    return lambda *a: fn(*a, **kw)


def torch_fn(op: str) -> Callable:
    """The torch function of table op `op`: its ATen op (``torch.ops.aten.<name>``), with
    the table's keyword arguments (KeyError for a castlab-only op).

    >>> from castlab.torch._aten import torch_fn
    >>> torch_fn("silu"), torch_fn("gelu_tanh").keywords
    (<OpOverloadPacket(op='aten.silu')>, {'approximate': 'tanh'})
    """
    aten = OPS[op].aten
    if not aten:
        raise KeyError(f"op {op!r} is castlab-only (no ATen op in ops/op_table.h)")
    name, kw = _aten_spec(aten)
    packet = getattr(torch.ops.aten, name)
    return functools.partial(packet, **kw) if kw else packet


#: Table op name -> torch function, for every op with an ATen name (castlab-only ops,
#: such as fma, have none): the one op -> torch list tests and benchmarks derive theirs from.
TORCH_OPS: dict[str, Callable] = {o.name: torch_fn(o.name) for o in OPS.values() if o.aten}


def torch_pairs(*categories: str, exclude: tuple[str, ...] = (),
                castlab_first: bool = False) -> dict[str, tuple[Callable, Callable]]:
    """op -> (torch function, castlab function) for every op with an ATen name in the given
    op-table categories (all if none), less `exclude` (say why where you exclude one);
    `castlab_first`: (castlab function, torch function) pairs."""
    out = {}
    for name, tf in TORCH_OPS.items():
        if name in exclude or (categories and OPS[name].category not in categories):
            continue
        pair = (tf, castlab_fn(name))
        out[name] = pair[::-1] if castlab_first else pair
    return out


# Overloads mapped per op (otherwise: "default" for one operand, "Tensor" and "Scalar"
# where ATen has them for two) and builders other than fn(*args[:arity]); ops whose aten
# column carries keyword arguments are reached through their base op's builder.
_OVERLOADS = {"pow": ("Tensor_Scalar", "Tensor_Tensor"), "where": ("self",)}
_BUILDERS = {"gelu": _gelu}
#: ATen names of the comparisons (bool results).
_CMP = frozenset(_aten_spec(o.aten)[0] for o in OPS.values() if o.aten and o.category == "compare")


def _overloads(op, packet) -> tuple[str, ...]:
    if op.name in _OVERLOADS:
        return _OVERLOADS[op.name]
    if op.arity == 1:
        return ("default",)
    have = set(packet.overloads())
    return tuple(n for n in ("Tensor", "Scalar") if n in have) or ("default",)


#: ATen overload (as ``str(target)`` prints it) -> (kind, builder(args, kwargs)).
ATEN: dict[str, tuple[str, Callable]] = {}
for _o in OPS.values():
    if not _o.aten or " " in _o.aten:
        continue
    _name = _aten_spec(_o.aten)[0]
    _build = _BUILDERS.get(_o.name) or _positional(getattr(ops, _o.name), _o.arity)
    for _ov in _overloads(_o, getattr(torch.ops.aten, _name)):
        ATEN[f"aten.{_name}.{_ov}"] = ("compute", _build)
ATEN.update({
    "aten.rsub.Scalar": ("compute", _rsub),
    "aten.rsub.Tensor": ("compute", _rsub),
    "aten._to_copy.default": ("compute", _to_copy),
    "aten.to.dtype": ("compute", _to_dtype),
    "aten.to.device": ("compute", _to_device),
    "aten.to.dtype_layout": ("compute", _to_dtype_layout),
    "aten.sum.dim_IntList": ("compute", _sum),
    "aten.sum.default": ("compute", _sum_all),
    "aten.mean.dim": ("compute", _mean),
    "aten.mean.default": ("compute", _mean_all),
    "aten.amax.default": ("compute", _amax),
    "aten.amin.default": ("compute", _amin),
    "aten.softmax.int": ("compute", _softmax_int),
    "aten._softmax.default": ("compute", _softmax_internal),
    "aten.log_softmax.int": ("compute", _log_softmax_int),
    "aten._log_softmax.default": ("compute", _log_softmax_internal),
    "aten.cat.default": ("compute", _cat),
    "aten.layer_norm.default": ("compute", _layer_norm),
    "aten.var.correction": ("compute", _var),
    "aten.var.dim": ("compute", _var_dim),
    "aten.cross_entropy_loss.default": ("compute", _cross_entropy),
    "aten.nll_loss.default": ("compute", _nll_loss),
    "aten.nll_loss_nd.default": ("compute", _nll_loss),
    "aten.gather.default": ("view", _gather),
    "aten.take_along_dim.default": ("view", _take_along_dim),
    # views and copies: exact under every policy
    "aten.alias.default": ("view", _identity),
    "aten.clone.default": ("view", _identity),
    "aten.contiguous.default": ("view", _identity),
    "aten.detach.default": ("view", _identity),
    "aten.dropout.default": ("view", _identity),  # (train=False only: see can_map)
    "aten.lift_fresh_copy.default": ("view", _identity),
    "aten.view.default": ("view", _view),
    "aten.reshape.default": ("view", _view),
    "aten._unsafe_view.default": ("view", _view),
    "aten.transpose.int": ("view", _transpose),
    "aten.t.default": ("view", _t),
    "aten.permute.default": ("view", _permute),
    "aten.unsqueeze.default": ("view", _unsqueeze),
    "aten.squeeze.default": ("view", _squeeze),
    "aten.squeeze.dim": ("view", _squeeze),
    "aten.squeeze.dims": ("view", _squeeze),
    "aten.expand.default": ("view", _expand),
    "aten.slice.Tensor": ("view", _slice),
    "aten.select.int": ("view", _select),
    "aten.split.Tensor": ("view", _split),
    "aten.split_with_sizes.default": ("view", _split),
    "aten.chunk.default": ("view", _chunk),
    "aten.unbind.int": ("view", _unbind),
})
_TUPLE_OUT = ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
              "aten.unbind.int")
# Ops that read an int64 tensor (class targets, indices): its position among the node's
# tensors (the others are floating point).
_INT_TENSOR = {"aten.cross_entropy_loss.default": 1, "aten.nll_loss.default": 1,
               "aten.nll_loss_nd.default": 1, "aten.gather.default": 1,
               "aten.take_along_dim.default": 1}

# Ops whose PyTorch semantics castlab does not have for some arguments: the check says
# which argument values castlab reproduces exactly.
_ALPHA_OPS = ("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
              "aten.rsub.Scalar", "aten.rsub.Tensor")


def _tensor_vals(node) -> list:
    """The example values (FakeTensors) of the tensors a node reads."""
    out: list = []

    def visit(a):
        if isinstance(a, torch.fx.Node):
            v = a.meta.get("val")
            out.append(v)
        elif isinstance(a, (list, tuple)):
            for b in a:
                visit(b)
        elif isinstance(a, dict):
            for b in a.values():
                visit(b)
    visit(node.args)
    visit(node.kwargs)
    return out


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype in FLOAT_DTYPES


def _number_ok(node) -> bool:
    """Python numbers castlab takes as weak scalars (no complex, no symbolic sizes)."""
    def ok(a):
        if isinstance(a, (list, tuple)):
            return all(ok(b) for b in a)
        return not isinstance(a, (complex, torch.SymInt, torch.SymFloat, torch.SymBool))
    return ok(list(node.args)) and ok(list(node.kwargs.values()))


def can_map(node, kinds: tuple = ("compute", "view")) -> bool:
    """Whether castlab builds FX node `node` itself (exact PyTorch semantics): an op of
    :data:`ATEN` over floating-point tensors (bool for a condition or a comparison's
    result), with the argument values castlab reproduces.

    >>> import torch
    >>> from castlab.torch._aten import can_map
    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> n = [n for n in gm.graph.nodes if n.op == "call_function"][0]
    >>> can_map(n)   # (an FX node without ATen target or example values)
    False
    """
    if node.op != "call_function":
        return False
    name = str(node.target)
    entry = ATEN.get(name)
    if entry is None or entry[0] not in kinds:
        return False
    out = node.meta.get("val")
    outs = list(out) if name in _TUPLE_OUT and isinstance(out, (list, tuple)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        return False
    vals = _tensor_vals(node)
    if not vals or any(not isinstance(v, torch.Tensor) for v in vals):
        return False
    if name == "aten.where.self":
        if vals[0].dtype is not torch.bool or not all(_is_float(v) for v in vals[1:]):
            return False
    elif name in _INT_TENSOR:
        k = _INT_TENSOR[name]
        if (len(vals) <= k or vals[k].dtype is not torch.int64
                or not all(_is_float(v) for i, v in enumerate(vals) if i != k)):
            return False
        if name == "aten.cross_entropy_loss.default" and vals[1].dim() == vals[0].dim():
            return False  # probability targets are float: the general rule below
    elif not all(_is_float(v) for v in vals):
        return False
    if name.split(".")[1] in _CMP:
        if outs[0].dtype is not torch.bool:
            return False
    elif not all(_is_float(o) for o in outs):
        return False
    if len({v.device for v in vals + outs}) != 1:
        return False  # a device move runs in PyTorch
    if any(isinstance(s, torch.SymInt) for o in outs for s in o.shape):
        return False
    if not _number_ok(node):
        return False
    kw = node.kwargs
    if name in _ALPHA_OPS and kw.get("alpha", 1) != 1:
        return False  # PyTorch's CPU kernels fuse a + alpha*b into one fma
    if name in ("aten.div.Tensor", "aten.div.Scalar") and kw.get("rounding_mode") is not None:
        return False
    if name == "aten.dropout.default" and _arg(node.args, node.kwargs, 2, "train", True):
        return False  # a training dropout draws PyTorch's random mask: PyTorch runs it
    if name == "aten.pow.Tensor_Scalar" and not isinstance(node.args[1], (int, float)):
        return False
    if name in ("aten._softmax.default", "aten._log_softmax.default") and node.args[2]:
        return False  # half_to_float: a dtype change castlab's softmax spells differently
    if name in ("aten.cat.default", "aten.layer_norm.default") and len({v.dtype for v in vals}) != 1:
        return False  # (layer_norm: PyTorch's mixed-dtype kernel is not castlab's)
    return True


def build(node, args: list, kwargs: dict) -> Any:
    """Call the castlab builder of `node` on `args` (tensors already castlab tensors)."""
    return ATEN[str(node.target)][1](args, kwargs)


GETITEM = operator.getitem
