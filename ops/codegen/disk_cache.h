// The disk cache of generated code's binaries: CUDA kernels (ops/cuda/kernel_cache.h,
// kinds "cubin" and "ptx") and the CPU's compiled loops (ops/cpu/jit.h, kind "so"), one
// file per entry named by its key (the SHA-256 of everything that determines the binary).
#pragma once
#include <cstddef>
#include <string>

namespace cl {
namespace codegen {

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

}  // namespace codegen
}  // namespace cl
