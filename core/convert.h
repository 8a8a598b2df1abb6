// Conversions between castlab's storage formats, written once for host and device.
//
// Every narrowing conversion rounds the exact input value directly to the target
// format (fp64 -> bf16 never goes through fp32, so there is no double rounding).
// NaN stays NaN, Inf and -0 are exact, subnormals are kept (no flush to zero).
// Rounding modes: nearest-even (default), toward zero, and stochastic (round up with
// probability equal to the discarded fraction, driven by 32 caller-supplied random bits).
#pragma once
#include "core/cl_defs.h"

namespace cl {

// Storage dtype codes. Shared by the executors and the generated CUDA code.
enum DTypeCode : uint8_t {
  kFloat64 = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat8E4M3FN = 4,
  kFloat8E5M2 = 5,
  kBool = 6,
  kInt32 = 7,
  kInt64 = 8,
};

enum RoundMode : uint8_t { kNearestEven = 0, kTowardZero = 1, kStochastic = 2 };

// A small binary floating-point format: M explicit mantissa bits, exponent bias, the
// largest finite value's bits, whether it has infinities (IEEE-like) and its NaN bits.
struct FloatFormat {
  int mant_bits;
  int exp_bits;
  int bias;
  bool has_inf;       // false for e4m3fn: the all-ones exponent holds normals
  uint32_t max_bits;  // bit pattern of the largest finite value (no sign)
  uint32_t nan_bits;  // canonical NaN produced by conversions
  uint32_t sign_bit;
};

CL_HD FloatFormat format_of(int code) {
  switch (code) {
    case kFloat32: return FloatFormat{23, 8, 127, true, 0x7F7FFFFFu, 0x7FC00000u, 0x80000000u};
    case kFloat16: return FloatFormat{10, 5, 15, true, 0x7BFFu, 0x7E00u, 0x8000u};
    case kBFloat16: return FloatFormat{7, 8, 127, true, 0x7F7Fu, 0x7FC0u, 0x8000u};
    case kFloat8E4M3FN: return FloatFormat{3, 4, 7, false, 0x7Eu, 0x7Fu, 0x80u};
    case kFloat8E5M2: return FloatFormat{2, 5, 15, true, 0x7Bu, 0x7Eu, 0x80u};
    default: return FloatFormat{52, 11, 1023, true, 0, 0, 0};
  }
}

// Exact value of a finite, nonnegative encoding (no sign bit) as a double.
CL_HD double decode_magnitude(uint32_t bits, const FloatFormat& f) {
  uint32_t e = bits >> f.mant_bits;
  uint32_t m = bits & ((1u << f.mant_bits) - 1u);
  int exp2 = (e == 0) ? (1 - f.bias - f.mant_bits) : ((int)e - f.bias - f.mant_bits);
  double scale = f64_from_bits((uint64_t)(exp2 + 1023) << 52);  // 2^exp2, always normal here
  double n = (e == 0) ? (double)m : (double)(m | (1u << f.mant_bits));
  return n * scale;
}

// Round a double to the format `code` and return its bit pattern.
// `saturate`: out-of-range finite values (and Inf for formats without Inf) become the
// largest finite value instead of Inf/NaN. `rbits` feeds stochastic rounding.
CL_HD uint32_t round_f64_to_bits(double x, int code, int mode, bool saturate, uint32_t rbits) {
  const FloatFormat f = format_of(code);
  if (isnan_d(x)) return f.nan_bits;
  // Saturation is an fp8 option only: bf16/fp16 overflow to Inf and keep Inf exact.
  saturate = saturate && (code == kFloat8E4M3FN || code == kFloat8E5M2);
  const uint64_t xb = f64_bits(x);
  const uint32_t sign = (xb >> 63) ? f.sign_bit : 0u;
  const uint64_t abits = xb & 0x7FFFFFFFFFFFFFFFull;
  const uint32_t inf_bits = f.has_inf ? ((1u << f.exp_bits) - 1u) << f.mant_bits : f.nan_bits;
  if (abits == 0x7FF0000000000000ull) {  // +-Inf
    if (f.has_inf && !saturate) return sign | inf_bits;
    if (!f.has_inf && !saturate) return f.nan_bits;
    return sign | f.max_bits;
  }
  if (abits == 0) return sign;
  const double a = f64_from_bits(abits);
  int e = (int)(abits >> 52) - 1023;  // floor(log2(a)) for normal doubles
  if ((abits >> 52) == 0) e = -1023;  // double subnormal: far below every target's range
  const int emin = 1 - f.bias;
  const int eq = (e < emin ? emin : e) - f.mant_bits;  // exponent of one ulp at a
  // a / 2^eq, exact: scaling by a power of two that keeps the result normal.
  double scaled;
  if (eq >= -1022 && eq <= 1023) {
    scaled = a * f64_from_bits((uint64_t)(1023 - eq) << 52);
  } else {  // only reachable from subnormal double inputs: two exact steps
    scaled = a * f64_from_bits((uint64_t)(1023 + 600) << 52);
    scaled = scaled * f64_from_bits((uint64_t)(1023 - eq - 600) << 52);
  }
  double nf = (double)(uint64_t)scaled;  // scaled < 2^(M+2) fits easily
  const double frac = scaled - nf;
  uint64_t n = (uint64_t)nf;
  if (mode == kNearestEven) {
    if (frac > 0.5 || (frac == 0.5 && (n & 1u))) n += 1;
  } else if (mode == kStochastic) {
    // Round up with probability frac: compare against 32 uniform random bits.
    if (frac * 4294967296.0 > (double)rbits) n += 1;
  }
  // Encode n * 2^eq.
  int ebiased = eq + f.mant_bits + f.bias;  // biased exponent if n in [2^M, 2^(M+1))
  const uint64_t one = 1ull << f.mant_bits;
  if (n >= 2 * one) {
    n >>= 1;
    ebiased += 1;
  }
  uint32_t out;
  if (n < one) {
    out = (uint32_t)n;  // subnormal (ebiased is the min normal's exponent here) or zero
  } else {
    out = ((uint32_t)ebiased << f.mant_bits) | (uint32_t)(n - one);
  }
  const uint32_t max_exp_field = (1u << f.exp_bits) - 1u;
  const bool overflow =
      f.has_inf ? ((uint32_t)ebiased >= max_exp_field && n >= one) : (out > f.max_bits);
  if (overflow) {
    if (saturate || mode == kTowardZero) return sign | f.max_bits;
    return f.has_inf ? (sign | inf_bits) : f.nan_bits;
  }
  return sign | out;
}

// Exact value of any storage encoding as double.
CL_HD double bits_to_f64(uint32_t bits, int code) {
  const FloatFormat f = format_of(code);
  const bool neg = (bits & f.sign_bit) != 0;
  const uint32_t a = bits & (f.sign_bit - 1u);
  const uint32_t exp_field = a >> f.mant_bits;
  const uint32_t max_exp = (1u << f.exp_bits) - 1u;
  double v;
  if (f.has_inf && exp_field == max_exp) {
    v = (a & ((1u << f.mant_bits) - 1u)) ? f64_from_bits(0x7FF8000000000000ull)
                                         : f64_from_bits(0x7FF0000000000000ull);
  } else if (!f.has_inf && a > f.max_bits) {
    v = f64_from_bits(0x7FF8000000000000ull);
  } else {
    v = decode_magnitude(a, f);
  }
  return neg ? -v : v;
}

// ---- fast paths for the hot conversions (bit tricks; same results as the generic path) ----

CL_HD float bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

// fp32 -> bf16, round to nearest even. NaN -> 0x7FC0 (as PyTorch).
CL_HD uint16_t f32_to_bf16_rne(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // The hardware conversion (one instruction; round to nearest even, subnormals kept),
  // with castlab's NaN (0x7FC0) so that every device gives the same bits.
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return x != x ? (uint16_t)0x7FC0 : (uint16_t)h;
#else
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
#endif
}

CL_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t m = h & 0x3FFu;
  const uint32_t inf_nan = sign | 0x7F800000u | (m << 13);  // an Inf, or a NaN's payload kept
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
  // The hardware conversion (exact, subnormals kept) for every value but a NaN, which
  // keeps its payload as on the host (selected, not branched: one instruction more).
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return (h & 0x7FFFu) > 0x7C00u ? f32_from_bits(inf_nan) : f;
#else
  const uint32_t e = (h >> 10) & 0x1Fu;
  if (e == 0x1F) return f32_from_bits(inf_nan);
  if (e == 0) {
    // m * 2^-24: exact in float (a float subnormal or normal)
    const float v = (float)m * f32_from_bits(0x33800000u);
    return f32_from_bits(sign | f32_bits(v));
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

// fp32 -> fp16, round to nearest even. NaN keeps its sign, payload becomes quiet 0x200.
CL_HD uint16_t f32_to_f16_rne(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
  // Hardware conversion (round to nearest even, subnormals kept); NaN as on the host:
  // the sign kept, quiet payload 0x200.
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return x != x ? (uint16_t)(((f32_bits(x) >> 16) & 0x8000u) | 0x7E00u) : (uint16_t)h;
#endif
  const uint32_t u = f32_bits(x);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520 (and Inf) -> Inf
  if (a >= 0x38800000u) {                                   // normal fp16
    const uint32_t r = a - 0x38000000u;
    return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25 (the tie rounds to even: zero)
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t s = 126u - (a >> 23);  // 14..24
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) q += 1u;
  return (uint16_t)(sign | q);
}

// Two fp32 -> two bf16 / fp16 (round to nearest even), packed: `lo` in bits 0-15, `hi` in
// bits 16-31. The same bits as two calls of the scalar functions above. On the GPU it is
// one paired conversion (F2FP) plus one 16x2 minimum that turns the hardware's canonical
// NaN (0x7FFF for every NaN input, either sign) into castlab's; the scalar form needs a
// compare and a select per element and keeps the compiler from pairing the conversions,
// which costs 10-15% of the time of bf16 kernels that are compute-bound (exp, log, tanh).
CL_HD uint32_t f32x2_to_bf16x2_rne(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  // As signed 16-bit lanes every non-NaN result (finite or infinite, either sign) is at
  // most 0x7F80 < 0x7FC0 < 0x7FFF: only the NaN lanes change.
  return __vmins2(w, 0x7FC07FC0u);
#else
  return (uint32_t)f32_to_bf16_rne(lo) | ((uint32_t)f32_to_bf16_rne(hi) << 16);
#endif
}
CL_HD uint32_t f32x2_to_f16x2_rne(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  // NaN lanes (0x7FFF) -> 0x7E00; then every lane takes its input's sign, which the
  // conversion already kept for every non-NaN lane.
  w = __vmins2(w, 0x7E007E00u);
  return w | (__byte_perm(f32_bits(lo), f32_bits(hi), 0x7030u) & 0x80008000u);
#else
  return (uint32_t)f32_to_f16_rne(lo) | ((uint32_t)f32_to_f16_rne(hi) << 16);
#endif
}

// ---- storage <-> compute value ----

// Widen a stored element (given as raw bits in the low bytes) to float, exactly.
// Valid for every format whose values fit in float (all but float64 and int64).
CL_HD float widen_to_f32(uint32_t bits, int code) {
  switch (code) {
    case kFloat32: return f32_from_bits(bits);
    case kBFloat16: return bf16_to_f32((uint16_t)bits);
    case kFloat16: return f16_to_f32((uint16_t)bits);
    case kBool: return bits ? 1.0f : 0.0f;
    case kInt32: return (float)(int32_t)bits;        // rounds for |v| > 2^24, as PyTorch
    default: return (float)bits_to_f64(bits, code);  // fp8: exact in float
  }
}

// Round a float to storage format `code` and return the bits.
CL_HD uint32_t narrow_f32(float x, int code, int mode, bool saturate, uint32_t rbits) {
  if (mode == kNearestEven) {
    if (code == kBFloat16) return f32_to_bf16_rne(x);
    if (code == kFloat16) return f32_to_f16_rne(x);
    if (code == kFloat32) return f32_bits(x);
  }
  if (code == kFloat32) return f32_bits(x);
  if (code == kBool) return x != 0.0f ? 1u : 0u;
  return round_f64_to_bits((double)x, code, mode, saturate, rbits);
}

// Round x to format `code` and return the rounded value as float (used for the
// explicit rounding steps a policy inserts between ops).
CL_HD float round_f32_to(float x, int code, int mode, bool saturate, uint32_t rbits) {
  if (code == kFloat32 || code == kFloat64) return x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // the paired conversion with a zero partner, its NaN lane set by a 16x2 minimum, then
  // widened: three instructions where the compare-and-select form takes four (the same
  // bits: castlab's NaN 0x7FC0 widens to 0x7FC00000)
  if (code == kBFloat16 && mode == kNearestEven)
    return f32_from_bits(f32x2_to_bf16x2_rne(x, 0.0f) << 16);
#endif
  if (code == kBFloat16 && mode == kNearestEven) return bf16_to_f32(f32_to_bf16_rne(x));
  if (code == kFloat16 && mode == kNearestEven) return f16_to_f32(f32_to_f16_rne(x));
  if (code == kBool) return x != 0.0f ? 1.0f : 0.0f;
  return (float)bits_to_f64(round_f64_to_bits((double)x, code, mode, saturate, rbits), code);
}

// Round a double to format `code` (directly, one rounding) and return it as a double.
// bf16 / fp16, nearest even, for |x| in the format's normal range or above it (as a double):
// x's own mantissa rounded to the format's width in integer arithmetic (a carry moves into the
// exponent; past the largest finite value, ties included, is infinity, as IEEE rounding).
// false where it does not apply (subnormal results, zeros): the general conversion then.
CL_HD bool round_f64_nearest_16(double x, int code, double* out) {
  const int M = code == kBFloat16 ? 7 : 10, emax = code == kBFloat16 ? 127 : 15;
  const uint64_t u = f64_bits(x), a = u & 0x7FFFFFFFFFFFFFFFull, sign = u ^ a;
  const int e = (int)(a >> 52) - 1023;
  if (e == 1024) {  // infinities exact; a NaN the format's NaN, as the general path
    *out = isnan_d(x) ? f64_from_bits(0x7FF8000000000000ull) : x;
    return true;
  }
  if (e > emax) {
    *out = f64_from_bits(sign | 0x7FF0000000000000ull);
    return true;
  }
  if (e < 1 - emax) return false;
  const int sh = 52 - M;
  uint64_t r = (a + ((1ull << (sh - 1)) - 1ull) + ((a >> sh) & 1ull)) & ~((1ull << sh) - 1ull);
  if ((int)(r >> 52) - 1023 > emax) r = 0x7FF0000000000000ull;
  *out = f64_from_bits(sign | r);
  return true;
}

CL_HD double round_f64_to(double x, int code, int mode, bool saturate, uint32_t rbits) {
  if (code == kFloat64) return x;
  if (code == kFloat32 && mode == kNearestEven) return (double)(float)x;
  double fast;
  if ((code == kBFloat16 || code == kFloat16) && mode == kNearestEven &&
      round_f64_nearest_16(x, code, &fast))
    return fast;
  if (code == kBool) return x != 0.0 ? 1.0 : 0.0;
  return bits_to_f64(round_f64_to_bits(x, code, mode, saturate, rbits), code);
}

}  // namespace cl
