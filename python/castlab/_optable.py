"""castlab's op table as Python sees it: read from the C++ table (ops/op_table.h) through
``castlab._C``. No op list is kept on the Python side; categories, variant factors and the
functions castlab exports all come from here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from . import _C


class OpInfo(NamedTuple):
    """One entry of the op table."""

    name: str
    aten: str | None  # the ATen op PyTorch computes it with ("aten.gelu approximate=tanh":
                      # name, then keyword arguments), None: castlab-only (or internal)
    opcode: int
    arity: int
    category: str    # internal, unary_float, unary_signed, binary, compare, ternary,
                     # conditional
    factors: int     # the VariantBits the op's formula reads
    cost: int        # rough GPU instructions per element
    public: bool     # exported as castlab.<name> and Tensor.<name>
    formula: str
    grad: str        # derivative rule (castlab._autodiff reads it); "" for none


TABLE: tuple[OpInfo, ...] = tuple(OpInfo(**d) for d in _C.OP_TABLE)
OPS: dict[str, OpInfo] = {o.name: o for o in TABLE if o.category != "internal"}
OPCODE: dict[str, int] = {o.name: o.opcode for o in TABLE}



class VariantBit(NamedTuple):
    """One variant bit (ops/scalar/ops.h CL_VARIANT_BITS, the one list of them)."""

    name: str
    bit: int
    math_field: str  # the castlab.Math field that sets it ("": the lowering does)
    doc: str
    trace: str  # the note a trace shows where Math.cuda_kernels sets the bit ("" otherwise)


VARIANT_BITS: tuple[VariantBit, ...] = tuple(VariantBit(**d) for d in _C.VARIANT_BIT_TABLE)
#: Variant bits by name.
BITS: dict[str, int] = {b.name: b.bit for b in VARIANT_BITS}


def bits_set_by(field: str) -> int:
    """The variant bits the castlab.Math field `field` sets (its column in the table)."""
    mask = 0
    for b in VARIANT_BITS:
        if b.math_field == field:
            mask |= b.bit
    return mask


IMPL_MASK = BITS["impl_mask"]
SILU_MUL_SIGMOID = bits_set_by("silu")
APPROX_DIV = bits_set_by("division")
SIGMOID_EX2 = bits_set_by("sigmoid")
RSQRT_APPROX_FTZ = bits_set_by("rsqrt")
NEG_ZERO_MINUS = bits_set_by("neg")
# Implementation details of PyTorch's eager CUDA kernels (Math.cuda_kernels).
TORCH_CUDA_BITS = bits_set_by("cuda_kernels")
# Set by the lowering (not a math factor): pow's exponent is a tensor, not a Python number.
POW_TENSOR_EXP = BITS["pow_tensor_exp"]
MATH_IMPLS: dict[str, int] = dict(_C.MATH_IMPLS)
ROUND_MODES: dict[str, int] = dict(_C.ROUND_MODES)


def names(*categories: str) -> tuple[str, ...]:
    """Names of the ops in the given categories, in table order."""
    return tuple(o.name for o in OPS.values() if o.category in categories)


# Register types of an instruction's destination (Instr.rtype).
F32, F64, I64 = 0, 1, 2


def instr(op: str, rtype: int, dst: int, a: int = -1, b: int = -1, c: int = -1, var: int = 0,
          dtype: int = 0, mode: int = 0, saturate: int = 0, aux: int = 0,
          imm: float = 0.0, iimm: int = 0):
    """A ``_C.Instr`` for op `op` (a table name or an internal instruction name); `rtype`:
    the destination's register type (F32, F64 or I64; a bool reads as F64 or F32)."""
    return _C.Instr(op=OPCODE[op], rtype=int(rtype), dst=dst, a=a, b=b, c=c, var=var,
                    dtype=dtype, mode=mode, saturate=saturate, aux=aux, imm=float(imm),
                    iimm=int(iimm))


def output(reg: int, mode: int = 0, saturate: int = 1, salt: int = 0):
    """A ``_C.OutputSpec``: store register `reg`, rounding with `mode`."""
    return _C.OutputSpec(reg=reg, mode=mode, saturate=saturate, salt=salt)


class BackwardKernel(NamedTuple):
    """How one of PyTorch's eager backward kernels computes the derivative rule that
    names it (``[name]`` in the op table's grad column), per device ("cuda", "cpu").

    arith: per device, "opmath" (the kernel widens bf16/fp16 to fp32, computes the whole
    rule there and rounds once) or "scalar_t" (it computes in the storage type:
    c10::BFloat16 and c10::Half arithmetic rounds after every operation, like separate
    ops); a dict maps dtype names to these ("*": every other dtype).
    contract: per device, whether the kernel's compiler contracts a*b+c into an fma
    (nvcc --fmad=true, PyTorch's default; the vectorised CPU kernels are built with
    -mfma and GCC's -ffp-contract=fast)."""

    arith: dict
    contract: dict
    source: str
    #: on the GPU, a division by a Python number inside the kernel multiplies by its
    #: reciprocal (MeanOps' factor) rather than dividing truly
    scalar_div_reciprocal: bool = False
    #: per device, where an add's operands are both products: the one its compiler fuses
    #: into the fma ("left" or "right", or a dict of those by dtype name, "*" for the
    #: rest; measured against PyTorch, default "left"); fma_product_tail: the same for the
    #: scalar lambda of a CPU kernel's loop (its tails), where GCC may choose otherwise
    fma_product: dict | None = None
    fma_product_tail: dict | None = None

    def fused_product(self, cuda: bool, dt, tail: bool = False) -> str:
        side = ((self.fma_product_tail if tail else self.fma_product) or {}).get(
            "cuda" if cuda else "cpu", "left")
        if isinstance(side, dict):
            side = side.get(dt.name if dt is not None else "", side["*"])
        return side

    def arith_for(self, cuda: bool, dt) -> str:
        a = self.arith["cuda" if cuda else "cpu"]
        if isinstance(a, dict):
            return a.get(dt.name, a["*"])
        return a


BACKWARD_KERNELS: dict[str, BackwardKernel] = {
    "silu_backward": BackwardKernel(
        {"cuda": "opmath", "cpu": "opmath"}, {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/ActivationSiluKernel.cu, native/cpu/Activation.cpp"),
    "sigmoid_backward": BackwardKernel(
        {"cuda": "scalar_t", "cpu": {"float16": "scalar_t", "*": "opmath"}},
        {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/BinaryMiscBackwardOpsKernels.cu, "
        "native/cpu/BinaryOpsKernel.cpp"),
    "tanh_backward": BackwardKernel(
        {"cuda": "scalar_t", "cpu": "opmath"}, {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/BinaryMiscBackwardOpsKernels.cu, "
        "native/cpu/BinaryOpsKernel.cpp"),
    # In cdf + x * pdf GCC fuses x * pdf in the fp32/fp64 vector loop and the 16-bit
    # types' scalar lambda, the cdf product (0.5 * (1 + erf)) in the others (measured on
    # the AVX2 and AVX512 builds, 2^18 elements per dtype and 45,000 scalar tails: 0
    # differ; the other choice: 10% of fp32/fp64 elements)
    "gelu_backward": BackwardKernel(
        {"cuda": "opmath", "cpu": "opmath"}, {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/ActivationGeluKernel.cu, native/cpu/Activation.cpp",
        fma_product={"cpu": {"float32": "right", "float64": "right", "*": "left"}},
        fma_product_tail={"cpu": {"float32": "left", "float64": "left", "*": "right"}}),
    "gelu_tanh_backward": BackwardKernel(
        {"cuda": "opmath", "cpu": "opmath"}, {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/ActivationGeluKernel.cu, native/cpu/Activation.cpp"),
    "hardswish_backward": BackwardKernel(
        {"cuda": "opmath", "cpu": "opmath"}, {"cuda": True, "cpu": True},
        "aten/src/ATen/native/cuda/ActivationHardswishKernel.cu, native/cpu/Activation.cpp"),
}


# ---------------------------------------------------------------- reductions

#: Reduction ops of the graph (a row reduction each; ops/scalar/reduce.h ReduceKind). The
#: row moments (the mean and M2 of PyTorch's Welford kernels, ops/scalar/moments.h) appear
#: only where the lowering expands var and layer_norm under a torch order.
REDUCE_OPS: dict[str, int] = {"sum": 0, "amax": 1, "amin": 2, "moments_mean": 3, "moments_m2": 4}
#: ReduceKind kRedOnline (ops/scalar/reduce.h): a softmax's sum of exp(x - max x) from x,
#: as Inductor's online softmax computes it (castlab._lower_reduce: no graph op of its own)
REDUCE_ONLINE = 6
#: Orders of accumulation Math.reduction names ("torch": the device's own PyTorch order).
REDUCTION_ORDERS = ("torch", "torch_cpu", "torch_cuda", "triton", "inductor_cpp", "pairwise",
                    "sequential")
#: ReduceOrder codes (ops/scalar/reduce.h).
ORDER_CODE: dict[str, int] = {"sequential": 0, "pairwise": 1, "torch_cpu": 2, "torch_cuda": 3,
                              "softmax_warp": 4, "softmax_block": 5, "cpu_moments": 6,
                              "cuda_layer_norm_vec": 7, "cuda_layer_norm_block": 8, "triton": 9,
                              "softmax_spatial": 10}

# PyTorch's forward kernels that compute a composite (softmax, layer_norm, ...) in op-math
# and round once: their inner nodes carry kernel=<name> like the backward kernels above.
def _opmath_kernel(source: str, contract: bool = True, **kw) -> BackwardKernel:
    return BackwardKernel({"cuda": "opmath", "cpu": "opmath"},
                          {"cuda": contract, "cpu": contract}, source, **kw)


BACKWARD_KERNELS.update({
    "softmax": _opmath_kernel("aten/src/ATen/native/cuda/SoftMax.cu, native/cpu/SoftMaxKernel.cpp"),
    "log_softmax": _opmath_kernel(
        "aten/src/ATen/native/cuda/SoftMax.cu, native/cpu/SoftMaxKernel.cpp"),
    # autograd's _softmax_backward_data / _log_softmax_backward_data on the CPU
    "softmax_backward": _opmath_kernel(
        "aten/src/ATen/native/cpu/SoftMaxKernel.cpp, native/cuda/SoftMax.cu"),
    "log_softmax_backward": _opmath_kernel(
        "aten/src/ATen/native/cpu/SoftMaxKernel.cpp, native/cuda/SoftMax.cu"),
    "mean": _opmath_kernel(
        "aten/src/ATen/native/cuda/ReduceMomentKernel.cu, native/ReduceOps.cpp", contract=False,
        scalar_div_reciprocal=True),
    "var": _opmath_kernel(
        "aten/src/ATen/native/cuda/ReduceMomentKernel.cu, native/cpu/ReduceOpsKernel.cpp",
        contract=False),
    "layer_norm": _opmath_kernel(
        "aten/src/ATen/native/cuda/layer_norm_kernel.cu, native/cpu/layer_norm_kernel.cpp"),
    # autograd's native_layer_norm_backward on the CPU: one kernel, three results
    "layer_norm_backward": _opmath_kernel(
        "aten/src/ATen/native/cpu/layer_norm_kernel.cpp LayerNormBackwardKernelImpl"),
    "rms_norm_te": _opmath_kernel("transformer_engine/common/normalization/rmsnorm"),
})


def grad_rule_kernel(rule: str) -> tuple[str | None, str]:
    """An op table grad rule split into the PyTorch kernel its ``[kernel]`` prefix names
    (None without one) and its statements."""
    m = re.match(r"\s*\[(\w+)\]\s*(.*)$", rule, re.S)
    return (m.group(1), m.group(2)) if m else (None, rule)


# A backward kernel the op table names and nothing above describes: PyTorch's usual
# activation backward, which loads into op-math, computes and rounds once, with its
# compilers' contraction (CUDA functors over opmath_t; the CPU's float Vectorized
# lambdas). tests/test_grad.py and test_grad_cuda.py check each against torch.autograd;
# one that rounds otherwise gets an entry above.
for _o in OPS.values():
    _k = grad_rule_kernel(_o.grad)[0]
    if _k is not None and _k not in BACKWARD_KERNELS:
        BACKWARD_KERNELS[_k] = _opmath_kernel(f"PyTorch's {_k} kernels ({_o.aten}), "
                                              "op-math as the op table's default")
