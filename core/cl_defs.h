// Definitions shared by host C++ and NVRTC-compiled device code.
// This header (like convert.h, rng.h and ops/scalar/*.h) is embedded verbatim into the
// CUDA code generator, so it must compile both as plain C++17 and under NVRTC without
// any system header.
#pragma once

// CL_HD_METHOD: the same for member functions (an accessor's operator[]); give their types
// internal linkage on the host (an unnamed namespace), as CL_HD's static does for functions.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define CL_HD __host__ __device__ __forceinline__
#define CL_HD_METHOD __host__ __device__ __forceinline__
// CL_HD_COLD: a large function compiled once per kernel and called, not inlined at every
// use: a rare path (the Payne-Hanek reductions; inlined into each lane of a vectorised fp64
// sin/cos kernel they took NVRTC 15-20 s) or one arm of a run-time dispatch (the generic
// reduce kernel's orders: 72 s for sm_90 as one function, 27 s as calls). Kernels compile
// with --fmad=false, so a call changes no value (nothing contracts across it).
#define CL_HD_COLD __host__ __device__ __noinline__
#define CL_DEVICE_CODE 1
#else
#define CL_HD_METHOD inline
// Internal linkage on the host: the CPU executor is compiled twice (baseline and
// AVX2+FMA) and each copy must keep its own versions of these functions.
// always_inline: the executor's loops over these functions vectorise only when the
// bodies are inlined into them.
#if defined(__GNUC__)
#define CL_HD static inline __attribute__((always_inline))
#else
#define CL_HD static inline
#endif
#define CL_HD_COLD CL_HD  // (host code: unchanged, inlined)
#endif

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef short int16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#endif

namespace cl {

CL_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
CL_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
CL_HD uint64_t f64_bits(double x) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)__double_as_longlong(x);
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
#endif
}
CL_HD double f64_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)u);
#else
  double x;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}
// The sign bit (of a zero or a NaN too).
CL_HD bool sign_bit(float x) { return (f32_bits(x) >> 31) != 0; }
CL_HD bool sign_bit(double x) { return (f64_bits(x) >> 63) != 0; }
// IEEE 754-2019 maximum (`max`) or minimum of a and b: NaN-propagating (a's NaN first,
// payload kept), and -0 < +0 in either argument order. The one definition of castlab's
// maximum/minimum ops (ops/scalar/ops.h) and max/min reductions (ops/scalar/reduce.h).
// Written as selects, not returns: GPU code has no branch per element.
template <typename T>
CL_HD T ieee_max_min(T a, T b, bool max) {
  T r = (max ? a > b : a < b) ? a : b;
  if (a == b) r = sign_bit(a) == max ? b : a;  // only a tie of zeros can differ
  if (b != b) r = b;
  if (a != a) r = a;
  return r;
}
// The larger (MAX) or smaller of two floats, a NaN where either is one: PTX max.NaN and
// min.NaN on sm_80 and later (one instruction), else ieee_max_min. Over a set without NaN
// it gives the value of any order's fold, up to the sign of a zero (the fast maximum of
// the register and SoftMax.cu row kernels, which fold again exactly where that matters).
template <bool MAX>
CL_HD float cl_max_min_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  if (MAX)
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return ieee_max_min(a, b, MAX);  // a NaN where either is one, as well
#endif
}

// IEEE fused multiply-add, used only where a math variant asks for it explicitly.
CL_HD float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
CL_HD double fma_d(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Rounding toward zero to an integer (exact).
CL_HD double trunc_d(double x) {
#if defined(__CUDA_ARCH__)
  return trunc(x);
#else
  return std::trunc(x);
#endif
}

CL_HD bool isnan_f(float x) { return x != x; }
CL_HD bool isnan_d(double x) { return x != x; }

}  // namespace cl
