// Device helpers of every generated kernel (ops/cuda/codegen.cpp). Never compiled by the
// host compiler: embedded as text at build time (CASTLAB_EMBEDDED_HEADERS) and handed to
// NVRTC, which the generated source asks for with #include "ops/cuda/prelude.cuh".
#pragma once
#include "ops/scalar/ops.h"

// Programmatic dependent launch (sm_90+): the executor launches elementwise kernels with
// programmatic stream serialization (ops/cuda/executor.cpp), so a kernel may be scheduled
// once the blocks of the kernel before it in the stream have exited, before that kernel
// has completed. Here it waits until every kernel before it has completed and its writes
// are visible; nothing of the kernel touches global memory before this. (No early
// launch_dependents trigger: blocks of the next kernel resident and waiting while this one
// runs slowed a compute-heavy kernel by 15%, benchmarks/RESULTS.md.) Without that
// launch attribute the wait returns at once.
__device__ __forceinline__ void cl_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// clang-format off
template <int B> struct cl_word;
template <> struct cl_word<16> { typedef uint4 T; };
template <> struct cl_word<8> { typedef uint2 T; };
template <> struct cl_word<4> { typedef unsigned int T; };
template <> struct cl_word<2> { typedef unsigned short T; };
template <> struct cl_word<1> { typedef unsigned char T; };
// clang-format on
// B bytes in 16-byte (or smaller) words; the caller checked alignment.
template <int B>
__device__ __forceinline__ void cl_copy_words(void* dst, const void* src) {
  constexpr int C = B >= 16 ? 16 : B;
  typedef typename cl_word<C>::T W;
#pragma unroll
  for (int c = 0; c < B / C; ++c) reinterpret_cast<W*>(dst)[c] = reinterpret_cast<const W*>(src)[c];
}
// A word of 16-bit values into an array, by masks and shifts of its 32-bit halves: the
// compiler then widens each bf16 with one instruction, where a copy through the array's
// 16-bit halves took two (the register row kernel).
__device__ __forceinline__ void cl_unpack16(unsigned short* o, const unsigned int w) {
  o[0] = static_cast<unsigned short>(w);
  o[1] = static_cast<unsigned short>(w >> 16);
}
__device__ __forceinline__ void cl_unpack16(unsigned short* o, const uint1 w) {
  cl_unpack16(o, w.x);
}
__device__ __forceinline__ void cl_unpack16(unsigned short* o, const uint2 w) {
  cl_unpack16(o, w.x);
  cl_unpack16(o + 2, w.y);
}
__device__ __forceinline__ void cl_unpack16(unsigned short* o, const uint4 w) {
  cl_unpack16(o, w.x);
  cl_unpack16(o + 2, w.y);
  cl_unpack16(o + 4, w.z);
  cl_unpack16(o + 6, w.w);
}
// a / b in fp32 (IEEE division) where the quotient is only rounded on to bf16 (BF) or
// fp16, nearest even, and b is a row's value: q = fl(a * r) with r = fl(1 / b) from
// cl_rcp_div16, once per row (the row kernel's split, ops/codegen/element.cpp), and the
// division itself only where q lies within 8 fp32 bit patterns of a 16-bit rounding
// boundary or outside the 16-bit format's normal range. Both roundings of a * r are
// relative errors of at most 2^-24 while r and q are normal, so q is within 2^-22.9
// |a / b| of a / b, and fl(a / b) within 2^-24: the two are at most 6 apart as fp32 bit
// patterns (3 ulps of the quotient's binade, 6 where q falls into the binade below). The
// 16-bit value changes only where the pattern crosses a midpoint (low 16 bits 0x8000 for
// bf16, low 13 bits 0x1000 for a normal fp16); a q 9 or more patterns from every midpoint
// therefore rounds as fl(a / b) does. Where r is not normal (|b| > 2^126, b zero, inf or
// NaN) it is a NaN, and every element divides. (PyTorch's softmax epilogue:
// exp(x - max) / sum.)
__device__ __forceinline__ float cl_rcp_div16(float b) {
  const unsigned ub = __float_as_uint(b) & 0x7fffffffu;
  return ub - 1u < 0x7e800000u ? __frcp_rn(b) : __int_as_float(0x7fffffff);
}
template <bool BF>
__device__ __forceinline__ float cl_div_rn_16(float a, float b, float r) {
  const float q = __fmul_rn(a, r), m = fabsf(q);
  // the low bits past the 16-bit format's, offset so a midpoint +- 8 is 0 .. 16
  const unsigned low =
      BF ? (__float_as_uint(q) + 0x8008u) & 0xffffu : (__float_as_uint(q) + 0x1008u) & 0x1fffu;
  // bf16: a normal float below 2^127; fp16: from 2^-14 (its smallest normal) below 65504
  const bool sure =
      (BF ? m >= 0x1p-126f && m < 0x1p127f : m >= 0x1p-14f && m < 65504.0f) && low > 16u;
  return sure ? q : a / b;
}
// N consecutive elements between memory and an array.
template <typename T, int N>
__device__ __forceinline__ void cl_vload(T (&dst)[N], const T* src) {
  cl_copy_words<(int)sizeof(T) * N>(dst, src);
}
template <typename T, int N>
__device__ __forceinline__ void cl_vstore(T* dst, const T (&src)[N]) {
  cl_copy_words<(int)sizeof(T) * N>(dst, src);
}
// cl_vload for an input many lanes read (broadcast along an outer dimension: RoPE's cos and
// sin), with an L2 evict-last policy (and L1 evict-last), as Inductor marks broadcast loads
// and Triton lowers them on sm_80 and later: the streaming inputs and outputs then leave L2
// before it, so later lanes, the next kernel reading it (the k half of a q/k RoPE) and the
// next call (a model's next layer) find it there (benchmarks/RESULTS.md, 2026-12-03).
// Words of 4, 8 and 16 bytes; narrower vectors and older GPUs load plainly.
template <int C>
struct cl_keep_word {
  static __device__ __forceinline__ void load(void* d, const void* s, unsigned long long) {
    cl_copy_words<C>(d, s);
  }
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <>
struct cl_keep_word<16> {
  static __device__ __forceinline__ void load(void* d, const void* s, unsigned long long pol) {
    uint4 w;
    asm("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
        : "l"(s), "l"(pol));
    *reinterpret_cast<uint4*>(d) = w;
  }
};
template <>
struct cl_keep_word<8> {
  static __device__ __forceinline__ void load(void* d, const void* s, unsigned long long pol) {
    uint2 w;
    asm("ld.global.L1::evict_last.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(w.x), "=r"(w.y)
        : "l"(s), "l"(pol));
    *reinterpret_cast<uint2*>(d) = w;
  }
};
template <>
struct cl_keep_word<4> {
  static __device__ __forceinline__ void load(void* d, const void* s, unsigned long long pol) {
    unsigned int w;
    asm("ld.global.L1::evict_last.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(w) : "l"(s), "l"(pol));
    *reinterpret_cast<unsigned int*>(d) = w;
  }
};
#endif
template <typename T, int N>
__device__ __forceinline__ void cl_vload_keep(T (&dst)[N], const T* src) {
  constexpr int B = (int)sizeof(T) * N;
  constexpr int C = B >= 16 ? 16 : B;
  unsigned long long pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
#pragma unroll
  for (int c = 0; c < B / C; ++c)
    cl_keep_word<C>::load(reinterpret_cast<char*>(dst) + c * C,
                          reinterpret_cast<const char*>(src) + c * C, pol);
}
// cl_vload for an input each element reads once, in a kernel whose evict-last loads
// (above) mark a broadcast input: an L2 evict-first policy (and no L1 allocation), so L2
// keeps the broadcast input and the freshly written outputs (for the kernel that reads
// them next) and drops these lines first. The executor asks for it where the operands
// exceed the L2 but fit in twice its size (KernelLayout::evict_first_reads, executor.cpp):
// RoPE at 16M elements 93.5% -> 98.4% of a 1 GiB copy's bandwidth (benchmarks/RESULTS.md).
// 16-byte words; narrower vectors and older GPUs load plainly.
template <typename T, int N>
__device__ __forceinline__ void cl_vload_first(T (&dst)[N], const T* src) {
  constexpr int B = (int)sizeof(T) * N;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (B % 16 == 0) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#pragma unroll
    for (int c = 0; c < B / 16; ++c) {
      uint4 w;
      asm("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
          : "l"(reinterpret_cast<const char*>(src) + c * 16), "l"(pol));
      reinterpret_cast<uint4*>(dst)[c] = w;
    }
    return;
  }
#endif
  cl_copy_words<B>(dst, src);
}
// fp16 NaNs by their magnitudes (the bits less the sign), two 16-bit lanes a 32-bit word:
// cl_f16_mag folds values (a word, a vector word, an array, one value) into the lanes'
// largest magnitudes m, and cl_f16_no_nan_in(m) says whether no magnitude was above
// Inf's. The row kernels fold each vector word as they load it (not its unpacked halves,
// which the compiler would pack again).
__device__ __forceinline__ unsigned int cl_f16_mag(const unsigned int m, const unsigned int w) {
  return __vmaxu2(m, w & 0x7FFF7FFFu);
}
__device__ __forceinline__ unsigned int cl_f16_mag(const unsigned int m, const uint4 w) {
  return cl_f16_mag(cl_f16_mag(cl_f16_mag(cl_f16_mag(m, w.x), w.y), w.z), w.w);
}
__device__ __forceinline__ unsigned int cl_f16_mag(const unsigned int m, const unsigned short h) {
  return cl_f16_mag(m, static_cast<unsigned int>(h));
}
template <int N>
__device__ __forceinline__ unsigned int cl_f16_mag(unsigned int m, const unsigned short (&h)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) m = cl_f16_mag(m, h[j]);
  return m;
}
__device__ __forceinline__ bool cl_f16_no_nan_in(const unsigned int m) {
  return __vmaxu2(m, 0x7C007C00u) == 0x7C007C00u;
}
// One fp16 value widened to float, exactly: with HW the hardware conversion alone (one
// instruction, subnormals kept), for a value the caller knows is no NaN (cl_f16_no_nan_in);
// else cl::f16_to_f32, which keeps a NaN's sign and payload bit for bit (as NumPy) where
// the hardware need not (benchmarks/RESULTS.md, "Design notes from kernel experiments").
template <bool HW>
__device__ __forceinline__ float cl_h2f(const unsigned short h) {
  if constexpr (HW) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  } else {
    return cl::f16_to_f32(h);
  }
}
// N fp16 values widened to float, exactly: the hardware conversion unless one is a NaN.
template <int N>
__device__ __forceinline__ void cl_f16v_to_f32(const unsigned short (&h)[N], float (&f)[N]) {
  if constexpr (N % 2 == 0) {
    unsigned int m = 0;
#pragma unroll
    for (int c = 0; c < N / 2; ++c) m = cl_f16_mag(m, reinterpret_cast<const unsigned int*>(h)[c]);
    if (cl_f16_no_nan_in(m)) {
#pragma unroll
      for (int j = 0; j < N; ++j) f[j] = cl_h2f<true>(h[j]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) f[j] = cl_h2f<false>(h[j]);
}
