// Reduction steps of a Plan: rows of a contiguous [rows, n] temporary (f32 or f64, the
// values a Program computed in its registers) reduced to [rows] in a stated order
// (ops/scalar/reduce.h holds the orders; this file resolves their launch configuration
// and runs them on the CPU; ops/cuda/reduce.cpp runs them on the GPU).
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "ops/scalar/reduce.h"

namespace cl {

// What the lowering asks for: kind (ReduceKind), order (ReduceOrder) and the order's
// parameters:
//   torch_cpu:  p0 = elements per vector load (8 fp32, 16 bf16/fp16 pairs, 4 fp64),
//               p1 = lanes (8 or 4), p2 = 0 (innermost reduction) or the contiguous
//               extent of the kept dims after the reduced ones (an outer reduction),
//               p3 = 0; or SoftMaxKernel.cpp's row sums: p0 = p1 = W lanes (16: AVX512
//               floats, 8, 4), p2 = 0, p3 = 1 (fp32/fp64 rows) or 2 (the bf16 kernel)
//   torch_cuda: p0 = input_vec_size, p1 = vt0, p2 = SMs (0: 132, an H100/H200), p3 = 0
//               for a reduction over the innermost dims, else the output vector size (1, 2
//               or 4) of a reduction over outer dims (each thread owns an output)
//   softmax_warp: p0 = the input's element size in bytes
//   softmax_block: p0 = the input's element size in bytes (as SoftMax.cu's kernel reads it:
//               fp16 even when it writes fp32), p1 = the input's first byte mod 16 (0 when
//               PyTorch copies it first), p2 = 1 for half_to_float (fp16 in, fp32 out),
//               p3 = 1 for the backward kernels (host_softmax_backward's launch rules)
//   softmax_spatial: p0 = the inner size (the product of the dims after the reduced one)
//   kinds kRedMean / kRedM2 (ops/scalar/moments.h): torch_cpu (WelfordOps, no parameter),
//               cpu_moments (p0 = elements per vector load, p1 = lanes, p2 = 1 for a build
//               with fma, p3 = 1 where it fuses the scalar tail too), torch_cuda (Reduce.cuh: as
//               above, vt0 = input_vec_size = 2), cuda_layer_norm_vec and cuda_layer_norm_block (no
//               parameter)
//   torch_cuda also: p4 = the input's first element past an aligned vector (elements),
//               p5 = its row stride in elements (0: contiguous rows), for the vectorized
//               loads (ReduceSpec's last two fields; 0 for every other order)
struct ReduceSpec {
  int kind = kRedSum;
  int order = kOrdSequential;
  int64_t p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0;
};

// The order's launch configuration for rows of n elements, `rows` rows reduced together.
// Throws std::invalid_argument for an unknown kind or order or bad parameters.
RedPlan make_red_plan(const ReduceSpec& s, int64_t n, int64_t rows);
// One line: the configuration in words (traces).
std::string describe_red_plan(const RedPlan& p);

// src: contiguous [rows, n] (or [n] for rows = 1), or where reduce_columns_supported the
// columns of a contiguous [n, rows] matrix (strides 1, rows: a reduction over the leading
// dims, read a matrix row at a time with the same bits), float32 or float64; dst:
// contiguous, rows elements, the same dtype and device.
void run_reduce(const ReduceSpec& s, const Tensor& src, const Tensor& dst);
// Can the columns of a matrix be reduced in this plan's order (the triton order's sum, max
// and min)?
bool reduce_columns_supported(const RedPlan& p);

}  // namespace cl
