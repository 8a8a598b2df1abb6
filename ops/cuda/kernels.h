// The CUDA kernels of the device-neutral steps (ops/reduce.h, index.h, loss.h): their
// generated sources (tests compile them with NVRTC without a GPU) and their launches,
// which the runtime reaches through CUDA's backend record (ops/cuda/backend.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/reduce.h"

namespace cl {
namespace cuda {

// The CUDA source of the reduce kernel for float (f64 false) or double rows (tests
// compile it with NVRTC without a GPU).
std::string reduce_kernel_source(bool f64);
void launch_reduce_cuda(const RedPlan& p, const Tensor& src, const Tensor& dst, int64_t rows);

std::string index_kernel_source();
// Returns the first out-of-range index found (or none: *bad == false).
void launch_index_cuda(const IndexSpec& s, const Tensor& src, const Tensor& index,
                       const Tensor& out, int64_t size, bool* bad, int64_t* bad_value);

std::string nll_kernel_source(bool f64);
void launch_nll_cuda(const NllPlan& plan, const Tensor& x, const Tensor& w, const Tensor& t,
                     const Tensor& out);

}  // namespace cuda
}  // namespace cl
