// castlab.numerics.compare's metrics, computed by castlab's own code on the CPU and (embedded
// verbatim for NVRTC) on the GPU: one header, so both devices give the same numbers, and the
// same numbers as the NumPy definitions in python/castlab/numerics/_metrics.py (`scan`).
//
// The work splits like NumPy's pairwise summation (ops/scalar/reduce.h: red_pairwise_block,
// red_pairwise_half): the flattened tensors are cut into the leaves of NumPy's halving tree.
// cmp_leaf computes one leaf's statistics (its pairwise block sums, maxima, counts, the first
// worst element); cmp_combine joins two neighbouring subtrees (left + right for the sums, as
// NumPy adds them). Combined up the tree, every sum is the one np.add.reduce gives on the
// whole array, and the maxima and counts are those of the plain definitions. The ulp helpers
// are the exhaustive statistics' (ops/scalar/exhaustive.h).
//
// Per-element definitions (x a result, b the first result, r the reference, all as fp64;
// f = x's format; ulp(r) as ex_ulp):
//   abs error    both NaN ? 0 : |x - r|          (max propagates NaN; summed)
//   rel error    r == 0 ? (err == 0 ? 0 : inf) : err / |r|
//   squared      (x - r)^2                       (summed: RMSE)
//   ulp error    ex_ulp_error (summed; its maximum and first arg-maximum, NaN counts largest)
//   correctly rounded   x == round(r to f) (castlab's conversion, core/convert.h), NaN == NaN
//   vs b         mismatch: ex_differ; NaN mismatch: exactly one NaN; same dtype: ulps apart
//                (ordinal distance of the bit patterns; both NaN 0, one NaN -1); other
//                dtypes: the coarser one's ulp error at the finer one, NaN skipped; not
//                close: torch.isclose(b, x, rtol=tol, atol=tol) false, computed in the
//                dtype as PyTorch does (16-bit: each op in fp32, rounded)
#pragma once
#include "core/convert.h"
#include "ops/scalar/exhaustive.h"
#include "ops/scalar/reduce.h"

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
CL_HD float cmp_absf(float x) { return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu); }
// NumPy's maximum: NaN propagates.
CL_HD double cmp_nanmax(double a, double b) {
  return (a != a || b != b) ? f64_from_bits(0x7FF8000000000000ull) : (b > a ? b : a);
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
  return code == kFloat64 ? f64_from_bits(bits) : bits_to_f64((uint32_t)bits, code);
}
CL_HD double cmp_load(const void* a, int code, int64_t i) {
  return cmp_value(cmp_bits(a, code, i), code);
}
// ulp_diff: distance of two bit patterns of one format (NaN handled by the caller),
// saturated at 2^63 - 1 (fp64 values of opposite signs).
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
    const double err = ex_abs(b - x);
    return err - err == 0.0 && err <= ex_abs(x * tol) + tol;
  }
  if (ex_format(code).bits == 8) return false;
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

// The summed quantities of element lo + i, as reduce.h's pairwise sums read them (a[i]).
enum CmpSum : int { kSumRefSq, kSumAbs, kSumSq, kSumUlp };
namespace {
struct CmpSummand {
  const CmpParams* P;
  int j;  // the result (not read for kSumRefSq)
  int kind;
  int64_t lo;
  CL_HD_METHOD double operator[](int64_t i) const {
    const double r = cmp_load(P->ref, P->ref_code, lo + i);
    if (kind == kSumRefSq) return r * r;
    const double x = cmp_load(P->x[j], P->code[j], lo + i);
    if (kind == kSumSq) return (x - r) * (x - r);
    if (kind == kSumUlp) return ex_ulp_error(x, r, ex_format(P->code[j]));
    return (x != x && r != r) ? 0.0 : ex_abs(x - r);
  }
};
}  // namespace

// The statistics of the leaf [lo, lo + m) (m <= kRedPairwiseBlock) into D (cmp_nd doubles)
// and I (cmp_ni): the sums are NumPy's pairwise block sums (red_pairwise_block), the maxima
// and counts one pass in index order (the first worst element wins).
CL_HD void cmp_leaf(const CmpParams& P, int64_t lo, int64_t m, double* D, int64_t* I) {
  const bool has_ref = P.ref != nullptr;
  const int bcode = P.code[0];
  const ExFormat bf = ex_format(bcode);
  D[kCdRefSq] = has_ref ? red_pairwise_block<double>(CmpSummand{&P, 0, kSumRefSq, lo}, m) : 0.0;
  double amax = -cmp_inf();  // the reference's largest finite magnitude
  for (int64_t i = 0; has_ref && i < m; ++i) {
    const double a = ex_abs(cmp_load(P.ref, P.ref_code, lo + i));
    if (a - a == 0.0 && a > amax) amax = a;
  }
  D[kCdRefAbsMax] = amax;
  for (int j = 0; j < P.nres; ++j) {
    const int code = P.code[j];
    const ExFormat f = ex_format(code);
    double* d = D + kCdRef + kCdPer * j;
    int64_t* c = I + kCiPer * j;
    double abs_max = -cmp_inf(), rel_max = -cmp_inf(), ue_max = -cmp_inf(), apart_f = -cmp_inf();
    int64_t ue_arg = -1, ok = 0, mism = 0, nan_mism = 0, notclose = 0, has_nan = 0;
    int64_t apart_i = j == 0 ? 0 : -0x7FFFFFFFFFFFFFFFll - 1;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t k = lo + i;
      const uint64_t xb = cmp_bits(P.x[j], code, k);
      const double x = cmp_value(xb, code);
      const bool xn = x != x;
      has_nan |= xn ? 1 : 0;
      if (has_ref) {
        const double r = cmp_load(P.ref, P.ref_code, k);
        const double err = (xn && r != r) ? 0.0 : ex_abs(x - r);
        abs_max = cmp_nanmax(abs_max, err);
        rel_max = cmp_nanmax(rel_max, r == 0.0 ? (err == 0.0 ? 0.0 : cmp_inf()) : err / ex_abs(r));
        const double ue = ex_ulp_error(x, r, f);
        if (!(ue_max != ue_max) && (ue != ue || ue > ue_max)) {
          ue_max = ue;
          ue_arg = k;
        }
        ok += ex_differ(round_f64_to(r, code, kNearestEven, true, 0), x) ? 0 : 1;
      }
      if (j > 0) {
        const uint64_t bb = cmp_bits(P.x[0], bcode, k);
        const double b = cmp_value(bb, bcode);
        const bool bn = b != b;
        mism += ex_differ(x, b) ? 1 : 0;
        nan_mism += xn != bn ? 1 : 0;
        if (code == bcode) {
          const int64_t dist = (xn && bn) ? 0 : (xn != bn) ? -1 : cmp_ulps_apart(xb, bb, f.bits);
          if (dist > apart_i) apart_i = dist;
          notclose += cmp_isclose(b, x, code, P.tol) ? 0 : 1;
        } else {  // the coarser format's ulp error at the finer value
          const double e = f.p <= bf.p ? ex_ulp_error(x, b, f) : ex_ulp_error(b, x, bf);
          if (!(e != e) && e > apart_f) apart_f = e;
        }
      }
    }
    d[kCdAbsMax] = abs_max;
    d[kCdRelMax] = rel_max;
    d[kCdUeMax] = ue_max;
    d[kCdApart] = apart_f;
    d[kCdAbsSum] = d[kCdSqSum] = d[kCdUeSum] = 0.0;
    if (has_ref) {
      d[kCdAbsSum] = red_pairwise_block<double>(CmpSummand{&P, j, kSumAbs, lo}, m);
      d[kCdSqSum] = red_pairwise_block<double>(CmpSummand{&P, j, kSumSq, lo}, m);
      d[kCdUeSum] = red_pairwise_block<double>(CmpSummand{&P, j, kSumUlp, lo}, m);
    }
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
