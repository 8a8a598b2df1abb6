// A row's mean and M2 (the sum of squared deviations from the mean) as PyTorch's Welford
// kernels compute them: the statistics of var and layer_norm under the torch orders.
// Included by ops/scalar/reduce.h (after RedPlan and the cascade sum); like it, compiled
// into the CPU executor and embedded verbatim for NVRTC, so both devices give the same bits.
//
// Kinds kRedMean and kRedM2 pick which statistic a reduce step returns; the order names
// the kernel (docs/torch_reductions.md §1.1, §3 and §4.4 have the sources):
//   torch_cpu   WelfordOps in one pass (ATen's CPU var kernel, std_var_kernel_impl:
//               binary_kernel_reduce, the accumulator in double), no fused multiply-add
//   cpu_moments RowwiseMoments (aten/src/ATen/native/cpu/moments_utils.h; the CPU
//               layer_norm kernel): per-lane Welford over chunks of 16 vectors, merged in a
//               binary-counter stack, a scalar tail, then the lanes in order
//   torch_cuda  WelfordOps in Reduce.cuh (ATen's CUDA var kernel, vt0 = 2): the launch
//               configuration of the sums, each thread's Welford states combined by the
//               same trees
//   cuda_layer_norm_vec    vectorized_layer_norm_kernel (layer_norm_kernel.cu): 32 x 4
//               threads, 4-element vectors, reciprocal-then-multiply updates
//   cuda_layer_norm_block  RowwiseMomentsCUDAKernel: 512 threads, WelfordOps, BlockReduce
// Where the kernels' compilers contract a*b + c into one fma (nvcc's default --fmad=true,
// read in NVRTC's PTX of the same expressions; GCC on the AVX2 build, measured against
// torch 2.13), the code here says fma explicitly; castlab itself never contracts.
//
// The serial orders (torch_cpu, cpu_moments) have one part: the whole row. The parallel
// ones have three parts per emulated thread (its state's mean, M2 and count), computed in
// parallel on the GPU; red_combine then runs the kernel's combination tree on them.
#pragma once
#include "core/cl_defs.h"

namespace cl {

template <typename T>
struct Moments {
  T mean, m2, nf;  // nf: the count, in T as the kernels keep it
};

CL_HD float mom_fma(float a, float b, float c) { return fma_f(a, b, c); }
CL_HD double mom_fma(double a, double b, double c) { return fma_d(a, b, c); }

// a * b + c, fused or with two roundings
template <typename T>
CL_HD T mom_madd(T a, T b, T c, bool fused) {
  return fused ? mom_fma(a, b, c) : a * b + c;
}

// WelfordOps::reduce (SharedReduceOps.h): the count as an integer, a true division; on the
// GPU nvcc fuses the M2 update (m2 + delta * (x - mean')).
template <typename T>
CL_HD Moments<T> mom_welford_add(Moments<T> s, int64_t* count, T x, bool fused) {
  *count += 1;
  const T nf = static_cast<T>(*count);
  const T delta = x - s.mean;
  const T mean = s.mean + delta / nf;
  return {mean, mom_madd(delta, x - mean, s.m2, fused), nf};
}

// WelfordOps::combine(a, b) as nvcc compiles it: mean = fma(delta, nb / n, a.mean),
// m2 = fma(delta * delta * a.nf, nb / n, a.m2 + b.m2).
template <typename T>
CL_HD Moments<T> mom_welford_combine(Moments<T> a, Moments<T> b) {
  if (a.nf == T(0)) return b;
  if (b.nf == T(0)) return a;
  const T delta = b.mean - a.mean;
  const T n = a.nf + b.nf;
  const T nb_over_n = b.nf / n;
  return {mom_fma(delta, nb_over_n, a.mean), mom_fma(delta * delta * a.nf, nb_over_n, a.m2 + b.m2),
          n};
}

// ---- the CPU kernels ----
template <typename T, typename A>
CL_HD Moments<T> mom_welford_row(A v, int64_t n) {
  Moments<T> s{T(0), T(0), T(0)};
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) s = mom_welford_add(s, &count, static_cast<T>(v[i]), false);
  return s;
}

// AddMomentsVec: lanes (m1_add, m2_add) of count m0_add merged into (m1, m2) of count *m0;
// c = m0_add / n once for all lanes, m2 through fmadd (fused on FMA builds).
template <typename T>
CL_HD void mom_cpu_merge_lanes(int64_t m0_add, const T* m1_add, const T* m2_add, int64_t* m0, T* m1,
                               T* m2, int lanes, bool fused) {
  const int64_t n = *m0 + m0_add;
  const T c = n == 0 ? T(0) : static_cast<T>(m0_add) / static_cast<T>(n);
  for (int k = 0; k < lanes; ++k) {
    const T delta = m1_add[k] - m1[k];
    const T m2_sum = m2[k] + m2_add[k];
    const T c_delta = c * delta;
    const T m0_delta = delta * static_cast<T>(*m0);
    m1[k] = m1[k] + c_delta;
    m2[k] = mom_madd(m0_delta, c_delta, m2_sum, fused);
  }
  *m0 = n;
}

// RowwiseMoments of N elements. vec: elements per loaded vector (lanes, or 2 * lanes for
// bf16/fp16, whose vector converts to two float vectors, each its own chain within a
// chunk); lanes: float (8) or double (4) lanes of the AVX2 build (AVX512 machines run the
// same kernel: REGISTER_DISPATCH); fused: the build has FMA (AVX2; not the DEFAULT build);
// tail_fused: GCC fuses the scalar tail's M2 update too (measured: in the fp16 kernel, not
// in the fp32, fp64 and bf16 ones). Returns the mean and M2 (the variance is M2 / N).
template <typename T, typename A>
CL_HD Moments<T> mom_rowwise(A v, int64_t N, int64_t vec, int lanes, bool fused, bool tail_fused) {
  constexpr int kChunk = 16;
  const int64_t nvec = N / vec;
  const int64_t chunks = (nvec + kChunk - 1) / kChunk;
  const int depth = red_ceil_log2(chunks);
  int64_t m0s[64];
  T m1s[64][8], m2s[64][8];
  for (int d = 0; d < 64; ++d) {
    m0s[d] = 0;
    for (int k = 0; k < 8; ++k) m1s[d][k] = m2s[d][k] = T(0);
  }
  T recip[kChunk];  // c_vecs: 1 / (j + 1)
  for (int j = 0; j < kChunk; ++j) recip[j] = T(1) / static_cast<T>(j + 1);
  const int halves = static_cast<int>(vec / lanes);
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t m0 = nvec - i * kChunk < kChunk ? nvec - i * kChunk : kChunk;
    const int64_t base = i * kChunk * vec;
    for (int h = 0; h < halves; ++h) {  // UpdateMomentsVec
      T m1[8], m2[8];
      for (int k = 0; k < lanes; ++k) m1[k] = m2[k] = T(0);
      for (int64_t j = 0; j < m0; ++j)
        for (int k = 0; k < lanes; ++k) {
          const T x = static_cast<T>(v[base + j * vec + h * lanes + k]);
          const T delta = x - m1[k];
          m1[k] = mom_madd(recip[j], delta, m1[k], fused);
          m2[k] = mom_madd(delta, x - m1[k], m2[k], fused);
        }
      mom_cpu_merge_lanes(m0, m1, m2, &m0s[0], m1s[0], m2s[0], lanes, fused);
    }
    int64_t mask = i + 1;  // carry up the binary counter
    for (int d = 1; d < depth && (mask & 1) == 0; ++d) {
      mom_cpu_merge_lanes(m0s[d - 1], m1s[d - 1], m2s[d - 1], &m0s[d], m1s[d], m2s[d], lanes,
                          fused);
      m0s[d - 1] = 0;
      for (int k = 0; k < 8; ++k) m1s[d - 1][k] = m2s[d - 1][k] = T(0);
      mask >>= 1;
    }
  }
  for (int d = 1; d < depth; ++d)
    mom_cpu_merge_lanes(m0s[d], m1s[d], m2s[d], &m0s[0], m1s[0], m2s[0], lanes, fused);
  // the scalar tail, then the lanes (AddMoments: GCC fuses m1 += c * delta and
  // m2_add + delta * delta * c * m0)
  int64_t m0 = 0;
  T m1 = T(0), m2 = T(0);
  for (int64_t i = nvec * vec; i < N; ++i) {
    const T x = static_cast<T>(v[i]);
    const T delta = x - m1;
    ++m0;
    m1 = m1 + delta / static_cast<T>(m0);
    m2 = mom_madd(delta, x - m1, m2, tail_fused);
  }
  const int64_t m0_add = nvec * vec / lanes;
  for (int k = 0; k < lanes; ++k) {
    const int64_t n = m0 + m0_add;
    const T c = n == 0 ? T(0) : static_cast<T>(m0_add) / static_cast<T>(n);
    const T delta = m1s[0][k] - m1;
    m1 = mom_madd(c, delta, m1, fused);
    m2 = m2 + mom_madd(delta * delta * c, static_cast<T>(m0), m2s[0][k], fused);
    m0 = n;
  }
  return {m1, m2, static_cast<T>(N)};
}

// ---- the CUDA kernels: thread k's state ----
// Reduce.cuh with WelfordOps (P as red_cuda_part's: a, b = block, c = accumulators,
// d = vectorized, e = rows split across warps, f = CTAs per row).
template <typename T, typename A>
CL_HD Moments<T> mom_cuda_thread(const RedPlan& P, A v, int64_t n, int64_t row, int64_t k) {
  Moments<T> acc[8];
  int64_t cnt[8];
  for (int i = 0; i < 8; ++i) {
    acc[i] = Moments<T>{T(0), T(0), T(0)};
    cnt[i] = 0;
  }
  red_cuda_walk(P, v, n, row, k, [&](int i, T x) {
    acc[i] = mom_welford_add(acc[i], &cnt[i], static_cast<T>(x), true);
  });
  Moments<T> r = acc[0];
  for (int i = 1; i < P.c; ++i) r = mom_welford_combine(r, acc[i]);
  return r;
}

// cuWelfordOnlineSum (vectorized_layer_norm_kernel): the count in float, the reciprocal
// 1.f / count (correctly rounded), then nvcc's fmas.
template <typename T>
CL_HD Moments<T> mom_ln_add(Moments<T> s, T x) {
  const T delta = x - s.mean;
  const T count = s.nf + T(1);
  const T mean = mom_fma(delta, T(1) / count, s.mean);
  return {mean, mom_fma(delta, x - mean, s.m2), count};
}

// cuWelfordCombine(B = this thread's state, A = the other's) as nvcc compiles it:
// coef = 1 / count, mean = fma(A.mean, A.count * coef, B.mean * (B.count * coef)),
// sigma2 = fma(delta * delta * A.count, B.count * coef, A.sigma2 + B.sigma2).
template <typename T>
CL_HD Moments<T> mom_ln_combine(Moments<T> b, Moments<T> a) {
  const T delta = b.mean - a.mean;
  const T count = a.nf + b.nf;
  if (!(count > T(0))) return {T(0), T(0), count};
  const T coef = T(1) / count;
  const T na = a.nf * coef, nb = b.nf * coef;
  return {mom_fma(a.mean, na, b.mean * nb), mom_fma(delta * delta * a.nf, nb, a.m2 + b.m2), count};
}

// vectorized_layer_norm_kernel's thread k = x + 32 y of a (32, 4) block: vectors of 4
// elements k, k + 128, ...
template <typename T, typename A>
CL_HD Moments<T> mom_ln_vec_thread(A v, int64_t n, int64_t k) {
  Moments<T> s{T(0), T(0), T(0)};
  for (int64_t i = k; i < n / 4; i += 128)
    for (int ii = 0; ii < 4; ++ii) s = mom_ln_add(s, static_cast<T>(v[4 * i + ii]));
  return s;
}

// RowwiseMomentsCUDAKernel's thread k of 512: elements k, k + 512, ... (WelfordOps).
template <typename T, typename A>
CL_HD Moments<T> mom_ln_block_thread(A v, int64_t n, int64_t k) {
  Moments<T> s{T(0), T(0), T(0)};
  int64_t count = 0;
  for (int64_t j = k; j < n; j += 512) s = mom_welford_add(s, &count, static_cast<T>(v[j]), true);
  return s;
}

// ---- parts and their combination ----
template <typename T>
CL_HD Moments<T> mom_load(const T* p, int64_t k) {
  return {p[3 * k], p[3 * k + 1], p[3 * k + 2]};
}
template <typename T>
CL_HD void mom_store(T* p, int64_t k, Moments<T> s) {
  p[3 * k] = s.mean;
  p[3 * k + 1] = s.m2;
  p[3 * k + 2] = s.nf;
}

CL_HD bool mom_is_serial(int order) {
  return order == kOrdTorchCpu || order == kOrdCpuMoments || order == kOrdTriton;
}

// ---- Inductor's C++ Welford (the inductor_cpp order's mean and M2; cpp_prefix.h) ----
// Welford<T>: mean, m2, weight, and index (how many updates or combined states: one count
// for every lane of a vector state). CPU only: the GPU's reduce launch refuses it, and the
// device compile gets NaN (mom_inductor_cpp below).
#if !defined(__CUDA_ARCH__)
template <typename T>
struct IndWelford {
  T mean = T(0), m2 = T(0), weight = T(0);
  int64_t index = 0;
};

// welford_combine(a, b): the vector form (`vec`: blendv guards, delta 0 where the means are
// equal, 0 where the new weight is 0) or the scalar one (delta 0 for equal infinite means).
template <typename T>
CL_HD IndWelford<T> ind_combine(const IndWelford<T>& a, const IndWelford<T>& b, bool vec) {
  if (a.index == 0) return b;
  if (b.index == 0) return a;
  T delta = b.mean - a.mean;
  if (vec ? a.mean == b.mean : (std::isinf(a.mean) && a.mean == b.mean)) delta = T(0);
  const T w = a.weight + b.weight;
  T wb = b.weight / w;
  if (vec && w == T(0)) wb = T(0);
  IndWelford<T> r;
  r.mean = a.mean + delta * wb;
  r.m2 = a.m2 + b.m2 + delta * delta * a.weight * wb;
  r.weight = w;
  r.index = a.index + b.index;
  return r;
}

// One lane's state over its values v[i * R + pos], i0 <= i < i1, through a WelfordHelper
// made for N vectors: chunks of 4096 updates merged in a binary-counter stack, each update
// dividing by multiplying with the helper's reciprocal 1 / (index + 1) (in the lane's
// scalar type, from a double division); then the stack merged into the state.
template <typename T, typename A>
CL_HD IndWelford<T> ind_welford_run(A v, int64_t R, int64_t pos, int64_t i0, int64_t i1,
                                    int64_t N) {
  constexpr int64_t kChunk = 4096;
  const int64_t m = (N + kChunk - 1) / kChunk;
  int64_t depth = 0;
  while ((int64_t(1) << depth) < m) ++depth;
  IndWelford<T> stk[40];
  IndWelford<T> acc;
  int64_t chunks = 0;
  for (int64_t i = i0; i < i1; ++i) {
    if (depth > 0 && acc.index == kChunk) {
      stk[0] = ind_combine(stk[0], acc, true);
      ++chunks;
      acc = IndWelford<T>();
      int64_t mask = chunks;
      for (int64_t j = 1; j < depth && (mask & 1) == 0; ++j) {
        stk[j] = ind_combine(stk[j], stk[j - 1], true);
        stk[j - 1] = IndWelford<T>();
        mask >>= 1;
      }
    }
    const T x = T(v[i * R + pos]);
    const T delta = x - acc.mean;
    const T mean = acc.mean + delta * T(1.0 / static_cast<double>(acc.index + 1));
    acc.m2 = acc.m2 + delta * (x - mean);
    acc.mean = mean;
    acc.weight = acc.weight + T(1);
    acc.index += 1;
  }
  for (int64_t j = 0; j < depth; ++j) acc = ind_combine(acc, stk[j], true);
  return acc;
}
#endif

// A row's state as the generated kernel has it: P.a lanes (vectors of P.b floats: two
// halves where P.a = 2 P.b, Inductor's VectorizedN<float, 2>), each lane over the full
// vectors of its thread's share (P.g > 1: the row split over OpenMP threads as
// red_omp_lane splits it, the threads' states combined in thread order), the masked tail
// vector's lanes from an empty state; each vector state reduced by welford_vec_reduce_all
// (the two halves combined, then shuffle-down offsets 1, 2, 4 ...), and the scalar state
// combined with the tail's and then the full vectors'.
template <typename T, typename A>
CL_HD Moments<T> mom_inductor_cpp(const RedPlan& P, A v, int64_t n) {
#if defined(__CUDA_ARCH__)
  (void)P;
  (void)v;
  (void)n;
  const T nan = static_cast<T>(f64_from_bits(0x7FF8000000000000ull));
  return Moments<T>{nan, nan, nan};
#else
  const int64_t R = P.a, H = P.b, K = n / R, I = (n + R - 1) / R;
  const int64_t nt = P.g > 1 ? P.g : 1, per = (K + nt - 1) / nt;
  IndWelford<T> full[64], tail[64];
  for (int64_t pos = 0; pos < R; ++pos) {
    for (int64_t t = 0; t < nt; ++t) {
      int64_t s = 0, e = 0;
      omp_static_range(I, nt, t, &s, &e);
      const IndWelford<T> f = ind_welford_run<T>(v, R, pos, s, e < K ? e : K, nt > 1 ? per : K);
      IndWelford<T> m;  // the masked tail vector: one update of every lane's count, of the
      if (e > K && s <= K && K < I) {  // state only where the tail has an element
        if (K * R + pos < n) m = ind_welford_run<T>(v, R, pos, K, K + 1, 1);
        m.index = 1;
      }
      // (one thread: the states themselves; several: combined into the empty state in turn)
      full[pos] = t == 0 ? f : ind_combine(full[pos], f, true);
      tail[pos] = t == 0 ? m : ind_combine(tail[pos], m, true);
    }
  }
  auto reduce_all = [&](IndWelford<T>* w) {
    if (w[0].index == 0) return IndWelford<T>();
    if (R == 2 * H)
      for (int64_t l = 0; l < H; ++l) w[l] = ind_combine(w[l], w[l + H], true);
    // vec_shuffle_down(x, off): lane l takes lane l + off, but for float vectors under
    // AVX2/AVX512 (_mm256/_mm512_permute_ps with SHUFFLE_MASK(1, 1, 3, 3) and (2, 2, 2, 2),
    // read by imm order: measured against cpp_prefix.h built by GCC) lane 4k takes 4k + 3
    // and 4k + 2 takes 4k + 1 at offset 1. Only the lanes lane 0 depends on are combined.
    for (int64_t off = 1; off < H; off *= 2)
      for (int64_t l = 0; l + off < H; l += 2 * off) {
        const int64_t from = sizeof(T) == 4 && off == 1 ? (l % 4 == 0 ? l + 3 : l - 1) : l + off;
        w[l] = ind_combine(w[l], w[from], true);
      }
    IndWelford<T> r = w[0];
    r.index = static_cast<int64_t>(r.weight);
    return r;
  };
  IndWelford<T> acc = ind_combine(IndWelford<T>(), reduce_all(tail), false);
  acc = ind_combine(acc, reduce_all(full), false);
  return Moments<T>{acc.mean, acc.m2, acc.weight};
#endif
}

template <typename T>
CL_HD T mom_pick(int kind, Moments<T> s) {
  return kind == kRedMean ? s.mean : s.m2;
}

// ORDER (mom_part, mom_combine): the ReduceOrder where the kernel is generated for one (the
// GPU's kernels: only that order's code compiles, and the stack holds only its arrays; the
// CPU order's 64-level cascade is 11 KB a thread, which the driver reserves for every
// thread the GPU can hold), or -1: P.order, at run time.
template <int ORDER>
CL_HD int mom_order(const RedPlan& P) {
  return ORDER < 0 ? P.order : ORDER;
}

template <typename T, int ORDER = -1, typename A>
CL_HD T mom_part(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  const int order = mom_order<ORDER>(P);
  if (order == kOrdTorchCpu) return mom_pick(P.kind, mom_welford_row<T>(v, n));
  if (order == kOrdTriton) return mom_pick(P.kind, mom_inductor_cpp<T>(P, v, n));
  if (order == kOrdCpuMoments)
    return mom_pick(P.kind, mom_rowwise<T>(v, n, P.a, P.b, P.c != 0, P.d != 0));
  const int64_t k = t / 3;
  Moments<T> s;
  if (order == kOrdCudaLnVec)
    s = mom_ln_vec_thread<T>(v, n, k);
  else if (order == kOrdCudaLnBlock)
    s = mom_ln_block_thread<T>(v, n, k);
  else
    s = mom_cuda_thread<T>(P, v, n, row, k);
  const int64_t c = t % 3;
  return c == 0 ? s.mean : (c == 1 ? s.m2 : s.nf);
}

// Reduce.cuh's block reduction of states (red_cuda_block's trees, WelfordOps::combine with
// the lower thread's state first).
template <typename T>
CL_HD Moments<T> mom_cuda_block(T* p, int64_t bw, int64_t bh, bool y_reduce) {
  const int64_t rows = y_reduce ? bh : 1;
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t off = bw / 2; off > 0; off >>= 1)
      for (int64_t x = 0; x < off; ++x)
        mom_store(p, bw * y + x,
                  mom_welford_combine(mom_load(p, bw * y + x), mom_load(p, bw * y + x + off)));
  if (y_reduce)
    for (int64_t off = bh / 2; off > 0; off >>= 1)
      for (int64_t y = 0; y < off; ++y)
        mom_store(p, bw * y, mom_welford_combine(mom_load(p, bw * y), mom_load(p, bw * (y + off))));
  return mom_load(p, 0);
}

template <typename T>
CL_HD Moments<T> mom_cuda_combine(const RedPlan& P, T* p) {
  const int64_t bw = P.a, bh = P.b, ctas = P.f, nt = bw * bh;
  const bool y_reduce = P.e != 0;
  if (ctas <= 1) return mom_cuda_block(p, bw, bh, y_reduce);
  // each CTA's block result, then thread t of the last CTA takes CTAs t, t + nt, ...
  for (int64_t c = 0; c < ctas; ++c)
    mom_store(p, c * nt, mom_cuda_block(p + 3 * c * nt, bw, bh, y_reduce));
  for (int64_t t = 0; t < nt; ++t) {
    Moments<T> acc{T(0), T(0), T(0)};
    for (int64_t c = t; c < ctas; c += nt) acc = mom_welford_combine(acc, mom_load(p, c * nt));
    mom_store(p, t, acc);  // t <= c * nt: each partial is read before it is overwritten
  }
  return mom_cuda_block(p, bw, bh, y_reduce);
}

// BlockReduce (block_reduce.cuh) of 512 threads: each warp's shfl_down tree (16 .. 1),
// then warp 0 over the 16 warp results (lanes 16..31 hold the identity).
template <typename T>
CL_HD Moments<T> mom_warp_tree(T* p, int64_t first) {
  for (int off = 16; off > 0; off >>= 1)
    for (int l = 0; l < off; ++l)
      mom_store(p, first + l,
                mom_welford_combine(mom_load(p, first + l), mom_load(p, first + l + off)));
  return mom_load(p, first);
}

template <typename T, int ORDER = -1>
CL_HD T mom_combine(const RedPlan& P, T* p) {
  const int order = mom_order<ORDER>(P);
  if (mom_is_serial(order)) return p[0];
  Moments<T> s;
  if (order == kOrdCudaLnVec) {
    // each warp's shfl_down tree, then warps y + 2 into y (y < 2) and warp 1 into 0
    Moments<T> w[4];
    for (int y = 0; y < 4; ++y) {
      for (int off = 16; off > 0; off >>= 1)
        for (int l = 0; l < off; ++l)
          mom_store(p, 32 * y + l,
                    mom_ln_combine(mom_load(p, 32 * y + l), mom_load(p, 32 * y + l + off)));
      w[y] = mom_load(p, 32 * y);
    }
    w[0] = mom_ln_combine(w[0], w[2]);
    w[1] = mom_ln_combine(w[1], w[3]);
    s = mom_ln_combine(w[0], w[1]);
  } else if (order == kOrdCudaLnBlock) {
    Moments<T> w[16];
    for (int k = 0; k < 16; ++k) w[k] = mom_warp_tree(p, 32 * k);
    for (int k = 0; k < 32; ++k) mom_store(p, k, k < 16 ? w[k] : Moments<T>{T(0), T(0), T(0)});
    s = mom_warp_tree(p, 0);
  } else {
    s = mom_cuda_combine(P, p);
  }
  return mom_pick(P.kind, s);
}

}  // namespace cl
