"""The kernel configurations Inductor chose for a compiled program, read while it compiles
(castlab.torch._inductor records them): a Triton reduction kernel's launched tile, which
product the launched kernel's last fma fuses, and the classes whose methods the reader
wraps (the C++ loop nests' tiling, Triton's autotuner).
"""

from __future__ import annotations

import glob
import math
import os
import re
from typing import Any

from .._schedule import triton_tile

__all__ = ["cpp_lanes", "cpp_proxy_class", "fused_product", "launched_ptx", "ptx_fused_product",
           "triton_classes", "tile"]


def cpp_proxy_class() -> Any:
    """Inductor's C++ kernel proxy (its codegen_nodes tiles each loop nest), or None."""
    try:
        from torch._inductor.codegen.cpp import CppKernelProxy
    except Exception:  # noqa: BLE001 (a PyTorch build without the C++ backend)
        return None
    return CppKernelProxy


def cpp_lanes(proxy: Any) -> int:
    """The vector lanes of the reductions a C++ kernel proxy generated, as its TilingSelect
    chose them: 0 for scalar loops; 1 for a vector across the kept dim (each output's sum
    in order); else the vector's elements along the row, negative where the row's last
    partial vector runs the scalar kernel (`_tail_vec_worthwhile` said no: the tail summed
    from zero on its own, then added to the lanes' sum)."""
    vec = next((k for k in getattr(proxy, "kernels", ())
                if getattr(k, "tiling_factor", None)), None)
    if vec is None:
        return 0
    loops = getattr(getattr(proxy, "loop_nest", None), "loops", None) or []
    i = vec.tiling_idx
    if loops and -len(loops) <= i < len(loops) and not loops[i].is_reduction:
        return 1
    w = int(vec.tiling_factor)
    return -w if type(proxy.kernels[-1]) is proxy.kernel_cls else w


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


_DEF = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_.]*)\s+(%r\d+),\s*(.*?);")
_OUT = re.compile(r"^\s*(?:@!?%p\d+\s+)?(cvt\.rn\.(?:bf16|f16)(?:x2)?\.f32\s+%\w+,|"
                  r"st\.global[.\w]*\s+\[[^]]*\],)\s*(.*?);")


def ptx_fused_product(ptx: str) -> str | None:
    """Which product the final fmas of a Triton kernel's PTX fuse: those whose results it
    rounds to bf16/fp16 or stores. "where" where a multiplicand of each comes from a select
    (``selp``: ``tl.where``, which a ``cat`` such as rotate_half's lowers to), "plain"
    where none does; None where there is no such fma or they disagree.

    The choice is LLVM's and depends on the launched configuration: ``q * cos +
    rotate_half(q) * sin`` fuses ``rotate_half(q) * sin`` where ``q * cos`` reaches the add
    through a layout conversion (shared memory), and ``q * cos`` where it does not (an H100,
    torch 2.11, Triton 3.6: 20 and 2 of the 22 configurations Inductor compiled for a
    Llama's and a Qwen2's RoPE kernels).

    >>> from castlab.torch._inductor_tiles import ptx_fused_product
    >>> ptx_fused_product('''
    ...   selp.f32 %r888, %r885, %r887, %p63;
    ...   fma.rn.f32 %r890, %r888, %r873, %r118;
    ...   cvt.rn.bf16x2.f32 %r869, %r890, %r890;''')
    'where'
    """
    defs: dict = {}
    outs: list = []
    for line in ptx.splitlines():
        m = _DEF.match(line)
        if m:
            defs[m.group(2)] = (m.group(1), [a.strip() for a in m.group(3).split(",")])
        o = _OUT.match(line)
        if o:
            outs += re.findall(r"%r\d+", o.group(2))
    kinds = set()
    for r in outs:
        op, args = defs.get(r, ("", []))
        if not op.startswith("fma.") or len(args) != 3:
            continue
        kinds.add("where" if any(defs.get(a, ("",))[0].startswith("selp") for a in args[:2])
                  else "plain")
    return kinds.pop() if len(kinds) == 1 else None


def fused_product(tuner: Any) -> str | None:
    """:func:`ptx_fused_product` of the kernel its autotuner launches (the configuration
    it chose); None where it has not run or its PTX is not at hand."""
    ptx = launched_ptx(tuner)
    return ptx_fused_product(ptx) if ptx is not None else None


def launched_ptx(tuner: Any) -> str | None:
    """The PTX of the kernel an autotuner launches: the compiled kernel's own (Triton's
    launcher), or the file in Triton's cache under the launcher's key (Inductor's static
    launcher keeps no compiled kernel); None where it has not run to one configuration."""
    launchers = getattr(tuner, "launchers", None)
    if not launchers or len(launchers) != 1:
        return None
    asm = getattr(getattr(launchers[0], "bin", None), "asm", None)
    ptx = asm.get("ptx") if isinstance(asm, dict) else None
    key = getattr(launchers[0], "cache_hash", None)
    if ptx is None and isinstance(key, str) and key:
        dev = (getattr(tuner, "triton_meta", None) or {}).get("device")
        d = os.path.join(_triton_cache_dir(getattr(dev, "index", None) or 0), key)
        files = glob.glob(os.path.join(glob.escape(d), "*.ptx"))
        if len(files) == 1:
            with open(files[0], encoding="utf-8", errors="replace") as f:
                ptx = f.read()
    if isinstance(ptx, bytes):
        ptx = ptx.decode("utf-8", "replace")
    return ptx if isinstance(ptx, str) else None


def _triton_cache_dir(device: int) -> str:
    """Where Inductor's Triton compiles keep their files for `device`."""
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    except Exception:  # noqa: BLE001 (another PyTorch layout: Triton's own default)
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".triton", "cache")
    return triton_cache_dir(device)


def reduction_size(loops: list) -> int | None:
    """The elements a C++ loop nest's reduction loops run over (None: no reduction loop,
    or a size that is not a number)."""
    red = [lp.size for lp in loops if lp.is_reduction]
    if not red or not all(str(s).isdigit() for s in red):
        return None
    return math.prod(int(s) for s in red)


def row_lengths(kernel: Any, parts: list) -> dict:
    """part -> the elements of its Triton kernel's row, for the reduction parts of a
    kernel whose row length is a number."""
    r = (getattr(kernel, "numels", None) or {}).get("r0_")
    if r is None or not str(r).isdigit():
        return {}
    return {n.get_name(): int(r) for n in parts if n.is_reduction()}
