"""castlab's ops: elementwise math and shape ops, eager or traced.

Every function works on castlab tensors (run now, rounding after the op as PyTorch
eager does) and on the symbolic tensors ``castlab.jit`` traces with (recorded into the
graph). Python numbers are weak scalars, kept in op-math precision: ``x * 0.5`` on a
bf16 tensor stays bf16 and multiplies by 0.5 in fp32.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections.abc import Sequence
from typing import Any, Union

from . import _C, _onednn
from ._creation import _to_device, asarray, full
from ._dtype import as_dtype, dtype, promote_types
from ._graph import (
    Node,
    Proxy,
    broadcast,
    cat_node,
    elementwise,
    record,
    scalar_node,
    tracing,
    view_node,
)
from ._graph import _state as _trace_state
from ._lower import _norm_vop, apply_view, input_node, lower
from ._optable import OPS, OpInfo
from .policy import Policy, current_math

Tensor = _C.Tensor
TensorLike = Union["_C.Tensor", Proxy]
Number = Union[int, float, bool]

_EAGER_POLICY = Policy.eager()
_eager_cache: dict = {}
_EAGER_CACHE_SIZE = 4096
# Guards insertion and eviction of _eager_cache and _composite's cache (lookups are single
# dict.get calls, atomic under the GIL). Without it, two threads evicting at once pop the same key
# (KeyError) or iterate the dict while another thread resizes it (RuntimeError).
_eager_cache_lock = threading.Lock()


def _sig(t) -> tuple:
    return (t._dtype_name, t.shape, t._strides, t._device_str)


def _to_tensor(x: Any):
    return asarray(x)


def _trace_input(t) -> Node:
    """A concrete tensor used inside a traced function: a captured constant input."""
    st = _trace_state
    for i, c in enumerate(st.captured):
        if c is t:
            return st.captured_nodes[i]
    n = input_node(t, st.n_inputs + len(st.captured))
    st.captured.append(t)
    st.captured_nodes.append(n)
    return n


def _apply(op: str, args: Sequence[Any], attrs: dict | None = None):
    """Build the node for an elementwise op and run it now or record it."""
    if tracing():
        nodes = []
        for a in args:
            if isinstance(a, Proxy):
                nodes.append(a.node)
            elif isinstance(a, Tensor):
                nodes.append(_trace_input(a))
            elif isinstance(a, (bool, int, float)):
                nodes.append(scalar_node(a, "cpu"))
            else:
                nodes.append(_trace_input(_to_tensor(a)))
        n = elementwise(op, nodes, attrs)
        record(n)
        return Proxy(n)
    # Eager: a cached plan for this op, argument signature and math variant, if any.
    tensors = []
    parts: list = [op]
    for a in args:
        if type(a) is Tensor:
            tensors.append(a)
            parts.append(None)
        elif isinstance(a, float):
            parts.append(a.hex())  # distinguishes -0.0 and NaN exactly
        elif isinstance(a, (bool, int)):
            parts.append((type(a), a))
        elif isinstance(a, Proxy):
            raise TypeError("a traced tensor escaped its castlab.jit function")
        else:
            tensors.append(a if isinstance(a, Tensor) else _to_tensor(a))
            parts.append(None)
    order = _dense_permuted_order(tensors)
    if order is not None:
        # PyTorch runs an elementwise op over dense, permuted operands (a transposed view)
        # in memory order and returns the same layout (TensorIterator, preserve_format);
        # its CPU kernels' vector body and scalar tail follow that order. So does castlab:
        # the op on the memory-ordered views, the result permuted back.
        inv = [0] * len(order)
        for i, d in enumerate(order):
            inv[d] = i
        it = iter(t.permute(*order) for t in tensors)
        pargs = [next(it) if p is None else a for a, p in zip(args, parts[1:])]
        with _onednn.input_not_contiguous():
            return _apply(op, pargs, attrs).permute(*inv)
    math = current_math()
    # torch_cpu math borrows MKL VML and torch's thread geometry once torch is imported
    # (castlab._torch_vml): a plan lowered before that would keep the stand-ins; gelu
    # follows whether PyTorch calls oneDNN now (torch.backends.mkldnn.enabled, _onednn)
    key = (tuple(parts), _attrs_key(attrs), _C.signature(tensors), math, "torch" in sys.modules,
           _onednn.state() if op == "gelu" else None)
    plan = _eager_cache.get(key)
    if plan is not None:
        return plan.run(tensors)[0]
    nodes = []
    slot = 0
    for a, p in zip(args, parts[1:]):
        if p is None:
            nodes.append(input_node(tensors[slot], slot))
            slot += 1
        else:
            nodes.append(scalar_node(a, "cpu"))
    n = elementwise(op, nodes, attrs)
    plan, result = lower([n], tensors, _EAGER_POLICY, math)
    plan.run(tensors, result)
    for nd in nodes:  # the cached plan keeps no tensors (its record keeps the nodes)
        nd.tensor = None
    _cache_put(_eager_cache, key, plan)
    return result[0]


def _cache_put(cache: dict, key: Any, value: Any) -> None:
    """Insert into an eager plan cache, oldest entries out past _EAGER_CACHE_SIZE."""
    with _eager_cache_lock:
        cache[key] = value
        while len(cache) > _EAGER_CACHE_SIZE:
            cache.pop(next(iter(cache)), None)


def _dense_permuted_order(tensors: list):
    """The dims of the operands in memory order (outermost first), when every operand is
    one CPU tensor layout that is dense and not contiguous (a permutation of a contiguous
    layout, as a transposed view); else None."""
    if not tensors:
        return None
    t0 = tensors[0]
    if t0.is_contiguous() or t0.device.type != "cpu" or t0.ndim < 2:
        return None
    shape, strides = tuple(t0.shape), tuple(t0._strides)
    for t in tensors[1:]:
        if tuple(t.shape) != shape or tuple(t._strides) != strides or t.device.type != "cpu":
            return None
    order = sorted(range(len(shape)), key=lambda d: (-strides[d] if shape[d] > 1 else 1, d))
    expect = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expect:
            return None
        expect *= shape[d]
    if not t0.permute(*order).is_contiguous():
        return None
    return order


def _attrs_key(attrs: dict | None):
    if not attrs:
        return None
    return tuple(sorted((k, v.name if isinstance(v, dtype) else v) for k, v in attrs.items()))


def _run_eager(outs: list[Node], tensors: list) -> list:
    """Run a small graph over concrete tensors now, under the eager policy."""
    plan, result = lower(outs, tensors, _EAGER_POLICY, current_math())
    plan.run(tensors, result)
    return result


# ---------------------------------------------------------------- elementwise ops

_EXAMPLES = {
    1: ">>> y = cl.{name}(cl.tensor([0.5, 2.0]))",
    2: ">>> y = cl.{name}(cl.tensor([0.5, 2.0]), 2.0)",
    3: ">>> y = cl.{name}(cl.tensor([0.5, 2.0]), 2.0, 1.0)",
}
_CONDITIONAL_EXAMPLE = """>>> x = cl.tensor([-1.0, 2.0])
>>> cl.{name}(x > 0, x, 0.0).tolist()
[0.0, 2.0]"""


def _elementwise_function(info: OpInfo):
    """The public function of one op-table entry: eager on tensors, recorded when traced."""
    name = info.name
    if info.arity == 1:
        def f(x: TensorLike) -> TensorLike:
            return _apply(name, [x])
    elif info.arity == 2:
        def f(a: TensorLike | Number, b: TensorLike | Number) -> TensorLike:
            return _apply(name, [a, b])
    else:
        def f(a: TensorLike | Number, b: TensorLike | Number,
              c: TensorLike | Number) -> TensorLike:
            return _apply(name, [a, b, c])
    f.__name__ = f.__qualname__ = name
    example = (_CONDITIONAL_EXAMPLE if info.category == "conditional"
               else _EXAMPLES[info.arity]).format(name=name)
    result = "bool" if info.category == "compare" else "computed in op-math, rounded once"
    f.__doc__ = f"{info.formula} ({result}).\n\n{example}\n"
    return f


#: The elementwise functions of the op table (ops/op_table.h), by name.
ELEMENTWISE_FUNCTIONS: dict[str, Any] = {o.name: _elementwise_function(o)
                                         for o in OPS.values() if o.public}


def gelu(x: TensorLike, approximate: str = "none") -> TensorLike:
    """GELU as PyTorch: ``x * 0.5 * (1 + erf(x / sqrt(2)))``, or the tanh form.

    >>> cl.gelu(cl.zeros(1)).tolist()
    [0.0]
    """
    if approximate == "none":
        return _apply("gelu", [x])
    if approximate == "tanh":
        return _apply("gelu_tanh", [x])
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


ELEMENTWISE_FUNCTIONS["gelu"] = gelu
globals().update({k: v for k, v in ELEMENTWISE_FUNCTIONS.items() if k != "gelu"})


def astype(x: TensorLike, dt: Any) -> TensorLike:
    """Convert to dtype `dt` (round to nearest even; exact when widening).

    >>> cl.tensor([1.0 + 2**-9]).astype(cl.bfloat16).tolist()
    [1.0]
    """
    dt = as_dtype(dt)
    if not tracing() and isinstance(x, Tensor) and x._dtype_name == dt.name:
        return x
    return _apply("astype", [x], {"dtype": dt})


def _store(x: TensorLike, dt: Any) -> TensorLike:
    """`x` rounded to `dt` as a kernel's store to a `dt` buffer rounds it: under every
    policy but fp64, whether or not the policy rounds casts (castlab.torch's Inductor
    placement: a value one kernel stores and another loads)."""
    return _apply("astype", [x], {"dtype": as_dtype(dt), "store": True})


# ---------------------------------------------------------------- shape ops

def _fake(shape: Sequence[int]):
    """A stride-0 tensor of any shape: lets traced views reuse the C++ checks."""
    return _C.empty([1], "bool", "cpu")._expand(list(shape)) if len(shape) else _C.empty([], "bool", "cpu")


def _view(x: TensorLike, vop: tuple) -> TensorLike:
    if vop[0] in ("reshape", "expand"):
        for s in vop[1]:
            if isinstance(s, int) and not -2**63 <= s < 2**63:
                raise ValueError(f"{vop[0]}: size {s} in {list(vop[1])} does not fit in 64 bits")
    if isinstance(x, Proxy):
        vop = _norm_vop(vop, x.shape)
        if vop[0] == "reshape":
            shape = tuple(_fake(x.shape)._infer_shape(list(vop[1])))
            vop = ("reshape", shape)
        else:
            shape = tuple(apply_view(_fake(x.shape), vop).shape)
        n = view_node(vop[0], x.node, shape, {"vop": vop})
        record(n)
        return Proxy(n)
    if not isinstance(x, Tensor):
        x = _to_tensor(x)
    if vop[0] == "reshape":
        v = x._view_or_none(list(vop[1]))
        if v is None:
            v = contiguous(x)._view_or_none(list(vop[1]))
        return v
    return apply_view(x, vop)


def _int1(fn: str, what: str, v, vals) -> int:
    if isinstance(v, Tensor) and not v.shape and not as_dtype(v._dtype_name).is_floating_point \
            and v._dtype_name != "bool":
        return int(v)  # a 0-d integer castlab tensor (torch takes 0-d int tensors too)
    if not hasattr(type(v), "__index__"):
        raise TypeError(f"{fn}: {what} must be ints, got {type(v).__name__} {v!r} in "
                        f"{tuple(vals)!r}")
    return operator.index(v)


def _ints(fn: str, what: str, vals) -> tuple:
    """`vals` as a tuple of Python ints: ints and integer-likes (NumPy integers, 0-d
    integer tensors) pass; floats, strings and the rest raise TypeError, as
    PyTorch does (no silent truncation of 2.5 to 2)."""
    return tuple(v if type(v) is int else _int1(fn, what, v, vals) for v in vals)


def reshape(x: TensorLike, *shape) -> TensorLike:
    """A tensor with the same elements in a new shape: a view when possible (as
    PyTorch), else a copy. One dimension may be -1.

    >>> cl.arange(6).reshape(2, 3).shape
    (2, 3)
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return _view(x, ("reshape", _ints("reshape", "shape sizes", shape)))


def view(x: TensorLike, *shape) -> TensorLike:
    """Like reshape, but never copies (raises when no view exists).

    >>> cl.arange(6).view(3, 2).shape
    (3, 2)
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if isinstance(x, Proxy):
        return reshape(x, *shape)
    return x.__class__._view_checked(x, list(_ints("view", "shape sizes", shape)))


def permute(x: TensorLike, *dims) -> TensorLike:
    """Reorder dimensions (a view).

    >>> cl.zeros(2, 3, 4).permute(2, 0, 1).shape
    (4, 2, 3)
    """
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return _view(x, ("permute", _ints("permute", "dims", dims)))


def transpose(x: TensorLike, dim0: int, dim1: int) -> TensorLike:
    """Swap two dimensions (a view).

    >>> cl.zeros(2, 3).transpose(0, 1).shape
    (3, 2)
    """
    nd = len(x.shape)
    perm = list(range(nd))
    if nd:
        d0 = _C.empty([1] * nd, "bool", "cpu")._transpose(dim0, dim1)  # validates the dims
        del d0
        d0, d1 = dim0 % nd, dim1 % nd
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        _C.empty([], "bool", "cpu")._transpose(dim0, dim1)
    return _view(x, ("permute", tuple(perm)))


def unsqueeze(x: TensorLike, dim: int) -> TensorLike:
    """Insert a dimension of size 1 (a view).

    >>> cl.zeros(3).unsqueeze(0).shape
    (1, 3)
    """
    return _view(x, ("unsqueeze", int(dim)))


def squeeze(x: TensorLike, dim: int | None = None) -> TensorLike:
    """Remove size-1 dimensions (all, or only `dim`) (a view).

    >>> cl.zeros(1, 3, 1).squeeze().shape
    (3,)
    """
    if dim is None:
        out = x
        for d in reversed(range(len(x.shape))):
            if x.shape[d] == 1:
                out = _view(out, ("squeeze", d))
        return out
    return _view(x, ("squeeze", int(dim)))


def expand(x: TensorLike, *shape) -> TensorLike:
    """Broadcast to a larger shape without copying (-1 keeps a dimension).

    >>> cl.zeros(3).expand(2, 3).shape
    (2, 3)
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return _view(x, ("expand", _ints("expand", "shape sizes", shape)))


def broadcast_to(x: TensorLike, shape: Sequence[int]) -> TensorLike:
    """Broadcast to `shape` as NumPy does (a view).

    >>> cl.zeros(3).broadcast_to((2, 3)).shape
    (2, 3)
    """
    broadcast([tuple(x.shape), tuple(shape)])
    return expand(x, tuple(shape))


def narrow_slice(x: TensorLike, dim: int, start: int, stop: int, step: int = 1) -> TensorLike:
    """x[..., start:stop:step, ...] along `dim` (a view)."""
    return _view(x, ("slice", int(dim), int(start), int(stop), int(step)))


def select(x: TensorLike, dim: int, index: int) -> TensorLike:
    """x[..., index, ...] along `dim`, removing that dimension (a view).

    >>> cl.arange(6).reshape(2, 3).select(0, 1).tolist()
    [3, 4, 5]
    """
    return _view(x, ("select", int(dim), int(index)))


def _dim(x: TensorLike, dim: int) -> int:
    if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
        raise TypeError(f"dim must be an int, not {type(dim).__name__}")
    dim = operator.index(dim)
    nd = len(x.shape)
    if not -nd <= dim < nd or nd == 0:
        raise IndexError(f"dimension {dim} is out of range for a {nd}-d tensor "
                         f"(expected a value in [{-nd}, {nd - 1}])")
    return dim % nd


def split(x: TensorLike, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple:
    """Split into views: chunks of a given size, or of the listed sizes (as torch.split).

    >>> [t.shape for t in cl.zeros(5, 2).split(2)]
    [(2, 2), (2, 2), (1, 2)]
    """
    d = _dim(x, dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, int) or (
            hasattr(type(split_size_or_sections), "__index__")
            and not isinstance(split_size_or_sections, Tensor)):
        s = operator.index(split_size_or_sections)
        if s <= 0:
            raise ValueError("split size must be positive")
        sizes = [min(s, n - i) for i in range(0, n, s)] or [0]
    elif hasattr(split_size_or_sections, "__iter__") and not isinstance(
            split_size_or_sections, (str, bytes)):
        sizes = list(_ints("split", "section sizes", list(split_size_or_sections)))
        if sum(sizes) != n:
            raise ValueError(f"split sizes {sizes} do not add up to dimension {d} of size {n}")
    else:
        raise TypeError(f"split: split_size_or_sections must be an int or a sequence of ints, "
                        f"got {type(split_size_or_sections).__name__} "
                        f"{split_size_or_sections!r}")
    out, o = [], 0
    for s in sizes:
        out.append(narrow_slice(x, d, o, o + s))
        o += s
    if isinstance(x, Proxy):
        # one split, as autograd sees it: its backward concatenates the pieces' gradients
        # (SplitBackward) instead of adding a zero-padded gradient per slice
        first = out[0].node.index
        for k, p in enumerate(out):
            p.node.attrs["split_of"] = (first, k, len(out), d)
    return tuple(out)


def chunk(x: TensorLike, chunks: int, dim: int = 0) -> tuple:
    """Split into `chunks` views of (nearly) equal size, as torch.chunk.

    >>> a, b = cl.chunk(cl.zeros(4, 6), 2, dim=-1)
    >>> a.shape, b.shape
    ((4, 3), (4, 3))
    """
    if chunks <= 0:
        raise ValueError("chunks must be positive")
    d = _dim(x, dim)
    n = x.shape[d]
    size = -(-n // chunks) if n else 0
    return split(x, size, d) if size else (narrow_slice(x, d, 0, 0),)


def cat(tensors: Sequence[TensorLike], dim: int = 0) -> TensorLike:
    """Concatenate along an existing dimension (dtypes promoted as PyTorch).

    >>> cl.cat([cl.zeros(2), cl.ones(1)]).tolist()
    [0.0, 0.0, 1.0]
    """
    _check_tensor_seq("cat", tensors)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat expects a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, (Tensor, Proxy)):
            raise TypeError(f"cat: expected a sequence of castlab Tensors, but element {i} "
                            f"is {type(t).__name__}")
    dt: dtype = None
    for t in tensors:  # every tensor takes part in the promotion, skipped ones as well
        tdt = t.dtype if isinstance(t, Proxy) else as_dtype(t._dtype_name)
        dt = tdt if dt is None else promote_types(dt, tdt)
    # PyTorch's legacy rule: a 1-d empty tensor (shape [0]) is skipped whatever the others'
    # shapes (an empty KV cache concatenated with the first keys)
    kept = [(i, t) for i, t in enumerate(tensors) if list(t.shape) != [0]]
    if not kept or len(kept) == len(tensors):
        kept = list(enumerate(tensors))
    tensors = [t for _, t in kept]
    nd = len(tensors[0].shape)
    if nd == 0:
        raise ValueError("cat: zero-dimensional tensors cannot be concatenated")
    d = _dim(tensors[0], dim)
    base = list(tensors[0].shape)
    for i, t in kept:  # (i: the position the caller gave it)
        s = list(t.shape)
        if len(s) != nd or any(s[k] != base[k] for k in range(nd) if k != d):
            raise ValueError(f"cat: tensor {i} has shape {s}, which does not match "
                             f"{base} outside dimension {d}")
    shape = list(base)
    shape[d] = sum(t.shape[d] for t in tensors)
    if tracing() or any(isinstance(t, Proxy) for t in tensors):
        nodes = [t.node if isinstance(t, Proxy) else _trace_input(t) for t in tensors]
        nodes = [n if n.dtype is dt else _astype_node(n, dt) for n in nodes]
        n = cat_node(nodes, d, tuple(shape), dt)
        record(n)
        return Proxy(n)
    nodes = [input_node(t, i) for i, t in enumerate(tensors)]
    nodes = [n if n.dtype is dt else elementwise("astype", [n], {"dtype": dt}) for n in nodes]
    n = cat_node(nodes, d, tuple(shape), dt)
    return _run_eager([n], tensors)[0]


def _check_tensor_seq(fn: str, tensors) -> None:
    if isinstance(tensors, (Tensor, Proxy, str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{fn}: expected a sequence (list or tuple) of tensors, "
                        f"got {type(tensors).__name__}")


def _astype_node(n: Node, dt: dtype) -> Node:
    m = elementwise("astype", [n], {"dtype": dt})
    record(m)
    return m


def stack(tensors: Sequence[TensorLike], dim: int = 0) -> TensorLike:
    """Stack along a new dimension.

    >>> cl.stack([cl.zeros(2), cl.ones(2)], dim=1).shape
    (2, 2)
    """
    _check_tensor_seq("stack", tensors)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack expects a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, (Tensor, Proxy)):
            raise TypeError(f"stack: expected a sequence of castlab Tensors, but element {i} "
                            f"is {type(t).__name__}")
    shape0 = tuple(tensors[0].shape)
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape0:
            raise ValueError(f"stack: tensor {i} has shape {list(t.shape)}, expected {list(shape0)}")
    nd = len(shape0) + 1
    if not -nd <= dim < nd:
        raise IndexError(f"dimension {dim} is out of range for stacking {nd - 1}-d tensors")
    return cat([unsqueeze(t, dim % nd) for t in tensors], dim % nd)


def contiguous(x: TensorLike) -> TensorLike:
    """x itself if it is contiguous, else a contiguous copy.

    >>> cl.zeros(2, 3).t().contiguous().is_contiguous()
    True
    """
    if isinstance(x, Proxy):
        return x
    if not isinstance(x, Tensor):
        raise TypeError(f"contiguous: expected a castlab Tensor, not {type(x).__name__}")
    if x.is_contiguous():
        return x
    return clone(x)


def clone(x: TensorLike) -> TensorLike:
    """A contiguous copy with the same values and dtype.

    >>> cl.ones(2).clone().tolist()
    [1.0, 1.0]
    """
    if isinstance(x, Proxy):
        return x
    if not isinstance(x, Tensor):
        raise TypeError(f"clone: expected a castlab Tensor, not {type(x).__name__}")
    n = input_node(x, 0)
    out = _C.empty(list(x.shape), x._dtype_name, x._device_str)
    plan, _ = lower([n], [x], _EAGER_POLICY, current_math())
    plan.run([x], [out])
    return out


def copy_(dst, src) -> None:
    """Write src (broadcast, converted to dst's dtype with one rounding) into dst.

    dst may be any view (steps, select, transpose, a NumPy or DLPack import): the elements
    written are the ones dst reaches through its own strides. When src and dst share
    memory other than element for element (``x[1:] = x[:-1]``, also through two imports of
    one buffer), src is first copied to a temporary, as NumPy does.

    >>> x = cl.zeros(2, 3); x[:, 1] = 5.0
    >>> x.tolist()
    [[0.0, 5.0, 0.0], [0.0, 5.0, 0.0]]
    """
    if not isinstance(dst, Tensor):
        raise TypeError(f"copy_: the destination must be a castlab Tensor, got {type(dst).__name__}")
    if dst.readonly:
        raise ValueError("cannot write to a read-only tensor")
    if _C.has_internal_overlap(dst):
        raise ValueError("copy_: several elements of the destination share one memory location "
                         "(an expanded view); write into a tensor without repeated elements")
    if isinstance(src, (bool, int, float)):
        src = full((), src, dtype=as_dtype(dst._dtype_name), device=dst._device_str)
    elif isinstance(src, Proxy):
        raise TypeError("copy_: a traced tensor cannot be written into a concrete tensor")
    elif not isinstance(src, Tensor):
        src = _to_tensor(src)
    if src._device_str != dst._device_str:
        src = _to_device(src, dst._device_str)
    shape = list(dst.shape)
    if tuple(src.shape) != tuple(dst.shape):
        given = list(src.shape)
        while len(src.shape) > len(shape) and src.shape[0] == 1:
            src = src._squeeze(0)  # leading 1s are dropped, as NumPy and PyTorch do
        try:
            ok = broadcast([tuple(src.shape), tuple(shape)]) == tuple(shape)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"copy_: a value of shape {given} cannot be broadcast to "
                             f"the destination's shape {shape}")
        expanded = src._expand(shape)
    else:
        expanded = src
    if dst.numel() == 0:
        return
    if _C.may_overlap(src, dst) and not _C.same_elements(expanded, dst):
        expanded = clone(src)._expand(shape)  # read everything before writing anything
    n = input_node(expanded, 0)
    if n.dtype.name != dst._dtype_name:
        n = elementwise("astype", [n], {"dtype": as_dtype(dst._dtype_name)})
    plan, _ = lower([n], [expanded], _EAGER_POLICY, current_math(), out_tensors=[dst])
    plan.run([expanded], [dst])


#: Shape and conversion functions (the elementwise ones come from the op table).
SHAPE_FUNCTIONS = (
    "astype", "reshape", "view", "permute", "transpose", "unsqueeze", "squeeze", "expand",
    "broadcast_to", "select", "split", "chunk", "cat", "stack", "contiguous", "clone",
)
__all__ = [*ELEMENTWISE_FUNCTIONS, *SHAPE_FUNCTIONS, "copy_"]
