// Kernel cache: generated source -> loaded CUfunction, in memory and on disk.
//
// Disk entries live in cache_dir() (see kernel_cache.h: $CASTLAB_CACHE_DIR, set but empty
// to turn the disk cache off; default ~/.cache/castlab/kernels), one file per kernel,
// named by the SHA-256 of everything that determines the binary: the source, the embedded
// headers' text, the NVRTC version, the target architecture, the options and castlab's
// version. A file is a one-line header ("castlab-kernel 2 <cubin|ptx> <size> <sha256 of
// the payload> <key>") followed by the payload. An entry is loaded only if it is a regular
// file (never through a symlink, never a FIFO), owned by this user, at most
// disk::kMaxEntryBytes, and its embedded key and payload checksum match what this process
// would compile; anything else is ignored and replaced by a fresh compile. The folder
// must be owned by this user and writable by nobody else (created 0700), else the disk
// cache is not used (said once at CASTLAB_DEBUG>=1). Entries are written 0600 to a
// temporary file named with the writer's pid and renamed into place; temporaries of dead
// writers, or older than disk::kStaleTempSeconds, are removed on first use of the folder.
#include "ops/cuda/kernel_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "core/debug.h"

#ifndef CASTLAB_VERSION
#define CASTLAB_VERSION "0.0.0"
#endif

namespace cl {
namespace cuda {

// ---------------------------------------------------------------- SHA-256 (FIPS 180-4)
namespace {

struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char buf[64];
  size_t blen = 0;
  uint64_t total = 0;

  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void block(const unsigned char* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
             (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = hh + S1 + ch + k[i] + w[i];
      const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = S0 + mj;
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }

  void update(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    total += n;
    while (n > 0) {
      const size_t take = std::min(n, 64 - blen);
      std::memcpy(buf + blen, p, take);
      blen += take;
      p += take;
      n -= take;
      if (blen == 64) {
        block(buf);
        blen = 0;
      }
    }
  }

  std::string hex() {
    const uint64_t bits = total * 8;
    const unsigned char pad = 0x80;
    update(&pad, 1);
    const unsigned char zero = 0;
    while (blen != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    update(len, 8);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (int i = 0; i < 8; ++i)
      for (int s = 28; s >= 0; s -= 4) out.push_back(digits[(h[i] >> s) & 0xF]);
    return out;
  }
};

}  // namespace

std::string sha256_hex(const std::string& data) {
  Sha256 s;
  s.update(data.data(), data.size());
  return s.hex();
}

// ---------------------------------------------------------------- cache

namespace {

std::mutex g_mu;
std::unordered_map<std::string, CompiledKernel> g_mem;  // key -> function (per device)
std::unordered_set<std::string> g_printed;
CacheStats g_stats;

}  // namespace

const std::string& embedded_headers_hash() {
  static const std::string h = [] {
    std::string all;
    for (int i = 0; kEmbeddedHeaders[i].first; ++i) {
      all += kEmbeddedHeaders[i].first;
      all.push_back('\0');
      all += kEmbeddedHeaders[i].second;
      all.push_back('\0');
    }
    return sha256_hex(all);
  }();
  return h;
}

namespace {

bool valid_key(const std::string& key) {
  return key.size() == 64 && key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

namespace disk {

int open_dir(const std::string& dir, std::string* why) {
  if (dir.empty()) {
    *why = "the disk cache is off (CASTLAB_CACHE_DIR is set but empty)";
    return -1;
  }
  // Create missing folders 0700 (whatever the umask); existing parents are left alone.
  bool created = false;
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string cur = dir.substr(0, i);
    if (mkdir(cur.c_str(), 0700) == 0)
      created = true;
    else if (errno != EEXIST) {
      *why = "cannot create " + cur + ": " + std::strerror(errno);
      return -1;
    }
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + dir + ": " + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    close(fd);
    *why = dir + " is not a directory";
    return -1;
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    *why = dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (" +
           std::to_string(geteuid()) + ")";
    return -1;
  }
  if (created && (st.st_mode & 07777) != 0700) {
    if (fchmod(fd, 0700) == 0) st.st_mode = (st.st_mode & ~07777) | 0700;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *why = dir + " is writable by other users (mode " + mode + ")";
    return -1;
  }
  return fd;
}

std::string load(int dirfd, const std::string& key, std::string* kind, std::string* payload) {
  if (!valid_key(key)) return "bad key";
  const std::string name = key + ".bin";
  const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "missing" : errno == ELOOP ? "symlink" : "read error";
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return "read error";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "foreign owner";
  const size_t cap = kMaxEntryBytes + 512;  // payload + header
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > cap) return "too large";
  std::string all;
  all.resize(static_cast<size_t>(st.st_size) + 1);  // one more: notices a file that grew
  size_t got = 0;
  while (got < all.size()) {
    const ssize_t n = read(fd, &all[got], all.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return "read error";
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  all.resize(got);
  const size_t nl = all.find('\n');
  if (nl == std::string::npos || nl > 300) return "bad header";
  const std::string header = all.substr(0, nl);
  char magic[32] = {0}, k[16] = {0}, sum[80] = {0}, ekey[80] = {0};
  int ver = 0;
  unsigned long long size = 0;
  if (std::sscanf(header.c_str(), "%31s %d %15s %llu %79s %79s", magic, &ver, k, &size, sum,
                  ekey) != 6)
    return "bad header";
  if (std::string(magic) != "castlab-kernel" || ver != 2) return "bad header";
  if (std::string(k) != "cubin" && std::string(k) != "ptx" && std::string(k) != "so")
    return "bad header";
  if (ekey != key) return "key mismatch";
  if (all.size() - nl - 1 != size) return "size mismatch";
  std::string data = all.substr(nl + 1);
  if (sha256_hex(data) != sum) return "checksum mismatch";
  *kind = k;
  *payload = std::move(data);
  return "ok";
}

bool store(int dirfd, const std::string& key, const std::string& kind, const std::string& payload) {
  if (!valid_key(key) || payload.size() > kMaxEntryBytes) return false;
  if (kind != "cubin" && kind != "ptx" && kind != "so") return false;
  std::random_device rd;
  char rnd[16];
  std::snprintf(rnd, sizeof rnd, "%08x", static_cast<unsigned>(rd()));
  const std::string name = key + ".bin";
  const std::string tmp = name + ".tmp." + std::to_string(getpid()) + "." + rnd;
  const int fd =
      openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = fchmod(fd, 0600) == 0;  // the umask can only remove bits; be explicit anyway
  const std::string data = "castlab-kernel 2 " + kind + " " + std::to_string(payload.size()) + " " +
                           sha256_hex(payload) + " " + key + "\n" + payload;
  size_t put = 0;
  while (ok && put < data.size()) {
    const ssize_t n = write(fd, data.data() + put, data.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      ok = false;
    else
      put += static_cast<size_t>(n);
  }
  ok = (close(fd) == 0) && ok;
  if (ok && renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) == 0) return true;
  unlinkat(dirfd, tmp.c_str(), 0);
  return false;
}

int clean_temps(int dirfd, int max_age_s) {
  const int fd = dup(dirfd);
  if (fd < 0) return 0;
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return 0;
  }
  rewinddir(d);
  std::vector<std::string> doomed;
  const time_t now = time(nullptr);
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const size_t t = name.find(".bin.tmp.");
    if (t != 64 || !valid_key(name.substr(0, 64))) continue;
    const char* p = name.c_str() + t + 9;
    char* end = nullptr;
    const long pid = std::strtol(p, &end, 10);
    struct stat st;
    if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool dead = end != p && *end == '.' && pid > 0 && pid != getpid() &&
                      kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    const bool old = now - st.st_mtime > max_age_s;
    if (dead || old) doomed.push_back(name);
  }
  closedir(d);
  int removed = 0;
  for (const auto& name : doomed)
    if (unlinkat(dirfd, name.c_str(), 0) == 0) ++removed;
  return removed;
}

}  // namespace disk

namespace {

// The cache folder's descriptor for this call, or -1 when the disk cache is not used
// (the reason is printed once per folder at CASTLAB_DEBUG>=1). Stale temporaries are
// cleaned on a folder's first use. Called with g_mu held.
int disk_dir(const std::string& dir) {
  static std::unordered_set<std::string> seen;
  std::string why;
  const int fd = disk::open_dir(dir, &why);
  const bool first = seen.insert(dir).second;
  if (fd < 0) {
    if (first && debug_level() >= 1) {
      std::fprintf(stderr, "# castlab: kernel disk cache not used: %s; compiling in memory\n",
                   why.c_str());
      std::fflush(stderr);
    }
    return -1;
  }
  if (first) disk::clean_temps(fd, disk::kStaleTempSeconds);
  return fd;
}

// Compiles `source` with NVRTC, handing it the embedded headers. On success returns true
// and, unless `image` is null, the CUBIN (or the PTX when ptx_only or when NVRTC cannot
// give a CUBIN) in *image and its kind in *kind. *log gets NVRTC's log either way; on
// failure *error names NVRTC's error.
bool nvrtc_compile(const std::string& name, const std::string& source,
                   const std::vector<std::string>& opts, bool ptx_only, std::string* image,
                   std::string* kind, std::string* log, std::string* error) {
  const NvrtcApi& r = nvrtc();
  std::vector<const char*> hnames, htexts;
  for (int i = 0; kEmbeddedHeaders[i].first; ++i) {
    hnames.push_back(kEmbeddedHeaders[i].first);
    htexts.push_back(kEmbeddedHeaders[i].second);
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult res =
      r.nvrtcCreateProgram(&prog, source.c_str(), (name + ".cu").c_str(),
                           static_cast<int>(hnames.size()), htexts.data(), hnames.data());
  if (res != 0)
    throw std::runtime_error(std::string("nvrtcCreateProgram failed: ") +
                             r.nvrtcGetErrorString(res));
  std::vector<const char*> o;
  for (const auto& s : opts) o.push_back(s.c_str());
  res = r.nvrtcCompileProgram(prog, static_cast<int>(o.size()), o.data());
  size_t log_size = 0;
  r.nvrtcGetProgramLogSize(prog, &log_size);
  log->assign(log_size, '\0');
  if (log_size) r.nvrtcGetProgramLog(prog, &(*log)[0]);
  while (!log->empty() && log->back() == '\0') log->pop_back();
  if (res != 0) {
    r.nvrtcDestroyProgram(&prog);
    *error = r.nvrtcGetErrorString(res);
    return false;
  }
  if (debug_level() >= 4) {
    std::string ptx;
    size_t np = 0;
    if (r.nvrtcGetPTXSize(prog, &np) == 0 && np > 0) {
      ptx.resize(np);
      if (r.nvrtcGetPTX(prog, &ptx[0]) != 0) ptx.clear();
    }
    std::fprintf(stderr, "# castlab NVRTC log %s\n%s\n# castlab PTX %s\n%s\n", name.c_str(),
                 log->empty() ? "(empty)" : log->c_str(), name.c_str(),
                 ptx.empty() ? "(not available: compiled to a cubin directly)" : ptx.c_str());
    std::fflush(stderr);
  }
  if (image) {
    size_t n = 0;
    if (!ptx_only && r.nvrtcGetCUBINSize && r.nvrtcGetCUBIN) {
      r.nvrtcGetCUBINSize(prog, &n);
      image->resize(n);
      r.nvrtcGetCUBIN(prog, &(*image)[0]);
      *kind = "cubin";
    } else {
      r.nvrtcGetPTXSize(prog, &n);
      image->resize(n);
      r.nvrtcGetPTX(prog, &(*image)[0]);
      *kind = "ptx";
    }
  }
  r.nvrtcDestroyProgram(&prog);
  return true;
}

std::string compile(const std::string& name, const std::string& source,
                    const std::vector<std::string>& opts, bool ptx_only, std::string* kind) {
  std::string out, log, error;
  if (!nvrtc_compile(name, source, opts, ptx_only, &out, kind, &log, &error)) {
    std::string opt_str;
    for (const auto& s : opts) opt_str += " " + s;
    throw std::runtime_error("NVRTC failed to compile castlab kernel " + name + " (" + error +
                             ", options:" + opt_str + ")\n--- NVRTC log ---\n" + log +
                             "\n--- generated source ---\n" + source);
  }
  return out;
}

// The one function compiled with --fmad=true and linked into kernels that define
// CL_LINK_POW_FMAD: CUDA's double pow as PyTorch's CUDA build (nvcc, --fmad=true) has it.
const char* const kPowFmadSource =
    "// castlab: CUDA's double pow compiled with --fmad=true (ops/cuda/kernel_cache.cpp)\n"
    "extern \"C\" __device__ double cl_pow_fmad(double x, double y) { return pow(x, y); }\n";

// Relocatable PTX (a virtual architecture: NVRTC gives PTX for it) with fmad set.
std::vector<std::string> with_options(std::vector<std::string> opts, bool fmad) {
  const std::string arch = "--gpu-architecture=";
  for (auto& o : opts) {
    if (o.rfind("--fmad=", 0) == 0) o = fmad ? "--fmad=true" : "--fmad=false";
    if (o.rfind(arch + "sm_", 0) == 0) o = arch + "compute_" + o.substr(arch.size() + 3);
  }
  opts.push_back("-rdc=true");
  return opts;
}

// `source` (relocatable, --fmad=false) and kPowFmadSource (relocatable, --fmad=true), both
// to PTX, linked by the driver into one CUBIN. PTX from --fmad=false has only explicitly
// rounded mul/add (mul.rn, add.rn), which the driver's assembler never contracts.
std::string compile_linked(const std::string& name, const std::string& source,
                           const std::vector<std::string>& opts, std::string* kind) {
  std::string k1, k2;
  const std::string main_ptx = compile(name, source, with_options(opts, false), true, &k1);
  const std::string pow_ptx =
      compile("cl_pow_fmad", kPowFmadSource, with_options(opts, true), true, &k2);
  const DriverApi& d = driver();
  CUlinkState st = nullptr;
  check(d.cuLinkCreate(0, nullptr, nullptr, &st), "cuLinkCreate");
  struct Destroy {
    const DriverApi& d;
    CUlinkState st;
    ~Destroy() { d.cuLinkDestroy(st); }
  } destroy{d, st};
  check(d.cuLinkAddData(st, CU_JIT_INPUT_PTX, const_cast<char*>(main_ptx.c_str()),
                        main_ptx.size() + 1, (name + ".ptx").c_str(), 0, nullptr, nullptr),
        "cuLinkAddData");
  check(d.cuLinkAddData(st, CU_JIT_INPUT_PTX, const_cast<char*>(pow_ptx.c_str()),
                        pow_ptx.size() + 1, "cl_pow_fmad.ptx", 0, nullptr, nullptr),
        "cuLinkAddData");
  void* cubin = nullptr;
  size_t size = 0;
  check(d.cuLinkComplete(st, &cubin, &size), "cuLinkComplete");
  *kind = "cubin";
  return std::string(static_cast<const char*>(cubin), size);  // copied before cuLinkDestroy
}

}  // namespace

std::string cache_dir() {
  if (const char* e = std::getenv("CASTLAB_CACHE_DIR")) return e;  // "": disk cache off
  const char* x = std::getenv("XDG_CACHE_HOME");
  if (x && x[0] == '/') return std::string(x) + "/castlab/kernels";
  const char* h = std::getenv("HOME");
  if (h && h[0] == '/' && h[1] != '\0') return std::string(h) + "/.cache/castlab/kernels";
  return "/tmp/castlab-kernels-" + std::to_string(geteuid());  // owner-checked on use
}

std::vector<int> nvrtc_supported_archs() {
  const NvrtcApi& r = nvrtc();
  std::vector<int> archs;
  if (r.nvrtcGetNumSupportedArchs && r.nvrtcGetSupportedArchs) {
    int na = 0;
    r.nvrtcGetNumSupportedArchs(&na);
    archs.resize(na > 0 ? na : 0);
    if (na > 0) r.nvrtcGetSupportedArchs(archs.data());
  }
  return archs;
}

std::string nvrtc_arch(int cc, bool* ptx_only) {
  const std::vector<int> archs = nvrtc_supported_archs();
  bool supported = archs.empty();  // NVRTC cannot say: assume it knows the device
  int max_arch = archs.empty() ? cc : 0;
  for (int a : archs) {
    if (a == cc) supported = true;
    if (a > max_arch) max_arch = a;
  }
  *ptx_only = !supported;
  // NVRTC older than the device: PTX for the newest architecture it knows; the driver
  // compiles it for the device when the module loads.
  if (!supported) return "compute_" + std::to_string(cc < max_arch ? cc : max_arch);
  return "sm_" + std::to_string(cc);
}

std::vector<std::string> nvrtc_options_for_arch(const std::string& arch) {
  return {"--std=c++17",     "--gpu-architecture=" + arch, "-default-device", "--ftz=false",
          "--prec-div=true", "--prec-sqrt=true",           "--fmad=false"};
}

std::vector<std::string> nvrtc_options(int dev, bool* ptx_only) {
  int major = 0, minor = 0;
  compute_capability(dev, &major, &minor);
  return nvrtc_options_for_arch(nvrtc_arch(major * 10 + minor, ptx_only));
}

NvrtcCheck nvrtc_compile_check(const std::string& source, const std::string& arch,
                               const std::string& name) {
  // "sm_<n>" (a CUBIN, as the cache builds for a device NVRTC knows) or "compute_<n>"
  // (PTX, as for a device newer than NVRTC).
  const bool sm = arch.rfind("sm_", 0) == 0;
  const size_t digits = sm ? 3 : arch.rfind("compute_", 0) == 0 ? 8 : 0;
  if (digits == 0 || arch.size() == digits ||
      arch.find_first_not_of("0123456789", digits) != std::string::npos)
    throw std::invalid_argument("architecture must be sm_<n> or compute_<n> (e.g. sm_90), not '" +
                                arch + "'");
  const int cc = std::stoi(arch.substr(digits));
  const std::vector<int> archs = nvrtc_supported_archs();
  if (!archs.empty() && std::find(archs.begin(), archs.end(), cc) == archs.end()) {
    std::string list;
    for (int a : archs) list += " " + std::to_string(a);
    int vmaj = 0, vmin = 0;
    nvrtc_version(&vmaj, &vmin);
    throw std::invalid_argument("NVRTC " + std::to_string(vmaj) + "." + std::to_string(vmin) +
                                " (" + nvrtc_path() + ") cannot compile for " + arch +
                                "; it supports:" + list);
  }
  NvrtcCheck out;
  std::string error;
  if (source.find(kLinkPowDefine) != std::string::npos) {
    // as get_kernel builds it: both parts relocatable, to PTX (the driver links them)
    const std::vector<std::string> opts = nvrtc_options_for_arch(arch);
    std::string pow_log;
    out.ok = nvrtc_compile(name, source, with_options(opts, false), true, nullptr, nullptr,
                           &out.log, &error) &&
             nvrtc_compile("cl_pow_fmad", kPowFmadSource, with_options(opts, true), true, nullptr,
                           nullptr, &pow_log, &error);
    out.log += pow_log;
  } else {
    out.ok = nvrtc_compile(name, source, nvrtc_options_for_arch(arch), !sm, nullptr, nullptr,
                           &out.log, &error);
  }
  if (!out.ok) out.log = "NVRTC: " + error + "\n" + out.log;
  return out;
}

CompiledKernel get_kernel(int dev, const std::string& name, const std::string& source) {
  std::lock_guard<std::mutex> lk(g_mu);
  const std::string mem_key = std::to_string(dev) + "\n" + name + "\n" + source;
  auto it = g_mem.find(mem_key);
  if (it != g_mem.end()) {
    g_stats.memory_hits++;
    return it->second;
  }
  if (debug_level() >= 3 && g_printed.insert(name).second) {
    std::fprintf(stderr, "# castlab CUDA kernel %s\n%s\n", name.c_str(), source.c_str());
    std::fflush(stderr);
  }
  bool ptx_only = false;
  const std::vector<std::string> opts = nvrtc_options(dev, &ptx_only);
  int vmaj = 0, vmin = 0;
  nvrtc_version(&vmaj, &vmin);
  std::string key_text = "castlab " CASTLAB_VERSION "\n";
  key_text += "nvrtc " + std::to_string(vmaj) + "." + std::to_string(vmin) + "\n";
  for (const auto& o : opts) key_text += o + "\n";
  key_text += "headers " + embedded_headers_hash() + "\n";
  const bool linked = source.find(kLinkPowDefine) != std::string::npos;
  if (linked) key_text += std::string("linked with:\n") + kPowFmadSource;
  key_text += source;
  const std::string file_key = sha256_hex(key_text);
  const int dfd = disk_dir(cache_dir());
  struct DirCloser {
    int fd;
    ~DirCloser() {
      if (fd >= 0) close(fd);
    }
  } dir_closer{dfd};

  std::string kind, image;
  const std::string got = dfd >= 0 ? disk::load(dfd, file_key, &kind, &image) : "off";
  if (got == "ok") {
    g_stats.disk_hits++;
  } else {
    if (got != "missing" && got != "off") g_stats.disk_rejects++;  // present but refused
    const auto t0 = std::chrono::steady_clock::now();
    if (linked) set_device(dev);  // the driver links for the current context's device
    image = linked ? compile_linked(name, source, opts, &kind)
                   : compile(name, source, opts, ptx_only, &kind);
    g_stats.compile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g_stats.compiles++;
    if (dfd >= 0) disk::store(dfd, file_key, kind, image);
  }
  set_device(dev);
  const DriverApi& d = driver();
  CUmodule mod = nullptr;
  check(d.cuModuleLoadData(&mod, image.data()), "cuModuleLoadData");
  CUfunction fn = nullptr;
  check(d.cuModuleGetFunction(&fn, mod, name.c_str()), "cuModuleGetFunction");
  CompiledKernel k{fn, name};
  g_mem.emplace(mem_key, k);
  return k;
}

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats;
}

}  // namespace cuda
}  // namespace cl
