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
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <future>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/debug.h"

#ifndef CASTLAB_VERSION
#define CASTLAB_VERSION "0.0.0"
#endif

namespace cl {
namespace cuda {

// ---------------------------------------------------------------- cache
//
// Concurrency (issue 53). g_mu guards only the maps and the counters: NVRTC, the disk
// cache and the module load run outside it, so threads compile different kernels at the
// same time. A compiled source is one module per device (g_modules, keyed by the disk
// key: a source compiled under several kernel names, as the compare kernels are, is
// compiled once); the first thread to miss it compiles it, and every other thread asking
// for it meanwhile waits on that thread's shared_future and gets its module, or its
// exception (the failed entry is dropped first, so a later call compiles again). No
// lock is held while a thread waits or compiles, so no wait can deadlock.
//
// What this relies on: NVRTC programs are independent objects, and NVRTC's header
// (nvrtc.h, CUDA 12 and 13) names nvrtcGetTypeName, which castlab never calls, as the
// only API that is not multi-thread safe; each thread here creates, compiles and
// destroys its own nvrtcProgram. The driver API is thread-safe (a context may be current
// on several threads; set_device makes it current on the calling one), so cuLink* (one
// CUlinkState per call) and cuModuleLoadData/cuModuleGetFunction may run concurrently.
// The disk cache writes each entry through a temporary named by pid and a random suffix
// and renames it into place, so two writers never share a temporary.

namespace {

std::mutex g_mu;
std::unordered_map<std::string, CompiledKernel> g_mem;  // key -> function (per device)
// device + disk key -> its module: compiled (or being compiled, or loaded from disk)
std::unordered_map<std::string, std::shared_future<CUmodule>> g_modules;
std::unordered_set<std::string> g_printed;
CacheStats g_stats;
std::vector<CompileRecord> g_log;  // a ring of kCompileLogSize records, g_log_next next
size_t g_log_next = 0;
const std::chrono::steady_clock::time_point g_epoch = std::chrono::steady_clock::now();

double since_epoch(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t - g_epoch).count();
}

}  // namespace

namespace {

// The cache folder's descriptor for this call, or -1 when the disk cache is not used
// (the reason is printed once per folder at CASTLAB_DEBUG>=1). Stale temporaries are
// cleaned on a folder's first use (by one thread; the others wait for it).
int disk_dir(const std::string& dir) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> lk(mu);
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
                               const std::string& name, bool keep_image) {
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
  std::string error, kind;
  std::string* image = keep_image ? &out.image : nullptr;
  if (source.find(kLinkPowDefine) != std::string::npos) {
    // as get_kernel builds it: both parts relocatable, to PTX (the driver links them)
    const std::vector<std::string> opts = nvrtc_options_for_arch(arch);
    std::string pow_log, pow_image;
    out.ok = nvrtc_compile(name, source, with_options(opts, false), true, image, &kind, &out.log,
                           &error) &&
             nvrtc_compile("cl_pow_fmad", kPowFmadSource, with_options(opts, true), true,
                           keep_image ? &pow_image : nullptr, &kind, &pow_log, &error);
    out.log += pow_log;
    out.image += pow_image;
  } else {
    out.ok = nvrtc_compile(name, source, nvrtc_options_for_arch(arch), !sm, image, &kind, &out.log,
                           &error);
  }
  if (!out.ok) out.log = "NVRTC: " + error + "\n" + out.log;
  return out;
}

namespace {

// What decides a kernel's binary, hashed: the disk cache's key (see the top of the file).
std::string disk_key(const std::vector<std::string>& opts, bool linked, const std::string& source) {
  int vmaj = 0, vmin = 0;
  nvrtc_version(&vmaj, &vmin);
  std::string key_text = "castlab " CASTLAB_VERSION "\n";
  key_text += "nvrtc " + std::to_string(vmaj) + "." + std::to_string(vmin) + "\n";
  for (const auto& o : opts) key_text += o + "\n";
  key_text += "headers " + embedded_headers_hash() + "\n";
  if (linked) key_text += std::string("linked with:\n") + kPowFmadSource;
  key_text += source;
  return sha256_hex(key_text);
}

// `source`'s module on `dev`: from the disk cache, else compiled (and stored there), then
// loaded. Runs without g_mu (taken only to count).
CUmodule build_module(int dev, const std::string& name, const std::string& source,
                      const std::vector<std::string>& opts, bool ptx_only, bool linked,
                      const std::string& file_key) {
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
    std::lock_guard<std::mutex> lk(g_mu);
    g_stats.disk_hits++;
  } else {
    // Counted when the compile ends, failed or not: `compiles` is NVRTC's runs.
    struct Counted {
      const std::string& name;
      size_t chars;
      std::chrono::steady_clock::time_point t0;
      bool rejected;
      bool ok = false;
      ~Counted() {
        const auto t1 = std::chrono::steady_clock::now();
        std::lock_guard<std::mutex> lk(g_mu);
        if (rejected) g_stats.disk_rejects++;  // present but refused
        g_stats.compile_seconds += std::chrono::duration<double>(t1 - t0).count();
        g_stats.compiles++;
        CompileRecord r{name, chars, since_epoch(t0), since_epoch(t1), ok};
        if (g_log.size() < kCompileLogSize) {
          g_log.push_back(std::move(r));
        } else {
          g_log[g_log_next] = std::move(r);
        }
        g_log_next = (g_log_next + 1) % kCompileLogSize;
      }
    };
    {
      Counted counted{name, source.size(), std::chrono::steady_clock::now(),
                      got != "missing" && got != "off"};
      if (linked) set_device(dev);  // the driver links for the current context's device
      image = linked ? compile_linked(name, source, opts, &kind)
                     : compile(name, source, opts, ptx_only, &kind);
      counted.ok = true;
    }
    if (dfd >= 0) disk::store(dfd, file_key, kind, image);
  }
  set_device(dev);
  CUmodule mod = nullptr;
  check(driver().cuModuleLoadData(&mod, image.data()), "cuModuleLoadData");
  return mod;
}

}  // namespace

CompiledKernel get_kernel(int dev, const std::string& name, const std::string& source) {
  const std::string mem_key = std::to_string(dev) + "\n" + name + "\n" + source;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_mem.find(mem_key);
    if (it != g_mem.end()) {
      g_stats.memory_hits++;
      return it->second;
    }
  }
  bool ptx_only = false;
  const std::vector<std::string> opts = nvrtc_options(dev, &ptx_only);
  const bool linked = source.find(kLinkPowDefine) != std::string::npos;
  const std::string file_key = disk_key(opts, linked, source);
  const std::string mod_key = std::to_string(dev) + "\n" + file_key;
  std::promise<CUmodule> mine;
  std::shared_future<CUmodule> mod;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_mem.find(mem_key);  // (another thread may have finished it meanwhile)
    if (it != g_mem.end()) {
      g_stats.memory_hits++;
      return it->second;
    }
    if (debug_level() >= 3 && g_printed.insert(name).second) {
      std::fprintf(stderr, "# castlab CUDA kernel %s\n%s\n", name.c_str(), source.c_str());
      std::fflush(stderr);
    }
    auto m = g_modules.find(mod_key);
    if (m == g_modules.end()) {
      mod = mine.get_future().share();
      g_modules.emplace(mod_key, mod);
      owner = true;
    } else {
      mod = m->second;
      g_stats.module_hits++;
    }
  }
  if (owner) {
    try {
      mine.set_value(build_module(dev, name, source, opts, ptx_only, linked, file_key));
    } catch (...) {
      {
        std::lock_guard<std::mutex> lk(g_mu);
        g_modules.erase(mod_key);  // a later call compiles again
      }
      mine.set_exception(std::current_exception());  // wakes the waiters, who rethrow it
      throw;
    }
  }
  const CUmodule m = mod.get();  // a waiter blocks here (no lock held) and may rethrow
  set_device(dev);
  CUfunction fn = nullptr;
  check(driver().cuModuleGetFunction(&fn, m, name.c_str()), "cuModuleGetFunction");
  std::lock_guard<std::mutex> lk(g_mu);
  return g_mem.emplace(mem_key, CompiledKernel{fn, name}).first->second;
}

void precompile(int dev, const std::vector<std::pair<std::string, std::string>>& kernels,
                int threads) {
  const size_t n = kernels.size();
  const size_t nt = std::min(n, static_cast<size_t>(std::max(1, threads)));
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  std::exception_ptr first_error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        get_kernel(dev, kernels[i].first, kernels[i].second);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  if (nt <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < nt; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (first_error) std::rethrow_exception(first_error);
}

CacheStats cache_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats;
}

std::vector<CompileRecord> compile_log() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_log.size() < kCompileLogSize) return g_log;
  std::vector<CompileRecord> out(g_log.begin() + static_cast<std::ptrdiff_t>(g_log_next),
                                 g_log.end());
  out.insert(out.end(), g_log.begin(), g_log.begin() + static_cast<std::ptrdiff_t>(g_log_next));
  return out;
}

}  // namespace cuda
}  // namespace cl
