"""Reductions and normalisations: sum, mean, amax, amin, var, softmax, log_softmax,
rms_norm and layer_norm, eager or traced.

The graph has three reduction ops (``sum``, ``amax``, ``amin``: a row reduction each, in
the order of accumulation ``Math.reduction`` names); everything else here is built from
them and the elementwise ops, the way PyTorch's kernels compute it. var and layer_norm
are kernel nodes the lowering expands for its order: PyTorch's Welford kernels (the row
moments ``moments_mean`` / ``moments_m2``, ops/scalar/moments.h) under the torch orders,
two passes of sums under castlab's own. Where PyTorch runs a
composite as one kernel (softmax, log_softmax, mean, var, layer_norm), its inner nodes
carry that kernel's name, so the eager policy rounds only its result, as PyTorch does;
HF's RMSNorm is several PyTorch ops, and each rounds under eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _C, _torch_vml, ops
from ._composite import _call
from ._creation import asarray
from ._dtype import as_dtype, bfloat16, float16, float32, float64, promote_types
from ._graph import EXPANSIONS, Node, Proxy, record, reduce_dims, reduce_node
from ._graph import _state as _trace_state
from .ops import Tensor, TensorLike

__all__ = ["sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "rms_norm",
           "layer_norm"]  # (softmax_backward: castlab._autodiff's, not exported)


def _reduce(op: str, x: Proxy, dims: tuple, keepdim: bool, dt=None, attrs=None) -> Proxy:
    n = reduce_node(op, x.node, dims, keepdim, dt or x.dtype)
    if attrs:
        n.attrs.update(attrs)
    record(n)
    return Proxy(n)


def _check_float(fn: str, x, what: str = "input") -> None:
    d = x.dtype
    if not d.is_floating_point:
        raise TypeError(f"{fn}: castlab reduces floating-point tensors; the {what} is "
                        f"{d.name} (cast with .astype(cl.float32) first)")


def _opt_dtype(fn: str, dt: Any):
    if dt is None:
        return None
    d = as_dtype(dt)
    if not d.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating-point dtype, not {d.name}")
    return d


def _shape(x) -> tuple:
    return tuple(x.shape)


def _numel(shape: tuple, dims: tuple) -> int:
    n = 1
    for d in dims:
        n *= shape[d]
    return n


# ---------------------------------------------------------------- plain reductions

def sum(x: TensorLike, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,
        dtype: Any = None) -> TensorLike:
    """Sum over `dim` (None: every dimension), as ``torch.sum``: fp32 accumulation for
    16-bit and fp32 inputs (fp64 for fp64), one rounding to the result dtype, in the order
    ``Math.reduction`` names (PyTorch's own order under ``torch_eager``). With `dtype` the
    input is converted to it first, as PyTorch's CPU kernel does (a narrower dtype rounds
    each element: ``sum([7e4, -7e4, 1.], dtype=float16)`` is NaN). An empty reduction is 0.

    Under the torch_cpu order, dims that do not coalesce into one in memory (not adjacent,
    or a strided view) follow ATen's TensorIterator: the rows of the fastest reduced dim
    by the cascade, their sums added in order (cut at the chunks of ATen's two-pass split
    for a sum to one value on several torch threads); a 16-bit input is summed as a float
    copy.

    >>> x = cl.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> cl.sum(x, dim=1).tolist()
    [3.0, 7.0]
    >>> cl.sum(x).item()
    10.0
    """
    dt = _opt_dtype("sum", dtype)
    x = _arg(x)
    _check_float("sum", x)
    dims = reduce_dims("sum", _shape(x), dim)

    def body(p):
        # ATen's make_reduction_from_out_ty on the CPU: the input is converted to the
        # requested dtype first (a narrower one rounds: 7e4 in fp16 is inf), then summed
        if dt is not None and p.dtype is not dt:
            p = ops.astype(p, dt)
            # ``self.to(dtype)``: a copy laid out as the input when it is dense (the
            # torch_cpu order reads it so: Lowering._to_copy)
            p.node.attrs = {**p.node.attrs, "to_copy": True}
        return _reduce("sum", p, dims, keepdim, dt)
    return _call(body, [x])


def mean(x: TensorLike, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,
         dtype: Any = None) -> TensorLike:
    """Mean over `dim`, as ``torch.mean``: the sum, then divided by the count inside the
    same kernel (one rounding). An empty reduction gives NaN, as PyTorch.

    >>> cl.mean(cl.tensor([1.0, 2.0, 4.0])).item()
    2.3333332538604736
    """
    dt = _opt_dtype("mean", dtype)
    x = _arg(x)
    _check_float("mean", x)
    dims = reduce_dims("mean", _shape(x), dim)
    n = _numel(_shape(x), dims)

    # an empty reduction: 0 / 0.0 = NaN, as PyTorch
    return _call(lambda p: _reduce("sum", p, dims, keepdim, dt) / float(n), [x], kernel="mean")


def amax(x: TensorLike, dim: int | Sequence[int] = (), keepdim: bool = False) -> TensorLike:
    """Largest value over `dim` (default: every dimension), NaN-propagating, as
    ``torch.amax``; exact in any order. An empty reduced dimension is an error. The sign
    of a zero result (``amax([-0., 0., -0.])`` is -0) follows ATen's CPU loops under the
    torch_cpu order on the CPU (binary_kernel_reduce_vec: the scalar op keeps the first of
    equal values, the vector op the second; ops/scalar/reduce.h red_cpu_extreme_zero);
    exception: a GPU emulating the torch_cpu order, and the other orders, take -0 < +0.

    >>> cl.amax(cl.tensor([[1.0, 5.0], [3.0, 2.0]]), dim=0).tolist()
    [3.0, 5.0]
    """
    return _extreme("amax", x, dim, keepdim)


def amin(x: TensorLike, dim: int | Sequence[int] = (), keepdim: bool = False) -> TensorLike:
    """Smallest value over `dim` (default: every dimension), as ``torch.amin``; a zero
    result's sign as amax says.

    >>> cl.amin(cl.tensor([[1.0, 5.0], [3.0, 2.0]]), dim=1).tolist()
    [1.0, 2.0]
    """
    return _extreme("amin", x, dim, keepdim)


def _extreme(op: str, x: TensorLike, dim, keepdim: bool) -> TensorLike:
    """amax or amin: one reduce node over the checked dims."""
    x = _arg(x)
    _check_float(op, x)
    dims = reduce_dims(op, _shape(x), dim)
    return _call(lambda p: _reduce(op, p, dims, keepdim), [x])


def var(x: TensorLike, dim: int | Sequence[int] | None = None, *, correction: float = 1,
        keepdim: bool = False) -> TensorLike:
    """Variance over `dim` with Bessel's `correction` (1: unbiased, 0: population), as
    ``torch.var``: ``M2 / max(N - correction, 0)`` with M2 the sum of squared deviations
    from the mean. Under ``Math.reduction`` "torch_cpu" / "torch_cuda" M2 comes from
    PyTorch's own Welford kernel, bit for bit (the CPU's in double; Reduce.cuh's in
    fp32, or fp64 for fp64 input), and a CPU reduction to one value takes the CPU's two
    passes in double; under "pairwise" / "sequential" castlab computes two passes in
    op-math: ``sum((x - mean)**2)`` in that order.

    >>> cl.var(cl.tensor([1.0, 2.0, 3.0, 4.0])).item()
    1.6666666269302368
    """
    if isinstance(correction, bool) or not isinstance(correction, (int, float)):
        raise TypeError(f"var: correction must be a number, not {type(correction).__name__}")
    x = _arg(x)
    _check_float("var", x)
    dims = reduce_dims("var", _shape(x), dim)
    # dim=None: autograd's var_backward takes its own branch then (the full mean, and
    # NaN / inf where N - correction <= 0)
    attrs = {"dims": dims, "keepdim": bool(keepdim), "correction": float(correction),
             "dim_none": dim is None}

    def body(p):
        shape = tuple(1 if i in dims else s for i, s in enumerate(p.shape)
                      if keepdim or i not in dims)
        return Proxy(record(Node("var", (p.node,), shape, p.dtype, p.node.device, attrs)))
    return _call(body, [x], kernel="var")


def _inductor_welford(ctx, shape: tuple, dims: tuple) -> bool:
    """Does torch.compile's C++ compute the variance over `dims` by Welford (lowering.py
    use_two_step_variance: on the CPU, two passes for rows of at most
    cpp.use_two_step_variance_threshold (1024) elements when there is more than one row)?
    The inductor_cpp order on a CPU input only: its GPU math is Triton's."""
    if ctx.order != "inductor_cpp" or ctx.cuda:
        return False
    n = _numel(shape, dims)
    rows = _numel(shape, tuple(d for d in range(len(shape)) if d not in dims))
    return n > 0 and (n > 1024 or rows == 1)


def _expand_var(ctx, node: Node, p: Proxy) -> Proxy:
    """castlab.var's kernel under the lowering's order (see var)."""
    dims, keepdim, corr = node.attrs["dims"], node.attrs["keepdim"], node.attrs["correction"]
    n = _numel(_shape(p), dims)
    denom = max(0.0, n - corr)
    out_dt = p.dtype
    rows = _numel(_shape(p), tuple(d for d in range(len(p.shape)) if d not in dims))
    if _inductor_welford(ctx, _shape(p), dims):  # Inductor's C++ Welford, then / in fp32
        v = _reduce("moments_m2", p, dims, keepdim, float32 if out_dt is not float64
                    else float64, {"algo": "var"}) / denom
        return ops.astype(v, out_dt) if v.dtype is not out_dt else v
    if n == 0 or ctx.order not in ("torch_cpu", "torch_cuda"):
        xf = p if p.dtype in (float32, float64) else ops.astype(p, float32)
        m = _reduce("sum", xf, dims, True) / float(n)  # n = 0: NaN, and so is the variance
        d = xf - m
        s = _reduce("sum", d * d, dims, keepdim) / denom
        return ops.astype(s, out_dt) if s.dtype is not out_dt else s
    if ctx.order == "torch_cuda":  # ReduceMomentKernel.cu: WelfordOps, M2 / divisor in acc
        acc = float64 if out_dt is float64 else float32
        v = _reduce("moments_m2", p, dims, keepdim, acc, {"algo": "var"}) / denom
        return ops.astype(v, out_dt) if v.dtype is not out_dt else v
    if rows == 1 and out_dt in (float32, float64):
        # std_var_all_cpu (ReduceOps.cpp): torch's CPU mean in the input's dtype, then
        # sum((double(x) - mean)**2) in double, one element after another (both over
        # the input in memory order: a permuted view of a contiguous tensor is walked
        # as that tensor)
        perm = ctx.memory_perm()
        if perm != tuple(range(len(p.shape))):
            p = ops.permute(p, perm)
            dims = tuple(sorted(perm.index(d) for d in dims))
            keepdim = False  # one value: shaped below
        m = _reduce("sum", p, dims, True) / float(n)
        d = ops.astype(p, float64) - ops.astype(m, float64)
        v = _reduce("sum", d * d, dims, keepdim, attrs={"order": "sequential", "algo": "var"})
        v = v / denom
        if tuple(v.shape) != tuple(node.shape):
            v = ops.reshape(v, tuple(node.shape))
    else:
        # std_var_kernel_impl: WelfordOps with a double accumulator, one pass per output
        v = _reduce("moments_m2", p, dims, keepdim, float64, {"algo": "var"}) / denom
    if out_dt in (bfloat16, float16):
        v = ops.astype(v, float32)  # c10::BFloat16 / c10::Half are built from a float
    return ops.astype(v, out_dt) if v.dtype is not out_dt else v


# ---------------------------------------------------------------- softmax

def _softmax_common(fn: str, x: TensorLike, dim: int, dtype: Any, log: bool):
    dt = _opt_dtype(fn, dtype)
    x = _arg(x)
    _check_float(fn, x)
    if dim is None or isinstance(dim, (tuple, list)):
        raise TypeError(f"{fn}: dim must be one int")
    (d,) = reduce_dims(fn, _shape(x), dim) or (0,)
    xdt = x.dtype
    src = xdt if dt is None else dt
    isz = src.bits // 8

    def body(p):
        if dt is not None and p.dtype is not dt:
            p = ops.astype(p, dt)
        out_dt = p.dtype
        xf = p if out_dt in (float32, float64) else ops.astype(p, float32)
        if 0 in tuple(p.shape):
            # an empty input (its softmax dim or another of size 0): PyTorch returns an
            # empty tensor of the output dtype, no max to take
            y = ops.astype(xf - xf, out_dt) if xf.dtype is not out_dt else xf - xf
            y.node.attrs = {**y.node.attrs, "softmax": (d, log)}
            return y
        if len(xf.shape) == 0:
            xf = ops.reshape(xf, 1)
        shape = tuple(p.shape)
        if shape and shape[d] == 0:  # nothing to normalise over: PyTorch's empty result
            y = xf - xf
            return ops.astype(y, out_dt) if y.dtype is not out_dt else y
        last = len(shape) == 0 or d == len(shape) - 1
        # PyTorch's CPU kernels: the last dim (of the contiguous input) sums each row over
        # vector lanes; another dim sums each column [outer, D, I] in order
        # (SoftMaxKernel.cpp _vec_softmax, serial_vec_logsoftmax_range), SLEEF's exp in
        # whole vectors of columns and glibc's in the rest
        a = {"algo": "softmax", "elem_bytes": isz, "softmax_last": last,
             "cast": dt is not None and dt is not xdt, "fp16_in": xdt is float16}
        geom = None if last else (_numel(shape, range(d)), shape[d],
                                  _numel(shape, range(d + 1, len(shape))))
        if last and not log and out_dt.bits == 16 and shape:
            # the 16-bit last-dim kernel: the row's last n % fVec::size() exponentials by
            # std::exp (one position per row: D = 1)
            geom = (_numel(shape, range(d)), 1, shape[d])
        m = _reduce("amax", xf, (d if len(p.shape) else 0,), True, attrs=a)
        z = xf - m
        ez = ops.exp(z)
        if geom:
            ez.node.attrs = {**ez.node.attrs, "softmax_geom": geom, "softmax_last": last,
                             "storage_dtype": out_dt.name}
        s = _reduce("sum", ez, (d if len(p.shape) else 0,), True, attrs={**a, "softmax_log": log})
        if log:
            ls = ops.log(s)
            if out_dt.bits == 16 and last:
                # the last-dim kernel keeps the sum and its log in bf16/fp16
                ls.node.attrs = {**ls.node.attrs, "storage_dtype": out_dt.name}
            y = z - ls
        else:
            y = ez / s
            if geom and not last:
                y.node.attrs = {**y.node.attrs, "softmax_geom": geom,
                                "storage_dtype": out_dt.name}
        if len(p.shape) == 0:
            y = ops.reshape(y, ())
        y = ops.astype(y, out_dt) if y.dtype is not out_dt else y
        # the autograd backward of this kernel: softmax_backward (castlab._autodiff)
        y.node.attrs = {**y.node.attrs, "softmax": (d, log)}
        return y
    return _call(body, [x], kernel="log_softmax" if log else "softmax")


def softmax_backward(g: TensorLike, y: TensorLike, dim: int, log: bool) -> TensorLike:
    """The gradient of softmax / log_softmax at its output `y` for the cotangent `g`, as
    PyTorch's backward kernels compute it: one kernel in op-math, rounded once.
    On the CPU (SoftMaxKernel.cpp _vec_host_softmax_backward_lastdim, _vec_softmax_backward,
    _vec_log_softmax_backward): softmax ``(g - sum(g * y)) * y``, the products fused into
    the sum's accumulations where GCC fuses them (the torch_cpu order); log_softmax ``g -
    exp(y) * sum(g)`` (an fma; SLEEF's exp, glibc's in the scalar columns of a dim that is
    not the last). On a GPU (SoftMax.cu host_softmax_backward): log_softmax the same
    formula with its row sum in the backward kernels' order (``bwd``: the warp kernel up to
    1024 elements, SoftMax_getBlockSize(ILP) threads above, blockReduce); softmax first
    forms ``g * y`` as an op of its own (rounded), then ``gy - y * sum(gy)``.

    >>> y = cl.softmax(cl.tensor([0.0, 1.0]), 0)
    >>> g = cl._reduce.softmax_backward(cl.tensor([1.0, 0.0]), y, 0, False)
    >>> [round(v, 4) for v in g.tolist()]
    [0.1966, -0.1966]
    """
    g, y = _arg(g), _arg(y)
    d = reduce_dims("softmax_backward", _shape(y), dim)
    d = d[0] if d else 0
    out_dt = y.dtype
    isz = out_dt.bits // 8

    cuda = y.device.is_cuda

    def up(v):
        return v if v.dtype in (float32, float64) else ops.astype(v, float32)

    def body(gp, yp):
        gf, yf = up(gp), up(yp)
        shape = tuple(yp.shape)
        if len(shape) == 0:
            gf, yf = ops.reshape(gf, 1), ops.reshape(yf, 1)
        last = len(shape) == 0 or d == len(shape) - 1
        a = {"algo": "softmax", "elem_bytes": isz, "softmax_last": last, "bwd": True}
        if cuda and not log:  # gp is g * y, rounded (an op before the kernel)
            r = gf - yf * _reduce("sum", gf, (d,), True, attrs=a)
        elif log:  # (gf is read again below: Inductor may store it first)
            s = _reduce("sum", gf, (d,), True, attrs={**a, "reuses_input": True})
            e = ops.exp(yf)
            if not last:
                geom = (_numel(shape, range(d)), shape[d], _numel(shape, range(d + 1, len(shape))))
                e.node.attrs = {**e.node.attrs, "softmax_geom": geom, "softmax_last": False,
                                "storage_dtype": out_dt.name}
            r = gf - e * s
        else:
            r = (gf - _reduce("sum", gf * yf, (d,), True, attrs={**a, "dot": True})) * yf
        if len(shape) == 0:
            r = ops.reshape(r, ())
        return ops.astype(r, out_dt) if r.dtype is not out_dt else r
    if cuda and not log:  # _softmax_backward_data: `Tensor tmp = grad * output` first
        g = g * y
    return _call(body, [g, y], kernel="log_softmax_backward" if log else "softmax_backward")


def softmax(x: TensorLike, dim: int, dtype: Any = None) -> TensorLike:
    """Softmax along `dim`, as ``torch.softmax``: one kernel in op-math (max, ``exp(x -
    max)``, their sum, a true division), rounded once. Under ``Math.reduction="torch"``
    on a GPU the sums follow SoftMax.cu (warp softmax for rows up to 2048 elements, block
    softmax above); on the CPU, with torch_eager math, SoftMaxKernel.cpp (SLEEF's exp, the
    vector lanes' sums, ``x * (1 / sum)``) for the last dim.

    >>> y = cl.softmax(cl.tensor([[0.0, 1.0], [2.0, 2.0]]), dim=-1)
    >>> [round(v, 4) for v in y[0].tolist()]
    [0.2689, 0.7311]
    """
    return _softmax_common("softmax", x, dim, dtype, log=False)


def log_softmax(x: TensorLike, dim: int, dtype: Any = None) -> TensorLike:
    """Log-softmax along `dim`, as ``torch.log_softmax``: ``(x - max) - log(sum(exp(x -
    max)))`` in op-math, rounded once.

    >>> y = cl.log_softmax(cl.tensor([0.0, 0.0]), dim=0)
    >>> [round(v, 4) for v in y.tolist()]
    [-0.6931, -0.6931]
    """
    return _softmax_common("log_softmax", x, dim, dtype, log=True)


# ---------------------------------------------------------------- norms

def _norm_dims(fn: str, x, normalized_shape) -> tuple:
    if isinstance(normalized_shape, bool):
        raise TypeError(f"{fn}: normalized_shape must be an int or a sequence of ints")
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not ns or not all(isinstance(s, int) and not isinstance(s, bool) for s in ns):
        raise TypeError(f"{fn}: normalized_shape must be a non-empty int or sequence of ints, "
                        f"not {normalized_shape!r}")
    shape = _shape(x)
    if len(ns) > len(shape) or tuple(shape[len(shape) - len(ns):]) != ns:
        raise ValueError(f"{fn}: Given normalized_shape={list(ns)}, expected input with shape "
                         f"[*, {', '.join(map(str, ns))}], but got input of size {list(shape)}")
    return ns, tuple(range(len(shape) - len(ns), len(shape)))


def _check_param(fn: str, what: str, w, ns: tuple, x) -> None:
    if w is None:
        return
    if tuple(w.shape) != ns:
        raise ValueError(f"{fn}: {what} of shape {list(w.shape)} does not match "
                         f"normalized_shape {list(ns)}")
    if not w.dtype.is_floating_point:
        raise TypeError(f"{fn}: {what} must be floating point, not {w.dtype.name}")
    if w.device != x.device:
        raise ValueError(f"{fn}: {what} is on {w.device}, the input on {x.device}")


def _eps(fn: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{fn}: eps must be a number, not {type(eps).__name__}")
    return float(eps)


def rms_norm(x: TensorLike, normalized_shape: int | Sequence[int], weight: TensorLike | None = None,
             eps: float = 1e-6, *, cast: str | None = None) -> TensorLike:
    """RMSNorm over the trailing `normalized_shape` dims: ``x / sqrt(mean(x**2) + eps) *
    weight``, with the mean of squares in fp32 (fp64 for fp64 input).

    `cast` places the rounding to the input dtype: "hf" (Hugging Face Qwen2RMSNorm /
    LlamaRMSNorm: ``weight * (h * rsqrt(var + eps)).to(x.dtype)``, each a PyTorch op of
    its own) or "te" (TransformerEngine: ``(h * rsqrt(var + eps) * weight).to(x.dtype)``
    in one kernel). None: ``Math.rms_norm`` decides when the graph is run, so one traced
    graph can be compared under both.

    >>> x = cl.tensor([[3.0, 4.0]])
    >>> [round(v, 4) for v in cl.rms_norm(x, 2).tolist()[0]]
    [0.8485, 1.1314]
    """
    if cast not in (None, "hf", "te"):
        raise ValueError(f"rms_norm: cast must be None, 'hf' or 'te', not {cast!r}")
    e = _eps("rms_norm", eps)
    x = _arg(x)
    _check_float("rms_norm", x)
    w = None if weight is None else _arg(weight)
    ns, dims = _norm_dims("rms_norm", x, normalized_shape)
    _check_param("rms_norm", "weight", w, ns, x)
    n = _numel(_shape(x), dims)
    in_dt = x.dtype

    def body(p, pw=None):
        h = p if p.dtype is float64 else ops.astype(p, float32)
        # square, as HF's h.pow(2): one product and, in autograd, one gradient term
        # (pow_backward: g * (2 * h)), where h * h would give two
        ms = _reduce("sum", ops.square(h), dims, True,
                     attrs={"algo": "rms_norm", "elem_bytes": in_dt.bits // 8}) / float(n)
        r = ops.rsqrt(ms + e)
        hn = h * r
        if pw is None:
            return ops.astype(hn, in_dt) if hn.dtype is not in_dt else hn
        out_dt = promote_types(in_dt, pw.dtype)
        node = Node("rms_scale", (hn.node, pw.node), hn.shape, out_dt, hn.node.device,
                    {"cast": cast, "in_dtype": in_dt})
        record(node)
        return Proxy(node)
    return _call(body, [x, w] if w is not None else [x])


def layer_norm(x: TensorLike, normalized_shape: int | Sequence[int],
               weight: TensorLike | None = None, bias: TensorLike | None = None,
               eps: float = 1e-5) -> TensorLike:
    """LayerNorm over the trailing `normalized_shape` dims, as
    ``torch.nn.functional.layer_norm``: one kernel in op-math (the mean, the population
    variance, ``rstd = 1 / sqrt(var + eps)``, then ``(x - mean) * rstd * weight + bias``),
    rounded once. Under ``Math.reduction`` "torch_cpu" / "torch_cuda" it is PyTorch's
    kernel bit for bit: its Welford moments (CPU: RowwiseMoments; CUDA: the vectorized
    kernel when the row is a multiple of 4 and aligned, else RowwiseMomentsCUDAKernel)
    and its epilogue as its compiler builds it (fused multiply-adds included, with
    ``Math.cuda_kernels``). Under "pairwise" / "sequential": two passes in that order.

    >>> y = cl.layer_norm(cl.tensor([[1.0, 3.0]]), 2)
    >>> [round(v, 4) for v in y.tolist()[0]]
    [-1.0, 1.0]
    """
    return _layer_norm(x, normalized_shape, weight, bias, eps)


def _layer_norm(x: TensorLike, normalized_shape: int | Sequence[int],
                weight: TensorLike | None = None, bias: TensorLike | None = None,
                eps: float = 1e-5, moments_of: TensorLike | None = None) -> TensorLike:
    """layer_norm; `moments_of` (the same shape and dtype as x): the value whose mean (and
    Welford's M2; two passes: the second sums the squared deviations of x) normalizes x,
    where a compiled program's kernel sums one version of its input (fp32, as computed)
    and normalizes another (loaded back rounded): torch.compile's kernels, as
    castlab.torch's placement reads them. Forward only."""
    e = _eps("layer_norm", eps)
    x = _arg(x)
    _check_float("layer_norm", x)
    w = None if weight is None else _arg(weight)
    b = None if bias is None else _arg(bias)
    ns, dims = _norm_dims("layer_norm", x, normalized_shape)
    _check_param("layer_norm", "weight", w, ns, x)
    _check_param("layer_norm", "bias", b, ns, x)
    xm = None if moments_of is None else _arg(moments_of)
    if xm is not None and (tuple(xm.shape) != tuple(x.shape) or xm.dtype is not x.dtype):
        raise ValueError("layer_norm: moments_of must have the input's shape and dtype")
    attrs = {"dims": dims, "eps": e, "weight": w is not None, "bias": b is not None}
    if xm is not None:
        attrs["moments_of"] = True

    def body(*ps):
        p = ps[0]
        node = Node("layer_norm", tuple(q.node for q in ps), p.shape, p.dtype, p.node.device,
                    attrs)
        return Proxy(record(node))
    return _call(body, [a for a in (x, w, b, xm) if a is not None], kernel="layer_norm")


def _expand_layer_norm(ctx, node: Node, p: Proxy, *params: Proxy) -> Proxy:
    """castlab.layer_norm's kernel under the lowering's order (see layer_norm)."""
    dims, e = node.attrs["dims"], node.attrs["eps"]
    it = iter(params)
    pw = next(it) if node.attrs["weight"] else None
    pb = next(it) if node.attrs["bias"] else None
    pm = next(it) if node.attrs.get("moments_of") else p  # the value the moments are of
    n = _numel(_shape(p), dims)
    in_dt = p.dtype
    xf = p if in_dt is float64 else ops.astype(p, float32)
    mf = xf if pm is p else (pm if in_dt is float64 else ops.astype(pm, float32))
    acc = xf.dtype

    def param(q):
        return None if q is None else (q if q.dtype is acc else ops.astype(q, acc))
    g, b = param(pw), param(pb)
    if _inductor_welford(ctx, _shape(p), dims):
        # Inductor's C++: Welford's mean and M2, var = M2 / n, 1 / sqrt(var + eps) in
        # float, then ((x - mean) * rstd) * w + b
        a = {"algo": "layer_norm", "elem_bytes": in_dt.bits // 8}
        m = _reduce("moments_mean", pm, dims, True, acc, a)
        v = _reduce("moments_m2", pm, dims, True, acc, a) / float(n)
        y = (xf - m) * (1.0 / ops.sqrt(v + e))
        if g is not None:
            y = y * g
        if b is not None:
            y = y + b
        return ops.astype(y, in_dt) if y.dtype is not in_dt else y
    if n == 0 or ctx.order not in ("torch_cpu", "torch_cuda"):
        # (moments_of: the mean's sum is of it, the variance's pass of x: Inductor's two
        # passes load back x rounded after its first loop summed it in fp32)
        m = _reduce("sum", mf, dims, True) / float(n)
        d = xf - m
        v = _reduce("sum", d * d, dims, True) / float(n)
        y = d * ops.rsqrt(v + e)
        if g is not None:
            y = y * g
        if b is not None:
            y = y + b
        return ops.astype(y, in_dt) if y.dtype is not in_dt else y
    a = {"algo": "layer_norm", "elem_bytes": in_dt.bits // 8}
    if ctx.order == "torch_cuda":
        a["vectorized"] = (in_dt is not float64 and n % 4 == 0 and n <= 1 << 24
                           and ctx.aligned(in_dt.bits // 8 * 4))
    m = _reduce("moments_mean", pm, dims, True, acc, a)
    v = _reduce("moments_m2", pm, dims, True, acc, a) / float(n)
    d = xf - m
    if ctx.order == "torch_cpu":  # layer_norm_kernel.cpp, as GCC builds it (measured)
        if not ctx.math.torch_cpu_fma():
            ctx.attrs["no_fma"] = True  # the DEFAULT build: no fma instruction to contract to
        r = 1.0 / ops.sqrt(v + e)
        if in_dt in (float32, float64):
            # (x + -mean) * rstd * gamma + beta; without gamma GCC drops the * 1:
            # fma(x - mean, rstd, beta)
            t = d * r
            if g is None:
                y = t + (b if b is not None else 0.0)
            else:
                y = t * g + (b if b is not None else 0.0)
        else:  # the mixed-type kernel: fma(fma(x, rstd, -rstd * mean), gamma, beta)
            t = xf * r + (-r) * m
            y = (t * g if g is not None else t) + (b if b is not None else 0.0)
    elif a["vectorized"]:  # vectorized_layer_norm_kernel: gamma * (rstd * (x - mean)) + beta
        r = ops.rsqrt(v + e)
        t = r * d
        y = g * t if g is not None else t
        if b is not None:
            y = y + b
            if g is None and ctx.cuda:
                y = _ln_bias_only_lanes(r, d, b, y, n)
    else:  # LayerNormForwardCUDAKernel: fma((x - mean) * rstd, gamma, beta or 0); without
        # gamma nvcc folds the * 1 (measured on an H200: fma(x - mean, rstd, beta))
        r = ops.rsqrt(v + e)
        t = d * r if g is None else (d * r) * g
        y = t + (b if b is not None else 0.0)
    return ops.astype(y, in_dt) if y.dtype is not in_dt else y


def _ln_bias_only_lanes(r: Proxy, d: Proxy, b: Proxy, y: Proxy, n: int) -> Proxy:
    """vectorized_layer_norm_kernel with a bias and no weight, as nvcc builds it in torch
    2.11 (measured on an H200, 2026-12-05): ``rstd * (x - mean) + beta`` is one fma in
    lanes 1-3 of each 4-element vector and two roundings, ``rn(rn(rstd * d) + beta)``, in
    lane 0 (fp32: 582 of 8,064 elements differ from an fma in every lane, all in lane 0;
    bf16/fp16 agree with it). `y` is the fma form; lane 0 is taken from the other."""
    st = _trace_state
    saved = st.annot
    st.annot = {**(saved or {}), "no_fma": True}  # its add does not contract the product
    try:
        plain = r * d + b
    finally:
        st.annot = saved
    shape = tuple(y.shape)
    q = (-1, n // 4, 4)
    lanes = ops.cat([ops.reshape(plain, *q)[:, :, :1], ops.reshape(y, *q)[:, :, 1:]], -1)
    return ops.reshape(lanes, *shape)


def _ln_rows(q: Proxy, rows: int, n: int) -> Proxy:
    return ops.reshape(q, (rows, n)) if tuple(q.shape) != (rows, n) else q


def _torch_cpu_row_chunks(rows: int) -> list:
    """The rows each of torch's threads takes in at::parallel_for(0, M, 1, ...) (OpenMP:
    min(threads, M) chunks of ceil(M / chunks) rows; one chunk on one thread)."""
    _torch_vml.unavailable()  # torch's thread count, from the library it borrows
    t = _C.torch_num_threads() or 1
    if rows <= 1 or t <= 1:
        return [(0, rows)]
    nt = min(t, rows)
    c = -(-rows // nt)
    return [(s, min(rows, s + c)) for s in range(0, rows, c)]


def _expand_layer_norm_backward(ctx, node: Node, pg: Proxy, px: Proxy, *params: Proxy) -> Proxy:
    """One gradient of castlab.layer_norm (node attr "what": "dx", "dgamma" or "dbeta")
    under the lowering's order and policy.

    The eager policy under the "torch_cpu" order is PyTorch's CPU kernel,
    layer_norm_kernel.cpp LayerNormBackwardKernelImplInternal / layer_norm_backward_frame:
    the forward's mean and rstd as it saved them (in the input's dtype for bf16/fp16);
    per row ``ds = sum(dy * x * gamma)`` and ``db = sum(dy * gamma)`` by
    vec::map3_reduce_all / map2_reduce_all / reduce_all (8 float lanes: the kernel is
    registered without AVX512; 16-bit rows as two float halves), then ``b = (db * mean
    - ds) * a * a * a * scale``, ``c = -b * mean - db * a * scale`` (a = rstd, scale =
    1/N) and ``dx = a * dy * gamma + b * x + c``; dgamma / dbeta accumulate
    ``dy * (a * x - a * mean)`` / ``dy`` row after row into one buffer per thread of
    torch's (in the input's dtype: a bf16/fp16 buffer rounds after every row), then add
    the threads' buffers in op-math. Anything else (fused, another order) is the
    decomposition torch.compile differentiates (torch._decomp native_layer_norm_backward):
    ``rstd / N * (N * gx - sum(gx) - xhat * sum(gx * xhat))`` with gx = dy * gamma and
    xhat = (x - mean) * rstd, in op-math, rounded once."""
    a = node.attrs
    dims, e, what = a["dims"], a["eps"], a["what"]
    pw = params[0] if params else None
    in_dt = px.dtype
    shape = _shape(px)
    n = _numel(shape, dims)
    rows = _numel(shape, tuple(d for d in range(len(shape)) if d not in dims))
    acc = float64 if in_dt is float64 or pg.dtype is float64 else float32

    def up(q):
        return q if q is None or q.dtype is acc else ops.astype(q, acc)
    xf, gf, wf = up(px), up(pg), up(pw)
    out_dt = node.dtype
    torch_order = ctx.order in ("torch_cpu", "torch_cuda") and n > 0
    eager = ctx.eager_rounding()
    if ctx.cuda and torch_order and eager:
        raise NotImplementedError(
            "layer_norm's gradient under the eager policy on a GPU (PyTorch's CUDA "
            "layer_norm backward kernels) is not implemented in castlab; use "
            "policy='fused' or run it on the CPU")
    la = {"algo": "layer_norm", "elem_bytes": in_dt.bits // 8}
    if torch_order:
        m = _reduce("moments_mean", px, dims, True, acc, la)
        v = _reduce("moments_m2", px, dims, True, acc, la) / float(n)
        r = 1.0 / ops.sqrt(v + e) if not ctx.cuda else ops.rsqrt(v + e)
    else:
        m = _reduce("sum", xf, dims, True) / float(n)
        d = xf - m
        r = ops.rsqrt(_reduce("sum", d * d, dims, True) / float(n) + e)
    if not (torch_order and eager and ctx.order == "torch_cpu"):
        return _ln_backward_decomposition(node, what, xf, gf, wf, m, r, dims, shape, n)

    # PyTorch's CPU kernel
    if not ctx.math.torch_cpu_fma():
        ctx.attrs["no_fma"] = True  # the DEFAULT build: no fma instruction to contract to
    half = in_dt.bits == 16
    # mean and rstd as the forward saved them: T2 = the input's dtype (float for fp32)
    # mixed types (a bf16/fp16 input with float32 weight): the float kernel of
    # layer_norm_backward_frame (mean and rstd saved in float, ds from x * (dy * gamma))
    mixed = half and pw is not None and pw.dtype is float32
    saved = in_dt if in_dt is not float64 else float64
    if half and not mixed:
        m = ops.astype(ops.astype(m, saved), acc)
        r = ops.astype(ops.astype(r, saved), acc)
    shp = tuple(1 if i in dims else s for i, s in enumerate(shape))
    if tuple(m.shape) != shp:
        m, r = ops.reshape(m, shp), ops.reshape(r, shp)
    # (fp16: GCC fuses the sums' products into their accumulations, measured; bf16's
    # rounding hides it)
    red = {"elem_bytes": in_dt.bits // 8, "vec_bytes": 32, "dot_fused": in_dt in (float16, float64)}
    if what == "dx":
        wx = ops.expand(wf, shape) if wf is not None else None
        if wx is None:
            ds = _reduce("sum", gf * xf, dims, True, attrs={**red, "dot": True})
            db = _reduce("sum", gf, dims, True, attrs={**red, "algo": "reduce_all"})
        else:
            if mixed:
                # (a row shorter than 16: fVec::set, then vec_reduce_all's butterfly)
                ds = _reduce("sum", xf * (gf * wx), dims, True,
                             attrs={**red, "dot": True, "dot_fused": True,
                                    "dot_short_tree": True})
            else:
                ds = _reduce("sum", (gf * xf) * wx, dims, True, attrs={**red, "dot": True})
            db = _reduce("sum", gf * wx, dims, True,
                         attrs={**red, "dot": True,
                                **({"dot_fused": False, "dot_short_tree": True} if mixed else {})})
        scale = float(np.float32(1.0) / np.float32(n)) if acc is float32 else 1.0 / n
        b = (db * m - ds) * r * r * r * scale
        c = (-b) * m - db * r * scale
        # a * dy * gamma + b * x + c, as GCC builds it: fma(b, x, a * dy * gamma) + c
        t = r * gf
        if wx is not None:
            t = t * wx
        y = (b * xf + t) + c
        return ops.astype(y, out_dt) if y.dtype is not out_dt else y
    # dgamma / dbeta: the per-thread buffers, then their sum from 0 in op-math
    return _ln_backward_param_buffers(node, what, xf, gf, m, r, rows, n, half, in_dt, red)


def _ln_backward_decomposition(node: Node, what: str, xf: Proxy, gf: Proxy, wf, m, r,
                               dims: tuple, shape: tuple, n: int) -> Proxy:
    """layer_norm's gradient as torch.compile differentiates it (torch._decomp
    native_layer_norm_backward), in op-math, rounded once."""
    out_dt = node.dtype
    lead = tuple(d for d in range(len(shape)) if d not in dims)
    xhat = (xf - m) * r
    if what == "dbeta":
        y = _reduce("sum", gf, lead, False) if lead else gf
    elif what == "dgamma":
        y = _reduce("sum", gf * xhat, lead, False) if lead else gf * xhat
    else:
        gx = gf * wf if wf is not None else gf
        s1 = _reduce("sum", gx, dims, True)
        s2 = _reduce("sum", gx * xhat, dims, True)
        y = (r / float(n)) * ((gx * float(n) - s1) - xhat * s2)
    if tuple(y.shape) != tuple(node.shape):
        y = ops.reshape(y, tuple(node.shape))
    return ops.astype(y, out_dt) if y.dtype is not out_dt else y


def _ln_backward_param_buffers(node: Node, what: str, xf: Proxy, gf: Proxy, m, r, rows: int,
                               n: int, half: bool, in_dt, red: dict) -> Proxy:
    """dgamma / dbeta as PyTorch's CPU kernel: one buffer per thread accumulating rows
    (in the input's dtype for bf16/fp16), then the buffers' sum from 0 in op-math."""
    out_dt = node.dtype
    g2, x2 = _ln_rows(gf, rows, n), _ln_rows(xf, rows, n)
    if what == "dgamma":
        mr, rr = ops.reshape(m, (rows, 1)), ops.reshape(r, (rows, 1))
        u = rr * x2 + (-rr) * mr
    total = None
    for s0, s1 in _torch_cpu_row_chunks(rows):
        gs = ops.narrow_slice(g2, 0, s0, s1)
        if what == "dgamma":
            us = ops.narrow_slice(u, 0, s0, s1)
        elif half:  # dy * 1: the dot's products are dy, its fma(dy, 1, buf) is buf + dy
            us = ops.where(ops.eq(gs, gs), 1.0, 1.0)
        else:
            us = None
        # one buffer per thread: `buf + dy * u` (fused where GCC fuses) row by row, from 0;
        # a bf16/fp16 buffer rounds after every row
        if us is not None:
            part = _reduce("sum", gs * us, (0,), False,
                           attrs={**red, "dot": True, "softmax_last": False,
                                  **({"acc16": in_dt} if half else {})})
        else:
            part = _reduce("sum", gs, (0,), False, attrs={"order": "sequential"})
        total = (part + 0.0) if total is None else total + part
    y = ops.reshape(total, tuple(node.shape)) if tuple(total.shape) != tuple(node.shape) else total
    return ops.astype(y, out_dt) if y.dtype is not out_dt else y


EXPANSIONS["var"] = _expand_var
EXPANSIONS["layer_norm"] = _expand_layer_norm
EXPANSIONS["layer_norm_backward"] = _expand_layer_norm_backward


def _arg(x):
    """A castlab tensor or a traced tensor (NumPy arrays and lists become tensors)."""
    if isinstance(x, (Proxy, Tensor)):
        return x
    return asarray(x)
