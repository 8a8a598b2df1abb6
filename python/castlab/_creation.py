"""Creating tensors, and NumPy interop without copies."""

from __future__ import annotations

import math as _math
import numbers as _numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _C, cuda
from ._device import as_device
from ._dlpack import _check_numpy_bounds, from_dlpack
from ._dtype import as_dtype, bool_, dtype, float32, float64, int64
from ._optable import I64, instr, output

Tensor = _C.Tensor

__all__ = ["tensor", "asarray", "from_numpy", "empty", "zeros", "ones", "full", "arange",
           "rand", "randn", "empty_like", "zeros_like", "ones_like", "full_like"]



def _device_str(device: Any) -> str:
    """"cpu" or "cuda:N" for a device given in any form castlab accepts (None: the CPU)."""
    return str(as_device(device))


def _shape_arg(shape: tuple) -> list[int]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise TypeError(f"shape entries must be integers, got {s!r}")
        if s < 0:
            raise ValueError(f"negative dimension {s} in shape {list(shape)}")
        if s >= 2**63:
            raise ValueError(f"dimension {s} in shape {list(shape)} does not fit in 64 bits")
        out.append(int(s))
    return out


def _to_device(t, device: str):
    return cuda.to_device(t, device)


def from_numpy(a: np.ndarray) -> Tensor:
    """A castlab tensor sharing memory with a NumPy array (any strides, read-only honoured).

    ml_dtypes arrays (bfloat16, float8_e4m3fn, float8_e5m2) are shared too.

    >>> a = np.arange(4, dtype=np.float32)
    >>> t = cl.from_numpy(a); a[0] = 7.0
    >>> t.tolist()[0]
    7.0
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(a).__name__}")
    dt = as_dtype(a.dtype)
    isz = a.dtype.itemsize
    strides = []
    for s in a.strides:
        if s % isz:
            raise ValueError("from_numpy: strides that are not a multiple of the item size "
                             "cannot be expressed in elements")
        strides.append(s // isz)
    ptr = a.__array_interface__["data"][0] if a.size else 0
    if a.size == 0:
        return _C.empty(list(a.shape), dt.name, "cpu")
    t = _C.from_pointer(ptr, list(a.shape), strides, dt.name, a, not a.flags.writeable, "cpu")
    _check_numpy_bounds(a, t, "from_numpy", ValueError)
    return t


_INT_RANGE = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1)}


def _int_value(v: Any, dt: dtype, what: str) -> int:
    """A Python number as a value of integer or bool dtype `dt`, as torch converts a
    number (truncation toward zero); ValueError where it cannot be represented."""
    if dt.name == "bool":
        return int(bool(v))
    lo, hi = _INT_RANGE[dt.name]
    if isinstance(v, (bool, int, np.integer)):
        iv = int(v)
    else:
        f = float(v)
        if not _math.isfinite(f):
            raise ValueError(f"{what}: value {f} cannot be converted to {dt.name}")
        iv = int(f)
    if not lo <= iv <= hi:
        raise ValueError(f"{what}: value {iv} cannot be converted to {dt.name} without overflow "
                         f"(range [{lo}, {hi}])")
    return iv


def _check_int_data(arr: np.ndarray, dt: dtype) -> np.ndarray:
    """Python data for an integer or bool tensor: values checked against dt's range."""
    if dt.name == "bool" or arr.size == 0:
        return np.asarray(arr, dtype=dt.numpy)
    if arr.dtype.kind in "iub" and arr.dtype.itemsize <= 4:
        if dt.name == "int64" or arr.dtype.itemsize < 4 or arr.dtype.kind != "u":
            return arr.astype(dt.numpy)
    lo, hi = _INT_RANGE[dt.name]
    flat = arr.ravel()
    if arr.dtype.kind == "f":
        t = np.trunc(flat)
        bad = ~np.isfinite(flat) | (t < lo) | (t > hi)
        if bad.any():
            v = flat[np.argmax(bad)]
            raise ValueError(f"tensor: value {v} cannot be converted to {dt.name} without overflow")
        return np.trunc(arr).astype(dt.numpy)
    for v in flat.tolist():  # exact Python integers (object or unsigned arrays included)
        _int_value(v, dt, "tensor")
    return np.array(arr.tolist(), dtype=dt.numpy).reshape(arr.shape)


def _has_big_int(data: Any) -> bool:
    """Nested Python data holding an integer outside int64 (NumPy would wrap or fail)."""
    if isinstance(data, bool):
        return False
    if isinstance(data, int):
        return not -(1 << 63) <= data < (1 << 63)
    if isinstance(data, (list, tuple)):
        return any(_has_big_int(x) for x in data)
    return False


def _nested_to_numpy(data: Any, dt: dtype | None) -> np.ndarray:
    if dt is None:
        arr = np.asarray(data) if not _has_big_int(data) else np.asarray(data, dtype=object)
        if arr.dtype.kind in "uO" and arr.size and all(
                isinstance(v, int) and not isinstance(v, bool) for v in arr.ravel().tolist()):
            return _check_int_data(arr, as_dtype("int64"))
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int64)
        elif arr.dtype.kind == "b":
            pass
        else:
            raise TypeError(f"cannot make a tensor from data of type {arr.dtype}")
        return arr
    if not dt.is_floating_point and not isinstance(data, np.ndarray):
        arr = np.asarray(data) if not _has_big_int(data) else np.asarray(data, dtype=object)
        if arr.dtype.kind not in "iufbO":
            raise TypeError(f"cannot make a tensor from data of type {arr.dtype}")
        return _check_int_data(arr, dt)
    if dt in (float64, float32) or not dt.is_floating_point:
        return np.asarray(data, dtype=dt.numpy)
    # Narrow floats: round once, directly from the exact (float64) values.
    return np.asarray(data, dtype=np.float64)


def tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, NumPy arrays,
    DLPack producers, castlab tensors). Default dtype: float32 for floats, int64 for ints.

    >>> cl.tensor([[1.0, 2.0]], dtype=cl.bfloat16)
    tensor([[1., 2.]], dtype=castlab.bfloat16)
    """
    dt = as_dtype(dtype) if dtype is not None else None
    dev = _device_str(device)
    if isinstance(data, Tensor):
        t = data.clone()
        if dt is not None:
            t = t.astype(dt)
        return t.to(dev)
    if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        t = from_dlpack(data).clone()
        return (t.astype(dt) if dt is not None else t).to(dev)
    if isinstance(data, np.ndarray) and dt is None:
        try:
            dt = as_dtype(data.dtype)
        except TypeError:
            dt = None
    arr = _nested_to_numpy(data, dt)
    src = from_numpy(np.asarray(arr, order="C"))  # (ascontiguousarray makes 0-d arrays 1-d)
    if dt is None:
        dt = as_dtype(arr.dtype)
    out = src.astype(dt) if src._dtype_name != dt.name else src.clone()
    return _to_device(out, dev)


def asarray(x: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Like :func:`tensor` but shares memory where it can (castlab tensors, NumPy arrays,
    DLPack producers).

    >>> a = np.ones(3, np.float32)
    >>> cl.asarray(a).data_ptr() == a.ctypes.data
    True
    """
    if isinstance(x, Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        try:
            t = from_numpy(x)
        except TypeError:
            t = tensor(x)
    elif hasattr(x, "__dlpack__"):
        t = from_dlpack(x)
    else:
        t = tensor(x)
    if dtype is not None:
        t = t.astype(as_dtype(dtype))
    if device is not None:
        t = t.to(_device_str(device))
    return t


def empty(*shape, dtype: Any = float32, device: Any = None) -> Tensor:
    """An uninitialised tensor.

    >>> cl.empty(2, 3).shape
    (2, 3)
    """
    dt = as_dtype(dtype)
    return _C.empty(_shape_arg(shape), dt.name, _device_str(device))


def full(shape: Sequence[int] | int, fill_value: float | int | bool, dtype: Any = None,
         device: Any = None) -> Tensor:
    """A tensor filled with one value (rounded once to `dtype`).

    >>> cl.full((2,), 0.1, dtype=cl.bfloat16).tolist()
    [0.10009765625, 0.10009765625]
    """
    if isinstance(shape, int):
        shape = (shape,)
    _check_fill(fill_value, "full")
    if dtype is None:
        dtype = bool_ if isinstance(fill_value, bool) else (int64 if isinstance(fill_value, int) else float32)
    dt = as_dtype(dtype)
    t = _C.empty(_shape_arg(tuple(shape)), dt.name, _device_str(device))
    _fill(t, fill_value)
    return t


def _check_fill(value: Any, what: str) -> None:
    """TypeError unless `value` is a real number (bool, int, float or a NumPy scalar)."""
    if (value is None or isinstance(value, (str, bytes, bytearray, complex, np.complexfloating))
            or not isinstance(value, (_numbers.Real, np.number, np.bool_, Tensor))):
        raise TypeError(f"{what}: fill value must be a number (bool, int or float), got "
                        f"{type(value).__name__} {value!r}")


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a castlab Tensor, got {type(t).__name__}")


def _fill(t: Tensor, value: float) -> None:
    if t._dtype_name in _INT_RANGE or t._dtype_name == "bool":  # exact, in an int64 register
        iv = _int_value(value, as_dtype(t._dtype_name), "full")
        _C.Program([instr("const", I64, 0, iimm=iv)], 1, [output(0)], 0).run([], [t])
        return
    value = float(value)
    # fp64 register for every float format but fp32: narrow formats then round once,
    # directly from the double (no double rounding through fp32)
    f64 = t._dtype_name not in ("float32", "bool")  # int32 too: > 2^24 is inexact in fp32
    prog = _C.Program([instr("const", f64, 0, imm=value)], 1, [output(0)], 0)
    prog.run([], [t])


def zeros(*shape, dtype: Any = float32, device: Any = None) -> Tensor:
    """A tensor of zeros.

    >>> cl.zeros(2).tolist()
    [0.0, 0.0]
    """
    return full(tuple(_shape_arg(shape)), 0.0, dtype=dtype, device=device)


def ones(*shape, dtype: Any = float32, device: Any = None) -> Tensor:
    """A tensor of ones.

    >>> cl.ones(2).tolist()
    [1.0, 1.0]
    """
    return full(tuple(_shape_arg(shape)), 1.0, dtype=dtype, device=device)


def empty_like(t: Tensor, dtype: Any = None) -> Tensor:
    _check_tensor(t, "empty_like")
    return empty(*t.shape, dtype=dtype or t.dtype, device=t._device_str)


def zeros_like(t: Tensor, dtype: Any = None) -> Tensor:
    _check_tensor(t, "zeros_like")
    return zeros(*t.shape, dtype=dtype or t.dtype, device=t._device_str)


def ones_like(t: Tensor, dtype: Any = None) -> Tensor:
    _check_tensor(t, "ones_like")
    return ones(*t.shape, dtype=dtype or t.dtype, device=t._device_str)


def full_like(t: Tensor, value: float, dtype: Any = None) -> Tensor:
    _check_tensor(t, "full_like")
    _check_fill(value, "full_like")
    return full(t.shape, value, dtype=dtype or t.dtype, device=t._device_str)


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None,
           device: Any = None) -> Tensor:
    """Evenly spaced values in [start, stop), as torch.arange (int64 for integer args).

    >>> cl.arange(4).tolist()
    [0, 1, 2, 3]
    """
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("end", stop), ("step", step)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, _numbers.Real):
            raise TypeError(f"arange: {name} must be a number, got {type(v).__name__} {v!r}")
        if not isinstance(v, (int, np.integer)) and not _math.isfinite(v):
            raise ValueError(f"arange: {name} must be finite, got {v}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    all_int = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    if all_int:
        start, stop, step = int(start), int(stop), int(step)
    dt = as_dtype(dtype) if dtype is not None else (int64 if all_int else float32)
    if all_int and not dt.is_floating_point and dt.name != "bool":
        r = range(start, stop, step)  # exact integers; the values must fit the dtype
        n = max(0, -((start - stop) // step))  # len(r), without its ssize_t OverflowError
        _check_arange_size(n, dt)
        for v in (r[0], r[-1]) if n else ():
            _int_value(v, dt, "arange")
        return tensor(np.array(r, dtype=dt.numpy), dtype=dt, device=device)
    n = max(0, _math.ceil((stop - start) / step))
    _check_arange_size(n, dt)
    vals = start + step * np.arange(n, dtype=np.float64)
    return tensor(vals.astype(np.int64) if dt is int64 else vals, dtype=dt, device=device)


_MAX_ARANGE_BYTES = 1 << 47  # 128 TiB: no machine holds more; beyond, the size is a mistake


def _check_arange_size(n: int, dt: dtype) -> None:
    if n * max(dt.itemsize, 8) > _MAX_ARANGE_BYTES:
        raise ValueError(f"arange: the range has {n} elements, too large a size to allocate "
                         f"({n * dt.itemsize} bytes of {dt.name})")


def _random(shape: tuple, kind: str, seed: int, dtype: Any, device: Any) -> Tensor:
    dt = as_dtype(dtype)
    if not dt.is_floating_point:
        raise TypeError(f"{kind} needs a floating-point dtype, got {dt}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer in [0, 2**64), got {type(seed).__name__} "
                        f"{seed!r}")
    seed = int(seed)
    if seed < 0 or seed >= 2**64:
        raise ValueError("seed must be an integer in [0, 2**64)")
    t = _C.empty(_shape_arg(shape), dt.name, _device_str(device))
    op = "rand_uniform" if kind == "rand" else "rand_normal"
    mode = 1 if kind == "rand" else 0  # uniform: round toward zero, so 1.0 never appears
    prog = _C.Program([instr(op, True, 0)], 1, [output(0, mode)], seed)
    prog.run([], [t])
    return t


def rand(*shape, seed: int = 0, dtype: Any = float32, device: Any = None) -> Tensor:
    """Uniform [0, 1) numbers from a counter-based generator (Philox): the same numbers
    for the same seed on every device and thread count.

    >>> cl.rand(3, seed=1).shape
    (3,)
    """
    return _random(tuple(_shape_arg(shape)), "rand", seed, dtype, device)


def randn(*shape, seed: int = 0, dtype: Any = float32, device: Any = None) -> Tensor:
    """Standard normal numbers (Philox + Box-Muller in fp64 with castlab's portable math:
    the same bits on every device).

    >>> cl.randn(2, 2, seed=0).shape
    (2, 2)
    """
    return _random(tuple(_shape_arg(shape)), "randn", seed, dtype, device)
