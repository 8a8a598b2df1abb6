// The kernel cache: generated source -> loaded CUfunction, in memory and on disk (see
// kernel_cache.cpp for the disk format and what the key covers).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/driver.h"
#include "ops/codegen/disk_cache.h"
#include "ops/codegen/hash.h"

namespace cl {

namespace cuda {

// A generated source that starts with this line calls CUDA's double pow as nvcc
// --fmad=true compiles it (ops/scalar/ops.h: cl_pow_fmad): get_kernel compiles that function
// separately with --fmad=true, the kernel with --fmad=false as always, and links the two.
constexpr const char* kLinkPowDefine = "#define CL_LINK_POW_FMAD 1\n";

struct CompiledKernel {
  CUfunction fn = nullptr;
  std::string name;
};
// Compiles (or finds in memory / on disk) `source` for device `dev`; throws with the
// NVRTC log and the source on failure. Thread-safe: different sources compile at the same
// time; a caller asking for a source another thread is compiling waits for that compile
// (and gets its error, if it fails) instead of compiling it again.
CompiledKernel get_kernel(int dev, const std::string& name, const std::string& source);
// get_kernel for each (name, source) on `threads` threads (at least 1): the kernels a run
// will need, compiled at once. Every kernel is tried; the first failure is rethrown after.
void precompile(int dev, const std::vector<std::pair<std::string, std::string>>& kernels,
                int threads);
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
// `keep_image`: *image gets what NVRTC produced (the CUBIN or PTX; for a linked source
// both PTX parts, one after the other).
struct NvrtcCheck {
  bool ok = false;
  std::string log;    // NVRTC's log (warnings too); on failure it starts with NVRTC's error
  std::string image;  // (keep_image only)
};
NvrtcCheck nvrtc_compile_check(const std::string& source, const std::string& arch,
                               const std::string& name = "castlab_check", bool keep_image = false);
// Hashing and the disk cache, shared with the CPU's generated code (ops/codegen/).
using codegen::cache_dir;
using codegen::embedded_headers_hash;
using codegen::sha256_hex;
namespace disk = codegen::disk;
// memory_hits: kernels found loaded; module_hits: a kernel of a source already compiled
// (or being compiled: the caller waited for it) under another name or by another thread;
// compile_seconds: summed over the compiling threads (not wall time).
struct CacheStats {
  uint64_t memory_hits = 0, module_hits = 0, disk_hits = 0, compiles = 0, disk_rejects = 0;
  double compile_seconds = 0;
};
CacheStats cache_stats();
// One NVRTC run: the kernel's name, its source's length, when it started and ended
// (seconds since the process's first compile) and whether it succeeded. The log keeps
// the most recent kCompileLogSize runs.
struct CompileRecord {
  std::string name;
  size_t source_chars = 0;
  double start = 0, end = 0;
  bool ok = false;
};
constexpr size_t kCompileLogSize = 4096;
std::vector<CompileRecord> compile_log();

}  // namespace cuda
}  // namespace cl
