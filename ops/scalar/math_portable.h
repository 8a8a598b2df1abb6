// castlab's portable transcendental functions: the same bits on every device.
//
// Every function here is built only from IEEE-754 basic operations (+ - * /, each correctly
// rounded to nearest), explicit fused multiply-adds (cl::fma_f / cl::fma_d), comparisons,
// conversions float<->double (round to nearest) and integer/bit manipulation through the
// cl:: bit helpers.  No std:: or CUDA math function is called, the only table (bits of 2/pi
// for the sin/cos reduction of large arguments) is a switch on constants, and nothing
// depends on the FP environment beyond round-to-nearest with subnormals enabled (no FTZ).
// Every multiply-add that matters is an explicit fma, and the products that feed an add
// in the double functions go through detail::mul_d (__dmul_rn on the device), so device
// results do not depend on nvcc/NVRTC --fmad (checked on an H200 with --fmad=false and
// --fmad=true: bit-identical to the CPU on 16.8M float and 4.2M double inputs per
// function).  The host must be built with -ffp-contract=off.
//
// Design.
//  * The float functions compute internally in double and round once at the end.  double
//    add/mul/fma are IEEE on the CPU and on NVIDIA GPUs (and fast on an H200); the float
//    polynomials are only as long as float needs (relative error ~2^-32..2^-38), so the
//    results are correctly rounded except for rare near-halfway cases, and all float
//    subnormal inputs/outputs are normal doubles, which removes most special cases.  The
//    float functions are branch-free (selects only), so loops over them vectorize, except
//    sinf_/cosf_ (a branch to the Payne-Hanek reduction for |x| >= 2^50).
//  * The double functions use the classic reductions with double-double corrections in
//    the places where a plain double would cost more than ~0.5 ulp.  They may branch
//    (erf_).
//  * Polynomial coefficients are minimax fits (weighted Lawson iteration in mpmath) made
//    for this file; the comment by each set gives its approximation error.
//  * NaN results are always the canonical quiet NaN (0x7fc00000 / 0x7ff8000000000000), so
//    NaN payloads do not differ between devices.
//
// Accuracy (measured by tests/cpp/test_math_portable.cpp; see tests/cpp/README.md):
//  expf_ <= 1 ulp (practically correctly rounded: ~0.5 ulp), the other float functions
//  and all double functions < 2 ulp (measured max ~0.5-1 ulp).
//  sin/cos argument reduction: 3-part Cody-Waite with pi/2 split into three doubles (done
//  in double-double for the double functions) for |x| < 2^50 (float) / |x| < 2^31 (double);
//  above that, a Payne-Hanek reduction (detail::rem_pio2_big: exact integer product of the
//  significand with a 192-bit window of 2/pi, 1216 bits of 2/pi in a switch) taken in a
//  branch.  So sin/cos are accurate for every finite argument: float sinf_/cosf_ <= 1 ulp
//  (measured max 0.5001 ulp; exhaustively over all 654M floats 2^50 <= x <= FLT_MAX, the
//  negative ones giving the mirrored bits: max 0.5001 ulp, 99.998% correctly rounded),
//  double sin_/cos_ < 2 ulp (measured max 0.715 ulp over 1M arguments 2^31 <= |x| <= DBL_MAX
//  against glibc's sinl/cosl, max 0.684 ulp over 220k against mpmath at 300+ bits).
//  Cost of that branch: the float and double sin/cos are no longer branch-free, so GCC does
//  not vectorize loops over them (measured on x86-64/AVX2: ~3.7 -> ~27 ns per sinf_, see
//  tests/cpp/README.md); the GPU is not affected beyond the rarely taken branch.
//
// Host build flags: -ffp-contract=off (required for the identical bits); for speed also
// FMA hardware (-mfma / -march=x86-64-v3: otherwise every fma is a libm call, ~10x slower)
// and -fno-trapping-math (lets GCC if-convert the selects so loops over the float
// functions vectorize; it changes no result).
#pragma once
#include "core/cl_defs.h"

namespace cl {
namespace portable {
namespace detail {

// Horner evaluation with explicit fma; coefficients lowest order first.
CL_HD double hpoly(double, double c0) { return c0; }
template <typename... T>
CL_HD double hpoly(double x, double c0, T... cs) {
  return cl::fma_d(x, hpoly(x, cs...), c0);
}

// a*b that a device compiler may not fuse into a following add (robust even without
// --fmad=false); on the host the build uses -ffp-contract=off.
CL_HD double mul_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

CL_HD float qnan_f() { return cl::f32_from_bits(0x7fc00000u); }
CL_HD double qnan_d() { return cl::f64_from_bits(0x7ff8000000000000ull); }
CL_HD float inf_f() { return cl::f32_from_bits(0x7f800000u); }
CL_HD double inf_d() { return cl::f64_from_bits(0x7ff0000000000000ull); }
CL_HD double abs_d(double x) { return cl::f64_from_bits(cl::f64_bits(x) & 0x7fffffffffffffffull); }
// 2^k for -1022 <= k <= 1023.
CL_HD double pow2_d(int32_t k) {
  return cl::f64_from_bits((uint64_t)((uint32_t)(k + 1023) & 0x7ffu) << 52);
}
// Low 32 bits of t, as an integer; with t = y + 1.5*2^52 this is round(y) for |y| < 2^31.
CL_HD int32_t low_int(double t) { return (int32_t)(uint32_t)cl::f64_bits(t); }

constexpr double kMagic = 0x1.8p52;                 // 1.5 * 2^52: adding it rounds to integer
constexpr double kInvLn2 = 0x1.71547652b82fep0;     // 1/ln2
constexpr double kLn2 = 0x1.62e42fefa39efp-1;       // ln2 rounded to double
constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;    // ln2 - kLn2
constexpr double kLn2Hi32 = 0x1.62e42feep-1;        // ln2 to 32 bits: k*kLn2Hi32 exact, |k| < 2^21
constexpr double kLn2Lo32 = 0x1.a39ef35793c76p-33;  // ln2 - kLn2Hi32
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
constexpr double kPio2_1 = 0x1.921fb54442d18p0;  // pi/2 = kPio2_1 + kPio2_2 + kPio2_3 + O(2^-161)
constexpr double kPio2_2 = 0x1.1a62633145c07p-54;
constexpr double kPio2_3 = -0x1.f1976b7ed8fbcp-110;

// ---- exp core (double) ------------------------------------------------------------
// For |x| <= ~750: e^x = 2^k * (1 + qh + ql), |qh + ql - expm1(r)| tiny, |r| <= ln2/2.
// expm1(r) = r + r^2 P(r), P minimax weighted by r^2/|expm1(r)|: 2^-60.0 relative to
// expm1(r) (so also to e^r).
CL_HD void exp_core_d(double x, int32_t& k, double& qh, double& ql) {
  double t = cl::fma_d(x, kInvLn2, kMagic);
  double kd = t - kMagic;
  k = low_int(t);
  double hi = cl::fma_d(-kd, kLn2Hi32, x);  // exact
  double lo = mul_d(kd, kLn2Lo32);
  double r = hi - lo;
  double rr = (hi - r) - lo;  // r + rr = x - k*ln2 to ~2^-100
  double z = r * r;
  double p = hpoly(r, 0x1.0000000000000p-1, 0x1.5555555555559p-3, 0x1.555555555553fp-5,
                   0x1.111111110f6c9p-7, 0x1.6c16c16c1f0c2p-10, 0x1.a01a01afdb71cp-13,
                   0x1.a01a017bb8ae3p-16, 0x1.71ddf869b649cp-19, 0x1.27e5363722a26p-22,
                   0x1.af5e9ccea4b82p-26, 0x1.1ee8925aeabaap-29);
  double s = cl::fma_d(z, p, rr);
  qh = r + s;
  ql = (r - qh) + s;
}

// ---- exp core for the float functions --------------------------------------------------
// For |x| <= ~110: returns k and r (double) with x = k*ln2 + r, |r| <= ln2/2 (r accurate to
// ~2^-53 relative; the first fma is exact because x is a float).
CL_HD double exp_reduce_f(double x, int32_t& k) {
  double t = cl::fma_d(x, kInvLn2, kMagic);
  double kd = t - kMagic;
  k = low_int(t);
  double r = cl::fma_d(-kd, kLn2, x);
  return cl::fma_d(-kd, kLn2Lo, r);
}

// ---- log core ----------------------------------------------------------------------
// Splits a positive normal double into x = 2^k * m, m in [sqrt(1/2), sqrt(2)).
CL_HD double log_split(double x, int32_t& k) {
  uint64_t ix = cl::f64_bits(x);
  uint64_t tmp = ix - 0x3fe6a09e667f3bcdull;  // bits of sqrt(1/2)
  k = (int32_t)((int64_t)tmp >> 52);
  return cl::f64_from_bits(ix - (tmp & 0xfff0000000000000ull));
}

// ---- sin/cos reduction (double) ------------------------------------------------------
// x = q*pi/2 + (rh + rl), |rh| <= ~pi/4.  Used for |x| < 2^31 (accurate there; it degrades
// slowly above, max 3.3 ulp at 2^50, hence detail::rem_pio2_big for |x| >= 2^31).
CL_HD double rem_pio2_d(double x, double& rl, int32_t& q) {
  double t = cl::fma_d(x, kTwoOverPi, kMagic);
  double kd = t - kMagic;
  q = low_int(t);
  double r1 = cl::fma_d(-kd, kPio2_1, x);  // exact
  double p = mul_d(kd, kPio2_2);
  double pe = cl::fma_d(kd, kPio2_2, -p);  // kd*kPio2_2 = p + pe exactly
  double h = r1 - p;                       // two-sum r1 - p = h + e
  double bb = h - r1;
  double e = (r1 - (h - bb)) + (-p - bb);
  double lo = cl::fma_d(-kd, kPio2_3, e - pe);
  double rh = h + lo;
  rl = (h - rh) + lo;
  return rh;
}

// ---- sin/cos reduction for large |x| (Payne-Hanek) -------------------------------------
// Word k (k >= 2) of 2/pi: bits 32(k-2)+1 .. 32(k-2)+32 after the binary point (2/pi =
// 0.a2f9836e 4e441529 ...), words 0 and 1 are zero (so that the window below may start up
// to 64 bits before the binary point).  1216 bits: enough for every double.  A switch
// rather than an array so that it is a plain constant in host and device code alike.
CL_HD uint32_t two_over_pi_word(int32_t k) {
  switch (k) {
    case 2: return 0xa2f9836eu;
    case 3: return 0x4e441529u;
    case 4: return 0xfc2757d1u;
    case 5: return 0xf534ddc0u;
    case 6: return 0xdb629599u;
    case 7: return 0x3c439041u;
    case 8: return 0xfe5163abu;
    case 9: return 0xdebbc561u;
    case 10: return 0xb7246e3au;
    case 11: return 0x424dd2e0u;
    case 12: return 0x06492eeau;
    case 13: return 0x09d1921cu;
    case 14: return 0xfe1deb1cu;
    case 15: return 0xb129a73eu;
    case 16: return 0xe88235f5u;
    case 17: return 0x2ebb4484u;
    case 18: return 0xe99c7026u;
    case 19: return 0xb45f7e41u;
    case 20: return 0x3991d639u;
    case 21: return 0x835339f4u;
    case 22: return 0x9c845f8bu;
    case 23: return 0xbdf9283bu;
    case 24: return 0x1ff897ffu;
    case 25: return 0xde05980fu;
    case 26: return 0xef2f118bu;
    case 27: return 0x5a0a6d1fu;
    case 28: return 0x6d367ecfu;
    case 29: return 0x27cb09b7u;
    case 30: return 0x4f463f66u;
    case 31: return 0x9e5fea2du;
    case 32: return 0x7527bac7u;
    case 33: return 0xebe5f17bu;
    case 34: return 0x3d0739f7u;
    case 35: return 0x8a5292eau;
    case 36: return 0x6bfb5fb1u;
    case 37: return 0x1f8d5d08u;
    case 38: return 0x56033046u;
    case 39: return 0xfc7b6babu;
    default: return 0u;
  }
}

// x = q*pi/2 + (rh + rl), |rh| <= pi/4 (+ tiny), for finite |x| >= 2^-9 of any size; exact
// integer arithmetic up to the final conversion.  x = M*2^e (M < 2^53 an integer).  Bits
// of 2/pi of weight >= 2^(2-e) add multiples of 4 to x*2/pi and are skipped; the next 192
// bits form the window W, so x*2/pi mod 4 = M*W*2^-190 mod 4 + (truncation < 2^-137).
// The fraction f (|f| <= 1/2, |f| > 2^-63 for every double: worst case 6381956970095103 *
// 2^797) is read from the top nonzero 128 bits, as a double-double (relative error
// < 2^-70), and multiplied by pi/2 in double-double.
CL_HD_COLD double rem_pio2_big(double x, double& rl, int32_t& q) {
  uint64_t ix = cl::f64_bits(x);
  uint64_t mant = (ix & 0x000fffffffffffffull) | 0x0010000000000000ull;
  int32_t j = (int32_t)((ix >> 52) & 0x7ffu) - 1075 - 2 + 64;  // window start (+64)
  int32_t k0 = j >> 5, sh = j & 31;
  uint32_t w[6];
  uint32_t cur = two_over_pi_word(k0);
  for (int t = 0; t < 6; ++t) {
    uint32_t nxt = two_over_pi_word(k0 + t + 1);
    w[t] = (uint32_t)(((((uint64_t)cur << 32) | nxt) << sh) >> 32);
    cur = nxt;
  }
  // P = M*W mod 2^192, limbs most significant first.
  uint32_t m_lo = (uint32_t)mant, m_hi = (uint32_t)(mant >> 32);
  uint32_t p[6];
  uint64_t c = 0;
  for (int t = 5; t >= 0; --t) {
    uint64_t v = (uint64_t)m_lo * w[t] + c;
    p[t] = (uint32_t)v;
    c = v >> 32;
  }
  c = 0;
  for (int t = 5; t >= 1; --t) {
    uint64_t v = (uint64_t)m_hi * w[t] + p[t - 1] + c;
    p[t - 1] = (uint32_t)v;
    c = v >> 32;
  }
  // y = P*2^-190 in [0, 4): q = round(y) mod 4, f = y - round(y) in [-1/2, 1/2).
  uint32_t top = p[0] + 0x20000000u;
  q = (int32_t)(top >> 30);
  int32_t g = (int32_t)(top & 0x3fffffffu) - 0x20000000;
  bool neg = g < 0;
  uint32_t mask = neg ? 0xffffffffu : 0u;  // |F| = ~F + 1 for F < 0
  uint32_t m[6];
  m[0] = (uint32_t)g ^ mask;
  for (int t = 1; t < 6; ++t) m[t] = p[t] ^ mask;
  c = neg ? 1u : 0u;
  for (int t = 5; t >= 0; --t) {
    uint64_t v = (uint64_t)m[t] + c;
    m[t] = (uint32_t)v;
    c = v >> 32;
  }
  int32_t sc = -30 - 32;  // |f| = (m0*2^32 + m1 + m2*2^-32 + m3*2^-64) * 2^sc
  for (int i = 0; i < 4; ++i) {
    if (m[0] != 0u) break;
    m[0] = m[1];
    m[1] = m[2];
    m[2] = m[3];
    m[3] = m[4];
    m[4] = m[5];
    m[5] = 0u;
    sc -= 32;
  }
  double a = (double)m[0] * 0x1p32, b = (double)m[1];
  double h = a + b;  // fast two-sum, a >= b (or a = 0)
  double l = (b - (h - a)) + ((double)m[2] * 0x1p-32 + (double)m[3] * 0x1p-64);
  double s = pow2_d(sc);
  double fh = h * s, fl = l * s;  // exact
  double rh = mul_d(fh, kPio2_1);
  double re = cl::fma_d(fh, kPio2_1, -rh);
  double rlo = cl::fma_d(fh, kPio2_2, cl::fma_d(fl, kPio2_1, re));
  double r = rh + rlo;
  double rr = (rh - r) + rlo;
  bool flip = neg != (x < 0.0);  // x < 0: x = -q*pi/2 - r
  q = x < 0.0 ? -q : q;
  rl = flip ? -rr : rr;
  return flip ? -r : r;
}

// sin(rh + rl), |rh| <= ~pi/4.  S minimax: 2^-56.8 relative.
CL_HD double sin_kernel_d(double rh, double rl) {
  double z = rh * rh;
  double s = hpoly(z, -0x1.5555555555548p-3, 0x1.111111110f78dp-7, -0x1.a01a019bf52dep-13,
                   0x1.71de355ff8e00p-19, -0x1.ae5e543a42f92p-26, 0x1.5d8deda214f7bp-33);
  double tail = cl::fma_d(rh * z, s, cl::fma_d(-0.5 * z, rl, rl));
  return rh + tail;
}
// cos(rh + rl), |rh| <= ~pi/4.  C minimax: 2^-59.2 relative.
CL_HD double cos_kernel_d(double rh, double rl) {
  double z = rh * rh;
  double zl = cl::fma_d(rh, rh, -z);  // rh^2 = z + zl exactly
  double c = hpoly(z, 0x1.555555555554bp-5, -0x1.6c16c16c14f45p-10, 0x1.a01a019c7c9f3p-16,
                   -0x1.27e4f7e513be2p-22, 0x1.1ee9d3bf685d1p-29, -0x1.8fa281affdbd3p-37);
  double hz = mul_d(0.5, z);
  double w = 1.0 - hz;
  double tail = ((1.0 - w) - hz) + (cl::fma_d(z * z, c, -(rh * rl)) - mul_d(0.5, zl));
  return w + tail;
}

// Float-grade kernels (double arithmetic), |r| <= ~pi/4.
// sin: r + r^3 S(r^2), 2^-37.5 relative.  cos: 1 - r^2/2 + r^4 C(r^2), 2^-42.9 relative.
CL_HD double sin_kernel_f(double r, double z) {
  double s = hpoly(z, -0x1.5555554c5e67ap-3, 0x1.1111085c467bdp-7, -0x1.a00f73c7e6486p-13,
                   0x1.6ccf3a439a146p-19);
  return cl::fma_d(r * z, s, r);
}
CL_HD double cos_kernel_f(double z) {
  double c = hpoly(z, 0x1.5555554ecb4f5p-5, -0x1.6c16b81af2dd2p-10, 0x1.a010d4e7f4d5ep-16,
                   -0x1.241c92e571a8bp-22);
  return cl::fma_d(z, cl::fma_d(z, c, -0.5), 1.0);
}

}  // namespace detail

// =====================================================================================
// exp
// =====================================================================================

// expf_: computed in double: x = k*ln2 + r (|r| <= ln2/2, r accurate to 2^-53), e^r =
// 1 + r + r^2 P(r) with a degree-5 minimax P (relative error 2^-34.2), times 2^k (exact in
// double), one rounding to float.  This was chosen over an all-float evaluation because it
// gives a (practically) correctly rounded result, <= 1 ulp guaranteed, with about the same
// number of operations; subnormal results come out of the single final rounding.
CL_HD float expf_(float x) {
  double xd = (double)x;
  xd = xd < -104.0 ? -104.0 : xd;  // e^-104 < 2^-150: rounds to 0 (NaN passes through)
  xd = xd > 89.0 ? 89.0 : xd;      // e^89 > FLT_MAX: rounds to +Inf
  int32_t k;
  double r = detail::exp_reduce_f(xd, k);
  double z = r * r;
  double p = detail::hpoly(r, 0x1.0000003a44d5dp-1, 0x1.55555442b4894p-3, 0x1.55548d78a28f7p-5,
                           0x1.11127111aec2dp-7, 0x1.6d8d4dcb387e2p-10, 0x1.9f08a07fd00d7p-13);
  double y = 1.0 + cl::fma_d(z, p, r);
  float res = (float)(y * detail::pow2_d(k));
  return cl::isnan_f(x) ? detail::qnan_f() : res;
}

// exp_: x = k*ln2 + r in double-double (32-bit ln2 head, exact), e^r = 1 + expm1(r) with
// expm1(r) = r + r^2 P(r), P degree 10 minimax (2^-60), 1 + qh + ql rounded once, then
// multiplied by 2^(k/2) (exact) and 2^(k - k/2) (one rounding, so subnormal results are
// rounded once).
CL_HD double exp_(double x) {
  double xc = x < -746.0 ? -746.0 : x;  // e^-746 < 2^-1075: rounds to 0
  xc = xc > 710.0 ? 710.0 : xc;         // e^710 > DBL_MAX
  int32_t k;
  double qh, ql;
  detail::exp_core_d(xc, k, qh, ql);
  double y = 1.0 + qh;
  double yl = ((1.0 - y) + qh) + ql;
  y = y + yl;
  int32_t k1 = k / 2;
  double res = (y * detail::pow2_d(k1)) * detail::pow2_d(k - k1);
  return cl::isnan_d(x) ? detail::qnan_d() : res;
}

// =====================================================================================
// log
// =====================================================================================

// logf_: in double (float subnormals are normal doubles): x = 2^k m, m in [sqrt(1/2),
// sqrt(2)), f = m - 1 (exact), s = f/(2+f), log(m) = 2 atanh(s) = 2s + s R(s^2) with
// R(z) = z Q(z), Q degree-3 minimax (2^-37.6 relative); result k*ln2 + log(m), one rounding.
CL_HD float logf_(float x) {
  double xd = (double)x;
  int32_t k;
  double m = detail::log_split(xd, k);
  double f = m - 1.0;
  double s = f / (2.0 + f);
  double z = s * s;
  double R = z * detail::hpoly(z, 0x1.555554fdb113bp-1, 0x1.999a7a79cd9cbp-2, 0x1.2438d7e9b4f6ap-2,
                               0x1.e2f6d6df1cb8ap-3);
  double lm = cl::fma_d(s, R, s + s);
  float res = (float)cl::fma_d((double)k, detail::kLn2, lm);
  res = x > 0.0f ? res : (x == 0.0f ? -detail::inf_f() : detail::qnan_f());
  return x == detail::inf_f() ? x : res;
}

// log_: same reduction (subnormals pre-scaled by 2^54); log(1+f) = f - (hfsq - s(hfsq + R))
// with hfsq = f^2/2 so that the leading term f is exact, R = z Q(z), Q degree-6 minimax
// (2^-59.0); k*ln2 added as a 32-bit head (exact) plus a tail.
CL_HD double log_(double x) {
  bool sub = x < 0x1p-1022;
  double xs = sub ? x * 0x1p54 : x;
  int32_t k;
  double m = detail::log_split(xs, k);
  double kd = (double)(sub ? k - 54 : k);
  double f = m - 1.0;
  double s = f / (2.0 + f);
  double z = s * s;
  double R = detail::mul_d(
      z, detail::hpoly(z, 0x1.5555555555592p-1, 0x1.999999997fdaep-2, 0x1.24924941f37e4p-2,
                       0x1.c71c52060e49bp-3, 0x1.74663fdbd891bp-3, 0x1.39a19b80efbf2p-3,
                       0x1.2f06de3191baep-3));
  double hfsq = detail::mul_d(0.5 * f, f);
  double res = detail::mul_d(kd, detail::kLn2Hi32) +
               (f - (hfsq - cl::fma_d(s, hfsq + R, kd * detail::kLn2Lo32)));
  res = x > 0.0 ? res : (x == 0.0 ? -detail::inf_d() : detail::qnan_d());
  return x == detail::inf_d() ? x : res;
}

// =====================================================================================
// sin / cos
// =====================================================================================

// sinf_/cosf_: in double: k = round(x*2/pi), r = x - k*pi/2 with pi/2 in three doubles
// (first fma exact; accurate for |x| < 2^50), or for |x| >= 2^50 the Payne-Hanek reduction;
// both float-grade kernels evaluated, quadrant selected without branches, one rounding.
namespace detail {
CL_HD double sincos_f_finish(double r, int32_t q, bool want_cos) {
  q += want_cos ? 1 : 0;
  double z = r * r;
  double s = detail::sin_kernel_f(r, z);
  double c = detail::cos_kernel_f(z);
  double v = (q & 1) ? c : s;
  return (q & 2) ? -v : v;
}
// The branch-free path, exact for |x| < 2^50 (what sincos_f_core computes there).
CL_HD double sincos_f_small(double xd, bool want_cos) {
  double t = cl::fma_d(xd, detail::kTwoOverPi, detail::kMagic);
  double kd = t - detail::kMagic;
  int32_t q = detail::low_int(t);
  double r = cl::fma_d(-kd, detail::kPio2_1, xd);
  r = cl::fma_d(-kd, detail::kPio2_2, r);
  r = cl::fma_d(-kd, detail::kPio2_3, r);
  return sincos_f_finish(r, q, want_cos);
}
CL_HD double sincos_f_core(float x, bool want_cos) {
  double xd = (double)x;
  if (detail::abs_d(xd) < 0x1p50) return sincos_f_small(xd, want_cos);
  // rare: |x| >= 2^50, Inf, NaN (the last two are replaced by the caller)
  double rl;
  int32_t q;
  double r = detail::rem_pio2_big(xd, rl, q);
  return sincos_f_finish(r, q, want_cos);
}
}  // namespace detail
CL_HD float sinf_(float x) {
  float res = (float)detail::sincos_f_core(x, false);
  float ax = cl::f32_from_bits(cl::f32_bits(x) & 0x7fffffffu);
  res = x == 0.0f ? x : res;  // keep the sign of zero
  return ax < detail::inf_f() ? res : detail::qnan_f();
}
CL_HD float cosf_(float x) {
  float res = (float)detail::sincos_f_core(x, true);
  float ax = cl::f32_from_bits(cl::f32_bits(x) & 0x7fffffffu);
  return ax < detail::inf_f() ? res : detail::qnan_f();
}
// Vectorisable variants for CPU loops: equal to sinf_/cosf_ where |x| < 2^50 (a caller
// fixes up the rest with sinf_/cosf_; see sincosf_needs_full_).
CL_HD float sinf_small_(float x) {
  float res = (float)detail::sincos_f_small((double)x, false);
  return x == 0.0f ? x : res;
}
CL_HD float cosf_small_(float x) { return (float)detail::sincos_f_small((double)x, true); }
CL_HD bool sincosf_needs_full_(float x) {
  return !(cl::f32_from_bits(cl::f32_bits(x) & 0x7fffffffu) < 0x1p50f);
}

// sin_/cos_: double-double reduction (detail::rem_pio2_d) for |x| < 2^31, Payne-Hanek
// (detail::rem_pio2_big) above, kernels on rh + rl, quadrant selection.
namespace detail {
CL_HD double sincos_d_core(double x, bool want_cos) {
  double rl, rh;
  int32_t q;
  if (detail::abs_d(x) < 0x1p31) {
    rh = detail::rem_pio2_d(x, rl, q);
  } else {  // rare: |x| >= 2^31, Inf, NaN (the last two are replaced by the caller)
    rh = detail::rem_pio2_big(x, rl, q);
  }
  q += want_cos ? 1 : 0;
  double v = (q & 1) ? detail::cos_kernel_d(rh, rl) : detail::sin_kernel_d(rh, rl);
  return (q & 2) ? -v : v;
}
}  // namespace detail
CL_HD double sin_(double x) {
  double res = detail::sincos_d_core(x, false);
  res = x == 0.0 ? x : res;
  return detail::abs_d(x) < detail::inf_d() ? res : detail::qnan_d();
}
CL_HD double cos_(double x) {
  double res = detail::sincos_d_core(x, true);
  return detail::abs_d(x) < detail::inf_d() ? res : detail::qnan_d();
}

// =====================================================================================
// tanh
// =====================================================================================

// tanhf_: in double: a = min(|x|, 9.5) (tanh(9.5) rounds to 1.0f), e^(2a) = 2^k (1 + q),
// q = expm1(r) = r + r^2 P(r) (P degree 5, 2^-32 relative to expm1(r)),
// tanh(a) = (2^k q + (2^k - 1)) / (2^k q + (2^k + 1)) (both exact-ish: k <= 28), one
// rounding, sign copied from x (so -0 stays -0).
CL_HD float tanhf_(float x) {
  double a = (double)cl::f32_from_bits(cl::f32_bits(x) & 0x7fffffffu);
  a = a > 9.5 ? 9.5 : a;
  int32_t k;
  double r = detail::exp_reduce_f(a + a, k);
  double z = r * r;
  double p = detail::hpoly(r, 0x1.0000002605192p-1, 0x1.555554ef5a54bp-3, 0x1.5554b0f1a165ap-5,
                           0x1.11118988e88d3p-7, 0x1.6d7238062e897p-10, 0x1.a032d7e9af197p-13);
  double q = cl::fma_d(z, p, r);
  double sk = detail::pow2_d(k);
  double num = cl::fma_d(sk, q, sk - 1.0);
  double den = cl::fma_d(sk, q, sk + 1.0);
  float res = (float)(num / den);
  res = cl::f32_from_bits(cl::f32_bits(res) | (cl::f32_bits(x) & 0x80000000u));
  return cl::isnan_f(x) ? detail::qnan_f() : res;
}

// tanh_: a = min(|x|, 20) (tanh(20) rounds to 1), e^(2a) = 2^k (1 + qh + ql) (exp core),
// N = e^(2a) - 1 and D = e^(2a) + 1 in double-double, N/D with one correction step.
CL_HD double tanh_(double x) {
  double a = detail::abs_d(x);
  a = a > 20.0 ? 20.0 : a;
  int32_t k;
  double qh, ql;
  detail::exp_core_d(a + a, k, qh, ql);
  double sk = detail::pow2_d(k);
  double bh = sk * qh, bl = sk * ql;  // exact
  // N = (sk - 1) + bh + bl, D = (sk + 1) + bh + bl; sk -+ 1 = an + anl = ad + adl exactly
  // (fast two-sum, sk >= 1), then two-sums with bh.
  double an = sk - 1.0, ad = sk + 1.0;
  double anl = -1.0 - (an - sk), adl = 1.0 - (ad - sk);
  double nh = an + bh;
  double nb = nh - an;
  double nl = ((an - (nh - nb)) + (bh - nb)) + (bl + anl);
  double dh = ad + bh;
  double db = dh - ad;
  double dl = ((ad - (dh - db)) + (bh - db)) + (bl + adl);
  double th = nh / dh;
  double rem = cl::fma_d(-th, dh, nh);  // exact
  double res = th + (cl::fma_d(-th, dl, rem + nl)) / dh;
  res = cl::f64_from_bits(cl::f64_bits(res) | (cl::f64_bits(x) & 0x8000000000000000ull));
  return cl::isnan_d(x) ? detail::qnan_d() : res;
}

// =====================================================================================
// erf
// =====================================================================================

// erff_: in double, branch-free.  |x| < 1: erf(x) = x + x E(x^2), E degree 7 minimax
// (2^-34.8 relative).  1 <= |x|: erf(|x|) = P(min(|x|, 3.925) - 2.4625), P degree 17
// minimax on [1, 3.925] (2^-33.6 relative; erf(x) rounds to 1.0f for x > 3.9193, and so
// does P(3.925)).  One rounding.
CL_HD float erff_(float x) {
  double xd = (double)x;
  double ax = detail::abs_d(xd);
  double z = xd * xd;
  double e = detail::hpoly(z, 0x1.06eba82005cf1p-3, -0x1.8127465fd66cep-2, 0x1.ce2f079cabde9p-4,
                           -0x1.b829a7e214947p-6, 0x1.5628efa995a88p-8, -0x1.bcbea6d6bea73p-11,
                           0x1.d826b5c385ac8p-14, -0x1.4384135a698dap-17);
  double small = cl::fma_d(xd, e, xd);
  double u = (ax > 3.925 ? 3.925 : ax) - 2.4625;
  double big = detail::hpoly(u, 0x1.ffbee3b6c8398p-1, 0x1.57e8c9475a13ep-9, -0x1.a7701f450becdp-8,
                             0x1.3ee9cda24bb59p-7, -0x1.42176107962b2p-7, 0x1.bb2a76ed02c10p-8,
                             -0x1.7fec0ad8a49b3p-9, 0x1.d904f13c38d2ap-12, 0x1.6e188809d3ec7p-12,
                             -0x1.24f4052eadfccp-12, 0x1.41619e21fda91p-14, 0x1.95ea7b14c7ba8p-17,
                             -0x1.24a025d079dc5p-16, 0x1.298c7567a08e8p-18, 0x1.3216f4c76f770p-20,
                             -0x1.89845d6e51923p-21, -0x1.dacc106f60bdfp-28, 0x1.5a7e67f56dba8p-25);
  big = xd < 0.0 ? -big : big;
  float res = (float)(ax < 1.0 ? small : big);
  return cl::isnan_f(x) ? detail::qnan_f() : res;
}

// erf_: |x| < 1: x + x E(x^2), E degree 11 minimax (2^-55.7).  1 <= |x| < 5.93:
// erf = 1 - e^(-x^2) F(|x|), F = erfc*e^(x^2) by a minimax polynomial on one of five
// intervals (relative error of the result <= 2^-57), e^(-x^2) = exp_(-hi) (1 - lo) with
// x^2 = hi + lo exact.  |x| >= 5.93: +-1.
CL_HD double erf_(double x) {
  double ax = detail::abs_d(x);
  double res;
  if (ax < 1.0) {
    double e =
        detail::hpoly(x * x, 0x1.06eba8214db68p-3, -0x1.812746b0379bdp-2, 0x1.ce2f21a040d1ep-4,
                      -0x1.b82ce311faaacp-6, 0x1.565bccf92d9fbp-8, -0x1.c02db03e29b68p-11,
                      0x1.f9a2bab01045fp-14, -0x1.f4ca4dd4d17abp-17, 0x1.b97fd78f1e45ep-20,
                      -0x1.5c073ca0a2427p-23, 0x1.d71b9f0b0b524p-27, -0x1.abafe686fadedp-31);
    return cl::fma_d(x, e, x);
  } else if (ax < 5.93) {
    double F;
    if (ax < 1.5) {
      F = detail::hpoly(ax - 1.25, 0x1.78a692138767ap-2, -0x1.abaacdbfa8afep-3,
                        0x1.b56f45eef7ce7p-4, -0x1.9b635ac628cd1p-5, 0x1.68a25a668847fp-6,
                        -0x1.299636ce0d1ecp-7, 0x1.d1b6950ce1b46p-9, -0x1.5b8bd8e29df66p-10,
                        0x1.f0ff127d58a7bp-12, -0x1.55b314430c067p-13, 0x1.c51f77a4b3cecp-15,
                        -0x1.287a31342b506p-16, 0x1.7b7dc0f224db6p-18);
    } else if (ax < 2.25) {
      F = detail::hpoly(ax - 1.875, 0x1.13e5743b60482p-2, -0x1.e36580c7f7320p-4,
                        0x1.8a6efeed2102bp-5, -0x1.2ef92f6f22e61p-6, 0x1.b99589da83657p-8,
                        -0x1.33237c0edd687p-9, 0x1.99b60786e96cbp-11, -0x1.070e3b2773feep-12,
                        0x1.4634ee93f713dp-14, -0x1.877d94dd1d01ap-16, 0x1.c6f39c6c4ee6bp-18,
                        -0x1.0aa2ae5b79ed2p-19, 0x1.3e124441498fep-21);
    } else if (ax < 3.25) {
      F = detail::hpoly(ax - 2.75, 0x1.8c9eb68ff2862p-3, -0x1.030578132f2f5p-4,
                        0x1.43b98bac4012ep-6, -0x1.84e9ab39b868cp-8, 0x1.c2c73056b295ep-10,
                        -0x1.f99e2f2f6db33p-12, 0x1.131b9b5cfe847p-13, -0x1.2319d246d0a76p-15,
                        0x1.2bee8737a4502p-17, -0x1.2b678a6f3bd89p-19, 0x1.30471a01f38b5p-21,
                        -0x1.5efce79aa210ap-23);
    } else if (ax < 4.5) {
      F = detail::hpoly(ax - 3.875, 0x1.211c625926961p-3, -0x1.193eb7b7d8b02p-5,
                        0x1.0a7a05f9ef1ccp-7, -0x1.ecb5886250065p-10, 0x1.bd20eb5ef0a6cp-12,
                        -0x1.89874cdbb2e78p-14, 0x1.55285b35d5babp-16, -0x1.1f46ac4cae222p-18,
                        0x1.d86b2a8f0d042p-21, -0x1.18f325e8fffafp-22);
    } else {
      F = detail::hpoly(ax - 5.215, 0x1.b365315e1e81dp-4, -0x1.42acfeb8e48d4p-6,
                        0x1.d67ba8ccb8f85p-9, -0x1.559df956862b0p-11, 0x1.a67ad9cec20b7p-14,
                        -0x1.0c38dad034d5fp-15);
    }
    double hi = ax * ax;
    double lo = cl::fma_d(ax, ax, -hi);
    double g = exp_(-hi);
    g = cl::fma_d(-lo, g, g);  // e^(-hi-lo) ~ e^(-hi) (1 - lo)
    res = 1.0 - detail::mul_d(g, F);
  } else {
    res = cl::isnan_d(x) ? detail::qnan_d() : 1.0;
  }
  return x < 0.0 ? -res : res;
}

}  // namespace portable
}  // namespace cl
