"""castlab's dtypes: names as PyTorch prints them, and mappings to NumPy, ml_dtypes and torch."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "dtype",
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "bool_",
    "int32",
    "int64",
    "as_dtype",
    "promote_types",
]


class dtype:
    """A castlab storage dtype, e.g. ``castlab.bfloat16``.

    >>> import castlab as cl
    >>> cl.bfloat16, cl.bfloat16.itemsize, cl.bfloat16.is_floating_point
    (castlab.bfloat16, 2, True)
    """

    __slots__ = ("name", "short", "code", "itemsize", "is_floating_point", "_np", "_rank")

    def __init__(self, name: str, short: str, code: int, itemsize: int, is_float: bool,
                 np_dtype: np.dtype, rank: int):
        self.name = name
        self.short = short
        self.code = code
        self.itemsize = itemsize
        self.is_floating_point = is_float
        self._np = np.dtype(np_dtype)
        self._rank = rank

    def __repr__(self) -> str:
        return f"castlab.{self.name}"

    __str__ = __repr__

    def __reduce__(self):
        return (as_dtype, (self.name,))

    @property
    def numpy(self) -> np.dtype:
        """The NumPy (or ml_dtypes) dtype with the same bits."""
        return self._np

    def to_torch(self) -> Any:
        """The torch dtype with the same bits (imports torch)."""
        import torch

        return getattr(torch, "bool" if self.name == "bool" else self.name)

    @property
    def opmath(self) -> dtype:
        """The dtype ops on this dtype compute in (PyTorch's opmath): fp64 for fp64, else fp32."""
        return float64 if self is float64 else float32

    @property
    def bits(self) -> int:
        return self.itemsize * 8


float64 = dtype("float64", "f64", 0, 8, True, np.float64, 50)
float32 = dtype("float32", "f32", 1, 4, True, np.float32, 40)
float16 = dtype("float16", "f16", 2, 2, True, np.float16, 30)
bfloat16 = dtype("bfloat16", "bf16", 3, 2, True, ml_dtypes.bfloat16, 30)
float8_e4m3fn = dtype("float8_e4m3fn", "f8e4m3fn", 4, 1, True, ml_dtypes.float8_e4m3fn, 20)
float8_e5m2 = dtype("float8_e5m2", "f8e5m2", 5, 1, True, ml_dtypes.float8_e5m2, 20)
bool_ = dtype("bool", "b8", 6, 1, False, np.bool_, 0)
int32 = dtype("int32", "i32", 7, 4, False, np.int32, 10)
int64 = dtype("int64", "i64", 8, 8, False, np.int64, 11)

_ALL = [float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, bool_, int32, int64]
_BY_NAME = {d.name: d for d in _ALL}
_BY_NAME.update({d.short: d for d in _ALL})
_BY_NAME.update({"double": float64, "float": float32, "half": float16, "bool_": bool_,
                 "long": int64, "int": int32})
# the names traces and papers use (issue 53: one vocabulary)
_BY_NAME.update({"fp64": float64, "fp32": float32, "fp16": float16, "fp8_e4m3": float8_e4m3fn,
                 "fp8_e4m3fn": float8_e4m3fn, "fp8_e5m2": float8_e5m2})
_BY_CODE = {d.code: d for d in _ALL}
_BY_NP = {d._np: d for d in _ALL}


def as_dtype(x: Any) -> dtype:
    """Turn a castlab/NumPy/ml_dtypes/torch dtype, a Python type, or a name into a castlab dtype.

    Names: the full ones (``"bfloat16"``), the short ones traces print (``"bf16"``,
    ``"f32"``), ``fp64``/``fp32``/``fp16``/``fp8_e4m3``/``fp8_e5m2``, and torch's aliases
    (``"half"``, ``"double"``, ...).

    >>> cl.as_dtype("bf16"), cl.as_dtype(np.float16), cl.as_dtype("fp8_e4m3")
    (castlab.bfloat16, castlab.float16, castlab.float8_e4m3fn)
    """
    if isinstance(x, dtype):
        return x
    if isinstance(x, str):
        try:
            return _BY_NAME[x.removeprefix("torch.").removeprefix("castlab.")]
        except KeyError:
            raise TypeError(
                f"unsupported dtype {x!r}; castlab supports: "
                + ", ".join(d.name for d in _ALL)) from None
    if x is float:
        return float32
    if x is bool:
        return bool_
    if x is int:
        return int64
    mod = type(x).__module__
    if mod.startswith("torch"):
        name = str(x).removeprefix("torch.")
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise TypeError(f"unsupported dtype {x}; castlab supports: "
                        + ", ".join(d.name for d in _ALL))
    try:
        npd = np.dtype(x)
    except TypeError:
        raise TypeError(f"cannot interpret {x!r} as a dtype") from None
    try:
        return _BY_NP[npd]
    except KeyError:
        raise TypeError(f"unsupported dtype {npd}; castlab supports: "
                        + ", ".join(d.name for d in _ALL)) from None


def _category(d: dtype) -> int:
    return 2 if d.is_floating_point else (0 if d is bool_ else 1)


def promote_types(a: dtype, b: dtype) -> dtype:
    """PyTorch's promotion of two tensor dtypes (bf16 with fp16 gives fp32, ...).

    >>> cl.promote_types(cl.bfloat16, cl.float16)
    castlab.float32
    """
    a, b = as_dtype(a), as_dtype(b)
    if a is b:
        return a
    # fp8 combines with nothing but itself, not even bool/int (as torch.result_type)
    if a.itemsize == 1 and a.is_floating_point or b.itemsize == 1 and b.is_floating_point:
        raise TypeError(f"promotion of {a} with {b} is not supported (as in PyTorch, "
                        "float8 types only combine with themselves; cast explicitly)")
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if a._rank == b._rank:  # float16 with bfloat16
        return float32
    return a if a._rank > b._rank else b
