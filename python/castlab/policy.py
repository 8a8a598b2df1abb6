"""Cast policies (where values are rounded) and math variants (how each op is computed).

A :class:`Policy` decides where a graph rounds to a storage dtype; a :class:`Math`
decides which formula and which implementation of exp/log/... each op uses. Together they
name every difference between two runs of the same graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from . import _onednn, _torch_vml
from ._optable import (
    APPROX_DIV,
    BITS,
    IMPL_MASK,
    MATH_IMPLS,
    NEG_ZERO_MINUS,
    OPS,
    REDUCTION_ORDERS,
    RSQRT_APPROX_FTZ,
    SIGMOID_EX2,
    SILU_MUL_SIGMOID,
    TORCH_CUDA_BITS,
    VARIANT_BITS,
)

__all__ = ["Policy", "Math", "use_math", "current_math", "as_policy", "as_math"]

from ._policy import (  # Policy and as_policy are castlab.policy's names too
    Policy,
    _cached_hash,
    _check_bool,
    _check_choice,
    _fields_html,
    as_policy,
)

_IMPLS = ("portable", "libm", "cuda", "cuda_fast", "fast", "torch", "torch_cpu", "inductor_cpp")

# Under the torch_cpu implementation: the op/dtype pairs whose PyTorch CPU kernel is code
# castlab cannot rebuild from a published algorithm (docs/torch_cpu_kernels.md), where
# castlab's portable functions stand in: MKL VML (fp32/fp64 exp, log, sin, cos, tanh,
# erf; vml.h). MKL VML is called from torch's own library once torch is imported
# (_torch_vml), so those pairs are opaque only while it is unavailable. oneDNN's JIT gelu
# (contiguous fp32, and bf16 where oneDNN takes it) is rebuilt (ops/scalar/math_onednn.h)
# except on CPUs whose oneDNN path castlab does not model (_onednn.gelu_path).
_TORCH_CPU_OPAQUE = {
    (op, dt): "MKL VML" for op in ("exp", "log", "sin", "cos", "tanh", "erf", "sqrt")
    for dt in ("float32", "float64")
}
# PyTorch's kernels registered with ALSO_REGISTER_AVX512_DISPATCH: on an AVX512 CPU they run
# 64-byte vectors; every other kernel runs its AVX2 build there (DispatchStub.h L495-502).
# UnaryOpsKernel.cpp registers sigmoid so; silu, gelu and gelu_tanh measured as 64-byte
# loops (docs/torch_cpu_kernels.md); pow and rsqrt are plain REGISTER_DISPATCH.
_TORCH_CPU_AVX512_OPS = frozenset({"sigmoid", "silu", "gelu", "gelu_tanh", "pow"})
# Ops whose PyTorch CPU kernel is a cpu_kernel_vec loop with a scalar lambda that computes
# differently from the vector body (glibc's function; 16-bit rsqrt's rounded sqrt); the
# vml-path ops (exp, log, ...: vec::map, partial vectors) have no scalar tail.
_TORCH_CPU_LAMBDA_OPS = frozenset({"sigmoid", "silu", "gelu", "gelu_tanh", "pow", "rsqrt"})
# PyTorch's backward kernels that are cpu_kernel_vec loops (Activation.cpp), each with the
# steps whose Vectorized function the scalar lambda replaces by glibc's (std::exp, ...);
# all three are registered with ALSO_REGISTER_AVX512_DISPATCH.
_TORCH_CPU_VEC_KERNELS = {"silu_backward": ("exp",), "gelu_backward": ("exp", "erf"),
                          "gelu_tanh_backward": ("tanh",)}
_TORCH_CPU_AVX512_KERNELS = frozenset(_TORCH_CPU_VEC_KERNELS)
# Vectorized<double> functions castlab does not rebuild (Sleef_sind4_u10, cosd4): inside
# another kernel (never the op's own kernel, which calls MKL VML) the portable ones stand in.
_SLEEF_MISSING = frozenset({("sin", "float64"), ("cos", "float64")})
_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def _torch_cpu_capability() -> str:
    """torch.backends.cpu.get_cpu_capability() of the loaded torch ("" when not loaded)."""
    torch = sys.modules.get("torch")  # never imported here: only asked if loaded
    cap = getattr(getattr(getattr(torch, "backends", None), "cpu", None),
                  "get_cpu_capability", None)
    return cap() if cap is not None else ""


def _cpu_flags() -> set:
    """The x86 feature flags of the first CPU in /proc/cpuinfo (empty where it cannot
    tell: not Linux, or not an x86 CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return flags if "sse2" in flags else set()
    except OSError:
        pass
    return set()


def _capability_of(flags: set) -> str:
    """torch's CPU capability for a CPU with these flags (DispatchStub.cpp
    compute_cpu_capability, through cpuinfo): AVX512 with avx512vl, avx512bw, avx512dq and
    fma; AVX2 with avx2 and fma; else DEFAULT ("" for no flags: unknown)."""
    if not flags:
        return ""
    if {"avx512vl", "avx512bw", "avx512dq", "fma"} <= flags:
        return "AVX512"
    return "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"


@functools.lru_cache(maxsize=1)
def _predicted_cpu_capability() -> str:
    """The CPU capability torch would choose on this machine, without importing it:
    ATEN_CPU_CAPABILITY when it is "avx512", "avx2" or "default", else the CPU's flags
    (_capability_of). Decided once per process, as torch decides it."""
    env = os.environ.get("ATEN_CPU_CAPABILITY")
    if env in ("avx512", "avx2", "default"):
        return env.upper()
    return _capability_of(_cpu_flags())


# Bits the torch_cpu implementation adds on the CPU: GCC contracts gelu's tanh form
# x + kKappa*x^3 into an fma in PyTorch's build (Gelu.h); pow calls SLEEF's pow (vector
# body) or the C library's (scalar lambda) directly, after pow_tensor_scalar's shortcuts.
_TORCH_CPU_BITS = BITS["fma_in_op"] | BITS["pow_device"]


@dataclasses.dataclass(frozen=True)
class Math:
    """How each op is computed: implementation of transcendental functions and formulas.

    Args:
        impl: exp/log/sin/cos/tanh/erf implementation: "portable" (castlab's own, the
            same bits on every device), "libm" (the platform's: the C library on the
            CPU, CUDA's precise functions on the GPU), "cuda" (CUDA's precise functions on
            the GPU; on the CPU, where they do not exist, the portable ones stand in),
            "torch_cpu" (what PyTorch's CPU kernels compute: SLEEF's vectorised functions
            and ATen's own erf polynomial, re-implemented in castlab, with the C library
            where PyTorch's loop runs its scalar lambda: non-contiguous layouts and the
            tail of each of torch's thread chunks; where PyTorch calls MKL VML, the same
            MKL functions from torch's libtorch_cpu.so once torch is imported; where it
            calls oneDNN (gelu), castlab's re-implementation of oneDNN's JIT kernel;
            without torch, the portable functions stand in for MKL; on the GPU it
            means "portable"), "torch" (PyTorch's own kernels for the device: "cuda" on a
            GPU, "torch_cpu" on the CPU), "inductor_cpp" (Inductor's generated C++ on the
            CPU: ATen's ``Vectorized`` functions, SLEEF's and ATen's erf, on every element,
            masked tails included; never MKL VML or oneDNN, no contraction; glibc's in the
            scalar kernels of the DEFAULT build; on the GPU it means "portable"), or
            "cuda_fast" (``__expf`` and friends, GPU only).
        fma: contract ``a*b + c`` into one fused multiply-add where no rounding sits
            between them (as nvcc and Triton do by default).
        silu: "div" for ``x / (1 + exp(-x))`` (PyTorch eager, Inductor) or "mul_sigmoid"
            for ``x * sigmoid(x)`` (TransformerEngine, Thunder, nvFuser).
        sigmoid: "ieee" for ``1 / (1 + exp(-x))`` or "ex2_approx" for Triton's tl.sigmoid
            (``ex2.approx.f32``; GPU only).
        division: "ieee" or "approx" (Triton's ``/``: ``div.full.f32``; GPU only).
        rsqrt: "ieee" (``1 / sqrt(x)``) or "approx_ftz" (Triton's ``libdevice.rsqrt``,
            Inductor's rsqrt: ``rsqrt.approx.ftz.f32``, a subnormal input read as a zero;
            GPU only). PyTorch's eager CUDA rsqrt (``rsqrtf``, no flush) comes with
            ``cuda_kernels``.
        neg: "ieee" (a sign flip) or "zero_minus" (Triton's unary minus, ``0 - x``, which
            Inductor's neg is: ``-(+0)`` is ``+0``; GPU only).
        fma_rounding: where a contracted fma (``fma=True``) whose add/sub rounds to its own
            16-bit dtype rounds: "fp32" (the fma runs in fp32 and the rounding to
            bf16/fp16 follows: two roundings, as Inductor's and nvcc's fp32 op-math) or
            "storage" (one rounding from the exact value, as Triton's ``fma.rn.bf16`` /
            ``fma.rn.f16`` on 16-bit tensors: Liger's and Unsloth's RoPE).
        reduction: the order of accumulation of sum (and of mean, var, softmax and the
            norms built on it): "torch" (PyTorch's own kernel for the device: "torch_cuda"
            on a GPU, "torch_cpu" on the CPU), "torch_cuda" (ATen's CUDA reduction
            kernels: Reduce.cuh's launch configuration for the shape, SoftMax.cu's warp
            and block sums), "torch_cpu" (ATen's vectorised cascade sum), "triton"
            (Inductor's Triton reductions, ``tl.sum`` over the tile torch 2.11 picked on an
            H200: _lower.triton_config; the inductor preset's order), "inductor_cpp"
            (Inductor's C++ reductions on the CPU: a lane per position of the kernel's
            vector, each from zero, then vec_reduce_all's butterfly, cascade sums over
            4096 elements, a row split over torch's threads where the rows are few, and
            Inductor's Welford for var and layer_norm over more than 1024 elements; the
            inductor_cpu preset's order), "pairwise" (NumPy's pairwise summation) or
            "sequential". Every order runs on both devices with the same bits, but for
            inductor_cpp's Welford, which exists on the CPU only (Inductor's C++ kernels):
            on a GPU input var and layer_norm take two passes under that order;
            accumulation is in fp32 for 16-bit and fp32 inputs, fp64 for fp64 inputs or
            under a compute=float64 policy.
        cpu_isa: the build of PyTorch's CPU kernels (``ATEN_CPU_CAPABILITY``) that the
            "torch_cpu" implementation and order follow: "avx512" (the kernels PyTorch also
            builds for AVX512 run 64-byte vectors: softmax and its backward, sigmoid, silu,
            gelu and their backward kernels, pow; the rest run their AVX2 build), "avx2"
            (32-byte vectors; SLEEF in the vector body, glibc in each thread chunk's
            scalar tail; GCC's fused multiply-adds), "default" (``vec_base``: glibc's
            functions on every element, no fused multiply-add, vector lanes summed in
            order) or "auto": ``torch.backends.cpu.get_cpu_capability()`` of the imported
            torch; while torch is not imported (castlab never imports it), the build torch
            would choose here: ``ATEN_CPU_CAPABILITY`` if set, else the CPU's flags
            (avx512vl/bw/dq + fma: "avx512"; avx2 + fma: "avx2"; else "default"). The
            vector widths and tails also need torch's thread count, so they apply once
            torch is imported (docs/torch_cpu_kernels.md, "Per ISA").
        rms_norm: where ``castlab.rms_norm`` (cast=None) rounds to the input dtype: "hf"
            (Hugging Face's Qwen2RMSNorm/LlamaRMSNorm: normalise in fp32, cast, then
            multiply by the weight in the input dtype) or "te" (TransformerEngine: multiply
            by the weight in fp32, then cast once).
        pow: how ``x ** n`` with a Python-number exponent is computed: "torch" (PyTorch's
            pow kernels, with their shortcuts) or "inductor" (Inductor's lowering: an
            integer-valued exponent 0 <= n < 32 as repeated squaring in op-math,
            ``x**3 = (x*x)*x``; lowering.py ``pow_recursive``; other exponents as "torch").
        online_softmax: under the "triton" order, a softmax's (log_softmax's,
            cross-entropy's) row sum over several of Inductor's tiles is Inductor's online
            softmax (``torch._inductor.config.online_softmax``, on by default in torch
            2.11: a running maximum and sum per tile position); False: the two loops, the
            maximum first, then the sum of exponentials. The torch_compile stack reads it
            from Inductor's config.
        cuda_kernels: on the GPU, also reproduce the implementation details of PyTorch's
            eager CUDA kernels: ``rsqrt`` is CUDA's approximate ``rsqrtf``, a division by a
            Python number multiplies by its reciprocal (with ``impl="torch"``: a kernel
            library's math sets cuda_kernels for ``rsqrtf`` and divides as its kernel
            does), ``a*b+c`` inside an op's formula
            contracts to an fma (gelu's tanh form; PyTorch is built with nvcc
            ``--fmad=true``), and bf16/fp16 ``x**3`` / ``x**-2`` round the inner product to
            the storage dtype (the kernels compute in ``scalar_t``). Also, on either
            device, ``a*b+c`` inside PyTorch's fused backward kernels (silu_backward,
            gelu_backward, tanh_backward, ...) contracts to an fma as their compilers do
            (nvcc; GCC's vectorised CPU kernels). No other effect on the CPU.

    >>> cl.Math.preset("inductor").division
    'approx'
    """

    name: str = "custom"
    impl: str = "libm"
    fma: bool = False
    silu: str = "div"
    sigmoid: str = "ieee"
    division: str = "ieee"
    rsqrt: str = "ieee"
    neg: str = "ieee"
    fma_rounding: str = "fp32"
    cuda_kernels: bool = False
    reduction: str = "pairwise"
    rms_norm: str = "hf"
    cpu_isa: str = "auto"
    pow: str = "torch"
    online_softmax: bool = True

    def __hash__(self) -> int:  # cached: math variants are dictionary keys on every call
        return _cached_hash(self)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"Math: name must be a str, not {type(self.name).__name__}")
        _check_choice("Math", "impl", self.impl, _IMPLS)
        _check_bool("Math", "fma", self.fma)
        _check_choice("Math", "silu", self.silu, ("div", "mul_sigmoid"))
        _check_choice("Math", "sigmoid", self.sigmoid, ("ieee", "ex2_approx"))
        _check_choice("Math", "division", self.division, ("ieee", "approx"))
        _check_choice("Math", "rsqrt", self.rsqrt, ("ieee", "approx_ftz"))
        _check_choice("Math", "neg", self.neg, ("ieee", "zero_minus"))
        _check_choice("Math", "fma_rounding", self.fma_rounding, ("fp32", "storage"))
        _check_bool("Math", "cuda_kernels", self.cuda_kernels)
        _check_choice("Math", "reduction", self.reduction, REDUCTION_ORDERS)
        _check_choice("Math", "rms_norm", self.rms_norm, ("hf", "te"))
        _check_choice("Math", "cpu_isa", self.cpu_isa, ("auto", "avx512", "avx2", "default"))
        _check_choice("Math", "pow", self.pow, ("torch", "inductor"))
        _check_bool("Math", "online_softmax", self.online_softmax)

    @staticmethod
    def presets() -> list[str]:
        """Names of the built-in presets."""
        return list(_PRESETS)

    @staticmethod
    def preset(name: str) -> Math:
        """A named preset: torch_eager, inductor, inductor_cpu, nvfuser, transformer_engine,
        portable."""
        try:
            return _PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown math preset {name!r}; valid: "
                             + ", ".join(_PRESETS)) from None

    def impl_on(self, cuda: bool) -> str:
        """The implementation the device runs ("torch" and "cuda" resolved).

        >>> cl.Math.preset("torch_eager").impl_on(cuda=False)
        'torch_cpu'
        """
        name = self.impl
        if name == "torch":
            name = "cuda" if cuda else "torch_cpu"
        if name == "cuda":  # precise CUDA functions; portable ones on the CPU
            name = "libm" if cuda else "portable"
        if name == "inductor_cpp":  # the torch_cpu functions, as steps of a fused kernel
            name = "torch_cpu"
        if name == "torch_cpu" and cuda:
            name = "portable"
        if name in ("fast", "cuda_fast"):
            name = "fast" if cuda else "libm"
        return name

    def aten_cpu(self, cuda: bool) -> bool:
        """Does the device run ATen's own CPU kernels, with their quirks (the torch_cpu
        implementation on the CPU, not Inductor's generated C++)?

        >>> cl.Math.preset("torch_eager").aten_cpu(False), cl.Math.preset("inductor_cpu").aten_cpu(False)
        (True, False)
        """
        return self.impl_on(cuda) == "torch_cpu" and self.impl != "inductor_cpp"

    def _torch_cpu_opaque(self, op: str, dtype: str | None, cuda: bool,
                          kernel: bool = False) -> str | None:
        """The library PyTorch's CPU kernel calls for this op and dtype where castlab's
        torch_cpu implementation cannot reproduce it (None where it does). `kernel`: the
        op is a step inside another of PyTorch's kernels (layer_norm, softmax, a backward
        kernel), which never calls MKL VML's function for it: castlab does not either."""
        if cuda or self.impl_on(cuda) != "torch_cpu":
            return None
        kernel = kernel or self.impl == "inductor_cpp"
        if (op == "gelu" and not kernel and _onednn.gelu_calls_onednn(dtype)
                and not self._onednn_gelu_bits(op, dtype, cuda, kernel)):
            return "oneDNN"
        if kernel:
            # a step of another kernel computes with Vectorized's function (SLEEF, ATen's
            # erf), never MKL VML; castlab lacks SLEEF's double log/sin/cos
            # (Sleef_logd*_u10 included: ops/scalar/math_torch_cpu.h log_u10)
            return "SLEEF (not reproduced)" if (op, dtype) in _SLEEF_MISSING else None
        lib = _TORCH_CPU_OPAQUE.get((op, dtype))
        if lib == "MKL VML":
            why = _torch_vml.unavailable()
            return None if why is None else f"MKL VML unavailable ({why})"
        return lib

    def _onednn_gelu(self, op: str, dtype: str | None, cuda: bool, kernel: bool = False) -> str:
        """oneDNN's gelu_erf form castlab computes for this op, as PyTorch's CPU kernel
        calls it ("avx512" minimax or "avx2" Abramowitz & Stegun; "" where it does not, or
        where castlab does not model its path: _onednn.gelu_path)."""
        if (op != "gelu" or cuda or kernel or self.impl_on(cuda) != "torch_cpu"
                or self.impl == "inductor_cpp"
                or not _onednn.gelu_calls_onednn(dtype)):
            return ""
        form = _onednn.gelu_path().form
        # bf16/fp16 below AVX512 (avx2_vnni_2's vcvtneps2bf16 / vcvtps2ph) is not modelled
        return form if form == "avx512" or (form == "avx2" and dtype == "float32") else ""

    def onednn_gelu_backward_bits(self, dtype: str | None) -> int:
        """Variant bits of PyTorch's CPU gelu backward (erf form) where it calls oneDNN's
        JIT eltwise_gelu_erf backward (where its forward does, castlab modelling that
        path; the backward's form is Abramowitz & Stegun on every ISA): the gelu op
        computing g * gelu'(x), stored as the kernel stores it; 0 elsewhere."""
        if not self._onednn_gelu("gelu", dtype, False):
            return 0
        ftz = BITS["onednn_bf16_ftz"] if (dtype == "bfloat16"
                                          and _onednn.gelu_path().bf16_store == "ftz") else 0
        return MATH_IMPLS["torch_cpu"] | BITS["onednn_gelu"] | BITS["onednn_gelu_bwd"] | ftz

    def _onednn_gelu_bits(self, op: str, dtype: str | None, cuda: bool, kernel: bool) -> int:
        form = self._onednn_gelu(op, dtype, cuda, kernel)
        if not form:
            return 0
        bits = BITS["onednn_gelu"] | (BITS["onednn_gelu_avx2"] if form == "avx2" else 0)
        if dtype == "bfloat16" and _onednn.gelu_path().bf16_store == "ftz":
            bits |= BITS["onednn_bf16_ftz"]
        return bits

    def _torch_vml(self, op: str, dtype: str | None, cuda: bool, kernel: bool = False) -> bool:
        """Does this op call MKL VML from libtorch_cpu.so (as PyTorch's CPU kernel does)?"""
        return (not cuda and not kernel and self.impl_on(cuda) == "torch_cpu"
                and self.impl != "inductor_cpp"
                and _TORCH_CPU_OPAQUE.get((op, dtype)) == "MKL VML"
                and _torch_vml.unavailable() is None)

    def _impl_code(self, cuda: bool, op: str = "", dtype: str | None = None,
                   kernel: bool | str = False) -> int:
        name = self.impl_on(cuda)
        if name == "torch_cpu" and self._torch_cpu_opaque(op, dtype, cuda, kernel):
            name = "portable"
        elif (name == "torch_cpu" and self._cpu_isa() == "default"
              and not self._torch_vml(op, dtype, cuda, kernel)):
            # the DEFAULT build's Vectorized (vec_base.h) maps the C library's function
            # over its lanes: glibc in the vector body as in the scalar lambda
            name = "libm"
        return MATH_IMPLS[name]

    def torch_cpu_tail(self, op: str, dtype: str | None, cuda: bool = False,
                       kernel: bool | str = False) -> int:
        """Width of the vectorised step of PyTorch's CPU loop for this op (``2 *
        Vec::size()`` of the build ``cpu_isa`` names), whose remainder in each thread chunk
        runs the kernel's scalar lambda (glibc): 0 where that changes no bits, or where
        torch is not loaded (its thread count then is unknown). `kernel`: the name of the
        PyTorch kernel the op is a step of (silu_backward, ...: its scalar lambda calls
        glibc's function for the step); True or "" for a kernel without such a lambda.

        >>> import torch
        >>> cl.Math.preset("torch_eager").torch_cpu_tail("silu", "float32") in (16, 32)
        True
        """
        f = OPS[op].factors if op in OPS else 0
        if self.impl == "inductor_cpp":
            return 0  # Inductor's loops end in masked vectors, never a scalar lambda
        if cuda or self.impl_on(cuda) != "torch_cpu" or not (kernel or f & BITS["torch_tail"]):
            return 0  # (the tail of another kernel's loop: a fact of that kernel's, not op's)
        size = _ITEMSIZE.get(dtype or "")
        if size is None:
            return 0
        if kernel:  # op "": the kernel's own loop, whatever the step
            if kernel not in _TORCH_CPU_VEC_KERNELS or (
                    op and op not in _TORCH_CPU_VEC_KERNELS[kernel]):
                return 0
            wide = kernel in _TORCH_CPU_AVX512_KERNELS
        else:
            if op not in _TORCH_CPU_LAMBDA_OPS or self._torch_cpu_opaque(op, dtype, cuda):
                return 0
            if op == "rsqrt" and size != 2:  # float/double: the scalar 1/sqrt is the vector's
                return 0
            wide = op in _TORCH_CPU_AVX512_OPS
        isa = self._cpu_isa()
        # DEFAULT: vec_base maps glibc's function over the lanes, as the scalar lambda
        # does; only pow's lambda still differs (std::pow(float, double)), and 16-bit
        # rsqrt rounds its sqrt everywhere (torch_scalar_loop)
        if isa == "default" and (kernel or op != "pow"):
            return 0
        if self.cpu_isa == "auto" and _torch_cpu_capability() not in ("AVX2", "AVX512", "DEFAULT"):
            return 0
        # the executor reads torch's thread count through the library _torch_vml borrows
        if _torch_vml.unavailable() is not None:
            return 0
        return 2 * (64 if isa == "avx512" and wide else 32) // size

    def _torch_cpu_bits(self) -> int:
        """_TORCH_CPU_BITS under the build cpu_isa names: the DEFAULT build is compiled
        without -mfma, so GCC contracts nothing there."""
        if self._cpu_isa() == "default" or self.impl == "inductor_cpp":
            # (Inductor compiles with -ffp-contract=off)
            return _TORCH_CPU_BITS & ~BITS["fma_in_op"]
        return _TORCH_CPU_BITS

    def variant_bits(self, op: str, f64: bool, cuda: bool, dtype: str | None = None,
                     kernel: bool | str = False) -> int:
        """Instruction variant bits (ops/scalar/ops.h VariantBits) for one op: only the
        factors the op table lists for it, so two runs differ in an op's bits exactly
        when they compute it differently. `dtype`: the op's storage dtype name (the
        torch_cpu implementation depends on it); `kernel`: the op is a step inside another
        of PyTorch's kernels (its name, or True), so not PyTorch's own kernel for the op
        (no MKL VML call, no 16-bit rsqrt details of that kernel; the scalar tail of the
        kernel's own loop where it has one: torch_cpu_tail)."""
        f = OPS[op].factors
        kernel = kernel or self.impl == "inductor_cpp"  # every op a step of a fused kernel
        bits = self._impl_code(cuda, op, dtype, kernel) if f & IMPL_MASK else 0
        if f & SILU_MUL_SIGMOID and self.silu == "mul_sigmoid":
            bits |= SILU_MUL_SIGMOID
        if not cuda and self.impl_on(cuda) == "torch_cpu":
            bits |= f & self._torch_cpu_bits()
            if self.torch_cpu_tail(op, dtype, cuda, kernel):
                bits |= BITS["torch_tail"]
        if not cuda and not kernel and self.impl_on(cuda) == "torch_cpu":
            if dtype in ("bfloat16", "float16"):  # 1 / sqrt rounded to 16 bits, scalar loop
                bits |= f & BITS["rsqrt_scalar16"]
                if self._cpu_isa() == "default":  # vec_base's rsqrt is that loop too
                    bits |= f & BITS["torch_scalar_loop"]
            if f & BITS["torch_vml"] and self._torch_vml(op, dtype, cuda):
                bits |= BITS["torch_vml"]
            # oneDNN on contiguous input of 2+ elements; the executor drops these bits on
            # other layouts, where the tail bits above apply (Gelu.h's loop)
            bits |= self._onednn_gelu_bits(op, dtype, cuda, kernel)
        if cuda and self.cuda_kernels:
            bits |= f & TORCH_CUDA_BITS
        if cuda and not f64:
            if self.division == "approx":
                bits |= f & APPROX_DIV
            if self.sigmoid == "ex2_approx" and self._computes_sigmoid(f):
                bits |= f & SIGMOID_EX2
        if cuda and self.rsqrt == "approx_ftz":
            bits |= f & RSQRT_APPROX_FTZ
        if cuda and self.neg == "zero_minus":
            bits |= f & NEG_ZERO_MINUS
        return bits

    def reduction_order(self, cuda: bool) -> str:
        """The concrete order of accumulation on a device ("torch" resolved).

        >>> cl.Math.preset("torch_eager").reduction_order(cuda=False)
        'torch_cpu'
        """
        if self.reduction == "torch":
            return "torch_cuda" if cuda else "torch_cpu"
        return self.reduction

    def torch_cpu_vector_bytes(self) -> int:
        """The width of PyTorch's CPU vectors where the "torch_cpu" order follows a kernel
        built for AVX512 as well (``ALSO_REGISTER_AVX512_DISPATCH``, e.g. softmax): 64 on
        an AVX512 build (``cpu_isa`` "avx512", or "auto" with torch loaded reporting
        AVX512), else 32.

        >>> cl.Math(cpu_isa="avx2").torch_cpu_vector_bytes()
        32
        """
        return 64 if self._cpu_isa() == "avx512" else 32

    def torch_cpu_fma(self) -> bool:
        """Do the "torch_cpu" order's Welford kernels fuse multiply-adds (``cpu_isa``
        resolved: only PyTorch's DEFAULT build does not)?

        >>> cl.Math(cpu_isa="default").torch_cpu_fma()
        False
        """
        return self._cpu_isa() != "default"

    def torch_cpu_isa(self) -> str:
        """The build of PyTorch's CPU kernels castlab follows: ``cpu_isa``, with "auto"
        resolved to ``torch.backends.cpu.get_cpu_capability()`` of the imported torch
        ("avx512", "avx2" or "default"; without torch imported, the build torch would
        choose on this CPU).

        >>> cl.Math(cpu_isa="default").torch_cpu_isa()
        'default'
        """
        return self._cpu_isa()

    def _cpu_isa(self) -> str:
        """``cpu_isa`` resolved: "auto" asks the loaded torch, else predicts its choice on
        this CPU (_predicted_cpu_capability; AVX2 where that cannot tell)."""
        if self.cpu_isa != "auto":
            return self.cpu_isa
        cap = _torch_cpu_capability() or _predicted_cpu_capability()
        return {"AVX512": "avx512", "DEFAULT": "default"}.get(cap, "avx2")

    def _repr_html_(self) -> str:
        """Jupyter's view: a table of the fields.

        >>> "silu" in cl.Math.preset("inductor")._repr_html_()
        True
        """
        return _fields_html(self, "Math")

    def _computes_sigmoid(self, factors: int) -> bool:
        # silu reaches a sigmoid only in its x*sigmoid(x) form
        return not factors & SILU_MUL_SIGMOID or self.silu == "mul_sigmoid"

    def describe_op(self, op: str, cuda: bool, dtype: str | None = None,
                    kernel: bool | str = False) -> str:
        """Human-readable variant of one op, as shown in traces (`kernel`: as in
        :meth:`variant_bits`)."""
        impl = self.impl if (cuda or self.impl != "cuda_fast") else "libm"
        if impl == "torch":
            impl = "cuda" if cuda else "torch_cpu"
        if impl == "cuda" and not cuda:
            impl = "portable (CPU stand-in for cuda)"
        if impl == "torch_cpu" and cuda:
            impl = "portable (torch_cpu is CPU-only)"
        opaque = self._torch_cpu_opaque(op, dtype, cuda, kernel)
        if opaque and opaque.startswith("MKL VML unavailable"):
            impl = f"portable ({opaque}: portable stand-in, not bit-exact)"
        elif opaque:
            impl = (f"portable (PyTorch's CPU kernel calls {opaque} here: not reproduced, "
                    "not bit-exact)")
        elif self._torch_vml(op, dtype, cuda, kernel):
            impl = "torch_cpu (MKL VML from libtorch_cpu.so, as PyTorch's kernel)"
        elif self._onednn_gelu(op, dtype, cuda, kernel):
            form = self._onednn_gelu(op, dtype, cuda, kernel)
            impl = (f"torch_cpu (oneDNN's JIT gelu_erf, {form} form, on contiguous input as "
                    "PyTorch's kernel; Gelu.h's loop on other layouts)")
        elif impl == "torch_cpu" and self._cpu_isa() == "default":
            impl = "torch_cpu (DEFAULT build: glibc, as vec_base maps it)"
        info = OPS.get(op)
        f = info.factors if info is not None else 0
        notes = []
        if f & SILU_MUL_SIGMOID:
            notes.append(info.formula if self.silu == "div" else "x*sigmoid(x)")
            notes.append(f"exp={impl}")
        elif f & SIGMOID_EX2:
            notes.append(info.formula)
            notes.append(f"exp={impl}")
        elif f & IMPL_MASK or (f & BITS["torch_vml"] and (opaque or impl.startswith("torch_cpu ("))):
            notes.append(f"impl={impl}")
        if not cuda and not kernel and f & BITS["rsqrt_scalar16"] and impl == "torch_cpu" and (
                dtype in ("bfloat16", "float16")):
            notes.append("strided: 1/round(sqrt(x)) (PyTorch's scalar loop)")
        if (not cuda and impl == "torch_cpu" and f & self._torch_cpu_bits() & BITS["fma_in_op"]):
            notes.append("fma inside the formula (GCC contracts it in PyTorch's CPU build)")
        if f & APPROX_DIV and self.division == "approx":
            notes.append("div=approx" if cuda else "div=ieee (approx is GPU-only)")
        if f & RSQRT_APPROX_FTZ and self.rsqrt == "approx_ftz":
            notes.append("rsqrt=approx.ftz" if cuda else "rsqrt=ieee (approx is GPU-only)")
        if f & NEG_ZERO_MINUS and self.neg == "zero_minus":
            notes.append("neg=0-x" if cuda else "neg=-x (0-x is GPU-only)")
        if cuda and self.cuda_kernels:
            for b in VARIANT_BITS:  # each bit the field sets has its note in the table
                if b.math_field == "cuda_kernels" and f & b.bit:
                    notes.append(b.trace)
        if f & SIGMOID_EX2 and self._computes_sigmoid(f) and self.sigmoid == "ex2_approx":
            notes.append("exp=ex2.approx" if cuda else "ex2.approx is GPU-only: exp=" + impl)
        return " ".join(notes)


_PRESETS = {
    # PyTorch eager CUDA kernels: precise expf, IEEE division, no contraction.
    # On the CPU, PyTorch's CPU kernels: SLEEF and ATen's erf polynomial (impl "torch").
    "torch_eager": Math("torch_eager", impl="torch", fma=False, silu="div", cuda_kernels=True,
                        reduction="torch"),
    # torch.compile / Inductor (Triton): silu = x / (1 + libdevice.exp(-x)) with `/` as
    # div.full.f32, tl.sigmoid with ex2.approx, FMA contraction on.
    # Its reductions: the Triton kernels' tl.sum order. torch.compile also drops a
    # down-cast followed by an up-cast inside a kernel (config.emulate_precision_casts is
    # off by default): compare it with Policy("fused", round_casts=False).
    # Its rsqrt: libdevice.rsqrt, rsqrt.approx.ftz.f32 (the PTX of its RMSNorm kernel).
    # Its neg: Triton's unary minus, 0 - x (sub.f32 from 0 in its RoPE kernel's PTX).
    "inductor": Math("inductor", impl="cuda", fma=True, silu="div", sigmoid="ex2_approx",
                     division="approx", rsqrt="approx_ftz", neg="zero_minus",
                     reduction="triton", pow="inductor"),
    # torch.compile / Inductor on the CPU (its C++ kernels, codegen/cpp.py): Vectorized's
    # functions (SLEEF's u10 exp/log, 1 / sqrt for rsqrt), silu = x / (1 + exp(-x)), IEEE
    # division, no contraction (Inductor compiles with -ffp-contract=off); its reductions:
    # vector lanes from zero, then vec_reduce_all's butterfly (the inductor_cpp order).
    "inductor_cpu": Math("inductor_cpu", impl="inductor_cpp", fma=False, silu="div",
                         reduction="inductor_cpp", pow="inductor"),
    # nvFuser (Thunder): silu = x * (1 / (1 + expf(-x))), NVRTC with --fmad=true.
    "nvfuser": Math("nvfuser", impl="cuda", fma=True, silu="mul_sigmoid"),
    # TransformerEngine: sigmoid = 1/(1+expf(-x)), silu = x * sigmoid(x); nvcc --fmad=true.
    "transformer_engine": Math("transformer_engine", impl="cuda", fma=True, silu="mul_sigmoid",
                               rms_norm="te"),
    # castlab's own functions: identical bits on CPU and GPU.
    "portable": Math("portable", impl="portable", fma=False, silu="div"),
}


def as_math(m: Any) -> Math:
    """A Math from a Math or a preset name."""
    if isinstance(m, Math):
        return m
    if isinstance(m, str):
        return Math.preset(m)
    raise TypeError(f"math must be a preset name or castlab.Math, not {type(m).__name__}")


_local = threading.local()


def current_math() -> Math:
    """The math variant that plain eager calls use (see :func:`use_math`)."""
    return getattr(_local, "math", _PRESETS["torch_eager"])


@contextlib.contextmanager
def use_math(m: Any) -> Iterator[Math]:
    """Run plain eager calls under another math variant.

    >>> import castlab as cl
    >>> with cl.use_math("portable"):
    ...     y = cl.exp(cl.ones(3))
    """
    prev = getattr(_local, "math", None)
    _local.math = as_math(m)
    try:
        yield _local.math
    finally:
        if prev is None:
            del _local.math
        else:
            _local.math = prev


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
