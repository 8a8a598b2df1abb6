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
  int code;         // DTypeCode of the results
  int bits;         // storage bits (8, 16, 32 or 64)
  int p;            // explicit mantissa bits
  int emin;         // exponent of the smallest normal
  bool scale;       // 1/ulp is a normal double for every r (p - emin <= 1023: all but fp64)
  double overflow;  // the largest finite value's midpoint with the next power of two
};

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

// 1 / ulp(r) = 2**(p - max(floor(log2|r|), emin)), exactly, for finite r where f.scale:
// its exponent lies in [p - 1023, p - emin] (and is NaN and infinity's p - 1024 for those,
// where no caller uses it), so the power of two is a normal double made from its exponent.
CL_HD double ex_inv_ulp(double r, const ExFormat& f) {
  const int e = (int)((f64_bits(r) >> 52) & 0x7FF) - 1023;
  return f64_from_bits((uint64_t)(f.p - (e > f.emin ? e : f.emin) + 1023) << 52);
}

// The factor that turns a difference into ulps of r (finite r): 1/ulp(r) where that is
// a normal double (every format but fp64: f.scale), else ulp(r). A product with 1/ulp is
// the quotient by ulp bit for bit (both round the same real v * 2**k once), and costs a
// GPU a fraction of an IEEE division.
CL_HD double ex_ulp_factor(double r, const ExFormat& f) {
  return f.scale ? ex_inv_ulp(r, f) : ex_ulp(r, f);
}
CL_HD double ex_in_ulps(double v, double factor, const ExFormat& f) {
  return f.scale ? v * factor : v / factor;
}

CL_HD ExFormat ex_format(int code) {
  const FloatFormat ff = format_of(code);
  const int bits = code == kFloat64                          ? 64
                   : code == kFloat32                        ? 32
                   : (code == kFloat16 || code == kBFloat16) ? 16
                                                             : 8;
  ExFormat f{code, bits, ff.mant_bits, 1 - ff.bias, false, 0.0};
  f.scale = f.p - f.emin <= 1023;
  if (bits == 64) {  // every finite double is below fp64's own overflow threshold
    f.overflow = f64_from_bits(0x7FF0000000000000ull);
    return f;
  }
  const double mx = decode_magnitude(ff.max_bits, ff);
  f.overflow = mx + 0.5 * ex_ulp(mx, f);
  return f;
}

// The ulp error of x against r, given r's NaN and infinity tests and ulp factor (NaN when
// exactly one of them is NaN).
CL_HD double ex_error(double x, double r, bool rnan, bool rinf, double factor, const ExFormat& f) {
  const bool xn = isnan_d(x);
  if (xn || rnan) return xn && rnan ? 0.0 : f64_from_bits(0x7FF8000000000000ull);
  if (rinf) return x == r ? 0.0 : f64_from_bits(0x7FF0000000000000ull);
  return ex_in_ulps(ex_abs(x - r), factor, f);
}

// The ulp error of x against r (NaN when exactly one of them is NaN).
CL_HD double ex_ulp_error(double x, double r, const ExFormat& f) {
  return ex_error(x, r, isnan_d(r), ex_abs(r) == f64_from_bits(0x7FF0000000000000ull),
                  ex_ulp_factor(r, f), f);
}

// What the statistics of every configuration's result need from the reference r of one
// input, computed once per input.
struct ExRef {
  double r;
  uint32_t crbits;  // r correctly rounded to the format (nearest even, castlab's conversion)
  bool nan, inf;    // r is NaN; r is infinite
  double factor;    // ex_ulp_factor(r)
};

// round_f64_to_bits(r, code, kNearestEven, true, 0): on Hopper, one conversion instruction
// for bf16 and fp16 (one rounding, subnormals kept, overflow to infinity), NaN made
// castlab's. The GPU tests check the two against each other.
CL_HD uint32_t ex_round_nearest(double r, int code) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (code == kBFloat16 || code == kFloat16) {
    unsigned short h;
    if (code == kBFloat16)
      asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(h) : "d"(r));
    else
      asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(r));
    return isnan_d(r) ? format_of(code).nan_bits : (uint32_t)h;
  }
#endif
  return round_f64_to_bits(r, code, kNearestEven, true, 0u);
}

CL_HD ExRef ex_ref(double r, const ExFormat& f) {
  ExRef R;
  R.r = r;
  R.crbits = ex_round_nearest(r, f.code);
  R.nan = isnan_d(r);
  R.inf = ex_abs(r) == f64_from_bits(0x7FF0000000000000ull);
  R.factor = ex_ulp_factor(r, f);
  return R;
}

// The value of a result's encoding: bits_to_f64, through float where that is exact (for a
// NaN: a NaN, whatever its payload; the statistics only ask whether it is one).
CL_HD double ex_value(uint32_t bits, int code) {
  if (code == kBFloat16) return (double)bf16_to_f32((uint16_t)bits);
  if (code == kFloat32) return (double)f32_from_bits(bits);
  return bits_to_f64(bits, code);
}

// The position of a (non-NaN) encoding in the ordered list of the format's values: the
// magnitude bits, negated for negative values (+0 and -0 are both 0).
CL_HD int64_t ex_ordinal(uint32_t bits, int nbits) {
  const uint32_t sign = 1u << (nbits - 1);
  const int64_t mag = (int64_t)(bits & (sign - 1u));
  return (bits & sign) ? -mag : mag;
}

// The category of a result with encoding `xbits` (value x) against the reference R, and
// its ulp error (*err; NaN for a NaN mismatch).
CL_HD int ex_classify(uint32_t xbits, double x, const ExRef& R, const ExFormat& f, double* err) {
  const bool xn = isnan_d(x);
  *err = ex_error(x, R.r, R.nan, R.inf, R.factor, f);
  if (xn != R.nan) return kExNanMismatch;
  if (xn || x == R.r) return kExExact;
  if (f.bits <= 16) {  // ordinals of 16-bit formats and their differences fit an int
    const int d = (int)ex_ordinal(xbits, f.bits) - (int)ex_ordinal(R.crbits, f.bits);
    return d == 0 ? kExRounded : (d == 1 || d == -1 ? kExOneUlp : kExFar);
  }
  int64_t d = ex_ordinal(xbits, f.bits) - ex_ordinal(R.crbits, f.bits);
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
CL_HD double ex_midpoint_distance(const ExRef& R, const ExFormat& f) {
  const double a = ex_abs(R.r);
  if (R.nan || R.inf || a == 0.0 || a > f.overflow) return 0.5;
  const double q = ex_in_ulps(a, R.factor, f);  // |r| has r's ulp
  if (q >= 9007199254740992.0) return 0.5;      // (q < 2**(p + 2) for every double)
  const double d = q - trunc_d(q) - 0.5;        // q >= 0, an integer part below 2**53
  return d < 0 ? -d : d;
}

// What ex_classify and ex_midpoint_distance give the correctly rounded value R.crbits
// itself: the result of most configurations for most inputs, computed once per input.
struct ExRefClass {
  double tie_d;  // ex_midpoint_distance(R, f)
  double err;    // the ulp error of R.crbits
  int cat;       // its category
};

// Where 1/ulp scales exactly (f.scale) and r is finite, nonzero and below the overflow
// threshold, from one scaling of |r|: q = |r| / ulp(r) is exact, the correctly rounded
// value is round(q) ulps, so its error |x - r| / ulp(r) is q's distance from the nearer
// integer, min(frac, 1 - frac) with frac = q - trunc(q), which ex_error's |x - r| * factor
// gives bit for bit: x - r is exact (Sterbenz: x lies within half an ulp of r, and x is 0
// only where r is below half the smallest subnormal), the scaling by 1/ulp is exact (the
// error is 0 or at least 2**(p - 52) ulps), and so are frac and 1 - frac (frac >= 0.5).
// Elsewhere (NaN, infinities, zero, overflow, fp64) the general functions.
CL_HD ExRefClass ex_ref_class(const ExRef& R, const ExFormat& f) {
  ExRefClass c;
  const double a = ex_abs(R.r);
  if (!f.scale || !(a < f.overflow) || a == 0.0) {
    c.tie_d = ex_midpoint_distance(R, f);
    c.cat = ex_classify(R.crbits, ex_value(R.crbits, f.code), R, f, &c.err);
    return c;
  }
  const double q = a * R.factor;  // below 2**(p + 2) <= 2**53: frac is exact
  const double frac = q - trunc_d(q);
  const double d = frac - 0.5;  // ex_midpoint_distance's expression
  c.tie_d = d < 0 ? -d : d;
  c.err = frac <= 0.5 ? frac : 1.0 - frac;
  c.cat = frac == 0.0 ? kExExact : kExRounded;
  return c;
}

// Whether r lies so close to a midpoint (within 256 fp64 ulps: tie distance <= 2**(p - 44)
// ulps of the format) that the fp64 reference's own error could put it on the wrong side:
// castlab's fp64 functions are within 2 fp64 ulps each, not correctly rounded, so for these
// inputs the "correctly rounded" label is not certified (exact midpoints included).
CL_HD bool ex_near_midpoint(double tie_d, const ExFormat& f) { return tie_d <= ex_pow2(f.p - 44); }

// Two results differ unless they are equal values or both NaN (the definition of
// castlab.numerics.compare's mismatches: +0 and -0 do not differ).
CL_HD bool ex_differ(double a, double b) { return !(a == b || (isnan_d(a) && isnan_d(b))); }
// The same from their encodings in the format (one encoding per value but for the zeros
// and the NaNs) and NaN tests: integer work instead of three fp64 comparisons.
CL_HD bool ex_differ_bits(uint32_t a, uint32_t b, bool anan, bool bnan, const ExFormat& f) {
  const uint32_t mag = (1u << (f.bits - 1)) - 1u;
  return !(a == b || ((a | b) & mag) == 0u || (anan && bnan));
}

}  // namespace cl
