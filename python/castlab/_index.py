"""Indexing by tensors: gather, take_along_dim, and scatter_add (gather's gradient).

A gather is a view whose positions come from an index tensor: the lowering pushes it
through elementwise ops to the tensors they read (castlab._lower), so ``gather(log_softmax
(x), -1, t)`` reads one logit a row and computes only the gathered values, and a value
broadcast along the gathered dim (a row's max or sum) is read as it is. A tensor gathered
for real is one index step (ops/index.h) on the CPU or the GPU: its elements copied bit
for bit, so gathering never changes a value.
"""

from __future__ import annotations

from typing import Any

from . import ops
from ._dtype import int32, int64
from ._graph import EXPANSIONS, Node, Proxy, record
from ._reduce import _arg, _call
from .ops import TensorLike

__all__ = ["gather", "take_along_dim"]


def _dim(fn: str, nd: int, dim: Any) -> int:
    if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
        raise TypeError(f"{fn}(): dim must be an int, not {type(dim).__name__}")
    d = int(dim)
    lo, hi = (-1, 0) if nd == 0 else (-nd, nd - 1)
    if not lo <= d <= hi:
        raise IndexError(f"{fn}(): Dimension out of range (expected to be in range of "
                         f"[{lo}, {hi}], but got {d})")
    return d % nd if nd else 0


def _index_arg(fn: str, index: Any):
    idx = _arg(index)
    if idx.dtype not in (int64, int32):
        raise TypeError(f"{fn}(): Expected dtype int64 for index, not {idx.dtype.name}")
    return idx


def _check_gather(fn: str, x, dim: int, idx) -> None:
    xs, ks = tuple(x.shape), tuple(idx.shape)
    if len(ks) != len(xs) and not (len(xs) == 0 and len(ks) <= 1) \
            and not (len(ks) == 0 and len(xs) <= 1):
        raise ValueError(f"{fn}(): Index tensor must have the same number of dimensions as "
                         f"input tensor ({len(ks)} vs {len(xs)})")
    for d, (a, b) in enumerate(zip(xs, ks)):
        if d != dim and b > a:
            raise ValueError(f"{fn}(): Size does not match at dimension {d} expected index "
                             f"{list(ks)} to be no larger than self {list(xs)} apart from "
                             f"dimension {dim}")
    if x.device != idx.device:
        raise ValueError(f"{fn}(): the input is on {x.device}, the index on {idx.device}")


def _gather_node(p: Proxy, dim: int, pi: Proxy, wrap: bool = False,
                 target: bool = False) -> Proxy:
    if pi.dtype is not int64:
        pi = ops.astype(pi, int64)
    if len(p.shape) == 0 or len(pi.shape) == 0:  # 0-d and 1-element tensors: one row
        p = ops.reshape(p, (max(1, p.numel()),)) if len(p.shape) == 0 else p
        pi2 = ops.reshape(pi, (1,)) if len(pi.shape) == 0 else pi
        out = _gather_node(p, 0, pi2, wrap, target)
        return ops.reshape(out, tuple(pi.shape))
    attrs = {"dim": dim}
    if wrap:
        attrs["wrap"] = True
    if target:  # nll_loss's class targets: its error message
        attrs["target"] = True
    node = Node("gather", (p.node, pi.node), tuple(pi.shape), p.dtype, p.node.device, attrs)
    return Proxy(record(node))


def gather(x: TensorLike, dim: int, index: TensorLike, *, sparse_grad: bool = False) -> TensorLike:
    """The elements of `x` at `index` along `dim`, as ``torch.gather``:
    ``out[i][j] = x[i][index[i][j]]`` for dim 1. `index` (int64 or int32) has x's
    number of dimensions and no larger extents apart from `dim`; the result has its
    shape and x's dtype, each element copied bit for bit. An index outside
    ``[0, x.shape[dim])`` raises IndexError (PyTorch: RuntimeError, same message).
    `sparse_grad` is accepted as PyTorch's is; castlab has no sparse tensors, so the
    gradient is dense either way (the same values PyTorch's sparse gradient holds).

    >>> x = cl.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> cl.gather(x, 1, cl.tensor([[1], [0]])).tolist()
    [[2.0], [3.0]]
    """
    if not isinstance(sparse_grad, bool):
        raise TypeError(f"gather(): sparse_grad must be a bool, not {type(sparse_grad).__name__}")
    x = _arg(x)
    idx = _index_arg("gather", index)
    d = _dim("gather", len(x.shape), dim)
    _check_gather("gather", x, d, idx)
    return _call(lambda p, pi: _gather_node(p, d, pi), [x, idx])


def take_along_dim(x: TensorLike, indices: TensorLike, dim: int | None = None) -> TensorLike:
    """Values of `x` at `indices` along `dim`, as ``torch.take_along_dim``: `x` and
    `indices` broadcast against each other except along `dim`, and each index is taken
    modulo the size (PyTorch's ``indices % dim_size``: -1 is the last element); with
    ``dim=None``, both are flattened and gathered as they are (no modulo).

    >>> x = cl.tensor([[10.0, 30.0, 20.0]])
    >>> cl.take_along_dim(x, cl.tensor([[1, -1]]), dim=1).tolist()
    [[30.0, 20.0]]
    """
    x = _arg(x)
    idx = _index_arg("take_along_dim", indices)
    if dim is None:
        def body_flat(p, pi):
            p = ops.reshape(p, (p.numel(),))
            pi = ops.reshape(pi, (pi.numel(),))
            return _gather_node(p, 0, pi)
        return _call(body_flat, [x, idx])
    nd = len(x.shape)
    if len(idx.shape) != nd:
        raise ValueError(f"take_along_dim(): input and indices should have the same number "
                         f"of dimensions, but got {nd} dimensions for input, and "
                         f"{len(idx.shape)} dimensions for indices")
    d = _dim("take_along_dim", nd, dim)
    xs, ks = list(x.shape), list(idx.shape)
    xb, kb = list(xs), list(ks)
    for i in range(nd):
        if i == d:
            continue
        a, b = xs[i], ks[i]
        if a != b and a != 1 and b != 1:
            raise ValueError(f"take_along_dim(): shapes {xs} and {ks} do not broadcast "
                             f"apart from dimension {d}")
        xb[i] = kb[i] = max(a, b) if min(a, b) != 0 else 0

    def body(p, pi):
        if list(p.shape) != xb:
            p = ops.expand(p, tuple(xb))
        if list(pi.shape) != kb:
            pi = ops.expand(pi, tuple(kb))
        return _gather_node(p, d, pi, wrap=True)
    return _call(body, [x, idx])


def scatter_add_zeros(src: Proxy, dim: int, index: Proxy, shape: tuple) -> Proxy:
    """Zeros of `shape` with `src` added at `index` along `dim`, each row of the index in
    order (gather's gradient: ``torch.zeros(shape).scatter_add_(dim, index, src)``).
    Inside a trace only."""
    if index.dtype is not int64:
        index = ops.astype(index, int64)
    node = Node("scatter_add", (src.node, index.node), tuple(shape), src.dtype,
                src.node.device, {"dim": dim})
    return Proxy(record(node))


def _expand_one_hot(ctx, node: Node, src: Proxy, pos: Proxy, idx: Proxy) -> Proxy:
    """The gradient of a gather of one position along `dim` (castlab._autodiff
    ._one_hot_scatter), elementwise: `src` where the position `pos` equals the index,
    broadcast over `dim`. ATen's scatter into zeros (and castlab's own orders) gives
    ``0 + src`` there and +0 elsewhere. Under Inductor's orders nll_loss's gradient
    (``nll``) is its decomposition's ``where(pos == t, -1.0, 0.0) * masked``, where masked
    is the cotangent over the total weight (0 in an ignored row: src is -0.0 there, so
    masked is -src): a -0.0 at an ignored row's target, and 0 * masked (its sign) at every
    other position."""
    shape = tuple(node.shape)
    hit = ops.eq(pos, ops.expand(idx, shape))
    if node.attrs.get("nll") and ctx.order in ("triton", "inductor_cpp"):
        ctx.how = "Inductor's nll_loss_backward: a one-hot of -1.0 times the masked value"
        return ops.where(hit, -1.0, 0.0) * ops.expand(-src, shape)
    ctx.how = "zeros with the value added at the index"
    return ops.where(hit, ops.expand(src + 0.0, shape), 0.0)


EXPANSIONS["one_hot_scatter"] = _expand_one_hot
