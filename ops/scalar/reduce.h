// Row reductions in a stated order of accumulation: one header for the CPU executor and
// (embedded verbatim) for NVRTC, so every order gives the same bits on both devices.
//
// A reduction of a row v[0..n) runs in two steps, the way a GPU kernel does:
//   1. red_part(P, v, n, row, t) for every part t in [0, P.nparts): what one thread of the
//      emulated kernel accumulates on its own (for the serial orders, one part: the row);
//   2. red_combine(P, parts): how the kernel combines those partials (trees, shuffles).
// The CPU runs both steps in a loop; the GPU computes the parts in parallel (one thread
// each) and combines them on one thread, so both devices evaluate the same expressions.
//
// Orders (ReduceOrder) and where they come from:
//   sequential   ((v0 + v1) + v2) + ...
//   pairwise     NumPy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src):
//                8 accumulators over blocks of at most 128, halves above
//   torch_cpu    ATen's cascade sum (aten/src/ATen/native/cpu/SumKernel.cpp), AVX2 lanes
//   torch_cuda   ATen's generic reduction kernel (aten/src/ATen/native/cuda/Reduce.cuh),
//                row-contiguous input: the launch configuration setReduceConfig picks
//   cuda_softmax_warp / cuda_softmax_block / cuda_softmax_spatial   the sums in SoftMax.cu's
//                persistent warp softmax, its block softmax (cunn_SoftMaxForwardReg,
//                cunn_SoftMaxForwardSmem, cunn_SoftMaxForward's ilpReduce; BlockReduce) and
//                its spatial softmax over an inner dim (cunn_SpatialSoftMaxForward)
//   triton       Inductor's Triton reduction kernels (tl.sum / max2 over a [1, R0_BLOCK]
//                tile, accumulated over the row's tiles in the looped form)
// The row moments (kinds kRedMean, kRedM2: var and layer_norm) have orders of their own,
// PyTorch's Welford kernels: ops/scalar/moments.h.
// docs/torch_reductions.md has the derivations.
#pragma once
#include "core/cl_defs.h"
#include "core/convert.h"
#include "ops/scalar/math.h"

namespace cl {

// kRedDot: the sum of products a[i] * b[i] of a row laid out as a[0..m) then b[0..m) (2m
// values): SoftMaxKernel.cpp's softmax backward, whose products GCC fuses into some of the
// accumulations (red_dot; orders torch_cpu and sequential only).
// kRedOnline: the sum of exp(x - max(x)) of a row of x, as Inductor's looped online
// softmax computes it (red_online_part; the triton order only).
enum ReduceKind : int {
  kRedSum = 0,
  kRedMax = 1,
  kRedMin = 2,
  kRedMean = 3,
  kRedM2 = 4,
  kRedDot = 5,
  kRedOnline = 6
};
CL_HD constexpr bool red_is_moment(int kind) { return kind == kRedMean || kind == kRedM2; }
enum ReduceOrder : int {
  kOrdSequential = 0,
  kOrdPairwise = 1,
  kOrdTorchCpu = 2,
  kOrdTorchCuda = 3,
  kOrdSoftmaxWarp = 4,
  kOrdSoftmaxBlock = 5,
  kOrdCpuMoments = 6,
  kOrdCudaLnVec = 7,
  kOrdCudaLnBlock = 8,
  kOrdTriton = 9,
  kOrdSoftmaxSpatial = 10,
  kOrdCount = 11
};

// A reduction's order with its launch configuration resolved for one row length.
//   torch_cpu:  a = elements per loaded vector (8: fp32, 16: bf16/fp16 pair loads, 4: fp64,
//               1: a strided row, scalar_inner_sum),
//               b = float lanes per vector (8 or 4), c = 0 for an innermost reduction, else
//               the contiguous extent of the kept dims after the reduced ones (outer sum),
//               d = 0 (the cascade sum), or 1..6: SoftMaxKernel.cpp's vec::reduce_all over
//               a = b = W lanes (red_cpu_reduce_all's modes)
//   torch_cuda: a = block width, b = block height, c = accumulators per thread (vt0, or
//               the vector size when vectorized), d = 1 when the input is vectorized,
//               e = 1 when the row is split across the block's rows (threadIdx.y),
//               f = CTAs per row (global reduction), g = 0 for an innermost reduction,
//               else (outer: one thread per output, a = 1) the block's width in outputs
//   softmax_warp:  a = warp width, b = iterations per lane
//   softmax_block: a = block size, b = elements per vector load (ILP), c = the kernel
//               host_softmax launches: 0 cunn_SoftMaxForwardReg (thread t holds t + k a),
//               1 cunn_SoftMaxForwardSmem (vectors t + k a of b elements), 2
//               cunn_SoftMaxForward (ilpReduce: a head of one element a thread up to the
//               first 16-byte boundary, vectors, a tail of one element a thread), d = the
//               input's first byte mod 16, e = its element size (kernel 2: row r starts
//               (d + r n e) mod 16 bytes past a boundary), f = 1 for the backward kernels'
//               blockReduce (each warp's 32 values in order, then the warps in order, each
//               from 0; cunn_SoftMaxBackward) instead of BlockReduce's shuffle trees
//   softmax_spatial: a = threads along the reduced dim (block.x): part x sums elements
//               x, x + a, ... in order; the parts by a shared-memory tree (a / 2 .. 1)
//   triton:     a = R0_BLOCK (the tile along the row), b = contiguous elements per thread
//               (sizePerThread), c = lanes along the row (threadsPerWarp), d = warps along
//               the row (warpsPerCTA), e = 1 for the looped kernel (triton_red_: each tile
//               position accumulates 0 + y0 + y1 ... over the row's tiles), 0 for the
//               persistent one (triton_per_: one tile, positions past the row hold the
//               identity); parts: the b * c * d... threads, part t = lane + c * warp
//   cpu_moments: a = elements per loaded vector (8, 16 or 4), b = lanes (8 or 4), c = 1
//               when the build fuses multiply-adds, d = 1 when it fuses the scalar tail's
//               too (ops/scalar/moments.h)
// The moments (kinds kRedMean, kRedM2) keep three parts per emulated thread under the
// CUDA orders (torch_cuda: a..f as above), one part under the CPU orders.
//   two-pass (TensorIteratorReduce.cpp two_pass_reduction, ParallelOpenMP.h parallel_reduce:
//               ATen's CPU reduction of a row of >= GRAIN_SIZE elements to ONE output on
//               more than one torch thread): e chunks of f elements, each reduced on its own
//               (the torch_cpu cascade from 0, or sequential from 0) into a buffer of g
//               slots (the other slots hold 0), stored in dtype h (a 16-bit code: the
//               output's; 0: the accumulator's), then the slots reduced in order
// chunk: max and min under the serial orders (sequential, pairwise, torch_cpu) take parts
// of `chunk` consecutive elements combined in row order: the value of one pass over the
// row (max and min are exact and associative, and the first NaN of the row still wins),
// computed by many threads.
// torch_cuda's vectorized loads also read where each row starts: mis = the first row's
// first element past an aligned vector (in elements), rs = the row stride in elements (0:
// rows of n, one after another).
struct RedPlan {
  int kind = kRedSum;
  int order = kOrdSequential;
  int64_t n = 0;
  int64_t nparts = 1;
  int64_t a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, g = 0, h = 0;
  int64_t mis = 0, rs = 0;
  int64_t chunk = 0;
  // torch_cpu max / min (red_cpu_extreme_zero): 1 + the loop ATen runs (0: none, castlab's
  // -0 < +0), and the iterator's row length when the reduced dims do not coalesce (0: n)
  int64_t zmode = 0, zseg = 0;
  // kRedOnline: the MathImpl of its exponentials, | kOnlineUnfused without fp fusion
  int64_t impl = 0;
  // The triton order's cascade (f > 0) under Inductor's C++ kernel vectorized across the
  // rows: the rows before this one (those of full vectors) run it; the others, the scalar
  // tail loop's, sum from zero in order. -1: every row runs the cascade.
  int64_t cascade_rows = -1;
  // The triton order under Inductor's C++ kernel whose row's last partial vector runs the
  // scalar tail loop (TilingSelect's _tail_vec_worthwhile said no): the lanes take the full
  // vectors only; part nparts - 1 is the tail's elements from the identity, in order, and
  // the combine is red_op(tail, the lanes' butterfly) (`tmp_acc0 + vec_reduce_all(...)`).
  int64_t scalar_tail = 0;
};

template <typename T>
CL_HD T red_identity(int kind) {
  if (kind == kRedSum) return T(0);
  const T inf = static_cast<T>(f64_from_bits(0x7FF0000000000000ull));
  return kind == kRedMax ? -inf : inf;
}

// The sum, or castlab's maximum/minimum (NaN-propagating, -0 < +0: ieee_max_min).
template <typename T>
CL_HD T red_op(int kind, T acc, T x) {
  if (kind == kRedSum) return acc + x;
  return ieee_max_min(acc, x, kind == kRedMax);
}

// red_op, or (FAST, a GPU's float maximum/minimum) cl_max_min_nan, the hardware's one
// instruction: a fold through it is kept only where its result is neither a zero nor a NaN
// (red_softmax_thread).
template <bool FAST, typename T>
CL_HD T red_op_fast(int kind, T acc, T x) {
  return red_op(kind, acc, x);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <>
CL_HD float red_op_fast<true, float>(int kind, float acc, float x) {
  if (kind == kRedSum) return acc + x;
  return kind == kRedMax ? cl_max_min_nan<true>(acc, x) : cl_max_min_nan<false>(acc, x);
}
#endif

template <typename T, typename A>
CL_HD T red_sequential(int kind, A v, int64_t n) {
  if (n == 0) return red_identity<T>(kind);
  T acc = v[0];
  for (int64_t i = 1; i < n; ++i) acc = red_op(kind, acc, v[i]);
  return acc;
}

// NumPy's pairwise_sum: blocks of at most kRedPairwiseBlock elements are summed directly
// (red_pairwise_block); a longer range splits at red_pairwise_half(len).
constexpr int64_t kRedPairwiseBlock = 128;
CL_HD int64_t red_pairwise_half(int64_t len) {
  const int64_t n2 = len / 2;
  return n2 - n2 % 8;
}

// NumPy's pairwise_sum, recursion unrolled into an explicit stack of (start, length).
template <typename T, typename A>
CL_HD T red_pairwise_block(A a, int64_t n) {
  if (n < 8) {
    T res = T(-0.0);  // numpy starts from -0.0 (so a row of -0.0 sums to -0.0)
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  T r[8];
  for (int j = 0; j < 8; ++j) r[j] = a[j];
  int64_t i = 8;
  for (; i < n - (n % 8); i += 8)
    for (int j = 0; j < 8; ++j) r[j] += a[i + j];
  T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) res += a[i];
  return res;
}

// The leaves of NumPy's halving tree (blocks of at most 128, split at n / 2 rounded down to
// a multiple of 8), left to right: leaf k's start and length, or (for k < 0) the number
// of leaves. The GPU sums the leaves in parallel (one part each).
CL_HD int64_t red_pairwise_leaf(int64_t n, int64_t k, int64_t* start, int64_t* length) {
  int64_t so[130], sl[130];
  int sp = 0;
  so[0] = 0;
  sl[0] = n;
  int64_t count = 0;
  while (sp >= 0) {
    const int64_t off = so[sp], len = sl[sp];
    --sp;
    if (len <= kRedPairwiseBlock) {
      if (count == k) {
        *start = off;
        *length = len;
        return count;
      }
      ++count;
      continue;
    }
    const int64_t n2 = red_pairwise_half(len);
    so[++sp] = off + n2;  // right half after the left one
    sl[sp] = len - n2;
    so[++sp] = off;
    sl[sp] = n2;
  }
  return count;
}

// pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2) as a loop over an explicit stack
// (depth < 64 for any int64 length). stage 0: split; 1: left half done (its sum in
// `ret`); 2: right half done. `leaf(off, len)` gives a leaf's sum, leaves left to right.
template <typename T, typename Leaf>
CL_HD T red_pairwise_tree(int64_t n, Leaf leaf) {
  if (n <= kRedPairwiseBlock) return leaf(int64_t{0}, n);
  int64_t off[64], len[64];
  int stage[64];
  T left[64];
  int sp = 0;
  off[0] = 0;
  len[0] = n;
  stage[0] = 0;
  T ret = T(0);
  for (;;) {
    if (len[sp] <= kRedPairwiseBlock || stage[sp] == 2) {
      if (len[sp] <= kRedPairwiseBlock)
        ret = leaf(off[sp], len[sp]);
      else
        ret = left[sp] + ret;
      if (sp == 0) return ret;
      --sp;
      ++stage[sp];
      continue;
    }
    const int64_t n2 = red_pairwise_half(len[sp]);
    if (stage[sp] == 1) {
      left[sp] = ret;
      off[sp + 1] = off[sp] + n2;
      len[sp + 1] = len[sp] - n2;
    } else {
      off[sp + 1] = off[sp];
      len[sp + 1] = n2;
    }
    ++sp;
    stage[sp] = 0;
  }
}

// NumPy's pairwise_sum of a[0, n).
template <typename T>
CL_HD T red_pairwise(const T* a, int64_t n) {
  return red_pairwise_tree<T>(
      n, [a](int64_t off, int64_t len) { return red_pairwise_block<T>(a + off, len); });
}

// The same tree over leaf sums already computed (red_pairwise_leaf's order).
template <typename T>
CL_HD T red_pairwise_leaves(const T* leaves, int64_t n) {
  int64_t k = 0;
  return red_pairwise_tree<T>(n, [leaves, &k](int64_t, int64_t) { return leaves[k++]; });
}

// ---- ATen's CPU cascade sum ----
CL_HD int red_ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int b = 0;
  uint64_t y = static_cast<uint64_t>(x - 1);
  while (y) {
    ++b;
    y >>= 1;
  }
  return b;
}

// Lane k of loaded vector i (vec elements, `lanes` lanes; vec == 2 * lanes: pair loads).
template <typename T, typename A>
CL_HD T red_cpu_load(A v, int64_t i, int k, int64_t vec, int64_t lanes) {
  if (vec == lanes) return v[i * vec + k];
  return v[i * vec + k] + v[i * vec + lanes + k];
}

// multi_row_sum: `nrows` (<= 4) interleaved rows (row r takes vectors nrows * i + r,
// i < size), each a cascade of 4 levels over `size` vectors `lanes` wide; the levels
// folded into out[r][k].
template <typename T, typename A>
CL_HD void red_cpu_multi_row(A v, int64_t size, int nrows, int64_t vec, int64_t lanes,
                             T out[4][8]) {
  T acc[4][4][8];  // [level][row][lane]
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 8; ++k) acc[j][r][k] = T(0);
  const int lp = red_ceil_log2(size) / 4 > 4 ? red_ceil_log2(size) / 4 : 4;
  const int64_t step = int64_t(1) << lp;
  const int64_t mask = step - 1;
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int r = 0; r < nrows; ++r)
        for (int k = 0; k < lanes; ++k)
          acc[0][r][k] += red_cpu_load<T>(v, nrows * i + r, k, vec, lanes);
    for (int j = 1; j < 4; ++j) {
      for (int r = 0; r < nrows; ++r)
        for (int k = 0; k < lanes; ++k) {
          acc[j][r][k] += acc[j - 1][r][k];
          acc[j - 1][r][k] = T(0);
        }
      if ((i & (mask << (j * lp))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int r = 0; r < nrows; ++r)
      for (int k = 0; k < lanes; ++k)
        acc[0][r][k] += red_cpu_load<T>(v, nrows * i + r, k, vec, lanes);
  for (int r = 0; r < nrows; ++r)
    for (int k = 0; k < lanes; ++k) {
      for (int j = 1; j < 4; ++j) acc[0][r][k] += acc[j][r][k];
      out[r][k] = acc[0][r][k];
    }
}

// row_sum over `size` vectors (lanes wide, at most 8) into out[lanes]: multi_row_sum with 4
// interleaved rows (ilp 4), the leftover vectors added to row 0, the rows in order.
template <typename T, typename A>
CL_HD void red_cpu_row_sum(A v, int64_t size, int64_t vec, int64_t lanes, T* out) {
  const int64_t size_ilp = size / 4;
  T p[4][8];
  red_cpu_multi_row<T>(v, size_ilp, 4, vec, lanes, p);
  for (int64_t q = 4 * size_ilp; q < size; ++q)
    for (int k = 0; k < lanes; ++k) p[0][k] += red_cpu_load<T>(v, q, k, vec, lanes);
  for (int k = 0; k < lanes; ++k) out[k] = ((p[0][k] + p[1][k]) + p[2][k]) + p[3][k];
}

// multi_row_sum for one scalar row: the cascade over all n elements (no ILP split), as
// vectorized_outer_sum runs it for each output column.
template <typename T, typename A>
CL_HD T red_cpu_cascade(A v, int64_t size) {
  T p[4][8];
  red_cpu_multi_row<T>(v, size, 1, 1, 1, p);
  return p[0][0];
}

// A reduction over a dimension that is not the innermost (vectorized_outer_sum): output
// column j of `cols` (the contiguous extent after the reduced dims) takes the plain
// cascade when it falls in a group of 4 vectors (of 4 columns on the scalar path taken when
// there are fewer columns than one vector), else row_sum's interleaved cascade.
template <typename T, typename A>
CL_HD T red_torch_cpu_outer(A v, int64_t n, int64_t vec, int64_t cols, int64_t row) {
  const int64_t j = row % cols;
  const int64_t w = cols >= vec ? vec : 1;  // fewer columns than a vector: scalar_outer_sum
  if (j < (cols / (4 * w)) * (4 * w)) return T(0) + red_cpu_cascade<T>(v, n);
  T r[8];
  red_cpu_row_sum<T>(v, n, 1, 1, r);
  return T(0) + r[0];
}

template <typename T, typename A>
CL_HD T red_torch_cpu(A v, int64_t n, int64_t vec, int64_t lanes);

// The two-pass reduction's last pass: the buffer of g slots (contiguous, in the output's
// dtype: bf16/fp16 pair loads when P.h names one) summed by the cascade of its dtype's
// vectors, whatever the loads of the input's rows were (a strided row: P.a = 1).
template <typename T>
CL_HD T red_two_pass_final(const RedPlan& P, T* slot, int64_t g) {
  if (P.a != 1) return red_torch_cpu<T>(slot, g, P.a, P.b);
  const int64_t lanes = sizeof(T) == 8 ? 4 : 8;
  return red_torch_cpu<T>(slot, g, P.h ? 16 : lanes, lanes);
}

// The two-pass reduction above (P.e chunks): the chunks' sums into g slots, then the slots.
template <typename T, typename A>
CL_HD T red_two_pass(const RedPlan& P, A v, int64_t n) {
  T slot[64];
  const int64_t g = P.g < 64 ? P.g : 64;
  for (int64_t k = 0; k < g; ++k) slot[k] = T(0);
  for (int64_t k = 0; k < P.e && k < g; ++k) {
    const int64_t start = k * P.f, len = n - start < P.f ? n - start : P.f;
    T s = T(0);
    if (P.order == kOrdTorchCpu) {
      s = s + red_torch_cpu<T>(v + start, len, P.a, P.b);
    } else {
      for (int64_t i = 0; i < len; ++i) s = s + v[start + i];
    }
    if (P.h == kBFloat16) s = T(bf16_to_f32(f32_to_bf16_rne(float(s))));
    if (P.h == kFloat16) s = T(f16_to_f32(f32_to_f16_rne(float(s))));
    slot[k] = s;
  }
  if (P.order == kOrdTorchCpu) return red_two_pass_final<T>(P, slot, g);
  T r = T(0);
  for (int64_t k = 0; k < g; ++k) r = r + slot[k];
  return r;
}

// torch_cpu, the reduced dims not coalescing into one (P.zseg: the length of the
// iterator's rows, the row here in the iterator's order): each row summed by the cascade
// into the output in turn; on several threads (P.e > 0) the two-pass split's chunks cut the
// rows at their boundaries, each piece summed on its own into the chunk's slot.
template <typename T, typename A>
CL_HD T red_cpu_ti_range(const RedPlan& P, A v, int64_t b, int64_t e) {
  T out = T(0);
  for (int64_t s = b; s < e;) {
    const int64_t row_end = (s / P.zseg + 1) * P.zseg;
    const int64_t end = row_end < e ? row_end : e;
    out = out + red_torch_cpu<T>(v + s, end - s, P.a, P.b);
    s = end;
  }
  return out;
}

template <typename T, typename A>
CL_HD T red_cpu_ti_rows(const RedPlan& P, A v, int64_t n) {
  if (P.e <= 0) return red_cpu_ti_range<T>(P, v, 0, n);
  T slot[64];
  const int64_t g = P.g < 64 ? P.g : 64;
  for (int64_t k = 0; k < g; ++k) {
    const int64_t b = k * P.f, e = n < b + P.f ? n : b + P.f;
    slot[k] = k < P.e && b < e ? red_cpu_ti_range<T>(P, v, b, e) : T(0);
  }
  return red_two_pass_final<T>(P, slot, g);
}

template <typename T, typename A>
CL_HD T red_torch_cpu(A v, int64_t n, int64_t vec, int64_t lanes) {
  T lane_sum[8];
  T fin = T(0);
  if (n < vec) {  // the scalar cascade: one lane, one element per "vector"
    red_cpu_row_sum<T>(v, n, 1, 1, lane_sum);
    fin = fin + lane_sum[0];
  } else {
    const int64_t nvec = n / vec;
    red_cpu_row_sum<T>(v, nvec, vec, lanes, lane_sum);
    for (int64_t k = nvec * vec; k < n; ++k) fin += v[k];
    for (int k = 0; k < lanes; ++k) fin += lane_sum[k];
  }
  return T(0) + fin;
}

// ---- ATen's CPU max / min (amax, amin): which of equal zeros wins ----
// binary_kernel_reduce_vec (aten/src/ATen/native/cpu/Reduce.h) with max_impl / min_impl
// (the scalar op keeps its first operand on a tie) and Vectorized maximum / minimum
// (_mm256_max_ps / _mm256_min_ps: the second operand on a tie), from an output filled with
// the identity. The value is any order's; only the sign of a zero result depends on the
// loops, so the executor asks this for rows whose result is a zero (no NaN in the row).
template <typename T>
CL_HD bool red_gt(int kind, T a, T b) {
  return kind == kRedMax ? a > b : a < b;
}

// vectorized_reduction over v[0..n), V elements a vector: reduction128's four vector
// accumulators over whole blocks of 4V (a tie: the later block), combined as
// vop(vop(a0, a1), vop(a2, a3)), the lanes then in order by the scalar op, then the
// remaining elements by the scalar op (a tie: the earlier). `out`: the output's value.
template <typename T, typename A>
CL_HD T red_cpu_vec_extreme(int kind, A v, int64_t n, int64_t V, T out) {
  const int64_t blk = 4 * V, count = n / blk;
  if (count > 0) {
    T acc[64];
    for (int64_t l = 0; l < blk; ++l) acc[l] = v[l];
    for (int64_t i = 1; i < count; ++i)
      for (int64_t l = 0; l < blk; ++l) {
        const T x = v[i * blk + l];
        acc[l] = red_gt(kind, acc[l], x) ? acc[l] : x;
      }
    T b0 = T(0);
    for (int64_t l = 0; l < V; ++l) {
      const T t01 = red_gt(kind, acc[l], acc[V + l]) ? acc[l] : acc[V + l];
      const T t23 = red_gt(kind, acc[2 * V + l], acc[3 * V + l]) ? acc[2 * V + l] : acc[3 * V + l];
      const T b = red_gt(kind, t01, t23) ? t01 : t23;
      b0 = l == 0 ? b : (red_gt(kind, b, b0) ? b : b0);
    }
    out = red_gt(kind, b0, out) ? b0 : out;
  }
  for (int64_t i = count * blk; i < n; ++i) out = red_gt(kind, v[i], out) ? v[i] : out;
  return out;
}

// The zero a torch_cpu max / min of the row returns (P.zmode - 1: 0 the scalar loop, 1
// vectorized_reduction over a contiguous row (rows of P.zseg, each into the output; the
// two-pass split's chunks into P.g slots, reduced the same way), 2 vectorized_outer_reduction:
// columns in whole groups of 4V keep the later of equal values).
template <typename T, typename A>
CL_HD T red_cpu_extreme_zero(const RedPlan& P, A v, int64_t n, int64_t row) {
  const int kind = P.kind;
  const T ident = red_identity<T>(kind);
  const int64_t V = P.a, mode = P.zmode - 1;
  if (mode == 2) {
    const int64_t j = row % (P.c > 0 ? P.c : 1);
    if (j < (P.c / (4 * V)) * (4 * V)) {
      T acc = v[0];
      for (int64_t i = 1; i < n; ++i) acc = red_gt(kind, acc, v[i]) ? acc : v[i];
      return acc;
    }
  }
  if (mode != 1) {
    T out = ident;
    for (int64_t i = 0; i < n; ++i) out = red_gt(kind, v[i], out) ? v[i] : out;
    return out;
  }
  if (P.e > 0) {  // the two-pass split: chunks into slots, then the slots
    T slot[64];
    const int64_t g = P.g < 64 ? P.g : 64;
    for (int64_t k = 0; k < g; ++k) {
      const int64_t start = k * P.f, len = n - start < P.f ? n - start : P.f;
      slot[k] = k < P.e && len > 0 ? red_cpu_vec_extreme<T>(kind, v + start, len, V, ident) : ident;
    }
    return red_cpu_vec_extreme<T>(kind, slot, g, V, ident);
  }
  const int64_t seg = P.zseg > 0 ? P.zseg : n;
  T out = ident;
  for (int64_t s = 0; s < n; s += seg)
    out = red_cpu_vec_extreme<T>(kind, v + s, n - s < seg ? n - s : seg, V, out);
  return out;
}

// ATen's vec::reduce_all (cpu/vec/functional_base.h) as SoftMaxKernel.cpp sums a softmax
// row, W lanes (mode 1: fp32/fp64 rows): lane l starts at v[l] and adds v[l + W], ...;
// the last partial vector is added into the low lanes; then vec_reduce_all's butterfly
// (lane l + lane l ^ h, h = W/2 .. 1). A row shorter than W is summed in order. Mode 2
// (the bf16 kernel): W float lanes from 0 over the full vectors, the butterfly, then the
// remaining elements one after another.
// ATen's vec_reduce_all for float vectors: lane l + lane l ^ h, h = W/2 .. 1 (W <= 16).
template <typename T>
CL_HD T red_lane_butterfly(T* acc, int64_t W) {
  for (int64_t h = W / 2; h >= 1; h /= 2) {
    T nx[16];
    for (int64_t l = 0; l < W; ++l) nx[l] = acc[l] + acc[l ^ h];
    for (int64_t l = 0; l < W; ++l) acc[l] = nx[l];
  }
  return acc[0];
}

// ATen's generic vec_reduce_all (no SIMD specialisation: double vectors, and every vector in
// the DEFAULT build's vec_base): lane 0 adds the other lanes in order.
template <typename T>
CL_HD T red_lane_sequential(const T* acc, int64_t W) {
  T s = acc[0];
  for (int64_t l = 1; l < W; ++l) s = s + acc[l];
  return s;
}

// Modes 5 and 6: modes 2 and 4 as the DEFAULT build computes them (the generic lane sum).
template <typename T, typename A>
CL_HD T red_cpu_reduce_all(A v, int64_t n, int64_t W, int64_t mode) {
  if (n <= 0) return T(0);
  const bool generic = mode == 3 || mode >= 5;
  if (mode == 5) mode = 2;
  if (mode == 6) mode = 4;
  if (mode == 4) {  // reduce_all over bf16/fp16 (functional_bfloat16.h): float halves
    T a0[16], a1[16];
    if (n < 2 * W) {  // one partial vector: its halves added, then lanes in order
      const int64_t m = n < W ? n : W;
      for (int64_t l = 0; l < m; ++l) a0[l] = v[l];
      for (int64_t l = 0; l + W < n; ++l) a0[l] = a0[l] + v[W + l];
      T s = a0[0];
      for (int64_t l = 1; l < m; ++l) s = s + a0[l];
      return s;
    }
    for (int64_t l = 0; l < W; ++l) {
      a0[l] = v[l];
      a1[l] = v[W + l];
    }
    const int64_t full = n - n % (2 * W);
    for (int64_t d = 2 * W; d < full; d += 2 * W)
      for (int64_t l = 0; l < W; ++l) {
        a0[l] = a0[l] + v[d + l];
        a1[l] = a1[l] + v[d + W + l];
      }
    const int64_t k = n - full;
    for (int64_t l = 0; l < W && l < k; ++l) a0[l] = a0[l] + v[full + l];
    for (int64_t l = 0; l + W < k; ++l) a1[l] = a1[l] + v[full + W + l];
    for (int64_t l = 0; l < W; ++l) a0[l] = a0[l] + a1[l];
    return generic ? red_lane_sequential(a0, W) : red_lane_butterfly(a0, W);
  }
  if (mode != 2 && n < W) {
    T s = v[0];
    for (int64_t i = 1; i < n; ++i) s = s + v[i];
    return s;
  }
  T acc[16];
  const int64_t full = n - n % W;
  for (int64_t l = 0; l < W; ++l) acc[l] = mode != 2 ? T(v[l]) : T(0);
  for (int64_t d = mode != 2 ? W : 0; d < full; d += W)
    for (int64_t l = 0; l < W; ++l) acc[l] = acc[l] + v[d + l];
  if (mode != 2)
    for (int64_t l = 0; l < n - full; ++l) acc[l] = acc[l] + v[full + l];
  if (mode == 3) return red_lane_sequential(acc, W);
  T s = generic ? red_lane_sequential(acc, W) : red_lane_butterfly(acc, W);
  if (mode == 2)
    for (int64_t i = full; i < n; ++i) s = s + v[i];
  return s;
}

// ---- ATen's CUDA reduction kernel (Reduce.cuh), one row of n contiguous elements ----
// Part t = (x, y, cta) of the emulated launch: x + a * (y + b * cta). When each row of
// threads reduces its own output, only threadIdx.y's row matters (b = 1 then).
// Reduce.cuh's walk of one thread t over a row: add(i, v[j]) for each element j the thread
// reads, into its accumulator i (i < acc_n = P.c), in the kernel's order. Shared by the
// sums (red_cuda_part) and the Welford moments (mom_cuda_thread).
template <typename A, typename Add>
CL_HD void red_cuda_walk(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t, Add add) {
  const int64_t bw = P.a, bh = P.b, acc_n = P.c;
  const int64_t x = t % bw, y = (t / bw) % bh, cta = t / (bw * bh);
  // thread's first index and stride (in vectors when vectorized)
  const int64_t split_y = P.e, ctas = P.f;
  int64_t idx0 = x, stride = bw;
  if (split_y) {
    idx0 += y * stride;
    stride *= bh;
  }
  if (ctas > 1) {
    idx0 += cta * stride;
    stride *= ctas;
  }
  if (P.d) {  // input_vectorized_thread_reduce_impl
    // row `row` starts `shift` elements past an aligned vector (its own offset from the
    // first row's, plus the first row's); those first elements go to threads shift..acc_n-1
    const int64_t shift = (P.mis + row * (P.rs > 0 ? P.rs : n)) % acc_n;
    const bool tail_thread = y == 0 && cta == 0;
    A d = v;
    int64_t end = n;
    if (shift > 0) {
      d = v - shift;
      end = n + shift;
      if (x >= shift && x < acc_n && tail_thread) add(0, d[x]);
      end -= acc_n;
      d = d + acc_n;
    }
    for (int64_t q = idx0; q * acc_n + acc_n - 1 < end; q += stride)
      for (int i = 0; i < acc_n; ++i) add(i, d[q * acc_n + i]);
    const int64_t tail = end - end % acc_n;
    if (tail_thread && tail + x < end) add(0, d[tail + x]);
  } else {  // thread_reduce_impl: acc_n strided accumulators
    int64_t idx = idx0;
    while (idx + (acc_n - 1) * stride < n) {
      for (int i = 0; i < acc_n; ++i) add(i, v[idx + i * stride]);
      idx += acc_n * stride;
    }
    for (int i = 0; i < acc_n && idx < n; ++i, idx += stride) add(i, v[idx]);
  }
}

template <typename T, typename A>
CL_HD T red_cuda_part(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  T acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = red_identity<T>(P.kind);
  red_cuda_walk(P, v, n, row, t, [&](int i, T x) { acc[i] = red_op(P.kind, acc[i], x); });
  T r = acc[0];
  for (int i = 1; i < P.c; ++i) r = red_op(P.kind, r, acc[i]);
  return r;
}

// One block's partials p[x + bw * y] combined (in place), as the kernel of torch 2.11
// does it (measured on an H200): across the lanes of each row of threads first, a tree
// with offsets bw / 2 down to 1 (shared memory, then warp shuffles), then across the rows
// (threadIdx.y) with offsets bh / 2 down to 1. Returns thread (0, 0)'s value.
template <typename T>
CL_HD T red_cuda_block(int kind, T* p, int64_t bw, int64_t bh, bool y_reduce) {
  const int64_t rows = y_reduce ? bh : 1;
  for (int64_t y = 0; y < rows; ++y) {
    T* q = p + bw * y;
    for (int64_t off = bw / 2; off > 0; off >>= 1)
      for (int64_t x = 0; x < off; ++x) q[x] = red_op(kind, q[x], q[x + off]);
  }
  if (y_reduce)
    for (int64_t off = bh / 2; off > 0; off >>= 1)
      for (int64_t y = 0; y < off; ++y) p[bw * y] = red_op(kind, p[bw * y], p[bw * (y + off)]);
  return p[0];
}

template <typename T>
CL_HD T red_cuda_combine(const RedPlan& P, T* parts) {
  const int64_t bw = P.a, bh = P.b, ctas = P.f, nt = bw * bh;
  const bool y_reduce = P.e != 0;
  if (ctas <= 1) return red_cuda_block(P.kind, parts, bw, bh, y_reduce);
  // every CTA reduces its block; the last one combines the CTA partials: thread t takes
  // partials t, t + nt, ... in order, then the same block reduction
  for (int64_t c = 0; c < ctas; ++c)
    parts[c * nt] = red_cuda_block(P.kind, parts + c * nt, bw, bh, y_reduce);
  for (int64_t t = 0; t < nt; ++t) {
    T acc = red_identity<T>(P.kind);
    for (int64_t c = t; c < ctas; c += nt) acc = red_op(P.kind, acc, parts[c * nt]);
    parts[t] = acc;  // t <= c * nt for every c read later: each is read before written
  }
  return red_cuda_block(P.kind, parts, bw, bh, y_reduce);
}

// ---- SoftMax.cu sums ----
// shfl_down with offsets 16, 8, 4, 2, 1 over 32 lanes (in place): lane 0's value (only
// the lanes it depends on: l < off).
template <typename T>
CL_HD T red_warp_down(int kind, T* lane) {
  for (int off = 16; off > 0; off >>= 1)
    for (int l = 0; l < off; ++l) lane[l] = red_op(kind, lane[l], lane[l + off]);
  return lane[0];
}

// warp softmax: part t = lane t (elements t + it * warp, it = 0..b-1; past the row the
// kernel's padding adds exp(-inf) = +0). block softmax: part t = warp t's shuffle-reduced
// value of its 32 threads' own (red_softmax_thread). spatial softmax: part x = thread x.
// ILP consecutive values from element i: the accessor's own chunk (a generated row
// kernel's vector loads) where it has one, else one v[i + k] at a time. Same values.
// AL: the caller knows every operand the chunk reads as vectors is on a 16-byte boundary
// at i (red_chunks_aligned), so the chunk skips its per-call address test (a generated
// chunk takes it as RedBool<AL>, a bool known when it compiles).
template <bool B>
struct RedBool {
  static constexpr bool value = B;
};
template <typename T, int ILP, bool AL, typename A>
CL_HD auto red_chunk(const A& v, int64_t i, T* out, int)
    -> decltype(v.template chunk<ILP, AL>(i, out), void()) {
  v.template chunk<ILP, AL>(i, out);
}
template <typename T, int ILP, bool AL, typename A>
CL_HD void red_chunk(const A& v, int64_t i, T* out, long) {
  for (int k = 0; k < ILP; ++k) out[k] = v[i + k];
}
// Whether the accessor's vector operands are all on a 16-byte boundary at element i (a
// generated row kernel's `aligned`); false where it has none.
template <typename A>
CL_HD auto red_chunks_aligned(const A& v, int64_t i, int) -> decltype(v.aligned(i)) {
  return v.aligned(i);
}
template <typename A>
CL_HD bool red_chunks_aligned(const A&, int64_t, long) {
  return false;
}

// s folded with the ilp values from element i in order: read as one chunk where ILP (the
// same ilp) is known when the caller compiles, else one at a time.
template <typename T, int ILP, bool FAST = false, bool AL = false, typename A>
CL_HD T red_fold_ilp(int kind, T s, const A& v, int64_t i, int64_t ilp) {
  if (ILP > 0) {
    T buf[ILP > 0 ? ILP : 1];
    red_chunk<T, (ILP > 0 ? ILP : 1), AL>(v, i, buf, 0);
    for (int k = 0; k < ILP; ++k) s = red_op_fast<FAST>(kind, s, buf[k]);
  } else {
    for (int64_t k = 0; k < ilp; ++k) s = red_op_fast<FAST>(kind, s, v[i + k]);
  }
  return s;
}

// The whole vectors of a thread's phase: chunks at i0 + q * step for i0 + q * step < end
// (step and every chunk's bytes multiples of 16 where the chunks are vectors, so a chunk
// is aligned where the first is: one test, then the loop without one).
template <typename T, int ILP, bool FAST, typename I, typename A>
CL_HD T red_fold_chunks(int kind, T s, const A& v, I i0, I end, I step, I ilp) {
  if (ILP > 0 && i0 < end && red_chunks_aligned(v, i0, 0)) {
    for (I i = i0; i < end; i += step) s = red_fold_ilp<T, ILP, FAST, true>(kind, s, v, i, ilp);
    return s;
  }
  for (I i = i0; i < end; i += step) s = red_fold_ilp<T, ILP, FAST>(kind, s, v, i, ilp);
  return s;
}

// One thread's value of the SoftMax.cu kernels' phase (below), its ops red_op_fast<FAST>.
// I: the element index's type, int where the caller knows the row fits (a generated kernel:
// SoftMax.cu's own index_t; no 64-bit division or remainder), else int64_t.
template <typename T, int ILP, int KIND, bool FAST, typename I, int C, typename A>
CL_HD T red_softmax_thread_fold(const RedPlan& P, A v, int64_t n64, int64_t row, int64_t th64) {
  const int kind = KIND >= 0 ? KIND : P.kind;
  T s = red_identity<T>(kind);
  const I n = static_cast<I>(n64), th = static_cast<I>(th64), bs = static_cast<I>(P.a);
  const I ilp = ILP > 0 ? ILP : static_cast<I>(P.b);
  const int64_t c = C >= 0 ? C : P.c;
  if (c == 0) {  // cunn_SoftMaxForwardReg
    for (I i = th; i < n; i += bs) s = red_op_fast<FAST>(kind, s, v[i]);
    return s;
  }
  if (c == 1) {  // cunn_SoftMaxForwardSmem: whole vectors (n % ilp == 0)
    return red_fold_chunks<T, ILP, FAST, I>(kind, s, v, th * ilp, n, bs * ilp, ilp);
  }
  // ilpReduce (SoftMax.cu): `shift` elements before the row's start to a 16-byte boundary
  // (the element size is 1, 2, 4 or 8 bytes: a shift, not a division)
  const int64_t esz = P.e > 0 ? P.e : 4;
  const int lg = esz == 1 ? 0 : esz == 2 ? 1 : esz == 4 ? 2 : 3;
  const I shift = static_cast<I>(((P.d + row * n64 * esz) & 15) >> lg);
  I size = n, base = 0;  // v[base + k]: element k of the data pointer as it moves
  if (shift > 0) {
    size += shift;
    if (th >= shift && th < size) s = red_op_fast<FAST>(kind, s, v[th - shift]);
    size -= bs > size ? size : bs;
    base = bs - shift;
  }
  const I last = size % (ilp * bs);
  s = red_fold_chunks<T, ILP, FAST, I>(kind, s, v, base + th * ilp, base + size - last, bs * ilp,
                                       ilp);
  for (I q = size - last + th; q < size; q += bs) s = red_op_fast<FAST>(kind, s, v[base + q]);
  return s;
}

// ILP, KIND: the plan's b and kind where the caller knows them when it compiles (a
// generated kernel: unrolled, vector loads), 0 / -1 to read them from the plan; I as above;
// C: the plan's kernel (c: Reg, Smem, ilpReduce) where the caller knows it, so that only
// that loop is compiled (-1: read from the plan).
// A float maximum or minimum known when the kernel compiles folds by the hardware's
// max.NaN / min.NaN on the GPU (one instruction where ieee_max_min takes ten), and again
// by red_op in the same order only where that gave a zero or a NaN (a zero's sign and a
// NaN's payload depend on the order): the same value either way.
template <typename T, int ILP = 0, int KIND = -1, typename I = int64_t, int C = -1, typename A>
CL_HD T red_softmax_thread(const RedPlan& P, A v, int64_t n, int64_t row, int64_t th) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (sizeof(T) == 4 && (KIND == kRedMax || KIND == kRedMin)) {
    const T s = red_softmax_thread_fold<T, ILP, KIND, true, I, C>(P, v, n, row, th);
    if (s == s && s != T(0)) return s;
  }
#endif
  return red_softmax_thread_fold<T, ILP, KIND, false, I, C>(P, v, n, row, th);
}

template <typename T, typename A>
CL_HD T red_softmax_part(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  if (P.order == kOrdSoftmaxWarp) {
    T s = red_identity<T>(P.kind);
    for (int64_t it = 0; it < P.b; ++it) {
      const int64_t i = t + it * P.a;
      s = red_op(P.kind, s, i < n ? v[i] : red_identity<T>(P.kind));
    }
    return s;
  }
  if (P.order == kOrdSoftmaxSpatial) {
    T s = red_identity<T>(P.kind);
    for (int64_t i = t; i < n; i += P.a) s = red_op(P.kind, s, v[i]);
    return s;
  }
  T lane[32];
  for (int l = 0; l < 32; ++l) lane[l] = red_softmax_thread<T>(P, v, n, row, 32 * t + l);
  if (P.f) {  // blockReduce (cunn_SoftMaxBackward): a warp's 32 values in order, from 0
    T s = red_identity<T>(P.kind);
    for (int l = 0; l < 32; ++l) s = red_op(P.kind, s, lane[l]);
    return s;
  }
  return red_warp_down(P.kind, lane);
}

template <typename T>
CL_HD T red_softmax_combine(const RedPlan& P, T* p) {
  if (P.order == kOrdSoftmaxWarp) {
    // XOR butterfly (every lane ends equal; lane 0 needs lanes l < 2 off at offset off)
    for (int64_t off = P.a / 2; off > 0; off >>= 1) {
      T nxt[32];
      for (int64_t l = 0; l < 2 * off; ++l) nxt[l] = red_op(P.kind, p[l], p[l ^ off]);
      for (int64_t l = 0; l < 2 * off; ++l) p[l] = nxt[l];
    }
    return p[0];
  }
  if (P.order == kOrdSoftmaxSpatial) {  // spatialBlockReduceX: shared[x] op= shared[x + off]
    for (int64_t off = P.a / 2; off > 0; off >>= 1)
      for (int64_t l = 0; l < off; ++l) p[l] = red_op(P.kind, p[l], p[l + off]);
    return p[0];
  }
  if (P.f) {  // blockReduce: thread 0 adds the warps' values in order, from 0
    T s = red_identity<T>(P.kind);
    for (int64_t k = 0; k < P.nparts; ++k) s = red_op(P.kind, s, p[k]);
    return s;
  }
  // BlockReduce: warp 0 reads the warp results (identity past the last warp)
  T w[32];
  for (int64_t k = 0; k < 32; ++k) w[k] = k < P.nparts ? p[k] : red_identity<T>(P.kind);
  return red_warp_down(P.kind, w);
}

// ---- Triton's tl.sum / max2, as Inductor's reduction kernels use it ----
// Thread t (lane t % c of warp t / c) owns the tile positions rep * (b c d) + t b + k
// (k < b); it folds its positions' values in register order (k, then rep) starting from
// the first; the lanes of a warp then combine by an xor butterfly (offsets c/2 .. 1) and
// the warps' results by another (d/2 .. 1). Addition is commutative, so lane 0's value is
// the one every lane holds. In the looped form each position first accumulates its
// values of every tile from the identity (Inductor's `_acc = _acc + y` from zeros).
// Inductor's C++ kernels (the inductor_cpp order: one lane per position, P.f > 0): a float
// sum of over 4096 elements accumulates each lane's values of the full vectors through
// CascadeSumHelper (cpp_prefix.h): chunks of P.f values, combined by a binary counter
// (chunk c adds the stack's levels below its lowest set bit upward), the levels then added
// from the bottom; the tail vector's value (masked_acc_vec) is added after.
// One lane's values v[i * R + pos] of the vectors i0 <= i < i1 through a CascadeSumHelper
// made for N vectors (C: the chunk; 0, or N <= C: a plain sum from zero).
template <typename T, typename A>
CL_HD T red_cascade_run(A v, int64_t R, int64_t C, int64_t pos, int64_t i0, int64_t i1, int64_t N) {
  const int64_t m = C > 0 ? (N + C - 1) / C : 1;
  int64_t depth = 0;
  while ((int64_t(1) << depth) < m) ++depth;
  T stk[64];
  for (int64_t j = 0; j < 64; ++j) stk[j] = T(0);
  int64_t index = 0, chunks = 0;
  for (int64_t i = i0; i < i1; ++i) {
    stk[0] = stk[0] + T(v[i * R + pos]);
    if (depth > 0 && ++index == C) {
      ++chunks;
      index = 0;
      int64_t mask = chunks, j = 1;
      for (; j < depth && (mask & 1) == 0; ++j) {
        stk[j] = stk[j] + stk[j - 1];
        stk[j - 1] = T(0);
        mask >>= 1;
      }
    }
  }
  T r = stk[0];
  for (int64_t j = 1; j < depth; ++j) r = r + stk[j];
  return r;
}

template <typename T, typename A>
CL_HD T red_cascade_lane(const RedPlan& P, A v, int64_t n, int64_t pos) {
  const int64_t R = P.a, K = n / R, full = K * R;
  T r = red_cascade_run<T>(v, R, P.f, pos, 0, K, K);
  if (full + pos < n) r = r + (T(0) + T(v[full + pos]));
  return r;
}

// The row's sum split over P.g OpenMP threads (Inductor's parallel reduction, cpp.py):
// the row's vector iterations (the tail vector the last) dealt by libgomp's static
// schedule (omp_static_range); each thread sums its full vectors from zero through a
// CascadeSumHelper made for ceil(K / threads) vectors (P.f > 0) and its masked tail from
// zero; the threads' lanes are added to a zero vector in thread order, the masked ones
// likewise, then the two.
// libgomp's static schedule without a chunk: thread t of nt takes iterations [*s, *e) of I
// (q + 1 of them from (q + 1) t where t < I % nt, else q from q t + I % nt).
CL_HD void omp_static_range(int64_t I, int64_t nt, int64_t t, int64_t* s, int64_t* e) {
  const int64_t q = I / nt, rem = I % nt;
  *s = t < rem ? (q + 1) * t : q * t + rem;
  *e = *s + q + (t < rem ? 1 : 0);
}

// (RedPlan.scalar_tail: the schedule still counts the tail's iteration, whose elements the
// scalar loop takes instead of a masked vector)
template <typename T, typename A>
CL_HD T red_omp_lane(const RedPlan& P, A v, int64_t n, int64_t pos) {
  const int64_t R = P.a, nt = P.g, K = n / R, I = (n + R - 1) / R, per = (K + nt - 1) / nt;
  T acc = T(0), masked = T(0);
  for (int64_t t = 0; t < nt; ++t) {
    int64_t s = 0, e = 0;
    omp_static_range(I, nt, t, &s, &e);
    acc = acc + red_cascade_run<T>(v, R, P.f, pos, s, e < K ? e : K, per);
    const bool tail = !P.scalar_tail && e > K && s <= K && K < I && K * R + pos < n;
    masked = masked + (tail ? T(0) + T(v[K * R + pos]) : T(0));
  }
  return acc + masked;
}

template <typename T, typename A>
CL_HD T red_triton_part(const RedPlan& P, A v, int64_t n, int64_t t) {
  const int64_t R = P.a, per = P.b, tile = P.b * P.c * P.d;
  T out = red_identity<T>(P.kind);
  if (P.scalar_tail) {  // the scalar tail loop's part, then the lanes over the full vectors
    const int64_t full = n / R * R;
    if (t == P.c * P.d) {
      for (int64_t i = full; i < n; ++i) out = red_op(P.kind, out, T(v[i]));
      return out;
    }
    if (!(P.g > 1 && P.kind == kRedSum)) n = full;  // (red_omp_lane skips the tail itself)
  }
  bool first = true;
  for (int64_t rep = 0; rep * tile < R; ++rep)
    for (int64_t k = 0; k < per; ++k) {
      const int64_t pos = rep * tile + t * per + k;
      T acc = red_identity<T>(P.kind);
      if (P.g > 1 && P.kind == kRedSum) {
        acc = red_omp_lane<T>(P, v, n, pos);
      } else if (P.f > 0 && P.kind == kRedSum) {
        acc = red_cascade_lane<T>(P, v, n, pos);
      } else if (P.e) {
        for (int64_t i = pos; i < n; i += R) acc = red_op(P.kind, acc, T(v[i]));
      } else if (pos < n) {
        acc = v[pos];
      }
      out = first ? acc : red_op(P.kind, out, acc);
      first = false;
    }
  return out;
}

// A column of a contiguous [n, rows] matrix read as a row (element i at p[i * stride]):
// the accessor red_triton_part reads a reduction over leading dims through, in place.
template <typename T>
struct RedColumn {
  const T* p;
  int64_t stride;
  CL_HD_METHOD T operator[](int64_t i) const { return p[i * stride]; }
};

// Triton's combine of its threads' values p[lane + lanes * warp] (in place): an xor
// butterfly over each warp's lanes, lane 0's value per warp, then a butterfly over the
// warps; `op(own, other)`.
template <typename T, typename Op>
CL_HD T red_triton_tree(int64_t lanes, int64_t warps, T* p, Op op) {
  for (int64_t w = 0; w < warps; ++w) {
    T* q = p + w * lanes;
    for (int64_t off = lanes / 2; off > 0; off >>= 1)
      for (int64_t l = 0; l < off; ++l) q[l] = op(q[l], q[l + off]);
  }
  for (int64_t off = warps / 2; off > 0; off >>= 1)
    for (int64_t w = 0; w < off; ++w) p[w * lanes] = op(p[w * lanes], p[(w + off) * lanes]);
  return p[0];
}

template <typename T>
CL_HD T red_triton_combine(const RedPlan& P, T* p) {
  const int64_t lanes = P.c, warps = P.d;
  const int kind = P.kind;
  const T tail = P.scalar_tail ? p[lanes * warps] : T(0);
  T r;
  if (P.h == 1) {  // ATen's generic vec_reduce_all (a double row under Inductor's C++): the
    // two vectors of VectorizedN<double, 2> lane by lane, then the lanes in order
    const int64_t half = lanes / 2;
    for (int64_t l = 0; l < half; ++l) p[l] = red_op(kind, p[l], p[l + half]);
    r = p[0];
    for (int64_t l = 1; l < half; ++l) r = red_op(kind, r, p[l]);
  } else {
    r = red_triton_tree(lanes, warps, p, [kind](T a, T b) { return red_op(kind, a, b); });
  }
  return P.scalar_tail ? red_op(kind, tail, r) : r;
}

// ---- Inductor's online softmax (kRedOnline) ----
// The row's sum of exp(x - max x) as Inductor's looped kernel computes it under
// config.online_softmax (its post-grad pattern prepare_softmax_online; the arithmetic read
// from Triton 3.6's PTX, docs/inductor_wide_rows.md 4.5): each tile position c keeps a
// running maximum m_c and sum s_c over the row's tiles, from (-inf, 0), with
//   m' = maximum(m, x), a = m' == -inf ? 1 : exp(m - m'), b = m' == -inf ? 1 : exp(x - m'),
//   s' = fma(s, a, b);
// then M = the positions' maximum (each thread's in register order, then Triton's
// butterflies), e_c = exp(M == -inf ? 0 : m_c - M), each thread's sum fma(s_0, e_0,
// rn(s_1 e_1)), then fma(s_k, e_k, sum), and the threads' sums as tl.sum's. Inductor's
// `maximum` keeps a NaN in either operand, and the first of two equal values.
// Without Triton's fp fusion (enable_fp_fusion off: Inductor under emulate_precision_casts)
// no product is fused into an addition: s' = rn(s a) + b, each thread's sum rn(s_0 e_0) +
// rn(s_1 e_1), then rn(s_k e_k) + sum (impl | kOnlineUnfused).
// Parts: (m_c, s_c) for each position c in order, then one slot a thread (the combine's).
constexpr int kOnlineUnfused = 16;
CL_HD float red_fma(float a, float b, float c) { return fma_f(a, b, c); }
CL_HD double red_fma(double a, double b, double c) { return fma_d(a, b, c); }
template <typename T>
CL_HD T red_tri_maximum(T a, T b) {
  return (a > b || a != a) ? a : b;
}
// a product rounded on its own (never contracted into a later addition; the host build
// uses -ffp-contract=off)
template <typename T>
CL_HD T red_mul_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// s a + c: fused (one rounding), or the product rounded first (impl & kOnlineUnfused)
template <typename T>
CL_HD T red_online_madd(T s, T a, T c, int impl) {
  return (impl & kOnlineUnfused) ? red_mul_rn(s, a) + c : red_fma(s, a, c);
}

template <typename T>
CL_HD void red_online_step(T& m, T& s, T x, int impl) {
  const T ninf = red_identity<T>(kRedMax);
  const T m2 = red_tri_maximum(m, x);
  const T a = m2 == ninf ? T(1) : m_exp(m - m2, impl & ~kOnlineUnfused);
  const T b = m2 == ninf ? T(1) : m_exp(x - m2, impl & ~kOnlineUnfused);
  s = red_online_madd(s, a, b, impl);
  m = m2;
}

template <typename T, typename A>
CL_HD T red_online_part(const RedPlan& P, A v, int64_t n, int64_t t) {
  const int64_t R = P.a;
  if (t >= 2 * R) return T(0);
  T m = red_identity<T>(kRedMax), s = T(0);
  for (int64_t i = t / 2; i < n; i += R) red_online_step(m, s, T(v[i]), static_cast<int>(P.impl));
  return (t & 1) ? s : m;
}

// e_c = exp(m_c - M): exp(0) where M is -inf (a row of -inf).
template <typename T>
CL_HD T red_online_scale(T m, T M, int impl) {
  return m_exp(M == red_identity<T>(kRedMax) ? T(0) : m - M, impl & ~kOnlineUnfused);
}

// A thread's sum of s_c e_c over its k-th positions, k = 0, 1, ... (see above).
template <typename T>
struct RedOnlineFold {
  T s0 = T(0), e0 = T(0), acc = T(0);
  int64_t k = 0;
  CL_HD_METHOD void add(T s, T e, int impl) {
    if (k == 0) {
      s0 = s;
      e0 = e;
    } else {
      acc = k == 1 ? red_online_madd(s0, e0, red_mul_rn(s, e), impl)
                   : red_online_madd(s, e, acc, impl);
    }
    ++k;
  }
  CL_HD_METHOD T sum() const { return k == 1 ? red_mul_rn(s0, e0) : acc; }
};

template <typename T>
CL_HD T red_online_combine(const RedPlan& P, T* p) {
  const int64_t R = P.a, per = P.b, lanes = P.c, warps = P.d, nt = lanes * warps;
  const int64_t tile = per * nt, reps = R / tile;
  const int impl = static_cast<int>(P.impl);
  T* th = p + 2 * R;
  for (int64_t t = 0; t < nt; ++t) {  // each thread's maxima in register order, from m_0
    T m = p[2 * (t * per)];
    for (int64_t i = 1; i < reps * per; ++i)
      m = red_tri_maximum(m, p[2 * ((i / per) * tile + t * per + i % per)]);
    th[t] = m;
  }
  const T M = red_triton_tree(lanes, warps, th, [](T a, T b) { return red_tri_maximum(a, b); });
  for (int64_t t = 0; t < nt; ++t) {
    RedOnlineFold<T> f;
    for (int64_t rep = 0; rep < reps; ++rep)
      for (int64_t k = 0; k < per; ++k) {
        const int64_t c = rep * tile + t * per + k;
        f.add(p[2 * c + 1], red_online_scale(p[2 * c], M, impl), impl);
      }
    th[t] = f.sum();
  }
  return red_triton_tree(lanes, warps, th, [](T a, T b) { return a + b; });
}

}  // namespace cl
#include "ops/scalar/moments.h"  // after RedPlan and the cascade sum, which it uses
namespace cl {

// ---- the two steps ----
// red_part and red_combine (below) for the kinds other than the moments.
// kRedDot over a row of 2m values (a then b). Sequential (P.a = 1: each step fma(a, b, acc),
// as GCC contracts SoftMaxKernel.cpp's `sum += grad * output` down a dim that is not the
// last), or map2_reduce_all's lanes (torch_cpu, P.d the reduce_all mode as
// red_cpu_reduce_all's 1, 3, 4 or 6; P.c = 1: the last partial vector's products fused into
// their lanes, which GCC does in the fp32 kernels): lane l starts at a[l] * b[l] and adds
// the products of the full vectors, then the lanes combine. A row shorter than W adds its
// rounded products in order (red_fma: above).

// map2_reduce_all over bf16/fp16 (functional_bfloat16.h): each 2W-element vector as two
// float halves with lanes of their own, added together before the lanes combine (mode 4;
// 6: the DEFAULT build's lanes in order; 7: mode 4, but a row of W..2W elements combines
// its lanes by the butterfly, as layer_norm's mixed-type backward frame does). `fused`: GCC
// fuses each product after the first
// vector into its lane's accumulation (measured in layer_norm's fp16 backward kernel);
// else the rounding to 16 bits hides where it fuses them (softmax's backward).
template <typename T, typename A>
CL_HD T red_dot_halves_acc(A v, int64_t m, bool fused, T s, int64_t i) {
  return fused ? red_fma(T(v[i]), T(v[m + i]), s) : T(s + v[i] * v[m + i]);
}

template <typename T, typename A>
CL_HD T red_dot_halves(A v, int64_t m, int64_t W, bool generic, bool fused, bool short_tree) {
  T a0[16], a1[16];
  if (m < 2 * W) {
    const int64_t k = m < W ? m : W;
    for (int64_t l = 0; l < k; ++l) a0[l] = v[l] * v[m + l];
    for (int64_t l = 0; l + W < m; ++l) a0[l] = red_dot_halves_acc<T>(v, m, fused, a0[l], W + l);
    if (short_tree && m > W) return red_lane_butterfly(a0, W);  // vec_reduce_all(f, v)
    T s = a0[0];
    for (int64_t l = 1; l < k; ++l) s = s + a0[l];
    return s;
  }
  for (int64_t l = 0; l < W; ++l) {
    a0[l] = v[l] * v[m + l];
    a1[l] = v[W + l] * v[m + W + l];
  }
  const int64_t full = m - m % (2 * W);
  for (int64_t d = 2 * W; d < full; d += 2 * W)
    for (int64_t l = 0; l < W; ++l) {
      a0[l] = red_dot_halves_acc<T>(v, m, fused, a0[l], d + l);
      a1[l] = red_dot_halves_acc<T>(v, m, fused, a1[l], d + W + l);
    }
  const int64_t k = m - full;
  for (int64_t l = 0; l < W && l < k; ++l)
    a0[l] = red_dot_halves_acc<T>(v, m, fused, a0[l], full + l);
  for (int64_t l = 0; l + W < k; ++l)
    a1[l] = red_dot_halves_acc<T>(v, m, fused, a1[l], full + W + l);
  for (int64_t l = 0; l < W; ++l) a0[l] = a0[l] + a1[l];
  return generic ? red_lane_sequential(a0, W) : red_lane_butterfly(a0, W);
}

// ORDER: as red_part's (known: only that order's code compiles)
template <typename T, int ORDER = -1, typename A>
CL_HD T red_dot(const RedPlan& P, A v, int64_t n2) {
  const int64_t m = n2 / 2;
  if (m <= 0) return T(0);
  if ((ORDER < 0 ? P.order : ORDER) != kOrdTorchCpu) {
    // P.h: a 16-bit accumulator (kBFloat16, kFloat16) that rounds after every step, as
    // layer_norm's backward buffer for dweight/dbias of 16-bit input does
    T s = T(0);
    for (int64_t i = 0; i < m; ++i) {
      s = P.a ? red_fma(T(v[i]), T(v[m + i]), s) : s + v[i] * v[m + i];
      if (P.h == kBFloat16) s = T(bf16_to_f32(f32_to_bf16_rne(float(s))));
      if (P.h == kFloat16) s = T(f16_to_f32(f32_to_f16_rne(float(s))));
    }
    return s;
  }
  const int64_t W = P.a;
  if (P.d == 4 || P.d == 6 || P.d == 7)
    return red_dot_halves<T>(v, m, W, P.d == 6, P.c != 0, P.d == 7);
  if (m < W) {
    T s = v[0] * v[m];
    for (int64_t i = 1; i < m; ++i) s = s + v[i] * v[m + i];
    return s;
  }
  T acc[16];
  for (int64_t l = 0; l < W; ++l) acc[l] = v[l] * v[m + l];
  const int64_t full = m - m % W;
  for (int64_t d = W; d < full; d += W)
    for (int64_t l = 0; l < W; ++l) acc[l] = acc[l] + v[d + l] * v[m + d + l];
  for (int64_t l = 0; l < m - full; ++l)
    acc[l] = P.c ? red_fma(T(v[full + l]), T(v[m + full + l]), acc[l])
                 : acc[l] + v[full + l] * v[m + full + l];
  return P.d == 3 ? red_lane_sequential(acc, W) : red_lane_butterfly(acc, W);
}

template <typename T, int ORDER, typename A>
CL_HD T red_part_plain(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t);
template <typename T, int ORDER>
CL_HD T red_combine_plain(const RedPlan& P, T* parts);

// The generic reduce kernel (ops/cuda/reduce.cpp) dispatches on P.order and P.kind at run
// time: each order's code is its own device function there, called once per thread (the
// row kernels, which know their order, inline it). One function holding every order took
// NVRTC and ptxas 72 s for sm_90 on 2 cores; as calls, 27 s.
template <typename T, int ORDER, typename A>
CL_HD_COLD T red_part_called(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  return red_part_plain<T, ORDER>(P, v, n, row, t);
}
template <typename T, int ORDER>
CL_HD_COLD T red_combine_called(const RedPlan& P, T* parts) {
  return red_combine_plain<T, ORDER>(P, parts);
}

template <typename T, int ORDER, typename A>
CL_HD T red_part_plain(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  if (P.kind == kRedDot) return red_dot<T, ORDER>(P, v, n);
  if (ORDER < 0 || ORDER == kOrdTriton)
    if (P.kind == kRedOnline) return red_online_part<T>(P, v, n, t);
  if (P.chunk > 0) {
    const int64_t start = t * P.chunk;
    const int64_t len = n - start < P.chunk ? n - start : P.chunk;
    return red_sequential<T>(P.kind, v + start, len);
  }
  if constexpr (ORDER < 0) {
    switch (P.order) {
      case kOrdTorchCuda: return red_part_called<T, kOrdTorchCuda>(P, v, n, row, t);
      case kOrdSoftmaxWarp:
      case kOrdSoftmaxSpatial:
      case kOrdSoftmaxBlock: return red_part_called<T, kOrdSoftmaxBlock>(P, v, n, row, t);
      case kOrdPairwise: return red_part_called<T, kOrdPairwise>(P, v, n, row, t);
      case kOrdTorchCpu: return red_part_called<T, kOrdTorchCpu>(P, v, n, row, t);
      case kOrdTriton: return red_part_called<T, kOrdTriton>(P, v, n, row, t);
      default: return red_part_called<T, kOrdSequential>(P, v, n, row, t);
    }
  } else if constexpr (ORDER == kOrdTorchCuda) {
    return red_cuda_part<T>(P, v, n, row, t);
  } else if constexpr (ORDER == kOrdSoftmaxWarp || ORDER == kOrdSoftmaxBlock ||
                       ORDER == kOrdSoftmaxSpatial) {
    return red_softmax_part<T>(P, v, n, row, t);
  } else if constexpr (ORDER == kOrdPairwise) {
    if (P.kind != kRedSum) return red_sequential<T>(P.kind, v, n);
    int64_t start = 0, length = n;  // part t: leaf t of the halving tree
    red_pairwise_leaf(n, t, &start, &length);
    return red_pairwise_block<T>(v + start, length);
  } else if constexpr (ORDER == kOrdTriton) {
    if (P.cascade_rows >= 0 && row >= P.cascade_rows && P.f > 0) {
      RedPlan Q = P;  // a row of the tail loop: no CascadeSumHelper
      Q.f = 0;
      return red_triton_part<T>(Q, v, n, t);
    }
    return red_triton_part<T>(P, v, n, t);
  } else if constexpr (ORDER == kOrdTorchCpu) {
    if (P.kind != kRedSum) return red_sequential<T>(P.kind, v, n);
    if (P.zseg > 0) return red_cpu_ti_rows<T>(P, v, n);
    if (P.e > 0) return red_two_pass<T>(P, v, n);
    if (P.d > 0) return red_cpu_reduce_all<T>(v, n, P.a, P.d);
    if (P.c > 0) return red_torch_cpu_outer<T>(v, n, P.a, P.c, row);
    return red_torch_cpu<T>(v, n, P.a, P.b);
  } else {
    (void)row;
    (void)t;
    if (P.e > 0 && P.kind == kRedSum) return red_two_pass<T>(P, v, n);
    return red_sequential<T>(P.kind, v, n);
  }
}

template <typename T, int ORDER>
CL_HD T red_combine_plain(const RedPlan& P, T* parts) {
  if (P.chunk > 0) return red_sequential<T>(P.kind, static_cast<const T*>(parts), P.nparts);
  if (ORDER < 0 || ORDER == kOrdTriton)
    if (P.kind == kRedOnline) return red_online_combine(P, parts);
  if constexpr (ORDER < 0) {
    switch (P.order) {
      case kOrdTorchCuda: return red_combine_called<T, kOrdTorchCuda>(P, parts);
      case kOrdSoftmaxWarp:
      case kOrdSoftmaxSpatial:
      case kOrdSoftmaxBlock: return red_combine_called<T, kOrdSoftmaxBlock>(P, parts);
      case kOrdPairwise: return red_combine_called<T, kOrdPairwise>(P, parts);
      case kOrdTriton: return red_combine_called<T, kOrdTriton>(P, parts);
      default: return parts[0];
    }
  } else if constexpr (ORDER == kOrdTorchCuda) {
    return red_cuda_combine(P, parts);
  } else if constexpr (ORDER == kOrdSoftmaxWarp || ORDER == kOrdSoftmaxBlock ||
                       ORDER == kOrdSoftmaxSpatial) {
    return red_softmax_combine(P, parts);
  } else if constexpr (ORDER == kOrdTriton) {
    return red_triton_combine(P, parts);
  } else if constexpr (ORDER == kOrdPairwise) {
    return P.kind == kRedSum ? red_pairwise_leaves(static_cast<const T*>(parts), P.n) : parts[0];
  } else {
    return parts[0];
  }
}

// ORDER: the ReduceOrder when it is known as the kernel is generated (the row kernel: the
// GPU then compiles only that order's code), or -1: dispatch on P.order. KIND likewise
// for P.kind: a kernel of a known kind compiles the moments (mom_part) only where it
// needs them (NVRTC spent three quarters of a softmax row kernel's 5 s on them).
template <typename T, int ORDER = -1, int KIND = -1, typename A>
CL_HD T red_part(const RedPlan& P, A v, int64_t n, int64_t row, int64_t t) {
  if constexpr (red_is_moment(KIND)) {
    return mom_part<T, ORDER>(P, v, n, row, t);
  } else {
    if constexpr (KIND < 0)
      if (red_is_moment(P.kind)) return mom_part<T, ORDER>(P, v, n, row, t);
    return red_part_plain<T, ORDER>(P, v, n, row, t);
  }
}

template <typename T, int ORDER = -1, int KIND = -1>
CL_HD T red_combine(const RedPlan& P, T* parts) {
  if constexpr (red_is_moment(KIND)) {
    return mom_combine<T, ORDER>(P, parts);
  } else {
    if constexpr (KIND < 0)
      if (red_is_moment(P.kind)) return mom_combine<T, ORDER>(P, parts);
    return red_combine_plain<T, ORDER>(P, parts);
  }
}

}  // namespace cl
