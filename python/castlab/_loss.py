"""Losses over class scores: nll_loss and cross_entropy, as PyTorch computes them.

``cross_entropy`` is PyTorch's composite (LossNLL.cpp): log_softmax over the class dim,
then nll_loss (or, with label smoothing or probability targets, the ops PyTorch adds).
``nll_loss`` gathers each row's log-probability at its target (castlab.gather: exact) and
reduces the rows' ``-w x`` in the order ``Math.reduction`` names: under the torch orders
PyTorch's own nll_loss kernel (ops/scalar/loss.h: the CPU's cascade in the input's format,
or the CUDA block's threads and tree), under the others a sum in that order divided by the
total weight. Every result carries PyTorch's dtype, and bad targets raise PyTorch's errors.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from . import ops
from ._C import Tensor
from ._creation import tensor
from ._dtype import bool_, float32, float64, int32, int64
from ._graph import EXPANSIONS, Node, Proxy, record
from ._index import _gather_node, gather
from ._reduce import _arg, _call, _check_float
from ._reduce import log_softmax as _log_softmax
from ._reduce import sum as _sum
from .ops import TensorLike

__all__ = ["nll_loss", "cross_entropy"]

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(fn: str, reduction: Any) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: {reduction!r} is not a valid value for reduction "
                         "(valid: 'none', 'mean', 'sum')")
    return reduction


def _ignore(fn: str, ignore_index: Any) -> int:
    if isinstance(ignore_index, bool) or not hasattr(type(ignore_index), "__index__"):
        raise TypeError(f"{fn}: ignore_index must be an int, not {type(ignore_index).__name__}")
    v = int(ignore_index)
    if not -2**63 <= v < 2**63:
        raise ValueError(f"{fn}: ignore_index {v} does not fit in int64")
    return v


def _shapes(fn: str, x, t) -> None:
    """PyTorch's checks of nll_loss's input [N, C, d1, ...] (or [C]) against the target
    [N, d1, ...] (or [])."""
    xs, ts = tuple(x.shape), tuple(t.shape)
    if len(xs) == 0:
        raise ValueError(f"{fn}: input tensor should be 1D, 2D or more, got a 0-d tensor")
    if len(xs) == 1:
        if len(ts) not in (0, 1) or (len(ts) == 1 and ts[0] != 1):
            raise ValueError(f"{fn}: 1D target tensor expected for a 1D input of {xs[0]} "
                             f"classes, got target of shape {list(ts)}")
        return
    if len(ts) == 0 or ts[0] != xs[0]:
        raise ValueError(f"{fn}: Expected input batch_size ({xs[0]}) to match target "
                         f"batch_size ({ts[0] if ts else 0}).")
    want = (xs[0],) + xs[2:]
    if ts != want:
        raise ValueError(f"{fn}: Expected target size {list(want)}, got {list(ts)}")


def _target(fn: str, target: Any):
    t = _arg(target)
    if t.dtype is int32:
        raise TypeError(f"{fn}: expected scalar type Long but found Int (targets are int64 "
                        "class indices)")
    if t.dtype is not int64:
        raise TypeError(f"{fn}: targets must be int64 class indices, not {t.dtype.name}")
    return t


def _weight(fn: str, weight: Any, x):
    if weight is None:
        return None
    w = _arg(weight)
    c = x.shape[1] if len(x.shape) > 1 else x.shape[0]
    if tuple(w.shape) != (c,):
        raise ValueError(f"{fn}: weight tensor should be defined either for all {c} classes "
                         f"or no classes but got weight tensor of shape: {list(w.shape)}")
    if w.dtype is not x.dtype:
        raise TypeError(f"{fn}: expected weight of dtype {x.dtype.name} (the input's), got "
                        f"{w.dtype.name}")
    if w.device != x.device:
        raise ValueError(f"{fn}: weight is on {w.device}, the input on {x.device}")
    return w


def _rows(p: Proxy, pt: Proxy):
    """The input as [rows, C] (the class dim last: rows in PyTorch's order b * S + s) and
    the targets as [rows]."""
    nd = len(p.shape)
    if nd == 1:
        return ops.unsqueeze(p, 0), ops.reshape(pt, (1,))
    if nd > 2:
        perm = (0,) + tuple(range(2, nd)) + (1,)
        p = ops.permute(p, perm)
    c = p.shape[-1]
    n = 1
    for s in pt.shape:
        n *= s
    return ops.reshape(p, (n, c)), ops.reshape(pt, (n,))


def _nll_body(p: Proxy, pt: Proxy, pw: Proxy | None, ignore_index: int, reduction: str):
    shape_t = tuple(pt.shape)
    one_d = len(p.shape) == 1
    x2, t = _rows(p, pt)
    valid = ops.ne(t, ignore_index)
    safe = ops.where(valid, t, 0)
    xg = ops.reshape(_gather_node(x2, 1, ops.unsqueeze(safe, 1), target=True), (t.shape[0],))
    wg = _gather_node(pw, 0, safe, target=True) if pw is not None else None
    if reduction == "none":
        term = -(xg * wg) if wg is not None else -xg
        out = ops.where(valid, term, 0.0)
        return ops.reshape(out, shape_t if not one_d else ())
    inputs = (xg.node, t.node) + ((wg.node,) if wg is not None else ())
    # [N, C, d1, ...] with N > 1 and spatial elements: Inductor's C++ loop over the rows
    # stays two loops (N, d1 * ...), since the gather's index does not merge them
    spatial = math.prod(p.shape[2:]) if len(p.shape) > 2 else 1
    attrs = {"reduction": reduction, "ignore_index": ignore_index, "weight": wg is not None,
             "one_d": one_d, "what": "loss", "two_loops": p.shape[0] > 1 and spatial > 1}
    node = Node("nll_reduce", inputs, (), p.dtype, p.node.device, attrs)
    return Proxy(record(node))


def nll_loss(input: TensorLike, target: TensorLike, weight: TensorLike | None = None,
             ignore_index: int = -100, reduction: str = "mean") -> TensorLike:
    """The negative log-likelihood loss, as ``torch.nn.functional.nll_loss``: for input
    [N, C] (log-probabilities) and int64 targets [N], ``-w[t] * input[i, t]`` per row, summed
    (``reduction="sum"``), divided by the total weight of the rows not ignored ("mean"), or
    per row ("none"); [N, C, d1, ...] inputs take targets [N, d1, ...], and a [C] input a 0-d
    target. Rows whose target is `ignore_index` count for nothing. The sum and the mean
    follow ``Math.reduction``: PyTorch's own kernel under the torch orders (the CPU's
    cascade in the input's format; the CUDA block's threads and tree), else a sum in that
    order. A target outside ``[0, C)`` raises IndexError ("Target 5 is out of bounds.").

    >>> lp = cl.log_softmax(cl.tensor([[1.0, 2.0, 3.0]]), -1)
    >>> round(cl.nll_loss(lp, cl.tensor([2])).item(), 4)
    0.4076
    """
    fn = "nll_loss"
    x = _arg(input)
    _check_float(fn, x)
    t = _target(fn, target)
    _shapes(fn, x, t)
    red = _reduction(fn, reduction)
    ii = _ignore(fn, ignore_index)
    w = _weight(fn, weight, x)
    return _call(lambda p, pt, pw=None: _nll_body(p, pt, pw, ii, red),
                 [x, t] + ([w] if w is not None else []))


def cross_entropy(input: TensorLike, target: TensorLike, weight: TensorLike | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> TensorLike:
    """Cross-entropy between class scores and targets, as
    ``torch.nn.functional.cross_entropy``: ``nll_loss(log_softmax(input, class_dim))`` for
    int64 class-index targets, with PyTorch's label smoothing (``(1 - eps) * nll + eps / C *
    smooth``, each term an op of its own) and probability targets (a float target of the
    input's shape). The class dim is 1 (0 for a [C] input). Each step is PyTorch's kernel:
    log_softmax (castlab.log_softmax), then nll_loss's reduction in the order
    ``Math.reduction`` names. As in PyTorch, `label_smoothing` above 1 raises, and one
    <= 0 (or NaN) smooths nothing; probability targets take any floating dtype (the
    result's is the promoted one) and no ``ignore_index >= 0``.

    Documented exceptions: (1) a weighted mean with label smoothing and ignored targets
    inside a traced call (castlab.jit, castlab.vjp/grad): PyTorch divides the smooth term
    by the kept rows' weights summed compacted (``masked_select``), which a static-shape
    trace cannot form, so castlab sums them in place (zeros at the ignored rows) and the
    loss may differ from PyTorch's in its last bit; called on concrete tensors, castlab
    compacts them as PyTorch does and is exact. (2) PyTorch also reads uint8 class
    targets; castlab has no uint8 dtype (castlab.from_dlpack refuses one).

    >>> x = cl.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.0]])
    >>> round(cl.cross_entropy(x, cl.tensor([0, 1])).item(), 4)
    0.3964
    """
    fn = "cross_entropy"
    x = _arg(input)
    _check_float(fn, x)
    red = _reduction(fn, reduction)
    ii = _ignore(fn, ignore_index)
    if isinstance(label_smoothing, Tensor) and label_smoothing.ndim == 0 \
            and label_smoothing.dtype is not bool_:
        label_smoothing = label_smoothing.item()  # PyTorch takes a 0-d tensor too
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"{fn}: label_smoothing must be a number, not "
                        f"{type(label_smoothing).__name__}")
    eps = float(label_smoothing)
    if eps > 1.0:
        raise ValueError(f"{fn}: label_smoothing must be between 0.0 and 1.0. Got: {eps}")
    if not eps > 0.0:  # PyTorch checks only the upper bound: <= 0 and NaN smooth nothing
        eps = 0.0
    if len(x.shape) == 0:
        raise ValueError(f"{fn}: input tensor should be 1D, 2D or more, got a 0-d tensor")
    w = _weight(fn, weight, x)
    cd = 0 if len(x.shape) == 1 else 1
    c = x.shape[cd]
    tt = _arg(target)
    if tt.dtype.is_floating_point:
        if tuple(tt.shape) != tuple(x.shape):
            raise ValueError(f"{fn}: probability targets must have the input's shape "
                             f"{list(x.shape)}, got {list(tt.shape)}")
        if ii >= 0:
            raise ValueError(f"{fn}: ignore_index is not supported for floating point target "
                             f"(got ignore_index={ii})")
        return _call(lambda p, pt, pw=None: _prob_target(p, pt, pw, cd, c, eps, red),
                     [x, tt] + ([w] if w is not None else []))
    if tuple(tt.shape) == tuple(x.shape):
        raise TypeError(f"{fn}: Expected floating point type for target with class "
                        f"probabilities, got {tt.dtype.name} (a target of the input's shape "
                        "holds probabilities)")
    t = _target(fn, tt)
    _shapes(fn, x, t)

    kept = None
    if eps > 0.0 and red == "mean" and w is not None and isinstance(t, Tensor):
        # PyTorch's smooth-term divisor sums the kept rows' weights compacted
        # (w.gather(0, t.masked_select(t != ignore_index))): with a concrete target
        # castlab compacts them the same way (a traced target cannot: its shape)
        import numpy as np

        tv = np.asarray(t.cpu().numpy()).reshape(-1)
        idx = tv[tv != ii]
        kept = _gather_node_eager(w, idx)

    def body(p, pt, pw=None, pk=None):
        lsm = _log_softmax(p, cd)
        nll = _nll_body(lsm, pt, pw, ii, red)
        if eps <= 0.0:
            return nll
        return _label_smoothing(lsm, pt, pw, nll, cd, c, eps, ii, red, pk)
    args = [x, t] + ([w] if w is not None else []) + ([kept] if kept is not None else [])
    return _call(body, args)


def _gather_node_eager(w, idx):
    """w's elements at the (concrete, in-range) class indices idx, copied bit for bit."""
    it = tensor(idx.astype("int64"), dtype=int64)
    if w.device != it.device:
        it = it.to(w.device)
    return gather(w, 0, it)


def _wview(pw: Proxy, nd: int, cd: int) -> Proxy:
    shape = [1] * nd
    shape[cd] = pw.shape[0]
    return ops.reshape(pw, tuple(shape))


def _label_smoothing(lsm, pt, pw, nll, cd: int, c: int, eps: float, ii: int, red: str,
                     pk=None):
    """cross_entropy_loss_label_smoothing (LossNLL.cpp): the smooth term's ops, each
    rounded as PyTorch's eager ops are. `pk`: the kept rows' weights, compacted (weighted
    mean; without it, the weights are summed in place, zeros at the ignored rows)."""
    nd = len(lsm.shape)
    prod = lsm * _wview(pw, nd, cd) if pw is not None else lsm
    smooth = -_sum(prod, cd)
    ign = ops.eq(pt, ii)
    smooth = ops.where(ign, 0.0, smooth)
    if red == "mean":
        if pk is not None:
            ret = _sum(smooth) / _sum(pk)
        elif pw is not None:
            safe = ops.where(ign, 0, pt)
            flat = ops.reshape(safe, (safe.numel(),))
            wsel = _gather_node(pw, 0, flat)
            keep = ops.reshape(ops.ne(pt, ii), (safe.numel(),))
            denom = _sum(ops.where(keep, wsel, 0.0))
            ret = _sum(smooth) / denom
        else:
            cnt = _sum(ops.astype(ops.ne(pt, ii), float32))
            s = _sum(smooth)
            ret = ops.astype(ops.astype(s, float32) / cnt, s.dtype) if s.dtype is not float64 \
                else s / ops.astype(cnt, float64)
    elif red == "sum":
        ret = _sum(smooth)
    else:
        ret = smooth
    return nll * (1.0 - eps) + ret * (eps / c)


def _prob_target(p, pt, pw, cd: int, c: int, eps: float, red: str):
    """cross_entropy_loss_prob_target (LossNLL.cpp)."""
    lsm = _log_softmax(p, cd)
    tgt = pt * (1.0 - eps) + eps / c if eps > 0.0 else pt
    prod = lsm * tgt
    if pw is not None:
        prod = prod * _wview(pw, len(p.shape), cd)
    if red == "none":
        return -_sum(prod, cd)
    s = -_sum(prod)
    if red == "sum":
        return s
    return s / float(p.numel() // c if c else 0)


# ---------------------------------------------------------------- the reduction's expansion

def _nll_sum(v: Proxy, acc, float_tiles: bool) -> Proxy:
    """The sum of v's elements in acc, which an Inductor C++ kernel tiles by float
    whatever v's inputs where `float_tiles` (castlab._torch_kernels reads
    ``cpp_float_tiles``), else by what it loads."""
    s = _sum(v, dtype=acc)
    if float_tiles:
        s.node.attrs = {**s.node.attrs, "cpp_float_tiles": True}
    return s


def _expand_nll(ctx, node: Node, xg: Proxy, t: Proxy, wg: Proxy | None = None) -> Proxy:
    """nll_reduce under castlab's own orders and Inductor's (the torch orders are an nll
    step of their own, ops/scalar/loss.h): the rows' terms summed in that order, divided
    by the total weight for "mean" (the count of rows not ignored when unweighted)."""
    a = node.attrs
    valid = ops.ne(t, a["ignore_index"])
    if a["one_d"] and ctx.order == "torch_cuda":
        # nll_loss_forward_reduce_cuda_kernel_1d: the one row's -w x (mean: -x, NaN for a
        # zero weight), 0 when ignored; the total weight w (0 when ignored)
        w1 = wg if wg is not None else 1.0
        if a["what"] == "total_weight":
            tw = ops.where(valid, wg, 0.0) if wg is not None else ops.astype(
                ops.where(valid, 1.0, 0.0), xg.dtype)
            return ops.reshape(tw, ())
        if a["reduction"] == "mean":
            v = -xg if wg is None else ops.where(ops.eq(wg, 0.0), math.nan, -xg)
        else:
            v = -(xg * w1) if wg is not None else -xg
        return ops.reshape(ops.where(valid, v, 0.0), ())  # the one row's value: a 0-d loss
    acc = float64 if xg.dtype is float64 else float32
    term = -(xg * wg) if wg is not None else -xg
    # Inductor's C++ kernel of these sums also computes the rows' log of their exponentials'
    # sum (a float pointwise node, fused there): it tiles by a 16-bit float only where
    # every loop body holds one (TilingSelect, get_loop_body_lowp_fp), so by float whatever
    # the logits (read in its generated code, torch 2.13 AVX512: 16 lanes for a bf16
    # model's mean and sum, weighted or not; 32 gave a loss 1 ulp away). Where the rows
    # are two loops (N, spatial) and the log one (N * spatial), each sum is a loop nest of
    # its own, tiled by what it loads (16-bit logits or weights: 16-bit; torch 2.13 AVX2).
    by_float = not a.get("two_loops")
    loss = _nll_sum(ops.where(valid, term, 0.0), acc, by_float)
    tw = _nll_sum(ops.where(valid, wg if wg is not None else 1.0, 0.0), acc, by_float)
    if a["what"] == "total_weight":
        return ops.astype(tw, xg.dtype)
    if a["reduction"] == "mean":
        loss = loss / tw
    return ops.astype(loss, xg.dtype)


EXPANSIONS["nll_reduce"] = _expand_nll
