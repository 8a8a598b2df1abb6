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
// f = the result's metric format: x's own, or one the caller names (drift measures fp32
// register values in ulps of the node's dtype); ulp(r) as ex_ulp):
//   abs error    both NaN ? 0 : |x - r|          (max propagates NaN; summed)
//   rel error    r == 0 ? (err == 0 ? 0 : inf) : err / |r|
//   squared      (x - r)^2                       (summed: RMSE)
//   ulp error    ex_ulp_error (summed; its maximum and first arg-maximum, NaN counts largest)
//   correctly rounded   round(x to f) == round(r to f) (castlab's conversion, core/convert.h;
//                x itself where f is x's format, unless drift), NaN == NaN, +0 == -0
//   vs b         mismatch: ex_differ; NaN mismatch: exactly one NaN; same dtype: ulps apart
//                (ordinal distance of the bit patterns; both NaN 0, one NaN -1); other
//                dtypes: the coarser one's ulp error at the finer one, NaN skipped; not
//                close: torch.isclose(b, x, rtol=tol, atol=tol) false, computed in the
//                dtype as PyTorch does (16-bit: each op in fp32, rounded); these three
//                use x's own format
//   union        (one count for all results, drift only) the elements where some result
//                differs from the first (ex_differ)
// Under drift's definitions the absolute and relative errors, the distances between
// results and the isclose counts are not computed (left at their starting values).
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
// after the per-result int64s: the union count

struct CmpParams {
  const void* x[kCmpMaxResults];  // contiguous results, n elements each
  int code[kCmpMaxResults];       // their dtype codes (core/convert.h)
  int fmt[kCmpMaxResults];        // the formats their ulps and rounding are measured in
  int drift;  // drift's definitions: correctly rounded compares round(x to f), not x, also
              // in x's own format (they differ for fp8, whose conversion saturates: inf ->
              // the largest), and the union count is made (another pass over the results)
  int nres;
  const void* ref;  // contiguous reference, or null
  int ref_code;
  double tol;  // the same() tolerance (isclose's rtol and atol)
  int64_t n;
};

CL_HD int cmp_nd(int nres) { return kCdRef + kCdPer * nres; }
CL_HD int cmp_ni(int nres) { return kCiPer * nres + 1; }
CL_HD int cmp_union(int nres) { return kCiPer * nres; }

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
  return code == kFloat64 ? f64_from_bits(bits) : ex_value((uint32_t)bits, code);
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
// ulps apart of two encodings of one format, given their NaN tests: both NaN 0, one NaN -1
CL_HD int64_t cmp_ulps_apart_nan(uint64_t a, uint64_t b, bool an, bool bn, int width) {
  return (an && bn) ? 0 : (an != bn) ? -1 : cmp_ulps_apart(a, b, width);
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
// On the host a leaf keeps in buffers the reference's values, its ulp factor and correctly
// rounded value per metric format, and each result's summed quantities (each element's
// costly parts once); a GPU thread, whose local memory is dear, recomputes them. Same
// values either way.
#ifdef __CUDA_ARCH__
constexpr int64_t kCmpBuf = 1;
#else
constexpr int64_t kCmpBuf = kRedPairwiseBlock;
#endif
enum CmpSum : int { kSumRefSq, kSumAbs, kSumSq, kSumUlp };
namespace {
struct CmpSummand {
  const CmpParams* P;
  int j;  // the result (not read for kSumRefSq)
  int kind;
  int64_t lo;
  const double* rbuf;  // the reference's values (host), or null
  const double* vbuf;  // the summed values themselves, kept by the leaf's pass (host), or null
  CL_HD_METHOD double operator[](int64_t i) const {
    if (vbuf) return vbuf[i];
    const double r = rbuf ? rbuf[i] : cmp_load(P->ref, P->ref_code, lo + i);
    if (kind == kSumRefSq) return r * r;
    const double x = cmp_load(P->x[j], P->code[j], lo + i);
    if (kind == kSumSq) return (x - r) * (x - r);
    if (kind == kSumUlp) return ex_ulp_error(x, r, ex_format(P->fmt[j]));
    return (x != x && r != r) ? 0.0 : ex_abs(x - r);
  }
};
}  // namespace

// The statistics of the leaf [lo, lo + m) (m <= kRedPairwiseBlock) into D (cmp_nd doubles)
// and I (cmp_ni): the sums are NumPy's pairwise block sums (red_pairwise_block), the maxima
// and counts one pass in index order (the first worst element wins).
CL_HD void cmp_leaf(const CmpParams& P, int64_t lo, int64_t m, double* D, int64_t* I) {
  const bool has_ref = P.ref != nullptr;
  const bool buf = kCmpBuf > 1;
  const int bcode = P.code[0];
  const ExFormat bf = ex_format(bcode);
  double rv[kCmpBuf], ue_v[kCmpBuf], sq_v[kCmpBuf], abs_v[kCmpBuf];
  // per metric format (cached while the results share it): the reference's ulp factor and
  // its correctly rounded value
  double fac[kCmpBuf], crr[kCmpBuf];
  int cached_fc = -1;
  double amax = -cmp_inf();  // the reference's largest finite magnitude
  for (int64_t i = 0; has_ref && i < m; ++i) {
    const double r = cmp_load(P.ref, P.ref_code, lo + i);
    if (buf) rv[i] = r;
    const double a = ex_abs(r);
    if (a - a == 0.0 && a > amax) amax = a;
  }
  const double* rb = has_ref && buf ? rv : nullptr;
  D[kCdRefSq] =
      has_ref ? red_pairwise_block<double>(CmpSummand{&P, 0, kSumRefSq, lo, rb, nullptr}, m) : 0.0;
  D[kCdRefAbsMax] = amax;
  int64_t uni = 0;
  for (int64_t i = 0; P.drift && P.nres > 1 && i < m; ++i) {
    const double b = cmp_load(P.x[0], bcode, lo + i);
    bool d = false;
    for (int j = 1; j < P.nres && !d; ++j) d = ex_differ(cmp_load(P.x[j], P.code[j], lo + i), b);
    uni += d ? 1 : 0;
  }
  I[cmp_union(P.nres)] = uni;
  for (int j = 0; j < P.nres; ++j) {
    const int code = P.code[j], fc = P.fmt[j];
    const ExFormat f = ex_format(code), mf = ex_format(fc);
    // x in its own format rounds to itself but under fp8's saturation (inf -> the largest)
    const bool round_x = fc != code || (P.drift && f.bits == 8);
    if (buf && has_ref && fc != cached_fc) {
      for (int64_t i = 0; i < m; ++i) {
        const double r = rv[i];
        fac[i] = ex_ulp_factor(r, mf);
        crr[i] = round_f64_to(r, fc, kNearestEven, true, 0);
      }
      cached_fc = fc;
    }
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
        const double r = buf ? rv[i] : cmp_load(P.ref, P.ref_code, k);
        if (buf) sq_v[i] = (x - r) * (x - r);
        if (!P.drift) {  // drift reads none of the absolute and relative errors
          const double err = (xn && r != r) ? 0.0 : ex_abs(x - r);
          if (buf) abs_v[i] = err;
          abs_max = cmp_nanmax(abs_max, err);
          rel_max =
              cmp_nanmax(rel_max, r == 0.0 ? (err == 0.0 ? 0.0 : cmp_inf()) : err / ex_abs(r));
        }
        // ex_ulp_error, with the leaf's cached factor on the host
        const double ue =
            ex_error(x, r, r != r, ex_abs(r) == cmp_inf(), buf ? fac[i] : ex_ulp_factor(r, mf), mf);
        if (buf) ue_v[i] = ue;
        if (!(ue_max != ue_max) && (ue != ue || ue > ue_max)) {
          ue_max = ue;
          ue_arg = k;
        }
        const double xr = round_x ? round_f64_to(x, fc, kNearestEven, true, 0) : x;
        const double rr = buf ? crr[i] : round_f64_to(r, fc, kNearestEven, true, 0);
        ok += ex_differ(rr, xr) ? 0 : 1;
      }
      if (j > 0) {
        const uint64_t bb = cmp_bits(P.x[0], bcode, k);
        const double b = cmp_value(bb, bcode);
        const bool bn = b != b;
        mism += ex_differ(x, b) ? 1 : 0;
        nan_mism += xn != bn ? 1 : 0;
        if (P.drift) continue;  // nor the distances between results
        if (code == bcode) {
          const int64_t dist = cmp_ulps_apart_nan(xb, bb, xn, bn, f.bits);
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
      if (!P.drift)
        d[kCdAbsSum] = red_pairwise_block<double>(
            CmpSummand{&P, j, kSumAbs, lo, rb, buf ? abs_v : nullptr}, m);
      d[kCdSqSum] =
          red_pairwise_block<double>(CmpSummand{&P, j, kSumSq, lo, rb, buf ? sq_v : nullptr}, m);
      d[kCdUeSum] =
          red_pairwise_block<double>(CmpSummand{&P, j, kSumUlp, lo, rb, buf ? ue_v : nullptr}, m);
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
  I[cmp_union(nres)] = IL[cmp_union(nres)] + IR[cmp_union(nres)];
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

// ---- near ties (castlab.numerics.near_ties, python/castlab/numerics/_ties.py) ----
// The signed distance of |r| from the nearest rounding midpoint of format f, in ulps of f at
// |r| (positive: above the midpoint in magnitude): t = |r| / ulp(r) (exact), minus its floor,
// minus 1/2. NaN for NaN, infinite and beyond-the-largest-finite (fmax) values. *in: within
// `within` ulps of the midpoint, the exact values (t == 0) excepted.
CL_HD double tie_distance(double r, const ExFormat& f, double fmax, double within, bool* in) {
  const double a = ex_abs(r);
  *in = false;
  if (!(a <= fmax)) return f64_from_bits(0x7FF8000000000000ull);  // no midpoint
  const double q = ex_in_ulps(a, ex_ulp_factor(a, f), f);
  const double t = q - trunc_d(q);
  const double d = t - 0.5;
  *in = ex_abs(d) <= within && t != 0.0;
  return d;
}

// numerics.ulp_error and ulp_diff, element i (python/castlab/numerics/_formats.py):
// x's ulp error against r in format f (ex_ulp_error), and the distance of two encodings of
// one format in representable values (NaN vs NaN 0; NaN vs a number -1, *nan_mismatch).
CL_HD double ulp_error_at(const void* x, int xcode, const void* r, int rcode, int64_t i,
                          const ExFormat& f) {
  return ex_ulp_error(cmp_load(x, xcode, i), cmp_load(r, rcode, i), f);
}
CL_HD int64_t ulp_diff_at(const void* a, const void* b, int code, int64_t i, bool* nan_mismatch) {
  const uint64_t ab = cmp_bits(a, code, i), bb = cmp_bits(b, code, i);
  const double av = cmp_value(ab, code), bv = cmp_value(bb, code);
  const bool an = av != av, bn = bv != bv;
  *nan_mismatch = an != bn;
  return cmp_ulps_apart_nan(ab, bb, an, bn, ex_format(code).bits);
}

// NearTies.mismatch_rate's counts over [lo, hi): tc[0] mismatches inside the set, tc[1] the
// set's size, tc[2] all mismatches (ex_differ: NaN equals NaN, +0 equals -0).
CL_HD void tie_split_range(const void* a, int acode, const void* b, int bcode, const uint8_t* mask,
                           int64_t lo, int64_t hi, int64_t* tc) {
  for (int64_t i = lo; i < hi; ++i) {
    const bool m = mask[i] != 0;
    const bool d = ex_differ(cmp_load(a, acode, i), cmp_load(b, bcode, i));
    tc[0] += (d && m) ? 1 : 0;
    tc[1] += m ? 1 : 0;
    tc[2] += d ? 1 : 0;
  }
}

}  // namespace cl
