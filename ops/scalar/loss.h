// nll_loss's reduction over the rows, in PyTorch's orders: one header for the CPU and
// (embedded verbatim) for NVRTC, so both devices give the same bits for either order.
//
// The rows' gathered values x[b] = input[b, target[b]] and weights w[b] = weight[target[b]]
// (in the input's storage format), the targets t[b]. A row whose target is ignore_index
// adds nothing. Two values come out: the loss (the sum of -w x, or that over the total
// weight for "mean") and the total weight (what PyTorch saves for the backward), both in
// the input's format.
//
//   torch_cpu  (aten/src/ATen/native/LossNLL.cpp, nll_loss_out_frame): scalar_t arithmetic,
//              each operation rounded to the input's format (c10::BFloat16 / Half); a cascade
//              of 8 partial sums: row b's term into level 0, then levels j -> j+1 while the
//              (4j .. 4j+3) bits of b are zero (b = 0 pushes to the top); an ignored row skips
//              that step too. Unweighted, the total weight is the count converted to the
//              format (rounded in bf16/fp16); mean divides in the format.
//   torch_cuda (aten/src/ATen/native/cuda/Loss.cu, nll_loss_forward_reduce_cuda_kernel_2d):
//              one block of T = clamp(2^round(log2(N / 16)), 32, 1024) threads; thread k sums
//              rows k, k + T, ... in the accumulate type (fp32; fp64 for fp64): `sh -= x * w`
//              (the product in scalar_t: rounded in bf16/fp16, fused into an fma by nvcc in
//              fp32/fp64), `acc += w`; then a shared-memory tree (offsets T/2 .. 1); mean
//              divides the sums in the accumulate type (the exact count), then rounds; the
//              total weight is the weight sum rounded to the format.
#pragma once
#include "core/cl_defs.h"
#include "core/convert.h"

namespace cl {

enum NllOrder : int { kNllTorchCpu = 0, kNllTorchCuda = 1 };
enum NllReduction : int { kNllSum = 1, kNllMean = 2 };

struct NllPlan {
  int order = kNllTorchCpu;
  int reduction = kNllMean;
  int fmt = kFloat32;  // the input's storage format (DTypeCode)
  int has_w = 0;
  int64_t n = 0;
  int64_t ignore_index = -100;
  int64_t threads = 32;  // torch_cuda: the block's threads
};

// Rounded to the input's format (scalar_t arithmetic): bf16 / fp16 round, fp32 / fp64 keep.
template <typename A>
CL_HD A nll_round(A v, int fmt) {
  if (fmt == kBFloat16 || fmt == kFloat16)
    return static_cast<A>(round_f32_to(static_cast<float>(v), fmt, kNearestEven, false, 0));
  return v;
}

CL_HD float nll_fma(float a, float b, float c) { return fma_f(a, b, c); }
CL_HD double nll_fma(double a, double b, double c) { return fma_d(a, b, c); }

// Loss.cu's nll_loss_threads(N): 2^round(log2(N / 16)) (integer division first) in [32, 1024];
// N < 16 gives log2(0) = -inf, which the launch clamps to 32.
CL_HD int64_t nll_cuda_threads(int64_t n) {
  const int64_t q = n / 16;
  if (q <= 0) return 32;
  int64_t lo = 0;
  while ((int64_t(1) << (lo + 1)) <= q) ++lo;  // floor(log2 q)
  // round(log2 q): up when q >= 2^(lo + 0.5), i.e. q^2 >= 2^(2 lo + 1)
  const double qq = static_cast<double>(q);
  const int64_t e = (qq * qq >= static_cast<double>(int64_t(1) << (2 * lo + 1))) ? lo + 1 : lo;
  const int64_t t = e >= 11 ? 2048 : (int64_t(1) << e);
  return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

// The CPU order: out[0] = the loss, out[1] = the total weight (both in the format).
template <typename A, typename X, typename W, typename Tg>
CL_HD void nll_cpu(const NllPlan& P, X x, W w, Tg t, A* out) {
  A lp[8], wp[8];
  for (int j = 0; j < 8; ++j) lp[j] = wp[j] = A(0);
  const int64_t n = P.n;
  int lg = 1;  // utils::CeilLog2(n)
  if (n > 2) {
    lg = 0;
    uint64_t y = static_cast<uint64_t>(n - 1);
    while (y) {
      ++lg;
      y >>= 1;
    }
  }
  const int lpow = lg / 8 > 4 ? lg / 8 : 4;
  const int64_t mask = (int64_t(1) << lpow) - 1;
  int64_t ignored = 0;
  for (int64_t b = 0; b < n; ++b) {
    if (t[b] == P.ignore_index) {
      ++ignored;
      continue;
    }
    const A xv = static_cast<A>(x[b]);
    if (P.has_w) {
      const A wv = static_cast<A>(w[b]);
      lp[0] = nll_round(lp[0] - nll_round(xv * wv, P.fmt), P.fmt);
      wp[0] = nll_round(wp[0] + wv, P.fmt);
    } else {
      lp[0] = nll_round(lp[0] - xv, P.fmt);
    }
    for (int j = 0; j + 1 < 8; ++j) {
      if ((b & (mask << (j * lpow))) != 0) break;
      wp[j + 1] = nll_round(wp[j + 1] + wp[j], P.fmt);
      lp[j + 1] = nll_round(lp[j + 1] + lp[j], P.fmt);
      wp[j] = A(0);
      lp[j] = A(0);
    }
  }
  A tw = A(0), loss = A(0);
  if (P.has_w) {
    for (int j = 0; j < 8; ++j) tw = nll_round(tw + wp[j], P.fmt);
  } else {  // static_cast<scalar_t>(int64): to float (double for fp64), then to the format
    tw = sizeof(A) == 8 ? static_cast<A>(n - ignored)
                        : nll_round(static_cast<A>(static_cast<float>(n - ignored)), P.fmt);
  }
  for (int j = 0; j < 8; ++j) loss = nll_round(loss + lp[j], P.fmt);
  if (P.reduction == kNllMean) loss = nll_round(loss / tw, P.fmt);
  out[0] = loss;
  out[1] = tw;
}

// The CUDA order, thread k's two partial sums (the loss's, the weight's).
template <typename A, typename X, typename W, typename Tg>
CL_HD void nll_cuda_thread(const NllPlan& P, X x, W w, Tg t, int64_t k, A* sh, A* aw) {
  A s = A(0), a = A(0);
  for (int64_t i = k; i < P.n; i += P.threads) {
    if (t[i] == P.ignore_index) continue;
    const A xv = static_cast<A>(x[i]);
    const A cw = P.has_w ? static_cast<A>(w[i]) : A(1);
    if (P.fmt == kBFloat16 || P.fmt == kFloat16)
      s = s - nll_round(xv * cw, P.fmt);  // the scalar_t product rounds, the sum does not
    else
      s = nll_fma(-xv, cw, s);  // nvcc contracts sh - x * w
    a = a + cw;
  }
  *sh = s;
  *aw = a;
}

// One level of the block's tree: partial k (< stride) adds partial k + stride.
template <typename A>
CL_HD void nll_cuda_tree_step(A* sh, A* aw, int64_t k, int64_t stride) {
  sh[k] = sh[k] + sh[k + stride];
  aw[k] = aw[k] + aw[k + stride];
}

// The two results from the tree's root.
template <typename A>
CL_HD void nll_cuda_finish(const NllPlan& P, const A* sh, const A* aw, A* out) {
  out[1] = nll_round(aw[0], P.fmt);
  out[0] = nll_round(P.reduction == kNllMean ? sh[0] / aw[0] : sh[0], P.fmt);
}

// The block's tree over T partials (in place) and the two results, on one thread (the
// GPU kernel runs each level on `stride` threads: the same additions).
template <typename A>
CL_HD void nll_cuda_combine(const NllPlan& P, A* sh, A* aw, A* out) {
  for (int64_t stride = P.threads / 2; stride > 0; stride >>= 1)
    for (int64_t k = 0; k < stride; ++k) nll_cuda_tree_step(sh, aw, k, stride);
  nll_cuda_finish(P, sh, aw, out);
}

}  // namespace cl
