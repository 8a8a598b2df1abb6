// The row kernel (ops/row_step.h): one thread block per row. For each phase, the block
// computes the phase's Program for every element of its row into shared memory (coalesced
// loads), reduces the row in the phase's order (red_part on many threads, red_combine on
// one: ops/scalar/reduce.h) and writes the row's result; then it computes the epilogue for
// the row's elements and writes the outputs. Where every phase takes Triton's order, the
// register kernel instead keeps each thread's tile positions in registers, and the launch
// runs as many blocks as the device holds at once, each looping over rows (reading its
// next row while it reduces this one). Where every phase takes SoftMax.cu's warp or block
// order, a block of that order's threads reads the operands from global memory as
// PyTorch's kernel does (any row length fits); a row that fits (srow_cache_limit) is kept
// in shared memory by the first phase for the later ones.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "ops/row_step.h"

namespace cl {
namespace cuda {

// Shared memory the kernel needs for a row of n accumulators and the phases' parts (bytes).
int64_t row_kernel_smem(const RowStep& s, bool f64);
// The largest row (bytes) the SoftMax.cu kernel keeps in shared memory between its phases
// on a device of smem_optin bytes a block: two blocks of 1024 threads an SM, each with the
// 1 KiB the driver reserves and its static parts. srow_cache_limit: that of device dev.
constexpr int64_t srow_cache_limit_of(int64_t smem_optin) {
  return smem_optin > 2048 ? (smem_optin - 2048) / 2 : 0;
}
int64_t srow_cache_limit(int dev);
// The generated source (without a device: tests compile it with NVRTC); cache_limit: as
// above, by default an H100's or H200's (232,448 bytes a block).
std::string row_kernel_source(const RowStep& s, const Tensor* const* ops, size_t nops,
                              int64_t cache_limit = srow_cache_limit_of(232448));
// Whether `s` fits device `dev` (its shared memory per block).
bool row_kernel_fits(const RowStep& s, bool f64, int dev);
void launch_row_kernel(const RowStep& s, const Tensor* const* ops, size_t nops);

}  // namespace cuda
}  // namespace cl
