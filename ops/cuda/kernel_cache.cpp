// Kernel cache: generated source -> loaded CUfunction, in memory and on disk.
//
// Disk entries live in $CASTLAB_CACHE_DIR (default ~/.cache/castlab/kernels), one file per
// kernel, named by the SHA-256 of everything that determines the binary: the source, the
// embedded headers' text, the NVRTC version, the target architecture, the options and
// castlab's version. A file is a one-line header ("castlab-kernel 1 <cubin|ptx> <size>
// <sha256 of the payload>") followed by the payload; it is written to a temporary file and
// renamed into place, and a file whose header, size or checksum does not match is ignored
// (and replaced by a fresh compile).
#include "ops/cuda/kernel_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
extern const std::pair<const char*, const char*> kEmbeddedHeaders[];

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

const std::string& headers_hash() {
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

bool mkdirs(const std::string& path) {
  std::string cur;
  size_t i = 0;
  while (i <= path.size()) {
    const size_t j = path.find('/', i);
    const size_t end = j == std::string::npos ? path.size() : j;
    cur = path.substr(0, end);
    if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return true;
}

bool read_file(const std::string& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[1 << 16];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  return ok;
}

bool read_entry(const std::string& path, std::string* kind, std::string* payload) {
  std::string all;
  if (!read_file(path, &all)) return false;
  const size_t nl = all.find('\n');
  if (nl == std::string::npos || nl > 200) return false;
  const std::string header = all.substr(0, nl);
  char magic[32] = {0}, k[16] = {0}, sum[80] = {0};
  int ver = 0;
  unsigned long long size = 0;
  if (std::sscanf(header.c_str(), "%31s %d %15s %llu %79s", magic, &ver, k, &size, sum) != 5)
    return false;
  if (std::string(magic) != "castlab-kernel" || ver != 1) return false;
  if (std::string(k) != "cubin" && std::string(k) != "ptx") return false;
  std::string data = all.substr(nl + 1);
  if (data.size() != size) return false;
  if (sha256_hex(data) != sum) return false;
  *kind = k;
  *payload = std::move(data);
  return true;
}

void write_entry(const std::string& dir, const std::string& path, const std::string& kind,
                 const std::string& payload) {
  if (!mkdirs(dir)) return;
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return;
  const std::string header = "castlab-kernel 1 " + kind + " " + std::to_string(payload.size()) +
                             " " + sha256_hex(payload) + "\n";
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok = ok && std::fwrite(payload.data(), 1, payload.size(), f) == payload.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
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

}  // namespace

std::string cache_dir() {
  if (const char* e = std::getenv("CASTLAB_CACHE_DIR")) return e;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/castlab/kernels";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/castlab/kernels";
  return "/tmp/castlab-kernels";
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
  out.ok = nvrtc_compile(name, source, nvrtc_options_for_arch(arch), !sm, nullptr, nullptr,
                         &out.log, &error);
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
  key_text += "headers " + headers_hash() + "\n";
  key_text += source;
  const std::string file_key = sha256_hex(key_text);
  const std::string dir = cache_dir();
  const std::string path = dir + "/" + file_key + ".bin";

  std::string kind, image;
  if (read_entry(path, &kind, &image)) {
    g_stats.disk_hits++;
  } else {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) g_stats.disk_rejects++;  // present but broken
    const auto t0 = std::chrono::steady_clock::now();
    image = compile(name, source, opts, ptx_only, &kind);
    g_stats.compile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g_stats.compiles++;
    write_entry(dir, path, kind, image);
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
