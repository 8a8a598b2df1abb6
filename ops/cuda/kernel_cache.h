// The kernel cache: generated source -> loaded CUfunction, in memory and on disk (see
// kernel_cache.cpp for the disk format and what the key covers).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/driver.h"

namespace cl {

// The embedded scalar-math headers (cmake/embed.cmake): {path, text} pairs, then {null, null}.
extern const std::pair<const char*, const char*> kEmbeddedHeaders[];
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
// The SHA-256 of every embedded header (names and texts): part of every kernel key.
const std::string& embedded_headers_hash();
struct CacheStats {
  uint64_t memory_hits = 0, disk_hits = 0, compiles = 0, disk_rejects = 0;
  double compile_seconds = 0;
};
CacheStats cache_stats();
// The disk cache's folder: $CASTLAB_CACHE_DIR (set but empty: "", the disk cache is off),
// else $XDG_CACHE_HOME/castlab/kernels, else $HOME/.cache/castlab/kernels, else
// /tmp/castlab-kernels-<euid>.
std::string cache_dir();

// The disk cache's file handling (no driver, no GPU; private bindings test it).
namespace disk {
constexpr size_t kMaxEntryBytes = size_t{64} << 20;  // larger files are never read
constexpr int kStaleTempSeconds = 600;
// Opens the cache folder `dir`, creating missing folders with mode 0700. Returns a
// descriptor, or -1 with the reason in *why: the folder is not a directory, is not owned
// by this user, or is group- or world-writable (anyone able to write it would choose the
// GPU code castlab runs).
int open_dir(const std::string& dir, std::string* why);
// Reads entry `key` (64 hex digits) from the folder: "ok", or why it was not loaded
// ("missing", "symlink", "not a regular file", "too large", "foreign owner",
// "bad header", "key mismatch", "size mismatch", "checksum mismatch", "read error").
// Never follows a symlink and never blocks on a FIFO or device.
std::string load(int dirfd, const std::string& key, std::string* kind, std::string* payload);
// Writes entry `key` as a temporary file (mode 0600 whatever the umask, named with the
// pid) renamed into place. False when it could not.
bool store(int dirfd, const std::string& key, const std::string& kind, const std::string& payload);
// Removes temporary files left by a writer that died (pid gone) or older than
// max_age_s seconds; returns how many.
int clean_temps(int dirfd, int max_age_s);
}  // namespace disk

}  // namespace cuda
}  // namespace cl
