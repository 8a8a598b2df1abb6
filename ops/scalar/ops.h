// The scalar definition of every op: written once, compiled into the CPU executor and
// embedded verbatim into the CUDA kernels the code generator writes.
//
// Each function evaluates one op in op-math (float for fp32/bf16/fp16/fp8 storage,
// double for fp64). Rounding to a storage format is never done here: it is an explicit
// step (kOpRound) that the policy places in the graph.
//
// Formulas follow PyTorch's CUDA kernels:
//   silu     x / (1 + exp(-x))            aten/src/ATen/native/cuda/ActivationSiluKernel.cu
//   sigmoid  1 / (1 + exp(-x))            aten/src/ATen/native/cuda/UnarySpecialOpsKernel.cu
//   gelu     x * 0.5 * (1 + erf(x / sqrt2))   and the tanh form, ActivationGeluKernel.cu
//   pow      special exponents as pow_tensor_scalar (2 -> x*x, 0.5 -> sqrt, ...)
#pragma once
#include "core/cl_defs.h"
#include "core/convert.h"
#include "core/rng.h"
#include "ops/scalar/math.h"

namespace cl {

// Math-variant bits carried by each instruction (ops/op_table.h lists which bits each
// op's formula reads). 32 bits wide: room for the factors still to come. The one list of
// them: the enum below, castlab._C.VARIANT_BITS and castlab._optable's constants derive
// from it.
// CL_VARIANT_BIT(Enum, "name", bit, "math_field", "description", "trace")
//   math_field  the castlab.Math field that sets the bit ("" where the lowering sets it)
//   trace       the note a trace shows where Math.cuda_kernels sets the bit (required for
//               those bits; "" for the others)
#define CL_VARIANT_BITS(X)                                                                      \
  X(ImplMask, "impl_mask", 0x3, "impl", "MathImpl for exp/log/sin/cos/tanh/erf", "")            \
  X(SiluMulSigmoid, "silu_mul_sigmoid", 0x4, "silu",                                            \
    "silu = x * sigmoid(x) (TE, Thunder, nvFuser) instead of x/(1+e)", "")                      \
  X(ApproxDiv, "approx_div", 0x8, "division",                                                   \
    "division as CUDA's approximate div.full.f32 (GPU only)", "")                               \
  X(SigmoidEx2, "sigmoid_ex2", 0x10, "sigmoid",                                                 \
    "sigmoid exp as ex2.approx(x*log2e) (Triton's tl.sigmoid, GPU only)", "")                   \
  X(RsqrtFast, "rsqrt_fast", 0x20, "cuda_kernels",                                              \
    "rsqrt via the device's rsqrtf instead of 1/sqrt(x)",                                       \
    "rsqrtf (approximate, as PyTorch's CUDA kernel)")                                           \
  X(FmaInOp, "fma_in_op", 0x40, "cuda_kernels",                                                 \
    "a*b+c inside an op's formula contracts (nvcc --fmad=true builds; GCC's on torch_cpu)",     \
    "fma inside the formula (nvcc --fmad=true)")                                                \
  X(HardswishRecip6, "hardswish_recip6", 0x80, "cuda_kernels",                                  \
    "hardswish and hardsigmoid multiply by 1/6 (PyTorch CUDA) instead of / 6 (CPU)",            \
    "times 1/6 (PyTorch's CUDA kernel)")                                                        \
  X(PowDevice, "pow_device", 0x100, "cuda_kernels",                                             \
    "pow's general case is the device's pow: CUDA powf/pow (PyTorch; glibc's on torch_cpu)",    \
    "CUDA powf/pow (PyTorch's pow kernels)")                                                    \
  X(PowTensorExp, "pow_tensor_exp", 0x200, "",                                                  \
    "with pow_device: a tensor exponent, no pow_tensor_scalar shortcuts (PyTorch's "            \
    "pow_tensor_tensor calls pow directly)",                                                    \
    "")                                                                                         \
  X(TorchVml, "torch_vml", 0x400, "impl",                                                       \
    "CPU only: MKL VML's function from libtorch_cpu.so over the whole block "                   \
    "(ops/cpu/torch_vml.h), as PyTorch's fp32/fp64 exp/log/sin/cos/tanh/erf/sqrt kernels",      \
    "")                                                                                         \
  X(RsqrtScalar16, "rsqrt_scalar16", 0x800, "impl",                                             \
    "CPU only, on layouts where PyTorch runs its scalar lambda: 1 / sqrt(x) with sqrt "         \
    "rounded to the 16-bit Instr.dtype first",                                                  \
    "")                                                                                         \
  X(TorchTail, "torch_tail", 0x1000, "impl",                                                    \
    "CPU only: PyTorch's cpu_kernel_vec runs the last (n mod Instr.aux) elements of each "      \
    "thread chunk with its scalar lambda (glibc), Loops.h; the executor does so too",           \
    "")                                                                                         \
  X(OneDnnGelu, "onednn_gelu", 0x2000, "impl",                                                  \
    "CPU only, fp32 gelu (erf): oneDNN's JIT eltwise_gelu_erf (math_onednn.h), minimax form "   \
    "(AVX512 cores), which PyTorch calls on contiguous input of 2 or more elements; the "       \
    "executor clears it on other layouts (then Gelu.h's loop, torch_tail)",                     \
    "")                                                                                         \
  X(OneDnnGeluAvx2, "onednn_gelu_avx2", 0x4000, "impl",                                         \
    "with onednn_gelu: the JIT's form below AVX512 (A&S)", "")                                  \
  X(OneDnnBf16Ftz, "onednn_bf16_ftz", 0x8000, "impl",                                           \
    "with onednn_gelu: bf16 stored by vcvtneps2bf16, which writes a subnormal float as a "      \
    "signed zero (avx512_bf16 CPUs)",                                                           \
    "")                                                                                         \
  X(TorchScalarLoop, "torch_scalar_loop", 0x10000, "cpu_isa",                                   \
    "CPU only: PyTorch's DEFAULT build (ATEN_CPU_CAPABILITY=default), whose vec_base "          \
    "Vectorized maps the scalar function over its lanes: every layout computes as the scalar "  \
    "lambda (16-bit rsqrt's rounded sqrt)",                                                     \
    "")                                                                                         \
  X(OneDnnGeluBwd, "onednn_gelu_bwd", 0x20000, "impl",                                          \
    "CPU only, with onednn_gelu: PyTorch's CPU gelu_backward (erf form, contiguous fp32/bf16) " \
    "through oneDNN's JIT eltwise_gelu_erf backward: register b (the cotangent) times "         \
    "gelu'(a) by Abramowitz & Stegun (every ISA), stored as the kernel stores "                 \
    "(onednn_bf16_ftz); the scalar op_gelu returns gelu'(a) only",                              \
    "")                                                                                         \
  X(RsqrtApproxFtz, "rsqrt_approx_ftz", 0x40000, "rsqrt",                                       \
    "rsqrt as Triton's libdevice.rsqrt: fp32 rsqrt.approx.ftz.f32 (a subnormal input is "       \
    "flushed to a zero first), fp64 the device's rsqrt (GPU only)",                             \
    "")                                                                                         \
  X(NegZeroMinus, "neg_zero_minus", 0x80000, "neg",                                             \
    "a floating neg as Triton's unary minus, 0 - x (Inductor writes neg as -x): -(+0) is +0 "   \
    "(GPU only)",                                                                               \
    "")

enum VariantBits : uint32_t {
#define CL_VARIANT_ENUM(E, name, bit, field, doc, trace) kVar##E = bit,
  CL_VARIANT_BITS(CL_VARIANT_ENUM)
#undef CL_VARIANT_ENUM
};

// ---- GPU-only approximate instructions (Triton's lowering of `/` and tl.exp) ----
// On the CPU these variants are cleared by the lowering (and the trace says so).
#if defined(__CUDA_ARCH__)
// div.full.f32 as ptxas expands it (the same SASS for sm_80 to sm_120): a and b scaled by
// `s` (1/4 where |b| > 2^126, 2^24 where |b| < 2^-126, else 1), then a*s times `r`, the
// hardware's reciprocal of b*s. Written out, the scale and the reciprocal of a divisor
// shared by many quotients (softmax's row sum) are computed once; tests/test_cuda.py
// checks the bits against the instruction over special and random operands.
struct FullDivisor {
  float s, r;
};
CL_HD FullDivisor full_divisor(float b) {
  const float m = fabsf(b);
  FullDivisor d;
  d.s = m > 0x1p126f ? 0.25f : (m < 0x1p-126f ? 0x1p24f : 1.0f);
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(d.r) : "f"(b * d.s));
  return d;
}
#endif

CL_HD float div_f(float a, float b, int var) {
#if defined(__CUDA_ARCH__)
  if (var & kVarApproxDiv) {
    const FullDivisor d = full_divisor(b);
    return (a * d.s) * d.r;
  }
#endif
  return a / b;
}
CL_HD double div_f(double a, double b, int var) { return a / b; }

// a/b + c where the quotient is used only by the add. With approximate division, ptxas
// contracts the product of div.full.f32's expansion into the add: one rounding (Triton's
// `s / n_cols + eps`; measured on an H100: every value equals fma(a, rcp(b), c), none the
// two-rounding form). IEEE: two roundings.
CL_HD float div_add_f(float a, float b, float c, int var) {
#if defined(__CUDA_ARCH__)
  if (var & kVarApproxDiv) {
    const FullDivisor d = full_divisor(b);
    return fma_f(a * d.s, d.r, c);
  }
#endif
  const float q = a / b;
  return q + c;
}
CL_HD double div_add_f(double a, double b, double c, int var) {
  const double q = a / b;
  return q + c;
}

// exp(-x) for sigmoid: Triton's math.exp on fp32 is ex2.approx.f32(x * log2(e)).
CL_HD float exp_neg_for_sigmoid(float x, int var) {
#if defined(__CUDA_ARCH__)
  if (var & kVarSigmoidEx2) {
    float r;
    const float t = (-x) * 1.4426950408889634f;
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(t));
    return r;
  }
#endif
  return m_exp(-x, var & kVarImplMask);
}
CL_HD double exp_neg_for_sigmoid(double x, int var) { return m_exp(-x, var & kVarImplMask); }

CL_HD float fma_t(float a, float b, float c) { return fma_f(a, b, c); }
CL_HD double fma_t(double a, double b, double c) { return fma_d(a, b, c); }

// ---- the ops of ops/op_table.h: fn(operands..., var), T = float or double ----
template <typename T>
CL_HD T sqrt_t(T x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

template <typename T>
CL_HD T op_neg(T x, int var) {
#if defined(__CUDA_ARCH__)
  if (var & kVarNegZeroMinus) return T(0) - x;  // (an integer's: the same as -x)
#else
  (void)var;
#endif
  return -x;
}
template <typename T>
CL_HD T op_abs(T x, int) {
  return x < T(0) ? -x : (x == T(0) ? T(0) : x);
}
template <typename T>
CL_HD T op_exp(T x, int var) {
  return m_exp(x, var & kVarImplMask);
}
template <typename T>
CL_HD T op_log(T x, int var) {
  return m_log(x, var & kVarImplMask);
}
template <typename T>
CL_HD T op_sigmoid(T x, int var) {
  return div_f(T(1), T(1) + exp_neg_for_sigmoid(x, var), var);
}
template <typename T>
CL_HD T op_silu(T x, int var) {
  if (var & kVarSiluMulSigmoid) return x * op_sigmoid(x, var);
  return div_f(x, T(1) + m_exp(-x, var & kVarImplMask), var);
}
template <typename T>
CL_HD T op_tanh(T x, int var) {
  return m_tanh(x, var & kVarImplMask);
}
#if !defined(__CUDACC__)
// oneDNN's gelu where PyTorch's CPU kernel calls it (kVarOneDnnGelu): the JIT's result, and
// for bf16 output what vcvtneps2bf16 keeps of it. (The CPU executor runs the same functions
// in one loop per form: compute_var.)
CL_HD float gelu_onednn(float x, int var) {
  if (var & kVarOneDnnGeluBwd) return onednn::gelu_erf_bwd(x);
  const float y = (var & kVarOneDnnGeluAvx2) ? onednn::gelu_erf_as(x) : onednn::gelu_erf_minimax(x);
  return (var & kVarOneDnnBf16Ftz) ? onednn::bf16_store_ftz(y) : y;
}
#endif

template <typename T>
CL_HD T op_gelu(T x, int var) {  // erf form
#if !defined(__CUDACC__)
  if constexpr (sizeof(T) == 4)  // oneDNN's gelu is fp32 (and bf16, computed in fp32) only
    if (var & kVarOneDnnGelu) return gelu_onednn(x, var);
#endif
  const T kAlpha = T(0.70710678118654752440);  // M_SQRT1_2
  return x * T(0.5) * (T(1) + m_erf(x * kAlpha, var & kVarImplMask));
}
template <typename T>
CL_HD T op_gelu_tanh(T x, int var) {
  const T kBeta = T(0.79788456080286535588);  // M_SQRT2 * M_2_SQRTPI * 0.5
  const T kKappa = T(0.044715);
  const T x_cube = x * x * x;
  // PyTorch's CUDA build contracts x + kKappa * x_cube into one fma (nvcc --fmad=true).
  const T inner =
      (var & kVarFmaInOp) ? kBeta * fma_t(kKappa, x_cube, x) : kBeta * (x + kKappa * x_cube);
  return T(0.5) * x * (T(1) + m_tanh(inner, var & kVarImplMask));
}
template <typename T>
CL_HD T op_sqrt(T x, int) {
  return sqrt_t(x);
}
#if defined(__CUDA_ARCH__)
// Triton's libdevice.rsqrt (Inductor's rsqrt): __nv_rsqrtf is rsqrt.approx.ftz.f32 in
// Triton's libdevice build; __nv_rsqrt for double, as CUDA's rsqrt.
__device__ inline float rsqrt_approx_ftz(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ inline double rsqrt_approx_ftz(double x) { return rsqrt(x); }
#endif
template <typename T>
CL_HD T op_rsqrt(T x, int var) {
#if defined(__CUDA_ARCH__)
  if (var & kVarRsqrtApproxFtz) return rsqrt_approx_ftz(x);
  if (var & kVarRsqrtFast) return rsqrt(x);
#endif
  return T(1) / sqrt_t(x);
}
template <typename T>
CL_HD T op_reciprocal(T x, int var) {
  return div_f(T(1), x, var);
}
template <typename T>
CL_HD T op_square(T x, int) {
  return x * x;
}
template <typename T>
CL_HD T op_cos(T x, int var) {
  return m_cos(x, var & kVarImplMask);
}
template <typename T>
CL_HD T op_sin(T x, int var) {
  return m_sin(x, var & kVarImplMask);
}
template <typename T>
CL_HD T op_erf(T x, int var) {
  return m_erf(x, var & kVarImplMask);
}
// PyTorch: CPU kernels divide by 6 (Activation.cpp hardswish_kernel); the CUDA kernel
// multiplies by one_sixth = 1.0f/6.0f (ActivationHardswishKernel.cu). std::min/max order:
// a NaN input propagates. (On the H200, x*c*(1.0/6.0) in fp64 differed from torch in
// 73% of random inputs; the float constant matches.)
template <typename T>
CL_HD T op_hardswish(T x, int var) {
  T c = x + T(3);
  c = c < T(0) ? T(0) : c;  // std::max(c, 0): keeps c when c is NaN
  c = T(6) < c ? T(6) : c;  // std::min(c, 6)
  // one_sixth is the float 1.0f/6.0f widened to op-math, also for double
  if (var & kVarHardswishRecip6) return x * c * T(1.0f / 6.0f);
  return x * c / T(6);
}
// PyTorch: hardsigmoid as hardswish's c alone, / 6 on the CPU (Activation.cpp
// hardsigmoid_kernel), times the float one_sixth on the GPU (ActivationHardsigmoidKernel.cu).
template <typename T>
CL_HD T op_hardsigmoid(T x, int var) {
  T c = x + T(3);
  c = c < T(0) ? T(0) : c;  // std::max(c, 0): keeps c when c is NaN
  c = T(6) < c ? T(6) : c;  // std::min(c, 6)
  if (var & kVarHardswishRecip6) return c * T(1.0f / 6.0f);
  return c / T(6);
}

template <typename T>
CL_HD T op_add(T a, T b, int) {
  return a + b;
}
template <typename T>
CL_HD T op_sub(T a, T b, int) {
  return a - b;
}
template <typename T>
CL_HD T op_mul(T a, T b, int) {
  return a * b;
}
template <typename T>
CL_HD T op_div(T a, T b, int var) {
  return div_f(a, b, var);
}
// IEEE 754-2019 maximum/minimum, as torch.maximum/minimum on CUDA: NaN-propagating, and
// -0 < +0 (maximum(-0, +0) = +0 and minimum(-0, +0) = -0 in either argument order).
// (torch CPU is not consistent here: its vectorised loop returns the second argument on a
// signed-zero tie, its scalar tail the first.)
template <typename T>
CL_HD T op_maximum(T a, T b, int) {
  return ieee_max_min(a, b, true);
}
template <typename T>
CL_HD T op_minimum(T a, T b, int) {
  return ieee_max_min(a, b, false);
}
// C pow (C99 Annex F.9.4.4), which PyTorch's pow(tensor, tensor) is; a Python-number
// exponent of +-0.5 is lowered to sqrt (PyTorch's pow_tensor_scalar) before it gets here.
// The device's own pow (CUDA's powf for float, pow for double; the C library on the CPU,
// where the lowering never asks for it): what PyTorch's CUDA pow kernels call.
// With the torch_cpu implementation on the CPU: SLEEF's pow, which the vector body of
// PyTorch's CPU pow kernels calls (Vectorized<float/double>::pow).
CL_HD float pow_device(float x, float y, int impl) {
#if defined(__CUDA_ARCH__)
  return powf(x, y);
#else
  return impl == kTorchCpu ? torch_cpu::powf_u10(x, y) : std::pow(x, y);
#endif
}
#if defined(__CUDA_ARCH__) && defined(CL_LINK_POW_FMAD)
// CUDA's double pow as PyTorch's nvcc build compiles it: libdevice's pow contracts some of
// its multiply-adds only under --fmad=true, which castlab's kernels are not compiled with.
// The kernel cache compiles this one function separately with --fmad=true and links it
// (ops/cuda/kernel_cache.cpp); a generated kernel that needs it defines CL_LINK_POW_FMAD.
extern "C" __device__ double cl_pow_fmad(double x, double y);
#endif
CL_HD double pow_device(double x, double y, int impl) {
#if defined(__CUDA_ARCH__) && defined(CL_LINK_POW_FMAD)
  return cl_pow_fmad(x, y);
#elif defined(__CUDA_ARCH__)
  return pow(x, y);
#else
  return impl == kTorchCpu ? torch_cpu::pow_u10(x, y) : std::pow(x, y);
#endif
}

template <typename T>
CL_HD T op_pow(T x, T y, int var) {
  // PyTorch's CUDA pow_tensor_tensor: pow(x, y) for every pair, no special cases
  if ((var & kVarPowDevice) && (var & kVarPowTensorExp))
    return pow_device(x, y, var & kVarImplMask);
  if (y == T(0) || x == T(1)) return T(1);  // pow(x, +-0) = pow(+1, y) = 1, even for NaN
  // Exponents PyTorch's pow_tensor_scalar kernels special-case: these give C pow's result
  // for every x, except +-0.5 at x = -0 and -inf (sqrt(-0) = -0, sqrt(-inf) = NaN).
  if (y == T(2)) return x * x;
  if (y == T(3)) return x * x * x;
  const bool root_ok = x != T(0) && x != T(-1.0 / 0.0);  // x is neither +-0 nor -inf
  if (y == T(0.5) && root_ok) return sqrt_t(x);
  if (y == T(-0.5) && root_ok) return T(1) / sqrt_t(x);
  if (y == T(-1)) return T(1) / x;
  if (y == T(-2)) return T(1) / (x * x);
  if (y == T(1)) return x;
  if (var & kVarPowDevice)  // pow_tensor_scalar's general case
    return pow_device(x, y, var & kVarImplMask);
  // General case: exp(y * log|x|) in double, with C pow's sign and special-value rules.
  const int impl = var & kVarImplMask;
  const double dx = (double)x, dy = (double)y;
  const double inf = 1.0 / 0.0;
  if (dx != dx || dy != dy) return T(dx + dy);
  const double ax = dx < 0 ? -dx : dx;
  const double ay = dy < 0 ? -dy : dy;
  if (ay == inf) {  // pow(-1, +-inf) = 1; |x| < 1: +inf for -inf, +0 for +inf; |x| > 1: the reverse
    if (ax == 1.0) return T(1);
    return T((ax < 1.0) == (dy < 0) ? inf : 0.0);
  }
  // Every double of magnitude >= 2**53 is an even integer.
  const bool big = ay >= 9007199254740992.0;
  const bool y_int = big || (double)(int64_t)dy == dy;
  const bool y_odd = !big && y_int && ((int64_t)dy & 1);
  const bool neg = sign_bit(dx);
  if (ax == inf) {  // pow(+-inf, y): +-0 for y < 0, +-inf for y > 0; the sign only for odd y
    const double r = dy < 0 ? 0.0 : inf;
    return T((neg && y_odd) ? -r : r);
  }
  if (dx == 0.0) {
    if (dy < 0) return (y_odd && neg) ? T(-inf) : T(inf);
    return (y_odd) ? x : T(0);
  }
  if (dx < 0 && !y_int) return T(0.0 / 0.0);
  const double r = m_exp(dy * m_log(ax, impl), impl);
  return T((dx < 0 && y_odd) ? -r : r);
}
template <typename T>
CL_HD T op_eq(T a, T b, int) {
  return a == b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_ne(T a, T b, int) {
  return a != b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_lt(T a, T b, int) {
  return a < b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_le(T a, T b, int) {
  return a <= b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_gt(T a, T b, int) {
  return a > b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_ge(T a, T b, int) {
  return a >= b ? T(1) : T(0);
}
template <typename T>
CL_HD T op_fma(T a, T b, T c, int) {
  return fma_t(a, b, c);
}
template <typename T>
CL_HD T op_div_add(T a, T b, T c, int var) {
  return div_add_f(a, b, c, var);
}
template <typename T>
CL_HD T op_where(T cond, T a, T b, int) {
  return cond != T(0) ? a : b;
}

// ---- integer conversions (the to_i64 instruction and stores to integer formats) ----
// A floating-point value as integer format `dt`, as PyTorch's casts on x86-64 CPUs:
// truncation toward zero; NaN, infinities and values outside the format's range give
// its minimum (INT32_MIN, INT64_MIN); bool: x != 0 (NaN is true). No undefined behaviour.
CL_HD int64_t float_to_int(double v, int dt) {
  if (dt == kBool) return v != 0.0 ? 1 : 0;
  if (dt == kInt32)
    return (v > -2147483649.0 && v < 2147483648.0) ? (int64_t)(int32_t)v
                                                   : (int64_t)(-2147483647 - 1);
  return (v >= -9223372036854775808.0 && v < 9223372036854775808.0)
             ? (int64_t)v
             : (int64_t)(-9223372036854775807LL - 1);
}
// An integer value as integer format `dt`: int32 keeps the low 32 bits (wraps, as
// PyTorch), bool: v != 0.
CL_HD int64_t int_to_int(int64_t v, int dt) {
  if (dt == kBool) return v != 0 ? 1 : 0;
  if (dt == kInt32) return (int64_t)(int32_t)(uint32_t)(uint64_t)v;
  return v;
}

// A register value (int64, double or float) as integer format dt.
CL_HD int64_t to_int_fmt(long long v, int dt) { return int_to_int((int64_t)v, dt); }
CL_HD int64_t to_int_fmt(long v, int dt) { return int_to_int((int64_t)v, dt); }
CL_HD int64_t to_int_fmt(double v, int dt) { return float_to_int(v, dt); }
CL_HD int64_t to_int_fmt(float v, int dt) { return float_to_int((double)v, dt); }

// ---- counter-based random numbers: a function of (seed, stream, element index) only ----
CL_HD double rand_uniform(uint64_t seed, uint32_t stream, uint64_t index) {
  const U32x4 r = philox4x32((uint32_t)index, (uint32_t)(index >> 32), stream, 0x5EEDu,
                             (uint32_t)seed, (uint32_t)(seed >> 32));
  return uniform_f64(r.v[0], r.v[1]);
}
// Box-Muller in double with the portable log/cos, so every device gives the same bits.
CL_HD double rand_normal(uint64_t seed, uint32_t stream, uint64_t index) {
  const U32x4 r = philox4x32((uint32_t)index, (uint32_t)(index >> 32), stream, 0xB0C5u,
                             (uint32_t)seed, (uint32_t)(seed >> 32));
  const double u1 = 1.0 - uniform_f64(r.v[0], r.v[1]);  // (0, 1]
  const double u2 = uniform_f64(r.v[2], r.v[3]);
  const double rad = sqrt_t(-2.0 * portable::log_(u1));
  return rad * portable::cos_(6.283185307179586 * u2);
}

}  // namespace cl
