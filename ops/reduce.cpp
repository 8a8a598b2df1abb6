#include "ops/reduce.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/parallel.h"
#include "ops/backend.h"
#include "ops/cpu/torch_vml.h"

namespace cl {

namespace {

int64_t last_pow2(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ATen's CPU reduction of >= GRAIN_SIZE elements to one output on more than one torch
// thread (read from the loaded torch at run time; none when torch is not loaded): the
// two-pass reduction of reduce.h. `code`: the 16-bit dtype its buffer rounds to, or 0.
void two_pass_config(RedPlan* P, int64_t n, int64_t rows, int64_t code) {
  constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE
  const int64_t threads = torch_num_threads();
  if (rows != 1 || n < kGrain || threads <= 1) return;
  P->e = std::min(threads, div_up(n, kGrain));
  P->f = div_up(n, P->e);
  P->g = threads;
  P->h = code;
}

// Inductor's C++ reduction kernel, compiled for torch's thread count (read from the loaded
// torch at run time; none when torch is not loaded). codegen/cpp.py: where the rows' loop
// has fewer than 1/300 of the row's vector iterations (max_parallel_depth), or there is no
// rows' loop (one row: the row's loop is the kernel's outermost), the parallel loop is the
// row's own (decide_parallel_depth: more than one thread, and 512 elements a thread), each
// thread taking its share by `#pragma omp for` (libgomp's static schedule). (One row of
// 4,100 floats splits under AVX512 too: 256 vectors of 16, under the 300 rule's bound.)
// `steps` (p5 >> 4): 1 + the outer loops' vector iterations where the kernel is vectorized
// along a kept dim (a reduction over an inner dim: the rows divided by that dim's extent L,
// times L's full vectors), 0 where they are the rows.
void inductor_omp_config(RedPlan* P, int64_t n, int64_t rows, int64_t steps) {
  const int64_t threads = torch_num_threads();
  const int64_t outer = steps > 0 ? steps - 1 : rows;
  if (threads > 1 && (rows == 1 || outer * 300 < n / P->a) && rows * n / threads >= 512)
    P->g = threads;
}

// setReduceConfig of aten/src/ATen/native/cuda/Reduce.cuh. Innermost (reduce_on_fastest,
// one reduced dimension): lanes split each row. Outer (s.p3 = output vector size): each
// thread owns an output and walks the reduced elements, split across the block's rows
// (threadIdx.y) when there are many.
void cuda_config(RedPlan* P, const ReduceSpec& s, int64_t n, int64_t rows) {
  const int64_t ivs = s.p0, vt0 = s.p1, sms = s.p2 > 0 ? s.p2 : 132, ovs = s.p3;
  if (ivs < 1 || ivs > 8 || vt0 < 1 || vt0 > 8)
    throw std::invalid_argument("torch_cuda order: input_vec_size and vt0 must be in [1, 8]");
  if (ovs != 0 && ovs != 1 && ovs != 2 && ovs != 4)
    throw std::invalid_argument("torch_cuda order: output vector size must be 0, 1, 2 or 4");
  constexpr int64_t kMaxThreadsPerSm = 2048;
  const bool outer = ovs > 0;
  const int64_t max_threads = 512 / (outer ? ovs : 1);
  int64_t dim0 = outer ? rows / ovs : n;
  const int64_t dim1 = outer ? n : rows;
  // vectorized from 128 on (measured on an H200 with torch 2.11: fp32 rows of 128 sum as
  // vectorized; the `dim0 > 128 && vt0 >= input_vec_size` of older sources no longer holds)
  const bool vec = !outer && dim0 >= 128 && ivs > 1;
  if (vec) dim0 /= ivs;
  const int64_t d0 = dim0 < max_threads ? last_pow2(std::max<int64_t>(dim0, 1)) : max_threads;
  const int64_t d1 = dim1 < max_threads ? last_pow2(std::max<int64_t>(dim1, 1)) : max_threads;
  int64_t bw = std::min<int64_t>(d0, 32);
  const int64_t bh = std::min<int64_t>(d1, max_threads / bw);
  bw = std::min<int64_t>(d0, max_threads / bh);
  int64_t step_in = outer ? 1 : bw;
  int64_t step_out = outer ? bw : 1;
  const int64_t vpt = div_up(n, step_in);
  const bool split_y = vpt >= std::min<int64_t>(bh * 16, 256);
  if (split_y)
    step_in *= bh;
  else
    step_out *= bh;
  int64_t ctas = 1;
  if (split_y) {
    const int64_t vpt2 = div_up(n, step_in);
    const int64_t target = sms * (kMaxThreadsPerSm / (bw * bh));
    const int64_t grid = div_up(outer ? rows / ovs : rows, step_out);
    if (vpt2 >= 256 && grid <= target)
      ctas = std::max(std::min(div_up(target, grid), div_up(vpt2, 16)), div_up(vpt2, 256));
  }
  P->a = outer ? 1 : bw;  // lanes along the row (outer: one thread per output)
  P->b = split_y ? bh : 1;
  P->c = vec ? ivs : vt0;
  P->d = vec ? 1 : 0;
  P->e = split_y ? 1 : 0;
  P->f = ctas;
  P->g = outer ? bw : 0;
  if (s.p4 < 0 || s.p5 < 0)
    throw std::invalid_argument("torch_cuda order: negative misalignment or row stride");
  P->mis = s.p4;
  P->rs = s.p5;
  P->nparts = P->a * P->b * ctas;
}

// The row moments (ops/scalar/moments.h): one part for the CPU kernels, three per thread
// (a Welford state) for the CUDA ones.
void moments_config(RedPlan* P, const ReduceSpec& s, int64_t n, int64_t rows) {
  switch (s.order) {
    case kOrdTorchCpu: P->nparts = 1; break;
    case kOrdTriton:  // Inductor's C++ Welford: (lanes, 1, lanes, 1, floats a vector, split)
      if (s.p0 < 1 || s.p0 > 64 || s.p1 != 1 || s.p2 != s.p0 || s.p3 != 1 ||
          !(s.p4 == s.p0 || 2 * s.p4 == s.p0) || (s.p5 & 15) < 1 || (s.p5 & 15) > 2 || s.p5 < 0)
        throw std::invalid_argument(
            "triton order: a mean or M2 is Inductor's C++ Welford, (lanes <= 64, 1, lanes, 1, "
            "lanes or half of them, 1 or 2 + 16 * (1 + outer vector iterations))");
      P->a = s.p0;
      P->b = s.p4;
      P->nparts = 1;
      if ((s.p5 & 15) == 2) inductor_omp_config(P, n, rows, s.p5 >> 4);
      break;
    case kOrdCpuMoments:
      if (!((s.p0 == 8 && s.p1 == 8) || (s.p0 == 16 && s.p1 == 8) || (s.p0 == 4 && s.p1 == 4)))
        throw std::invalid_argument("cpu_moments order: vector (8, 8), (16, 8) or (4, 4)");
      P->a = s.p0;
      P->b = s.p1;
      P->c = s.p2 != 0 ? 1 : 0;
      P->d = s.p3 != 0 ? 1 : 0;
      P->nparts = 1;
      break;
    case kOrdTorchCuda:
      cuda_config(P, s, n, rows);
      P->nparts *= 3;
      break;
    case kOrdCudaLnVec:  // PyTorch takes it for rows of a multiple of 4 only (castlab's lowering
                         // too)
      P->a = 32;
      P->b = 4;
      P->nparts = 3 * 128;
      break;
    case kOrdCudaLnBlock:
      P->a = 512;
      P->nparts = 3 * 512;
      break;
    default:
      throw std::invalid_argument(
          "reduce: a mean or M2 of a row needs one of PyTorch's Welford orders (torch_cpu, "
          "cpu_moments, torch_cuda, cuda_layer_norm_vec, cuda_layer_norm_block)");
  }
}

}  // namespace

RedPlan make_red_plan(const ReduceSpec& s, int64_t n, int64_t rows) {
  if (s.kind < kRedSum || s.kind > kRedOnline)
    throw std::invalid_argument("reduce: unknown kind " + std::to_string(s.kind));
  if (s.kind == kRedOnline) {  // the triton order's tile, p4 the exponentials' MathImpl,
    // p5 1 without Triton's fp fusion
    if (s.order != kOrdTriton || s.p4 < kPortable || s.p4 > kTorchCpu || s.p5 < 0 || s.p5 > 1)
      throw std::invalid_argument(
          "reduce: the online softmax sum takes the triton order (R0_BLOCK, per thread, "
          "lanes, warps), the MathImpl of its exp (0-3) and 0 or 1 (no fp fusion)");
    ReduceSpec t = s;
    t.kind = kRedSum;
    t.p4 = 0;
    RedPlan P = make_red_plan(t, n, rows);
    P.kind = kRedOnline;
    P.impl = s.p4 | (s.p5 ? kOnlineUnfused : 0);
    P.e = 1;
    P.nparts = 2 * P.a + P.c * P.d;  // (m, s) a position, then a slot a thread
    return P;
  }
  if (s.order < 0 || s.order >= kOrdCount)
    throw std::invalid_argument("reduce: unknown order " + std::to_string(s.order));
  if (n < 0 || rows < 0) throw std::invalid_argument("reduce: negative size");
  RedPlan P;
  P.kind = s.kind;
  P.order = s.order;
  P.n = n;
  if (red_is_moment(s.kind)) {
    moments_config(&P, s, n, rows);
    return P;
  }
  if (s.kind == kRedDot) {  // red_dot: torch_cpu (W lanes, reduce_all mode, tail fused) or
                            // sequential (fused or not)
    if (n % 2 != 0) throw std::invalid_argument("reduce: a dot row holds 2m values");
    if (s.order == kOrdTorchCpu) {
      if (!(s.p0 == 4 || s.p0 == 8 || s.p0 == 16) ||
          !(s.p3 == 1 || s.p3 == 3 || s.p3 == 4 || s.p3 == 6 || s.p3 == 7))
        throw std::invalid_argument(
            "torch_cpu dot: W = 4, 8 or 16 lanes, reduce_all mode 1, 3, 4, 6 or 7");
      P.a = s.p0;
      P.c = s.p2 != 0 ? 1 : 0;
      P.d = s.p3;
    } else if (s.order == kOrdSequential) {
      P.a = s.p0 != 0 ? 1 : 0;
      // p1 > 0: the accumulator is 16-bit dtype p1 - 1, rounded after every step
      if (s.p1 > 0) {
        if (!(s.p1 - 1 == kBFloat16 || s.p1 - 1 == kFloat16))
          throw std::invalid_argument("sequential dot: a 16-bit accumulator is bf16 or fp16");
        P.h = s.p1 - 1;
      }
    } else {
      throw std::invalid_argument("reduce: a dot row takes the torch_cpu or sequential order");
    }
    return P;
  }
  if (s.order >= kOrdCpuMoments && s.order <= kOrdCudaLnBlock)
    throw std::invalid_argument("reduce: the Welford orders compute a mean or M2, not a sum");
  switch (s.order) {
    case kOrdTorchCpu:
      if ((s.kind == kRedMax || s.kind == kRedMin) && s.p3 == 0 && s.p1 >= 1 && s.p1 <= 3) {
        // amax / amin: p0 = V (elements a vector), p1 = 1 + the loop, p2 = the outer
        // reduction's columns, p4 = the iterator's row length (red_cpu_extreme_zero)
        if (!(s.p0 == 4 || s.p0 == 8 || s.p0 == 16) || s.p2 < 0 || s.p4 < 0)
          throw std::invalid_argument("torch_cpu order: max/min take V = 4, 8 or 16");
        P.a = s.p0;
        P.c = s.p2;
        P.zmode = s.p1;
        P.zseg = s.p4;
        if (s.p1 == 2 && s.p4 == 0) two_pass_config(&P, n, rows, 0);
        break;
      }
      if (s.p3 != 0) {  // SoftMaxKernel.cpp's vec::reduce_all over W lanes
        if (s.p3 < 0 || s.p3 > 6 || s.p0 != s.p1 || !(s.p0 == 4 || s.p0 == 8 || s.p0 == 16) ||
            s.p2 != 0)
          throw std::invalid_argument("torch_cpu order: reduce_all takes W = 4, 8 or 16 lanes");
        P.a = P.b = s.p0;
        P.d = s.p3;
        break;
      }
      if (!((s.p0 == 8 && s.p1 == 8) || (s.p0 == 16 && s.p1 == 8) || (s.p0 == 4 && s.p1 == 4) ||
            (s.p0 == 1 && s.p1 == 1)))
        throw std::invalid_argument("torch_cpu order: vector (8, 8), (16, 8), (4, 4) or (1, 1)");
      // p2 < 0: an innermost reduction whose two-pass buffer is 16-bit dtype -p2 - 1
      P.a = s.p0;
      P.b = s.p1;
      P.c = std::max<int64_t>(s.p2, 0);
      // p4 > 0: the row in TensorIterator's order, its rows of p4 (red_cpu_ti_rows)
      if (s.p4 < 0 || (s.p4 > 0 && s.p2 != 0))
        throw std::invalid_argument("torch_cpu order: iterator rows of a negative length");
      P.zseg = s.kind == kRedSum ? s.p4 : 0;
      if (s.kind == kRedSum && s.p2 <= 0) two_pass_config(&P, n, rows, s.p2 < 0 ? -s.p2 - 1 : 0);
      break;
    case kOrdTorchCuda: cuda_config(&P, s, n, rows); break;
    case kOrdSequential:  // p0 = 1: ATen's parallel_reduce (var's sum of squares)
      if (s.kind == kRedSum && s.p0 == 1) two_pass_config(&P, n, rows, 0);
      break;
    case kOrdPairwise:
      if (s.kind == kRedSum) {  // one part per leaf of NumPy's halving tree
        int64_t st = 0, len = 0;
        P.nparts = n <= kRedPairwiseBlock ? 1 : red_pairwise_leaf(n, -1, &st, &len);
      }
      break;
    case kOrdSoftmaxWarp: {
      // dispatch_softmax_forward: next power of two, warp of min(that, 32) lanes
      if (n > 2048) throw std::invalid_argument("softmax_warp order: rows of at most 2048");
      const int64_t p2 = n <= 1 ? 1 : last_pow2(n - 1) * 2;
      P.a = std::min<int64_t>(p2, 32);
      P.b = p2 / P.a;
      P.nparts = P.a;
      break;
    }
    case kOrdSoftmaxBlock: {
      // host_softmax (SoftMax.cu), rows over the persistent warp softmax's limit: a block of
      // SoftMaxForward_getBlockSize threads (min(n, 1024) rounded up to a warp multiple);
      // fewer than 10 elements a thread: cunn_SoftMaxForwardReg (never for half_to_float);
      // else the row in shared memory (48 KiB a block, less the warps' partials) when the
      // input is 16-byte aligned and n a multiple of ILP: cunn_SoftMaxForwardSmem; else
      // cunn_SoftMaxForward (ilpReduce). ILP = 16 bytes of input elements.
      const int64_t isz = s.p0 > 0 ? s.p0 : 4, misalign = s.p1, half_to_float = s.p2 & 1;
      const bool bwd = s.p3 == 1;
      if (!(isz == 2 || isz == 4 || isz == 8) || misalign < 0 || misalign > 15 ||
          misalign % isz != 0)
        throw std::invalid_argument(
            "softmax_block order: element size 2, 4 or 8 and a misalignment in [0, 16) of "
            "whole elements");
      P.b = 16 / isz;
      if (bwd) {  // host_softmax_backward: SoftMax_getBlockSize(ILP, n), no register kernel
        int64_t mb = std::min<int64_t>(n / P.b, 1024);
        if (P.b > 1) mb /= 2;
        int64_t bs = 1;
        while (bs < mb) bs *= 2;
        P.a = std::max<int64_t>(bs, 32);
      } else {
        const int64_t mb = std::min<int64_t>(std::max<int64_t>(n, 1), 1024);
        P.a = div_up(mb, 32) * 32;
      }
      const int64_t acc = isz == 8 ? 8 : 4;
      const int64_t smem_elems = (49152 - (P.a / 32) * acc) / isz;
      if (!bwd && !half_to_float && div_up(n, P.a) < 10)
        P.c = 0;
      else if (n < smem_elems && misalign == 0 && n % P.b == 0)
        P.c = 1;
      else
        P.c = 2;
      P.d = misalign;
      P.e = isz;
      P.f = bwd && P.c == 2 ? 1 : 0;  // cunn_SoftMaxBackward's blockReduce
      P.nparts = P.a / 32;
      break;
    }
    case kOrdSoftmaxSpatial: {
      // SpatialSoftMax_getBlockSize: inner_threads = min(inner, 1024); when they are at
      // most 64 and the row has at least 64 elements, block.x is the largest power of two
      // with inner_threads * block.x <= 1024 and block.x <= n; else 1
      const int64_t inner = s.p0;
      if (inner < 1) throw std::invalid_argument("softmax_spatial order: inner size >= 1");
      const int64_t it = std::min<int64_t>(inner, 1024);
      int64_t dt = 1;
      if (it <= 64 && n >= 64) {
        while (it * dt <= 1024 && dt <= n) dt *= 2;
        dt /= 2;
      }
      P.a = dt;
      P.nparts = dt;
      break;
    }
    case kOrdTriton: {
      // (R0_BLOCK, per thread, lanes, warps): powers of two, the threads' positions
      // tiling R0_BLOCK exactly (no replicated layout), at most 1024 threads
      auto pow2 = [](int64_t x) { return x >= 1 && (x & (x - 1)) == 0; };
      const int64_t tile = s.p1 * s.p2 * s.p3;
      if (!pow2(s.p0) || !pow2(s.p1) || !pow2(s.p2) || !pow2(s.p3) || s.p2 > 32 ||
          s.p2 * s.p3 > 1024 || tile > s.p0 || s.p0 > (int64_t(1) << 20))
        throw std::invalid_argument(
            "triton order: (R0_BLOCK, per thread, lanes, warps) must be powers of two with "
            "lanes <= 32, lanes * warps <= 1024 and per thread * lanes * warps <= R0_BLOCK");
      // (p4, p5): Inductor's C++ kernels (the inductor_cpp order): the cascade sum's chunk
      // of vector iterations (0: none; above bit 32, where the kernel is vectorized across
      // the rows, its vectors' rows: a last partial vector's rows run the scalar tail loop,
      // without the cascade), and 1 where every lane accumulates from zero, 2
      // where besides a sum's loop over the row may be split over torch's threads; + 4
      // where the lanes combine as ATen's generic vec_reduce_all does (a double row: the two
      // vectors of VectorizedN<double, 2> added, then their lanes in order, P.h = 1)
      // + 8 where the row's last partial vector runs the scalar tail loop (RedPlan.scalar_tail);
      // + 16 * (1 + the outer loops' vector iterations) where the kernel is vectorized along a
      // kept dim (inductor_omp_config)
      const int64_t p5 = s.p5 & 3, chunk = s.p4 & 0xFFFFFFFF, across = s.p4 >> 32;
      const int64_t in_order = s.p5 & 4, stail = s.p5 & 8;
      if (s.p4 < 0 || chunk > (int64_t(1) << 30) || across > 64 || (across > 0 && !chunk) ||
          s.p5 < 0 || (s.p5 & 15) > 14 || p5 > 2 ||
          ((s.p4 > 0 || p5 == 2 || in_order || stail) &&
           (s.p1 != 1 || s.p2 != s.p0 || s.p3 != 1)) ||
          ((in_order || stail) && (p5 == 0 || s.p0 < 2)) || (stail && across > 0))
        throw std::invalid_argument(
            "triton order: the cascade chunk (p4) must be in [0, 2^30], rows a vector above "
            "bit 32 at most 64 (with a chunk); p5 0, 1 or 2, + 4 "
            "for lanes combined in order, + 8 for a scalar tail loop (with p5 1 or 2 and at "
            "least 2 lanes; a scalar tail not across the rows), + 16 * (1 + outer vector "
            "iterations); a cascade, a "
            "split over threads, lanes in order or a scalar tail take one lane a position "
            "(per thread 1, lanes = R0_BLOCK, 1 warp)");
      P.a = s.p0;
      P.b = s.p1;
      P.c = s.p2;
      P.d = s.p3;
      P.e = (p5 || n > 1024 || s.p0 < n) ? 1 : 0;  // Inductor: persistent up to 1024
      P.f = chunk;
      if (across > 0) P.cascade_rows = rows / across * across;
      P.h = in_order ? 1 : 0;
      P.scalar_tail = stail ? 1 : 0;
      P.nparts = s.p2 * s.p3 + (stail ? 1 : 0);
      if (p5 == 2 && s.kind == kRedSum) inductor_omp_config(&P, n, rows, s.p5 >> 4);
      break;
    }
    default: break;
  }
  if (s.kind != kRedSum &&
      (s.order == kOrdSequential || s.order == kOrdPairwise || s.order == kOrdTorchCpu)) {
    // chunks of 32 m elements (m odd: the row kernel's padded shared-memory row puts the
    // parts' first elements in different banks), at most 256 of them
    int64_t m = std::max<int64_t>(1, div_up(n, 32 * 256));
    if (m % 2 == 0) ++m;
    P.chunk = 32 * m;
    P.nparts = div_up(n, P.chunk);
  }
  return P;
}

std::string describe_red_plan(const RedPlan& p) {
  static const char* kKinds[] = {"sum", "max", "min", "mean", "M2", "dot", "online softmax sum"};
  std::string r = kKinds[p.kind];
  auto num = [](int64_t x) { return std::to_string(static_cast<long long>(x)); };
  if (p.kind == kRedDot)
    return std::string("dot ") +
           (p.order == kOrdTorchCpu
                ? "torch_cpu map2_reduce_all (" + num(p.a) + " lanes" +
                      (p.c ? (p.d >= 4 ? ", products fused after the first vector"
                                       : ", the last partial vector's products fused")
                           : "") +
                      (p.d >= 4 ? ", 16-bit vectors as two float halves" : "") +
                      (p.d == 7 ? ", a short row's lanes by the butterfly" : "") +
                      (p.d == 3 || p.d == 6 ? ", lanes added in order)" : ", lane butterfly)")
                : std::string(p.a ? "sequential, fused multiply-adds" : "sequential") +
                      (p.h == kBFloat16  ? ", a bf16 accumulator"
                       : p.h == kFloat16 ? ", an fp16 accumulator"
                                         : ""));
  if (red_is_moment(p.kind)) {
    switch (p.order) {
      case kOrdTorchCpu: return r + " torch_cpu Welford (WelfordOps, one pass)";
      case kOrdTriton:
        return r + " inductor_cpp Welford (" + num(p.a) + " vector lanes" +
               (p.a == 2 * p.b ? " as two halves" : "") +
               ", reciprocal updates, chunks of 4096 in a stack, then welford_vec_reduce_all" +
               (p.g > 1 ? ", the row split over " + num(p.g) + " OpenMP threads (static))" : ")");
      case kOrdCpuMoments:
        return r + " torch_cpu RowwiseMoments (" + num(p.a) + "-element loads, " + num(p.b) +
               " lanes, " + (p.c ? "fused multiply-adds" : "no fma") +
               (p.d ? ", the tail's too)" : ")");
      case kOrdCudaLnVec: return r + " torch_cuda vectorized_layer_norm_kernel (32x4 threads)";
      case kOrdCudaLnBlock: return r + " torch_cuda RowwiseMomentsCUDAKernel (512 threads)";
      default:
        return r + " torch_cuda Reduce.cuh WelfordOps block (" + num(p.a) + "," + num(p.b) + ")" +
               (p.d ? " vectorized x" + num(p.c) : " " + num(p.c) + " accumulators") +
               (p.e ? ", row split across warps" : "") +
               (p.f > 1 ? ", " + num(p.f) + " CTAs per row" : "");
    }
  }
  switch (p.order) {
    case kOrdSequential:
      return r + " sequential" + (p.e > 0 ? ", " + num(p.e) + " thread chunks of " + num(p.f) : "");
    case kOrdPairwise: return r + (p.kind == kRedSum ? " pairwise (NumPy)" : " sequential");
    case kOrdTorchCpu:
      if (p.kind != kRedSum) return r + " sequential";
      if (p.c > 0) return r + " torch_cpu outer cascade (" + num(p.c) + " columns)";
      if (p.e > 0)
        return r + " torch_cpu cascade (" + num(p.a) + "-element loads, " + num(p.b) +
               " lanes) in " + num(p.e) + " thread chunks of " + num(p.f) +
               (p.h ? ", each rounded to 16 bits" : "") + ", then the " + num(p.g) + " partials";
      if (p.d > 0)  // SoftMaxKernel.cpp's vec::reduce_all (red_cpu_reduce_all's modes)
        return r + " torch_cpu vec::reduce_all (" + num(p.a) + " lanes" +
               (p.d == 2 || p.d == 5 ? " over full vectors, then the rest in order" : "") +
               (p.d == 4 || p.d == 6 ? ", 16-bit vectors as two float halves" : "") +
               (p.d == 3 || p.d >= 5 ? ", lanes added in order)" : ", lane butterfly)");
      return r + " torch_cpu cascade (" + num(p.a) + "-element loads, " + num(p.b) + " lanes)";
    case kOrdTorchCuda:
      if (p.g > 0)
        return r + " torch_cuda Reduce.cuh outer reduction (" + num(p.g) + " outputs per warp" +
               (p.e ? ", " + num(p.b) + " threads per output" : ", one thread per output") + ", " +
               num(p.c) + " accumulators" + (p.f > 1 ? ", " + num(p.f) + " CTAs per output)" : ")");
      return r + " torch_cuda Reduce.cuh block (" + num(p.a) + "," + num(p.b) + ")" +
             (p.d ? " vectorized x" + num(p.c) : " " + num(p.c) + " accumulators") +
             (p.d && p.mis % p.c ? ", input " + num(p.mis % p.c) + " elements past a vector" : "") +
             (p.e ? ", row split across warps" : ", warp per row") +
             (p.f > 1 ? ", " + num(p.f) + " CTAs per row" : "");
    case kOrdSoftmaxWarp:
      return r + " torch_cuda persistent warp softmax (" + num(p.a) + " lanes x " + num(p.b) + ")";
    case kOrdSoftmaxBlock: {
      static const char* kKernels[] = {"cunn_SoftMaxForwardReg", "cunn_SoftMaxForwardSmem",
                                       "cunn_SoftMaxForward"};
      return r + " torch_cuda block softmax " + kKernels[p.c] + " (" + num(p.a) + " threads" +
             (p.c == 0 ? ")" : ", ILP " + num(p.b) + ")") +
             (p.c == 2 ? (p.d ? ", input " + num(p.d) + " bytes past a 16-byte boundary"
                              : ", input 16-byte aligned")
                       : "") +
             (p.f ? ", blockReduce in order" : "");
    }
    case kOrdSoftmaxSpatial:
      return r + " torch_cuda spatial softmax (cunn_SpatialSoftMaxForward, " + num(p.a) +
             (p.a == 1 ? " thread a column: sequential)" : " threads a column, then a tree)");
    case kOrdTriton:
      if (p.b == 1 && p.c == p.a && p.d == 1 && (p.f > 0 || p.e))
        return r + " " + num(p.a) + " vector lanes, each from zero, then " +
               (p.h == 1 ? "the two vectors' lanes added and the " + num(p.a / 2) +
                               " sums in order (ATen's generic vec_reduce_all)"
                         : std::string("a butterfly")) +
               (p.f > 0 ? ", each lane's full vectors a cascade sum in chunks of " + num(p.f)
                        : "") +
               (p.cascade_rows >= 0 ? " (a vector across the rows: the rows of its partial "
                                      "vector without it)"
                                    : "") +
               (p.g > 1 ? ", the row split over " + num(p.g) + " OpenMP threads (static)" : "") +
               (p.scalar_tail ? "; the row's last partial vector a scalar loop from zero, "
                                "added to the lanes' sum"
                              : "");
      return r + " triton " + (p.e ? "looped" : "persistent") + " (R0_BLOCK " + num(p.a) + ": " +
             num(p.b) + " per thread x " + num(p.c) + " lanes x " + num(p.d) + " warps)" +
             (p.kind == kRedOnline
                  ? ((p.impl & kOnlineUnfused)
                         ? ": a running (max, sum) a tile position, s' = s exp(m - m') + exp(x - "
                           "m') rounded twice (no fp fusion), then the positions' sum of s "
                           "exp(m - M)"
                         : ": a running (max, sum) a tile position, s' = fma(s, exp(m - m'), "
                           "exp(x - m')), then the positions' sum fma(s, exp(m - M), ...)")
                  : "");
  }
  return r;
}

namespace {

template <typename T>
void reduce_cpu(const RedPlan& P, const T* src, T* dst, int64_t rows, int64_t n) {
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n));
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<T> parts(static_cast<size_t>(std::max<int64_t>(P.nparts, 1)));
    for (int64_t r = r0; r < r1; ++r) {
      const T* v = src + r * n;
      for (int64_t t = 0; t < P.nparts; ++t) parts[t] = red_part<T>(P, v, n, r, t);
      dst[r] = red_combine(P, parts.data());
      if (P.zmode > 0 && dst[r] == T(0)) dst[r] = red_cpu_extreme_zero<T>(P, v, n, r);
    }
  });
}

// The rows as the columns of a contiguous [n, rows] matrix, reduced as the GPU does
// (ops/cuda/reduce.cpp): each thread's part through a RedColumn, then the parts combined.
// (Its own function: a change to reduce_cpu's body moved which NaN x86 keeps in the
// moments' adds, as between two C++ builds.)
template <typename T>
void reduce_columns_cpu(const RedPlan& P, const T* src, T* dst, int64_t rows, int64_t n) {
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<T> parts(static_cast<size_t>(std::max<int64_t>(P.nparts, 1)));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t t = 0; t < P.nparts; ++t)
        parts[t] = red_triton_part<T>(P, RedColumn<T>{src + r, rows}, n, t);
      dst[r] = red_triton_combine(P, parts.data());
    }
  });
}

template <typename T>
void reduce_any_cpu(const RedPlan& P, const T* src, T* dst, int64_t rows, int64_t n, bool columns) {
  if (columns)
    reduce_columns_cpu(P, src, dst, rows, n);
  else
    reduce_cpu(P, src, dst, rows, n);
}

}  // namespace

void run_reduce(const ReduceSpec& s, const Tensor& src, const Tensor& dst) {
  if (src.dtype() != kFloat32 && src.dtype() != kFloat64)
    throw std::invalid_argument("reduce: the rows must be float32 or float64");
  if (dst.dtype() != src.dtype()) throw std::invalid_argument("reduce: dtypes differ");
  if (src.device() != dst.device())
    throw std::invalid_argument("reduce: tensors on " + src.device().str() + " and " +
                                dst.device().str());
  const int64_t rows = dst.numel();
  const int64_t total = src.numel();
  if (rows == 0) return;
  if (total % rows != 0) throw std::invalid_argument("reduce: rows do not divide the input");
  const int64_t n = total / rows;
  // or the columns of a contiguous [n, rows] matrix (a reduction over its leading dims)
  const bool columns = !src.is_contiguous() && src.ndim() == 2 && src.shape()[0] == rows &&
                       src.shape()[1] == n && src.strides()[0] == 1 && src.strides()[1] == rows;
  if ((total > 0 && !src.is_contiguous() && !columns) || !dst.is_contiguous())
    throw std::invalid_argument(
        "reduce: operands must be contiguous rows or the columns of a contiguous matrix");
  const RedPlan P = make_red_plan(s, n, rows);
  if (columns && !reduce_columns_supported(P))
    throw std::invalid_argument(
        "reduce: the columns of a matrix are reduced in the triton order only (sum, max, min)");
  if (src.device().type != DeviceType::CPU) {
    device_backend(src.device().type).reduce(P, src, dst, rows);
    return;
  }
  if (src.dtype() == kFloat32)
    reduce_any_cpu(P, static_cast<const float*>(src.data_ptr()),
                   static_cast<float*>(dst.data_ptr()), rows, n, columns);
  else
    reduce_any_cpu(P, static_cast<const double*>(src.data_ptr()),
                   static_cast<double*>(dst.data_ptr()), rows, n, columns);
}

bool reduce_columns_supported(const RedPlan& P) {
  return P.order == kOrdTriton && P.kind <= kRedMin && P.f == 0 && P.g <= 1 && P.h != 1 &&
         P.chunk == 0 && P.nparts > 0 && P.nparts <= 65535;
}

}  // namespace cl
