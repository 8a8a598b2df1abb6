"""Where PyTorch's CPU gelu calls oneDNN, and which of oneDNN's JIT forms then runs.

``torch.nn.functional.gelu(x)`` (erf form) on a contiguous CPU tensor of 2 or more
elements calls oneDNN's ``eltwise_gelu_erf`` for fp32, for bf16 where oneDNN supports
bf16 (aten/src/ATen/native/Activation.cpp ``use_mkldnn``; ``mkldnn_bf16_device_check`` is
ideep's ``has_bf16_type_support``: oneDNN's ISA at least avx512_core), and for fp16 where
it supports fp16 (``mkldnn_fp16_device_check``: avx512_core_fp16, e.g. Sapphire Rapids). oneDNN's JIT computes
it two ways (ops/scalar/math_onednn.h): a minimax polynomial on AVX512 cores, Abramowitz &
Stegun below; its bf16 store is ``vcvtneps2bf16`` on CPUs with avx512_bf16 (a subnormal
becomes a signed zero) and an emulated round-to-nearest-even on other AVX512 cores.
oneDNN picks its ISA from the CPU (``mayiuse``, src/cpu/x64/cpu_isa_traits.hpp L425-460),
capped by ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA`` (cpu_isa_traits.cpp L30-75);
castlab follows both. PyTorch's choices (whether oneDNN is enabled, whether it takes bf16)
are asked of torch when it is loaded; without torch, its defaults are assumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading

from . import _C


@dataclasses.dataclass(frozen=True)
class GeluPath:
    """oneDNN's gelu_erf on this machine: the JIT form ("avx512" minimax or "avx2"
    Abramowitz & Stegun; None where castlab does not model it: below AVX2, not x86) and
    how its bf16 store rounds ("ftz": vcvtneps2bf16; "rne": the emulated conversion)."""

    form: str | None
    bf16_store: str


# oneDNN's user names of its ISA caps (cpu_isa_traits.hpp user_option_env), by the form of
# gelu and the bf16 store they leave; any other value (or none) caps nothing.
_CAP_BELOW_AVX2 = ("sse41", "avx")
_CAP_AVX2 = ("avx2", "avx2_vnni", "avx2_vnni_2")
_CAP_AVX512_NO_BF16 = ("avx512_core", "avx512_core_vnni")


@functools.cache
def gelu_path() -> GeluPath:
    """oneDNN's gelu_erf form on this CPU (see the module docstring). Read once, as oneDNN
    reads its ISA cap once.

    >>> cl._onednn.gelu_path().form in ("avx512", "avx2", None)
    True
    """
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").lower()
    if not (_C.cpu_has("avx2") and _C.cpu_has("fma")) or cap in _CAP_BELOW_AVX2:
        return GeluPath(None, "rne")  # SSE/AVX JIT (fma emulated) or another architecture
    avx512_core = all(_C.cpu_has(f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    if not avx512_core or cap in _CAP_AVX2:
        return GeluPath("avx2", "rne")
    # avx512_core_bf16 = avx512_core_vnni + avx512_bf16 (cpu_isa_traits.hpp L441-452)
    native = _C.cpu_has("avx512vnni") and _C.cpu_has("avx512bf16")
    return GeluPath("avx512", "ftz" if native and cap not in _CAP_AVX512_NO_BF16 else "rne")


def gelu_calls_onednn(dtype: str | None) -> bool:
    """Does PyTorch's CPU gelu (erf form) call oneDNN for a contiguous tensor of this dtype
    (2 or more elements)? Asks the loaded torch; without it, PyTorch's defaults.

    >>> cl._onednn.gelu_calls_onednn("float64")
    False
    """
    if dtype not in ("float32", "bfloat16", "float16") or getattr(_local, "strided", False):
        return False
    torch = sys.modules.get("torch")  # never imported here: only asked if loaded
    if torch is not None:
        if not (torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()):
            return False
        return dtype == "float32" or _torch_takes(torch, dtype)
    if dtype == "float16":  # avx512_core_fp16 (an ISA cap below it turns it off)
        cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
               or "").lower()
        return (gelu_path().form == "avx512" and _C.cpu_has("avx512fp16")
                and cap not in _CAP_AVX512_NO_BF16 + ("avx512_core_bf16",))
    return dtype == "float32" or gelu_path().form == "avx512"


@functools.cache
def _torch_takes(torch, dtype: str) -> bool:
    # mkldnn_bf16_device_check / mkldnn_fp16_device_check (ideep's has_bf16_type_support,
    # has_fp16_type_support: avx512_core_fp16 or avx2_vnni_2): fixed once oneDNN has read
    # the CPU, so asked once. On CPUs with avx512_fp16 PyTorch's fp16 gelu is oneDNN's
    # fp32 gelu rounded to fp16 (all 63,488 finite fp16 inputs, torch 2.13, Xeon).
    if dtype == "bfloat16":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


_local = threading.local()


@contextlib.contextmanager
def input_not_contiguous():
    """castlab.ops runs an op on a permuted (transposed) tensor over its memory-ordered,
    contiguous view; PyTorch's gelu takes oneDNN only for an input contiguous as given,
    so within this context gelu_calls_onednn is False."""
    prev = getattr(_local, "strided", False)
    _local.strided = True
    try:
        yield
    finally:
        _local.strided = prev


def torch_env() -> tuple:
    """What of the loaded PyTorch a lowered plan's bits depend on, for the plan caches
    (jit's, the eager composites'): whether torch is imported (the torch_cpu math then
    follows its CPU capability, MKL VML and thread geometry) and oneDNN's switch (gelu).
    A plan lowered before ``import torch`` is not reused after it.

    >>> cl._onednn.torch_env()[0] in (True, False)
    True
    """
    return ("torch" in sys.modules, state()[0])


def state() -> tuple:
    """What of PyTorch's gelu path can change while castlab runs (its oneDNN flag,
    ``torch.backends.mkldnn.enabled``, None without torch; and whether the input is a
    permuted view: input_not_contiguous), for caches of lowered plans.

    >>> cl._onednn.state()[0] in (True, False, None)
    True
    """
    torch = sys.modules.get("torch")
    return (None if torch is None else torch._C._get_mkldnn_enabled(),
            getattr(_local, "strided", False))
