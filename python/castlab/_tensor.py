"""castlab.Tensor's Python methods, written once: the operators, shape ops, reductions,
indexing, NumPy interop, printing and device moves of concrete tensors (the C++ class
castlab._C.Tensor) and of the symbolic tensors that castlab.jit traces with (Proxy).

Every method has one home, a class body here: :class:`TensorMethods` (what both kinds of
tensor have) and :class:`ConcreteTensorMethods` (what only a tensor with values has).
Neither tensor class can inherit them: _C.Tensor is a pybind11 class, and Proxy lives in
_graph, a layer below the ops these methods call. So :func:`_adopt` copies each class's
attributes onto them once, at import, unchanged (``cl.Tensor.reshape`` *is*
``TensorMethods.reshape``). For static tools, _C.pyi declares
``class Tensor(ConcreteTensorMethods)`` with the members bound in C++
(python/src/bind_tensor.cpp).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _C, _dlpack, _index, _reduce, cuda, ops
from ._device import as_device, device
from ._dtype import as_dtype, dtype
from ._graph import Proxy
from .ops import Number, TensorLike

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from typing_extensions import Self

    from ._device import device as Device
    from ._dtype import dtype as DType

Tensor = _C.Tensor

__all__ = ["Tensor", "device"]


# ---------------------------------------------------------------- helpers

_I64 = 2**63  # indices and slice bounds are int64 in C++

def _index_vops(shape: tuple, key: Any) -> list:
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > len(shape):
        raise IndexError(f"too many indices for a tensor of dimension {len(shape)}")
    vops = []
    d = 0
    for k in key:
        if k is Ellipsis:
            d += len(shape) - consumed
        elif k is None:
            vops.append(("unsqueeze", d))
            d += 1
        elif isinstance(k, slice):
            step = 1 if k.step is None else int(k.step)
            if step <= 0:
                raise ValueError("slice step must be positive (castlab, like PyTorch, has no "
                                 "negative strides)")
            # clamp to int64 (the C++ slice clamps to the dimension, as Python does)
            start = 0 if k.start is None else min(max(int(k.start), -_I64), _I64 - 1)
            stop = _I64 - 1 if k.stop is None else min(max(int(k.stop), -_I64), _I64 - 1)
            vops.append(("slice", d, start, stop, min(step, _I64 - 1)))
            d += 1
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            if not -_I64 <= int(k) < _I64:
                raise IndexError(f"index {int(k)} is out of bounds for dimension {d} with size "
                                 f"{shape[d] if d < len(shape) else '?'}")
            vops.append(("select", d, int(k)))
        elif isinstance(k, (Tensor, Proxy, np.ndarray, list, bool)):
            raise TypeError("advanced (tensor/list/bool) indexing is not supported; castlab "
                            "supports integers, slices, None and ...")
        else:
            raise TypeError(f"invalid index of type {type(k).__name__}")
    return vops


class _ArrayHolder:
    """Keeps a tensor alive for as long as a NumPy view of it exists."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t):
        self.tensor = t
        isz = t.itemsize
        self.__array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": f"|V{isz}",
            "data": (t.data_ptr(), bool(t.readonly)),
            "strides": tuple(s * isz for s in t._strides),
            "version": 3,
        }


def _summarized(t):
    """The elements a summarised repr shows (3 at each end of every dimension longer than
    6, and one from the middle that NumPy replaces by "..."), gathered on the tensor's
    own device: printing a large tensor copies only these, as PyTorch's printing does."""
    for d, n in enumerate(t.shape):
        if n > 7:
            m = n // 2
            t = ops.cat([ops.narrow_slice(t, d, 0, 3), ops.narrow_slice(t, d, m, m + 1),
                         ops.narrow_slice(t, d, n - 3, n)], d)
    return t


_BADGE = ("display:inline-block;padding:0 6px;margin-right:4px;border-radius:8px;"
          "font-size:85%;font-family:monospace;background:{bg};color:{fg}")


def _badge(text: str, bg: str = "#e8eaf6", fg: str = "#1a237e") -> str:
    return f"<span style='{_BADGE.format(bg=bg, fg=fg)}'>{html.escape(text)}</span>"


def _is_dtype_like(a: Any) -> bool:
    """Whether a positional argument of ``to()`` is a dtype (a string only when it is a
    dtype name; other strings are parsed as devices)."""
    if isinstance(a, (dtype, np.dtype)) or any(a is t for t in (float, int, bool)):
        return True
    if isinstance(a, type) and issubclass(a, np.generic):
        return True
    if type(a).__module__.startswith("torch") and type(a).__name__ == "dtype":
        return True
    if isinstance(a, str):
        try:
            as_dtype(a)
        except TypeError:
            return False
        return True
    return False


# ---------------------------------------------------------------- the methods

class TensorMethods:
    """The methods, properties and operators of every castlab tensor: concrete ones
    (castlab.Tensor) and those castlab.jit traces with. Most are the method form of a
    castlab function (``x.exp()`` is ``cl.exp(x)``), eager on a concrete tensor and
    recorded into the graph while tracing."""

    __slots__ = ()

    # -- operators (Python numbers are weak scalars: ``x * 0.5`` keeps x's dtype)

    def __add__(self, other: TensorLike | Number) -> Self:
        return ops.add(self, other)

    def __radd__(self, other: TensorLike | Number) -> Self:
        return ops.add(other, self)

    def __sub__(self, other: TensorLike | Number) -> Self:
        return ops.sub(self, other)

    def __rsub__(self, other: TensorLike | Number) -> Self:
        return ops.sub(other, self)

    def __mul__(self, other: TensorLike | Number) -> Self:
        return ops.mul(self, other)

    def __rmul__(self, other: TensorLike | Number) -> Self:
        return ops.mul(other, self)

    def __truediv__(self, other: TensorLike | Number) -> Self:
        return ops.div(self, other)

    def __rtruediv__(self, other: TensorLike | Number) -> Self:
        return ops.div(other, self)

    def __pow__(self, other: TensorLike | Number) -> Self:
        return ops.pow(self, other)

    def __rpow__(self, other: TensorLike | Number) -> Self:
        return ops.pow(other, self)

    def __neg__(self) -> Self:
        return ops.neg(self)

    def __abs__(self) -> Self:
        return ops.abs(self)

    def __pos__(self) -> Self:
        return self

    def __lt__(self, other: TensorLike | Number) -> Self:
        return ops.lt(self, other)

    def __le__(self, other: TensorLike | Number) -> Self:
        return ops.le(self, other)

    def __gt__(self, other: TensorLike | Number) -> Self:
        return ops.gt(self, other)

    def __ge__(self, other: TensorLike | Number) -> Self:
        return ops.ge(self, other)

    def __eq__(self, other: TensorLike | Number) -> Self:  # type: ignore[override]
        return ops.eq(self, other)

    def __ne__(self, other: TensorLike | Number) -> Self:  # type: ignore[override]
        return ops.ne(self, other)

    # defining __eq__ sets __hash__ to None; tensors hash by identity (dict keys, sets)
    __hash__ = object.__hash__

    def __getitem__(self, key: Any) -> Self:
        """Basic indexing as NumPy's and PyTorch's (a view): integers, slices with a
        positive step, None and ``...``."""
        out = self
        for vop in _index_vops(tuple(self.shape), key):
            out = ops._view(out, vop)
        return out

    # -- shapes and dtypes

    def astype(self, dt: Any) -> Self:
        """Method form of :func:`castlab.astype`."""
        return ops.astype(self, dt)

    def reshape(self, *shape) -> Self:
        """Method form of :func:`castlab.reshape`."""
        return ops.reshape(self, *shape)

    def view(self, *shape) -> Self:
        """Method form of :func:`castlab.view`."""
        return ops.view(self, *shape)

    def permute(self, *dims) -> Self:
        """Method form of :func:`castlab.permute`."""
        return ops.permute(self, *dims)

    def transpose(self, dim0: int, dim1: int) -> Self:
        """Method form of :func:`castlab.transpose`."""
        return ops.transpose(self, dim0, dim1)

    def unsqueeze(self, dim: int) -> Self:
        """Method form of :func:`castlab.unsqueeze`."""
        return ops.unsqueeze(self, dim)

    def squeeze(self, dim: int | None = None) -> Self:
        """Method form of :func:`castlab.squeeze`."""
        return ops.squeeze(self, dim)

    def expand(self, *shape) -> Self:
        """Method form of :func:`castlab.expand`."""
        return ops.expand(self, *shape)

    def broadcast_to(self, shape: Sequence[int]) -> Self:
        """Method form of :func:`castlab.broadcast_to`."""
        return ops.broadcast_to(self, shape)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        """Method form of :func:`castlab.chunk`."""
        return ops.chunk(self, chunks, dim)

    def split(self, split_size_or_sections: int | Sequence[int],
              dim: int = 0) -> tuple[Self, ...]:
        """Method form of :func:`castlab.split`."""
        return ops.split(self, split_size_or_sections, dim)

    def contiguous(self) -> Self:
        """Method form of :func:`castlab.contiguous`."""
        return ops.contiguous(self)

    def clone(self) -> Self:
        """Method form of :func:`castlab.clone`."""
        return ops.clone(self)

    def select(self, dim: int, index: int) -> Self:
        """Method form of :func:`castlab.select`."""
        return ops.select(self, dim, index)

    def t(self) -> Self:
        """The transpose of a 2-d tensor (dimensions 0 and 1 swapped, a view); a tensor of
        fewer dimensions as it is."""
        return ops.transpose(self, 0, 1) if len(self.shape) == 2 else self

    def flatten(self) -> Self:
        """The elements as one dimension (a view when possible)."""
        return ops.reshape(self, -1)

    @property
    def T(self) -> Self:
        """Every dimension reversed (a view)."""
        return ops.permute(self, tuple(reversed(range(len(self.shape)))))

    # -- reductions, normalisation and indexing

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,
            dtype: Any = None) -> Self:
        """Method form of :func:`castlab.sum`."""
        return _reduce.sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, *,
             dtype: Any = None) -> Self:
        """Method form of :func:`castlab.mean`."""
        return _reduce.mean(self, dim, keepdim, dtype=dtype)

    def amax(self, dim: int | Sequence[int] = (), keepdim: bool = False) -> Self:
        """Method form of :func:`castlab.amax`."""
        return _reduce.amax(self, dim, keepdim)

    def amin(self, dim: int | Sequence[int] = (), keepdim: bool = False) -> Self:
        """Method form of :func:`castlab.amin`."""
        return _reduce.amin(self, dim, keepdim)

    def var(self, dim: int | Sequence[int] | None = None, *, correction: float = 1,
            keepdim: bool = False) -> Self:
        """Method form of :func:`castlab.var`."""
        return _reduce.var(self, dim, correction=correction, keepdim=keepdim)

    def softmax(self, dim: int, dtype: Any = None) -> Self:
        """Method form of :func:`castlab.softmax`."""
        return _reduce.softmax(self, dim, dtype)

    def log_softmax(self, dim: int, dtype: Any = None) -> Self:
        """Method form of :func:`castlab.log_softmax`."""
        return _reduce.log_softmax(self, dim, dtype)

    def gather(self, dim: int, index: TensorLike, *, sparse_grad: bool = False) -> Self:
        """Method form of :func:`castlab.gather`."""
        return _index.gather(self, dim, index, sparse_grad=sparse_grad)

    def take_along_dim(self, indices: TensorLike, dim: int | None = None) -> Self:
        """Method form of :func:`castlab.take_along_dim`."""
        return _index.take_along_dim(self, indices, dim)

    # -- the op table's elementwise functions of one or two operands (ops/op_table.h;
    #    tests/test_tensor.py checks that each has its method here)

    def neg(self) -> Self:
        """Method form of :func:`castlab.neg`."""
        return ops.neg(self)

    def abs(self) -> Self:
        """Method form of :func:`castlab.abs`."""
        return ops.abs(self)

    def exp(self) -> Self:
        """Method form of :func:`castlab.exp`."""
        return ops.exp(self)

    def log(self) -> Self:
        """Method form of :func:`castlab.log`."""
        return ops.log(self)

    def sigmoid(self) -> Self:
        """Method form of :func:`castlab.sigmoid`."""
        return ops.sigmoid(self)

    def silu(self) -> Self:
        """Method form of :func:`castlab.silu`."""
        return ops.silu(self)

    def tanh(self) -> Self:
        """Method form of :func:`castlab.tanh`."""
        return ops.tanh(self)

    def sqrt(self) -> Self:
        """Method form of :func:`castlab.sqrt`."""
        return ops.sqrt(self)

    def rsqrt(self) -> Self:
        """Method form of :func:`castlab.rsqrt`."""
        return ops.rsqrt(self)

    def reciprocal(self) -> Self:
        """Method form of :func:`castlab.reciprocal`."""
        return ops.reciprocal(self)

    def square(self) -> Self:
        """Method form of :func:`castlab.square`."""
        return ops.square(self)

    def cos(self) -> Self:
        """Method form of :func:`castlab.cos`."""
        return ops.cos(self)

    def sin(self) -> Self:
        """Method form of :func:`castlab.sin`."""
        return ops.sin(self)

    def erf(self) -> Self:
        """Method form of :func:`castlab.erf`."""
        return ops.erf(self)

    def hardswish(self) -> Self:
        """Method form of :func:`castlab.hardswish`."""
        return ops.hardswish(self)

    def gelu(self, approximate: str = "none") -> Self:
        """Method form of :func:`castlab.gelu`."""
        return ops.gelu(self, approximate)

    def add(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.add`."""
        return ops.add(self, b)

    def sub(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.sub`."""
        return ops.sub(self, b)

    def mul(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.mul`."""
        return ops.mul(self, b)

    def div(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.div`."""
        return ops.div(self, b)

    def maximum(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.maximum`."""
        return ops.maximum(self, b)

    def minimum(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.minimum`."""
        return ops.minimum(self, b)

    def pow(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.pow`."""
        return ops.pow(self, b)

    def eq(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.eq`."""
        return ops.eq(self, b)

    def ne(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.ne`."""
        return ops.ne(self, b)

    def lt(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.lt`."""
        return ops.lt(self, b)

    def le(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.le`."""
        return ops.le(self, b)

    def gt(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.gt`."""
        return ops.gt(self, b)

    def ge(self, b: TensorLike | Number) -> Self:
        """Method form of :func:`castlab.ge`."""
        return ops.ge(self, b)


class ConcreteTensorMethods(TensorMethods):
    """The methods of a tensor that holds values (castlab.Tensor), beyond those it shares
    with traced tensors: element access, NumPy and DLPack interop, printing, devices,
    strides. (A traced tensor has no values: its own methods for these raise.)"""

    __slots__ = ()

    # NumPy defers binary operators with an ndarray to ours (``array + tensor``)
    __array_priority__ = 1000

    def __setitem__(self, key: Any, value: Any) -> None:
        """Write ``value`` (a tensor or a number, broadcast) into ``self[key]``."""
        ops.copy_(self[key], value)

    # -- elements

    def numpy(self) -> np.ndarray:
        """A NumPy array sharing this tensor's memory (ml_dtypes dtypes for bf16/fp8).

        >>> t = cl.zeros(3, dtype=cl.bfloat16); a = t.numpy(); a[0] = 2
        >>> t.tolist()[0]
        2.0
        """
        if self._device_type != 0:
            raise TypeError(f"can't convert a {self._device_str} tensor to NumPy; call .cpu() "
                            "first")
        dt = as_dtype(self._dtype_name)
        raw = np.asarray(_ArrayHolder(self))
        return raw.view(dt.numpy)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("a copy is needed to convert to the requested dtype")
            return a.astype(dtype)
        if copy:
            return a.copy()
        return a

    def tolist(self) -> Any:
        """Values as nested Python lists (floats, ints or bools).

        >>> cl.tensor([1.5, 2.0], dtype=cl.bfloat16).tolist()
        [1.5, 2.0]
        """
        a = self.cpu().numpy()
        dt = as_dtype(self._dtype_name)
        if dt.is_floating_point:
            a = a.astype(np.float64)
        return a.tolist()

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has "
                             f"{self.numel()}")
        return self.reshape(()).tolist()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Self]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # -- DLPack (the producer's side; castlab.from_dlpack is the consumer's)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: Any = None, copy: Any = _dlpack.COPY_UNSET) -> Any:
        """Export as a DLPack capsule (array API semantics): see
        :func:`castlab._dlpack.tensor_dlpack`."""
        return _dlpack.tensor_dlpack(self, stream=stream, max_version=max_version,
                                     dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(1, 0)`` on the CPU, ``(2, index)`` on CUDA (DLPack's device codes)."""
        return _dlpack.tensor_dlpack_device(self)

    # -- printing

    def __repr__(self) -> str:
        dt = as_dtype(self._dtype_name)
        dev = self._device_str
        suffix = []
        if dev != "cpu":
            suffix.append(f"device='{dev}'")
        if dt.name not in ("float32", "int64", "bool"):
            suffix.append(f"dtype={dt}")
        if self.numel() == 0:
            body = "[]"
            if self.ndim != 1:
                suffix.insert(0, f"size={tuple(self.shape)}")
        else:
            big = self.numel() > 1000
            a = (_summarized(self).cpu() if big else self.cpu()).numpy()
            if dt.is_floating_point:
                a = a.astype(np.float64)
            # PyTorch prints "1., 2." when every finite value is integral, else 4 fixed decimals
            fin = a[np.isfinite(a)] if dt.is_floating_point else a
            fmode = ("maxprec" if (not dt.is_floating_point or np.all(fin == np.round(fin)))
                     else "fixed")
            body = np.array2string(a, separator=", ", prefix="tensor(",
                                   threshold=0 if big else 1000, edgeitems=3, precision=4,
                                   floatmode=fmode)
        s = "tensor(" + body
        if suffix:
            s += ", " + ", ".join(suffix)
        return s + ")"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        """Jupyter's view of a tensor: badges with the dtype, device, shape and element
        count, over the plain repr (the same text as ``repr()``, which PyTorch's printing
        options summarise with "..." beyond 1000 elements) in a block that scrolls
        sideways instead of wrapping.

        >>> h = cl.ones(2, 3, dtype=cl.bfloat16)._repr_html_()
        >>> "bfloat16" in h and "cpu" in h and "(2, 3)" in h
        True
        """
        dt = as_dtype(self._dtype_name)
        shape = tuple(self.shape)
        n = self.numel()
        badges = [_badge(dt.name, "#e3f2fd", "#0d47a1"),
                  _badge(self._device_str, "#e8f5e9", "#1b5e20") if self._device_str == "cpu"
                  else _badge(self._device_str, "#fff3e0", "#e65100"),
                  _badge("shape " + str(shape)), _badge(f"{n:,} elements")]
        if n > 1000:
            badges.append(_badge("summarised", "#f5f5f5", "#616161"))
        return ("<div class='castlab-tensor'><div style='margin-bottom:2px'>" + "".join(badges)
                + "</div><div style='overflow-x:auto'><pre style='margin:0;white-space:pre'>"
                + html.escape(repr(self)) + "</pre></div></div>")

    # -- dtype, device, layout

    @property
    def dtype(self) -> DType:
        """The element type (a castlab dtype)."""
        return as_dtype(self._dtype_name)

    @property
    def device(self) -> Device:
        """Where the elements live: ``cpu`` or ``cuda:N``."""
        return as_device(self._device_str)

    @property
    def is_cuda(self) -> bool:
        """Whether the tensor is on a CUDA device."""
        return self._device_type == 1

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Move to a device and/or convert to a dtype: ``t.to("cuda:1")``, ``t.to(cl.float32)``,
        ``t.to(device, dtype)``. Devices: "cpu", "cuda", "cuda:N", a device object or an int."""
        dev = kwargs.pop("device", None)
        dt = kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"unexpected arguments {list(kwargs)}")
        if len(args) > 2:
            raise TypeError(f"to() takes at most a device and a dtype, got {len(args)} "
                            "arguments")
        for a in args:
            if _is_dtype_like(a):
                dt = a
            else:  # anything else is a device: as_device raises TypeError/ValueError naming it
                dev = a
        out = self
        if dev is not None:
            d = str(as_device(dev))
            if d != out._device_str:
                out = cuda.to_device(out, d)
        if dt is not None:
            out = ops.astype(out, dt)
        return out

    def cpu(self) -> Self:
        """This tensor if it is on the CPU, else a copy there."""
        return self.to("cpu")

    def cuda(self, index: Any = None) -> Self:
        """A copy on ``cuda:index`` (``cuda:0`` by default; ``index`` may be a device)."""
        return self.to(as_device(0 if index is None else index))

    def size(self, d: int | None = None) -> Any:
        """The shape (a tuple), or the size of dimension ``d``."""
        return tuple(self.shape) if d is None else self.shape[d]

    def stride(self, d: int | None = None) -> Any:
        """The strides in elements (a tuple), or the stride of dimension ``d``."""
        return tuple(self._strides) if d is None else self._strides[d]

    def storage_offset(self) -> int:
        """Where the first element is in the storage, in elements."""
        return self._offset

    def element_size(self) -> int:
        """Bytes per element."""
        return self.itemsize

    def _view_checked(self, shape: Sequence[int]) -> Self:
        """A view of ``shape`` (ops.view), or ValueError when the strides allow none."""
        v = self._view_or_none(list(shape))
        if v is None:
            raise ValueError(f"view of shape {list(shape)} is not possible for a tensor of "
                             f"shape {list(self.shape)} with strides {list(self._strides)}; use "
                             "reshape(), which copies")
        return v


# ---------------------------------------------------------------- attach

# A class body's own bookkeeping, which is not a method to copy.
_CLASS_MACHINERY = frozenset({
    "__module__", "__qualname__", "__doc__", "__slots__", "__dict__", "__weakref__",
    "__annotations__", "__firstlineno__", "__static_attributes__", "__orig_bases__",
})


def _adopt(cls: type, methods: type) -> None:
    """Give ``cls`` the attributes written in ``methods`` and its bases (the objects
    themselves: one definition, in this file). A name ``cls`` defines itself (a C++
    binding, Proxy's own method) is never replaced: that is a bug, raised here."""
    own = set(vars(cls))
    for base in reversed(methods.__mro__[:-1]):
        for name, value in vars(base).items():
            if name in _CLASS_MACHINERY:
                continue
            if name in own:
                raise TypeError(f"{cls.__qualname__}.{name} is defined by {cls.__qualname__} "
                                f"and by {base.__qualname__}")
            setattr(cls, name, value)


_adopt(Tensor, ConcreteTensorMethods)
_adopt(Proxy, TensorMethods)
