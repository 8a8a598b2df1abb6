// The per-element statistics of castlab.numerics.exhaustive, written once for the CPU
// driver (ops/exhaustive.cpp) and device code: how one result compares with the fp64
// reference, which histogram bin its ulp error falls in, and whether the reference lies
// on a rounding midpoint of the output format.
//
// Definitions (those of castlab.numerics, python/castlab/numerics/__init__.py):
//   ulp(r) = 2**(max(floor(log2|r|), emin) - p) from the fp64 reference r;
//   ulp error = |x - r| / ulp(r) (0 for NaN vs NaN and equal infinities, inf for a
//   finite x against an infinite r); the correctly rounded value is r rounded once to
//   the output format (nearest even, castlab's conversion).
#pragma once
#include "core/convert.h"

namespace cl {

// Categories of one result; they partition the inputs.
enum ExCategory : int {
  kExExact = 0,    // x == r (as values; NaN and NaN count as equal)
  kExRounded = 1,  // not exact, but the correctly rounded value
  kExOneUlp = 2,   // one step of the format away from the correctly rounded value
  kExFar = 3,      // more than one step away
  kExNanMismatch = 4,
};
constexpr int kExCategories = 5;

// Histogram of ulp errors: bin 0 holds errors of 0; bin 1 (0, 2**kExHistLo); bin
// 2 + j holds [2**(kExHistLo + j), 2**(kExHistLo + j + 1)) for j < kExHistSpan; the last
// bin [2**(kExHistLo + kExHistSpan), inf] (infinite errors included). NaN mismatches
// are counted apart, in no bin.
constexpr int kExHistLo = -8;
constexpr int kExHistSpan = 40;
constexpr int kExHistBins = kExHistSpan + 3;

// The output format's parameters the statistics need.
struct ExFormat {
  int code;  // DTypeCode of the results
  int bits;  // storage bits (8, 16, 32 or 64)
  int p;     // explicit mantissa bits
  int emin;  // exponent of the smallest normal
};

CL_HD ExFormat ex_format(int code) {
  const FloatFormat f = format_of(code);
  const int bits = code == kFloat64                          ? 64
                   : code == kFloat32                        ? 32
                   : (code == kFloat16 || code == kBFloat16) ? 16
                                                             : 8;
  return ExFormat{code, bits, f.mant_bits, 1 - f.bias};
}

CL_HD double ex_abs(double x) { return f64_from_bits(f64_bits(x) & 0x7FFFFFFFFFFFFFFFull); }
// 2**e for -1074 <= e <= 1023, exactly (the fp64 format's ulps reach the subnormals)
CL_HD double ex_pow2(int e) {
  return e >= -1022 ? f64_from_bits((uint64_t)(e + 1023) << 52) : f64_from_bits(1ull << (e + 1074));
}

// ulp(r) of the format, for finite r: 2**floor(log2|r|) (|r|'s exponent bits alone),
// scaled by 2**-p and floored at the smallest subnormal 2**(emin - p).
CL_HD double ex_ulp(double r, const ExFormat& f) {
  const double e = f64_from_bits(f64_bits(r) & 0x7FF0000000000000ull) * ex_pow2(-f.p);
  const double lo = ex_pow2(f.emin - f.p);
  return e > lo ? e : lo;
}

// The ulp error of x against r (NaN when exactly one of them is NaN).
CL_HD double ex_ulp_error(double x, double r, const ExFormat& f) {
  const bool xn = isnan_d(x), rn = isnan_d(r);
  if (xn || rn) return xn && rn ? 0.0 : f64_from_bits(0x7FF8000000000000ull);
  const double inf = f64_from_bits(0x7FF0000000000000ull);
  if (ex_abs(r) == inf) return x == r ? 0.0 : inf;
  return ex_abs(x - r) / ex_ulp(r, f);
}

// The position of a (non-NaN) encoding in the ordered list of the format's values: the
// magnitude bits, negated for negative values (+0 and -0 are both 0).
CL_HD int64_t ex_ordinal(uint32_t bits, int nbits) {
  const uint32_t sign = 1u << (nbits - 1);
  const int64_t mag = (int64_t)(bits & (sign - 1u));
  return (bits & sign) ? -mag : mag;
}

// The category of a result with encoding `xbits` (value x) against the reference r, whose
// correctly rounded encoding is `crbits`.
CL_HD int ex_category(uint32_t xbits, double x, double r, uint32_t crbits, const ExFormat& f) {
  const bool xn = isnan_d(x), rn = isnan_d(r);
  if (xn != rn) return kExNanMismatch;
  if (xn || x == r) return kExExact;
  int64_t d = ex_ordinal(xbits, f.bits) - ex_ordinal(crbits, f.bits);
  if (d < 0) d = -d;
  return d == 0 ? kExRounded : (d == 1 ? kExOneUlp : kExFar);
}

// The histogram bin of a non-NaN ulp error.
CL_HD int ex_hist_bin(double e) {
  if (e == 0.0) return 0;
  const int ex = (int)((f64_bits(e) >> 52) & 0x7FF) - 1023;  // floor(log2 e); inf: 1024
  if (ex < kExHistLo) return 1;
  if (ex >= kExHistLo + kExHistSpan) return kExHistBins - 1;
  return 2 + ex - kExHistLo;
}

// How far r lies from the nearest rounding midpoint of its binade, in ulps of r: the
// distance of r / ulp(r) (exact: a power-of-two scaling) from the nearest half-integer,
// in [0, 0.5]; 0 exactly on a midpoint. 0.5 for NaN, infinities, zero and values beyond
// the largest finite value's midpoint with the next power of two (the overflow threshold
// of round-to-nearest), which have no midpoint to break.
CL_HD double ex_midpoint_distance(double r, const ExFormat& f) {
  const double a = ex_abs(r);
  if (isnan_d(a) || a == f64_from_bits(0x7FF0000000000000ull) || a == 0.0) return 0.5;
  const FloatFormat ff = format_of(f.code);
  const double mx = decode_magnitude(ff.max_bits, ff);
  if (a > mx + 0.5 * ex_ulp(mx, f)) return 0.5;
  const double q = a / ex_ulp(a, f);
  if (q >= 9007199254740992.0) return 0.5;  // (q < 2**(p + 2) for every double)
  const double d = q - (double)(uint64_t)q - 0.5;
  return d < 0 ? -d : d;
}

// Whether r is exactly a midpoint of two consecutive values of the format (or of the
// largest finite value and the next power of two), where round-to-nearest breaks a tie.
CL_HD bool ex_is_midpoint(double r, const ExFormat& f) { return ex_midpoint_distance(r, f) == 0.0; }

// Whether r lies so close to a midpoint (within 256 fp64 ulps: tie distance <= 2**(p - 44)
// ulps of the format) that the fp64 reference's own error could put it on the wrong side:
// castlab's fp64 functions are within 2 fp64 ulps each, not correctly rounded, so for these
// inputs the "correctly rounded" label is not certified (exact midpoints included).
CL_HD bool ex_near_midpoint(double tie_d, const ExFormat& f) { return tie_d <= ex_pow2(f.p - 44); }

// Two results differ unless they are equal values or both NaN (the definition of
// castlab.numerics.compare's mismatches: +0 and -0 do not differ).
CL_HD bool ex_differ(double a, double b) { return !(a == b || (isnan_d(a) && isnan_d(b))); }

}  // namespace cl
