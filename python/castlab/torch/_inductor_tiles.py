"""The kernel configurations Inductor chose for a compiled program, read while it compiles
(castlab.torch._inductor records them): a Triton reduction kernel's launched tile, and the
classes whose methods the reader wraps (the C++ loop nests' tiling, Triton's autotuner).
"""

from __future__ import annotations

from typing import Any

from .._schedule import triton_tile

__all__ = ["cpp_proxy_class", "triton_classes", "tile"]


def cpp_proxy_class() -> Any:
    """Inductor's C++ kernel proxy (its codegen_nodes tiles each loop nest), or None."""
    try:
        from torch._inductor.codegen.cpp import CppKernelProxy
    except Exception:  # noqa: BLE001 (a PyTorch build without the C++ backend)
        return None
    return CppKernelProxy


def triton_classes() -> tuple:
    """Inductor's Triton scheduling and autotuner classes (None where this PyTorch build
    has no Triton backend)."""
    try:
        from torch._inductor.codegen.triton import TritonScheduling
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except Exception:  # noqa: BLE001 (no Triton: the CPU's C++ kernels only)
        return None, None
    return TritonScheduling, CachingAutotuner


_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


def tile(tuner: Any) -> tuple | None:
    """(R0_BLOCK, elements per thread, lanes, warps) along the row of a reduction kernel
    as its autotuner launches it: the configuration it chose (XBLOCK, R0_BLOCK, warps) and
    Triton's blocked layout for it (castlab._schedule.triton_tile: each thread holds up to
    16 bytes of the narrowest dtype the kernel loads). None: not a reduction, not run."""
    launchers = getattr(tuner, "launchers", None)
    if not launchers or len(launchers) != 1:
        return None
    cfg = getattr(launchers[0], "config", None)
    hints = getattr(tuner, "size_hints", None) or {}
    kw = dict(getattr(cfg, "kwargs", None) or {})
    r = kw.get("R0_BLOCK") or hints.get("r0_")
    if cfg is None or not r or "r1_" in hints:
        return None
    sig = (getattr(tuner, "triton_meta", None) or {}).get("signature") or {}
    sizes = [_BYTES[t[1:]] for a, t in sig.items()
             if isinstance(t, str) and t.startswith("*") and t[1:] in _BYTES
             and a.startswith("in_ptr")]
    if "R0_BLOCK" not in kw:  # a persistent kernel: one tile of the row's next power of two
        r = 1 << max(int(r) - 1, 0).bit_length()
    return triton_tile(int(r), int(kw.get("XBLOCK", 1)), int(cfg.num_warps),
                       min(sizes) if sizes else 4)
