"""MKL VML borrowed from PyTorch's libtorch_cpu.so (ops/cpu/torch_vml.h).

PyTorch's CPU kernels compute float/double exp, log, sin, cos, tanh, erf and sqrt with MKL
VML (ATen/cpu/vml.h), which is closed source. Under ``Math(impl="torch_cpu")`` castlab calls
the same functions from torch's own library, found with ``dlopen(RTLD_NOLOAD)``: only once
torch has been imported in this process (castlab never imports torch itself, and never
links against it). Until then, castlab's portable functions stand in, and traces say so.
"""

from __future__ import annotations

import os
import sys

from . import _C

_failed: dict[str, str] = {}  # library path -> why it could not be used (tried once)


def unavailable() -> str | None:
    """Why PyTorch's MKL VML functions cannot be called now, or None when they can.
    Borrows them on the first call after ``import torch``.

    >>> import torch, castlab as cl
    >>> cl._torch_vml.unavailable() is None
    True
    """
    if _C.torch_vml_loaded():
        return None
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    if path is None:
        return "torch not loaded"
    lib = os.path.join(os.path.dirname(path), "lib", "libtorch_cpu.so")
    if lib not in _failed:
        # torch's own lib directory (wheels); else the soname, wherever it was loaded from
        why = _C.torch_vml_load(lib)
        if why and _C.torch_vml_load("libtorch_cpu.so") == "":
            why = ""
        if not why:
            return None
        _failed[lib] = why
    return _failed[lib]
