// castlab.numerics.compare's metrics, computed by castlab's own code on the CPU and (embedded
// verbatim for NVRTC) on the GPU: one header, so both devices give the same numbers, and the
// same numbers as the NumPy definitions in python/castlab/numerics/_metrics.py (`scan`).
//
// The work splits like NumPy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src):
// the flattened tensors are cut into the leaves of NumPy's halving tree (blocks of at most 128
// elements, split at n / 2 rounded down to a multiple of 8). cmp_leaf computes one leaf's
// statistics (sums with NumPy's 8 accumulators, maxima, counts, the first worst element);
// cmp_combine joins two neighbouring subtrees (left + right for the sums, as NumPy adds them).
// Combined up the tree, every sum is the one np.add.reduce gives on the whole array, and the
// maxima and counts are those of the plain definitions.
//
// Per-element definitions (x a result, b the first result, r the reference, all as fp64;
// f = x's format; ulp(r) = max(2^floor(log2|r|), 2^emin) * 2^-p from r's bits):
//   abs error    both NaN ? 0 : |x - r|          (max propagates NaN; summed)
//   rel error    r == 0 ? (err == 0 ? 0 : inf) : err / |r|
//   squared      (x - r)^2                       (summed: RMSE)
//   ulp error    |x - r| / ulp(r); 0 for both NaN or equal infinities; inf for finite x vs
//                infinite r (summed; its maximum and first arg-maximum, NaN counts largest)
//   correctly rounded   x == round(r to f) (castlab's conversion, core/convert.h), NaN == NaN
//   vs b         mismatch: !(x == b || both NaN); NaN mismatch: exactly one NaN; same dtype:
//                ulps apart (ordinal distance of the bit patterns; both NaN 0, one NaN -1);
//                other dtypes: the coarser one's ulp error at the finer one, NaN skipped;
//                not close: torch.isclose(b, x, rtol=tol, atol=tol) false, computed in the
//                dtype as PyTorch does (16-bit: each op in fp32, rounded)
#pragma once
#include "core/convert.h"

namespace cl {

constexpr int kCmpMaxResults = 8;
// Statistics of one tree node: doubles, then int64s. The reference's two doubles come first,
// then kCdPer doubles (and kCiPer int64s) per result.
enum CmpRefD : int { kCdRefSq = 0, kCdRefAbsMax = 1, kCdRef = 2 };
enum CmpD : int { kCdAbsMax, kCdAbsSum, kCdRelMax, kCdSqSum, kCdUeMax, kCdUeSum, kCdApart, kCdPer };
enum CmpI : int { kCiUeArg, kCiOk, kCiMism, kCiNanMism, kCiApart, kCiNan, kCiNotClose, kCiPer };

struct CmpParams {
  const void* x[kCmpMaxResults];  // contiguous results, n elements each
  int code[kCmpMaxResults];       // their dtype codes (core/convert.h)
  int nres;
  const void* ref;  // contiguous reference, or null
  int ref_code;
  double tol;  // the same() tolerance (isclose's rtol and atol)
  int64_t n;
};

CL_HD int cmp_nd(int nres) { return kCdRef + kCdPer * nres; }
CL_HD int cmp_ni(int nres) { return kCiPer * nres; }

CL_HD double cmp_inf() { return f64_from_bits(0x7FF0000000000000ull); }
CL_HD double cmp_nan() { return f64_from_bits(0x7FF8000000000000ull); }
CL_HD double cmp_abs(double x) { return f64_from_bits(f64_bits(x) & 0x7FFFFFFFFFFFFFFFull); }
CL_HD float cmp_absf(float x) { return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu); }
CL_HD bool cmp_isinf(double x) { return cmp_abs(x) == cmp_inf(); }
// 2^e for -1074 <= e <= 1023, exactly.
CL_HD double cmp_pow2(int e) {
  return e >= -1022 ? f64_from_bits((uint64_t)(e + 1023) << 52) : f64_from_bits(1ull << (e + 1074));
}
// NumPy's maximum: NaN propagates.
CL_HD double cmp_nanmax(double a, double b) {
  return (a != a || b != b) ? cmp_nan() : (b > a ? b : a);
}

// Explicit mantissa bits and the smallest normal's exponent of a float format (ml_dtypes.finfo).
CL_HD void cmp_format(int code, int* p, int* emin) {
  const FloatFormat f = format_of(code);
  *p = f.mant_bits;
  *emin = 1 - f.bias;
}
CL_HD double cmp_ulp(double r, int p, int emin) {
  if (r != r) return r;
  const double e = f64_from_bits(f64_bits(r) & 0x7FF0000000000000ull);  // 2^floor(log2|r|)
  const double u = e * cmp_pow2(-p), lo = cmp_pow2(emin - p);
  return u > lo ? u : lo;
}
// _ulp_error_np: |x - r| / ulp(r) in the format (p, emin).
CL_HD double cmp_ulp_error(double x, double r, int p, int emin) {
  const bool xn = x != x, rn = r != r;
  if ((xn && rn) || (cmp_isinf(x) && x == r)) return 0.0;
  if (cmp_isinf(r) && !xn && x != r) return cmp_inf();
  return cmp_abs(x - r) / cmp_ulp(r, p, emin);
}

CL_HD uint64_t cmp_bits(const void* a, int code, int64_t i) {
  switch (code) {
    case kFloat64: return static_cast<const uint64_t*>(a)[i];
    case kFloat32: return static_cast<const uint32_t*>(a)[i];
    case kFloat16:
    case kBFloat16: return static_cast<const uint16_t*>(a)[i];
    default: return static_cast<const uint8_t*>(a)[i];
  }
}
CL_HD double cmp_value(uint64_t bits, int code) {
  if (code == kFloat64) return f64_from_bits(bits);
  if (code == kFloat32) return (double)f32_from_bits((uint32_t)bits);
  return bits_to_f64((uint32_t)bits, code);
}
CL_HD int cmp_width(int code) {
  return code == kFloat64                          ? 64
         : code == kFloat32                        ? 32
         : (code == kFloat16 || code == kBFloat16) ? 16
                                                   : 8;
}
// ulp_diff: distance of two bit patterns of one format (NaN handled by the caller).
CL_HD int64_t cmp_ulps_apart(uint64_t a, uint64_t b, int width) {
  const uint64_t mask = (width == 64) ? 0x7FFFFFFFFFFFFFFFull : ((1ull << (width - 1)) - 1ull);
  const uint64_t ma = a & mask, mb = b & mask;
  const bool sa = ((a >> (width - 1)) & 1ull) != 0, sb = ((b >> (width - 1)) & 1ull) != 0;
  uint64_t d = sa == sb ? (ma >= mb ? ma - mb : mb - ma) : ma + mb;
  if (d > 0x7FFFFFFFFFFFFFFFull) d = 0x7FFFFFFFFFFFFFFFull;
  return (int64_t)d;
}
// torch.isclose(actual=b, expected=x, rtol=tol, atol=tol) for one dtype, as PyTorch computes
// it (castlab's eager ops follow it): |b - x| <= |x * tol| + tol, each op in the dtype's
// op-math and rounded to the dtype; 1-byte formats compare for equality only.
CL_HD bool cmp_isclose(double b, double x, int code, double tol) {
  if (b == x) return true;
  if (code == kFloat64) {
    const double err = cmp_abs(b - x);
    return err - err == 0.0 && err <= cmp_abs(x * tol) + tol;
  }
  if (cmp_width(code) == 8) return false;
  const float bf = (float)b, xf = (float)x, t = (float)tol;
  float allowed, err;
  if (code == kFloat32) {
    allowed = cmp_absf(xf * t) + t;
    err = cmp_absf(bf - xf);
  } else {
    allowed = round_f32_to(cmp_absf(round_f32_to(xf * t, code, kNearestEven, false, 0)) + t, code,
                           kNearestEven, false, 0);
    err = cmp_absf(round_f32_to(bf - xf, code, kNearestEven, false, 0));
  }
  return err - err == 0.0f && err <= allowed;
}

// NumPy's pairwise block sum, fed one element at a time in index order (m: block length).
struct CmpPw {
  double r[8];
  double res;
};
CL_HD double cmp_pw_tree(const CmpPw& s) {
  return ((s.r[0] + s.r[1]) + (s.r[2] + s.r[3])) + ((s.r[4] + s.r[5]) + (s.r[6] + s.r[7]));
}

// The statistics of the leaf [lo, lo + m) (m <= 128) into D (cmp_nd doubles) and I (cmp_ni).
CL_HD void cmp_leaf(const CmpParams& P, int64_t lo, int64_t m, double* D, int64_t* I) {
  const bool has_ref = P.ref != nullptr;
  const int bcode = P.code[0];
  int bp, bemin;
  cmp_format(bcode, &bp, &bemin);
  const int64_t body = m < 8 ? 0 : m - m % 8;
  // the reference: sum of squares, largest finite magnitude
  if (has_ref) {
    CmpPw s;
    s.res = -0.0;
    double amax = -cmp_inf();
    for (int64_t i = 0; i < m; ++i) {
      const double r = cmp_value(cmp_bits(P.ref, P.ref_code, lo + i), P.ref_code);
      const double sq = r * r, a = cmp_abs(r);
      if (a - a == 0.0 && a > amax) amax = a;
      if (m < 8 || i >= body) {
        if (i == body && m >= 8) s.res = cmp_pw_tree(s);
        s.res += sq;
      } else if (i < 8) {
        s.r[i] = sq;
      } else {
        s.r[i & 7] += sq;
      }
    }
    if (m >= 8 && body == m) s.res = cmp_pw_tree(s);
    D[kCdRefSq] = s.res;
    D[kCdRefAbsMax] = amax;
  } else {
    D[kCdRefSq] = 0.0;
    D[kCdRefAbsMax] = -cmp_inf();
  }
  for (int j = 0; j < P.nres; ++j) {
    const int code = P.code[j];
    const int w = cmp_width(code);
    int p, emin;
    cmp_format(code, &p, &emin);
    double* d = D + kCdRef + kCdPer * j;
    int64_t* c = I + kCiPer * j;
    CmpPw sa, ss, su;
    sa.res = ss.res = su.res = -0.0;
    double abs_max = -cmp_inf(), rel_max = -cmp_inf(), ue_max = -cmp_inf(), apart_f = -cmp_inf();
    int64_t ue_arg = -1, ok = 0, mism = 0, nan_mism = 0, notclose = 0, has_nan = 0;
    int64_t apart_i = j == 0 ? 0 : -0x7FFFFFFFFFFFFFFFll - 1;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t k = lo + i;
      const uint64_t xb = cmp_bits(P.x[j], code, k);
      const double x = cmp_value(xb, code);
      const bool xn = x != x;
      has_nan |= xn ? 1 : 0;
      double e_abs = 0.0, e_sq = 0.0, e_ue = 0.0;
      if (has_ref) {
        const double r = cmp_value(cmp_bits(P.ref, P.ref_code, k), P.ref_code);
        const bool rn = r != r;
        const double dd = x - r;
        const double err = (xn && rn) ? 0.0 : cmp_abs(dd);
        abs_max = cmp_nanmax(abs_max, err);
        const double rel = r == 0.0 ? (err == 0.0 ? 0.0 : cmp_inf()) : err / cmp_abs(r);
        rel_max = cmp_nanmax(rel_max, rel);
        e_abs = err;
        e_sq = dd * dd;
        e_ue = cmp_ulp_error(x, r, p, emin);
        if (!(ue_max != ue_max) && (e_ue != e_ue || e_ue > ue_max)) {
          ue_max = e_ue;
          ue_arg = k;
        }
        const double cr = round_f64_to(r, code, kNearestEven, true, 0);
        ok += (cr == x || (cr != cr && xn)) ? 1 : 0;
      }
      if (j > 0) {
        const uint64_t bb = cmp_bits(P.x[0], bcode, k);
        const double b = cmp_value(bb, bcode);
        const bool bn = b != b;
        mism += (x == b || (xn && bn)) ? 0 : 1;
        nan_mism += xn != bn ? 1 : 0;
        if (code == bcode) {
          const int64_t dist = (xn && bn) ? 0 : (xn != bn) ? -1 : cmp_ulps_apart(xb, bb, w);
          if (dist > apart_i) apart_i = dist;
          notclose += cmp_isclose(b, x, code, P.tol) ? 0 : 1;
        } else {
          const double e = p <= bp ? cmp_ulp_error(x, b, p, emin) : cmp_ulp_error(b, x, bp, bemin);
          if (!(e != e) && e > apart_f) apart_f = e;
        }
      }
      if (m < 8 || i >= body) {
        if (i == body && m >= 8) {
          sa.res = cmp_pw_tree(sa);
          ss.res = cmp_pw_tree(ss);
          su.res = cmp_pw_tree(su);
        }
        sa.res += e_abs;
        ss.res += e_sq;
        su.res += e_ue;
      } else if (i < 8) {
        sa.r[i] = e_abs;
        ss.r[i] = e_sq;
        su.r[i] = e_ue;
      } else {
        sa.r[i & 7] += e_abs;
        ss.r[i & 7] += e_sq;
        su.r[i & 7] += e_ue;
      }
    }
    if (m >= 8 && body == m) {
      sa.res = cmp_pw_tree(sa);
      ss.res = cmp_pw_tree(ss);
      su.res = cmp_pw_tree(su);
    }
    d[kCdAbsMax] = abs_max;
    d[kCdAbsSum] = sa.res;
    d[kCdRelMax] = rel_max;
    d[kCdSqSum] = ss.res;
    d[kCdUeMax] = ue_max;
    d[kCdUeSum] = su.res;
    d[kCdApart] = apart_f;
    c[kCiUeArg] = ue_arg;
    c[kCiOk] = ok;
    c[kCiMism] = mism;
    c[kCiNanMism] = nan_mism;
    c[kCiApart] = apart_i;
    c[kCiNan] = has_nan;
    c[kCiNotClose] = notclose;
  }
}

// Node = left subtree + right subtree (left holds the lower indices).
CL_HD void cmp_combine(int nres, const double* DL, const int64_t* IL, const double* DR,
                       const int64_t* IR, double* D, int64_t* I) {
  D[kCdRefSq] = DL[kCdRefSq] + DR[kCdRefSq];
  D[kCdRefAbsMax] = DR[kCdRefAbsMax] > DL[kCdRefAbsMax] ? DR[kCdRefAbsMax] : DL[kCdRefAbsMax];
  for (int j = 0; j < nres; ++j) {
    const int o = kCdRef + kCdPer * j, q = kCiPer * j;
    const double* l = DL + o;
    const double* r = DR + o;
    double* d = D + o;
    d[kCdAbsMax] = cmp_nanmax(l[kCdAbsMax], r[kCdAbsMax]);
    d[kCdAbsSum] = l[kCdAbsSum] + r[kCdAbsSum];
    d[kCdRelMax] = cmp_nanmax(l[kCdRelMax], r[kCdRelMax]);
    d[kCdSqSum] = l[kCdSqSum] + r[kCdSqSum];
    d[kCdUeSum] = l[kCdUeSum] + r[kCdUeSum];
    d[kCdApart] = r[kCdApart] > l[kCdApart] ? r[kCdApart] : l[kCdApart];
    const bool take_r =
        !(l[kCdUeMax] != l[kCdUeMax]) && (r[kCdUeMax] != r[kCdUeMax] || r[kCdUeMax] > l[kCdUeMax]);
    d[kCdUeMax] = take_r ? r[kCdUeMax] : l[kCdUeMax];
    I[q + kCiUeArg] = take_r ? IR[q + kCiUeArg] : IL[q + kCiUeArg];
    I[q + kCiOk] = IL[q + kCiOk] + IR[q + kCiOk];
    I[q + kCiMism] = IL[q + kCiMism] + IR[q + kCiMism];
    I[q + kCiNanMism] = IL[q + kCiNanMism] + IR[q + kCiNanMism];
    I[q + kCiApart] = IR[q + kCiApart] > IL[q + kCiApart] ? IR[q + kCiApart] : IL[q + kCiApart];
    I[q + kCiNan] = IL[q + kCiNan] | IR[q + kCiNan];
    I[q + kCiNotClose] = IL[q + kCiNotClose] + IR[q + kCiNotClose];
  }
}

}  // namespace cl
