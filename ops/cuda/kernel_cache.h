// The kernel cache: generated source -> loaded CUfunction, in memory and on disk (see
// kernel_cache.cpp for the disk format and what the key covers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/driver.h"

namespace cl {
namespace cuda {

struct CompiledKernel {
  CUfunction fn = nullptr;
  std::string name;
};
// Compiles (or finds in memory / on disk) `source` for device `dev`; throws with the
// NVRTC log and the source on failure.
CompiledKernel get_kernel(int dev, const std::string& name, const std::string& source);
// NVRTC options used for `dev` (for reporting and the cache key).
std::vector<std::string> nvrtc_options(int dev, bool* ptx_only);
std::string sha256_hex(const std::string& data);
struct CacheStats {
  uint64_t memory_hits = 0, disk_hits = 0, compiles = 0, disk_rejects = 0;
  double compile_seconds = 0;
};
CacheStats cache_stats();
std::string cache_dir();

}  // namespace cuda
}  // namespace cl
