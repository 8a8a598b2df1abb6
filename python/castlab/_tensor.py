"""Python-level methods of castlab.Tensor (the C++ class castlab._C.Tensor) and of the
symbolic tensors used while tracing: operators, indexing, NumPy interop, printing."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _C, _index, _reduce, cuda, ops
from ._device import as_device, device
from ._dtype import as_dtype, dtype
from ._graph import Proxy
from ._optable import OPS

Tensor = _C.Tensor

__all__ = ["Tensor", "device"]


# ---------------------------------------------------------------- indexing

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


def _getitem(self, key):
    out = self
    for vop in _index_vops(tuple(self.shape), key):
        out = ops._view(out, vop)
    return out


def _setitem(self, key, value):
    target = _getitem(self, key)
    ops.copy_(target, value)


# ---------------------------------------------------------------- NumPy

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


def _numpy(self) -> np.ndarray:
    """A NumPy array sharing this tensor's memory (ml_dtypes dtypes for bf16/fp8).

    >>> t = cl.zeros(3, dtype=cl.bfloat16); a = t.numpy(); a[0] = 2
    >>> t.tolist()[0]
    2.0
    """
    if self._device_type != 0:
        raise TypeError(f"can't convert a {self._device_str} tensor to NumPy; call .cpu() first")
    dt = as_dtype(self._dtype_name)
    raw = np.asarray(_ArrayHolder(self))
    return raw.view(dt.numpy)


def _array(self, dtype=None, copy=None):
    a = _numpy(self)
    if dtype is not None and np.dtype(dtype) != a.dtype:
        if copy is False:
            raise ValueError("a copy is needed to convert to the requested dtype")
        return a.astype(dtype)
    if copy:
        return a.copy()
    return a


def _tolist(self):
    """Values as nested Python lists (floats, ints or bools).

    >>> cl.tensor([1.5, 2.0], dtype=cl.bfloat16).tolist()
    [1.5, 2.0]
    """
    a = _numpy(self.cpu())
    dt = as_dtype(self._dtype_name)
    if dt.is_floating_point:
        a = a.astype(np.float64)
    return a.tolist()


def _item(self):
    """The value of a one-element tensor as a Python number."""
    if self.numel() != 1:
        raise ValueError(f"item() needs a tensor with one element, this one has {self.numel()}")
    v = _tolist(self.reshape(()))
    return v


# ---------------------------------------------------------------- printing

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


def _repr(self) -> str:
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
        a = _numpy(_summarized(self).cpu() if big else self.cpu())
        if dt.is_floating_point:
            a = a.astype(np.float64)
        # PyTorch prints "1., 2." when every finite value is integral, else 4 fixed decimals
        fin = a[np.isfinite(a)] if dt.is_floating_point else a
        fmode = "maxprec" if (not dt.is_floating_point or np.all(fin == np.round(fin))) else "fixed"
        body = np.array2string(a, separator=", ", prefix="tensor(", threshold=0 if big else 1000,
                               edgeitems=3, precision=4, floatmode=fmode)
    s = "tensor(" + body
    if suffix:
        s += ", " + ", ".join(suffix)
    return s + ")"


_BADGE = ("display:inline-block;padding:0 6px;margin-right:4px;border-radius:8px;"
          "font-size:85%;font-family:monospace;background:{bg};color:{fg}")


def _badge(text: str, bg: str = "#e8eaf6", fg: str = "#1a237e") -> str:
    import html

    return f"<span style='{_BADGE.format(bg=bg, fg=fg)}'>{html.escape(text)}</span>"


def _repr_html(self) -> str:
    """Jupyter's view of a tensor: badges with the dtype, device, shape and element
    count, over the plain repr (the same text as ``repr()``, which PyTorch's printing
    options summarise with "..." beyond 1000 elements) in a block that scrolls
    sideways instead of wrapping.

    >>> h = cl.ones(2, 3, dtype=cl.bfloat16)._repr_html_()
    >>> "bfloat16" in h and "cpu" in h and "(2, 3)" in h
    True
    """
    import html

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
            + html.escape(_repr(self)) + "</pre></div></div>")


# ---------------------------------------------------------------- devices

def _to(self, *args, **kwargs):
    """Move to a device and/or convert to a dtype: ``t.to("cuda:1")``, ``t.to(cl.float32)``,
    ``t.to(device, dtype)``. Devices: "cpu", "cuda", "cuda:N", a device object or an int."""
    dev = kwargs.pop("device", None)
    dt = kwargs.pop("dtype", None)
    if kwargs:
        raise TypeError(f"unexpected arguments {list(kwargs)}")
    if len(args) > 2:
        raise TypeError(f"to() takes at most a device and a dtype, got {len(args)} arguments")
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


def _cpu(self):
    return _to(self, "cpu")


def _cuda(self, index: Any = None):
    """A copy on ``cuda:index`` (``cuda:0`` by default; ``index`` may be a device)."""
    return _to(self, as_device(0 if index is None else index))


# ---------------------------------------------------------------- attach

def _rop(fn):
    def r(self, other):
        return fn(other, self)

    return r


def _install(cls, concrete: bool):
    m = {
        "__add__": ops.add, "__radd__": _rop(ops.add), "__sub__": ops.sub,
        "__rsub__": _rop(ops.sub), "__mul__": ops.mul, "__rmul__": _rop(ops.mul),
        "__truediv__": ops.div, "__rtruediv__": _rop(ops.div), "__pow__": ops.pow,
        "__rpow__": _rop(ops.pow), "__neg__": ops.neg, "__abs__": ops.abs,
        "__pos__": lambda self: self,
        "__lt__": ops.lt, "__le__": ops.le, "__gt__": ops.gt, "__ge__": ops.ge,
        "__eq__": ops.eq, "__ne__": ops.ne,
        "__getitem__": _getitem,
        "astype": ops.astype, "reshape": ops.reshape, "view": ops.view, "permute": ops.permute,
        "transpose": ops.transpose, "unsqueeze": ops.unsqueeze, "squeeze": ops.squeeze,
        "expand": ops.expand, "broadcast_to": ops.broadcast_to, "chunk": ops.chunk,
        "split": ops.split, "contiguous": ops.contiguous, "clone": ops.clone,
        "select": ops.select,
        "t": lambda self: ops.transpose(self, 0, 1) if len(self.shape) == 2 else self,
        "flatten": lambda self: ops.reshape(self, -1),
        "sum": _reduce.sum, "mean": _reduce.mean, "amax": _reduce.amax, "amin": _reduce.amin,
        "var": _reduce.var, "softmax": _reduce.softmax, "log_softmax": _reduce.log_softmax,
        "gather": _index.gather, "take_along_dim": _index.take_along_dim,
    }
    # Every public elementwise op of the op table is a method too (x.exp(), x.add(y)).
    for name, fn in ops.ELEMENTWISE_FUNCTIONS.items():
        if OPS[name].arity <= 2:
            m.setdefault(name, fn)
    for k, v in m.items():
        setattr(cls, k, v)
    cls.__hash__ = object.__hash__
    cls.T = property(lambda self: ops.permute(self, tuple(reversed(range(len(self.shape))))))
    if concrete:
        cls.__setitem__ = _setitem
        cls.numpy = _numpy
        cls.__array__ = _array
        cls.__array_priority__ = 1000
        cls.tolist = _tolist
        cls.item = _item
        cls.__repr__ = _repr
        cls.__str__ = _repr
        cls._repr_html_ = _repr_html
        cls.to = _to
        cls.cpu = _cpu
        cls.cuda = _cuda
        cls.dtype = property(lambda self: as_dtype(self._dtype_name))
        cls.device = property(lambda self: as_device(self._device_str))
        cls.is_cuda = property(lambda self: self._device_type == 1)
        cls.stride = lambda self, d=None: tuple(self._strides) if d is None else self._strides[d]
        cls.size = lambda self, d=None: tuple(self.shape) if d is None else self.shape[d]
        cls.storage_offset = lambda self: self._offset
        cls.element_size = lambda self: self.itemsize
        cls.__len__ = _len
        cls.__iter__ = lambda self: (self[i] for i in range(len(self)))
        cls.__bool__ = lambda self: bool(_item(self))
        cls.__float__ = lambda self: float(_item(self))
        cls.__int__ = lambda self: int(_item(self))
        cls._view_checked = lambda self, shape: self._view_checked_impl(shape)
        cls._view_checked_impl = _view_checked_impl


def _len(self):
    if not self.shape:
        raise TypeError("len() of a 0-d tensor")
    return self.shape[0]


def _view_checked_impl(self, shape):
    v = self._view_or_none(list(shape))
    if v is None:
        raise ValueError(f"view of shape {list(shape)} is not possible for a tensor of shape "
                         f"{list(self.shape)} with strides {list(self._strides)}; use reshape(), "
                         "which copies")
    return v


_install(Tensor, True)
_install(Proxy, False)
