// The CPU executor's implementation, included twice: by executor.cpp (baseline ISA)
// and by executor_avx2.cpp (compiled with -mavx2 -mfma, so portable math's explicit
// fma becomes one instruction and the block loops use 256-bit vectors). Contraction
// of a*b+c stays off in both (-ffp-contract=off), so both give the same bits.
// Expects CL_EXEC_NS to name the namespace to define run() in.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu/jit.h"
#include "ops/cpu/torch_vml.h"
#include "ops/program.h"

namespace cl {
namespace CL_EXEC_NS {
namespace {

constexpr int64_t kBlock = 512;
constexpr int64_t kRegStride = kBlock + 8;  // doubles between two registers of a block
// Lanes of the fp32 SLEEF vector in PyTorch's AVX2 kernels (Sleef_*f8): the group over
// which its sin/cos choose one argument reduction.
constexpr int64_t kTorchFloatLanes = 8;

// The coefficients of oneDNN's minimax gelu (math_onednn.h) for the pieces piece[0..n),
// n <= kBlock, into c[degree][j]. The JIT looks them up with one vpermt2ps per degree over
// the 32-entry rows; so does this, where the CPU has AVX512F (which the minimax form implies:
// oneDNN runs it only on AVX512 cores). A table lookup is exact: only the speed differs.
#if defined(__x86_64__)
__attribute__((target("avx512f"), noinline)) void onednn_gelu_coefs_avx512(const int32_t* piece,
                                                                           float (*c)[kBlock],
                                                                           int64_t n) {
  __m512 lo[6], hi[6];
  for (int k = 0; k < 6; ++k) {
    lo[k] = _mm512_castsi512_ps(_mm512_load_si512(&onednn::detail::kGeluErfPol[k][0]));
    hi[k] = _mm512_castsi512_ps(_mm512_load_si512(&onednn::detail::kGeluErfPol[k][16]));
  }
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512i i = _mm512_maskz_loadu_epi32(m, piece + j);
    for (int k = 0; k < 6; ++k)
      _mm512_mask_storeu_ps(&c[k][j], m, _mm512_permutex2var_ps(lo[k], i, hi[k]));
  }
}
#endif

void onednn_gelu_minimax(float* d, const float* a, int64_t n) {
  alignas(64) int32_t piece[kBlock];
  alignas(64) float c[6][kBlock];
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
#else
  constexpr bool avx512 = false;
#endif
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t m = std::min(kBlock, n - j0);
    const float* x = a + j0;
    for (int64_t j = 0; j < m; ++j) piece[j] = onednn::gelu_erf_minimax_piece(x[j]);
#if defined(__x86_64__)
    if (avx512) onednn_gelu_coefs_avx512(piece, c, m);
#endif
    if (!avx512)
      for (int k = 0; k < 6; ++k)
        for (int64_t j = 0; j < m; ++j) c[k][j] = onednn::gelu_erf_minimax_coef(k, piece[j]);
    for (int64_t j = 0; j < m; ++j)
      d[j0 + j] =
          onednn::gelu_erf_minimax_poly(x[j], c[0][j], c[1][j], c[2][j], c[3][j], c[4][j], c[5][j]);
  }
}

template <typename T>
inline T reg_value(const void* p, int64_t j) {
  return static_cast<const T*>(p)[j];
}

// Element access through byte addresses: NumPy arrays may start at any byte offset, so
// a typed pointer could be misaligned (undefined behaviour); memcpy of a fixed size
// compiles to the same plain (vectorisable) load or store.
template <typename T>
struct LoadAt {
  const char* b;
  T operator[](int64_t i) const {
    T v;
    std::memcpy(&v, b + i * static_cast<int64_t>(sizeof(T)), sizeof v);
    return v;
  }
};
template <typename T>
struct StoreAt {
  char* b;
  struct Ref {
    char* p;
    void operator=(T v) const { std::memcpy(p, &v, sizeof v); }
  };
  Ref operator[](int64_t i) const { return Ref{b + i * static_cast<int64_t>(sizeof(T))}; }
};

// ---- loads: storage -> register ----
template <typename R>
void load_rows(R* dst, const char* base, int dtype, const int64_t* row_off, int64_t nrows,
               int64_t col0, int64_t ncols, int64_t cstride) {
  int64_t j = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t off = row_off[r] + col0 * cstride;
    switch (dtype) {
      case kFloat64: {
        const LoadAt<double> p{base + off * static_cast<int64_t>(sizeof(double))};
        for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(p[c * cstride]);
        break;
      }
      case kFloat32: {
        const LoadAt<float> p{base + off * static_cast<int64_t>(sizeof(float))};
        if (cstride == 1)
          for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(p[c]);
        else
          for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(p[c * cstride]);
        break;
      }
      case kBFloat16: {
        const LoadAt<uint16_t> p{base + off * static_cast<int64_t>(sizeof(uint16_t))};
        if (cstride == 1) {
          // in chunks of 16 through a local copy: no aliasing test or vector-loop
          // prologue per row (RoPE's rows are 64 elements)
          int64_t c = 0;
          for (; c + 16 <= ncols; c += 16) {
            uint16_t h[16];
            std::memcpy(h, p.b + 2 * c, sizeof h);
            R* o = dst + j + c;
            for (int l = 0; l < 16; ++l) o[l] = static_cast<R>(bf16_to_f32(h[l]));
          }
          for (; c < ncols; ++c) dst[j + c] = static_cast<R>(bf16_to_f32(p[c]));
        } else
          for (int64_t c = 0; c < ncols; ++c)
            dst[j + c] = static_cast<R>(bf16_to_f32(p[c * cstride]));
        break;
      }
      case kFloat16: {
        const LoadAt<uint16_t> p{base + off * static_cast<int64_t>(sizeof(uint16_t))};
        for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(f16_to_f32(p[c * cstride]));
        break;
      }
      case kFloat8E4M3FN:
      case kFloat8E5M2: {
        const LoadAt<uint8_t> p{base + off * static_cast<int64_t>(sizeof(uint8_t))};
        for (int64_t c = 0; c < ncols; ++c)
          dst[j + c] = static_cast<R>(bits_to_f64(p[c * cstride], dtype));
        break;
      }
      case kBool: {
        const LoadAt<uint8_t> p{base + off * static_cast<int64_t>(sizeof(uint8_t))};
        for (int64_t c = 0; c < ncols; ++c) dst[j + c] = p[c * cstride] ? R(1) : R(0);
        break;
      }
      case kInt32: {
        const LoadAt<int32_t> p{base + off * static_cast<int64_t>(sizeof(int32_t))};
        for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(p[c * cstride]);
        break;
      }
      case kInt64: {
        const LoadAt<int64_t> p{base + off * static_cast<int64_t>(sizeof(int64_t))};
        for (int64_t c = 0; c < ncols; ++c) dst[j + c] = static_cast<R>(p[c * cstride]);
        break;
      }
      default: throw std::invalid_argument("load: unsupported dtype");
    }
    j += ncols;
  }
}

// Integer and bool inputs into an int64 register (exact): load_rows's integer cases.
void load_rows_int(int64_t* dst, const char* base, int dtype, const int64_t* row_off, int64_t nrows,
                   int64_t col0, int64_t ncols, int64_t cstride) {
  if (dtype != kBool && dtype != kInt32 && dtype != kInt64)
    throw std::invalid_argument("load: an int64 register loads integer inputs only");
  load_rows(dst, base, dtype, row_off, nrows, col0, ncols, cstride);
}

// ---- stores: register -> storage, one rounding ----
template <typename R>
void store_rows(char* base, int dtype, const R* src, const int64_t* row_off, int64_t nrows,
                int64_t col0, int64_t ncols, int64_t cstride, int mode, bool sat,
                const uint32_t* rbits) {
  int64_t j = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t off = row_off[r] + col0 * cstride;
    switch (dtype) {
      case kFloat64: {
        const StoreAt<double> p{base + off * static_cast<int64_t>(sizeof(double))};
        for (int64_t c = 0; c < ncols; ++c) p[c * cstride] = static_cast<double>(src[j + c]);
        break;
      }
      case kFloat32: {
        const StoreAt<float> p{base + off * static_cast<int64_t>(sizeof(float))};
        if (std::is_same<R, float>::value || mode == kNearestEven) {
          for (int64_t c = 0; c < ncols; ++c) p[c * cstride] = static_cast<float>(src[j + c]);
        } else {
          for (int64_t c = 0; c < ncols; ++c)
            p[c * cstride] = f32_from_bits(round_f64_to_bits(
                static_cast<double>(src[j + c]), kFloat32, mode, sat, rbits ? rbits[j + c] : 0));
        }
        break;
      }
      case kBFloat16:
      case kFloat16: {
        const StoreAt<uint16_t> p{base + off * static_cast<int64_t>(sizeof(uint16_t))};
        if (std::is_same<R, float>::value && mode == kNearestEven) {
          if (dtype == kBFloat16 && cstride == 1) {
            int64_t c = 0;
            for (; c + 16 <= ncols; c += 16) {  // as the bf16 load above
              uint16_t h[16];
              const R* a = src + j + c;
              for (int l = 0; l < 16; ++l) h[l] = f32_to_bf16_rne(static_cast<float>(a[l]));
              std::memcpy(p.b + 2 * c, h, sizeof h);
            }
            for (; c < ncols; ++c) p[c] = f32_to_bf16_rne(static_cast<float>(src[j + c]));
          } else
            for (int64_t c = 0; c < ncols; ++c)
              p[c * cstride] = static_cast<uint16_t>(
                  narrow_f32(static_cast<float>(src[j + c]), dtype, kNearestEven, sat, 0));
        } else {
          for (int64_t c = 0; c < ncols; ++c)
            p[c * cstride] = static_cast<uint16_t>(round_f64_to_bits(
                static_cast<double>(src[j + c]), dtype, mode, sat, rbits ? rbits[j + c] : 0));
        }
        break;
      }
      case kFloat8E4M3FN:
      case kFloat8E5M2: {
        const StoreAt<uint8_t> p{base + off * static_cast<int64_t>(sizeof(uint8_t))};
        for (int64_t c = 0; c < ncols; ++c)
          p[c * cstride] = static_cast<uint8_t>(round_f64_to_bits(
              static_cast<double>(src[j + c]), dtype, mode, sat, rbits ? rbits[j + c] : 0));
        break;
      }
      case kBool: {
        const StoreAt<uint8_t> p{base + off * static_cast<int64_t>(sizeof(uint8_t))};
        for (int64_t c = 0; c < ncols; ++c) p[c * cstride] = src[j + c] != R(0) ? 1 : 0;
        break;
      }
      case kInt32: {
        const StoreAt<int32_t> p{base + off * static_cast<int64_t>(sizeof(int32_t))};
        for (int64_t c = 0; c < ncols; ++c)
          p[c * cstride] = static_cast<int32_t>(to_int_fmt(src[j + c], kInt32));
        break;
      }
      case kInt64: {
        const StoreAt<int64_t> p{base + off * static_cast<int64_t>(sizeof(int64_t))};
        for (int64_t c = 0; c < ncols; ++c) p[c * cstride] = to_int_fmt(src[j + c], kInt64);
        break;
      }
      default: throw std::invalid_argument("store: unsupported dtype");
    }
    j += ncols;
  }
}

// ---- arithmetic on one block: the op table's scalar functions, one loop per op ----
template <typename T, typename F>
inline __attribute__((always_inline)) void block_loop(std::integral_constant<int, 1>, T* d,
                                                      const T* a, const T*, const T*, int64_t n,
                                                      F f) {
  for (int64_t j = 0; j < n; ++j) d[j] = f(a[j]);
}
template <typename T, typename F>
inline __attribute__((always_inline)) void block_loop(std::integral_constant<int, 2>, T* d,
                                                      const T* a, const T* b, const T*, int64_t n,
                                                      F f) {
  for (int64_t j = 0; j < n; ++j) d[j] = f(a[j], b[j]);
}
template <typename T, typename F>
inline __attribute__((always_inline)) void block_loop(std::integral_constant<int, 3>, T* d,
                                                      const T* a, const T* b, const T* c, int64_t n,
                                                      F f) {
  for (int64_t j = 0; j < n; ++j) d[j] = f(a[j], b[j], c[j]);
}

// The variant bits that matter on the CPU (the transcendental implementation and
// silu's formula) arrive as the compile-time constant VAR, so no loop branches on them
// and the portable functions vectorise.
constexpr uint32_t kCpuVarMask = kVarImplMask | kVarSiluMulSigmoid;

template <typename T, int VAR>
void compute_var(const Instr& in, T* d, const T* a, const T* b, const T* c, int64_t n) {
  const int v = VAR | static_cast<int>(in.var & ~kCpuVarMask);
  if constexpr (std::is_same<T, float>::value && (VAR & kVarImplMask) == kPortable) {
    if (in.op == kOpSin || in.op == kOpCos) {
      // The same bits as portable::sinf_/cosf_, in two passes: a branch-free loop the
      // compiler vectorises, then the rare huge or non-finite arguments.
      const bool want_cos = in.op == kOpCos;
      if (want_cos)
        for (int64_t j = 0; j < n; ++j) d[j] = portable::cosf_small_(a[j]);
      else
        for (int64_t j = 0; j < n; ++j) d[j] = portable::sinf_small_(a[j]);
      for (int64_t j = 0; j < n; ++j)
        if (portable::sincosf_needs_full_(a[j]))
          d[j] = want_cos ? portable::cosf_(a[j]) : portable::sinf_(a[j]);
      return;
    }
  }
  if constexpr (std::is_same<T, float>::value && (VAR & kVarImplMask) == kTorchCpu) {
    if (in.op == kOpGelu && (in.var & kVarOneDnnGeluBwd)) {  // b: the cotangent
      for (int64_t j = 0; j < n; ++j) d[j] = b[j] * onednn::gelu_erf_bwd(a[j]);
      if (in.var & kVarOneDnnBf16Ftz)
        for (int64_t j = 0; j < n; ++j) d[j] = onednn::bf16_store_ftz(d[j]);
      return;
    }
    if (in.op == kOpGelu && (in.var & kVarOneDnnGelu)) {
      // op_gelu's oneDNN branch (gelu_onednn) with the form chosen once per block, so
      // neither form is computed for every element and the loops vectorise
      if (in.var & kVarOneDnnGeluAvx2)
        for (int64_t j = 0; j < n; ++j) d[j] = onednn::gelu_erf_as(a[j]);
      else
        onednn_gelu_minimax(d, a, n);  // gelu_erf_minimax, its lookups per block
      if (in.var & kVarOneDnnBf16Ftz)
        for (int64_t j = 0; j < n; ++j) d[j] = onednn::bf16_store_ftz(d[j]);
      return;
    }
    if (in.op == kOpSin || in.op == kOpCos) {
      // SLEEF's sinf/cosf (the build PyTorch links) reduce all lanes of a vector one way,
      // chosen by the vector's largest |x| (math_torch_cpu.h): groups of kTorchFloatLanes
      // elements from the block's start, which is a multiple of the group in a contiguous
      // tensor, as PyTorch's loop sees it.
      const bool want_cos = in.op == kOpCos;
      for (int64_t g = 0; g < n; g += kTorchFloatLanes) {
        const int64_t e = std::min<int64_t>(n, g + kTorchFloatLanes);
        int mode = 0;
        for (int64_t j = g; j < e; ++j)
          mode = std::max(mode, torch_cpu::detail::sincosf_mode(a[j]));
        if (mode == 0 && want_cos)
          for (int64_t j = g; j < e; ++j) d[j] = torch_cpu::cosf_u35(a[j], 0);
        else if (mode == 0)
          for (int64_t j = g; j < e; ++j) d[j] = torch_cpu::sinf_u35(a[j], 0);
        else
          for (int64_t j = g; j < e; ++j)
            d[j] = want_cos ? torch_cpu::cosf_u35(a[j], mode) : torch_cpu::sinf_u35(a[j], mode);
      }
      return;
    }
  }
  switch (in.op) {
    case kOpConst: {
      const T k = static_cast<T>(in.imm);
      for (int64_t j = 0; j < n; ++j) d[j] = k;
      break;
    }
#define CL_CPU_CASE(E, name, aten, arity, cat, factors, cost, cost_fast, fn, py, formula, grad) \
  case kOp##E:                                                                                  \
    block_loop(std::integral_constant<int, arity>(), d, a, b, c, n,                             \
               [v](auto... x) __attribute__((always_inline)) { return fn(x..., v); });          \
    break;
      CL_ELEMENTWISE_OPS(CL_CPU_CASE)
#undef CL_CPU_CASE
    default: throw std::logic_error(std::string("cpu executor: unexpected op ") + op_name(in.op));
  }
}

// PyTorch's ops whose CPU kernel is cpu_kernel_vec with a scalar lambda that calls the C
// library: on a non-contiguous layout the whole loop is that lambda (Loops.h basic_loop),
// so under the torch_cpu implementation those blocks compute with libm instead.
// (exp/log/sin/cos/tanh/erf copy strided input into a buffer and stay vectorised.)
inline bool torch_scalar_lambda_op(int op) {
  return op == kOpSigmoid || op == kOpSilu || op == kOpGelu || op == kOpGeluTanh || op == kOpPow;
}

// PyTorch's scalar lambda for bf16/fp16 rsqrt, `1 / std::sqrt(x)` in scalar_t
// (UnaryOpsKernel.cpp rsqrt_kernel): c10's sqrt of a BFloat16/Half rounds the (correctly
// rounded) float sqrt to the 16-bit type, then the division is float, rounded once more
// by the caller's store. The contiguous body is Vectorized's float 1/sqrt, rounded once.
inline void rsqrt_scalar16(float* d, const float* a, int64_t n, int dtype) {
  if (dtype == kBFloat16)
    for (int64_t j = 0; j < n; ++j) d[j] = 1.0f / bf16_to_f32(f32_to_bf16_rne(std::sqrt(a[j])));
  else
    for (int64_t j = 0; j < n; ++j) d[j] = 1.0f / f16_to_f32(f32_to_f16_rne(std::sqrt(a[j])));
}

template <typename T>
void compute(const Instr& in, T* d, const T* a, const T* b, const T* c, int64_t n,
             bool torch_scalar_path) {
  if (in.var & kVarTorchScalarLoop) torch_scalar_path = true;  // the DEFAULT build's vec_base
  if (in.var & kVarTorchVml) {
    // MKL VML over the whole block, as PyTorch's vml::v<op> over its chunk (torch_vml.h).
    // The lowering sets this bit only once torch_vml_load succeeded.
    if (!torch_vml(in.op, a, d, n))
      throw std::logic_error(std::string("cpu executor: ") + op_name(in.op) +
                             " asks for MKL VML, which is not loaded");
    return;
  }
  if constexpr (std::is_same<T, float>::value) {
    if (torch_scalar_path && (in.var & kVarRsqrtScalar16) && in.op == kOpRsqrt) {
      rsqrt_scalar16(d, a, n, in.dtype);
      return;
    }
    if (torch_scalar_path && in.op == kOpPow && in.dtype == kFloat32 &&
        ((in.var & kVarImplMask) == kTorchCpu || (in.var & kVarTorchTail)) &&
        (in.var & kVarPowDevice) && !(in.var & kVarPowTensorExp)) {
      // PowKernel.cpp's pow_tensor_scalar_optimized_kernel<float, double>: its general
      // scalar lambda is std::pow(float base, double exp), i.e. pow in double with the
      // Python number's double value (Instr.imm; the vector body's Vec::pow gets it as a
      // float, register b), rounded to float. The exponents it (or pow_tensor_scalar)
      // special-cases compute in float, as op_pow does. The lowering passes the storage
      // dtype: bf16/fp16 call float pow there.
      const int v = static_cast<int>((in.var & ~kVarImplMask) | kLibm);
      for (int64_t j = 0; j < n; ++j) {
        const float y = b[j];
        const bool shortcut = y == 0.0f || y == 1.0f || y == 2.0f || y == 3.0f || y == 0.5f ||
                              y == -0.5f || y == -1.0f || y == -2.0f || a[j] == 1.0f;
        d[j] = shortcut ? op_pow<float>(a[j], y, v)
                        : static_cast<float>(std::pow(static_cast<double>(a[j]), in.imm));
      }
      return;
    }
  }
  if constexpr (std::is_same<T, float>::value) {
    if (torch_scalar_path && in.op == kOpDiv && (in.var & kVarTorchTail) &&
        (in.dtype == kBFloat16 || in.dtype == kFloat16)) {
      // _vec_softmax's scalar columns (16-bit): the exponential is stored in scalar_t, then
      // read back and divided by the float sum
      for (int64_t j = 0; j < n; ++j)
        d[j] = (in.dtype == kBFloat16 ? bf16_to_f32(f32_to_bf16_rne(a[j]))
                                      : f16_to_f32(f32_to_f16_rne(a[j]))) /
               b[j];
      return;
    }
  }
  if (in.op == kOpWhere && (in.var & kVarTorchTail)) {
    // a PyTorch kernel whose vector loop (b) and scalar lambda (c) compute differently
    const T* s = torch_scalar_path ? c : b;
    for (int64_t j = 0; j < n; ++j) d[j] = s[j];
    return;
  }
  int impl = in.var & kVarImplMask;
  // the scalar lambda calls glibc: the op's own kernel's, or a step of another kernel's
  // loop whose lambda calls the C library's function for it (kVarTorchTail, silu_backward)
  if (impl == kTorchCpu && torch_scalar_path &&
      (torch_scalar_lambda_op(in.op) || (in.var & kVarTorchTail)))
    impl = kLibm;
  const bool mul_sigmoid = (in.var & kVarSiluMulSigmoid) != 0;
  if (impl == kPortable && !mul_sigmoid)
    compute_var<T, kPortable>(in, d, a, b, c, n);
  else if (impl == kPortable)
    compute_var<T, kPortable | kVarSiluMulSigmoid>(in, d, a, b, c, n);
  else if (impl == kTorchCpu && !mul_sigmoid)
    compute_var<T, kTorchCpu>(in, d, a, b, c, n);
  else if (impl == kTorchCpu)
    compute_var<T, kTorchCpu | kVarSiluMulSigmoid>(in, d, a, b, c, n);
  else if (!mul_sigmoid)
    compute_var<T, kLibm>(in, d, a, b, c, n);
  else
    compute_var<T, kLibm | kVarSiluMulSigmoid>(in, d, a, b, c, n);
}

// Where PyTorch's cpu_kernel_vec (ATen/native/cpu/Loops.h) runs its scalar lambda on a
// contiguous layout: TensorIterator::for_each splits the flat range [0, numel) into
// at::parallel_for chunks (one when numel <= GRAIN_SIZE 32768 or torch has one thread;
// else ParallelOpenMP.h's invoke_parallel: min(threads, ceil(numel / 32768)) chunks of
// ceil(numel / that) elements); within a chunk each inner row is one loop call, whose
// vectorized_loop handles 2*Vec::size() elements per step and leaves the last
// (len mod 2*Vec::size()) to the scalar lambda. castlab's flat index is TensorIterator's
// when both coalesce a contiguous output into the same rows (row-major, same shape).
struct TorchTails {
  int64_t numel = 0, inner = 1, chunk = 0;  // chunk 0: no tails to emulate
  // true: PyTorch's kernel for this instruction sees its operands as one contiguous row of
  // numel elements (its own inputs are contiguous: results of earlier ops, or leaves laid
  // out as the output), so a tail ends a thread chunk only; false: a row of `inner`
  // elements per outer index (a broadcast operand keeps TensorIterator 2-D).
  bool flat = false;
  static TorchTails of(int64_t numel, int64_t inner) {
    constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE
    TorchTails t;
    t.numel = numel;
    t.inner = inner;
    const int64_t threads = torch_num_threads();
    if (threads <= 0) return t;  // torch not loaded: its geometry is unknown
    int64_t nt = 1;
    if (numel > kGrain && threads > 1)
      nt = std::min<int64_t>(threads, (numel + kGrain - 1) / kGrain);
    t.chunk = (numel + nt - 1) / nt;
    return t;
  }
  // SoftMaxKernel.cpp over a dim that is not the innermost (_vec_softmax,
  // serial_vec_logsoftmax_range): the operands are laid out [outer, D, I] or [outer * I, D]
  // (the instruction's iimm = permuted << 62 | D << 32 | I), and position p = o * I + i is
  // one column of D elements. Columns are vectorised w at a time through each piece of a row
  // of I positions, and a piece's last (len mod w) columns run the scalar code (std::exp).
  // The pieces: _vec_softmax's at::parallel_for ranges over the outer * I positions (grain
  // 0: one range per torch thread; row_chunk 0), or serial_vec_logsoftmax_range's chunks of
  // row_chunk columns.
  bool column_tail(int64_t index, int64_t w, int64_t D, int64_t I, bool permuted,
                   int64_t row_chunk) const {
    // permuted: laid out [outer * I, D] (the reduction's operand), else [outer, D, I]
    const int64_t o = permuted ? index / D / I : index / (D * I);
    const int64_t i = permuted ? index / D % I : index % I;
    int64_t pb, pe, p;
    if (row_chunk > 0) {
      p = i;
      pb = i / row_chunk * row_chunk;
      pe = std::min(I, pb + row_chunk);
    } else {
      const int64_t P = numel / D, threads = torch_num_threads();
      const int64_t pc = threads > 1 ? (P + threads - 1) / threads : P;
      p = o * I + i;
      pb = std::max(o * I, p / pc * pc);
      pe = std::min((o + 1) * I, (p / pc + 1) * pc);
    }
    return p >= pe - (pe - pb) % w;
  }
  // Calls f(j, len) for each run of block elements (block-local index j) in a tail of
  // width w; the block covers rows [r0, r0+nrows) and columns [c0, c0+ncols). With `iimm`
  // (D << 32 | I; `row_chunk`), the column tails above.
  template <typename F>
  void each(int64_t w, int64_t iimm, int64_t row_chunk, int64_t r0, int64_t nrows, int64_t c0,
            int64_t ncols, F f) const {
    if (iimm <= 0) return each(w, r0, nrows, c0, ncols, f);
    const int64_t D = (iimm >> 32) & 0x3fffffff, I = iimm & 0xffffffff;
    const bool permuted = (iimm >> 62) & 1;
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t f0 = (r0 + r) * inner + c0;
      int64_t run = -1;
      for (int64_t c = 0; c <= ncols; ++c) {
        const bool t = c < ncols && column_tail(f0 + c, w, D, I, permuted, row_chunk);
        if (t && run < 0) run = c;
        if (!t && run >= 0) {
          f(r * ncols + run, c - run);
          run = -1;
        }
      }
    }
  }
  // Calls f(j, len) for each run of block elements (block-local index j) in a tail of
  // width w; the block covers rows [r0, r0+nrows) and columns [c0, c0+ncols).
  template <typename F>
  void each(int64_t w, int64_t r0, int64_t nrows, int64_t c0, int64_t ncols, F f) const {
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t rb = (r0 + r) * inner, re = flat ? numel : rb + inner;
      const int64_t f0 = rb + c0, f1 = f0 + ncols;
      for (int64_t k = f0 / chunk; k * chunk < f1; ++k) {
        const int64_t pb = flat ? k * chunk : std::max(rb, k * chunk);
        const int64_t pe = std::min(std::min(re, (k + 1) * chunk), numel);
        const int64_t tb = std::max(pe - (pe - pb) % w, f0), te = std::min(pe, f1);
        if (tb < te) f(r * ncols + tb - f0, te - tb);
      }
    }
  }
};

// compute() over one block, then PyTorch's scalar tails recomputed as its scalar lambda.
template <typename T>
void compute_block(const Instr& in, T* d, const T* a, const T* b, const T* c, int64_t n,
                   bool torch_scalar_path, const TorchTails& tails, int64_t r0, int64_t nrows,
                   int64_t c0, int64_t ncols) {
  compute(in, d, a, b, c, n, torch_scalar_path);
  if (!(in.var & kVarTorchTail) || torch_scalar_path || tails.chunk == 0 || in.aux <= 0) return;
  tails.each(in.aux, in.iimm, static_cast<int64_t>(in.imm), r0, nrows, c0, ncols,
             [&](int64_t j, int64_t len) {
               compute(in, d + j, a + j, b + j, c + j, len, /*torch_scalar_path=*/true);
             });
}

// ---- sums of products in one pass ----
// RoPE's x*cos + (-x2)*sin is three or four instructions whose intermediate registers are
// read once. An add or sub whose operands are such products (a factor possibly negated) is
// computed in one loop over the block: each product rounded, then the sum, exactly as the
// separate loops (contraction of a*b+c is off; a negation is a flip of the sign bit, NaN
// included, as op_neg's -x). Fewer passes over the block's registers: on a 2-core Xeon,
// RoPE 1M elements goes from 15 passes to 10.
struct SumOfProducts {
  int x[2], y[2];         // term t: x[t] * y[t], or register x[t] alone where y[t] < 0
  bool negx[2], negy[2];  // a factor read through its negation
  bool sub;
};

// x with its sign bit flipped under `mask` (0 or the sign bit): op_neg's -x, NaN included,
// as a loop-invariant xor that the loop keeps vectorised
inline __attribute__((always_inline)) float flip_sign(float x, uint32_t mask) {
  return f32_from_bits(f32_bits(x) ^ mask);
}
inline __attribute__((always_inline)) double flip_sign(double x, uint64_t mask) {
  return f64_from_bits(f64_bits(x) ^ mask);
}

template <typename T, bool P0, bool P1, bool SUB, typename M>
void sum_of_products_loop(T* d, const T* x0, const T* y0, const T* x1, const T* y1, M sx0, M sy0,
                          M sx1, M sy1, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    T a, b;
    if constexpr (P0)
      a = flip_sign(x0[j], sx0) * flip_sign(y0[j], sy0);
    else
      a = x0[j];
    if constexpr (P1)
      b = flip_sign(x1[j], sx1) * flip_sign(y1[j], sy1);
    else
      b = x1[j];
    d[j] = SUB ? a - b : a + b;
  }
}

template <typename T>
void sum_of_products(const SumOfProducts& s, T* d, const T* x0, const T* y0, const T* x1,
                     const T* y1, int64_t n) {
  using M = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
  const M sign = M(1) << (8 * sizeof(T) - 1);
  const M sx0 = s.negx[0] ? sign : 0, sy0 = s.negy[0] ? sign : 0;
  const M sx1 = s.negx[1] ? sign : 0, sy1 = s.negy[1] ? sign : 0;
  const bool p0 = s.y[0] >= 0, p1 = s.y[1] >= 0;
  auto go = [&](auto P0, auto P1) {
    if (s.sub)
      sum_of_products_loop<T, P0(), P1(), true>(d, x0, y0, x1, y1, sx0, sy0, sx1, sy1, n);
    else
      sum_of_products_loop<T, P0(), P1(), false>(d, x0, y0, x1, y1, sx0, sy0, sx1, sy1, n);
  };
  if (p0 && p1)
    go(std::true_type(), std::true_type());
  else if (p0)
    go(std::true_type(), std::false_type());
  else
    go(std::false_type(), std::true_type());
}

// The sums of products of `code` (sop[i] >= 0: instruction i is sops[sop[i]]) and the
// products and negations they absorb (absorbed[i]: not run). A product qualifies when its
// register is written once and read only by the sum (not an output); so does a negation
// read only by the product. Every register a fused loop reads is written once, so its
// value at the sum is the one the product would have read.
void find_sums_of_products(const Program& prog, const std::vector<Instr>& code,
                           std::vector<int>* sop, std::vector<SumOfProducts>* sops,
                           std::vector<uint8_t>* absorbed) {
  const size_t nc = code.size();
  sop->assign(nc, -1);
  absorbed->assign(nc, 0);
  const size_t nr = static_cast<size_t>(std::max(prog.n_regs, 1));
  std::vector<int> writes(nr, 0), reads(nr, 0), def(nr, -1);
  for (size_t i = 0; i < nc; ++i) {
    const Instr& in = code[i];
    writes[static_cast<size_t>(in.dst)]++;
    def[static_cast<size_t>(in.dst)] = static_cast<int>(i);
    for (int r : {in.a, in.b, in.c})
      if (r >= 0) reads[static_cast<size_t>(r)]++;
  }
  for (const OutputSpec& os : prog.outputs) reads[static_cast<size_t>(os.reg)] += 2;
  auto plain = [&](const Instr& in) {
    return (in.rtype == kRegF32 || in.rtype == kRegF64) && !(in.var & kVarTorchVml);
  };
  // instruction defining r, if it is `op` and only its one reader needs it
  auto only_use = [&](int r, int op, int rtype) -> int {
    if (r < 0 || writes[static_cast<size_t>(r)] != 1 || reads[static_cast<size_t>(r)] != 1)
      return -1;
    const int i = def[static_cast<size_t>(r)];
    return i >= 0 && code[static_cast<size_t>(i)].op == op &&
                   code[static_cast<size_t>(i)].rtype == rtype &&
                   plain(code[static_cast<size_t>(i)])
               ? i
               : -1;
  };
  auto once = [&](int r) { return r >= 0 && writes[static_cast<size_t>(r)] == 1; };
  for (size_t i = 0; i < nc; ++i) {
    const Instr& in = code[i];
    if ((in.op != kOpAdd && in.op != kOpSub) || !plain(in) || !once(in.a) || !once(in.b)) continue;
    SumOfProducts s{};
    s.sub = in.op == kOpSub;
    std::vector<int> eaten;
    int products = 0;
    const int terms[2] = {in.a, in.b};
    for (int t = 0; t < 2; ++t) {
      const int m = only_use(terms[t], kOpMul, in.rtype);
      s.x[t] = terms[t];
      s.y[t] = -1;
      if (m < 0) continue;
      const Instr& mi = code[static_cast<size_t>(m)];
      if (!once(mi.a) || !once(mi.b)) continue;
      eaten.push_back(m);
      ++products;
      s.x[t] = mi.a;
      s.y[t] = mi.b;
      const int nx = only_use(mi.a, kOpNeg, in.rtype), ny = only_use(mi.b, kOpNeg, in.rtype);
      if (nx >= 0 && once(code[static_cast<size_t>(nx)].a)) {
        eaten.push_back(nx);
        s.x[t] = code[static_cast<size_t>(nx)].a;
        s.negx[t] = true;
      }
      if (ny >= 0 && once(code[static_cast<size_t>(ny)].a)) {
        eaten.push_back(ny);
        s.y[t] = code[static_cast<size_t>(ny)].a;
        s.negy[t] = true;
      }
    }
    if (products == 0) continue;
    (*sop)[i] = static_cast<int>(sops->size());
    sops->push_back(s);
    for (int e : eaten) (*absorbed)[static_cast<size_t>(e)] = 1;
  }
}

// An instruction computing in int64 registers: constants, comparisons and where.
void compute_int(const Instr& in, int64_t* d, const int64_t* a, const int64_t* b, const int64_t* c,
                 int64_t n) {
  switch (in.op) {
    case kOpConst:
      for (int64_t j = 0; j < n; ++j) d[j] = in.iimm;
      break;
#define CL_CPU_INT_CASE(E, fn)                                         \
  case kOp##E:                                                         \
    for (int64_t j = 0; j < n; ++j) d[j] = fn<int64_t>(a[j], b[j], 0); \
    break;
      CL_CPU_INT_CASE(Eq, op_eq)
      CL_CPU_INT_CASE(Ne, op_ne)
      CL_CPU_INT_CASE(Lt, op_lt)
      CL_CPU_INT_CASE(Le, op_le)
      CL_CPU_INT_CASE(Gt, op_gt)
      CL_CPU_INT_CASE(Ge, op_ge)
#undef CL_CPU_INT_CASE
    case kOpWhere:
      for (int64_t j = 0; j < n; ++j) d[j] = op_where<int64_t>(a[j], b[j], c[j], 0);
      break;
    default:
      throw std::logic_error(std::string("cpu executor: ") + op_name(in.op) +
                             " on int64 registers");
  }
}

// What run() works out once per call and every block reads: the blocks of the collapsed
// iteration (rows of `inner` elements, in blocks of rows_per_block rows x col_chunk
// columns), the operands (outputs first), and how each instruction runs. It holds
// pointers into itself (code may be code_here): made in place, never copied.
struct RunPlan {
  const Program& prog;
  const std::vector<Tensor>& outputs;
  std::vector<const Tensor*> ops;
  Iter it;
  std::vector<int64_t> scratch;
  int nd = 0, nops = 0, nout = 0;
  int64_t numel = 0, inner = 0, rows = 1, col_chunk = 0, col_blocks = 0, rows_per_block = 0;
  int64_t nblocks = 0;
  bool random = false;
  // Element index in the first output's storage: the stream position for stochastic
  // rounding (the same on every device).
  int64_t out0_offset = 0;
  std::vector<uint8_t> rtypes;
  std::vector<char*> bases;
  bool out_strided = false;
  std::vector<uint8_t> ins_scalar, ins_flat;  // per instruction (layout_classes)
  const std::vector<Instr>* code = nullptr;
  std::vector<Instr> code_here;
  std::vector<int> sop;
  std::vector<SumOfProducts> sops;
  std::vector<uint8_t> absorbed;
  TorchTails tails, tails_flat;
  CpuKernelFn jit = nullptr;
  std::vector<int64_t> inner_stride;
  struct TailOf {
    int64_t w;
    bool flat;
    int64_t iimm, row_chunk;
  };
  std::vector<TailOf> jit_tails;  // the scalar tails the interpreter would recompute

  RunPlan(const Program& p, const std::vector<Tensor>& outs) : prog(p), outputs(outs) {}
  RunPlan(const RunPlan&) = delete;
  RunPlan& operator=(const RunPlan&) = delete;
};

// PyTorch's loops vectorise only when every operand is contiguous in the innermost
// dimension (an input may also be a broadcast scalar there); otherwise they run the
// scalar lambda (torch_scalar_lambda_op). What PyTorch's own kernel for each instruction sees
// (under the eager policy each op is its own kernel: its operands are the program's inputs, laid
// out as they are, or results of earlier ops, which PyTorch materialises contiguous). Per
// register: 0 an op's result, 1 an input laid out as the output, 2 a broadcast input, 3 an input
// with a non-unit innermost stride. An instruction reading a class-3 input runs PyTorch's scalar
// lambda; one reading only classes 0-1 sees one contiguous row (flat tails); else rows of inner.
void layout_classes(RunPlan* R) {
  const Program& prog = R->prog;
  const Iter& it = R->it;
  const int nd = R->nd;
  for (int k = 0; k < R->nout; ++k)
    if (R->inner > 1 && it.stride(k, nd - 1) != 1) R->out_strided = true;
  auto leaf_class = [&](int k) -> uint8_t {
    bool same = true;
    for (int d = 0; d < nd; ++d)
      if (it.shape[d] > 1 && it.stride(k, d) != it.stride(0, d)) same = false;
    if (same) return 1;
    const int64_t st = it.stride(k, nd - 1);
    return (R->inner > 1 && st != 1 && st != 0) ? 3 : 2;
  };
  std::vector<uint8_t> prov(static_cast<size_t>(std::max(prog.n_regs, 1)), 0);
  R->ins_scalar.assign(prog.code.size(), 0);
  R->ins_flat.assign(prog.code.size(), 0);
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (in.op == kOpLoad) {
      prov[in.dst] = leaf_class(R->nout + in.aux);
      continue;
    }
    if (in.op == kOpToF32 || in.op == kOpToF64) {  // a widening inside the op's kernel
      prov[in.dst] = prov[in.a];
      continue;
    }
    uint8_t worst = 0;
    for (int r : {in.a, in.b, in.c})
      if (r >= 0 && prov[r] > worst) worst = prov[r];
    R->ins_scalar[i] = R->out_strided || worst == 3;
    R->ins_flat[i] = worst <= 1;
    prov[in.dst] = 0;
  }
}

// PyTorch's gelu calls oneDNN only on a contiguous tensor of 2 or more elements
// (Activation.cpp use_mkldnn): here, a gelu whose operand is an earlier op's result or an
// input laid out as the output (ins_flat). Elsewhere its Gelu.h loop runs, so the
// instruction drops the oneDNN bits (keeping the tail ones); under oneDNN there are no
// scalar tails.
void choose_gelu(RunPlan* R) {
  const Program& prog = R->prog;
  R->code = &prog.code;
  for (const Instr& in : prog.code)
    if (in.var & kVarOneDnnGelu) {
      R->code_here = prog.code;
      for (size_t i = 0; i < R->code_here.size(); ++i) {
        Instr& g = R->code_here[i];
        // (the backward's: the lowering emits it for contiguous operands only)
        if (!(g.var & kVarOneDnnGelu) || (g.var & kVarOneDnnGeluBwd)) continue;
        const bool onednn = R->numel > 1 && R->ins_flat[i] && !R->out_strided;
        g.var &=
            onednn
                ? ~static_cast<uint32_t>(kVarTorchTail)
                : ~static_cast<uint32_t>(kVarOneDnnGelu | kVarOneDnnGeluAvx2 | kVarOneDnnBf16Ftz);
      }
      R->code = &R->code_here;
      break;
    }
}

// The whole block as one generated loop (ops/cpu/jit.h), where the interpreter's
// emulations of PyTorch that depend on the layout do not apply: torch_cpu instructions
// that run PyTorch's scalar lambda here, and blocks holding a scalar tail (checked per
// block). Outputs must not share memory with an input: the interpreter reads a block's
// inputs before it writes any output, the loop element by element.
void choose_jit(RunPlan* R) {
  const std::vector<Instr>& code = *R->code;
  const int nops = R->nops, nout = R->nout;
  R->inner_stride.assign(static_cast<size_t>(nops), 0);
  bool torch_scalar = false;
  for (size_t i = 0; i < code.size(); ++i)
    if (R->ins_scalar[i] && (code[i].var & kVarImplMask) == kTorchCpu) torch_scalar = true;
  if (!torch_scalar && !R->random) {
    bool apart = true;  // (outputs write disjoint elements: the lowering's views)
    for (int k = 0; k < nout && apart; ++k)
      for (int j = nout; j < nops && apart; ++j)
        if (may_overlap(*R->ops[k], *R->ops[j])) apart = false;
    if (apart) {
      std::vector<uint8_t> dts(static_cast<size_t>(nops));
      for (int k = 0; k < nops; ++k) {
        dts[k] = static_cast<uint8_t>(R->ops[k]->dtype());
        R->inner_stride[k] = R->it.stride(k, R->nd - 1);
      }
      R->jit = cpu_jit_kernel(R->prog, code, dts, R->inner_stride, R->numel);
    }
  }
  if (R->jit && R->tails.chunk != 0) {
    for (size_t i = 0; i < code.size(); ++i) {
      const Instr& in = code[i];
      if ((in.var & kVarTorchTail) && in.aux > 0)
        R->jit_tails.push_back(
            {in.aux, R->ins_flat[i] != 0, in.iimm, static_cast<int64_t>(in.imm)});
    }
  }
  if (R->jit) cpu_jit_count_run();
}

// Plans a call whose operands are on the CPU and whose output is not empty.
void plan_run(RunPlan* R) {
  const Program& prog = R->prog;
  collapse_dims(R->outputs[0].shape(), R->ops.data(), static_cast<int>(R->ops.size()), &R->it,
                &R->scratch);
  const int nd = R->nd = R->it.nd;
  R->inner = R->it.shape[nd - 1];
  for (int d = 0; d < nd - 1; ++d) R->rows *= R->it.shape[d];
  R->col_chunk = std::min(R->inner, kBlock);
  R->col_blocks = (R->inner + R->col_chunk - 1) / R->col_chunk;
  R->rows_per_block = std::max<int64_t>(1, kBlock / R->col_chunk);
  const int64_t row_blocks = (R->rows + R->rows_per_block - 1) / R->rows_per_block;
  R->nblocks = row_blocks * R->col_blocks;
  R->nops = static_cast<int>(R->ops.size());
  R->nout = static_cast<int>(R->outputs.size());
  R->random = prog.uses_random();
  R->out0_offset = R->outputs[0].offset();
  R->rtypes = prog.reg_types();
  R->bases.resize(R->nops);
  for (int k = 0; k < R->nops; ++k) R->bases[k] = static_cast<char*>(R->ops[k]->data_ptr());
  layout_classes(R);
  choose_gelu(R);
  find_sums_of_products(prog, *R->code, &R->sop, &R->sops, &R->absorbed);
  // PyTorch's thread chunks, for the scalar tails of its cpu_kernel_vec loops (TorchTails).
  for (const Instr& in : *R->code)
    if (in.var & kVarTorchTail) R->tails = TorchTails::of(R->numel, R->inner);
  R->tails_flat = R->tails;
  R->tails_flat.flat = true;
  choose_jit(R);
}

// One block of a run: rows r0 .. r0 + nrows - 1, columns c0 .. c0 + ncols - 1 (n elements).
struct Block {
  int64_t r0, nrows, c0, ncols, n;
};

// A thread's state across its blocks: the registers, every operand's row offsets, the
// element index of each lane (random numbers) and where each register is read from.
struct BlockState {
  double* reg0 = nullptr;
  std::vector<int64_t> row_off, rbits, idx;
  // Where each register's values are read from: its own block, or, for a load of a float32
  // (float64) input into a float32 (float64) register whose block is one contiguous,
  // aligned run of the input, the input itself (no copy).
  std::vector<const void*> read_at;

  void* reg_ptr(int r) const { return reg0 + static_cast<size_t>(r) * kRegStride; }
  const void* in_ptr(int r) const { return read_at[static_cast<size_t>(r)]; }
};

// Registers kRegStride doubles apart, from a 64-byte boundary: a stride of exactly 4 KiB
// (kBlock doubles) put every register on the same L1 sets and made loads of one look
// dependent on stores to another (4K aliasing). (Kept per thread between calls: zeroing a
// fresh n_regs x 4 KiB for every call was most of a small call's time; every instruction
// writes its register before any read.)
BlockState block_state(const RunPlan& R) {
  thread_local std::vector<double> regs;
  const size_t need = static_cast<size_t>(R.prog.n_regs) * kRegStride + 8;
  if (regs.size() < need) regs.resize(need);
  BlockState b;
  b.reg0 = regs.data() + ((64 - reinterpret_cast<uintptr_t>(regs.data()) % 64) % 64) / 8;
  b.row_off.resize(static_cast<size_t>(R.nops) * R.rows_per_block);
  b.rbits.resize(R.random ? kBlock : 0);  // element index per lane
  b.idx.resize(R.nd > 1 ? R.nd - 1 : 1);
  b.read_at.resize(static_cast<size_t>(std::max(R.prog.n_regs, 1)));
  return b;
}

// Every operand's row offsets for the block's rows, and the lanes' element indices.
void block_offsets(const RunPlan& R, BlockState* S, const Block& B) {
  const Iter& it = R.it;
  const int nd = R.nd;
  std::vector<int64_t>& idx = S->idx;
  int64_t* const row_off = S->row_off.data();
  int64_t rem = B.r0;
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = rem % it.shape[d];
    rem /= it.shape[d];
  }
  // (a row after one that only stepped the innermost row index is the one before
  // plus that dimension's stride; the full sum only after a carry)
  bool carried = true;
  for (int64_t r = 0; r < B.nrows; ++r) {
    if (carried) {
      for (int k = 0; k < R.nops; ++k) {
        int64_t off = 0;
        for (int d = 0; d < nd - 1; ++d) off += idx[d] * it.stride(k, d);
        row_off[k * R.rows_per_block + r] = off;
      }
    } else {
      for (int k = 0; k < R.nops; ++k)
        row_off[k * R.rows_per_block + r] =
            row_off[k * R.rows_per_block + r - 1] + it.stride(k, nd - 2);
    }
    carried = true;
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < it.shape[d]) {
        carried = d != nd - 2;
        break;
      }
      idx[d] = 0;
    }
  }
  if (R.random) {
    int64_t j = 0;
    const int64_t cs = it.stride(0, nd - 1);
    for (int64_t r = 0; r < B.nrows; ++r)
      for (int64_t c = 0; c < B.ncols; ++c, ++j)
        S->rbits[j] = R.out0_offset + row_off[r] + (B.c0 + c) * cs;
  }
}

// Runs the block with the generated loop unless it holds a scalar tail; whether it did.
bool jit_block(const RunPlan& R, BlockState* S, const Block& B) {
  bool tail = false;
  for (const RunPlan::TailOf& t : R.jit_tails)
    (t.flat ? R.tails_flat : R.tails)
        .each(t.w, t.iimm, t.row_chunk, B.r0, B.nrows, B.c0, B.ncols,
              [&](int64_t, int64_t) { tail = true; });
  if (tail) return false;
  R.jit(R.bases.data(), S->row_off.data(), R.rows_per_block, B.nrows, B.c0, B.ncols,
        R.inner_stride.data());
  return true;
}

// A load: the input itself where the register can read it in place, else its block
// converted into the register.
void load_instr(const RunPlan& R, BlockState* S, const Instr& in, void* d, const Block& B) {
  const int k = R.nout + in.aux;
  const int64_t cs = R.it.stride(k, R.nd - 1);
  const int64_t* ro = &S->row_off[k * R.rows_per_block];
  if ((in.rtype == kRegF32 && in.dtype == kFloat32) ||
      (in.rtype == kRegF64 && in.dtype == kFloat64)) {
    const size_t esz = in.dtype == kFloat64 ? 8 : 4;
    bool run = cs == 1 || B.ncols == 1;
    for (int64_t r = 1; run && r < B.nrows; ++r) run = ro[r] == ro[0] + r * B.ncols;
    const char* p = R.bases[k] + (ro[0] + B.c0 * cs) * static_cast<int64_t>(esz);
    if (run && reinterpret_cast<uintptr_t>(p) % esz == 0) {
      S->read_at[static_cast<size_t>(in.dst)] = p;
      return;
    }
  }
  if (in.rtype == kRegI64)
    load_rows_int(static_cast<int64_t*>(d), R.bases[k], in.dtype, ro, B.nrows, B.c0, B.ncols, cs);
  else if (in.rtype == kRegF64)
    load_rows(static_cast<double*>(d), R.bases[k], in.dtype, ro, B.nrows, B.c0, B.ncols, cs);
  else
    load_rows(static_cast<float*>(d), R.bases[k], in.dtype, ro, B.nrows, B.c0, B.ncols, cs);
}

void round_instr(const RunPlan& R, const BlockState& S, const Instr& in, void* d, int64_t n) {
  const bool sr = in.mode == kStochastic;
  const auto seed = R.prog.seed;
  const int64_t* rbits = S.rbits.data();
  if (in.rtype == kRegF64) {
    double* o = static_cast<double*>(d);
    const double* a = static_cast<const double*>(S.in_ptr(in.a));
    for (int64_t j = 0; j < n; ++j)
      o[j] = round_f64_to(
          a[j], in.dtype, in.mode, in.saturate,
          sr ? random_bits(seed, static_cast<uint32_t>(in.aux), static_cast<uint64_t>(rbits[j]))
             : 0u);
    return;
  }
  float* o = static_cast<float*>(d);
  const float* a = static_cast<const float*>(S.in_ptr(in.a));
  if (in.mode == kNearestEven && in.dtype == kBFloat16) {
    for (int64_t j = 0; j < n; ++j) o[j] = bf16_to_f32(f32_to_bf16_rne(a[j]));
  } else if (in.mode == kNearestEven && in.dtype == kFloat16) {
    for (int64_t j = 0; j < n; ++j) o[j] = f16_to_f32(f32_to_f16_rne(a[j]));
  } else {
    for (int64_t j = 0; j < n; ++j)
      o[j] = round_f32_to(
          a[j], in.dtype, in.mode, in.saturate,
          sr ? random_bits(seed, static_cast<uint32_t>(in.aux), static_cast<uint64_t>(rbits[j]))
             : 0u);
  }
}

void rand_instr(const RunPlan& R, const BlockState& S, const Instr& in, void* d, int64_t n) {
  const uint32_t stream = static_cast<uint32_t>(in.aux);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t e = static_cast<uint64_t>(S.rbits[j]);
    const double v = in.op == kOpRandUniform ? rand_uniform(R.prog.seed, stream, e)
                                             : rand_normal(R.prog.seed, stream, e);
    if (in.rtype == kRegF64)
      static_cast<double*>(d)[j] = v;
    else
      static_cast<float*>(d)[j] = static_cast<float>(v);
  }
}

void convert_instr(const RunPlan& R, const BlockState& S, const Instr& in, void* d, int64_t n) {
  const void* a = S.in_ptr(in.a);
  const int src = R.rtypes[in.a];
  auto conv = [&](auto* o) {
    using O = typename std::remove_pointer<decltype(o)>::type;
    auto from = [&](const auto* x) {
      for (int64_t j = 0; j < n; ++j) {
        if constexpr (std::is_same<O, int64_t>::value)
          o[j] = to_int_fmt(x[j], in.dtype);
        else
          o[j] = static_cast<O>(x[j]);
      }
    };
    if (src == kRegI64)
      from(static_cast<const int64_t*>(a));
    else if (src == kRegF64)
      from(static_cast<const double*>(a));
    else
      from(static_cast<const float*>(a));
  };
  if (in.op == kOpToF64)
    conv(static_cast<double*>(d));
  else if (in.op == kOpToF32)
    conv(static_cast<float*>(d));
  else
    conv(static_cast<int64_t*>(d));
}

// A sum of products (find_sums_of_products) in the register's type.
void sop_instr(const SumOfProducts& s, const BlockState& S, const Instr& in, void* d, int64_t n) {
  auto at = [&](int r) { return r >= 0 ? S.in_ptr(r) : nullptr; };
  if (in.rtype == kRegF64)
    sum_of_products(s, static_cast<double*>(d), static_cast<const double*>(at(s.x[0])),
                    static_cast<const double*>(at(s.y[0])), static_cast<const double*>(at(s.x[1])),
                    static_cast<const double*>(at(s.y[1])), n);
  else
    sum_of_products(s, static_cast<float*>(d), static_cast<const float*>(at(s.x[0])),
                    static_cast<const float*>(at(s.y[0])), static_cast<const float*>(at(s.x[1])),
                    static_cast<const float*>(at(s.y[1])), n);
}

// Any other instruction: on int64 registers, or compute_block in the register's type
// (an absent operand reads the destination).
void compute_instr(const RunPlan& R, const BlockState& S, size_t ii, void* d, const Block& B) {
  const Instr& in = (*R.code)[ii];
  auto op = [&](int r) -> const void* { return r >= 0 ? S.in_ptr(r) : d; };
  if (in.rtype == kRegI64) {
    compute_int(in, static_cast<int64_t*>(d), static_cast<const int64_t*>(op(in.a)),
                static_cast<const int64_t*>(op(in.b)), static_cast<const int64_t*>(op(in.c)), B.n);
    return;
  }
  const TorchTails& tails = R.ins_flat[ii] ? R.tails_flat : R.tails;
  if (in.rtype == kRegF64)
    compute_block(in, static_cast<double*>(d), static_cast<const double*>(op(in.a)),
                  static_cast<const double*>(op(in.b)), static_cast<const double*>(op(in.c)), B.n,
                  R.ins_scalar[ii] != 0, tails, B.r0, B.nrows, B.c0, B.ncols);
  else
    compute_block(in, static_cast<float*>(d), static_cast<const float*>(op(in.a)),
                  static_cast<const float*>(op(in.b)), static_cast<const float*>(op(in.c)), B.n,
                  R.ins_scalar[ii] != 0, tails, B.r0, B.nrows, B.c0, B.ncols);
}

// The outputs of the block from their registers, rounded to their formats.
void store_outputs(const RunPlan& R, const BlockState& S, const Block& B) {
  for (int k = 0; k < R.nout; ++k) {
    const OutputSpec& os = R.prog.outputs[k];
    std::vector<uint32_t> sbits;
    if (os.mode == kStochastic) {
      sbits.resize(B.n);
      for (int64_t j = 0; j < B.n; ++j)
        sbits[j] = random_bits(R.prog.seed, static_cast<uint32_t>(os.salt),
                               static_cast<uint64_t>(S.rbits[j]));
    }
    const uint32_t* sb = sbits.empty() ? nullptr : sbits.data();
    const int ort = R.rtypes[os.reg];
    const int dt = R.outputs[k].dtype();
    const int64_t* ro = &S.row_off[k * R.rows_per_block];
    const int64_t cs = R.it.stride(k, R.nd - 1);
    if (ort == kRegI64)
      store_rows(R.bases[k], dt, static_cast<const int64_t*>(S.in_ptr(os.reg)), ro, B.nrows, B.c0,
                 B.ncols, cs, os.mode, os.saturate, sb);
    else if (ort == kRegF64)
      store_rows(R.bases[k], dt, static_cast<const double*>(S.in_ptr(os.reg)), ro, B.nrows, B.c0,
                 B.ncols, cs, os.mode, os.saturate, sb);
    else
      store_rows(R.bases[k], dt, static_cast<const float*>(S.in_ptr(os.reg)), ro, B.nrows, B.c0,
                 B.ncols, cs, os.mode, os.saturate, sb);
  }
}

// Block `blk`: its row offsets, then the generated loop, or the interpreter's
// instructions one after the other over the whole block and the outputs stored.
void run_block(const RunPlan& R, BlockState* S, int64_t blk) {
  const int64_t rb = blk / R.col_blocks, cb = blk % R.col_blocks;
  Block B;
  B.r0 = rb * R.rows_per_block;
  B.nrows = std::min(R.rows_per_block, R.rows - B.r0);
  B.c0 = cb * R.col_chunk;
  B.ncols = std::min(R.col_chunk, R.inner - B.c0);
  B.n = B.nrows * B.ncols;
  block_offsets(R, S, B);
  if (R.jit && jit_block(R, S, B)) return;
  const std::vector<Instr>& code = *R.code;
  for (size_t ii = 0; ii < code.size(); ++ii) {
    const Instr& in = code[ii];
    if (R.absorbed[ii]) continue;  // computed inside a sum of products
    void* d = S->reg_ptr(in.dst);
    S->read_at[static_cast<size_t>(in.dst)] = d;
    if (R.sop[ii] >= 0)
      sop_instr(R.sops[static_cast<size_t>(R.sop[ii])], *S, in, d, B.n);
    else if (in.op == kOpLoad)
      load_instr(R, S, in, d, B);
    else if (in.op == kOpRound)
      round_instr(R, *S, in, d, B.n);
    else if (in.op == kOpRandUniform || in.op == kOpRandNormal)
      rand_instr(R, *S, in, d, B.n);
    else if (in.op == kOpToF64 || in.op == kOpToF32 || in.op == kOpToI64)
      convert_instr(R, *S, in, d, B.n);
    else
      compute_instr(R, *S, ii, d, B);
  }
  store_outputs(R, *S, B);
}

}  // namespace

void run(const Program& prog, const std::vector<Tensor>& inputs,
         const std::vector<Tensor>& outputs) {
  if (outputs.empty()) return;
  RunPlan R(prog, outputs);
  std::vector<const Tensor*> in_ptrs, out_ptrs;
  for (const auto& t : inputs) in_ptrs.push_back(&t);
  for (const auto& t : outputs) out_ptrs.push_back(&t);
  const int n_in = static_cast<int>(in_ptrs.size());
  gather_operands(prog, in_ptrs.data(), n_in, out_ptrs.data(), static_cast<int>(out_ptrs.size()),
                  &R.ops);
  for (const auto* t : R.ops)
    if (t->device().type != DeviceType::CPU)
      throw std::invalid_argument("CPU executor got a tensor on " + t->device().str());
  check_loads(prog, in_ptrs.data(), n_in);
  R.numel = numel_of(outputs[0].shape());
  if (R.numel == 0) return;
  plan_run(&R);
  const int64_t work_per_block =
      R.rows_per_block * R.col_chunk * static_cast<int64_t>(R.code->size() + 1);
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, work_per_block));
  parallel_for(R.nblocks, grain, [&](int64_t b0, int64_t b1) {
    BlockState S = block_state(R);
    for (int64_t blk = b0; blk < b1; ++blk) run_block(R, &S, blk);
  });
}

}  // namespace CL_EXEC_NS
}  // namespace cl
