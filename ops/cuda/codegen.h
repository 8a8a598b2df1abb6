// Program -> CUDA C++ source, and the kernel cache (memory + disk) that compiles it with
// NVRTC. The generated kernel evaluates one output element per (vector) lane with one
// line per Program instruction, calling the same scalar functions (ops/scalar/ops.h,
// core/convert.h, core/rng.h) the CPU interpreter calls; those headers are handed to
// NVRTC verbatim from the embedded copies.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/driver.h"
#include "ops/program.h"

namespace cl {
namespace cuda {

// Threads per block of every generated kernel (its __launch_bounds__ and the launch).
// 128, as PyTorch's elementwise kernels: 256 was 1-3% slower on compute-bound ops.
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
  // n-D kernels specialised to one collapsed shape (large, shape-stable launches): the
  // shape[nd] and strides[nops * nd] (operand-major) become compile-time constants, so
  // the index decomposition divides by constants and the offset products fold. Empty:
  // read from the parameter block (which is filled the same way either way).
  std::vector<int64_t> shape, strides;
};

// The parameter block, one struct by value. Field order is fixed: operand pointers,
// then int64 fields; all 8 bytes wide, so the host lays it out as a flat array.
//   ptr[nops], shape[nd], stride[nops][nd], numel, seed, rbase
size_t param_bytes(const KernelLayout& L);

struct GeneratedKernel {
  std::string name;
  std::string source;
};
GeneratedKernel generate_kernel(const Program& prog, const KernelLayout& L);

// ---- kernel cache (kernel_cache.cpp) ----
struct CompiledKernel {
  CUfunction fn = nullptr;
  std::string name;
};
// Compiles (or finds in memory / on disk) `source` for device `dev`; throws with the
// NVRTC log and the source on failure.
CompiledKernel get_kernel(int dev, const std::string& name, const std::string& source);
// NVRTC options used for `dev` (for reporting and the cache key): those of
// nvrtc_options_for_arch for the device's architecture, nvrtc_arch(cc).
std::vector<std::string> nvrtc_options(int dev, bool* ptx_only);
// The architectures NVRTC can compile for (e.g. 90 for sm_90); empty when it cannot say.
std::vector<int> nvrtc_supported_archs();
// The NVRTC options for an explicit architecture ("sm_90", "compute_90"); no device needed.
std::vector<std::string> nvrtc_options_for_arch(const std::string& arch);
// The architecture the cache compiles for on a device of compute capability `cc` (e.g. 90):
// "sm_<cc>" when NVRTC knows it, else PTX ("compute_<n>", *ptx_only set) for the newest
// architecture NVRTC knows.
std::string nvrtc_arch(int cc, bool* ptx_only);
// Compiles `source` as the kernel cache would for `arch` ("sm_<n>": to a CUBIN;
// "compute_<n>": to PTX), with the same options and embedded headers, and drops the result
// (tests of the code generator; loads NVRTC but neither the driver nor a GPU). Throws
// std::invalid_argument for an architecture NVRTC does not support.
struct NvrtcCheck {
  bool ok = false;
  std::string log;  // NVRTC's log (warnings too); on failure it starts with NVRTC's error
};
NvrtcCheck nvrtc_compile_check(const std::string& source, const std::string& arch,
                               const std::string& name = "castlab_check");
std::string sha256_hex(const std::string& data);
struct CacheStats {
  uint64_t memory_hits = 0, disk_hits = 0, compiles = 0, disk_rejects = 0;
  double compile_seconds = 0;
};
CacheStats cache_stats();
std::string cache_dir();

// ---- executor.cpp ----
void run_program_cuda(const Program& prog, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs);
// The same on borrowed operands (no Tensor copies: the launch path of cached plans).
void launch_program_cuda(const Program& prog, const Tensor* const* inputs, int n_in,
                         const Tensor* const* outputs, int n_out);
// Copies src into dst: same shape and dtype, both contiguous, any pair of devices.
// Host -> device returns once the source is staged; device -> host waits for the data.
void copy_tensor(const Tensor& src, const Tensor& dst);

}  // namespace cuda
}  // namespace cl
