// Program -> CUDA C++ source. The generated kernel evaluates one output element per
// (vector) lane with one line per Program instruction, calling the same scalar functions
// (ops/scalar/ops.h, core/convert.h, core/rng.h) the CPU interpreter calls; those headers
// and the device prelude (ops/cuda/prelude.cuh) are handed to NVRTC verbatim from the
// embedded copies. Compiling and caching: kernel_cache.h; launching: executor.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/codegen/element.h"
#include "ops/program.h"

namespace cl {
namespace cuda {

// Threads per block of every generated kernel (its __launch_bounds__ and the launch).
// 128, as PyTorch's elementwise kernels (256 measured slower: benchmarks/RESULTS.md).
constexpr int kThreadsPerBlock = 128;

// How the kernel walks its operands (outputs first, then inputs), decided on the host
// after collapsing dimensions.
struct KernelLayout {
  std::vector<uint8_t> dtypes;  // per operand (outputs then inputs)
  int n_out = 0;
  int nd = 1;           // collapsed dimensions
  bool contig = false;  // nd == 1 and every stride is 1: plain 1-D indexing
  int vec = 1;          // elements per vector (vectorised loads/stores when > 1)
  int unroll = 1;       // contig: vectors per lane, kThreadsPerBlock * vec elements apart
  bool idx32 = false;   // every index and offset fits in int32
  // n-D kernels specialised to one collapsed shape (large or repeated launches): the
  // shape[nd] and strides[nops * nd] (operand-major) become compile-time constants, so
  // the index decomposition divides by constants and the offset products fold, and the
  // parameter block carries neither. Empty: read from the parameter block.
  std::vector<int64_t> shape, strides;
  // Static layouts with an input broadcast along an outer dimension (RoPE's cos/sin, loaded
  // with evict-last): the other inputs are loaded with an L2 evict-first policy, so the
  // outputs stay in L2 for the kernel that reads them next. The executor sets it where
  // the launch's operands exceed the L2 and fit in twice its size (executor.cpp).
  bool evict_first_reads = false;
};

// The parameter block, one struct by value. Field order is fixed: operand pointers,
// then int64 fields; all 8 bytes wide, so the host lays it out as a flat array.
//   runtime-shape n-D kernels: ptr[nops], shape[nd], stride[nops][nd], numel, seed, rbase
//     (then div[nd] where magic_division)
//   contiguous and static-layout kernels (which read no shape or stride): ptr[nops],
//     numel, seed, rbase
// (A launch's parameters travel with it to the GPU: a small kernel's time grew with
// unused ones, benchmarks/RESULTS.md.)
bool params_have_layout(bool contig, bool static_layout);
inline bool params_have_layout(const KernelLayout& L) {
  return params_have_layout(L.contig, !L.shape.empty());
}
// The parameter block's length in 8-byte words (magic_division's arguments).
size_t param_words(int nops, int nd, bool contig, bool static_layout, bool idx32);

// Runtime-shape n-D kernels with 32-bit indices divide by each dimension with a
// multiply-high and a shift (the parameter block's `div`: one word per dimension,
// division_magic of its extent) instead of an integer division: exact for dividends
// below 2^31 and divisors in [1, 2^31) (Granlund and Montgomery; as PyTorch's
// IntDivider).
bool magic_division(bool contig, bool static_layout, bool idx32, int nd);
inline bool magic_division(const KernelLayout& L) {
  return magic_division(L.contig, !L.shape.empty(), L.idx32, L.nd);
}
// (m | shift << 32) with floor(n / d) = (umulhi(n, m) + n) >> shift for n < 2^31.
uint64_t division_magic(uint32_t d);

struct GeneratedKernel {
  std::string name;
  std::string source;
};
GeneratedKernel generate_kernel(const Program& prog, const KernelLayout& L);
// Does the Program call CUDA's double pow (pow with kVarPowDevice on double registers)? Its
// kernel then starts with kLinkPowDefine (ops/cuda/kernel_cache.h).
bool needs_linked_pow(const Program& prog);

// The per-element emitters and storage types, shared with the CPU's generated loops
// (ops/codegen/element.h).
using codegen::emit_element_function;
using codegen::emit_split_element_function;
using codegen::paired_rounding;
using codegen::rne_16;
using codegen::SplitFunction;
using codegen::storage_type;

}  // namespace cuda
}  // namespace cl
